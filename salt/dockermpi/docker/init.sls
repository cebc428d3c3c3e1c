include:
  - .package
  - .config
  - .service
  - .network
