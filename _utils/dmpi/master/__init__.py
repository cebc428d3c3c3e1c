"""
The master's side of DockerMPI:

- :mod:`dmpi.master.site`: the cluster as the master reaches it through Salt;
- :mod:`dmpi.master.user_calls`: all a user may ask (the user API serves these only);
- :mod:`dmpi.master.admin_calls`: what only admins may do (``salt-run mpi.*``);
- :mod:`dmpi.master.controller`: the job controller, the long-lived object that owns
  every job's life, fed by the ``mpi_master`` Salt engine; with
  :mod:`dmpi.master.nodes` (what it knows of each node), :mod:`dmpi.master.planner`
  (what the queue sees) and :mod:`dmpi.master.starter` (what a start sends to nodes).

This file imports nothing: Salt's loader may load the folder itself as a utils module.
"""
