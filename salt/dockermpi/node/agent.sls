{%- set tplroot = tpldir.split('/')[0] %}
{#- DockerMPI's remote-start agent (_modules/mpi_agent.py): the sshd and ssh that start
    a job's ranks in any image, assembled from the OpenSSH packages the node's apt offers
    (downloaded, never installed: no ssh service starts here) and mounted read-only into
    job containers. Built again when apt offers another OpenSSH. #}

include:
  - {{ tplroot }}.config
  - .jobs

mpi-node-agent:
  mpi_agent.present:
    - require:
      - sls: {{ tplroot }}.config
      - pkg: mpi-node-jobs-tools-installed
