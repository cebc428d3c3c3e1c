{%- set tplroot = tpldir.split('/')[0] %}
{%- from tplroot ~ "/map.jinja" import mpi with context %}
{#- Export mpi:storage:nfs:export to the cluster network's hosts only (never the job
    address pool inside it), root squashed, with the security flavour of
    mpi:storage:nfs:security.
    Salt 3008 core no longer ships the nfs_export state, so the export is a
    file in /etc/exports.d and `exportfs -ra` runs only when that file changes. #}
{%- set export = mpi.storage.nfs.export %}
{%- set options = "(rw,sync,root_squash,no_subtree_check,sec=" ~ mpi.storage.nfs.security ~ ")" %}
{%- set clients = salt['mpi_config.host_networks'](mpi.cluster_network, mpi.job_network.addresses) %}
{%- set export_line = export ~ " " ~ clients | join(options ~ " ") ~ options %}

include:
  - {{ tplroot }}.config
  - {{ tplroot }}.guest
  - .hosts

mpi-storage-nfs-server-package-installed:
  pkg.installed:
    - name: nfs-kernel-server
    - require:
      - sls: {{ tplroot }}.config

mpi-storage-nfs-server-export-directory:
  file.directory:
    - name: {{ export | json }}
    - user: root
    - group: root
    - mode: '0755'
    - makedirs: True
    - require:
      - sls: {{ tplroot }}.config

mpi-storage-nfs-server-users-directory:
  file.directory:
    - name: {{ (export ~ "/users") | json }}
    - user: {{ mpi.guest.user | json }}
    - group: {{ mpi.guest.group | json }}
    - mode: '0711'
    - require:
      - sls: {{ tplroot }}.config
      - file: mpi-storage-nfs-server-export-directory
      - user: mpi-guest-user-user-present

{#- Where each node's health check writes and removes its probe file (mpi_job.health):
    root on a node is squashed to nobody, so nobody owns it; no user reaches it. #}
mpi-storage-nfs-server-health-directory:
  file.directory:
    - name: {{ (export ~ "/.dockermpi-health") | json }}
    - user: nobody
    - group: nogroup
    - mode: '0700'
    - require:
      - sls: {{ tplroot }}.config
      - file: mpi-storage-nfs-server-export-directory

mpi-storage-nfs-server-exports-file:
  file.managed:
    - name: /etc/exports.d/dockermpi.exports
    - user: root
    - group: root
    - mode: '0644'
    - makedirs: True
    - contents:
      - '# Managed by Salt (dockermpi.storage.nfs-server).'
      - {{ export_line | json }}
    - require:
      - sls: {{ tplroot }}.config
      - file: mpi-storage-nfs-server-export-directory

mpi-storage-nfs-server-service-running:
  service.running:
    - name: nfs-kernel-server
    - enable: True
    - require:
      - sls: {{ tplroot }}.config
      - pkg: mpi-storage-nfs-server-package-installed
      - file: mpi-storage-nfs-server-exports-file

mpi-storage-nfs-server-exportfs-reload:
  module.run:
    - cmd.run_all:
      - cmd: [exportfs, -ra]
      - python_shell: False
    - onchanges:
      - file: mpi-storage-nfs-server-exports-file
    - require:
      - sls: {{ tplroot }}.config
      - service: mpi-storage-nfs-server-service-running
