{%- set tplroot = tpldir.split('/')[0] %}
{%- from tplroot ~ "/map.jinja" import mpi with context %}
{#- What only a hub needs beyond the checked settings (dockermpi.config, which accepts
    these empty so other hosts need not set them): every other hub state requires this
    one, so a hub missing them changes nothing, in a real run and with test=True alike. #}
{%- set hub = mpi.hub if mpi.hub is mapping else {} %}
{%- set images = mpi.images if mpi.images is mapping else {} %}
{%- set missing = [] %}
{%- for key in ("hub_api_url", "api_url", "api_service_url") if not hub.get(key) %}
{%-   do missing.append("mpi:hub:" ~ key ~ " is required on the hub host") %}
{%- endfor %}
{#- The proxy listens for users with TLS exactly when it has a certificate and key. #}
{%- set tls = hub.get("tls") if hub.get("tls") is mapping else {} %}
{%- set bind_url = hub.get("bind_url") if hub.get("bind_url") is string else "" %}
{%- if bind_url.startswith("https://") and not (tls.get("cert") and tls.get("key")) %}
{%-   do missing.append("mpi:hub:tls:cert and mpi:hub:tls:key are required on the hub host: mpi:hub:bind_url " ~ bind_url ~ " is https (a certificate for the hub's name and, with subdomain_host, its wildcard *.name)") %}
{%- elif (tls.get("cert") or tls.get("key")) and not bind_url.startswith("https://") %}
{%-   do missing.append("mpi:hub:bind_url must be https:// when mpi:hub:tls has a certificate or key, got " ~ bind_url) %}
{%- endif %}
{%- if hub.get("image") not in images %}
{%-   do missing.append("mpi:hub:image " ~ (hub.get("image") | string) ~ " is not an approved image (mpi:images has: " ~ (images | list | sort | join(", ") or "none") ~ ")") %}
{%- endif %}
{%- for name in (hub.get("images") if hub.get("images") is iterable and hub.get("images") is not string else []) if name not in images %}
{%-   do missing.append("mpi:hub:images names " ~ (name | string) ~ ", which is not an approved image (mpi:images has: " ~ (images | list | sort | join(", ") or "none") ~ ")") %}
{%- endfor %}

include:
  - {{ tplroot }}.config

mpi-hub-settings-complete:
  test.configurable_test_state:
    - name: mpi:hub
    - changes: False
    - result: {{ not missing }}
    - allow_test_mode_failure: True
    - comment: {{ (("The mpi:hub settings are incomplete; the hub is not set up until they are:\n" ~ missing | join("\n")) if missing else "The mpi:hub settings are complete") | json }}
    - require:
      - sls: {{ tplroot }}.config
