{#- Reactor for salt/beacon/<node>/mpi_jobs/report: a node's report on its jobs. #}
mpi-reactor-node-report:
  runner.mpi.node_report:
    - args:
      - node: {{ data['id'] | json }}
      - report: {{ data | json }}
