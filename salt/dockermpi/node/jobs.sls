{%- set tplroot = tpldir.split('/')[0] %}
{%- from tplroot ~ "/map.jinja" import mpi with context %}
{#- What a node needs to start job containers: job_root, the node-local home of
    per-job secrets (ssh keys), which only root may list (0711: a job reaches its
    own subdirectory by name); and setpriv (util-linux) to drop to the guest uid. #}

mpi-node-jobs-util-linux-installed:
  pkg.installed:
    - name: util-linux

mpi-node-jobs-root-directory:
  file.directory:
    - name: {{ mpi.job_root | json }}
    - user: root
    - group: root
    - mode: '0711'
    - makedirs: True
