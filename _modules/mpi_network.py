"""
The Docker macvlan network that gives each DockerMPI job container an address of
its own on the cluster network.

Every MPI node has one such network (``dmpi-jobs`` by default) on the interface
that holds the node's cluster address. Its IPAM pool is the cluster network as
subnet and the job address pool (a part of it, e.g. ``10.251.1.128/25``) as
IP range; the master allocates addresses from that pool and passes an explicit
IPv4 address for every container, so the engines of different nodes never hand
out the same address.

The network's gateway (the containers' default route) is never inside the
pool: when none is given docker takes it from the IP range, which would both
route containers to a job and take an address the master may hand out. It is
the node's default gateway when that lies on the cluster network outside the
pool, else the first host address of the cluster network outside the pool.

:depends: docker (the Docker SDK for Python, 7.1.0), a running Docker engine
"""

import contextlib
import ipaddress
import logging
import re

import dmpi_current

# A minion that outlived an upgrade imports the library below anew (dmpi_current).
dmpi_current.ensure()

import dmpi.pingpong
from dmpi.errors import NodeError
from dmpi.settings import SELFTEST_COUNTS
from salt.exceptions import CommandExecutionError, SaltInvocationError

try:
    import docker
    import docker.errors
    import docker.types
    import requests.exceptions
    from dmpi.node import containers

    HAS_DOCKER = True
except ImportError:  # pragma: no cover - exercised through __virtual__
    HAS_DOCKER = False

log = logging.getLogger(__name__)

__virtualname__ = "mpi_network"

DRIVER = "macvlan"
# Docker's own rule for container and network names.
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def __virtual__():
    if not HAS_DOCKER:
        return (
            False,
            "mpi_network: the docker Python package (Docker SDK) is not installed",
        )
    return __virtualname__


def _check_name(name):
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise SaltInvocationError(
            f"Docker network name {name!r} is invalid: use letters, digits, '_', '.' "
            "or '-', starting with a letter or digit"
        )
    return name


def _ipv4_network(value, what):
    if not isinstance(value, str) or not value:
        raise SaltInvocationError(
            f"{what} must be an IPv4 network in CIDR form, got {value!r}"
        )
    try:
        network = ipaddress.ip_network(value, strict=True)
    except ValueError as exc:
        raise SaltInvocationError(
            f"{what} {value!r} is not an IPv4 network in CIDR form "
            f"(no host bits set): {exc}"
        ) from exc
    if network.version != 4:
        raise SaltInvocationError(f"{what} {value!r} is not an IPv4 network")
    return network


def _networks(subnet, ip_range):
    """Validated (subnet, ip_range) as ``IPv4Network`` objects."""
    subnet_net = _ipv4_network(subnet, "subnet (the cluster network)")
    range_net = _ipv4_network(ip_range, "ip_range (the job address pool)")
    if subnet_net.prefixlen > 30:
        raise SaltInvocationError(
            f"subnet {subnet_net} is too small: it needs a gateway address outside "
            "the job address pool"
        )
    if not range_net.subnet_of(subnet_net):
        raise SaltInvocationError(
            f"ip_range {range_net} is not inside subnet {subnet_net}: the job "
            "address pool must be a part of the cluster network"
        )
    if range_net == subnet_net:
        raise SaltInvocationError(
            f"ip_range {range_net} is the whole subnet {subnet_net}: the job address "
            "pool must leave room for the nodes and the gateway"
        )
    return subnet_net, range_net


def _interface_addresses():
    """[(interface, IPv4Address)] from the ``ip4_interfaces`` grain."""
    found = []
    for iface, addresses in sorted((__grains__.get("ip4_interfaces") or {}).items()):
        for address in addresses or []:
            try:
                found.append((iface, ipaddress.IPv4Address(address)))
            except ValueError:
                continue
    return found


def parent_interface(cluster_network):
    """
    Return the name of the node's interface that holds its address in
    ``cluster_network`` (from the ``ip4_interfaces`` grain). Raises
    ``CommandExecutionError`` when no interface, or more than one, does.

    cluster_network
        IPv4 network in CIDR form, e.g. ``10.251.1.0/24``.

    CLI Example:

    .. code-block:: bash

        salt '*' mpi_network.parent_interface 10.251.1.0/24
    """
    network = _ipv4_network(cluster_network, "cluster_network")
    interfaces = sorted(
        {iface for iface, address in _interface_addresses() if address in network}
    )
    if not interfaces:
        raise CommandExecutionError(
            f"no interface of this node has an address in the cluster network "
            f"{network}; set the parent interface explicitly"
        )
    if len(interfaces) > 1:
        raise CommandExecutionError(
            f"several interfaces of this node have an address in the cluster network "
            f"{network} ({', '.join(interfaces)}); set the parent interface explicitly"
        )
    return interfaces[0]


def _gateway(subnet, ip_range):
    """The gateway for the network: never inside ``ip_range``."""
    default = __grains__.get("ip4_gw")
    if isinstance(default, str):
        try:
            address = ipaddress.IPv4Address(default)
        except ValueError:
            address = None
        if (
            address is not None
            and address in subnet
            and address not in ip_range
            and address not in (subnet.network_address, subnet.broadcast_address)
        ):
            return str(address)
    # _networks() guarantees a /30 or larger subnet and a strictly smaller,
    # aligned ip_range: one of these is a host address outside it.
    for candidate in (subnet.network_address + 1, ip_range.broadcast_address + 1):
        if candidate not in ip_range and candidate < subnet.broadcast_address:
            return str(candidate)
    raise SaltInvocationError(  # pragma: no cover - unreachable after _networks()
        f"no gateway address in {subnet} outside {ip_range}"
    )


@contextlib.contextmanager
def _docker_errors(action):
    """Turn every Docker SDK / requests error into a CommandExecutionError."""
    try:
        yield
    except docker.errors.APIError as exc:
        raise CommandExecutionError(
            f"cannot {action}: {exc.explanation or exc}"
        ) from exc
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        raise CommandExecutionError(f"cannot {action}: {exc}") from exc


def _client():
    try:
        return containers.client(check=True)
    except NodeError as exc:
        raise CommandExecutionError(str(exc)) from exc


def _get(client, name):
    """The Network object named exactly ``name``, or None."""
    with _docker_errors(f"inspect Docker network {name}"):
        try:
            network = client.networks.get(name)
        except docker.errors.NotFound:
            return None
    # the engine also matches ID prefixes; only the exact name counts
    if network.attrs.get("Name") != name:
        return None
    return network


def _summary(attrs):
    pools = (attrs.get("IPAM") or {}).get("Config") or []
    pool = {}
    for config in pools:
        try:
            if ipaddress.ip_network(config.get("Subnet") or "", strict=False).version == 4:
                pool = config
                break
        except ValueError:
            continue
    gateway = pool.get("Gateway") or None
    if gateway:
        gateway = gateway.split("/")[0]
    containers = sorted(
        (info or {}).get("Name") or cid[:12]
        for cid, info in (attrs.get("Containers") or {}).items()
    )
    return {
        "driver": attrs.get("Driver"),
        "parent": (attrs.get("Options") or {}).get("parent"),
        "subnet": pool.get("Subnet") or None,
        "ip_range": pool.get("IPRange") or None,
        "gateway": gateway,
        "containers": containers,
    }


def _same_network(value, wanted):
    try:
        return ipaddress.ip_network(value, strict=False) == wanted
    except (TypeError, ValueError):
        return False


def _gateway_ok(value, subnet, ip_range):
    try:
        address = ipaddress.IPv4Address(value)
    except (TypeError, ValueError):
        return False
    return address in subnet and address not in ip_range


def _plan(client, name, subnet, ip_range, parent):
    """(current summary or None, desired summary, changes)."""
    _check_name(name)
    subnet_net, range_net = _networks(subnet, ip_range)
    for iface, address in _interface_addresses():
        if address in range_net:
            raise CommandExecutionError(
                f"this node's own address {address} ({iface}) lies inside the job "
                f"address pool {range_net}: a job container could be given it"
            )
    parent = parent or parent_interface(str(subnet_net))
    desired = {
        "driver": DRIVER,
        "parent": parent,
        "subnet": str(subnet_net),
        "ip_range": str(range_net),
        "gateway": _gateway(subnet_net, range_net),
    }
    network = _get(client, name)
    if network is None:
        return None, desired, {"network": {"old": None, "new": desired}}
    current = _summary(network.attrs)
    changes = {}
    for key in ("driver", "parent"):
        if current[key] != desired[key]:
            changes[key] = {"old": current[key], "new": desired[key]}
    if not _same_network(current["subnet"], subnet_net):
        changes["subnet"] = {"old": current["subnet"], "new": desired["subnet"]}
    if not _same_network(current["ip_range"], range_net):
        changes["ip_range"] = {"old": current["ip_range"], "new": desired["ip_range"]}
    # any gateway on the cluster network outside the pool will do
    if not _gateway_ok(current["gateway"], subnet_net, range_net):
        changes["gateway"] = {"old": current["gateway"], "new": desired["gateway"]}
    return current, desired, changes


def inspect(name):
    """
    Return the Docker network ``name`` as ``{driver, parent, subnet, ip_range,
    gateway, containers}`` (``containers``: names of the containers attached on
    this node), or ``None`` when there is no network of that name.

    name
        Name of the Docker network, e.g. ``dmpi-jobs``.

    CLI Example:

    .. code-block:: bash

        salt '*' mpi_network.inspect dmpi-jobs
    """
    _check_name(name)
    network = _get(_client(), name)
    if network is None:
        return None
    return _summary(network.attrs)


def diff(name, subnet, ip_range, parent=None):
    """
    Return what ``mpi_network.present`` would change, ``{}`` when the network
    already matches. A missing network gives ``{"network": {"old": None, "new":
    {...}}}``; a differing one gives ``{key: {"old": ..., "new": ...}}`` for each
    of ``driver``, ``parent``, ``subnet``, ``ip_range`` and ``gateway`` that
    differs (a gateway differs only when it is off the subnet or inside the
    pool).

    name
        Name of the Docker network, e.g. ``dmpi-jobs``.

    subnet
        The cluster network, IPv4 in CIDR form, e.g. ``10.251.1.0/24``.

    ip_range
        The job address pool, IPv4 in CIDR form, inside ``subnet`` and smaller
        than it, e.g. ``10.251.1.128/25``.

    parent
        Interface the macvlan network sits on. Default: the interface holding
        this node's address in ``subnet``.

    CLI Example:

    .. code-block:: bash

        salt '*' mpi_network.diff dmpi-jobs 10.251.1.0/24 10.251.1.128/25
    """
    return _plan(_client(), name, subnet, ip_range, parent)[2]


def _create(client, name, desired):
    ipam = docker.types.IPAMConfig(
        pool_configs=[
            docker.types.IPAMPool(
                subnet=desired["subnet"],
                iprange=desired["ip_range"],
                gateway=desired["gateway"],
            )
        ]
    )
    log.debug(
        "mpi_network: creating %s on %s, pool %s",
        name,
        desired["parent"],
        desired["ip_range"],
    )
    with _docker_errors(f"create Docker network {name}"):
        network = client.networks.create(
            name,
            driver=DRIVER,
            options={"parent": desired["parent"]},
            ipam=ipam,
        )
    return _summary(network.attrs)


def _held_message(name, containers):
    return (
        f"Docker network {name} is still used by job containers "
        f"{', '.join(containers)}"
    )


def present(name, subnet, ip_range, parent=None):
    """
    Make sure the macvlan network ``name`` exists as described: create it, or
    replace it when it differs and no container is attached. Raises
    ``CommandExecutionError`` naming the attached containers when it differs
    while jobs hold it. Returns ``{"created": {...}}``, ``{"replaced": {"old":
    {...}, "new": {...}}}`` or ``{"unchanged": {...}}``.

    name
        Name of the Docker network, e.g. ``dmpi-jobs``.

    subnet
        The cluster network, IPv4 in CIDR form, e.g. ``10.251.1.0/24``.

    ip_range
        The job address pool, IPv4 in CIDR form, inside ``subnet`` and smaller
        than it, e.g. ``10.251.1.128/25``.

    parent
        Interface the macvlan network sits on. Default: the interface holding
        this node's address in ``subnet``.

    CLI Example:

    .. code-block:: bash

        salt '*' mpi_network.present dmpi-jobs 10.251.1.0/24 10.251.1.128/25
        salt '*' mpi_network.present dmpi-jobs 10.251.1.0/24 10.251.1.128/25 parent=eth1
    """
    client = _client()
    current, desired, changes = _plan(client, name, subnet, ip_range, parent)
    if current is None:
        return {"created": _create(client, name, desired)}
    if not changes:
        return {"unchanged": current}
    if current["containers"]:
        raise CommandExecutionError(
            f"{_held_message(name, current['containers'])}; it differs in "
            f"{', '.join(sorted(changes))} and can be replaced once they end"
        )
    network = _get(client, name)
    if network is not None:
        log.debug("mpi_network: removing %s to replace it", name)
        with _docker_errors(f"remove Docker network {name} to replace it"):
            network.remove()
    try:
        created = _create(client, name, desired)
    except CommandExecutionError as exc:
        raise CommandExecutionError(
            f"removed Docker network {name} to replace it, but {exc}"
        ) from exc
    return {"replaced": {"old": current, "new": created}}


def absent(name):
    """
    Remove the Docker network ``name``. Raises ``CommandExecutionError``
    naming the attached containers while jobs hold it. Returns ``{"removed":
    {...}}``, or ``{"unchanged": None}`` when there was no such network.

    name
        Name of the Docker network, e.g. ``dmpi-jobs``.

    CLI Example:

    .. code-block:: bash

        salt '*' mpi_network.absent dmpi-jobs
    """
    _check_name(name)
    client = _client()
    network = _get(client, name)
    if network is None:
        return {"unchanged": None}
    current = _summary(network.attrs)
    if current["containers"]:
        raise CommandExecutionError(_held_message(name, current["containers"]))
    log.debug("mpi_network: removing %s", name)
    with _docker_errors(f"remove Docker network {name}"):
        network.remove()
    return {"removed": current}


# ------------------------------------------------------------ the self-test's host side

def _pingpong_args(address, port, timeout, **counts):
    try:
        ipaddress.IPv4Address(address)
    except (ipaddress.AddressValueError, ValueError):
        raise SaltInvocationError(f"address must be an IPv4 address, not {address!r}") from None
    # The self-test's own bounds (mpi:selftest), so a value pillar allows is never refused.
    limits = dict(SELFTEST_COUNTS, port=(1, 65535), timeout=(1, 600),
                  max_bytes=SELFTEST_COUNTS["size"])
    checked = {}
    for name, value in dict(counts, port=port, timeout=timeout).items():
        low, high = limits[name]
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise SaltInvocationError(f"{name} must be a whole number from {low} to {high}, "
                                      f"not {value!r}")
        checked[name] = value
    return checked


def pingpong_echo(address, port, max_bytes, timeout=60):
    """
    Listen on this host's ``address:port`` and echo the messages of one connection of
    the network self-test's TCP ping-pong (:mod:`dmpi.pingpong`) until it closes: the
    host side of ``salt-run mpi.selftest``. Returns how many messages it echoed.

    address
        This host's address on the cluster network.
    port
        A port the node firewall accepts from the cluster network (the self-test uses
        the top of ``mpi:ports:btl``).
    max_bytes
        The longest message accepted.
    timeout
        Seconds to wait for the connection, and for each message.

    CLI Example:

    .. code-block:: bash

        salt node2 mpi_network.pingpong_echo 10.251.1.12 20999 4194304
    """
    args = _pingpong_args(address, port, timeout, max_bytes=max_bytes)
    try:
        listener = dmpi.pingpong.listen(address, args["port"], args["timeout"])
        with listener:
            return dmpi.pingpong.echo(listener, args["max_bytes"], args["timeout"])
    except (OSError, ValueError) as exc:
        raise CommandExecutionError(f"ping-pong echo on {address}:{port}: {exc}") from exc


def pingpong(address, port, size, lat_iters, bw_iters, connect_timeout=30):
    """
    Time the network self-test's TCP ping-pong (:mod:`dmpi.pingpong`) from this host to
    the echo at ``address:port`` (``mpi_network.pingpong_echo`` on the other host):
    ``{latency_us, bandwidth_mb_per_s}``.

    size
        Bytes of the bandwidth messages.
    lat_iters, bw_iters
        Round trips of 1 byte and of ``size`` bytes (after a tenth as many for warm-up).
    connect_timeout
        Seconds to keep trying to connect while the echo starts.

    CLI Example:

    .. code-block:: bash

        salt node1 mpi_network.pingpong 10.251.1.12 20999 4194304 2000 20
    """
    args = _pingpong_args(address, port, connect_timeout, size=size, lat_iters=lat_iters,
                          bw_iters=bw_iters)
    try:
        with dmpi.pingpong.connect(address, args["port"], args["timeout"]) as sock:
            return dmpi.pingpong.measure(sock, args["size"], args["lat_iters"],
                                         args["bw_iters"])
    except OSError as exc:
        raise CommandExecutionError(f"ping-pong to {address}:{port}: {exc}") from exc
