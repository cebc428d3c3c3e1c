"""
The master's side of DockerMPI: the job controller (:mod:`dmpi.master.controller`), the
long-lived object that owns every job's life, fed by the ``mpi_master`` Salt engine.

This file imports nothing: Salt's loader may load the folder itself as a utils module.
"""
