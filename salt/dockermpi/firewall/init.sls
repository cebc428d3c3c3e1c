include:
  - .package
  - .rules
  - .persist
