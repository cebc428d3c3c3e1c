{%- set tplroot = tpldir.split('/')[0] %}
{%- from tplroot ~ "/map.jinja" import mpi with context %}
{#- The mpi_node engine (_engines/mpi_node.py): a process in the minion that sends the
    node's evidence about its jobs to the master's job controller when it changes (Docker's
    event stream wakes it at once) and a small heartbeat every 2 seconds otherwise.
    Minion engines are read from the minion's configuration at start, so the minion
    restarts when the running one was not started with this configuration (a first run,
    a change, or an earlier restart that did not happen); a transient systemd timer does
    it two seconds later, outside the minion's own processes, so this highstate still
    returns its result. `health` (seconds between looks at the node's health: Docker,
    shared storage, images) is in the configuration so that nodes whose engine predates
    health reports restart into one that sends them: the master schedules no job on a
    node without them. `revision` is the digest of the engine's code as synced for this
    run (mpi_config.engine_revision): an upgrade of DockerMPI restarts the minion into it. #}
{%- set engine_revision = salt['mpi_config.engine_revision']() %}

include:
  - {{ tplroot }}.config
  - .jobs

{#- The node's evidence goes by the mpi_node engine alone: a host that still has the
    mpi_jobs beacon loses it, or it would send every report twice. #}
mpi-node-beacon-absent:
  beacon.absent:
    - name: mpi_jobs
    - save: True
    - require:
      - sls: {{ tplroot }}.config

mpi-node-engine-config:
  file.serialize:
    - name: /etc/salt/minion.d/dockermpi-engine.conf
    - serializer: yaml
    - mode: '0644'
    - dataset:
        engines:
          - mpi_node:
              storage_path: {{ mpi.storage.path | json }}
              job_root: {{ mpi.job_root | json }}
              health: 10
              revision: {{ engine_revision | json }}
    - require:
      - sls: {{ tplroot }}.config
      - file: mpi-node-jobs-root-directory

mpi-node-engine-minion-restart:
  module.run:
    - cmd.run_all:
      # Last state of the run, restart 5 s later: a restart while states still run
      # kills the highstate and its return (seen when the standby state ran after it).
      # (a transient timer fires within a minute by default: ask for the second)
      - cmd: [systemd-run, --on-active=5, --timer-property=AccuracySec=100ms,
              systemctl, restart, salt-minion]
      - python_shell: False
    - order: last
    - unless:
      - fun: mpi_job.node_engine_running
        storage_path: {{ mpi.storage.path | json }}
        job_root: {{ mpi.job_root | json }}
        health: 10
        revision: {{ engine_revision | json }}
    - require:
      - sls: {{ tplroot }}.config
      - file: mpi-node-engine-config
