{%- set tplroot = tpldir.split('/')[0] %}
{%- from tplroot ~ "/map.jinja" import mpi with context %}

include:
  - {{ tplroot }}.config
  - .package
{#- No `hosts` key: the engine keeps its default unix socket only (a `hosts`
    key would also clash with dockerd's `-H fd://` in Debian's unit).
    live-restore: a restart of dockerd (this file changed, a docker.io upgrade) leaves
    running job containers running; the node reports the outage as "not yet known"
    for a grace period (mpi_job.report) so their jobs are not failed for it. #}
{%- set daemon = {
      "log-driver": "json-file",
      "log-opts": {
        "max-size": mpi.docker.log_max_size | string,
        "max-file": mpi.docker.log_max_file | string,
      },
      "insecure-registries": mpi.docker.insecure_registries,
      "live-restore": true,
    } %}

mpi-docker-config-daemon-json:
  file.serialize:
    - name: /etc/docker/daemon.json
    - serializer: json
    - dataset: {{ daemon | json }}
    - user: root
    - group: root
    - mode: '0644'
    - makedirs: True
    - require:
      - sls: {{ tplroot }}.config
      - pkg: mpi-docker-package-installed
