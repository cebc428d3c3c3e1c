include:
  - .package
  - .config

mpi-docker-service-running:
  service.running:
    - name: docker
    - enable: True
    - require:
      - pkg: mpi-docker-package-installed
    - watch:
      - file: mpi-docker-config-daemon-json
