{%- set tplroot = tpldir.split('/')[0] %}
{%- from tplroot ~ "/map.jinja" import mpi with context %}
{#- JupyterHub and DockerSpawner, pinned in files/requirements.txt (and oauthenticator,
    pinned in pillar, when users log in with GitHub), in a virtualenv of their own. pip
    reads from mpi:hub:pip (a package index, or a wheelhouse with no_index). #}
{%- import_text tplroot ~ "/hub/files/requirements.txt" as requirements %}
{%- set pkgs = [] %}
{%- for line in requirements.splitlines() if line.strip() and not line.strip().startswith("#") %}
{%-   do pkgs.append(line.split("#")[0].strip()) %}
{%- endfor %}
{%- if mpi.hub.authenticator == "github" %}
{%-   do pkgs.append(mpi.hub.github.package) %}
{%- endif %}
{%- set pip = mpi.hub.pip %}

include:
  - {{ tplroot }}.config
  - .settings

mpi-hub-venv-packages-installed:
  pkg.installed:
    - pkgs:
      - python3
      - python3-venv
    - require:
      - sls: {{ tplroot }}.config
      - sls: {{ tplroot }}.hub.settings

mpi-hub-venv-virtualenv-managed:
  virtualenv.managed:
    - name: {{ mpi.hub.venv | json }}
    - venv_bin: /usr/bin/python3
    - require:
      - sls: {{ tplroot }}.config
      - sls: {{ tplroot }}.hub.settings
      - pkg: mpi-hub-venv-packages-installed

mpi-hub-venv-pip-installed:
  pip.installed:
    - pkgs: {{ pkgs | json }}
    - bin_env: {{ mpi.hub.venv | json }}
{%- if pip.index_url %}
    - index_url: {{ pip.index_url | json }}
{%- endif %}
{%- if pip.find_links %}
    - find_links: {{ pip.find_links | json }}
{%- endif %}
    - no_index: {{ pip.no_index | json }}
    - require:
      - sls: {{ tplroot }}.config
      - sls: {{ tplroot }}.hub.settings
      - virtualenv: mpi-hub-venv-virtualenv-managed
