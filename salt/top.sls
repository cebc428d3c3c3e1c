{#- Roles come from the `roles` grain (a list). The NFS server match comes
    first so that, on a node holding both roles, the export exists before the
    node mounts it. #}
base:
  'roles:mpi-nfs-server':
    - match: grain
    - dockermpi.storage.nfs-server
  'roles:mpi-node':
    - match: grain
    - dockermpi
  'roles:mpi-hub':
    - match: grain
    - dockermpi.hub
  'roles:mpi-master':
    - match: grain
    - dockermpi.api
