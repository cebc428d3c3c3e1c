{%- set tplroot = tpldir.split('/')[0] %}
{%- from tplroot ~ "/map.jinja" import mpi with context %}
{#- The notebooks' approved image, pulled by digest (as dockermpi.images does on the
    nodes, for this one image only: the hub runs no job image). #}
{%- set name = mpi.hub.image | string %}

include:
  - {{ tplroot }}.config
  - .settings
  - {{ tplroot }}.docker.service

mpi-hub-image-present:
  mpi_image.present:
    - name: {{ name | json }}
    - reference: {{ (mpi.images or {}).get(name, "") | json }}
    - require:
      - sls: {{ tplroot }}.config
      - sls: {{ tplroot }}.hub.settings
      - service: mpi-docker-service-running
