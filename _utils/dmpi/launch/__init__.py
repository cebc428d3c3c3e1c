"""
How a job is launched in DockerMPI containers, as text and argv lists: pure functions
that take plain values, check them, and return what the node writes or runs. Nothing
here touches the file system, runs a process or imports Salt.

A job runs like this on each chosen node: a *worker* container (the job image, run as
the job's user's own uid:gid with every capability dropped) runs the node's own sshd
(:mod:`dmpi.node.agent`) with ``-D -e -f /run/dockermpi/sshd_config`` on a per-job port. The read-only per-job directory
``/run/dockermpi`` holds the files built here: ``sshd_config``, ``known_hosts``,
``hostfile`` and the ``passwd``/``group`` files that are bind-mounted over
``/etc/passwd`` and ``/etc/group``. A *launcher* container on the first node runs the
MPI's launcher over ssh to the workers.

- :mod:`dmpi.launch.ssh`: the job's keys and certificates, sshd's configuration,
  known_hosts, the ssh options;
- :mod:`dmpi.launch.files`: passwd, group and the program script;
- :mod:`dmpi.launch.openmpi`, :mod:`dmpi.launch.openmpi5`, :mod:`dmpi.launch.mpich`:
  each MPI flavour's hostfile, parameters, command line and failure messages;
  :mod:`dmpi.launch.flavours` picks one by the image's flavour;
- :mod:`dmpi.launch.probe`: what an image holds for jobs (the probe script run in it
  when it is approved, its answer read, whether jobs can run on it);
- :mod:`dmpi.launch.values`: the checks they share.

This file imports nothing: Salt's loader may load the folder itself as a utils module.
"""
