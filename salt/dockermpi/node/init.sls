include:
  - .jobs
  - .agent
  - .engine
  - .standby
