{#- Everything a DockerMPI node needs to run jobs. The NFS server role is
    added by top.sls (dockermpi.storage.nfs-server). #}
include:
  - .guest
  - .docker
  - .storage
  - .firewall
  - .images
  - .node
