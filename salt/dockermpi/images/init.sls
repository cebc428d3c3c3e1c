include:
  - .present
