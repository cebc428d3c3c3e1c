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
