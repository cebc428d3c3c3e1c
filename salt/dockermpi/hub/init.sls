{#- The JupyterHub host (grain role mpi-hub): JupyterHub in its own virtualenv behind
    configurable-http-proxy, spawning each user's notebook server in a container on this
    host's own Docker engine (unix socket only), as the user's own uid from the master,
    with only the user's directory on the shared storage mounted. No job network and no
    node firewall here: the hub runs no MPI jobs. #}
include:
  - dockermpi.config
  - .settings
  - dockermpi.docker.service
  - dockermpi.storage
  - .image
  - dockermpi.images.absent
  - .proxy
  - .venv
  - .firewall
  - .config
  - .service
