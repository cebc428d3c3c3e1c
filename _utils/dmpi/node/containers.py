"""
The Docker side of a node: its engine's client, and what DockerMPI's containers are
made with (options, limits) and which job each belongs to.
"""

import os

import docker
import docker.errors
import requests.exceptions
from docker.types import Mount

from dmpi.contract import (AGENT_DIR, DATA_MOUNT, LABEL_JOB, LABEL_ROLE, LABEL_USER, NETNS_RE, RUN_DIR,
                           STANDBY_ROLE)
from dmpi.errors import NodeError, RequestError
from dmpi.node import checks

SECRET_FILE_MAX = 1 << 20  # bytes a file of a job's secret directory holds at most

# What a job container is given when the runner names no limits (a worker that only
# holds the job's network namespace and sshd, on the launcher's node).
SMALL_LIMITS = {"memory": 256 << 20, "pids": 64, "nano_cpus": 500_000_000, "tmp_size": 64 << 20}


def program(argv):
    """Options that run ``argv`` in a job container whatever ENTRYPOINT its image sets
    (which would otherwise wrap the agent's sshd and the launcher's script)."""
    return {"entrypoint": argv[:1], "command": argv[1:]}


def client(check=False):
    """A client of this node's Docker engine: the one way DockerMPI's modules on a node
    make one. With ``check``, the engine must answer a ping first. NodeError when it
    cannot be reached."""
    try:
        found = docker.from_env(timeout=60)
        if check:
            found.ping()
        return found
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        raise NodeError(f"cannot reach the Docker engine: {exc}") from exc


def secret_dir(job_root, job_id):
    """The node-local directory of a job's files (keys, sshd_config, hostfile)."""
    return os.path.join(checks.check_abs(job_root, "job_root"), job_id)


def _size(value, what):
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise RequestError(f"limit {what} must be a whole number, got {value!r}") from None
    if number <= 0:
        raise RequestError(f"limit {what} must be positive, got {value!r}")
    return number


def _limit_options(limits):
    """Docker options for a job container's limits: memory (no swap), processes, CPU,
    a read-only root with a sized /tmp, and /dev/shm inside the memory limit."""
    limits = dict(SMALL_LIMITS, **(limits or {}))
    memory = _size(limits["memory"], "memory")
    tmp = _size(limits["tmp_size"], "tmp_size")
    return {
        "mem_limit": memory,
        "memswap_limit": memory,
        "pids_limit": _size(limits["pids"], "pids"),
        "nano_cpus": _size(limits["nano_cpus"], "nano_cpus"),
        "read_only": True,
        "tmpfs": {"/tmp": f"rw,nosuid,nodev,size={tmp},mode=1777"},
        "shm_size": max(64 << 20, memory // 2),
    }


def container_options(job_id, role, user, uid, gid, data_dir, secrets, limits, agent):
    """Docker options of a job's ``worker`` or ``launcher`` container: the user's own
    uid, no capabilities, no new privileges, the user's directory at /data, the job's
    files and the node's remote-start agent (``agent``, its build's path on the node)
    read-only, and its limits."""
    mounts = [
        Mount(AGENT_DIR, agent, type="bind", read_only=True),
        Mount(DATA_MOUNT, data_dir, type="bind"),
        Mount(RUN_DIR, secrets, type="bind", read_only=True),
        Mount("/etc/passwd", os.path.join(secrets, "passwd"), type="bind", read_only=True),
        Mount("/etc/group", os.path.join(secrets, "group"), type="bind", read_only=True),
    ]
    return {
        "name": f"dmpi-{job_id}-{role}",
        "labels": {LABEL_JOB: job_id, LABEL_ROLE: role, LABEL_USER: user},
        "user": f"{uid}:{gid}",
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "mounts": mounts,
        "init": True,
        "working_dir": DATA_MOUNT,
        "environment": {"HOME": DATA_MOUNT, "TMPDIR": "/tmp"},
        "detach": True,
        **_limit_options(limits),
    }


def job_of(container):
    """(job id, role) of one of DockerMPI's containers on a node: a taken standby namespace is
    its job's ``netns`` (by the name the start gave it), a spare belongs to no job
    (``(None, "standby")``); workers and launchers carry their job and role as labels.
    The role is None for a label DockerMPI never sets."""
    labels = container.labels or {}
    role = labels.get(LABEL_ROLE)
    if role == STANDBY_ROLE:
        taken = NETNS_RE.match(container.name or "")
        return (taken.group(1), "netns") if taken else (None, STANDBY_ROLE)
    return labels.get(LABEL_JOB), role if role in ("worker", "launcher") else None


def namespace_options(node_id):
    """What a job's network namespace gets wherever it is made (with the worker, or
    ahead as a standby): the node's name as hostname, as users know it (the ranks
    share it), no IPv6, and ports below 1024 for root alone (Docker lowers that floor
    to 0 in every container; a job binding one could pass for a host's root, as to an
    NFS server that trusts privileged source ports)."""
    return {"hostname": node_id,
            "sysctls": {"net.ipv6.conf.all.disable_ipv6": "1",
                        "net.ipv4.ip_unprivileged_port_start": "1024"}}
