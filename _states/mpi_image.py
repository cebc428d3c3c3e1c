"""
Make sure an approved, digest-pinned image is present on a node's Docker engine.

.. code-block:: yaml

    mpi-images-present-openmpi:
      mpi_image.present:
        - name: openmpi
        - reference: registry.example:5000/mpi/openmpi@sha256:0123...cdef

:depends: the ``mpi_image`` execution module (Docker SDK)
"""

import dmpi_current

# A minion that outlived an upgrade imports the library below anew (dmpi_current).
dmpi_current.ensure()

from dmpi.launch import probe as image_probe
from salt.exceptions import CommandExecutionError, SaltInvocationError

__virtualname__ = "mpi_image"


def __virtual__():
    if "mpi_image.pull" in __salt__:
        return __virtualname__
    return (
        False,
        "mpi_image: the mpi_image execution module is not available "
        "(is the docker Python package installed?)",
    )


def present(name, reference):
    """
    Ensure the image ``reference`` is present, pulling it by digest if needed, and
    probed: what it holds for MPI jobs is found in a throw-away container
    (``mpi_image.probe``) once per image, and kept on the node for the master. An image
    jobs cannot run on (no MPI, or one DockerMPI cannot launch) is still present and
    the state succeeds: the comment says why, and submits of jobs on it are refused
    with that reason. With ``test=True`` the registry is asked (without pulling)
    whether it has the digest, so a wrong digest fails the dry run too.

    name
        Short name of the approved image (the key under ``mpi:images``); used
        in messages.

    reference
        ``registry/repo@sha256:<64 hex>``. References not pinned by digest are
        rejected.
    """
    ret = {"name": name, "result": False, "changes": {}, "comment": ""}
    try:
        __salt__["mpi_image.parse_reference"](reference)
        found = __salt__["mpi_image.inspect"](reference)
    except (SaltInvocationError, CommandExecutionError) as exc:
        ret["comment"] = f"Image {name} ({reference!r}): {exc}"
        return ret

    if found:
        if not __opts__["test"]:
            __salt__["mpi_image.record_pulled"](reference)  # pulled before the ledger
        ret["result"] = True
        ret["comment"] = f"Image {name} is present as {reference} ({found['id']})"
        return _probed(ret, reference)

    if __opts__["test"]:
        try:
            __salt__["mpi_image.registry_has"](reference)
        except CommandExecutionError as exc:
            ret["comment"] = f"Image {name} could not be pulled: {exc}"
            return ret
        ret["result"] = None
        ret["changes"] = {"pulled": {"old": None, "new": reference}}
        ret["comment"] = f"Image {name} would be pulled from {reference} and probed"
        return ret

    try:
        pulled = __salt__["mpi_image.pull"](reference)
    except (SaltInvocationError, CommandExecutionError) as exc:
        ret["comment"] = f"Image {name}: {exc}"
        return ret

    ret["result"] = True
    ret["changes"] = {"pulled": {"old": None, "new": reference, "id": pulled["id"]}}
    ret["comment"] = f"Image {name} pulled from {reference} ({pulled['id']})"
    return _probed(ret, reference)


def _probed(ret, reference):
    """``ret`` once the present image is probed (unless it was before)."""
    try:
        facts = __salt__["mpi_image.facts"](reference)
        if facts is not None and facts.get("probe_version") == image_probe.PROBE_VERSION:
            return ret
        if __opts__["test"]:
            ret["result"] = None
            ret["changes"]["probed"] = {"old": None, "new": "what the image holds for MPI jobs"}
            ret["comment"] += "; it would be probed"
            return ret
        facts = __salt__["mpi_image.probe"](reference)
    except (SaltInvocationError, CommandExecutionError) as exc:
        ret["result"] = False
        ret["comment"] += f"; probing it failed: {exc}"
        return ret
    ret["changes"]["probed"] = {"old": None, "new": image_probe.describe(facts)}
    ret["comment"] += f"; probed: {image_probe.describe(facts)}"
    if facts.get("why_no_jobs"):
        ret["comment"] += f"; jobs cannot run on it: {facts['why_no_jobs']}"
    elif facts.get("why_one_node_only"):
        ret["comment"] += f"; its jobs keep to one node: {facts['why_one_node_only']}"
    return ret


def unapproved_absent(name, approved):
    """
    Remove every image DockerMPI pulled on this host that is no longer approved, once
    no container uses it (a job still running in it keeps it until a later run).
    ``test=True`` lists what would be removed.

    name
        What the approved images are called in messages (``mpi:images``).

    approved
        Every approved reference (the values of ``mpi:images``).
    """
    ret = {"name": name, "result": False, "changes": {}, "comment": ""}
    try:
        found = __salt__["mpi_image.unapproved"](list(approved or []))
    except (SaltInvocationError, CommandExecutionError) as exc:
        ret["comment"] = f"cannot list images no longer in {name}: {exc}"
        return ret
    removed, kept, notes = [], [], []
    for image in found:
        if image["present"] and image["containers"]:
            kept.append(image["reference"])
            notes.append(f"{image['reference']} kept: used by {', '.join(image['containers'])}")
            continue
        if __opts__["test"]:
            removed.append(image["reference"])
            continue
        try:
            result = __salt__["mpi_image.remove"](image["reference"])
        except (SaltInvocationError, CommandExecutionError) as exc:
            ret["comment"] = f"cannot remove {image['reference']}: {exc}"
            return ret
        if result["removed"]:
            removed.append(image["reference"])
        else:
            kept.append(image["reference"])
            notes.append(f"{image['reference']} kept: {result['reason']}")
    if removed:
        ret["changes"] = {"removed": removed}
    verb = "would be removed" if __opts__["test"] else "removed"
    ret["comment"] = "; ".join(
        ([f"{len(removed)} image(s) no longer in {name} {verb}"] if removed else
         [f"no image DockerMPI pulled is outside {name}"] if not kept else []) + notes)
    ret["result"] = None if __opts__["test"] and removed else True
    return ret
