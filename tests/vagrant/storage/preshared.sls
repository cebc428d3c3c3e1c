# Docker provider: this kernel has no NFS; the Docker volume vagrant-dmpi-shared is
# mounted at /srv/dockermpi on every node (the platform shares it).
mpi:
  storage:
    type: preshared
    path: /srv/dockermpi
