{%- set tplroot = tpldir.split('/')[0] %}
{%- from tplroot ~ "/map.jinja" import mpi with context %}
{#- Notebooks reach the hub host (its proxy, through which they call DockerMPI's API,
    and the hub's API) and nothing else of the cluster network: not the master's Salt
    ports or registry, not the API's own port, not a node host. Docker sends every
    container's forwarded traffic through DOCKER-USER first and never flushes that
    chain; the hub host itself is reached through INPUT, which this leaves alone. #}

include:
  - {{ tplroot }}.config
  - .settings
  - {{ tplroot }}.docker.service

mpi-hub-firewall-notebooks-reach-only-the-hub:
  iptables.insert:
    - table: filter
    - chain: DOCKER-USER
    - position: 1
    - in-interface: docker0
    - destination: {{ mpi.cluster_network | json }}
    - match: conntrack
    - ctstate: NEW
    - jump: REJECT
    - save: False
    - require:
      - sls: {{ tplroot }}.config
      - sls: {{ tplroot }}.hub.settings
      - service: mpi-docker-service-running
