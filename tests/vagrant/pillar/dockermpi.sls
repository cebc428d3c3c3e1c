# Site pillar of the Vagrant cluster (written from pillar/pillar.example), the same for
# every provider but for mpi:storage (tests/vagrant/storage/, chosen in the Vagrantfile).
mpi:
  cluster_network: 10.252.1.0/24
  slots_per_node: 2
  limits:
    memory_per_slot_mb: 512
  job_network:
    # Job containers' own addresses; the hosts use .1-.20.
    addresses: 10.252.1.128/25
  docker:
    insecure_registries:
      - 10.252.1.2:5000
