# Pillar of the local test cluster (tests/cluster). A site writes its own from pillar.example.
mpi:
  cluster_network: 10.251.1.0/24
  slots_per_node: 2
  limits:
    max_running_jobs_per_user: 2
    # Small enough that the tenant tests reach them quickly on a 2-core test machine.
    memory_per_slot_mb: 512
    pids_per_slot: 128
    tmp_size_mb: 256
  job_network:
    # Job containers' own addresses; the hosts use .1-.20.
    addresses: 10.251.1.128/25
  storage:
    # The storage host dmpi-storage (10.251.1.6) serves a GlusterFS volume (the kernel
    # here has no NFS); every node and the hub mount it at /srv/dockermpi.
    type: glusterfs
    path: /srv/dockermpi
    glusterfs:
      server: 10.251.1.6
    # Small, so the tests that fill a quota fill it quickly; `filler` is the user whose
    # quota the tenant tests fill.
    quota:
      size_mb: 2048
      files: 100000
      users:
        filler:
          size_mb: 48
          files: 2000
  docker:
    insecure_registries:
      - 10.251.1.2:5000
  # The hub host dmpi-hub (10.251.1.5). Its secrets are in testcluster_hub.sls (hub only).
  hub:
    image: notebook
    # The spawn form offers both; notebook-mpich's jobs run MPICH from its virtualenv.
    images: [notebook, notebook-mpich]
    # Notebooks and the proxy reach the hub's own API on the hub host; tokens to it never
    # cross the cluster network.
    hub_api_url: http://10.251.1.5:8081/hub/api
    # Each user's server on <name>.hub.dmpi.test, the API on an origin of its own, all
    # over https with the wildcard certificate the cluster tool makes (its CA in
    # testcluster_tls, the key in testcluster_hub_tls): the test cluster has no DNS, so
    # notebooks and the master get the names in /etc/hosts and the browser tests map
    # *.hub.dmpi.test to the hub host.
    bind_url: https://0.0.0.0:8000
    subdomain_host: https://hub.dmpi.test:8000
    # Notebooks call DockerMPI's API through the hub's proxy; the proxy reaches it on
    # the master, over TLS (mpi:api:tls).
    api_url: https://dockermpi--service.hub.dmpi.test:8000/services/dockermpi
    api_service_url: https://10.251.1.2:8001
    notebook_hosts:
      dockermpi--service.hub.dmpi.test: 10.251.1.5
    limits:
      memory_mb: 1024
      pids: 256
      cpus: 1.0
  api:
    # The hub host (its proxy, and notebooks, which call the API directly) and this test
    # machine's address on the cluster network, from which bench/api_load.py calls as
    # notebooks do.
    allowed_clients: [10.251.1.5, 10.251.1.1]
    # The API checks tokens with the hub through its proxy, over TLS.
    hub_api_url: https://hub.dmpi.test:8000/hub/api
    # Short enough that the tests see a revoked token refused soon.
    token_cache_seconds: 5
