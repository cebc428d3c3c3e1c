base:
  'G@roles:mpi-node or G@roles:mpi-hub or G@roles:mpi-master or G@roles:mpi-glusterfs-server':
    - match: compound
    - testcluster
    # Written by the cluster tool on the master: the images pinned by their pushed digests,
    # and the certificates of the hub and the API (with their CA).
    - testcluster_images
    - testcluster_tls
    - ignore_missing: True
  'G@roles:mpi-hub':
    - match: compound
    - testcluster_hub
    # The hub's private key (the cluster tool's, on the master).
    - testcluster_hub_tls
    - ignore_missing: True
  'G@roles:mpi-master':
    - match: compound
    # The API's private key (the cluster tool's, on the master).
    - testcluster_api_tls
    - ignore_missing: True
