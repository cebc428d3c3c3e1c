# Secrets of the test cluster's hub host (roles:mpi-hub only): not for a real site.
mpi:
  hub:
    authenticator: dummy
    admin_users: [hubadmin]
    # The test suite's admin API token (service dockermpi-admin): tests/cluster/testcluster.py.
    admin_token: dmpi-testcluster-admin-token-0123456789abcdef
    dummy:
      password: dmpi-test-password
      allowed_users: []
    # The host's wheelhouse, mounted read-only by the cluster tool (no PyPI in containers).
    pip:
      find_links: /var/cache/dockermpi/wheelhouse
      no_index: true
