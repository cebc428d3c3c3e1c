{%- set tplroot = tpldir.split('/')[0] %}
{%- from tplroot ~ "/map.jinja" import mpi with context %}
{#- Approved images, pulled by digest. The settings check (.config) and the
    module reject references not pinned by digest. #}

include:
  - {{ tplroot }}.config
  - {{ tplroot }}.docker

{%- for name, reference in (mpi.images if mpi.images is mapping else {}) | dictsort %}

{{ ("mpi-images-present-" ~ name) | json }}:
  mpi_image.present:
    - name: {{ name | json }}
    - reference: {{ reference | json }}
    - require:
      - sls: {{ tplroot }}.config
      - service: mpi-docker-service-running
{%- endfor %}
