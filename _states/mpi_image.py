"""
Make sure an approved, digest-pinned image is present on a node's Docker engine.

.. code-block:: yaml

    mpi-images-present-openmpi:
      mpi_image.present:
        - name: openmpi
        - reference: registry.example:5000/mpi/openmpi@sha256:0123...cdef

:depends: the ``mpi_image`` execution module (Docker SDK)
"""

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
    Ensure the image ``reference`` is present, pulling it by digest if needed.
    With ``test=True`` the registry is asked (without pulling) whether it has
    the digest, so a wrong digest fails the dry run too.

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
        ret["result"] = True
        ret["comment"] = f"Image {name} is present as {reference} ({found['id']})"
        return ret

    if __opts__["test"]:
        try:
            __salt__["mpi_image.registry_has"](reference)
        except CommandExecutionError as exc:
            ret["comment"] = f"Image {name} could not be pulled: {exc}"
            return ret
        ret["result"] = None
        ret["changes"] = {"pulled": {"old": None, "new": reference}}
        ret["comment"] = f"Image {name} would be pulled from {reference}"
        return ret

    try:
        pulled = __salt__["mpi_image.pull"](reference)
    except (SaltInvocationError, CommandExecutionError) as exc:
        ret["comment"] = f"Image {name}: {exc}"
        return ret

    ret["result"] = True
    ret["changes"] = {"pulled": {"old": None, "new": reference, "id": pulled["id"]}}
    ret["comment"] = f"Image {name} pulled from {reference} ({pulled['id']})"
    return ret
