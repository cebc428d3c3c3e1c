include:
  - .jobs
