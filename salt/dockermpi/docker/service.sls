{%- set tplroot = tpldir.split('/')[0] %}

include:
  - {{ tplroot }}.config
  - .package
  - .config

mpi-docker-service-running:
  service.running:
    - name: docker
    - enable: True
    - require:
      - sls: {{ tplroot }}.config
      - pkg: mpi-docker-package-installed
    - watch:
      - file: mpi-docker-config-daemon-json
