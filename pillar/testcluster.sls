# Pillar of the local test cluster (tests/cluster). A site writes its own from pillar.example.
mpi:
  cluster_network: 10.251.1.0/24
  slots_per_node: 2
  limits:
    max_running_jobs_per_user: 2
  storage:
    # The kernel here has no NFS: a Docker volume shares /srv/dockermpi between the nodes.
    type: preshared
    path: /srv/dockermpi
  docker:
    insecure_registries:
      - 10.251.1.2:5000
