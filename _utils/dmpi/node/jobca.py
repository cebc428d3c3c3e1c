"""
A node's job CA: it certifies the ssh keys the node makes for its part of each job, so
no private key of a job ever leaves the node. Its public key travels in the node's
health report; the private key stays in :data:`JOB_CA_KEY` (root only).
"""

import os
import re
import threading
import time

import dmpi.launch.ssh
from cryptography.hazmat.primitives import serialization

from dmpi.errors import NodeError, RequestError

JOB_CA_KEY = "/var/lib/dockermpi/job-ca/ca"
# Certificates are valid a little before they are made (clocks of nodes differ) and a
# little past the job's walltime (the clean-up after it).
CERT_CLOCK_SKEW = 300
CERT_GRACE = 600
_JOB_CA_LOCK = threading.Lock()
_CA_LINE_RE = re.compile(r"^ssh-ed25519 [A-Za-z0-9+/]+=*( \S+)?\Z")


def ca():
    """This node's job CA: ``(private text, public line)``, made on first use."""
    with _JOB_CA_LOCK:
        try:
            with open(JOB_CA_KEY) as handle:
                private = handle.read()
        except FileNotFoundError:
            os.makedirs(os.path.dirname(JOB_CA_KEY), mode=0o700, exist_ok=True)
            private, _ = dmpi.launch.ssh.generate_ed25519_keypair("dockermpi-job-ca")
            partial = f"{JOB_CA_KEY}.{os.getpid()}"
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as handle:
                handle.write(private)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(partial, JOB_CA_KEY)
    try:
        key = serialization.load_ssh_private_key(private.encode("ascii"), password=None)
    except ValueError as exc:
        raise NodeError(f"the job CA key {JOB_CA_KEY} is unreadable: {exc}") from exc
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                           serialization.PublicFormat.OpenSSH).decode("ascii")
    return private, public


def public_line():
    """The public key of this node's job CA (made on first use)."""
    try:
        return ca()[1]
    except OSError as exc:
        raise NodeError(f"cannot make the job CA {JOB_CA_KEY}: {exc}") from exc


def job_keys(node_id, job_id, job_cas, launcher_node, addresses, sshd_port, valid_seconds):
    """The ssh keys of node ``node_id``'s part of a job, made and certified here with
    the node's job CA (:func:`dmpi.launch.ssh.job_keys`)."""
    if not isinstance(job_cas, dict) or set(addresses) - set(job_cas) or not all(
            isinstance(job_cas[n], str) and _CA_LINE_RE.match(job_cas[n]) for n in addresses):
        raise RequestError(
            "job_cas must give every node of the job its job CA's ed25519 public key")
    try:
        valid_seconds = int(valid_seconds)
    except (TypeError, ValueError):
        raise RequestError(f"valid_seconds must be seconds, got {valid_seconds!r}") from None
    if valid_seconds <= 0:
        raise RequestError("valid_seconds must be positive")
    try:
        ca_private, ca_public = ca()
    except OSError as exc:
        raise NodeError(f"cannot make the job CA {JOB_CA_KEY}: {exc}") from exc
    if str(job_cas[node_id]).split()[:2] != ca_public.split()[:2]:
        raise NodeError(
            f"the master holds another job CA for {node_id} than the node's own "
            f"({JOB_CA_KEY} changed); the node's next health report brings the new one")
    now = int(time.time())
    try:
        return dmpi.launch.ssh.job_keys(
            ca_private, job_id, node_id, addresses, job_cas, launcher_node, sshd_port,
            now - CERT_CLOCK_SKEW, now + valid_seconds + CERT_GRACE)
    except ValueError as exc:
        raise RequestError(f"cannot make the keys of job {job_id}: {exc}") from exc
