include:
  - .jobs
  - .engine
