{%- set tplroot = tpldir.split('/')[0] %}
{%- from tplroot ~ "/map.jinja" import mpi with context %}
{#- Notebooks reach the hub host (its proxy and the hub's API) and, of the rest of the
    cluster network, DockerMPI's API alone (mpi:hub:api_service_url, which they call
    directly): not the master's Salt ports or registry, not a node host. Docker sends every
    container's forwarded traffic through DOCKER-USER first and never flushes that
    chain; the hub host itself is reached through INPUT, which this leaves alone. The API's
    rule returns to Docker's own rules (which let a container's connections out) before
    the refusal of the rest. The rules are put in place now (iptables.insert) and at every
    start of Docker (dockermpi-hub-firewall, ordered before the hub and its notebooks),
    since a boot starts with an empty DOCKER-USER chain.
    Of the hub host itself (reached through INPUT, on any of its addresses), notebooks
    open connections to the hub's API port (mpi:hub:hub_api_url) and the user API's
    port alone: nothing else the host serves (a storage server's NFS, rpcbind or mountd,
    sshd) answers them. #}
{%- set refuse = ["-i", "docker0", "-d", mpi.cluster_network, "-m", "conntrack",
                  "--ctstate", "NEW", "-j", "REJECT"] %}
{%- set api = salt["mpi_config.endpoint"](mpi.hub.api_service_url) %}
{%- set api_is_remote = api and not salt["mpi_config.is_loopback"](api[0]) %}
{%- set allow_api = ["-i", "docker0", "-d", api[0] ~ "/32", "-p", "tcp", "--dport", api[1] | string,
                     "-m", "conntrack", "--ctstate", "NEW", "-j", "RETURN"] if api_is_remote else [] %}
{%- set hub_api = salt["mpi_config.endpoint"](mpi.hub.hub_api_url) %}
{%- set host_ports = ([hub_api[1]] if hub_api else []) + ([api[1]] if api else []) %}
{%- set host_ports = host_ports | unique | list %}
{#- Two refusals that need no order between them or with any other rule. #}
{%- set refuse_host_tcp = ["-i", "docker0", "-p", "tcp", "-m", "multiport", "!", "--dports",
                           host_ports | join(","), "-m", "conntrack", "--ctstate", "NEW",
                           "-j", "REJECT"] %}
{%- set refuse_host_other = ["!", "-p", "tcp", "-i", "docker0", "-m", "conntrack", "--ctstate",
                             "NEW", "-j", "REJECT"] %}

include:
  - {{ tplroot }}.config
  - .settings
  - {{ tplroot }}.docker.service

mpi-hub-firewall-notebooks-reach-only-the-hub:
  iptables.insert:
    - table: filter
    - chain: DOCKER-USER
    - position: 1
    - in-interface: docker0
    - destination: {{ mpi.cluster_network | json }}
    - match: conntrack
    - ctstate: NEW
    - jump: REJECT
    - save: False
    - require:
      - sls: {{ tplroot }}.config
      - sls: {{ tplroot }}.hub.settings
      - service: mpi-docker-service-running
{%- if api_is_remote %}

mpi-hub-firewall-notebooks-reach-the-api:
  iptables.insert:
    - table: filter
    - chain: DOCKER-USER
    - position: 1
    - in-interface: docker0
    - destination: {{ (api[0] ~ "/32") | json }}
    - proto: tcp
    - dport: {{ api[1] }}
    - match: conntrack
    - ctstate: NEW
    - jump: RETURN
    - save: False
    - require:
      - sls: {{ tplroot }}.config
      - sls: {{ tplroot }}.hub.settings
      - iptables: mpi-hub-firewall-notebooks-reach-only-the-hub
{%- endif %}

mpi-hub-firewall-notebooks-reach-the-hub-host-on-its-api-ports-only:
  iptables.insert:
    - table: filter
    - chain: INPUT
    - position: 1
    - in-interface: docker0
    - proto: tcp
    - match:
      - multiport
      - conntrack
    - dports: {{ ("! " ~ host_ports | join(",")) | json }}
    - ctstate: NEW
    - jump: REJECT
    - save: False
    - require:
      - sls: {{ tplroot }}.config
      - sls: {{ tplroot }}.hub.settings
      - service: mpi-docker-service-running

mpi-hub-firewall-notebooks-reach-the-hub-host-over-tcp-only:
  iptables.insert:
    - table: filter
    - chain: INPUT
    - position: 1
    - in-interface: docker0
    - proto: '! tcp'
    - match: conntrack
    - ctstate: NEW
    - jump: REJECT
    - save: False
    - require:
      - sls: {{ tplroot }}.config
      - sls: {{ tplroot }}.hub.settings
      - service: mpi-docker-service-running

mpi-hub-firewall-boot-unit-file:
  file.managed:
    - name: /etc/systemd/system/dockermpi-hub-firewall.service
    - user: root
    - group: root
    - mode: '0644'
    - contents: |
        # Managed by Salt (dockermpi.hub.firewall).
        [Unit]
        Description=DockerMPI: notebooks reach only the hub host and the API on the cluster network
        After=docker.service
        PartOf=docker.service
        Before=dockermpi-hub.service

        [Service]
        Type=oneshot
        RemainAfterExit=yes
        ExecStart=-/usr/sbin/iptables -w -D DOCKER-USER {{ refuse | join(" ") }}
        ExecStart=/usr/sbin/iptables -w -I DOCKER-USER 1 {{ refuse | join(" ") }}
        ExecStart=-/usr/sbin/iptables -w -D INPUT {{ refuse_host_tcp | join(" ") }}
        ExecStart=/usr/sbin/iptables -w -I INPUT 1 {{ refuse_host_tcp | join(" ") }}
        ExecStart=-/usr/sbin/iptables -w -D INPUT {{ refuse_host_other | join(" ") }}
        ExecStart=/usr/sbin/iptables -w -I INPUT 1 {{ refuse_host_other | join(" ") }}
{%- if api_is_remote %}
        ExecStart=-/usr/sbin/iptables -w -D DOCKER-USER {{ allow_api | join(" ") }}
        ExecStart=/usr/sbin/iptables -w -I DOCKER-USER 1 {{ allow_api | join(" ") }}
{%- endif %}

        [Install]
        WantedBy=docker.service
    - require:
      - sls: {{ tplroot }}.config
      - sls: {{ tplroot }}.hub.settings

mpi-hub-firewall-boot-unit-enabled:
  service.enabled:
    - name: dockermpi-hub-firewall
    - require:
      - sls: {{ tplroot }}.config
      - sls: {{ tplroot }}.hub.settings
      - file: mpi-hub-firewall-boot-unit-file
      - service: mpi-docker-service-running
