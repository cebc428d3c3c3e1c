{%- set tplroot = tpldir.split('/')[0] %}
{%- from tplroot ~ "/map.jinja" import mpi with context %}
{#- The whole `mpi` pillar, merged over defaults.yaml, checked before anything is
    applied: on a bad pillar this state fails naming every problem, one per line.

    Every SLS of the formula that has states includes this one, and each of its states
    has `require: [sls: dockermpi.config]`, so a bad pillar changes nothing. Why that
    idiom: `failhard` stops a real run but not a test=True one, whose report would then
    differ from what a real run does; `require_in` from here reaches only the SLS files
    it lists (it does not follow includes) and only when this SLS is in the run; a
    require beside each state also holds when one SLS is applied alone, and the render
    test (tests/functional/test_render.py) fails on any state without it. #}

mpi-config-settings-valid:
  mpi_config.valid:
    - name: mpi
    - config: {{ mpi | json }}

{#- Every role's states run services, timers and restarts through systemd (docker, the
    firewall unit, the hub, salt's own restarts): a host booted without it would fail
    each of them with no better word than "error message N/A". #}
{%- set init = grains.get("init", "unknown") %}

mpi-config-host-boots-systemd:
  test.configurable_test_state:
    - name: systemd
    - changes: False
    - result: {{ init == "systemd" }}
    - allow_test_mode_failure: True
    - comment: {{ ("The host boots systemd" if init == "systemd" else "DockerMPI needs a host booted with systemd as PID 1 (grain init is " ~ init ~ "): its states manage Docker, the firewall and Salt's own restarts as systemd units; install systemd-sysv and reboot, or use a host that boots systemd") | json }}
