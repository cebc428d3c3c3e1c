{#- Roles come from the `roles` grain (a list). The storage servers' matches come
    first so that, on a node holding both roles, the export or volume exists before
    the node mounts it. #}
base:
  'roles:mpi-nfs-server':
    - match: grain
    - dockermpi.storage.nfs-server
  'roles:mpi-glusterfs-server':
    - match: grain
    - dockermpi.storage.glusterfs-server
  'roles:mpi-node':
    - match: grain
    - dockermpi
  'roles:mpi-hub':
    - match: grain
    - dockermpi.hub
  'roles:mpi-master':
    - match: grain
    - dockermpi.api
