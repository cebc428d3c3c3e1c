"""
Run the containers of DockerMPI jobs on this node.

The ``mpi`` runner on the master decides everything about a job (placement, the user's
uid, the job's addresses, limits, the mpirun command line) and calls these
functions on the chosen nodes. The job's ssh keys are the one thing made here: each
node keeps a job CA (its public key travels in :func:`health`) and certifies the keys it
makes for its own part of a job, so no private key ever leaves the node. This module only acts on the local Docker engine and
local disk:

- :func:`start_worker` writes the job's secrets to node-local disk (readable only by the
  job's uid), starts the job's worker container in a network namespace of its own (an
  address on the job network, a firewall that admits only the job's own peers) and
  waits until its sshd answers with the job's host certificate. The namespace is one
  made ahead (a standby) when the node has one: making it is the slowest step of a
  start. On the job's first node it then starts the container that runs ``mpirun``, in
  the worker's network namespace.
- :func:`cleanup` writes the status file, then removes every container and secret of a
  job. It is idempotent. It then makes the network namespaces the node keeps ready for
  the next jobs (:func:`standby`), off every job's start.
- :func:`jobs` lists what of which job is on this node.
- :func:`report` is the node's evidence about every job on it (containers, launcher
  exit and the failing rank, limits hit, Docker engine, reachability of the job's other
  nodes); the ``mpi_node`` engine sends it to the master when it changes. It never
  raises on anything a job wrote.
- :func:`health` is the node's fitness for new jobs: the Docker engine answering, the
  shared storage mounted and writable, the image digests present, the job CA's public
  key; the ``mpi_node``
  engine adds it to its reports now and then.
- :func:`read_output` returns the tail of a job's standard output or error.
- :func:`ensure_user_dir`, :func:`migrate_user_dir` and :func:`user_dirs` give a
  user's directory to the user's own uid and list them (run on the host that is root
  on the shared storage).

Every job container runs as the job's user's own uid:gid, drops all capabilities, sets
no-new-privileges, has a read-only root file system, limits on memory, processes and CPU,
and mounts only the user's data directory (read-write, at ``/data``) and the job's
secret directory (read-only). Whatever the node does inside a user's directory goes
through ``mpi_userfs``: one directory fd per path component, opened with O_NOFOLLOW, in a
child process that runs as the user's uid, so a job's symlinks, FIFOs or swapped
directories cannot lead the node anywhere else (and NFS root_squash is no obstacle).

:depends: docker (Docker SDK for Python), nsenter (util-linux), iptables-restore,
    ip6tables-restore and ssh-keyscan on the node
"""

import concurrent.futures
import contextlib
import contextvars
import fcntl
import ipaddress
import json
import logging
import os
import re
import secrets
import shutil
import socket
import stat
import threading
import time

from dmpi.contract import (DATA_MOUNT, DOCKER_NAME_RE, JOB_ID_RE, JOBS_SUBDIR, LABEL_JOB,
                           LABEL_ROLE, LABEL_USER, MAX_STANDBY_NAMESPACES, NETNS_NAME,
                           NETNS_RE, RUN_DIR, STANDBY_PREFIX, STANDBY_ROLE, USER_RE)
from dmpi.errors import StartFailure
from salt.exceptions import CommandExecutionError, SaltInvocationError

try:
    import docker
    import docker.errors
    import requests.exceptions
    from docker.types import Mount

    HAS_DOCKER = True
except ImportError:
    HAS_DOCKER = False

log = logging.getLogger(__name__)

__virtualname__ = "mpi_job"

SECRET_FILES = {
    "sshd_config",
    "hostfile",
    "passwd",
    "group",
    "program",
}
_PORT_RE = re.compile(r"^\s*Port\s+([0-9]{1,5})\s*$", re.IGNORECASE | re.MULTILINE)
OUTPUT_STREAMS = ("stdout", "stderr")
TAIL_BYTES = 65536
USERFS_TIMEOUT = 10  # seconds any file operation in a user's directory may take
STORAGE_CHECK_TIMEOUT = 2  # seconds the storage check may take (a hung mount must not hang us)
HEALTH_DIR = ".dockermpi-health"  # under the storage path: the storage states make it
HEALTH_IMAGES_MAX = 500  # image digests a health report carries at most
_NODE_ID_RE = re.compile(r"[^A-Za-z0-9_.-]")
SECRET_FILE_MAX = 1 << 20  # bytes; the job's own files are small
# The node's job CA: it certifies the ssh keys this node makes for jobs (root only).
JOB_CA_KEY = "/var/lib/dockermpi/job-ca/ca"
# Certificates are valid a little before they are made (clocks of nodes differ) and a
# little past the job's walltime (the clean-up after it).
CERT_CLOCK_SKEW = 300
CERT_GRACE = 600
_JOB_CA_LOCK = threading.Lock()
_CA_LINE_RE = re.compile(r"^ssh-ed25519 [A-Za-z0-9+/]+=*( \S+)?\Z")
# What a job container is given when the runner names no limits (a worker that only
# holds the job's network namespace and sshd, on the launcher's node).
SMALL_LIMITS = {"memory": 256 << 20, "pids": 64, "nano_cpus": 500_000_000, "tmp_size": 64 << 20}
DAEMON_JSON = "/etc/docker/daemon.json"  # written by highstate (dockermpi.docker.config)
# Seconds a Docker engine with live-restore may stay silent before the node says so as a
# fault: a restart of dockerd (highstate changed daemon.json, a docker.io upgrade) leaves
# job containers running, and a restart takes seconds, not this long.
ENGINE_RESTART_GRACE = 30
# When this process (the mpi_node engine keeps this module loaded) first saw the Docker
# engine not answering; None while it answers.
_ENGINE_OUTAGE = {"since": None}
# Network namespaces made ahead of jobs: containers that only hold one (running `sleep`
# as nobody), on a node-local internal network until a job start takes one, renames it
# to NETNS_NAME and gives it the job's address.
STANDBY_NETWORK = "dmpi-standby"
# Taking and trimming spares, one at a time (in /run: only root may make files there).
STANDBY_LOCK = "/run/dockermpi-standby.lock"
STANDBY_LIMITS = {"mem_limit": 32 << 20, "pids_limit": 8, "nano_cpus": 100_000_000}


def __virtual__():
    if not HAS_DOCKER:
        return False, "mpi_job needs the Docker SDK for Python (pip package 'docker')"
    for tool in ("nsenter", "iptables-restore", "ssh-keyscan"):
        if not shutil.which(tool):
            return False, f"mpi_job needs {tool} on the node (util-linux, iptables, openssh-client)"
    return __virtualname__


def _client():
    try:
        return docker.from_env(timeout=60)
    except docker.errors.DockerException as exc:
        raise CommandExecutionError(f"cannot reach the Docker engine: {exc}") from exc


# --------------------------------------------------------------------------- checks


def _check_job_id(job_id):
    if not isinstance(job_id, str) or not JOB_ID_RE.match(job_id):
        raise SaltInvocationError(f"invalid job id {job_id!r}")


def _check_user(user):
    if not isinstance(user, str) or not USER_RE.match(user):
        raise SaltInvocationError(f"invalid user name {user!r}")


def _check_ids(uid, gid):
    """The job's uid and gid as ints; never root's."""
    try:
        uid, gid = int(uid), int(gid)
    except (TypeError, ValueError):
        raise SaltInvocationError(f"uid and gid must be numbers, got {uid!r}, {gid!r}") from None
    if uid <= 0 or gid <= 0:
        raise SaltInvocationError("a job's uid and gid must not be root's")
    return uid, gid


def _check_abs(path, what):
    if not isinstance(path, str) or not os.path.isabs(path):
        raise SaltInvocationError(f"{what} must be an absolute path, got {path!r}")
    return path


def _check_ipv4(value, what):
    try:
        return str(ipaddress.IPv4Address(value))
    except (ipaddress.AddressValueError, ValueError, TypeError):
        raise SaltInvocationError(f"{what} must be an IPv4 address, got {value!r}") from None


def _check_ipv4_network(value, what):
    try:
        return str(ipaddress.IPv4Network(value, strict=True))
    except (ipaddress.AddressValueError, ipaddress.NetmaskValueError, ValueError,
            TypeError):
        raise SaltInvocationError(
            f"{what} must be an IPv4 network in CIDR form, got {value!r}") from None


def _secret_dir(job_root, job_id):
    return os.path.join(_check_abs(job_root, "job_root"), job_id)


def _users_root(storage_path):
    """``<storage>/users``: admin-made, the one path the node may follow."""
    root = os.path.join(_check_abs(storage_path, "storage path"), "users")
    if not os.path.isdir(root):
        raise CommandExecutionError(
            f"shared storage is not ready: {root} does not exist on this node"
        )
    return root


# ----------------------------------------------------------- user directories (userfs)


def _userfs(op, uid, gid, **kwargs):
    """Run a mpi_userfs operation in a child process as uid:gid; Salt errors only."""
    try:
        return __utils__["mpi_userfs.run_confined"](op, uid=uid, gid=gid,
                                                    timeout=USERFS_TIMEOUT, **kwargs)
    except Exception as exc:  # pylint: disable=broad-except
        # mpi_userfs raises UserPathError for everything a user's tree can do to it; the
        # loader does not export the class, so this is the one place it is translated.
        raise CommandExecutionError(str(exc)) from exc


def _user_dir_owner(storage_path, user):
    """(uid, mode) of ``users/<user>`` without following a symlink; None when absent."""
    root_fd = os.open(_users_root(storage_path), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fd = os.open(user, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                     dir_fd=root_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CommandExecutionError(f"users/{user} is not a directory: {exc.strerror}") from None
    finally:
        os.close(root_fd)
    try:
        info = os.fstat(fd)
    finally:
        os.close(fd)
    return info.st_uid, stat.S_IMODE(info.st_mode)


def _require_user_dir(storage_path, user, uid):
    found = _user_dir_owner(storage_path, user)
    if found is None or found[0] != uid or found[1] & 0o077:
        raise CommandExecutionError(StartFailure(
            "user_dir",
            f"the directory of user {user} is not ready: users/{user} must exist, be owned "
            f"by uid {uid} and be closed to others (found {found})").wire())


def ensure_user_dir(storage_path, user, uid, gid):
    """
    Give a user's directory ``<storage_path>/users/<user>`` to the user's own uid:gid,
    mode 0700, creating it when missing. Never follows a symlink. Run it on the node
    that is root on the shared storage (the NFS server, or any node of a cluster file
    system).

    storage_path
        Where the shared storage is on this host (the NFS export on the server).
    user
        The user's name.
    uid, gid
        The user's own ids (from the master's allocation).

    Returns ``{"created": bool, "changed": bool}``.

    CLI Example:

    .. code-block:: bash

        salt node1 mpi_job.ensure_user_dir /srv/dockermpi alice 100000 100000
    """
    _check_user(user)
    uid, gid = _check_ids(uid, gid)
    try:
        return __utils__["mpi_userfs.ensure_owned_dir"](_users_root(storage_path), user, uid, gid,
                                                        0o700)
    except CommandExecutionError:
        raise
    except Exception as exc:  # pylint: disable=broad-except
        raise CommandExecutionError(f"cannot prepare users/{user}: {exc}") from exc


def prune_job_dirs(storage_path, user, uid, gid, older_than, keep=None):
    """
    Remove a user's job directories (``users/<user>/mpi-jobs/<job id>``) of jobs
    submitted before ``older_than`` in which nothing changed since, except the jobs in
    ``keep`` (queued or running). Runs as the user's uid and never follows a link
    (``mpi_userfs.prune_job_dirs``). Run it on the host that owns the shared storage.

    storage_path
        Where the shared storage is on this host.
    user, uid, gid
        The user and their own ids.
    older_than
        Unix time.
    keep
        Job ids whose directories stay.

    Returns the job ids whose directories were removed.

    CLI Example:

    .. code-block:: bash

        salt node1 mpi_job.prune_job_dirs /srv/dockermpi alice 100000 100000 1767225600
    """
    _check_user(user)
    uid, gid = _check_ids(uid, gid)
    try:
        older_than = float(older_than)
    except (TypeError, ValueError):
        raise SaltInvocationError("older_than must be a Unix time") from None
    keep = [str(job_id) for job_id in keep or []]
    if not all(JOB_ID_RE.match(job_id) for job_id in keep):
        raise SaltInvocationError("keep must be a list of job ids")
    return _userfs("prune_job_dirs", uid, gid, root=_users_root(storage_path),
                   parts=[user, JOBS_SUBDIR], older_than=older_than, keep=keep)


def migrate_user_dir(storage_path, user, from_uid, uid, gid):
    """
    Hand a directory tree that the old shared guest uid owned to the user's own uid:
    every entry of ``users/<user>`` owned by ``from_uid`` (never following a symlink)
    changes owner, then the directory is closed to others (0700).

    CLI Example:

    .. code-block:: bash

        salt node1 mpi_job.migrate_user_dir /srv/dockermpi alice 2000 100000 100000
    """
    _check_user(user)
    uid, gid = _check_ids(uid, gid)
    from_uid, _ = _check_ids(from_uid, gid)
    root = _users_root(storage_path)
    try:
        changed = __utils__["mpi_userfs.chown_tree"](root, user, from_uid, uid, gid)
        result = __utils__["mpi_userfs.ensure_owned_dir"](root, user, uid, gid, 0o700)
    except Exception as exc:  # pylint: disable=broad-except
        raise CommandExecutionError(f"cannot migrate users/{user}: {exc}") from exc
    return {"entries_changed": changed, **result}


def user_dirs(storage_path):
    """
    List the user directories on the shared storage: ``{name: {"uid": owner, "mode":
    "0700"}}`` (entries that are not directories, or not valid user names, are left out).

    CLI Example:

    .. code-block:: bash

        salt node1 mpi_job.user_dirs /srv/dockermpi
    """
    root = _users_root(storage_path)
    found = {}
    for name in os.listdir(root):
        if not USER_RE.match(name):
            continue
        info = os.lstat(os.path.join(root, name))
        if stat.S_ISDIR(info.st_mode):
            found[name] = {"uid": info.st_uid, "mode": f"{stat.S_IMODE(info.st_mode):04o}"}
    return found


# ------------------------------------------------------------------------- secrets


def _write_secrets(directory, files, uid, gid, keys):
    """The job's files (from the master) and its keys (made here) in a directory only
    the job's uid reads."""
    unknown = set(files) - SECRET_FILES
    if unknown:
        raise SaltInvocationError(f"unexpected job files: {sorted(unknown)}")
    if any(not isinstance(t, str) or len(t) > SECRET_FILE_MAX for t in files.values()):
        raise SaltInvocationError("job files must be text of at most 1 MiB each")
    files = dict(files, **keys)
    os.makedirs(os.path.dirname(directory), mode=0o711, exist_ok=True)
    os.mkdir(directory, 0o700)
    os.chown(directory, uid, gid)
    for name, text in files.items():
        fd = os.open(os.path.join(directory, name),
                     os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.chown(os.path.join(directory, name), uid, gid)


# ---------------------------------------------------------------------- containers


def _size(value, what):
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise SaltInvocationError(f"limit {what} must be a whole number, got {value!r}") from None
    if number <= 0:
        raise SaltInvocationError(f"limit {what} must be positive, got {value!r}")
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


def _container_options(job_id, role, user, uid, gid, data_dir, secret_dir, limits):
    mounts = [
        Mount(DATA_MOUNT, data_dir, type="bind"),
        Mount(RUN_DIR, secret_dir, type="bind", read_only=True),
        Mount("/etc/passwd", os.path.join(secret_dir, "passwd"), type="bind", read_only=True),
        Mount("/etc/group", os.path.join(secret_dir, "group"), type="bind", read_only=True),
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


def _netns(pid):
    return ["nsenter", f"--net=/proc/{int(pid)}/ns/net", "--"]


def _run(argv, stdin=None, timeout=10):
    result = __salt__["cmd.run_all"](argv, python_shell=False, stdin=stdin, timeout=timeout,
                                     ignore_retcode=True, output_loglevel="quiet")
    return result["retcode"], result["stdout"], result["stderr"]


def job_firewall_rules(allowed_sources, sshd_port):
    """
    The iptables rules of a job's network namespace: only the job's own containers may
    reach it, and its nodes' hosts only its sshd (the node reports probe it); nothing
    else on the cluster network reaches a job's sshd or Open MPI ports. Out of it, the
    job opens connections to its own containers only among the networks in
    ``allowed_sources["unreachable"]`` (the cluster network and what the site adds):
    never to the master's Salt ports or user API, the registry, the hub or a node's host.
    Those are refused at once (a reset or port-unreachable), not left to time out.
    """
    peers = [_check_ipv4(source, "peer address") for source in allowed_sources["peers"]]
    lines = [
        "*filter",
        ":INPUT DROP [0:0]",
        ":FORWARD DROP [0:0]",
        ":OUTPUT ACCEPT [0:0]",
        "-A INPUT -i lo -j ACCEPT",
        "-A INPUT -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT",
    ]
    lines += [f"-A INPUT -s {peer}/32 -j ACCEPT" for peer in peers]
    for source in allowed_sources["hosts"]:
        lines.append(f"-A INPUT -s {_check_ipv4(source, 'host address')}/32 -p tcp "
                     f"--dport {int(sshd_port)} -j ACCEPT")
    lines += ["-A OUTPUT -o lo -j ACCEPT",
              "-A OUTPUT -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT"]
    lines += [f"-A OUTPUT -d {peer}/32 -j ACCEPT" for peer in peers]
    for network in allowed_sources.get("unreachable", ()):
        network = _check_ipv4_network(network, "unreachable network")
        lines += [f"-A OUTPUT -d {network} -p tcp -j REJECT --reject-with tcp-reset",
                  f"-A OUTPUT -d {network} -j REJECT --reject-with icmp-port-unreachable"]
    return "\n".join(lines + ["COMMIT", ""])


_IPV6_CLOSED = "*filter\n:INPUT DROP [0:0]\n:FORWARD DROP [0:0]\n:OUTPUT DROP [0:0]\n" \
               "-A INPUT -i lo -j ACCEPT\n-A OUTPUT -o lo -j ACCEPT\nCOMMIT\n"


def _close_namespace(job_id, pid, allowed_sources, sshd_port):
    for tool, rules in (("iptables-restore", job_firewall_rules(allowed_sources, sshd_port)),
                        ("ip6tables-restore", _IPV6_CLOSED)):
        code, _, err = _run(_netns(pid) + [tool], stdin=rules)
        if code != 0:
            raise CommandExecutionError(f"cannot set the firewall of job {job_id}: {err.strip()}")


# ------------------------------------------------------- standby network namespaces


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


def _job_of(container):
    """(job id, role) of one of this module's containers: a taken standby namespace is
    its job's ``netns`` (by the name the start gave it), a spare belongs to no job
    (``(None, "standby")``); workers and launchers carry their job and role as labels.
    The role is None for a label this module never sets."""
    labels = container.labels or {}
    role = labels.get(LABEL_ROLE)
    if role == STANDBY_ROLE:
        taken = NETNS_RE.match(container.name or "")
        return (taken.group(1), "netns") if taken else (None, STANDBY_ROLE)
    return labels.get(LABEL_JOB), role if role in ("worker", "launcher") else None


def _namespace_options():
    """What a job's network namespace gets wherever it is made (with the worker, or
    ahead as a standby): the node's name as hostname, as users know it (the ranks
    share it), no IPv6, and ports below 1024 for root alone (Docker lowers that floor
    to 0 in every container; a job binding one could pass for a host's root, as to an
    NFS server that trusts privileged source ports)."""
    return {"hostname": __opts__["id"],
            "sysctls": {"net.ipv6.conf.all.disable_ipv6": "1",
                        "net.ipv4.ip_unprivileged_port_start": "1024"}}


def _check_standby_count(count):
    most = MAX_STANDBY_NAMESPACES
    if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= most:
        raise SaltInvocationError(
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


def _take_standby(client, job_id, network, address):
    """A standby namespace made the job's (renamed to NETNS_NAME, on the job network at
    ``address``; :func:`_seal_standby` takes it off the standby network), or None when
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


def _seal_standby(client, job_id, holder, pid, allowed_sources, sshd_port):
    """A taken standby namespace (its holder, whose process is ``pid``) off the standby
    network and behind the job's firewall; done before the worker starts in it, so
    nothing of the job ever runs without both."""
    try:
        client.api.disconnect_container_from_network(holder.id, STANDBY_NETWORK)
    except docker.errors.APIError as exc:
        raise CommandExecutionError(
            f"cannot take the namespace of job {job_id} off the standby network: {exc}") from exc
    _close_namespace(job_id, pid, allowed_sources, sshd_port)


def standby(image, count):
    """
    Keep ``count`` network namespaces made ahead of jobs on this node, each held by a
    container that runs ``sleep`` as nobody (no capabilities, read-only, tiny limits)
    on the node-local internal network ``dmpi-standby``, which reaches nothing. A job
    start takes one (:func:`start_worker`): making a namespace is the slowest step of
    a container's start. Spares beyond ``count``, or not running, are removed.

    image
        An image present on the node with ``sleep`` in it (the clean-up passes the
        image its job ran).
    count
        How many to keep, 0 to 16 (``mpi:job_network:standby``); 0 removes them all.

    Returns ``{"made": [names], "removed": [names], "ready": n}``.

    CLI Example:

    .. code-block:: bash

        salt node1 mpi_job.standby 10.0.0.10:5000/mpi@sha256:0123...cdef 2
    """
    _check_standby_count(count)
    if not isinstance(image, str) or not image or image.startswith("-"):
        raise SaltInvocationError(f"invalid image {image!r}")
    return _keep_standby(image, count)


def standby_status():
    """
    The standby network namespaces on this node (:func:`standby`): ``{"ready": n,
    "not_running": m}``, spares that run and spares that do not (a stopped engine's).

    CLI Example:

    .. code-block:: bash

        salt node1 mpi_job.standby_status
    """
    spares = _standby_spares(_client())
    ready = sum(1 for spare in spares if spare.status == "running")
    return {"ready": ready, "not_running": len(spares) - ready}


def _keep_standby(image, count):
    client = _client()
    removed = []
    with _standby_lock():
        running = 0
        for spare in _standby_spares(client):
            if spare.status == "running" and running < count:
                running += 1
                continue
            with contextlib.suppress(docker.errors.NotFound):
                spare.remove(force=True)
                removed.append(spare.name)
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
                read_only=True, init=True, **_namespace_options(), **STANDBY_LIMITS)
        except docker.errors.APIError as exc:
            with contextlib.suppress(docker.errors.APIError):
                client.containers.get(name).remove(force=True)
            raise CommandExecutionError(f"cannot make a standby namespace: {exc}") from exc
        made.append(name)
    return {"made": made, "removed": removed, "ready": running + len(made)}


def _answering_with_job_certificate(pid, expected, port):
    """Which of the sshds at the addresses of ``expected`` (``{address: CA public
    line}``), seen from the job's own namespace, present a host certificate of that
    address's node CA naming that address (a banner alone proves nothing)."""
    _, out, _ = _run(_netns(pid) + ["ssh-keyscan", "-c", "-T", "1", "-p", str(int(port))]
                     + sorted(expected), timeout=5)
    proven = set()
    for line in out.splitlines():
        try:
            cert = __utils__["mpi_launch.read_ssh_certificate"](line)
        except ValueError:
            continue
        if cert["kind"] != "host":
            continue
        proven.update(a for a in cert["principals"]
                      if a in expected and expected[a].split()[:2] == cert["ca"].split())
    return proven


def _wait_for_sshd(job_id, container, pid, expected, port, deadline):
    """Wait until every address of ``expected`` answers with its host certificate; raise
    when the worker exits or time runs out."""
    waiting = set(expected)
    while waiting:
        waiting -= _answering_with_job_certificate(
            pid, {a: expected[a] for a in waiting}, port)
        if not waiting:
            return
        container.reload()
        if container.status != "running":
            logs = container.logs(tail=20).decode(errors="replace")
            raise CommandExecutionError(f"worker sshd of job {job_id} exited: {logs.strip()}")
        if time.monotonic() > deadline:
            raise CommandExecutionError(
                f"the sshd of job {job_id} at {', '.join(sorted(waiting))} did not answer "
                f"with the job's host certificate on port {port} in time")
        time.sleep(0.05)


def _job_ca():
    """This node's job CA: ``(private text, public line)``, made on first use."""
    with _JOB_CA_LOCK:
        try:
            with open(JOB_CA_KEY) as handle:
                private = handle.read()
        except FileNotFoundError:
            os.makedirs(os.path.dirname(JOB_CA_KEY), mode=0o700, exist_ok=True)
            private, _ = __utils__["mpi_launch.generate_ed25519_keypair"]("dockermpi-job-ca")
            partial = f"{JOB_CA_KEY}.{os.getpid()}"
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as handle:
                handle.write(private)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(partial, JOB_CA_KEY)
    from cryptography.hazmat.primitives import serialization

    try:
        key = serialization.load_ssh_private_key(private.encode("ascii"), password=None)
    except ValueError as exc:
        raise CommandExecutionError(f"the job CA key {JOB_CA_KEY} is unreadable: {exc}") from exc
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                           serialization.PublicFormat.OpenSSH).decode("ascii")
    return private, public


def job_ca():
    """
    The public key of this node's job CA, which certifies the ssh keys this node makes
    for jobs (made on first use; the private key stays in ``/var/lib/dockermpi/job-ca``).

    CLI Example:

    .. code-block:: bash

        salt node1 mpi_job.job_ca
    """
    try:
        return _job_ca()[1]
    except OSError as exc:
        raise CommandExecutionError(f"cannot make the job CA {JOB_CA_KEY}: {exc}") from exc


def _job_keys(job_id, job_cas, launcher_node, addresses, sshd_port, valid_seconds):
    """The ssh keys of this node's part of a job, made and certified here with the
    node's job CA (:func:`mpi_launch.job_keys <_utils.mpi_launch.job_keys>`)."""
    if not isinstance(job_cas, dict) or set(addresses) - set(job_cas) or not all(
            isinstance(job_cas[n], str) and _CA_LINE_RE.match(job_cas[n]) for n in addresses):
        raise SaltInvocationError(
            "job_cas must give every node of the job its job CA's ed25519 public key")
    try:
        valid_seconds = int(valid_seconds)
    except (TypeError, ValueError):
        raise SaltInvocationError(f"valid_seconds must be seconds, got {valid_seconds!r}") from None
    if valid_seconds <= 0:
        raise SaltInvocationError("valid_seconds must be positive")
    try:
        ca_private, ca_public = _job_ca()
    except OSError as exc:
        raise CommandExecutionError(f"cannot make the job CA {JOB_CA_KEY}: {exc}") from exc
    if str(job_cas[__opts__["id"]]).split()[:2] != ca_public.split()[:2]:
        raise CommandExecutionError(
            f"the master holds another job CA for {__opts__['id']} than the node's own "
            f"({JOB_CA_KEY} changed); the node's next health report brings the new one")
    now = int(time.time())
    try:
        return __utils__["mpi_launch.job_keys"](
            ca_private, job_id, __opts__["id"], addresses, job_cas, launcher_node, sshd_port,
            now - CERT_CLOCK_SKEW, now + valid_seconds + CERT_GRACE)
    except ValueError as exc:
        raise SaltInvocationError(f"cannot make the keys of job {job_id}: {exc}") from exc


def start_worker(job_id, image, user, uid, gid, storage_path, job_root, network, addresses,
                 allowed_sources, sshd_port, files, launcher, job_cas, valid_seconds,
                 limits=None, ready_timeout=30):
    """
    Make a job's keys, write its files, start its worker container and wait until its
    sshd answers with the job's host certificate; on the job's first node, start the
    launcher.

    job_id
        The job id the runner gave.
    image
        Approved image reference, pinned by digest.
    user
        Whose job it is; ``<storage_path>/users/<user>`` is mounted at ``/data``.
    uid, gid
        The user's own ids; the containers run as them.
    storage_path
        Where the shared storage is on this node.
    job_root
        Node-local directory for per-job secrets.
    network
        The Docker job network (macvlan) on this node.
    addresses
        ``{node id: address}``: each node's job container address from the master's
        pool (one call serves every node of the job); this node takes its own.
    allowed_sources
        ``{"peers": [job addresses], "hosts": [node addresses], "unreachable":
        [networks]}``: who may reach the job's namespace (peers: everything; hosts: only
        sshd), and where the job may open connections only to its peers (CIDRs: the
        cluster network and the site's ``mpi:job_network:unreachable``).
    sshd_port
        The port sshd listens on inside the job's namespace.
    files
        ``{name: text}``: sshd_config, passwd, group, program and hostfile (no keys: the
        node makes those).
    launcher
        ``{"node": id, "argv": [...], "environment": {...}, "limits": {...},
        "status": {...}}``: the node with that id makes the job's user key and, once
        its own sshd and every other address in ``addresses`` answer with their host
        certificates, starts the container that runs mpirun (``argv``, the launcher
        command; ``environment``, set there and forwarded to the ranks, sealed to this
        node's Salt key by the master (:mod:`mpi_seal <_utils.mpi_seal>`); ``status``,
        written as ``status.json`` just before it starts) before it returns. Every
        other node's sshd trusts the user certificates of that node's job CA.
    job_cas
        ``{node id: job CA public line}`` of every node of the job (:func:`job_ca`).
    valid_seconds
        How long the job may run: its certificates expire that long (and a grace for
        the clean-up) after they are made.
    limits
        ``{node id: {"memory": bytes, "pids": n, "nano_cpus": n, "tmp_size": bytes}}``;
        a node not named gets small limits (a worker that runs no ranks).
    ready_timeout
        Seconds to wait for sshd.

    Returns ``{"container": name, "sshd_ready_seconds": float, "namespace": "standby"
    or "own", "phases": {...}}``, and on the launcher's node also ``launcher`` (its
    container name); there ``sshd_ready_seconds`` is when every sshd of the job was
    proven. ``phases`` says when each step ended (seconds from the call: prepare,
    namespace, container, firewall, sshd, launcher). In a standby namespace the
    firewall is in place before the worker starts; in its own, just after.

    CLI Example:

    .. code-block:: bash

        salt node1 mpi_job.start_worker <job_id> <image> alice 100000 100000 \\
            /srv/dockermpi /var/lib/dockermpi/jobs dmpi-jobs '{node1: 10.0.1.130}' \\
            '{peers: [10.0.1.130], hosts: [10.0.0.11], unreachable: [10.0.0.0/16]}' \\
            2222 '{...}' '{node: node1, argv: [...]}' '{node1: ssh-ed25519 AAAA...}' 3600
    """
    _check_job_id(job_id)
    _check_user(user)
    uid, gid = _check_ids(uid, gid)
    if not isinstance(addresses, dict) or __opts__["id"] not in addresses:
        raise SaltInvocationError(f"addresses must give this node ({__opts__['id']}) an address")
    address = _check_ipv4(addresses[__opts__["id"]], "address")
    limits = (limits or {}).get(__opts__["id"])
    if not isinstance(network, str) or not DOCKER_NAME_RE.match(network):
        raise SaltInvocationError(f"invalid network name {network!r}")
    if not isinstance(allowed_sources, dict):
        raise SaltInvocationError(
            "allowed_sources must be {peers: [...], hosts: [...], unreachable: [...]}")
    if not isinstance(launcher, dict) or launcher.get("node") not in addresses:
        raise SaltInvocationError("launcher must name one of the job's nodes")
    starts_launcher = launcher["node"] == __opts__["id"]
    started = time.monotonic()
    keys = _job_keys(job_id, job_cas, launcher["node"], addresses, sshd_port, valid_seconds)
    try:
        users_root = _users_root(storage_path)
    except CommandExecutionError as exc:
        raise CommandExecutionError(StartFailure("storage", str(exc)).wire()) from None
    _require_user_dir(storage_path, user, uid)
    secret_dir = _secret_dir(job_root, job_id)
    _write_secrets(secret_dir, files, uid, gid, keys)
    options = _container_options(job_id, "worker", user, uid, gid,
                                 os.path.join(users_root, user), secret_dir, limits)
    client = _client()
    phases = {"prepare": time.monotonic() - started}
    holder = _take_standby(client, job_id, network, address)
    phases["namespace"] = time.monotonic() - started
    sshd_argv = ["/usr/sbin/sshd", "-D", "-e", "-f", f"{RUN_DIR}/sshd_config"]
    try:
        if holder is not None:
            # The namespace is sealed while the worker is created, and before it starts.
            options.pop("detach")
            pid = holder.attrs["State"]["Pid"]
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                sealed = pool.submit(contextvars.copy_context().run, _seal_standby, client,
                                     job_id, holder, pid, allowed_sources, sshd_port)
                container = client.containers.create(
                    image, sshd_argv, network_mode=f"container:{holder.id}", **options)
                sealed.result()
            phases["firewall"] = time.monotonic() - started
            container.start()
        else:
            container = client.containers.run(
                image, sshd_argv, network=network,
                networking_config={
                    network: client.api.create_endpoint_config(ipv4_address=address)},
                **_namespace_options(), **options,
            )
            container.reload()
            pid = container.attrs["State"]["Pid"]
    except docker.errors.APIError as exc:
        raise CommandExecutionError(f"cannot start the worker of job {job_id}: {exc}") from exc
    phases["container"] = time.monotonic() - started
    netns = holder.id if holder is not None else options["name"]
    namespace = "standby" if holder is not None else "own"
    if holder is None:
        _close_namespace(job_id, pid, allowed_sources, sshd_port)
        phases["firewall"] = time.monotonic() - started
    deadline = time.monotonic() + ready_timeout
    if not starts_launcher:
        _wait_for_sshd(job_id, container, pid, {address: job_cas[__opts__["id"]]},
                       sshd_port, deadline)
        phases["sshd"] = time.monotonic() - started
        return {"container": options["name"], "sshd_ready_seconds": phases["sshd"],
                "namespace": namespace, "phases": phases}
    # The launcher's node starts mpirun itself once every sshd of the job, its own
    # included, proves it is the job's: one publish starts the whole job. The job
    # directory and the launcher container are made while the sshds come up.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        # The thread runs in this call's context: Salt's dunders resolve through it.
        prepared = pool.submit(contextvars.copy_context().run, _create_launcher, job_id, image,
                               user, uid, gid, storage_path, job_root, launcher["argv"],
                               launcher.get("environment"), launcher.get("limits"),
                               launcher.get("status"), netns)
        _wait_for_sshd(job_id, container, pid,
                       {addresses[n]: job_cas[n] for n in addresses}, sshd_port, deadline)
        launcher_container = prepared.result()
    phases["sshd"] = time.monotonic() - started
    _start_launcher(job_id, launcher_container)
    phases["launcher"] = time.monotonic() - started
    return {"container": options["name"], "sshd_ready_seconds": phases["sshd"],
            "launcher": launcher_container.name, "namespace": namespace, "phases": phases}


def _create_launcher(job_id, image, user, uid, gid, storage_path, job_root, argv,
                     environment, limits, status, netns):
    """The job directory (as the user's uid), the launcher container in the network
    namespace of container ``netns`` (the worker's), created, not started, and
    ``status.json`` (when ``status`` is given) saying the job runs."""
    _check_job_id(job_id)
    _check_user(user)
    uid, gid = _check_ids(uid, gid)
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise SaltInvocationError("argv must be a non-empty list of strings")
    users_root = _users_root(storage_path)
    secret_dir = _secret_dir(job_root, job_id)
    if not os.path.isdir(secret_dir):
        raise CommandExecutionError(f"job {job_id} has no worker on this node")
    _userfs("makedirs", uid, gid, root=users_root, parts=[user, JOBS_SUBDIR, job_id])
    options = _container_options(job_id, "launcher", user, uid, gid,
                                 os.path.join(users_root, user), secret_dir, limits)
    options["environment"] = dict(_opened_environment(environment),
                                  **options["environment"])
    options.pop("detach")
    try:
        container = _client().containers.create(
            image, argv, network_mode=f"container:{netns}", **options)
    except docker.errors.APIError as exc:
        raise CommandExecutionError(f"cannot start the launcher of job {job_id}: {exc}") from exc
    if status is not None:
        write_status(job_id, storage_path, user, uid, gid, status)
    return container


def _opened_environment(environment):
    """The job's environment the master sealed to this node (users' values travel
    sealed, so the master's job cache holds no secret of theirs)."""
    if environment is None:
        return {}
    try:
        opened = json.loads(__utils__["mpi_seal.unseal"](
            os.path.join(__opts__["pki_dir"], "minion.pem"), environment))
    except (OSError, ValueError) as exc:
        raise SaltInvocationError(f"the job's environment is not sealed to this node: {exc}") \
            from exc
    if not isinstance(opened, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in opened.items()):
        raise SaltInvocationError("the job's environment must be names and text values")
    return opened


def _start_launcher(job_id, container):
    try:
        container.start()
    except docker.errors.APIError as exc:
        raise CommandExecutionError(f"cannot start the launcher of job {job_id}: {exc}") from exc


def cleanup(job_id, job_root, status=None, status_node=None, storage_path=None, user=None,
            uid=None, gid=None, standby=0):
    """
    Remove every container and secret of a job from this node; idempotent. Then, with
    ``standby``, make the network namespaces the node keeps ready (:func:`standby`,
    from the job's image); a failure there is logged, never the clean-up's.

    job_id, job_root
        As for :func:`start_worker`.
    status
        Optional final status record, written first as ``status.json`` in the job's
        output directory (needs ``storage_path``, ``user``, ``uid`` and ``gid``).
    status_node
        Only the node with this id writes ``status``: one call serves all of a job's
        nodes, and the shared file is written once.
    standby
        How many network namespaces this node keeps made ahead of jobs
        (``mpi:job_network:standby``); 0 leaves them as they are.

    Returns ``{"removed": [container names], "secrets_removed": bool}``, and
    ``standby`` (what :func:`standby` did) when it ran.

    CLI Example:

    .. code-block:: bash

        salt '*' mpi_job.cleanup <job_id> /var/lib/dockermpi/jobs
    """
    _check_job_id(job_id)
    _check_standby_count(standby)
    if status is not None and status_node in (None, __opts__["id"]):
        try:
            write_status(job_id, storage_path, user, uid, gid, status)
        except (CommandExecutionError, SaltInvocationError) as exc:
            log.error("job %s: cannot write status.json: %s", job_id, exc)
    removed, image = [], None
    client = _client()
    # (another clean-up of the same job may remove a container while it is listed)
    containers = client.containers.list(all=True, filters={"label": f"{LABEL_JOB}={job_id}"},
                                        ignore_removed=True)
    # The namespace's holder last: the job's containers are in its namespace.
    containers += client.containers.list(
        all=True, filters={"name": NETNS_NAME.format(job_id=job_id)}, ignore_removed=True)
    for container in containers:
        if container.name == f"dmpi-{job_id}-worker":
            image = (container.attrs or {}).get("Image")
        try:
            container.remove(force=True)
            removed.append(container.name)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            # Another clean-up of the same job is removing it right now (409).
            if exc.status_code != 409:
                raise CommandExecutionError(f"cannot remove {container.name}: {exc}") from exc
    secret_dir = _secret_dir(job_root, job_id)
    had_secrets = os.path.isdir(secret_dir)
    shutil.rmtree(secret_dir, ignore_errors=True)
    if os.path.exists(secret_dir):
        raise CommandExecutionError(f"cannot remove {secret_dir}")
    result = {"removed": sorted(removed), "secrets_removed": had_secrets}
    if standby and image:
        try:
            result["standby"] = _keep_standby(image, standby)
        except (CommandExecutionError, SaltInvocationError) as exc:
            log.error("cannot keep %s standby network namespaces: %s", standby, exc)
    return result


def write_status(job_id, storage_path, user, uid, gid, status):
    """
    Write a job's status record as ``status.json`` in its output directory, as the
    job's uid, without following anything the job put there.

    CLI Example:

    .. code-block:: bash

        salt node1 mpi_job.write_status <job_id> /srv/dockermpi alice 100000 100000 \\
            '{state: running}'
    """
    _check_job_id(job_id)
    _check_user(user)
    uid, gid = _check_ids(uid, gid)
    text = json.dumps(status, indent=2, sort_keys=True) + "\n"
    _userfs("write_file", uid, gid, root=_users_root(storage_path),
            parts=[user, JOBS_SUBDIR, job_id], name="status.json", data=text.encode())
    return True


def node_engine_running(storage_path, job_root="/var/lib/dockermpi/jobs", health=None):
    """
    Whether this minion was started with the ``mpi_node`` engine configured for these
    paths (minion engines are read at start only, so a newer configuration needs a
    restart of the minion).

    health
        The seconds between health looks the engine should run with, when its
        configuration names them (since it reports health: a minion started before that
        runs an engine without it, and restarts).

    CLI Example:

    .. code-block:: bash

        salt '*' mpi_job.node_engine_running /srv/dockermpi health=10
    """
    wanted = {"storage_path": storage_path, "job_root": job_root}
    if health is not None:
        wanted["health"] = health
    for engine in __opts__.get("engines") or []:
        if isinstance(engine, dict) and engine.get("mpi_node") == wanted:
            return True
    return False


def jobs(job_root="/var/lib/dockermpi/jobs"):
    """
    List the DockerMPI job containers and secret directories on this node.

    Returns ``{job_id: {"containers": {name: status}, "secrets": bool}}``.

    CLI Example:

    .. code-block:: bash

        salt '*' mpi_job.jobs
    """
    found = {}
    for container in _client().containers.list(all=True, filters={"label": LABEL_ROLE},
                                               ignore_removed=True):
        job_id, _ = _job_of(container)
        if job_id:
            job = found.setdefault(job_id, {"containers": {}, "secrets": False})
            job["containers"][container.name] = container.status
    if os.path.isdir(job_root):
        for name in os.listdir(job_root):
            found.setdefault(name, {"containers": {}, "secrets": False})["secrets"] = True
    return found


def _read_tail(storage_path, user, uid, gid, job_id, stream, tail_bytes, offset=None):
    """Bytes of a job's output file, read as the job's uid."""
    return _userfs("read_tail", uid, gid, root=_users_root(storage_path),
                   parts=[user, JOBS_SUBDIR, job_id], name=stream, max_bytes=tail_bytes,
                   offset=offset)


def _whole_characters(data):
    """``data`` without a UTF-8 character cut off at its end (the follower reads it next)."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte < 0x80:
            return data
        if byte >= 0xC0:  # the lead byte of the last character
            length = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return data if length <= back else data[:-back]
    return data


def read_output(job_id, storage_path, user, uid, gid, stream="stdout", tail_bytes=TAIL_BYTES,
                offset=None, seal=False):
    """
    Return the tail of a job's standard output or standard error (text); with
    ``offset``, ``{"data": text, "offset": where to read next}`` from that byte on (at
    most ``tail_bytes``), for following a running job.

    job_id
        The job id.
    storage_path
        Where the shared storage is on this node.
    user, uid, gid
        Whose job it is; the file is read as that uid.
    stream
        ``stdout`` or ``stderr``.
    tail_bytes
        At most this many bytes from the end of the file (default 64 KiB).
    seal
        Return the answer sealed to the master's key (:mod:`mpi_seal
        <_utils.mpi_seal>`), so the user's output is not in the master's job cache or
        on its event bus; the ``mpi`` runner opens it.

    CLI Example:

    .. code-block:: bash

        salt node1 mpi_job.read_output <job_id> /srv/dockermpi alice 100000 100000 \\
            stream=stderr
    """
    _check_job_id(job_id)
    _check_user(user)
    uid, gid = _check_ids(uid, gid)
    if stream not in OUTPUT_STREAMS:
        raise SaltInvocationError(f"stream must be one of {OUTPUT_STREAMS}, got {stream!r}")
    try:
        tail_bytes = int(tail_bytes)
    except (TypeError, ValueError):
        raise SaltInvocationError(f"tail_bytes must be an integer, got {tail_bytes!r}") from None
    if not 1 <= tail_bytes <= 16 << 20:
        raise SaltInvocationError(f"tail_bytes must be between 1 and 16 MiB, got {tail_bytes}")
    if offset is not None and (isinstance(offset, bool) or not isinstance(offset, int)
                               or offset < 0):
        raise SaltInvocationError(f"offset must be a non-negative integer, got {offset!r}")
    try:
        data = _read_tail(storage_path, user, uid, gid, job_id, stream, tail_bytes, offset)
        if offset is None:
            answer = data.decode(errors="replace")
        else:
            data = _whole_characters(data)
            answer = {"data": data.decode(errors="replace"), "offset": offset + len(data)}
    except CommandExecutionError as exc:
        raise CommandExecutionError(f"cannot read the {stream} of job {job_id}: {exc}") from exc
    if not seal:
        return answer
    try:
        return __utils__["mpi_seal.seal"](os.path.join(__opts__["pki_dir"], "minion_master.pub"),
                                          json.dumps(answer).encode())
    except OSError as exc:
        raise CommandExecutionError(f"cannot seal the output to the master's key: {exc}") from exc


# --------------------------------------------------------------------------- report


def _job_peers(secret_dir):
    """(the job's sshd port, [job addresses from the hostfile]) or (None, []).

    The secret directory is root's (mounted read-only into the job), so its content is
    the master's; it is still read with bounds.
    """
    try:
        with open(os.path.join(secret_dir, "sshd_config"), errors="replace") as handle:
            match = _PORT_RE.search(handle.read(SECRET_FILE_MAX))
        with open(os.path.join(secret_dir, "hostfile"), errors="replace") as handle:
            lines = handle.read(SECRET_FILE_MAX).splitlines()
    except OSError:
        return None, []
    if not match:
        return None, []
    addresses = []
    for line in lines:
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        try:
            addresses.append(str(ipaddress.IPv4Address(words[0])))
        except ValueError:
            log.warning("%s/hostfile: ignoring %r", secret_dir, line[:80])
    return int(match.group(1)), addresses


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
        # Every container this module makes has a role: the jobs' and the standby
        # namespaces (a job's once a start took it and named it after the job).
        containers = client.containers.list(
            all=True, filters={"label": LABEL_ROLE}, ignore_removed=True
        )
    finally:
        client.close()
    found = {}
    for container in containers:
        labels = container.labels or {}
        job_id, role = _job_of(container)
        if role == STANDBY_ROLE:
            continue  # a spare: no job's yet
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


def _failed_rank(storage_path, job_id, job):
    """Which rank failed, from the job's stderr read as its uid; None when unknown."""
    if job["launcher_exit_code"] in (None, 0) or not job["user"] or not job["uid"]:
        return None
    try:
        text = _read_tail(storage_path, job["user"], int(job["uid"]), int(job["gid"]), job_id,
                          "stderr", TAIL_BYTES).decode(errors="replace")
    except (CommandExecutionError, SaltInvocationError, ValueError, TypeError) as exc:
        log.debug("job %s: cannot read stderr: %s", job_id, exc)
        return None
    return __utils__["mpi_launch.parse_mpirun_failure"](text)


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
    saying so, and the master judges the node's jobs by its silence only. Nothing a job wrote can make this raise: at worst that job's failure
    stays unknown.

    CLI Example:

    .. code-block:: bash

        salt '*' mpi_job.report /srv/dockermpi
    """
    _check_abs(str(storage_path), "storage path")
    _check_abs(str(job_root), "job_root")
    try:
        probe_timeout = float(probe_timeout)
        engine_timeout = float(engine_timeout)
    except (TypeError, ValueError):
        raise SaltInvocationError("probe_timeout and engine_timeout must be numbers") from None
    if probe_timeout <= 0 or engine_timeout <= 0:
        raise SaltInvocationError("probe_timeout and engine_timeout must be positive")
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
        raise CommandExecutionError(f"cannot list {job_root}: {exc}") from exc
    for name in names:
        if JOB_ID_RE.match(name) and os.path.isdir(os.path.join(job_root, name)):
            found.setdefault(name, _empty_job())["secrets"] = True

    wanted = {}
    for job_id, job in found.items():
        job["failure"] = _failed_rank(storage_path, job_id, job)
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


# --------------------------------------------------------------------------- health

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


def health(storage_path, engine_timeout=5):
    """
    Whether this node can take new jobs, in evidence the master's job engine judges.

    storage_path
        Where the shared storage is on this node.
    engine_timeout
        Seconds the Docker engine has to answer.

    Returns ``{"docker": "ok" or why not, "storage": "ok" or why not ("not mounted:
    ...", "not writable: ...", "not responding ..."), "images": [repo@sha256:...],
    "job_ca": "ok" or why not, "job_ca_public": the job CA's public line}``:
    the storage is a mount point (or holds ``users/``) and a probe file can be written
    and removed in its ``.dockermpi-health`` directory (at its root before highstate
    made that); ``images`` are the digest references of every
    local image (the master keeps those of approved images). Never raises for what it
    finds.

    CLI Example:

    .. code-block:: bash

        salt '*' mpi_job.health /srv/dockermpi
    """
    _check_abs(str(storage_path), "storage path")
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
    node_id = _NODE_ID_RE.sub("_", str(__opts__.get("id") or "node"))[:64]
    storage = _storage_health(str(storage_path), f".dockermpi-health-{node_id}",
                              STORAGE_CHECK_TIMEOUT)
    health = {"docker": docker_state, "storage": storage,
              "images": sorted(set(images))[:HEALTH_IMAGES_MAX], "job_ca": "ok"}
    try:
        health["job_ca_public"] = _job_ca()[1]
    except (OSError, CommandExecutionError) as exc:
        health["job_ca"] = f"cannot make the job CA {JOB_CA_KEY}: {exc}"[:300]
    return health
