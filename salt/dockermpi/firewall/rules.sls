{%- set tplroot = tpldir.split('/')[0] %}
{%- from tplroot ~ "/map.jinja" import mpi with context %}
{#- The live rules: one chain, jumped to from rule 1 of INPUT. #}

include:
  - .package

mpi-firewall-rules-chain-present:
  mpi_firewall.chain_present:
    - name: {{ mpi.firewall.chain | json }}
    - cluster_network: {{ mpi.cluster_network | json }}
    - ports: {{ mpi.ports | json }}
    - require:
      - pkg: mpi-firewall-package-installed
