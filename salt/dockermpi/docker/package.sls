{%- set tplroot = tpldir.split('/')[0] %}
{%- from tplroot ~ "/map.jinja" import mpi with context %}

include:
  - {{ tplroot }}.config

mpi-docker-package-installed:
  pkg.installed:
    - name: {{ mpi.docker.package | json }}
    - require:
      - sls: {{ tplroot }}.config
