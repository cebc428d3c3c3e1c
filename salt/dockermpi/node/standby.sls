{%- set tplroot = tpldir.split('/')[0] %}
{%- from tplroot ~ "/map.jinja" import mpi with context %}
{#- Network namespaces made ahead of jobs (mpi:job_network:standby): a job start takes
    one instead of making its own, the slowest step of a start. Each job's clean-up
    keeps them; this makes them for the node's first job. The holders run `sleep` from
    the first approved image (by name): any approved image will do. #}
{%- set images = mpi.images if mpi.images is mapping else {} %}

include:
  - {{ tplroot }}.config
  - {{ tplroot }}.images
  - .jobs

{%- if images %}
{%- set name = (images | dictsort | first)[0] %}

mpi-node-standby-namespaces:
  mpi_standby.present:
    - name: {{ name | json }}
    - image: {{ images[name] | json }}
    - count: {{ mpi.job_network.standby | int }}
    - require:
      - sls: {{ tplroot }}.config
      - sls: {{ tplroot }}.images
      - sls: {{ tplroot }}.node.jobs
{%- endif %}
