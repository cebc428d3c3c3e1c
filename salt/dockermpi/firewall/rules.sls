{%- set tplroot = tpldir.split('/')[0] %}
{%- from tplroot ~ "/map.jinja" import mpi with context %}
{#- The live rules: one chain per address family, jumped to from rule 1 of
    INPUT. IPv4 accepts the MPI ports from the cluster network; IPv6 (the
    cluster network is IPv4, but host-networked sshd/Open MPI may listen on ::)
    drops them for anyone but loopback. #}

include:
  - {{ tplroot }}.config
  - .package

mpi-firewall-rules-chain-present:
  mpi_firewall.chain_present:
    - name: {{ mpi.firewall.chain | json }}
    - family: ipv4
    - cluster_network: {{ mpi.cluster_network | json }}
    - ports: {{ mpi.ports | json }}
    - require:
      - sls: {{ tplroot }}.config
      - pkg: mpi-firewall-package-installed

mpi-firewall-rules-ipv6-chain-present:
  mpi_firewall.chain_present:
    - name: {{ mpi.firewall.chain | json }}
    - family: ipv6
    - ports: {{ mpi.ports | json }}
    - require:
      - sls: {{ tplroot }}.config
      - pkg: mpi-firewall-package-installed
