{%- set tplroot = tpldir.split('/')[0] %}
{%- from tplroot ~ "/map.jinja" import mpi with context %}
{#- Approved images, pulled by digest. The module rejects references not
    pinned by digest. #}

include:
  - {{ tplroot }}.docker

{%- for name, reference in mpi.images | dictsort %}

{{ ("mpi-images-present-" ~ name) | json }}:
  mpi_image.present:
    - name: {{ name | json }}
    - reference: {{ reference | json }}
    - require:
      - service: mpi-docker-service-running
{%- endfor %}
