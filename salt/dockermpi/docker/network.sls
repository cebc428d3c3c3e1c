{%- set tplroot = tpldir.split('/')[0] %}
{%- from tplroot ~ "/map.jinja" import mpi with context %}
{#- The macvlan network job containers get their own cluster addresses from:
    subnet is the cluster network, IP range the job address pool the master
    allocates from. An empty parent means the interface holding the node's
    cluster address. #}
{%- set net = mpi.job_network %}

include:
  - {{ tplroot }}.config
  - .service

mpi-docker-network-present:
  mpi_network.present:
    - name: {{ net.name | json }}
    - subnet: {{ mpi.cluster_network | json }}
    - ip_range: {{ net.addresses | json }}
    - parent: {{ (net.parent or none) | json }}
    - require:
      - sls: {{ tplroot }}.config
      - service: mpi-docker-service-running
