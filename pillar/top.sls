base:
  'G@roles:mpi-node or G@roles:mpi-hub or G@roles:mpi-master':
    - match: compound
    - testcluster
    # Written by the cluster tool on the master: the images pinned by their pushed digests.
    - testcluster_images
    - ignore_missing: True
  'G@roles:mpi-hub':
    - match: compound
    - testcluster_hub
