include:
  - .present
  - .absent
