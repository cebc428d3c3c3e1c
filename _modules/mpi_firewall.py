"""
Manage the one iptables chain DockerMPI owns on a node, for IPv4 and IPv6.

The chain (``DOCKERMPI-INPUT`` by default) is jumped to from the first rule of
``INPUT``, in both the IPv4 (``iptables``) and the IPv6 (``ip6tables``) filter
table. Its content is computed from the ``mpi`` pillar: replies to established
connections and loopback traffic go back to ``INPUT``; then every MPI port
range (sshd, Open MPI out-of-band, Open MPI TCP byte-transfer layer)

- ``family=ipv4``: is accepted from the cluster network and dropped for anyone
  else;
- ``family=ipv6``: is dropped for anyone but loopback. The cluster network is
  IPv4, but sshd and Open MPI on a node with host networking may also listen
  on ``::``, which the IPv4 chain alone would leave open.

Nothing outside that chain and the single jump rule is touched.

Rules are compared in the canonical form ``iptables -S`` / ``ip6tables -S``
print, and replaced atomically with ``iptables-restore --noflush`` /
``ip6tables-restore --noflush`` (declaring a user chain in a ``--noflush``
restore flushes only that chain).

:depends: iptables (Debian 12: iptables-nft, which also ships ip6tables) for the
    functions that read or change the live rules; ``desired_rules`` and
    ``restore_payload`` need nothing.
"""

import ipaddress
import logging

import salt.utils.path
import salt.utils.platform
from salt.exceptions import CommandExecutionError, SaltInvocationError

log = logging.getLogger(__name__)

__virtualname__ = "mpi_firewall"

DEFAULT_CHAIN = "DOCKERMPI-INPUT"
PARENT_CHAIN = "INPUT"
#: Port ranges handled first, in this order; other keys of ``ports`` follow sorted.
KNOWN_RANGES = ("sshd", "oob", "btl")
#: Address family -> (listing/changing command, restore command).
FAMILIES = {
    "ipv4": ("iptables", "iptables-restore"),
    "ipv6": ("ip6tables", "ip6tables-restore"),
}


def __virtual__():
    # Not gated on the iptables binaries: the highstate that installs iptables
    # renders the rules file through restore_payload() before the package is
    # there. Functions that run iptables say so when it is missing.
    if not salt.utils.platform.is_linux():
        return (False, "mpi_firewall: iptables chains exist on Linux only")
    return __virtualname__


def _require_binary(name):
    if not salt.utils.path.which(name):
        raise CommandExecutionError(f"{name} is not installed (package iptables)")


def _check_chain_name(chain):
    if (
        not isinstance(chain, str)
        or not chain
        or len(chain) > 28
        or not all(c.isalnum() or c in "-_" for c in chain)
    ):
        raise SaltInvocationError(
            f"chain name {chain!r} is invalid: use 1-28 letters, digits, '-' or '_'"
        )
    return chain


def _commands(family):
    try:
        return FAMILIES[family]
    except (KeyError, TypeError):
        raise SaltInvocationError(
            f"family {family!r} is invalid: use one of {', '.join(FAMILIES)}"
        ) from None


def _network(cluster_network):
    try:
        net = ipaddress.IPv4Network(str(cluster_network), strict=True)
    except ValueError as exc:
        raise SaltInvocationError(
            f"cluster_network {cluster_network!r} is not an IPv4 network in CIDR form "
            f"with no host bits set: {exc}"
        ) from exc
    return net


def _ranges(ports):
    if not isinstance(ports, dict) or not ports:
        raise SaltInvocationError(
            f"ports must be a mapping of name -> [first, last], got {ports!r}"
        )
    missing = [name for name in KNOWN_RANGES if name not in ports]
    if missing:
        raise SaltInvocationError(f"ports is missing the range(s) {', '.join(missing)}")
    names = list(KNOWN_RANGES) + sorted(n for n in ports if n not in KNOWN_RANGES)
    ranges = []
    for name in names:
        value = ports[name]
        if (
            not isinstance(value, (list, tuple))
            or len(value) != 2
            or not all(isinstance(p, int) and not isinstance(p, bool) for p in value)
        ):
            raise SaltInvocationError(
                f"ports:{name} must be a list of two integers [first, last], got {value!r}"
            )
        first, last = value
        if not 1 <= first <= last <= 65535:
            raise SaltInvocationError(
                f"ports:{name} {value!r} is not a range within 1-65535 with first <= last"
            )
        ranges.append((name, first, last))
    return ranges


def desired_rules(cluster_network, ports, chain=DEFAULT_CHAIN, family="ipv4"):
    """
    Return the rules the chain should hold, in the form ``iptables -S`` (or
    ``ip6tables -S``) prints.

    cluster_network
        IPv4 network in CIDR form (``10.0.0.0/8``) allowed to reach the MPI ports.
        Checked for ``ipv4`` only; with ``ipv6`` it is not used (pass ``None``)
        since the cluster network is IPv4.

    ports
        Mapping of range name to ``[first, last]`` (inclusive); must contain
        ``sshd``, ``oob`` and ``btl``.

    chain
        Name of the chain. Default: ``DOCKERMPI-INPUT``.

    family
        ``ipv4`` (default): each range is accepted from ``cluster_network`` and
        dropped for anyone else. ``ipv6``: each range is dropped for anyone but
        loopback.

    CLI Example:

    .. code-block:: bash

        salt '*' mpi_firewall.desired_rules 10.0.0.0/8 '{"sshd": [20000, 20099], "oob": [20100, 20299], "btl": [20300, 20999]}'
        salt '*' mpi_firewall.desired_rules None '{"sshd": [20000, 20099], "oob": [20100, 20299], "btl": [20300, 20999]}' family=ipv6
    """
    chain = _check_chain_name(chain)
    _commands(family)
    net = _network(cluster_network) if family == "ipv4" else None
    rules = [
        f"-A {chain} -m conntrack --ctstate RELATED,ESTABLISHED -j RETURN",
        f"-A {chain} -i lo -j RETURN",
    ]
    for _name, first, last in _ranges(ports):
        dport = str(first) if first == last else f"{first}:{last}"
        if net is not None:
            rules.append(f"-A {chain} -s {net} -p tcp -m tcp --dport {dport} -j ACCEPT")
        rules.append(f"-A {chain} -p tcp -m tcp --dport {dport} -j DROP")
    return rules


def restore_payload(cluster_network, ports, chain=DEFAULT_CHAIN, family="ipv4"):
    """
    Return the ``iptables-restore --noflush`` (``ip6tables-restore`` for
    ``ipv6``) input that replaces the chain's rules with the desired ones in one
    transaction. Used both to apply the rules and as the rules file restored at
    boot.

    cluster_network
        IPv4 network in CIDR form allowed to reach the MPI ports (``ipv4`` only).

    ports
        Mapping of range name to ``[first, last]``.

    chain
        Name of the chain. Default: ``DOCKERMPI-INPUT``.

    family
        ``ipv4`` (default) or ``ipv6``; see :py:func:`desired_rules`.

    CLI Example:

    .. code-block:: bash

        salt '*' mpi_firewall.restore_payload 10.0.0.0/8 '{"sshd": [20000, 20099], "oob": [20100, 20299], "btl": [20300, 20999]}'
    """
    rules = desired_rules(cluster_network, ports, chain=chain, family=family)
    restore = _commands(family)[1]
    lines = [
        f"# Managed by Salt (dockermpi.firewall); restored with {restore} --noflush.",
        "*filter",
        f":{chain} - [0:0]",
        *rules,
        "COMMIT",
    ]
    return "\n".join(lines) + "\n"


def _iptables(args, family="ipv4"):
    binary = _commands(family)[0]
    _require_binary(binary)
    cmd = [binary, "-w"] + list(args)
    res = __salt__["cmd.run_all"](cmd, python_shell=False, ignore_retcode=True)
    if res["retcode"] != 0:
        raise CommandExecutionError(
            f"{' '.join(cmd)} failed (exit {res['retcode']}): "
            f"{(res.get('stderr') or res.get('stdout') or '').strip()}"
        )
    return res["stdout"]


def current_rules(chain=DEFAULT_CHAIN, family="ipv4"):
    """
    Return the rules the chain holds now (``iptables -S`` lines without the
    ``-N`` line), or ``None`` when the chain does not exist.

    chain
        Name of the chain. Default: ``DOCKERMPI-INPUT``.

    family
        ``ipv4`` (default, ``iptables``) or ``ipv6`` (``ip6tables``).

    CLI Example:

    .. code-block:: bash

        salt '*' mpi_firewall.current_rules
        salt '*' mpi_firewall.current_rules family=ipv6
    """
    chain = _check_chain_name(chain)
    # List the whole filter table: asking iptables-nft for a missing chain gives a
    # misleading error, and legacy iptables a different one.
    lines = _iptables(["-t", "filter", "-S"], family=family).splitlines()
    if f"-N {chain}" not in lines:
        return None
    prefix = f"-A {chain} "
    return [line for line in lines if line.startswith(prefix)]


def jump_rules(chain=DEFAULT_CHAIN, parent=PARENT_CHAIN, family="ipv4"):
    """
    Return the 1-based positions in ``parent`` of rules jumping to ``chain``.

    chain
        Name of the chain. Default: ``DOCKERMPI-INPUT``.

    parent
        Built-in chain holding the jump. Default: ``INPUT``.

    family
        ``ipv4`` (default, ``iptables``) or ``ipv6`` (``ip6tables``).

    CLI Example:

    .. code-block:: bash

        salt '*' mpi_firewall.jump_rules
    """
    chain = _check_chain_name(chain)
    parent = _check_chain_name(parent)
    rules = [
        line
        for line in _iptables(["-t", "filter", "-S", parent], family=family).splitlines()
        if line.startswith(f"-A {parent} ")
    ]
    return [
        pos for pos, line in enumerate(rules, 1) if line == f"-A {parent} -j {chain}"
    ]


def diff(cluster_network, ports, chain=DEFAULT_CHAIN, family="ipv4"):
    """
    Compare the chain with the desired rules.

    Returns a mapping with ``in_sync`` (bool), ``chain_exists``, ``jump_ok`` (the
    only jump to the chain is rule 1 of ``INPUT``), ``old`` and ``new`` (rule lists).

    cluster_network
        IPv4 network in CIDR form allowed to reach the MPI ports (``ipv4`` only).

    ports
        Mapping of range name to ``[first, last]``.

    chain
        Name of the chain. Default: ``DOCKERMPI-INPUT``.

    family
        ``ipv4`` (default) or ``ipv6``; see :py:func:`desired_rules`.

    CLI Example:

    .. code-block:: bash

        salt '*' mpi_firewall.diff 10.0.0.0/8 '{"sshd": [20000, 20099], "oob": [20100, 20299], "btl": [20300, 20999]}'
    """
    new = desired_rules(cluster_network, ports, chain=chain, family=family)
    old = current_rules(chain=chain, family=family)
    jumps = jump_rules(chain=chain, family=family) if old is not None else []
    jump_ok = jumps == [1]
    return {
        "in_sync": old == new and jump_ok,
        "chain_exists": old is not None,
        "jump_ok": jump_ok,
        "jumps": jumps,
        "old": old or [],
        "new": new,
    }


def apply(cluster_network, ports, chain=DEFAULT_CHAIN, family="ipv4"):
    """
    Make the chain hold exactly the desired rules and make rule 1 of ``INPUT``
    its only jump. Rules are replaced in one ``iptables-restore`` (or
    ``ip6tables-restore``) transaction. Returns the result of :py:func:`diff`
    after the change.

    cluster_network
        IPv4 network in CIDR form allowed to reach the MPI ports (``ipv4`` only).

    ports
        Mapping of range name to ``[first, last]``.

    chain
        Name of the chain. Default: ``DOCKERMPI-INPUT``.

    family
        ``ipv4`` (default) or ``ipv6``; see :py:func:`desired_rules`.

    CLI Example:

    .. code-block:: bash

        salt '*' mpi_firewall.apply 10.0.0.0/8 '{"sshd": [20000, 20099], "oob": [20100, 20299], "btl": [20300, 20999]}'
    """
    payload = restore_payload(cluster_network, ports, chain=chain, family=family)
    restore = _commands(family)[1]
    _require_binary(restore)
    res = __salt__["cmd.run_all"](
        [restore, "-w", "--noflush"],
        stdin=payload,
        python_shell=False,
        ignore_retcode=True,
    )
    if res["retcode"] != 0:
        raise CommandExecutionError(
            f"{restore} of chain {chain} failed (exit {res['retcode']}): "
            f"{(res.get('stderr') or res.get('stdout') or '').strip()}"
        )
    jumps = jump_rules(chain=chain, family=family)
    if jumps != [1]:
        # Delete from the bottom so positions stay valid, then insert at the top.
        for pos in sorted(jumps, reverse=True):
            _iptables(["-t", "filter", "-D", PARENT_CHAIN, str(pos)], family=family)
        _iptables(["-t", "filter", "-I", PARENT_CHAIN, "1", "-j", chain], family=family)
    log.debug("mpi_firewall: chain %s (%s) applied", chain, family)
    after = diff(cluster_network, ports, chain=chain, family=family)
    if not after["in_sync"]:
        raise CommandExecutionError(
            f"{family} chain {chain} still differs from the desired rules after applying them: "
            f"has {after['old']}, jumps at {after['jumps']}"
        )
    return after
