{%- set tplroot = tpldir.split('/')[0] %}
{%- from tplroot ~ "/map.jinja" import mpi with context %}
{#- Mount the GlusterFS volume of mpi:storage:glusterfs at mpi:storage:path (FUSE). The
    server (role mpi-glusterfs-server) lays out users/ in it. #}
{%- set gluster = mpi.storage.glusterfs %}

include:
  - {{ tplroot }}.config

mpi-storage-glusterfs-client-package-installed:
  pkg.installed:
    - name: glusterfs-client
    - require:
      - sls: {{ tplroot }}.config

mpi-storage-glusterfs-client-mount-mounted:
  mount.mounted:
    - name: {{ mpi.storage.path | json }}
    - device: {{ (gluster.server ~ ":/" ~ gluster.volume) | json }}
    - fstype: glusterfs
    - opts: {{ gluster.mount_options | json }}
    - mkmnt: True
    - persist: True
    - require:
      - sls: {{ tplroot }}.config
      - pkg: mpi-storage-glusterfs-client-package-installed
