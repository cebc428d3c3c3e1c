"""
DockerMPI from a JupyterHub notebook: submit MPI jobs to the cluster and follow them.

    import dockermpi
    mpi = dockermpi.Client()            # configured by the hub's environment
    record = mpi.run(["python3", "pi.py"], np=6)
    record["state"], record["exit_code"]

The same calls are the ``mpi`` command in a terminal (``mpi --help``).
"""

from dockermpi.client import (APIError, APIUnreachableError, Client, DockerMPIError, JobError,
                              TokenRefusedError)

__all__ = ["APIError", "APIUnreachableError", "Client", "DockerMPIError", "JobError",
           "TokenRefusedError"]
