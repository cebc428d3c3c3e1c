{%- set tplroot = tpldir.split('/')[0] %}
{%- from tplroot ~ "/map.jinja" import mpi with context %}
{#- The master's side of the notebook way in (role mpi-master, on the salt-master's own
    minion): the mpi_api engine, DockerMPI's user API, which the hub registers as its
    service `dockermpi` and proxies at /services/dockermpi/. It accepts connections from
    the hub host only (mpi:api:allowed_clients, by default the host of mpi:hub:hub_api_url).
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
{%- set missing = [] %}
{%- if not hub_api_url %}
{%-   do missing.append("mpi:hub:hub_api_url is required on the master: the API asks the hub there whose token a caller holds") %}
{%- elif not api.get("allowed_clients") and not hub_host | is_ip %}
{%-   do missing.append("mpi:api:allowed_clients must list the hub host's addresses: mpi:hub:hub_api_url names it " ~ hub_host ~ ", not by an IP address") %}
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
              hub_api_url: {{ hub_api_url | json }}
              host: {{ api.get("host") | json }}
              port: {{ api.get("port") | json }}
              allowed_clients: {{ allowed | json }}
              token_cache_seconds: {{ api.get("token_cache_seconds") | json }}
              limits: {{ api.get("limits") | json }}
    - require:
      - sls: {{ tplroot }}.config
      - test: mpi-api-settings-complete

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
