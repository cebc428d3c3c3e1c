include:
  - .jobs
  - .engine
  - .standby
