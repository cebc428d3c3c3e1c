{%- set tplroot = tpldir.split('/')[0] %}
{%- from tplroot ~ "/map.jinja" import mpi with context %}
{#- The master's side of the notebook way in (role mpi-master, on the salt-master's own
    minion): the mpi_api engine, DockerMPI's user API, which the hub registers as its
    service `dockermpi` and proxies at /services/dockermpi/. It accepts connections from
    the hub host only (mpi:api:allowed_clients, by default the host of mpi:hub:hub_api_url),
    over TLS (mpi:api:tls), and checks tokens with the hub over https (mpi:api:hub_api_url).
    salt-api is not part of DockerMPI: where it runs it is stopped and disabled, and the
    files DockerMPI once gave it (its TLS key and certificate, the jupyterhub eauth
    module) are removed, so no user reaches Salt. The master reads
    engines only at start, so it restarts when this configuration changes; a transient
    systemd timer does it two seconds later, so this highstate still returns its result
    to it. #}
{%- set api = mpi.api if mpi.api is mapping else {} %}
{%- set hub = mpi.hub if mpi.hub is mapping else {} %}
{%- set hub_api_url = hub.get("hub_api_url") if hub.get("hub_api_url") is string else "" %}
{%- set netloc = hub_api_url.split("://", 1)[-1].split("/", 1)[0] %}
{%- if netloc.startswith("[") %}
{%-   set hub_host = netloc[1:].split("]", 1)[0] %}
{%- else %}
{%-   set hub_host = netloc.split(":", 1)[0] %}
{%- endif %}
{#- The engine refuses to start without clients or with a host name (it matches callers'
    addresses), so the state says so first. #}
{%- set allowed = api.get("allowed_clients") or ([hub_host] if hub_host else []) %}
{#- Where the API checks tokens: mpi:api:hub_api_url, else the hub's own. Tokens cross the
    network only over TLS: https, or http to loopback (mpi_config checks the URLs' form). #}
{%- set token_url = api.get("hub_api_url") or hub_api_url %}
{%- set tls = api.get("tls") if api.get("tls") is mapping else {} %}
{%- set api_dir = "/etc/dockermpi/api-tls" %}
{%- set tls_files = [
      ("tls_cert", api_dir ~ "/tls.crt", tls.get("cert") or "", "0644"),
      ("tls_key", api_dir ~ "/tls.key", tls.get("key") or "", "0600"),
      ("hub_ca", api_dir ~ "/hub-ca.pem", (hub.get("tls") or {}).get("ca") or "", "0644"),
    ] %}
{%- set missing = [] %}
{%- if not token_url %}
{%-   do missing.append("mpi:api:hub_api_url is required on the master: the API asks the hub there whose token a caller holds") %}
{%- elif not salt["mpi_config.encrypted_or_local"](token_url) %}
{%-   do missing.append("mpi:api:hub_api_url must be the hub API's https URL (its proxy's, e.g. https://hub.example.org/hub/api): the API sends users' tokens there, and " ~ token_url ~ " is plain http to another host") %}
{%- endif %}
{%- if not api.get("allowed_clients") and not hub_host | is_ip %}
{%-   do missing.append("mpi:api:allowed_clients must list the hub host's addresses: " ~ (("mpi:hub:hub_api_url names it " ~ hub_host ~ ", not by an IP address") if hub_host else "mpi:hub:hub_api_url, which would name the hub host, is ''")) %}
{%- endif %}
{%- if not (tls.get("cert") and tls.get("key")) and not salt["mpi_config.is_loopback"](api.get("host")) %}
{%-   do missing.append("mpi:api:tls:cert and mpi:api:tls:key are required on the master: the hub's proxy sends users' tokens to the API on " ~ (api.get("host") | string) ~ " (a certificate for the host in mpi:hub:api_service_url)") %}
{%- endif %}

include:
  - {{ tplroot }}.config

mpi-api-settings-complete:
  test.configurable_test_state:
    - name: mpi:api
    - changes: False
    - result: {{ not missing }}
    - allow_test_mode_failure: True
    - comment: {{ (("The mpi:api settings are incomplete; the API is not set up until they are:\n" ~ missing | join("\n")) if missing else "The mpi:api settings are complete") | json }}
    - require:
      - sls: {{ tplroot }}.config

mpi-api-master-config:
  file.serialize:
    - name: /etc/salt/master.d/dockermpi-api.conf
    - serializer: yaml
    - mode: '0600'
    - dataset:
        engines:
          - mpi_api:
              hub_api_url: {{ token_url | json }}
{%- for setting, path, pem, mode in tls_files %}
              {{ setting }}: {{ (path if pem else none) | json }}
{%- endfor %}
              host: {{ api.get("host") | json }}
              port: {{ api.get("port") | json }}
              allowed_clients: {{ allowed | json }}
              token_cache_seconds: {{ api.get("token_cache_seconds") | json }}
              limits: {{ api.get("limits") | json }}
    - require:
      - sls: {{ tplroot }}.config
      - test: mpi-api-settings-complete

mpi-api-tls-directory:
  file.directory:
    - name: {{ api_dir }}
    - user: root
    - group: root
    - mode: '0700'
    - makedirs: True
    - require:
      - sls: {{ tplroot }}.config
      - test: mpi-api-settings-complete
{%- for setting, path, pem, mode in tls_files %}

mpi-api-{{ setting | replace("_", "-") }}:
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
      - file: mpi-api-tls-directory
    - require_in:
      - file: mpi-api-master-config
    - onchanges_in:
      - module: mpi-api-master-restart
{%- endfor %}

mpi-api-salt-api-stopped:
  service.dead:
    - name: salt-api
    - enable: False
    - require:
      - sls: {{ tplroot }}.config

mpi-api-master-restart:
  module.run:
    - cmd.run_all:
      - cmd: [systemd-run, --on-active=2, --timer-property=AccuracySec=100ms,
              systemctl, restart, salt-master]
      - python_shell: False
    - onchanges:
      - file: mpi-api-master-config
    - require:
      - sls: {{ tplroot }}.config
      - test: mpi-api-settings-complete

{%- for leftover in ("/etc/dockermpi/api", "/var/lib/dockermpi/salt-auth") %}

mpi-api-salt-api-leftover-{{ loop.index }}-absent:
  file.absent:
    - name: {{ leftover | json }}
    - require:
      - sls: {{ tplroot }}.config
      - service: mpi-api-salt-api-stopped
{%- endfor %}
