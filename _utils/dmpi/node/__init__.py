"""
The node side of DockerMPI: what a node's Salt functions (``_modules/mpi_job.py``) and
its ``mpi_node`` engine do, as ordinary modules.

- :mod:`dmpi.node.checks`: the master's arguments, checked.
- :mod:`dmpi.node.containers`: the Docker engine's client, job containers' options.
- :mod:`dmpi.node.userdirs`: users' directories, read and written as their uid.
- :mod:`dmpi.node.netns`: a job's network namespace and its firewall.
- :mod:`dmpi.node.standby`: network namespaces made ahead of jobs.
- :mod:`dmpi.node.jobca`: the node's job CA and a job's keys.
- :mod:`dmpi.node.start`: a job's start.
- :mod:`dmpi.node.cleanup`: what of which job is here, and a job's end.
- :mod:`dmpi.node.evidence`: the node's report about its jobs.
- :mod:`dmpi.node.health`: the node's fitness for new jobs.
- :mod:`dmpi.node.imagefacts`: the probe of an approved image, and its facts kept.
- :mod:`dmpi.node.agent`: the node's own sshd and ssh, mounted into job containers.

They raise :mod:`dmpi.errors` (``RequestError`` for a bad argument, ``NodeError`` for
what the node cannot do, ``StartFailure`` for a start); the Salt face turns those into
Salt's exceptions.

This file imports nothing: Salt's loader may load the folder itself as a utils module.
"""
