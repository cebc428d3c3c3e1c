mpi-firewall-package-installed:
  pkg.installed:
    - name: iptables
