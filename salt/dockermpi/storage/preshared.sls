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

mpi-storage-preshared-users-directory:
  file.directory:
    - name: {{ (mpi.storage.path ~ "/users") | json }}
    - user: {{ mpi.guest.user | json }}
    - group: {{ mpi.guest.group | json }}
    - mode: '0711'
    - makedirs: False
    - require:
      - sls: {{ tplroot }}.config
      - file: mpi-storage-preshared-path-exists
      - user: mpi-guest-user-user-present
