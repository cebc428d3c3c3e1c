{%- set tplroot = tpldir.split('/')[0] %}
{%- from tplroot ~ "/map.jinja" import mpi with context %}
{%- set nfs = mpi.storage.nfs %}

include:
  - {{ tplroot }}.config

mpi-storage-nfs-client-package-installed:
  pkg.installed:
    - name: nfs-common
    - require:
      - sls: {{ tplroot }}.config

mpi-storage-nfs-client-mount-mounted:
  mount.mounted:
    - name: {{ mpi.storage.path | json }}
    - device: {{ (nfs.server ~ ":" ~ nfs.export) | json }}
    - fstype: nfs
    - opts: {{ (nfs.mount_options + ["sec=" ~ nfs.security]) | json }}
    - mkmnt: True
    - persist: True
    - require:
      - sls: {{ tplroot }}.config
      - pkg: mpi-storage-nfs-client-package-installed
