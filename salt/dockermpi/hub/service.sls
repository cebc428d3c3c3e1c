{%- set tplroot = tpldir.split('/')[0] %}
{%- from tplroot ~ "/map.jinja" import mpi with context %}
{#- The hub as the systemd service dockermpi-hub, restarted when its configuration,
    spawner or packages change; it starts notebooks only once the firewall keeps them
    from the rest of the cluster network (.firewall). Its state (sqlite database,
    cookie secret, proxy pid) is in mpi:hub:state_dir. It runs as root: it drives the
    local Docker engine, which is root's anyway. #}
{%- set hub = mpi.hub %}

include:
  - {{ tplroot }}.config
  - .settings
  - {{ tplroot }}.docker.service
  - .image
  - .proxy
  - .venv
  - .firewall
  - .config

mpi-hub-service-state-directory:
  file.directory:
    - name: {{ hub.state_dir | json }}
    - user: root
    - group: root
    - mode: '0700'
    - makedirs: True
    - require:
      - sls: {{ tplroot }}.config
      - sls: {{ tplroot }}.hub.settings

mpi-hub-service-unit-file:
  file.managed:
    - name: /etc/systemd/system/dockermpi-hub.service
    - user: root
    - group: root
    - mode: '0644'
    - contents: |
        # Managed by Salt (dockermpi.hub.service).
        [Unit]
        Description=DockerMPI JupyterHub
        Wants=network-online.target
        After=network-online.target docker.service
        Requires=docker.service

        [Service]
        Environment=PYTHONPATH=/etc/dockermpi/hub
        Environment=DOCKERMPI_HUB_SETTINGS=/etc/dockermpi/hub/settings.json
        Environment=PATH={{ hub.venv }}/bin:/usr/local/bin:/usr/bin:/bin
        WorkingDirectory={{ hub.state_dir }}
        ExecStart={{ hub.venv }}/bin/jupyterhub -f /etc/dockermpi/hub/jupyterhub_config.py
        Restart=on-failure
        RestartSec=2

        [Install]
        WantedBy=multi-user.target
    - require:
      - sls: {{ tplroot }}.config
      - sls: {{ tplroot }}.hub.settings

mpi-hub-service-running:
  service.running:
    - name: dockermpi-hub
    - enable: True
    - require:
      - sls: {{ tplroot }}.config
      - sls: {{ tplroot }}.hub.settings
      - service: mpi-docker-service-running
      - sls: {{ tplroot }}.hub.image
      - pkg: mpi-hub-proxy-package-installed
      - file: mpi-hub-service-state-directory
      - iptables: mpi-hub-firewall-notebooks-reach-only-the-hub
      - iptables: mpi-hub-firewall-notebooks-reach-the-hub-host-on-its-api-ports-only
      - iptables: mpi-hub-firewall-notebooks-reach-the-hub-host-over-tcp-only
    - watch:
      - file: mpi-hub-service-unit-file
      - file: mpi-hub-config-settings-json
      - file: mpi-hub-config-jupyterhub-config
      - file: mpi-hub-config-spawner-module
      - file: mpi-hub-config-ssl-cert
      - file: mpi-hub-config-ssl-key
      - file: mpi-hub-config-hub-ca-file
      - file: mpi-hub-config-api-ca-file
      - pip: mpi-hub-venv-pip-installed
