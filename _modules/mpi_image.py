"""
Images approved for DockerMPI jobs, pinned by digest, on a node's Docker engine.

An approved image is named by a registry reference pinned by digest,
``registry/repo@sha256:<64 hex>``. Tags are never used: a tag can move, a
digest cannot.

:depends: docker (the Docker SDK for Python), a running Docker engine
"""

import json
import logging

import dmpi_current

# A minion that outlived an upgrade imports the library below anew (dmpi_current).
dmpi_current.ensure()

from dmpi.contract import IMAGE_REFERENCE_RE, LABEL_ROLE, STANDBY_PREFIX, STANDBY_ROLE
from dmpi.errors import NodeError
from dmpi.launch import probe as image_probe
from salt.exceptions import CommandExecutionError, SaltInvocationError

try:
    import docker
    import docker.errors
    from dmpi.node import containers, imagefacts

    HAS_DOCKER = True
except ImportError:  # pragma: no cover - exercised through __virtual__
    HAS_DOCKER = False

log = logging.getLogger(__name__)

__virtualname__ = "mpi_image"

#: Every reference DockerMPI pulled on this host, so that one no longer approved can be
#: found and removed (images anyone else pulled are never touched).
LEDGER = "/var/lib/dockermpi/images.json"


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
    match = IMAGE_REFERENCE_RE.match(reference)
    if not match:
        raise SaltInvocationError(
            f"image reference {reference!r} is not pinned by digest: expected "
            "registry/repo@sha256:<64 lower-case hex digits> with no tag"
        )
    return {"repository": match.group("repo"), "digest": match.group("digest")}


def _client():
    try:
        return containers.client(check=True)
    except NodeError as exc:
        raise CommandExecutionError(str(exc)) from exc


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
    image = _local_image(_client(), reference)
    return None if image is None else _summary(image)


def _local_image(client, reference):
    """The local image whose RepoDigests hold ``reference``, or None."""
    try:
        image = client.images.get(reference)
    except docker.errors.ImageNotFound:
        return None
    except docker.errors.APIError as exc:
        raise CommandExecutionError(
            f"cannot inspect image {reference}: {exc.explanation or exc}"
        ) from exc
    return image if reference in (image.attrs.get("RepoDigests") or []) else None


#: What Docker says when a registry speaks plain HTTP and the engine expects TLS.
_PLAIN_HTTP_REGISTRY = "server gave HTTP response to HTTPS client"
#: What Docker says when a registry wants a login it did not get or refused.
_LOGIN_REFUSED = ("no basic auth credentials", "unauthorized", "authentication required")


def _registry(reference):
    return parse_reference(reference)["repository"].split("/", 1)[0]


def _login(reference):
    """The ``auth_config`` for the registry of ``reference`` from pillar
    ``mpi:docker:registry_credentials``, or None when it needs no login."""
    docker_settings = (__pillar__.get("mpi") or {}).get("docker") or {}
    credentials = docker_settings.get("registry_credentials") or {}
    login = credentials.get(_registry(reference)) if isinstance(credentials, dict) else None
    if not isinstance(login, dict):
        return None
    return {"username": login.get("username"), "password": login.get("password")}


def _why(reference, exc):
    """The engine's reason, with the fix when it is the host's Docker not trusting a
    plain-HTTP registry."""
    text = str(exc.explanation or exc) if isinstance(exc, docker.errors.APIError) else str(exc)
    if _PLAIN_HTTP_REGISTRY in text:
        registry = _registry(reference)
        text += (f" (the registry {registry} serves plain HTTP, which this host's Docker "
                 f"does not trust: list {registry} in pillar mpi:docker:insecure_registries "
                 "and run highstate, which restarts Docker with it; or serve the registry "
                 "over TLS)")
    elif any(phrase in text.lower() for phrase in _LOGIN_REFUSED):
        registry = _registry(reference)
        known = "refused the login in" if _login(reference) else "wants a login: set"
        text += (f" (the registry {registry} {known} pillar "
                 f"mpi:docker:registry_credentials:{registry} (username, password), then "
                 "refresh pillar and apply again)")
    return text


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
        image = client.images.pull(parts["repository"], tag=parts["digest"],
                                   auth_config=_login(reference))
    except docker.errors.NotFound as exc:
        raise CommandExecutionError(
            f"cannot pull {reference}: the registry does not have this digest "
            f"(wrong digest or repository?): {exc.explanation or exc}"
        ) from exc
    except docker.errors.DockerException as exc:
        raise CommandExecutionError(f"cannot pull {reference}: {_why(reference, exc)}") from exc
    summary = _summary(image)
    if reference not in summary["repo_digests"]:
        raise CommandExecutionError(
            f"pulled {reference} but the image's RepoDigests "
            f"{summary['repo_digests']} do not contain it"
        )
    record_pulled(reference)
    return summary


def _ledger():
    try:
        with open(LEDGER, encoding="utf-8") as handle:
            found = json.load(handle)
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        raise CommandExecutionError(f"cannot read {LEDGER}: {exc}") from exc
    return sorted({r for r in found if isinstance(r, str) and IMAGE_REFERENCE_RE.match(r)}) \
        if isinstance(found, list) else []


def _write_ledger(references):
    imagefacts.write_json(LEDGER, sorted(set(references)))


def record_pulled(reference):
    """
    Note that DockerMPI pulled ``reference`` on this host (:data:`LEDGER`), so that
    :func:`unapproved` can find it once it is no longer approved. ``pull`` does this
    itself; ``mpi_image.present`` also records an approved image it finds already there.

    CLI Example:

    .. code-block:: bash

        salt '*' mpi_image.record_pulled registry.example:5000/mpi/openmpi@sha256:0123...cdef
    """
    parse_reference(reference)
    known = _ledger()
    if reference not in known:
        _write_ledger(known + [reference])
    return True


def unapproved(approved):
    """
    The references DockerMPI pulled on this host that are not in ``approved``, with
    whether each is still present and whether a container (running or not) uses it:
    ``[{reference, present, id, containers}]``.

    approved
        Every approved reference (the values of pillar ``mpi:images``).

    CLI Example:

    .. code-block:: bash

        salt '*' mpi_image.unapproved '["registry.example:5000/mpi/openmpi@sha256:0123...cdef"]'
    """
    approved = set(approved or [])
    client = _client()
    found = []
    users = {}
    for container in client.containers.list(all=True, sparse=False):
        if not _is_standby_spare(container):  # removed with the image (remove())
            users.setdefault(container.attrs.get("Image"), []).append(container.name)
    for reference in _ledger():
        if reference in approved:
            continue
        image = _local_image(client, reference)
        found.append({"reference": reference, "present": image is not None,
                      "id": image and image.id,
                      "containers": sorted(users.get(image.id, [])) if image else []})
    return found


def _is_standby_spare(container):
    labels = container.attrs.get("Config", {}).get("Labels") or {}
    return (labels.get(LABEL_ROLE) == STANDBY_ROLE
            and container.name.startswith(STANDBY_PREFIX))


def remove(reference):
    """
    Remove the local image ``reference`` (pinned by digest) unless a container uses it,
    and forget it in the ledger once it is gone. Returns ``{removed: bool, reason}``.

    CLI Example:

    .. code-block:: bash

        salt '*' mpi_image.remove registry.example:5000/mpi/openmpi@sha256:0123...cdef
    """
    parse_reference(reference)
    client = _client()
    image = _local_image(client, reference)
    if image is not None:
        # Spare network namespaces (mpi_job.standby) run the image of the last job;
        # they are idle and the next clean-up makes new ones.
        for container in client.containers.list(all=True, sparse=False):
            if _is_standby_spare(container) and container.attrs.get("Image") == image.id:
                try:
                    container.remove(force=True)
                except docker.errors.NotFound:
                    pass
    try:
        client.images.remove(reference, force=False)
        removed, reason = True, None
    except docker.errors.ImageNotFound:
        removed, reason = True, "already gone"
    except docker.errors.APIError as exc:
        if exc.status_code == 409:  # a container uses it
            return {"removed": False, "reason": f"in use: {exc.explanation or exc}"}
        raise CommandExecutionError(f"cannot remove {reference}: {exc.explanation or exc}") from exc
    _write_ledger([r for r in _ledger() if r != reference])
    return {"removed": removed, "reason": reason}


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
        data = client.images.get_registry_data(reference, auth_config=_login(reference))
    except docker.errors.NotFound as exc:
        raise CommandExecutionError(
            f"the registry does not have {reference} (wrong digest or repository?): "
            f"{exc.explanation or exc}"
        ) from exc
    except docker.errors.APIError as exc:
        raise CommandExecutionError(
            f"cannot ask the registry about {reference}: {_why(reference, exc)}"
        ) from exc
    return data.id


def probe(reference):
    """
    Probe the local image ``reference`` for what MPI jobs need (MPI flavour and version,
    its mpirun or mpiexec, python3 and mpi4py, an ssh server, the C library), in a
    throw-away container with no network, as nobody, and keep the facts on this node,
    where its health report carries them to the master (``salt-run mpi.images``).
    Returns the facts; ``problem`` says why the probe could not run, ``why_no_jobs``
    why jobs cannot run on the image (None when they can), ``why_one_node_only`` why its
    jobs keep to one node (None when they need not).

    reference
        ``registry/repo@sha256:<64 hex>``, present on this node.

    CLI Example:

    .. code-block:: bash

        salt '*' mpi_image.probe registry.example:5000/mpi/openmpi@sha256:0123...cdef
    """
    parse_reference(reference)
    try:
        facts = imagefacts.run_probe(reference, _client())
    except NodeError as exc:
        raise CommandExecutionError(str(exc)) from exc
    facts["why_no_jobs"] = image_probe.why_no_jobs(facts)
    facts["why_one_node_only"] = image_probe.why_one_node_only(facts)
    try:
        return imagefacts.keep(reference, facts)
    except OSError as exc:
        raise CommandExecutionError(f"cannot keep the facts in {imagefacts.FACTS_FILE}: "
                                    f"{exc}") from exc


def facts(reference=None):
    """
    The facts the last probe of each image found on this node (``{reference: facts}``),
    or of ``reference`` only (None when it was never probed here).

    CLI Example:

    .. code-block:: bash

        salt '*' mpi_image.facts
    """
    kept = imagefacts.kept()
    if reference is None:
        return kept
    parse_reference(reference)
    return kept.get(reference)
