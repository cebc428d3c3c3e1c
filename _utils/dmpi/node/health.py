"""
A node's fitness for new jobs: the Docker engine answering, the shared storage mounted
and writable (bounded in time: a hung mount makes the node unhealthy, not silent), the
image digests present, its job CA and its remote-start agent.
"""

import contextlib
import errno
import os
import re
import threading

import docker
import docker.errors
import requests.exceptions

from dmpi.contract import STORAGE_FULL
from dmpi.errors import NodeError
from dmpi.node import agent, checks, imagefacts, jobca

STORAGE_CHECK_TIMEOUT = 2  # seconds the storage check may take (a hung mount must not hang us)
HEALTH_DIR = ".dockermpi-health"  # under the storage path: the storage states make it
HEALTH_IMAGES_MAX = 500  # image digests a health report carries at most
_NODE_ID_RE = re.compile(r"[^A-Za-z0-9_.-]")
_STORAGE_CHECKS = {}  # storage path -> the check thread still running (a hung mount)


def _storage_state(storage_path, probe_name):
    """'ok', or why the shared storage cannot take jobs (the words follow 'storage ')."""
    if not os.path.isdir(storage_path):
        return f"not mounted: {storage_path} does not exist"
    if not os.path.ismount(storage_path) and \
            not os.path.isdir(os.path.join(storage_path, "users")):
        # An empty directory where the shared file system should be would split the
        # cluster's data: a preshared path below a mount point still holds users/.
        return f"not mounted: {storage_path} is no mount point and has no users/"
    # The probe file lies in the storage's health directory (highstate makes it, owned by
    # whom root is on the storage: root, or nobody under NFS root_squash), or at the
    # storage root before that: never in a user's directory, where a job could have put
    # a symlink or a FIFO.
    health_dir = os.path.join(storage_path, HEALTH_DIR)
    if not (os.path.isdir(health_dir) and not os.path.islink(health_dir)):
        health_dir = storage_path
    probe = os.path.join(health_dir, probe_name)
    try:
        try:
            os.unlink(probe)  # left by a check that was cut short
        except FileNotFoundError:
            pass
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, b"dockermpi storage check\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            with contextlib.suppress(OSError):
                os.unlink(probe)
            return f"{STORAGE_FULL}: {exc.strerror}"
        return f"not writable: {exc.strerror or exc}"
    return "ok"


def _storage_health(storage_path, probe_name, timeout):
    """The storage state, bounded by ``timeout``: a hung mount leaves its check thread
    behind (marked), and the node stays reporting, saying the storage does not respond."""
    running = _STORAGE_CHECKS.get(storage_path)
    if running is not None and running.is_alive():
        return "not responding (a check is still hanging)"
    result = {}

    def check():
        result["state"] = _storage_state(storage_path, probe_name)

    thread = threading.Thread(target=check, daemon=True, name="mpi-storage-check")
    _STORAGE_CHECKS[storage_path] = thread
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        return f"not responding (the check took over {timeout} s)"
    return result.get("state", "not checked")


def health(node_id, storage_path, engine_timeout=5):
    """
    Whether node ``node_id`` (this one) can take new jobs, in evidence the master's job
    engine judges.

    storage_path
        Where the shared storage is on this node.
    engine_timeout
        Seconds the Docker engine has to answer.

    Returns ``{"docker": "ok" or why not, "storage": "ok" or why not ("not mounted:
    ...", "not writable: ...", "not responding ...") or "full: ..." (no space, inodes or
    quota left: still usable), "images": [repo@sha256:...],
    "image_facts": {repo@sha256:...: facts}, "job_ca": "ok" or why not, "job_ca_public":
    the job CA's public line, "agent": "ok" or why the remote-start agent cannot start
    jobs (:mod:`dmpi.node.agent`)}``:
    the storage is a mount point (or holds ``users/``) and a probe file can be written
    and removed in its ``.dockermpi-health`` directory (at its root before highstate
    made that); ``images`` are the digest references of every
    local image (the master keeps those of approved images), ``image_facts`` what the
    probe found in those of them it probed (:mod:`dmpi.node.imagefacts`). Never raises
    for what it finds.
    """
    checks.check_abs(str(storage_path), "storage path")
    docker_state, images = "ok", []
    try:
        client = docker.from_env(timeout=float(engine_timeout))
        try:
            for image in client.images.list():
                images.extend(d for d in image.attrs.get("RepoDigests") or []
                              if isinstance(d, str) and "@sha256:" in d)
        finally:
            client.close()
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        docker_state = str(exc)[:300] or type(exc).__name__
    probe_name = ".dockermpi-health-" + _NODE_ID_RE.sub("_", str(node_id or "node"))[:64]
    storage = _storage_health(str(storage_path), probe_name, STORAGE_CHECK_TIMEOUT)
    images = sorted(set(images))[:HEALTH_IMAGES_MAX]
    probed = imagefacts.kept()
    found = {"docker": docker_state, "storage": storage, "images": images,
             "image_facts": {ref: probed[ref] for ref in images if ref in probed},
             "job_ca": "ok", "agent": agent.state()}
    try:
        found["job_ca_public"] = jobca.ca()[1]
    except (OSError, NodeError) as exc:
        found["job_ca"] = f"cannot make the job CA {jobca.JOB_CA_KEY}: {exc}"[:300]
    return found
