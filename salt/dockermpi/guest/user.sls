{%- set tplroot = tpldir.split('/')[0] %}
{%- from tplroot ~ "/map.jinja" import mpi with context %}
{#- The unprivileged account job containers run as. It only owns files
    (shared users/ tree, per-job keys): no login shell, no home directory. #}

include:
  - {{ tplroot }}.config

mpi-guest-user-group-present:
  group.present:
    - name: {{ mpi.guest.group | json }}
    - gid: {{ mpi.guest.gid | json }}
    - require:
      - sls: {{ tplroot }}.config

mpi-guest-user-user-present:
  user.present:
    - name: {{ mpi.guest.user | json }}
    - uid: {{ mpi.guest.uid | json }}
    - gid: {{ mpi.guest.gid | json }}
    - home: /nonexistent
    - createhome: False
    - shell: /usr/sbin/nologin
    - require:
      - sls: {{ tplroot }}.config
      - group: mpi-guest-user-group-present
