"""
DockerMPI's remote-start agent on a node: the sshd and ssh that start a job's ranks in
any image, assembled from the node's Debian packages and mounted read-only into job
containers (:mod:`dmpi.node.agent`).

:depends: apt-get, dpkg-deb, ldd
"""

import dmpi_current

# A minion that outlived an upgrade imports the library below anew (dmpi_current).
dmpi_current.ensure()

from dmpi.contract import AGENT_DIR
from dmpi.errors import NodeError
from dmpi.node import agent
from salt.exceptions import CommandExecutionError

__virtualname__ = "mpi_agent"


def __virtual__():
    if __grains__.get("os_family") == "Debian":
        return __virtualname__
    return (False, "mpi_agent: the agent is assembled from Debian packages")


def status():
    """
    What the node's agent is and why it would be built again: ``{"path",
    "manifest", "wanted": {package: version}, "problems": [...]}`` (no problems: it is
    current).

    CLI Example:

    .. code-block:: bash

        salt '*' mpi_agent.status
    """
    try:
        wanted = agent.candidate_versions()
    except NodeError as exc:
        raise CommandExecutionError(str(exc)) from exc
    return {"path": AGENT_DIR, "manifest": agent.current(), "wanted": wanted,
            "problems": agent.problems(wanted=wanted)}


def build():
    """
    Assemble the agent from the OpenSSH packages apt offers now and make it current
    (the previous build stays for the jobs that have it mounted). Returns its manifest.

    CLI Example:

    .. code-block:: bash

        salt '*' mpi_agent.build
    """
    try:
        return agent.build()
    except (NodeError, OSError) as exc:
        raise CommandExecutionError(f"cannot build the remote-start agent: {exc}") from exc
