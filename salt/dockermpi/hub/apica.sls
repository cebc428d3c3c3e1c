{%- set tplroot = tpldir.split('/')[0] %}
{%- from tplroot ~ "/map.jinja" import mpi with context %}
{#- salt-api's certificate, as the master host publishes it in the Salt mine (function
    alias dockermpi_api_certificate of the minion with role mpi-master): the hub verifies
    salt-api with it and mounts it read-only into every notebook. Without it the state
    fails, saying so: highstate the master first. #}
{%- set found = salt['mine.get']('roles:mpi-master', 'dockermpi_api_certificate', tgt_type='grain') %}
{%- set pems = [] %}
{%- for minion, pem in (found if found is mapping else {}) | dictsort %}
{%-   if pem is string and "-----BEGIN CERTIFICATE-----" in pem %}
{%-     do pems.append(pem.strip() ~ "\n") %}
{%-   endif %}
{%- endfor %}

include:
  - {{ tplroot }}.config
  - .settings

{%- if pems %}

mpi-hub-apica-certificate:
  file.managed:
    - name: {{ mpi.hub.api_ca | json }}
    - contents: {{ pems | unique | join("") | json }}
    - user: root
    - group: root
    - mode: '0644'
    - makedirs: True
    - require:
      - sls: {{ tplroot }}.config
      - sls: {{ tplroot }}.hub.settings
{%- else %}

mpi-hub-apica-certificate:
  test.configurable_test_state:
    - name: {{ mpi.hub.api_ca | json }}
    - changes: False
    - result: False
    - allow_test_mode_failure: True
    - comment: {{ ("No salt-api certificate in the Salt mine (function dockermpi_api_certificate of a minion with grain roles:mpi-master; found " ~ ((found or {}) | list | sort | join(", ") or "no such minion") ~ "): apply highstate to the master host first (state dockermpi.api), then to this hub") | json }}
    - require:
      - sls: {{ tplroot }}.config
      - sls: {{ tplroot }}.hub.settings
{%- endif %}
