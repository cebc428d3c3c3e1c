{%- set tplroot = tpldir.split('/')[0] %}
{%- from tplroot ~ "/map.jinja" import mpi with context %}
{#- jupyterhub_config.py is the same everywhere; the site's choices reach it as
    settings.json (0600: admin token, login secrets) rendered from mpi:hub. The spawner
    module lies beside them, on the service's PYTHONPATH. #}
{%- set hub = mpi.hub %}
{#- The images the spawn form offers (short name -> reference), the default among them. #}
{%- set offered = {} %}
{%- for name in (hub.images or [hub.image]) %}
{%-   do offered.update({name | string: (mpi.images or {}).get(name | string, "")}) %}
{%- endfor %}
{#- TLS files (PEM from pillar): the proxy's certificate and key for users (mpi:hub:tls),
    the CA notebooks verify it with, and the CA the proxy and spawner verify the API's
    certificate with (mpi:api:tls:ca); '' leaves a file out (system CAs, or no TLS). #}
{%- set tls_files = [
      ("ssl_cert", "/etc/dockermpi/hub/tls.crt", hub.tls.cert, "0644"),
      ("ssl_key", "/etc/dockermpi/hub/tls.key", hub.tls.key, "0600"),
      ("hub_ca_file", "/etc/dockermpi/hub/hub-ca.pem", hub.tls.ca, "0644"),
      ("api_ca_file", "/etc/dockermpi/hub/api-ca.pem", mpi.api.tls.ca, "0644"),
    ] %}
{%- set settings = {
      "image": hub.image,
      "image_reference": (mpi.images or {}).get(hub.image | string, ""),
      "images": offered,
      "bind_url": hub.bind_url,
      "hub_bind_url": hub.hub_bind_url,
      "hub_api_url": hub.hub_api_url,
      "api_url": hub.api_url,
      "api_service_url": hub.api_service_url,
      "subdomain_host": hub.subdomain_host,
      "notebook_hosts": hub.notebook_hosts,
      "users_dir": mpi.storage.path ~ "/users",
      "state_dir": hub.state_dir,
      "proxy_command": "/usr/bin/configurable-http-proxy",
      "authenticator": hub.authenticator,
      "admin_users": hub.admin_users,
      "admin_token": hub.admin_token,
      "dummy": hub.dummy,
      "github": hub.github,
      "limits": hub.limits,
      "panel_refresh_seconds": hub.panel_refresh_seconds,
    } %}
{%- for setting, path, pem, mode in tls_files %}
{%-   do settings.update({setting: path if pem else ""}) %}
{%- endfor %}
{#- Notebooks call the API on the master directly (firewall.sls opens its endpoint to
    them); an API on this host's loopback, which a notebook's loopback is not, through
    the proxy as browsers do. #}
{%- set api = salt["mpi_config.endpoint"](hub.api_service_url) %}
{%- if api and not salt["mpi_config.is_loopback"](api[0]) %}
{%-   do settings.update({"notebook_api_url": hub.api_service_url.rstrip("/") ~ "/services/dockermpi",
                          "notebook_api_ca_file": settings["api_ca_file"]}) %}
{%- else %}
{%-   do settings.update({"notebook_api_url": hub.api_url,
                          "notebook_api_ca_file": settings["hub_ca_file"]}) %}
{%- endif %}

include:
  - {{ tplroot }}.config
  - .settings

mpi-hub-config-directory:
  file.directory:
    - name: /etc/dockermpi/hub
    - user: root
    - group: root
    - mode: '0700'
    - makedirs: True
    - require:
      - sls: {{ tplroot }}.config
      - sls: {{ tplroot }}.hub.settings

mpi-hub-config-settings-json:
  file.serialize:
    - name: /etc/dockermpi/hub/settings.json
    - serializer: json
    - dataset: {{ settings | json }}
    - user: root
    - group: root
    - mode: '0600'
    - show_changes: False
    - require:
      - sls: {{ tplroot }}.config
      - sls: {{ tplroot }}.hub.settings
      - file: mpi-hub-config-directory

mpi-hub-config-jupyterhub-config:
  file.managed:
    - name: /etc/dockermpi/hub/jupyterhub_config.py
    - source: salt://{{ tpldir }}/files/jupyterhub_config.py
    - user: root
    - group: root
    - mode: '0644'
    - require:
      - sls: {{ tplroot }}.config
      - sls: {{ tplroot }}.hub.settings
      - file: mpi-hub-config-directory

mpi-hub-config-spawner-module:
  file.managed:
    - name: /etc/dockermpi/hub/dockermpi_spawner.py
    - source: salt://{{ tpldir }}/files/dockermpi_spawner.py
    - user: root
    - group: root
    - mode: '0644'
    - require:
      - sls: {{ tplroot }}.config
      - sls: {{ tplroot }}.hub.settings
      - file: mpi-hub-config-directory

{%- for setting, path, pem, mode in tls_files %}

mpi-hub-config-{{ setting | replace("_", "-") }}:
{%-   if pem %}
  file.managed:
    - name: {{ path }}
    - contents: {{ pem | json }}
    - user: root
    - group: root
    - mode: '{{ mode }}'
    - show_changes: False
{%-   else %}
  file.absent:
    - name: {{ path }}
{%-   endif %}
    - require:
      - sls: {{ tplroot }}.config
      - sls: {{ tplroot }}.hub.settings
      - file: mpi-hub-config-directory
    - require_in:
      - file: mpi-hub-config-settings-json
{%- endfor %}

{#- Hubs provisioned when notebooks called salt-api directly hold that API's CA. #}
mpi-hub-config-salt-api-ca-absent:
  file.absent:
    - name: /etc/dockermpi/api-ca.pem
    - require:
      - sls: {{ tplroot }}.config
      - sls: {{ tplroot }}.hub.settings
