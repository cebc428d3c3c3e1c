"""
DockerMPI from a JupyterHub notebook: submit MPI jobs to the cluster and follow them.

    import dockermpi
    mpi = dockermpi.Client()            # configured by the hub's environment
    record = mpi.run(["python3", "pi.py"], np=6)
    record["state"], record["exit_code"]

The same calls are the ``mpi`` command in a terminal (``mpi --help``), and a cell runs
as an MPI job under the ``%%mpi`` magic (``%load_ext dockermpi``; DockerMPI's notebooks
load it at start).
"""

from dockermpi.client import (APIError, APIUnreachableError, Client, DockerMPIError, JobError,
                              TokenRefusedError)


def load_ipython_extension(ipython):
    """``%load_ext dockermpi``: the ``%%mpi`` cell magic (IPython is imported only here)."""
    from dockermpi import magic
    magic.load_ipython_extension(ipython)


def _jupyter_server_extension_points():
    """The Jupyter Server extension that forwards the side panel's calls to the API
    (imported by jupyter_server only, so ``import dockermpi`` needs no tornado)."""
    return [{"module": "dockermpi.server"}]


__all__ = ["APIError", "APIUnreachableError", "Client", "DockerMPIError", "JobError",
           "TokenRefusedError", "load_ipython_extension"]
