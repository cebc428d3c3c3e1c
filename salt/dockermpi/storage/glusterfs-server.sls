{%- set tplroot = tpldir.split('/')[0] %}
{%- from tplroot ~ "/map.jinja" import mpi, mpi_problems with context %}
{#- The GlusterFS server (role mpi-glusterfs-server): one volume on one brick, served to
    the hosts only (auth.allow: mpi:storage:glusterfs:clients, or every address of the
    cluster network but the job address pool), clients on privileged ports, quotas
    enforced at once. The server mounts the volume itself at mpi:storage:path to lay out
    users/ and the health directory and to put every user directory under its quota
    (mpi:storage:quota); the master puts a new user's directory under it as it makes
    it. With invalid settings nothing is computed (config.sls fails first). #}
{%- set gluster = mpi.storage.glusterfs %}
{%- set clients = [] if mpi_problems else salt['mpi_storage.clients'](
      mpi.cluster_network, mpi.job_network.addresses, gluster.clients) %}

include:
  - {{ tplroot }}.config
  - {{ tplroot }}.guest
  - .hosts

mpi-storage-glusterfs-server-package-installed:
  pkg.installed:
    - pkgs:
      - glusterfs-server
      - glusterfs-client
    - require:
      - sls: {{ tplroot }}.config

mpi-storage-glusterfs-server-service-running:
  service.running:
    - name: glusterd
    - enable: True
    - require:
      - pkg: mpi-storage-glusterfs-server-package-installed

{#- The brick's root is the volume's: the same mode as the volume root below. #}
mpi-storage-glusterfs-server-brick-directory:
  file.directory:
    - name: {{ gluster.brick | json }}
    - user: root
    - group: root
    - mode: '0755'
    - makedirs: True
    - require:
      - sls: {{ tplroot }}.config

mpi-storage-glusterfs-server-volume-present:
  mpi_storage.volume_present:
    - name: {{ gluster.volume | json }}
    - bricks:
      - {{ (gluster.server ~ ":" ~ gluster.brick) | json }}
    - clients: {{ clients | json }}
    - options: {{ gluster.options | json }}
    - require:
      - service: mpi-storage-glusterfs-server-service-running
      - file: mpi-storage-glusterfs-server-brick-directory

mpi-storage-glusterfs-server-volume-mounted:
  mount.mounted:
    - name: {{ mpi.storage.path | json }}
    - device: {{ (gluster.server ~ ":/" ~ gluster.volume) | json }}
    - fstype: glusterfs
    - opts: {{ gluster.mount_options | json }}
    - mkmnt: True
    - persist: True
    - require:
      - mpi_storage: mpi-storage-glusterfs-server-volume-present

{#- The volume's root takes its brick's mode: open it to every uid for traversal, as
    the NFS export's is. #}
mpi-storage-glusterfs-server-volume-root:
  file.directory:
    - name: {{ mpi.storage.path | json }}
    - user: root
    - group: root
    - mode: '0755'
    - require:
      - mount: mpi-storage-glusterfs-server-volume-mounted

mpi-storage-glusterfs-server-users-directory:
  file.directory:
    - name: {{ (mpi.storage.path ~ "/users") | json }}
    - user: {{ mpi.guest.user | json }}
    - group: {{ mpi.guest.group | json }}
    - mode: '0711'
    - require:
      - file: mpi-storage-glusterfs-server-volume-root
      - user: mpi-guest-user-user-present

{#- Where each node's health check writes and removes its probe file (mpi_job.health),
    outside every user's directory and its quota. #}
mpi-storage-glusterfs-server-health-directory:
  file.directory:
    - name: {{ (mpi.storage.path ~ "/.dockermpi-health") | json }}
    - user: root
    - group: root
    - mode: '0700'
    - require:
      - mount: mpi-storage-glusterfs-server-volume-mounted

mpi-storage-glusterfs-server-user-quotas:
  mpi_storage.user_quotas:
    - name: {{ gluster.volume | json }}
    - mount: {{ mpi.storage.path | json }}
    - limits: {{ mpi.storage.quota | json }}
    - require:
      - file: mpi-storage-glusterfs-server-users-directory
