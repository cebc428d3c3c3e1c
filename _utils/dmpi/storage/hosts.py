"""
What the shared storage trusts on the hosts that speak to it. GlusterFS (its bricks serve
only clients bound to a privileged port) and NFS ``sec=sys`` (``secure``) take a client's
claimed uid as true when it comes from a port below 1024 of a listed host: that holds
only while below 1024 only root can bind on every such host.
"""

from dmpi.errors import DockerMPIError

#: Where the kernel keeps the lowest port an unprivileged process may bind.
PORT_FLOOR_PATH = "/proc/sys/net/ipv4/ip_unprivileged_port_start"
#: The kernel's default: every port below it is root's alone.
PRIVILEGED_PORTS = 1024


def unprivileged_port_start(path=PORT_FLOOR_PATH):
    """The lowest port an unprivileged process may bind on this host; DockerMPIError
    when it cannot be read."""
    try:
        with open(path, encoding="ascii") as found:
            return int(found.read().strip())
    except (OSError, ValueError) as exc:
        raise DockerMPIError(f"cannot read {path}: {exc}") from None


def port_floor_problem(path=PORT_FLOOR_PATH):
    """Why this host's unprivileged accounts could speak to the shared storage as any uid
    (they may bind a port below 1024), or None when they cannot."""
    start = unprivileged_port_start(path)
    if start >= PRIVILEGED_PORTS:
        return None
    return (f"net.ipv4.ip_unprivileged_port_start is {start} on this host: any local "
            f"account can bind a port below {PRIVILEGED_PORTS} and so read and write every "
            "user's files on the shared storage as their uid (GlusterFS and NFS sec=sys "
            "trust a host's privileged ports); set it back to 1024 (sysctl "
            "net.ipv4.ip_unprivileged_port_start=1024, and in /etc/sysctl.d)")
