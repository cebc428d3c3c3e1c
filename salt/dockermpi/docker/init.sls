include:
  - .package
  - .config
  - .service
