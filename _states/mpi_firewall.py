"""
Keep DockerMPI's iptables chain equal to the rules computed from the pillar, in
the IPv4 and the IPv6 filter table.

.. code-block:: yaml

    mpi-firewall-rules-chain-present:
      mpi_firewall.chain_present:
        - name: DOCKERMPI-INPUT
        - cluster_network: 10.0.0.0/8
        - ports:
            sshd: [20000, 20099]
            oob: [20100, 20299]
            btl: [20300, 20999]

    mpi-firewall-rules-ipv6-chain-present:
      mpi_firewall.chain_present:
        - name: DOCKERMPI-INPUT
        - family: ipv6
        - ports:
            sshd: [20000, 20099]
            oob: [20100, 20299]
            btl: [20300, 20999]

:depends: the ``mpi_firewall`` execution module (iptables, ip6tables)
"""

from salt.exceptions import CommandExecutionError, SaltInvocationError

__virtualname__ = "mpi_firewall"


def __virtual__():
    if "mpi_firewall.diff" in __salt__:
        return __virtualname__
    return (False, "mpi_firewall: the mpi_firewall execution module is not available")


def _changes(before, after_rules):
    changes = {}
    if not before["chain_exists"]:
        changes["chain"] = {"old": None, "new": "created"}
    removed = [r for r in before["old"] if r not in after_rules]
    added = [r for r in after_rules if r not in before["old"]]
    if removed or added:
        changes["rules"] = {"removed": removed, "added": added}
    elif before["old"] != after_rules:
        changes["rules"] = {"old": before["old"], "new": after_rules}
    if not before["jump_ok"]:
        changes["jump"] = {
            "old": f"INPUT positions {before['jumps']}",
            "new": "INPUT position 1",
        }
    return changes


def chain_present(name, cluster_network=None, ports=None, family="ipv4"):
    """
    Ensure the chain ``name`` holds exactly the DockerMPI rules and is jumped
    to from rule 1 of ``INPUT``. Applies only when something differs.

    name
        Name of the chain, e.g. ``DOCKERMPI-INPUT``.

    cluster_network
        IPv4 network in CIDR form allowed to reach the MPI ports. Required for
        ``ipv4``; not used for ``ipv6``.

    ports
        Mapping of range name to ``[first, last]``; must contain ``sshd``,
        ``oob`` and ``btl``.

    family
        ``ipv4`` (default, ``iptables``): each range is accepted from
        ``cluster_network`` and dropped for anyone else. ``ipv6``
        (``ip6tables``): each range is dropped for anyone but loopback.
    """
    ret = {"name": name, "result": False, "changes": {}, "comment": ""}
    what = name if family == "ipv4" else f"{name} ({family})"
    try:
        before = __salt__["mpi_firewall.diff"](
            cluster_network, ports, chain=name, family=family
        )
    except (SaltInvocationError, CommandExecutionError) as exc:
        ret["comment"] = f"Cannot read chain {what}: {exc}"
        return ret

    if before["in_sync"]:
        ret["result"] = True
        ret["comment"] = f"Chain {what} holds the {len(before['new'])} desired rules"
        return ret

    changes = _changes(before, before["new"])
    if __opts__["test"]:
        ret["result"] = None
        ret["changes"] = changes
        ret["comment"] = f"Chain {what} would be updated"
        return ret

    try:
        __salt__["mpi_firewall.apply"](cluster_network, ports, chain=name, family=family)
    except (SaltInvocationError, CommandExecutionError) as exc:
        ret["comment"] = f"Failed to update chain {what}: {exc}"
        return ret

    ret["result"] = True
    ret["changes"] = changes
    ret["comment"] = f"Chain {what} updated"
    return ret
