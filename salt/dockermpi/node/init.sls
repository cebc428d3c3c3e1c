include:
  - .jobs
  - .beacon
