base:
  'G@roles:mpi-node':
    - match: compound
    - testcluster
    # Written by the cluster tool on the master: the MPI image pinned by its pushed digest.
    - testcluster_images
    - ignore_missing: True
