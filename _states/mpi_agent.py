"""
Make sure a node has DockerMPI's remote-start agent, built from the OpenSSH packages
its apt offers now.

.. code-block:: yaml

    mpi-node-agent:
      mpi_agent.present

:depends: the ``mpi_agent`` execution module
"""

from salt.exceptions import CommandExecutionError

__virtualname__ = "mpi_agent"


def __virtual__():
    if "mpi_agent.build" in __salt__:
        return __virtualname__
    return (False, "mpi_agent: the mpi_agent execution module is not available")


def present(name):
    """
    Ensure the agent is current: built the way this version of DockerMPI builds it, of
    the OpenSSH versions apt would install now, and no file of it changed. Otherwise it
    is built again (``test=True`` says why it would be).

    name
        Any name (the state's id).
    """
    ret = {"name": name, "result": False, "changes": {}, "comment": ""}
    try:
        found = __salt__["mpi_agent.status"]()
    except CommandExecutionError as exc:
        ret["comment"] = str(exc)
        return ret
    if not found["problems"]:
        ret["result"] = True
        ret["comment"] = (f"the remote-start agent at {found['path']} is current "
                          f"(build {found['manifest']['build']})")
        return ret
    why = "; ".join(found["problems"])
    old = (found["manifest"] or {}).get("build")
    if __opts__["test"]:
        ret["result"] = None
        ret["comment"] = f"the remote-start agent would be built: {why}"
        ret["changes"] = {"agent": {"old": old, "new": "built from " + ", ".join(
            f"{p} {v}" for p, v in sorted(found["wanted"].items()))}}
        return ret
    try:
        manifest = __salt__["mpi_agent.build"]()
    except CommandExecutionError as exc:
        ret["comment"] = str(exc)
        return ret
    ret["result"] = True
    ret["comment"] = f"the remote-start agent was built: {why}"
    ret["changes"] = {"agent": {"old": old, "new": manifest["build"]}}
    return ret
