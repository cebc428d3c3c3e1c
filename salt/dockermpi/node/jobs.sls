{%- set tplroot = tpldir.split('/')[0] %}
{%- from tplroot ~ "/map.jinja" import mpi with context %}
{#- What a node needs to start job containers: job_root, the node-local home of
    per-job secrets (ssh keys), which only root may list (0711: a job reaches its
    own subdirectory by name); nsenter (util-linux) and iptables to close each job's
    network namespace to all but the job's own containers, and ssh-keyscan
    (openssh-client) to check a job's sshd by its host key, not its banner. #}

include:
  - {{ tplroot }}.config

mpi-node-jobs-tools-installed:
  pkg.installed:
    - pkgs:
      - util-linux
      - iptables
      - openssh-client
    - require:
      - sls: {{ tplroot }}.config

mpi-node-jobs-root-directory:
  file.directory:
    - name: {{ mpi.job_root | json }}
    - user: root
    - group: root
    - mode: '0711'
    - makedirs: True
    - require:
      - sls: {{ tplroot }}.config
