{#- Reactor for mpi/job/<id>/queued: start what the queue allows now. #}
mpi-reactor-schedule:
  runner.mpi.schedule: []
