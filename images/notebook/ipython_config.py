# DockerMPI: the %%mpi cell magic in every kernel and IPython shell of this image
# (installed as /etc/ipython/ipython_config.py and ipython_kernel_config.py).
c.InteractiveShellApp.extensions.append("dockermpi")  # noqa: F821 (c: IPython's config)
