include:
  - .user
