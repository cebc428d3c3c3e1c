{%- set tplroot = tpldir.split('/')[0] %}
{%- from tplroot ~ "/map.jinja" import mpi with context %}
{#- The mpi_jobs beacon (_beacons/mpi_jobs.py): every second the node fires its evidence
    about each job (containers, launcher exit and failed rank, Docker engine, whether it
    still reaches the job's other nodes) as salt/beacon/<id>/mpi_jobs/report. The event is
    also the node's heartbeat. Saved to beacons.conf so it survives a minion restart. #}

include:
  - {{ tplroot }}.config
  - .jobs

mpi-node-beacon-present:
  beacon.present:
    - name: mpi_jobs
    - save: True
    - interval: 1
    - storage_path: {{ mpi.storage.path | json }}
    - job_root: {{ mpi.job_root | json }}
    - require:
      - sls: {{ tplroot }}.config
      - file: mpi-node-jobs-root-directory
