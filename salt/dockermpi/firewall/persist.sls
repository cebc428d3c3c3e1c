{%- set tplroot = tpldir.split('/')[0] %}
{%- from tplroot ~ "/map.jinja" import mpi, mpi_problems with context %}
{#- The same rules restored at boot: rules files for iptables-restore and
    ip6tables-restore --noflush (each flushes and refills only our chain) and a
    oneshot unit that restores them and puts the jumps back at rule 1 of INPUT.
    The execution module renders the files so live and boot rules cannot drift
    apart. With invalid settings (mpi_problems) it is not asked: the files would not
    be written anyway, every state here requires the settings check (.config). #}
{%- set chain = mpi.firewall.chain %}
{%- set rules_file = mpi.firewall.rules_file %}
{%- set rules_file_ipv6 = mpi.firewall.rules_file_ipv6 %}
{%- if mpi_problems %}
{%- set payload, payload_ipv6 = "", "" %}
{%- else %}
{%- set payload = salt['mpi_firewall.restore_payload'](mpi.cluster_network, mpi.ports, chain=chain, family='ipv4') %}
{%- set payload_ipv6 = salt['mpi_firewall.restore_payload'](None, mpi.ports, chain=chain, family='ipv6') %}
{%- endif %}

include:
  - {{ tplroot }}.config
  - .package
  - .rules

mpi-firewall-persist-rules-file:
  file.managed:
    - name: {{ rules_file | json }}
    - contents: {{ payload | json }}
    - user: root
    - group: root
    - mode: '0644'
    - makedirs: True
    - require:
      - sls: {{ tplroot }}.config

mpi-firewall-persist-ipv6-rules-file:
  file.managed:
    - name: {{ rules_file_ipv6 | json }}
    - contents: {{ payload_ipv6 | json }}
    - user: root
    - group: root
    - mode: '0644'
    - makedirs: True
    - require:
      - sls: {{ tplroot }}.config

mpi-firewall-persist-unit-file:
  file.managed:
    - name: /etc/systemd/system/dockermpi-firewall.service
    - user: root
    - group: root
    - mode: '0644'
    - contents: |
        # Managed by Salt (dockermpi.firewall.persist).
        [Unit]
        Description=DockerMPI firewall chain {{ chain }}
        Wants=network-pre.target
        Before=network-pre.target

        [Service]
        Type=oneshot
        RemainAfterExit=yes
        ExecStart=/usr/sbin/iptables-restore -w --noflush {{ rules_file }}
        ExecStart=-/usr/sbin/iptables -w -D INPUT -j {{ chain }}
        ExecStart=/usr/sbin/iptables -w -I INPUT 1 -j {{ chain }}
        ExecStart=/usr/sbin/ip6tables-restore -w --noflush {{ rules_file_ipv6 }}
        ExecStart=-/usr/sbin/ip6tables -w -D INPUT -j {{ chain }}
        ExecStart=/usr/sbin/ip6tables -w -I INPUT 1 -j {{ chain }}

        [Install]
        WantedBy=multi-user.target
    - require:
      - sls: {{ tplroot }}.config

mpi-firewall-persist-service-running:
  service.running:
    - name: dockermpi-firewall
    - enable: True
    - require:
      - sls: {{ tplroot }}.config
      - pkg: mpi-firewall-package-installed
      - mpi_firewall: mpi-firewall-rules-chain-present
      - mpi_firewall: mpi-firewall-rules-ipv6-chain-present
    - watch:
      - file: mpi-firewall-persist-rules-file
      - file: mpi-firewall-persist-ipv6-rules-file
      - file: mpi-firewall-persist-unit-file
