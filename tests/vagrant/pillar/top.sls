base:
  'G@roles:mpi-node':
    - match: compound
    - dockermpi
    # Which shared storage this provider has (the Vagrantfile uploads one of
    # tests/vagrant/storage/ as dockermpi_storage.sls).
    - dockermpi_storage
    # The approved images: written when an image is approved by digest (docs/admin.md).
    - dockermpi_images
    - ignore_missing: True
