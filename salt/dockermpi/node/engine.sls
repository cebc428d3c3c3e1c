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
    run (mpi_config.engine_revision): an upgrade of DockerMPI restarts the minion into it.
    `multiprocessing: False`: the minion runs each call (a job's start and clean-up, every
    read of a followed job's output) in a thread of its own process, where DockerMPI's
    library and the Docker SDK stay loaded, instead of a new process that loads them
    again (docs/benchmarks.md has what it saves). #}
{#- The engine's settings and the minion's, named once: its configuration and the
    restart's check must say the same, or the minion restarts at every highstate. #}
{%- set engine_settings = {"storage_path": mpi.storage.path, "job_root": mpi.job_root,
                           "health": 10,
                           "revision": salt['mpi_config.engine_revision']()} %}
{%- set minion_settings = {"multiprocessing": False} %}

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
    - dataset: {{ dict(minion_settings, engines=[{"mpi_node": engine_settings}]) | json }}
    - require:
      - sls: {{ tplroot }}.config
      - file: mpi-node-jobs-root-directory

{#- In threads, Salt's saltutil.kill_job signals the call's pid, which is the minion's own
    (and its children's, the engine included). Salt's packaged unit does not restart the
    minion: with this it comes back two seconds later instead of leaving the node silent
    until someone starts it, and a silent node's jobs are kept while its host answers
    (mpi:engine:silent_grace). #}
mpi-node-minion-restarts-always:
  file.managed:
    - name: /etc/systemd/system/salt-minion.service.d/dockermpi.conf
    - makedirs: True
    - mode: '0644'
    - contents: |
        [Service]
        Restart=always
        RestartSec=2
    - require:
      - sls: {{ tplroot }}.config

mpi-node-minion-restarts-always-loaded:
  module.run:
    - cmd.run_all:
      - cmd: [systemctl, daemon-reload]
      - python_shell: False
    - onchanges:
      - file: mpi-node-minion-restarts-always
    - require:
      - sls: {{ tplroot }}.config

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
      - {{ dict(engine_settings, fun="mpi_config.node_engine_running", **minion_settings) | json }}
    - require:
      - sls: {{ tplroot }}.config
      - file: mpi-node-engine-config
