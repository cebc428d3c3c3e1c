{%- set tplroot = tpldir.split('/')[0] %}
{#- Every host that speaks to the shared storage, its servers too: GlusterFS and NFS
    sec=sys trust the uid a host's privileged port claims, so below 1024 only root may
    bind there. A check: a site that lowered the floor is told, nothing is changed. #}

include:
  - {{ tplroot }}.config

mpi-storage-privileged-ports-root-only:
  mpi_storage.privileged_ports_root_only:
    - name: net.ipv4.ip_unprivileged_port_start
    - require:
      - sls: {{ tplroot }}.config
