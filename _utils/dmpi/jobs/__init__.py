"""
The master's jobs: what a job's record holds (:mod:`~dmpi.jobs.record`), the store of
records (:mod:`~dmpi.jobs.store`), the rules that judge
evidence (:mod:`~dmpi.jobs.rules`), the scheduler (:mod:`~dmpi.jobs.sched`), the job
address pool (:mod:`~dmpi.jobs.addresses`), the checks of a request
(:mod:`~dmpi.jobs.request`) and accounting (:mod:`~dmpi.jobs.accounting`).

This file imports nothing: Salt's loader may load the folder itself as a utils module.
"""
