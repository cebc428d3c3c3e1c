"""
Keep the Docker macvlan network DockerMPI job containers get their own
addresses from.

.. code-block:: yaml

    mpi-docker-network-present:
      mpi_network.present:
        - name: dmpi-jobs
        - subnet: 10.251.1.0/24
        - ip_range: 10.251.1.128/25
        - parent: null

:depends: the ``mpi_network`` execution module (Docker SDK)
"""

from salt.exceptions import CommandExecutionError, SaltInvocationError

__virtualname__ = "mpi_network"


def __virtual__():
    if "mpi_network.present" in __salt__:
        return __virtualname__
    return (
        False,
        "mpi_network: the mpi_network execution module is not available "
        "(is the docker Python package installed?)",
    )


def _held(name, containers):
    return (
        f"Docker network {name} is still used by job containers "
        f"{', '.join(containers)}"
    )


def present(name, subnet, ip_range, parent=None):
    """
    Ensure the macvlan network ``name`` exists with the cluster network as
    subnet and the job address pool as IP range. A network that differs is
    replaced, but only while no container is attached; otherwise the state
    fails naming the containers (in a dry run too).

    name
        Name of the Docker network, e.g. ``dmpi-jobs``.

    subnet
        The cluster network, IPv4 in CIDR form.

    ip_range
        The job address pool, IPv4 in CIDR form, inside ``subnet`` and smaller
        than it.

    parent
        Interface the network sits on. Default (``None`` or empty): the
        interface holding this node's address in ``subnet``.
    """
    ret = {"name": name, "result": False, "changes": {}, "comment": ""}
    parent = parent or None
    try:
        changes = __salt__["mpi_network.diff"](name, subnet, ip_range, parent=parent)
        current = __salt__["mpi_network.inspect"](name) if changes else None
    except (SaltInvocationError, CommandExecutionError) as exc:
        ret["comment"] = f"Docker network {name}: {exc}"
        return ret

    if not changes:
        ret["result"] = True
        ret["comment"] = f"Docker network {name} is as desired (job pool {ip_range})"
        return ret

    if current and current["containers"]:
        ret["comment"] = (
            f"{_held(name, current['containers'])}; it differs in "
            f"{', '.join(sorted(changes))} and can be replaced once they end"
        )
        return ret

    verb = "created" if current is None else "replaced"
    if __opts__["test"]:
        ret["result"] = None
        ret["changes"] = changes
        ret["comment"] = f"Docker network {name} would be {verb}"
        return ret

    try:
        done = __salt__["mpi_network.present"](name, subnet, ip_range, parent=parent)
    except (SaltInvocationError, CommandExecutionError) as exc:
        ret["comment"] = f"Docker network {name}: {exc}"
        return ret

    ret["result"] = True
    if "unchanged" in done:  # someone else made it match meanwhile
        ret["comment"] = f"Docker network {name} is as desired (job pool {ip_range})"
        return ret
    ret["changes"] = changes
    ret["comment"] = f"Docker network {name} {next(iter(done))}"
    return ret


def absent(name):
    """
    Ensure there is no Docker network ``name``. Fails, naming them, while job
    containers are attached to it (in a dry run too).

    name
        Name of the Docker network, e.g. ``dmpi-jobs``.
    """
    ret = {"name": name, "result": False, "changes": {}, "comment": ""}
    try:
        current = __salt__["mpi_network.inspect"](name)
    except (SaltInvocationError, CommandExecutionError) as exc:
        ret["comment"] = f"Docker network {name}: {exc}"
        return ret

    if current is None:
        ret["result"] = True
        ret["comment"] = f"Docker network {name} is absent"
        return ret

    if current["containers"]:
        ret["comment"] = f"{_held(name, current['containers'])}; it cannot be removed"
        return ret

    changes = {"network": {"old": current, "new": None}}
    if __opts__["test"]:
        ret["result"] = None
        ret["changes"] = changes
        ret["comment"] = f"Docker network {name} would be removed"
        return ret

    try:
        __salt__["mpi_network.absent"](name)
    except (SaltInvocationError, CommandExecutionError) as exc:
        ret["comment"] = f"Docker network {name}: {exc}"
        return ret

    ret["result"] = True
    ret["changes"] = changes
    ret["comment"] = f"Docker network {name} removed"
    return ret
