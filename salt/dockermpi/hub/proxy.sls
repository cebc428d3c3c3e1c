{%- set tplroot = tpldir.split('/')[0] %}
{#- configurable-http-proxy from Debian: JupyterHub starts it and keeps its routes. #}

include:
  - {{ tplroot }}.config
  - .settings

mpi-hub-proxy-package-installed:
  pkg.installed:
    - name: node-configurable-http-proxy
    - require:
      - sls: {{ tplroot }}.config
      - sls: {{ tplroot }}.hub.settings
