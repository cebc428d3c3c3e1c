{%- set tplroot = tpldir.split('/')[0] %}
{%- from tplroot ~ "/map.jinja" import mpi with context %}
{#- Notebooks reach the hub host (its proxy, through which they call DockerMPI's API,
    and the hub's API) and nothing else of the cluster network: not the master's Salt
    ports or registry, not the API's own port, not a node host. Docker sends every
    container's forwarded traffic through DOCKER-USER first and never flushes that
    chain; the hub host itself is reached through INPUT, which this leaves alone.
    The rule is put in place now (iptables.insert) and at every start of Docker
    (dockermpi-hub-firewall, ordered before the hub and its notebooks), since a boot
    starts with an empty DOCKER-USER chain. #}
{%- set rule = ["DOCKER-USER", "-i", "docker0", "-d", mpi.cluster_network, "-m", "conntrack",
                "--ctstate", "NEW", "-j", "REJECT"] %}

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

mpi-hub-firewall-boot-unit-file:
  file.managed:
    - name: /etc/systemd/system/dockermpi-hub-firewall.service
    - user: root
    - group: root
    - mode: '0644'
    - contents: |
        # Managed by Salt (dockermpi.hub.firewall).
        [Unit]
        Description=DockerMPI: notebooks reach only the hub host on the cluster network
        After=docker.service
        PartOf=docker.service
        Before=dockermpi-hub.service

        [Service]
        Type=oneshot
        RemainAfterExit=yes
        ExecStart=-/usr/sbin/iptables -w -D {{ rule | join(" ") }}
        ExecStart=/usr/sbin/iptables -w -I {{ rule[0] }} 1 {{ rule[1:] | join(" ") }}

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
