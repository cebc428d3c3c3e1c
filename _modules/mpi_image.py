"""
Images approved for DockerMPI jobs, pinned by digest, on a node's Docker engine.

An approved image is named by a registry reference pinned by digest,
``registry/repo@sha256:<64 hex>``. Tags are never used: a tag can move, a
digest cannot.

:depends: docker (the Docker SDK for Python), a running Docker engine
"""

import logging
import re

from salt.exceptions import CommandExecutionError, SaltInvocationError

try:
    import docker
    import docker.errors

    HAS_DOCKER = True
except ImportError:  # pragma: no cover - exercised through __virtual__
    HAS_DOCKER = False

log = logging.getLogger(__name__)

__virtualname__ = "mpi_image"

# repository part: lower-case path components, optional registry host[:port];
# no tag allowed next to the digest.
_REFERENCE_RE = re.compile(
    r"^(?P<repo>(?:[A-Za-z0-9.-]+(?::[0-9]+)?/)?[a-z0-9]+(?:[._-]+[a-z0-9]+)*"
    r"(?:/[a-z0-9]+(?:[._-]+[a-z0-9]+)*)*)"
    r"@(?P<digest>sha256:[0-9a-f]{64})$"
)


def __virtual__():
    if not HAS_DOCKER:
        return (
            False,
            "mpi_image: the docker Python package (Docker SDK) is not installed",
        )
    return __virtualname__


def parse_reference(reference):
    """
    Split a digest-pinned reference into repository and digest; reject anything
    not pinned by digest.

    reference
        ``registry/repo@sha256:<64 hex>``.

    CLI Example:

    .. code-block:: bash

        salt '*' mpi_image.parse_reference registry.example:5000/mpi/openmpi@sha256:0123...cdef
    """
    if not isinstance(reference, str):
        raise SaltInvocationError(
            f"image reference must be a string, got {type(reference).__name__}"
        )
    match = _REFERENCE_RE.match(reference)
    if not match:
        raise SaltInvocationError(
            f"image reference {reference!r} is not pinned by digest: expected "
            "registry/repo@sha256:<64 lower-case hex digits> with no tag"
        )
    return {"repository": match.group("repo"), "digest": match.group("digest")}


def _client():
    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as exc:
        raise CommandExecutionError(f"cannot reach the Docker engine: {exc}") from exc
    return client


def _summary(image):
    return {
        "id": image.id,
        "repo_digests": list(image.attrs.get("RepoDigests") or []),
        "repo_tags": list(image.attrs.get("RepoTags") or []),
    }


def inspect(reference):
    """
    Return ``{id, repo_digests, repo_tags}`` of the local image whose
    RepoDigests contain ``reference``, or ``None`` when there is none.

    reference
        ``registry/repo@sha256:<64 hex>``.

    CLI Example:

    .. code-block:: bash

        salt '*' mpi_image.inspect registry.example:5000/mpi/openmpi@sha256:0123...cdef
    """
    parse_reference(reference)
    client = _client()
    try:
        image = client.images.get(reference)
    except docker.errors.ImageNotFound:
        return None
    except docker.errors.APIError as exc:
        raise CommandExecutionError(
            f"cannot inspect image {reference}: {exc.explanation or exc}"
        ) from exc
    summary = _summary(image)
    if reference not in summary["repo_digests"]:
        return None
    return summary


def pull(reference):
    """
    Pull ``reference`` by digest and check that the pulled image's RepoDigests
    contain it. Returns ``{id, repo_digests, repo_tags}``.

    reference
        ``registry/repo@sha256:<64 hex>``.

    CLI Example:

    .. code-block:: bash

        salt '*' mpi_image.pull registry.example:5000/mpi/openmpi@sha256:0123...cdef
    """
    parts = parse_reference(reference)
    client = _client()
    log.debug("mpi_image: pulling %s", reference)
    try:
        image = client.images.pull(parts["repository"], tag=parts["digest"])
    except docker.errors.NotFound as exc:
        raise CommandExecutionError(
            f"cannot pull {reference}: the registry does not have this digest "
            f"(wrong digest or repository?): {exc.explanation or exc}"
        ) from exc
    except docker.errors.APIError as exc:
        raise CommandExecutionError(
            f"cannot pull {reference}: {exc.explanation or exc}"
        ) from exc
    except docker.errors.DockerException as exc:
        raise CommandExecutionError(f"cannot pull {reference}: {exc}") from exc
    summary = _summary(image)
    if reference not in summary["repo_digests"]:
        raise CommandExecutionError(
            f"pulled {reference} but the image's RepoDigests "
            f"{summary['repo_digests']} do not contain it"
        )
    return summary


def registry_has(reference):
    """
    Ask the registry (through the engine, without pulling) whether it has
    ``reference``. Returns the manifest digest the registry reports; raises
    ``CommandExecutionError`` when the registry does not have it or cannot be
    reached. Used by ``mpi_image.present`` with ``test=True``.

    reference
        ``registry/repo@sha256:<64 hex>``.

    CLI Example:

    .. code-block:: bash

        salt '*' mpi_image.registry_has registry.example:5000/mpi/openmpi@sha256:0123...cdef
    """
    parse_reference(reference)
    client = _client()
    try:
        data = client.images.get_registry_data(reference)
    except docker.errors.NotFound as exc:
        raise CommandExecutionError(
            f"the registry does not have {reference} (wrong digest or repository?): "
            f"{exc.explanation or exc}"
        ) from exc
    except docker.errors.APIError as exc:
        raise CommandExecutionError(
            f"cannot ask the registry about {reference}: {exc.explanation or exc}"
        ) from exc
    return data.id
