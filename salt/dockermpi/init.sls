{#- Everything a DockerMPI node needs to run jobs. The NFS server role is
    added by top.sls (dockermpi.storage.nfs-server). The settings are checked
    first (.config): every state of the formula requires it. #}
include:
  - .config
  - .guest
  - .docker
  - .storage
  - .firewall
  - .images
  - .node
