{%- set tplroot = tpldir.split('/')[0] %}
{%- from tplroot ~ "/map.jinja" import mpi with context %}
{#- Images DockerMPI pulled here (the mpi_image ledger) that pillar no longer approves
    are removed once no container uses them; images anyone else pulled are never
    touched. #}

include:
  - {{ tplroot }}.config
  - {{ tplroot }}.docker.service

mpi-images-unapproved-absent:
  mpi_image.unapproved_absent:
    - name: mpi:images
    - approved: {{ ((mpi.images if mpi.images is mapping else {}).values() | list) | json }}
    - require:
      - sls: {{ tplroot }}.config
      - service: mpi-docker-service-running
