"""
A node's evidence about every job on it, which its ``mpi_node`` engine sends the master
when it changes: containers and their states, the launcher's exit and the failing rank,
limits hit, the Docker engine, and whether each of the job's other containers answers.
Nothing a job wrote can make it raise: at worst that job's failure stays unknown.
"""

import json
import logging
import os
import re
import socket
import threading
import time

import docker
import docker.errors
import dmpi.launch.files
import dmpi.launch.flavours
import requests.exceptions

from dmpi.contract import (JOB_ID_RE, LABEL_ROLE, LABEL_USER, PROBE_ROLE, STANDBY_ROLE,
                           USER_RE)
from dmpi.errors import DockerMPIError, NodeError, RequestError
from dmpi.node import checks, containers, userdirs

log = logging.getLogger(__name__)

_PORT_RE = re.compile(r"^\s*Port\s+([0-9]{1,5})\s*$", re.IGNORECASE | re.MULTILINE)
DAEMON_JSON = "/etc/docker/daemon.json"  # written by highstate (dockermpi.docker.config)
# Seconds a Docker engine with live-restore may stay silent before the node says so as a
# fault: a restart of dockerd (highstate changed daemon.json, a docker.io upgrade) leaves
# job containers running, and a restart takes seconds, not this long.
ENGINE_RESTART_GRACE = 30
# When this process (the mpi_node engine keeps this module loaded) first saw the Docker
# engine not answering; None while it answers.
_ENGINE_OUTAGE = {"since": None}
# job id -> (launcher exit code, failure): a job's stderr is read once after its end.
_FAILURES = {}
_FAILURES_KEPT = 1000
#: Bytes left in a failed job's user directory below which it counts as full.
ROOM_LEFT = 64 * 1024


def _secret_text(secret_dir, name):
    """A file of the job's secret directory, or None. The directory is root's (mounted
    read-only into the job), so its content is the master's; it is still read with
    bounds."""
    try:
        with open(os.path.join(secret_dir, name), errors="replace") as handle:
            return handle.read(containers.SECRET_FILE_MAX)
    except OSError:
        return None


def _job_peers(secret_dir):
    """(the job's sshd port, [job addresses from the hostfile]) or (None, [])."""
    sshd_config = _secret_text(secret_dir, "sshd_config")
    hostfile = _secret_text(secret_dir, "hostfile")
    match = _PORT_RE.search(sshd_config) if sshd_config is not None else None
    if hostfile is None or not match:
        return None, []
    return int(match.group(1)), dmpi.launch.flavours.hostfile_addresses(hostfile)


def _tcp_connects(address, port, timeout):
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return True
    except OSError:
        return False


def _probe_all(targets, timeout):
    """{(address, port): bool}: TCP connect to every target at once, bounded by timeout."""
    results = {}

    def probe(target):
        results[target] = _tcp_connects(target[0], target[1], timeout)

    threads = [threading.Thread(target=probe, args=(t,), daemon=True) for t in targets]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout + 0.2
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return {target: results.get(target, False) for target in targets}


def _cgroup_counter(pid, controller, filename, key):
    """A counter from a container's cgroup (v1 or v2), or 0 when it cannot be read."""
    try:
        with open(f"/proc/{int(pid)}/cgroup") as handle:
            lines = handle.read(65536).splitlines()
    except (OSError, ValueError):
        return 0
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if controller in parts[1].split(","):
            path = f"/sys/fs/cgroup/{controller}{parts[2]}/{filename}"
        elif parts[0] == "0" and parts[1] == "":
            path = f"/sys/fs/cgroup{parts[2]}/{filename.replace('oom_control', 'events')}"
        else:
            continue
        try:
            with open(path) as handle:
                for row in handle.read(65536).splitlines():
                    words = row.split()
                    if len(words) == 2 and words[0] == key and words[1].isdigit():
                        return int(words[1])
        except OSError:
            continue
    return 0


def _limits_hit(container):
    """Which of the container's limits its processes ran into: memory, pids."""
    hit = []
    state = container.attrs.get("State") or {}
    pid = state.get("Pid") or 0
    if state.get("OOMKilled") or (pid and _cgroup_counter(pid, "memory", "memory.oom_control",
                                                          "oom_kill")):
        hit.append("memory")
    if pid and _cgroup_counter(pid, "pids", "pids.events", "max"):
        hit.append("pids")
    return hit


def _engine_jobs(engine_timeout):
    """{job_id: {...}} from the Docker engine: containers, launcher exit, own address,
    limits hit."""
    client = docker.from_env(timeout=engine_timeout)
    try:
        # Every container DockerMPI makes has a role: the jobs' and the standby
        # namespaces (a job's once a start took it and named it after the job).
        listed = client.containers.list(
            all=True, filters={"label": LABEL_ROLE}, ignore_removed=True
        )
    finally:
        client.close()
    found = {}
    for container in listed:
        labels = container.labels or {}
        job_id, role = containers.job_of(container)
        if role == STANDBY_ROLE or labels.get(LABEL_ROLE) == PROBE_ROLE:
            continue  # a spare (no job's yet), or an image being probed
        if role is None or not JOB_ID_RE.match(job_id or ""):
            log.warning("ignoring container %s with labels %s", container.name, labels)
            continue
        job = found.setdefault(job_id, _empty_job())
        user = labels.get(LABEL_USER)
        if job["user"] is None and user and USER_RE.match(user):
            job["user"] = user
        job["containers"][role] = container.status
        attrs = container.attrs or {}
        if role in ("worker", "netns"):
            # The namespace's owner holds the address (the worker's own, or the standby's).
            networks = (attrs.get("NetworkSettings") or {}).get("Networks") or {}
            job["address"] = job["address"] or next(
                (n.get("IPAddress") for n in networks.values() if n.get("IPAddress")), None)
        if role == "worker":
            config_user = (attrs.get("Config") or {}).get("User") or ""
            job["uid"] = config_user.split(":")[0] or None
            job["gid"] = config_user.split(":")[1] if ":" in config_user else None
        if role == "launcher" and container.status in ("exited", "dead"):
            job["launcher_exit_code"] = (attrs.get("State") or {}).get("ExitCode")
        for limit in _limits_hit(container):
            if limit not in job["limits_hit"]:
                job["limits_hit"].append(limit)
    return found


def _empty_job():
    return {
        "user": None,
        "uid": None,
        "gid": None,
        "address": None,
        "containers": {"worker": None, "launcher": None, "netns": None},
        "launcher_exit_code": None,
        "failure": None,
        "limits_hit": [],
        "secrets": False,
        "peers": {},
    }


def _failed_rank(storage_path, job_root, job_id, job):
    """Which rank failed, from the job's stderr (and, after a failure, what failing ranks
    wrote in its directory and its stdout: Hydra says there) read as its uid, once per
    job; None when unknown. A launcher that exited 0 is read too: Open MPI 5's mpirun
    exits 0 after it lost a node's daemon, and says so only there."""
    if job["launcher_exit_code"] is None or not job["user"] or not job["uid"]:
        return None
    known = _FAILURES.get(job_id)
    if known is not None and known[0] == job["launcher_exit_code"]:
        return known[1]
    try:
        text = _job_text(storage_path, job, job_id, "stderr")
    except (DockerMPIError, ValueError, TypeError) as exc:
        log.debug("job %s: cannot read stderr: %s", job_id, exc)
        return None  # read again next time
    if job["launcher_exit_code"] != 0:
        text = _ranks_failed(storage_path, job, job_id) + text
        try:
            text += "\n" + _job_text(storage_path, job, job_id, "stdout")
        except (DockerMPIError, ValueError, TypeError) as exc:
            log.debug("job %s: cannot read stdout: %s", job_id, exc)
    failure = _failure_in(text, job["launcher_exit_code"])
    # A job that filled its user's directory may have had no room left to say so.
    if job["launcher_exit_code"] != 0 and not (failure or {}).get("space") and \
            _directory_full(storage_path, job):
        failure = dict(failure or {}, directory_full=True)
    if isinstance(failure, dict) and "host" in failure:
        hostfile = _secret_text(os.path.join(job_root, job_id), "hostfile") or ""
        failure = dmpi.launch.flavours.failed_rank_at(failure, hostfile)
    if len(_FAILURES) >= _FAILURES_KEPT:
        _FAILURES.clear()
    _FAILURES[job_id] = (job["launcher_exit_code"], failure)
    return failure


def _directory_full(storage_path, job):
    """Whether the job's user's directory has less than :data:`ROOM_LEFT` bytes left
    (its quota used up, or the file system full); False when that cannot be read."""
    try:
        found = userdirs.room(storage_path, job["user"], int(job["uid"]), int(job["gid"]))
    except (DockerMPIError, ValueError, TypeError) as exc:
        log.debug("job %s: cannot read the room left: %s", job.get("user"), exc)
        return False
    return found["bytes_free"] < ROOM_LEFT


def _job_text(storage_path, job, job_id, name, max_bytes=userdirs.TAIL_BYTES, offset=None):
    """A file of the job's directory read as its uid (its tail, or from ``offset``), as
    text; raises as :func:`dmpi.node.userdirs.read_tail`."""
    return userdirs.read_tail(storage_path, job["user"], int(job["uid"]), int(job["gid"]),
                              job_id, name, max_bytes, offset=offset).decode(errors="replace")


def _ranks_failed(storage_path, job, job_id):
    """What failing ranks' scripts wrote in the job's directory
    (:data:`dmpi.launch.files.RANK_FAILED_FILE`, first failure first), "" when none did."""
    try:
        return _job_text(storage_path, job, job_id, dmpi.launch.files.RANK_FAILED_FILE,
                         4096, offset=0) + "\n"
    except (DockerMPIError, ValueError, TypeError):
        return ""  # none (the usual case), or unreadable: standard error still says it


def _failure_in(text, exit_code):
    """What a job's launcher's standard error says failed (see :func:`_failed_rank`)."""
    if exit_code == 0:
        lost = dmpi.launch.flavours.lost_daemon(text)
        return {"lost_daemon": lost} if lost else None
    # A rank's own word comes first: it is the first failure, the MPI's may be a later one.
    failure = dmpi.launch.files.rank_failure(text) or dmpi.launch.flavours.parse_failure(text)
    placement = dmpi.launch.files.placement_failure(text)
    if placement:
        failure = dict(failure or {}, placement=placement)
    space = dmpi.launch.files.space_failure(text)
    if space:
        failure = dict(failure or {}, space=space)
    return failure


def report(storage_path, job_root="/var/lib/dockermpi/jobs", probe_timeout=0.5,
           engine_timeout=5):
    """
    Report what this node knows about every DockerMPI job on it.

    storage_path
        Where the shared storage is on this node (to read a failed job's stderr).
    job_root
        Node-local directory of per-job secrets.
    probe_timeout
        Seconds each TCP probe of a peer may take; all probes run at once.
    engine_timeout
        Seconds the Docker engine has to answer.

    Jobs come from containers labelled ``io.dockermpi.job`` and from secret directories
    in ``job_root``. Returns::

        {"engine": "ok" or the error text when the Docker engine cannot be reached,
         "jobs": {job_id: {"user": str or None,
                           "containers": {"worker": status or None,
                                          "launcher": status or None,
                                          "netns": status or None},
                           "launcher_exit_code": int or None,
                           "failure": which rank failed (from stderr) or None,
                           "limits_hit": ["memory", "pids"] (those the job ran into),
                           "secrets": bool,
                           "peers": {address: bool}, ...}},
         "time": unix time}

    ``peers`` holds, while the job's worker or launcher runs, whether each other
    container of the job (its address in the hostfile) accepts a TCP connection on the
    job's sshd port. With the engine down, jobs come from ``job_root`` only and nothing
    is probed; while an engine with live-restore has been down for less than
    ``ENGINE_RESTART_GRACE`` seconds (a restart), the report also carries ``error``
    saying so, and the master judges the node's jobs by its silence only. Nothing a job
    wrote can make this raise: at worst that job's failure stays unknown.
    """
    checks.check_abs(str(storage_path), "storage path")
    checks.check_abs(str(job_root), "job_root")
    try:
        probe_timeout = float(probe_timeout)
        engine_timeout = float(engine_timeout)
    except (TypeError, ValueError):
        raise RequestError("probe_timeout and engine_timeout must be numbers") from None
    if probe_timeout <= 0 or engine_timeout <= 0:
        raise RequestError("probe_timeout and engine_timeout must be positive")
    now = time.time()

    engine, outage = "ok", None
    try:
        found = _engine_jobs(engine_timeout)
        _ENGINE_OUTAGE["since"] = None
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        engine = str(exc) or type(exc).__name__
        found = {}
        outage = _engine_outage(now)
    try:
        names = os.listdir(job_root)
    except FileNotFoundError:
        names = []
    except OSError as exc:
        raise NodeError(f"cannot list {job_root}: {exc}") from exc
    for name in names:
        if JOB_ID_RE.match(name) and os.path.isdir(os.path.join(job_root, name)):
            found.setdefault(name, _empty_job())["secrets"] = True

    wanted = {}
    for job_id, job in found.items():
        job["failure"] = _failed_rank(storage_path, job_root, job_id, job)
        running = "running" in job["containers"].values()
        if running and job["secrets"]:
            port, addresses = _job_peers(os.path.join(job_root, job_id))
            if port is not None:
                wanted[job_id] = [(a, port) for a in addresses if a != job["address"]]
    results = _probe_all({t for targets in wanted.values() for t in targets}, probe_timeout)
    for job_id, targets in wanted.items():
        found[job_id]["peers"] = {address: results[(address, port)] for address, port in targets}
    result = {"engine": engine, "jobs": found, "time": now}
    if outage:
        result["error"] = outage
    return result


def _live_restore():
    """Whether the Docker engine is configured to keep containers running while it is
    down (``live-restore`` in daemon.json); False when that cannot be read."""
    try:
        with open(DAEMON_JSON, encoding="utf-8") as handle:
            return json.load(handle).get("live-restore") is True
    except (OSError, ValueError, AttributeError):
        return False


def _engine_outage(now):
    """While a Docker engine with live-restore has been silent for less than
    ENGINE_RESTART_GRACE: why this report says nothing yet about the node's jobs (the
    master then takes it as a heartbeat, not as evidence). None once the outage is
    longer, or without live-restore (a stopped engine stopped the containers): then the
    silent engine is a fault of the node's jobs."""
    since = _ENGINE_OUTAGE["since"] = _ENGINE_OUTAGE["since"] or now
    if now - since >= ENGINE_RESTART_GRACE or not _live_restore():
        return None
    # Constant during the outage, so the report's fingerprint is too (heartbeats only).
    stamp = time.strftime("%H:%M:%S", time.gmtime(since))
    return (f"the Docker engine has not answered since {stamp} UTC (restarting?); with "
            f"live-restore its job containers keep running, so this node's jobs are judged "
            f"on its report only if it still does not answer after {ENGINE_RESTART_GRACE} s")
