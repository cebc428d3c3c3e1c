# VM providers (libvirt, virtualbox): node1 (grain role mpi-nfs-server) exports the
# shared storage over NFS, as on real hosts; every node mounts it.
mpi:
  storage:
    type: nfs
    path: /srv/dockermpi
    nfs:
      server: 10.252.1.11
