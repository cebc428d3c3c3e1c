"""
Network namespaces made ahead of jobs on a node (standbys): containers that only hold
one (running ``sleep`` as nobody), on a node-local internal network until a job start
takes one, renames it to NETNS_NAME and gives it the job's address. Making a namespace
is the slowest step of a start.
"""

import contextlib
import fcntl
import logging
import os
import secrets

import docker
import docker.errors

from dmpi.contract import (LABEL_ROLE, MAX_STANDBY_NAMESPACES, NETNS_NAME, STANDBY_PREFIX,
                           STANDBY_ROLE)
from dmpi.errors import NodeError, RequestError
from dmpi.node import containers, netns

log = logging.getLogger(__name__)

STANDBY_NETWORK = "dmpi-standby"
# Taking and trimming spares, one at a time (in /run: only root may make files there).
STANDBY_LOCK = "/run/dockermpi-standby.lock"
STANDBY_LIMITS = {"mem_limit": 32 << 20, "pids_limit": 8, "nano_cpus": 100_000_000}


def _standby_network(client):
    """The node-local network standby namespaces wait on, made when missing: internal
    (no route anywhere) and without traffic between its members."""
    try:
        return client.networks.get(STANDBY_NETWORK)
    except docker.errors.NotFound:
        pass
    try:
        return client.networks.create(
            STANDBY_NETWORK, driver="bridge", internal=True,
            options={"com.docker.network.bridge.enable_icc": "false"},
            labels={LABEL_ROLE: STANDBY_ROLE})
    except docker.errors.APIError:
        # Another call made it meanwhile; anything else raises from get().
        return client.networks.get(STANDBY_NETWORK)


def _standby_spares(client):
    """The standby namespaces not yet taken by a job (any state)."""
    return [c for c in client.containers.list(
        all=True, filters={"label": f"{LABEL_ROLE}={STANDBY_ROLE}"}, ignore_removed=True)
        if c.name.startswith(STANDBY_PREFIX)]


def check_count(count):
    """How many standby namespaces a node keeps: 0 to MAX_STANDBY_NAMESPACES."""
    most = MAX_STANDBY_NAMESPACES
    if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= most:
        raise RequestError(
            f"the standby count must be a whole number from 0 to {most}, got {count!r}")


@contextlib.contextmanager
def _standby_lock():
    """Serialize taking and trimming spares between this node's Salt jobs."""
    fd = os.open(STANDBY_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _trim(client, count, removed):
    """Remove the spares beyond ``count`` running ones, and those not running (names
    added to ``removed``); how many running spares are left. Under the standby lock."""
    running = 0
    for spare in _standby_spares(client):
        if spare.status == "running" and running < count:
            running += 1
            continue
        with contextlib.suppress(docker.errors.NotFound):
            spare.remove(force=True)
            removed.append(spare.name)
    return running


def take_standby(client, job_id, network, address):
    """A standby namespace made the job's (renamed to NETNS_NAME, on the job network at
    ``address``; :func:`seal_standby` takes it off the standby network), or None when
    this node has none ready (the caller then makes the namespace with the worker, as
    it takes longer)."""
    name = NETNS_NAME.format(job_id=job_id)
    with _standby_lock():
        try:
            spares = [c for c in _standby_spares(client) if c.status == "running"]
            if not spares:
                return None
            spares[0].rename(name)
        except docker.errors.APIError as exc:
            log.warning("job %s: cannot take a standby namespace: %s", job_id, exc)
            return None
        holder = spares[0]
    try:
        client.api.connect_container_to_network(holder.id, network, ipv4_address=address)
    except docker.errors.APIError as exc:
        log.warning("job %s: cannot move standby namespace %s to the job network: %s",
                    job_id, name, exc)
        with contextlib.suppress(docker.errors.APIError):
            holder.remove(force=True)
        return None
    return holder


def seal_standby(client, job_id, holder, pid, allowed_sources, sshd_port):
    """A taken standby namespace (its holder, whose process is ``pid``) off the standby
    network and behind the job's firewall; done before the worker starts in it, so
    nothing of the job ever runs without both."""
    try:
        client.api.disconnect_container_from_network(holder.id, STANDBY_NETWORK)
    except docker.errors.APIError as exc:
        raise NodeError(
            f"cannot take the namespace of job {job_id} off the standby network: {exc}") from exc
    netns.close_namespace(job_id, pid, allowed_sources, sshd_port)


def status():
    """The standby network namespaces on this node: ``{"ready": n, "not_running": m}``,
    spares that run and spares that do not (a stopped engine's)."""
    spares = _standby_spares(containers.client())
    ready = sum(1 for spare in spares if spare.status == "running")
    return {"ready": ready, "not_running": len(spares) - ready}


def keep(image, count, node_id, client=None):
    """Keep ``count`` network namespaces made ahead of jobs on this node, each held by a
    container that runs ``sleep`` as nobody (no capabilities, read-only, tiny limits)
    on the node-local internal network ``dmpi-standby``, which reaches nothing. A job
    start takes one (:func:`take_standby`): making a namespace is the slowest step of
    a container's start. Spares beyond ``count``, or not running, are removed.

    ``image``: one present on the node with ``sleep`` in it (the clean-up passes the
    image its job ran); ``count``: 0 to 16 (``mpi:job_network:standby``), 0 removes them
    all; ``node_id``: the hostname the namespaces give the jobs; ``client``: the
    caller's Docker client, if it has one. Returns ``{"made": [names], "removed":
    [names], "ready": n}``."""
    check_count(count)
    if not isinstance(image, str) or not image or image.startswith("-"):
        raise RequestError(f"invalid image {image!r}")
    client = client or containers.client()
    removed = []
    with _standby_lock():
        running = _trim(client, count, removed)
    made = []
    if running < count:
        network = _standby_network(client)
    # Made outside the lock: a start may take a spare meanwhile.
    for _ in range(count - running):
        name = STANDBY_PREFIX + secrets.token_hex(4)
        try:
            client.containers.run(
                image, entrypoint=["sleep", "infinity"], name=name, detach=True,
                labels={LABEL_ROLE: STANDBY_ROLE}, network=network.name,
                user="65534:65534", cap_drop=["ALL"], security_opt=["no-new-privileges"],
                read_only=True, init=True, **containers.namespace_options(node_id),
                **STANDBY_LIMITS)
        except docker.errors.APIError as exc:
            with contextlib.suppress(docker.errors.APIError):
                client.containers.get(name).remove(force=True)
            raise NodeError(f"cannot make a standby namespace: {exc}") from exc
        made.append(name)
    ready = running + len(made)
    if made:
        # Two clean-ups that keep spares at once each make what they found missing: the
        # node still keeps ``count``.
        with _standby_lock():
            ready = _trim(client, count, removed)
    return {"made": [n for n in made if n not in removed], "removed": removed, "ready": ready}
