{%- set tplroot = tpldir.split('/')[0] %}
{%- from tplroot ~ "/map.jinja" import mpi with context %}
{#- The approved images offered for notebooks, pulled by digest (as dockermpi.images
    does on the nodes, for these only: the hub runs no job). #}

include:
  - {{ tplroot }}.config
  - .settings
  - {{ tplroot }}.docker.service

{%- for name in (mpi.hub.images or [mpi.hub.image]) %}

mpi-hub-image-present-{{ name }}:
  mpi_image.present:
    - name: {{ name | string | json }}
    - reference: {{ (mpi.images or {}).get(name | string, "") | json }}
    - require:
      - sls: {{ tplroot }}.config
      - sls: {{ tplroot }}.hub.settings
      - service: mpi-docker-service-running
{%- endfor %}
