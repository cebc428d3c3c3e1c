{%- set tplroot = tpldir.split('/')[0] %}
{%- from tplroot ~ "/map.jinja" import mpi with context %}
{%- set nfs = mpi.storage.nfs %}
{%- if not nfs.server %}
{{- raise("mpi:storage:nfs:server must name the NFS server when mpi:storage:type is nfs") }}
{%- endif %}

mpi-storage-nfs-client-package-installed:
  pkg.installed:
    - name: nfs-common

mpi-storage-nfs-client-mount-mounted:
  mount.mounted:
    - name: {{ mpi.storage.path | json }}
    - device: {{ (nfs.server ~ ":" ~ nfs.export) | json }}
    - fstype: nfs
    - opts: {{ nfs.mount_options | json }}
    - mkmnt: True
    - persist: True
    - require:
      - pkg: mpi-storage-nfs-client-package-installed
