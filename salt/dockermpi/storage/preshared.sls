{%- set tplroot = tpldir.split('/')[0] %}
{%- from tplroot ~ "/map.jinja" import mpi with context %}
{#- The platform shares mpi:storage:path (a cluster file system mounted by
    other means). Check it is there, never create it: an empty local directory
    in its place would silently split the cluster's data. #}

include:
  - {{ tplroot }}.config
  - {{ tplroot }}.guest

mpi-storage-preshared-path-exists:
  file.exists:
    - name: {{ mpi.storage.path | json }}
    - require:
      - sls: {{ tplroot }}.config

{#- Every node applies these at once on the one file system: mpi_storage.shared_directory
    lets the first make each directory and the others find it made. #}
mpi-storage-preshared-users-directory:
  mpi_storage.shared_directory:
    - name: {{ (mpi.storage.path ~ "/users") | json }}
    - user: {{ mpi.guest.user | json }}
    - group: {{ mpi.guest.group | json }}
    - mode: '0711'
    - require:
      - sls: {{ tplroot }}.config
      - file: mpi-storage-preshared-path-exists
      - user: mpi-guest-user-user-present

{#- Where each node's health check writes and removes its probe file (mpi_job.health),
    outside every user's directory. #}
mpi-storage-preshared-health-directory:
  mpi_storage.shared_directory:
    - name: {{ (mpi.storage.path ~ "/.dockermpi-health") | json }}
    - user: root
    - group: root
    - mode: '0700'
    - require:
      - sls: {{ tplroot }}.config
      - file: mpi-storage-preshared-path-exists
