{%- set tplroot = tpldir.split('/')[0] %}
{%- from tplroot ~ "/map.jinja" import mpi with context %}
{#- The master's side of the notebook way in (role mpi-master, on the salt-master's own
    minion): salt-api (rest_cherrypy) over TLS, the jupyterhub eauth module
    (_auth/jupyterhub.py) that asks the hub whose token a caller holds, and the ACL
    that lets hub users call only the user-facing mpi runner functions. The master
    reads external_auth only at start, so it restarts when that configuration changes;
    a transient systemd timer does it two seconds later, so this highstate still
    returns its result to it. #}
{%- set api = mpi.api %}
{%- set names = api.subject_alt_names or
      (["DNS:" ~ grains.fqdn] + (grains.ipv4 | reject("match", "^127\.") | map("regex_replace", "^", "IP:") | list)) %}

include:
  - {{ tplroot }}.config

mpi-api-cherrypy-installed:
  pip.installed:
    - name: {{ api.cherrypy | json }}
    - bin_env: {{ api.salt_pip | json }}
    - require:
      - sls: {{ tplroot }}.config

mpi-api-tls-key:
  x509.private_key_managed:
    - name: {{ (api.tls_dir ~ "/tls.key") | json }}
    - algo: rsa
    - keysize: 3072
    - mode: '0600'
    - makedirs: True
    - require:
      - sls: {{ tplroot }}.config

{#- Self-signed (a site with its own CA puts its certificate and key at these paths and
    keeps them: the state renews only what it made itself, 30 days before the end). #}
mpi-api-tls-certificate:
  x509.certificate_managed:
    - name: {{ (api.tls_dir ~ "/tls.crt") | json }}
    - signing_private_key: {{ (api.tls_dir ~ "/tls.key") | json }}
    - CN: {{ grains.fqdn | json }}
    - subjectAltName: {{ names | join(", ") | json }}
    - basicConstraints: "critical, CA:true, pathlen:0"
    - keyUsage: "critical, digitalSignature, keyEncipherment, keyCertSign"
    - extendedKeyUsage: serverAuth
    - days_valid: {{ api.certificate_days }}
    - days_remaining: 30
    - mode: '0644'
    - require:
      - sls: {{ tplroot }}.config
      - x509: mpi-api-tls-key

mpi-api-certificate-published:
  mpi_api.certificate_published:
    - name: dockermpi_api_certificate
    - path: {{ (api.tls_dir ~ "/tls.crt") | json }}
    - require:
      - sls: {{ tplroot }}.config
      - x509: mpi-api-tls-certificate

mpi-api-eauth-module:
  file.managed:
    - name: {{ (api.auth_dir ~ "/jupyterhub.py") | json }}
    - source: salt://_auth/jupyterhub.py
    - mode: '0644'
    - makedirs: True
    - require:
      - sls: {{ tplroot }}.config

mpi-api-master-config:
  file.serialize:
    - name: /etc/salt/master.d/dockermpi-api.conf
    - serializer: yaml
    - mode: '0600'
    - dataset:
        rest_cherrypy:
          host: {{ api.host | json }}
          port: {{ api.port }}
          ssl_crt: {{ (api.tls_dir ~ "/tls.crt") | json }}
          ssl_key: {{ (api.tls_dir ~ "/tls.key") | json }}
        # salt-api serves the runner client only: no local (minion), wheel or ssh
        # calls, whoever asks.
        netapi_enable_clients:
          - runner
        auth_dirs:
          - {{ api.auth_dir | json }}
        # A salt-api /login token outlives a revoked hub token by at most this long
        # (the mpi client never logs in: it sends the hub token with every call).
        token_expire: {{ api.token_expire }}
        external_auth:
          jupyterhub:
            ^url: {{ mpi.hub.hub_api_url | json }}
            '*':
              - '@runner':
                - '^mpi\.(whoami|submit|launch|wait|status|list|history|usage|logs|cancel)$'
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
      - file: mpi-api-eauth-module
    - require:
      - sls: {{ tplroot }}.config

mpi-api-service-running:
  service.running:
    - name: {{ api.service | json }}
    - enable: True
    - require:
      - sls: {{ tplroot }}.config
      - pip: mpi-api-cherrypy-installed
      - x509: mpi-api-tls-certificate
    - watch:
      - file: mpi-api-master-config
      - x509: mpi-api-tls-certificate
