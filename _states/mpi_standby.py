"""
Keep the network namespaces a DockerMPI node makes ahead of jobs, so that a node's first
job after provisioning starts as fast as the next ones (each job's clean-up keeps them
afterwards).

.. code-block:: yaml

    mpi-node-standby-namespaces:
      mpi_standby.present:
        - name: mpi
        - image: registry.example:5000/mpi/openmpi@sha256:0123...cdef
        - count: 2

:depends: the ``mpi_job`` execution module (Docker SDK)
"""

from salt.exceptions import CommandExecutionError, SaltInvocationError

__virtualname__ = "mpi_standby"


def __virtual__():
    if "mpi_job.standby" in __salt__:
        return __virtualname__
    return False, "mpi_standby: the mpi_job execution module is not available"


def present(name, image, count):
    """
    Ensure ``count`` standby network namespaces run on this node (``mpi_job.standby``):
    makes the missing ones, removes extra or stopped ones.

    name
        The approved image's short name (for the comment).
    image
        Its reference, pinned by digest; the holders run ``sleep`` from it.
    count
        ``mpi:job_network:standby`` (0 to 16; 0 removes them all).
    """
    ret = {"name": name, "result": False, "changes": {}, "comment": ""}
    try:
        status = __salt__["mpi_job.standby_status"]()
    except (SaltInvocationError, CommandExecutionError) as exc:
        ret["comment"] = f"standby network namespaces: {exc}"
        return ret
    make = max(0, count - status["ready"])
    remove = status["not_running"] + max(0, status["ready"] - count)
    if not make and not remove:
        ret["result"] = True
        ret["comment"] = f"{count} standby network namespaces are ready"
        return ret
    if __opts__["test"]:
        ret["result"] = None
        ret["changes"] = {"made": make, "removed": remove}
        ret["comment"] = (f"{make} standby network namespaces would be made and {remove} "
                          f"removed (to keep {count}, from image {name})")
        return ret
    try:
        done = __salt__["mpi_job.standby"](image, count)
    except (SaltInvocationError, CommandExecutionError) as exc:
        ret["comment"] = f"standby network namespaces: {exc}"
        return ret
    ret["result"] = True
    if done["made"] or done["removed"]:
        ret["changes"] = {"made": done["made"], "removed": done["removed"]}
    ret["comment"] = f"{done['ready']} standby network namespaces are ready (image {name})"
    return ret
