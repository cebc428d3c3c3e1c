{%- set tplroot = tpldir.split('/')[0] %}

include:
  - {{ tplroot }}.config

mpi-firewall-package-installed:
  pkg.installed:
    - name: iptables
    - require:
      - sls: {{ tplroot }}.config
