"""
Run the containers of DockerMPI jobs on this node.

The ``mpi`` runner on the master decides everything about a job (placement, ports, keys,
the mpirun command line) and calls these functions on the chosen nodes. This module
only acts on the local Docker engine and local disk:

- :func:`start_worker` writes the job's secrets to node-local disk (readable only by the
  guest uid), starts the job's worker container (sshd as the guest uid, ``--net=host``)
  and waits until its sshd answers.
- :func:`start_launcher` starts the container that runs ``mpirun`` on the first node.
- :func:`cleanup` writes the status file, then removes every container and secret of a
  job. It is idempotent.
- :func:`jobs` lists what of which job is on this node.
- :func:`report` is the node's evidence about every job on it (containers, launcher
  exit and the failing rank, Docker engine, reachability of the job's other nodes); the
  ``mpi_jobs`` beacon fires it as an event every interval.
- :func:`read_output` returns the tail of a job's standard output or error.

Every job container drops all capabilities, sets no-new-privileges and mounts only the
user's data directory (read-write, at ``/data``) and the job's secret directory
(read-only). Files in the user's directory are written as the guest uid (``setpriv``), so
this works on NFS with root_squash.

:depends: docker (Docker SDK for Python), setpriv (util-linux)
"""

import ipaddress
import json
import logging
import os
import re
import shutil
import socket
import sys
import stat
import threading
import time

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

LABEL_JOB = "io.dockermpi.job"
LABEL_ROLE = "io.dockermpi.role"
LABEL_USER = "io.dockermpi.user"
RUN_DIR = "/run/dockermpi"
DATA_MOUNT = "/data"
JOBS_SUBDIR = "mpi-jobs"
SECRET_FILES = {
    "id_ed25519",
    "ssh_host_key",
    "authorized_keys",
    "known_hosts",
    "sshd_config",
    "hostfile",
    "passwd",
    "group",
}
_JOB_ID_RE = re.compile(r"^[0-9]{8}-[0-9]{6}-[0-9a-f]{6}$")
_USER_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
_PORT_RE = re.compile(r"^\s*Port\s+(\d+)\s*$", re.IGNORECASE | re.MULTILINE)
OUTPUT_STREAMS = ("stdout", "stderr")
TAIL_BYTES = 65536

# Writes stdin to argv[1] atomically; run as the guest uid through setpriv.
_WRITE_FILE = (
    "import os,sys\n"
    "path=sys.argv[1]; tmp=path+'.tmp'\n"
    "with open(tmp,'w') as f: f.write(sys.stdin.read())\n"
    "os.replace(tmp,path)\n"
)


def __virtual__():
    if not HAS_DOCKER:
        return False, "mpi_job needs the Docker SDK for Python (pip package 'docker')"
    if not shutil.which("setpriv"):
        return False, "mpi_job needs setpriv (util-linux) to write files as the guest user"
    return __virtualname__


def _client():
    try:
        return docker.from_env(timeout=60)
    except docker.errors.DockerException as exc:
        raise CommandExecutionError(f"cannot reach the Docker engine: {exc}") from exc


def _check_job_id(job_id):
    if not isinstance(job_id, str) or not _JOB_ID_RE.match(job_id):
        raise SaltInvocationError(f"invalid job id {job_id!r}")


def _check_guest(guest):
    try:
        uid, gid = int(guest["uid"]), int(guest["gid"])
    except (KeyError, TypeError, ValueError):
        raise SaltInvocationError(f"guest must give numeric uid and gid, got {guest!r}") from None
    if uid <= 0 or gid <= 0:
        raise SaltInvocationError("the guest uid and gid must not be root's")
    return uid, gid


def _user_dirs(storage_path, user, job_id):
    """(the user's data directory, the job's output directory) on this node."""
    if not isinstance(user, str) or not _USER_RE.match(user):
        raise SaltInvocationError(f"invalid user name {user!r}")
    if not os.path.isabs(storage_path):
        raise SaltInvocationError(f"storage path must be absolute, got {storage_path!r}")
    if not os.path.isdir(os.path.join(storage_path, "users")):
        raise CommandExecutionError(
            f"shared storage is not ready: {storage_path}/users does not exist on this node"
        )
    data_dir = os.path.join(storage_path, "users", user)
    return data_dir, os.path.join(data_dir, JOBS_SUBDIR, job_id)


def _as_guest(uid, gid, argv, stdin=None):
    """Run argv as the guest uid:gid (no supplementary groups)."""
    cmd = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--", *argv]
    result = __salt__["cmd.run_all"](cmd, python_shell=False, stdin=stdin, ignore_retcode=True)
    if result["retcode"] != 0:
        raise CommandExecutionError(f"{argv[0]} as uid {uid} failed: {result['stderr'].strip()}")
    return result


def _write_as_guest(uid, gid, path, text):
    _as_guest(uid, gid, [sys.executable, "-c", _WRITE_FILE, path], stdin=text)


def _secret_dir(job_root, job_id):
    if not os.path.isabs(job_root):
        raise SaltInvocationError(f"job_root must be absolute, got {job_root!r}")
    return os.path.join(job_root, job_id)


def _write_secrets(directory, files, uid, gid):
    unknown = set(files) - SECRET_FILES
    if unknown:
        raise SaltInvocationError(f"unexpected job files: {sorted(unknown)}")
    os.makedirs(os.path.dirname(directory), mode=0o755, exist_ok=True)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    os.chown(directory, uid, gid)
    for name, text in files.items():
        path = os.path.join(directory, name)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.chown(path, uid, gid)


def _container_options(job_id, role, user, uid, gid, data_dir, secret_dir, shm_size):
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
        "network_mode": "host",
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "mounts": mounts,
        "shm_size": shm_size,
        "init": True,
        "working_dir": DATA_MOUNT,
        "detach": True,
    }


def _cluster_address(cluster_network):
    try:
        network = ipaddress.ip_network(cluster_network)
    except ValueError as exc:
        raise SaltInvocationError(f"invalid cluster network {cluster_network!r}: {exc}") from None
    for address in __grains__.get("ipv4", []):
        if ipaddress.ip_address(address) in network:
            return address
    raise CommandExecutionError(f"this node has no address in the cluster network {network}")


def _sshd_answers(address, port):
    try:
        with socket.create_connection((address, port), timeout=1) as conn:
            conn.settimeout(1)
            return conn.recv(8).startswith(b"SSH-")
    except OSError:
        return False


def start_worker(
    job_id,
    image,
    user,
    guest,
    storage_path,
    job_root,
    port,
    cluster_network,
    files,
    shm_size="512m",
    ready_timeout=30,
):
    """
    Write a job's secrets, start its worker container and wait until its sshd answers.

    job_id
        The job id the runner gave.
    image
        Approved image reference, pinned by digest.
    user
        The user whose data directory (``<storage_path>/users/<user>``) is mounted.
    guest
        ``{"uid": ..., "gid": ...}`` the container runs as.
    storage_path
        Where the shared storage is on this node.
    job_root
        Node-local directory for per-job secrets.
    port
        The job's sshd port.
    cluster_network
        The cluster network (CIDR); sshd is probed on this node's address in it.
    files
        ``{name: text}``: id_ed25519, ssh_host_key, authorized_keys, known_hosts,
        sshd_config, passwd, group and (launcher node) hostfile.
    shm_size
        Size of the container's /dev/shm (ranks on one node talk through it).
    ready_timeout
        Seconds to wait for sshd.

    Returns ``{"container": name, "sshd_ready_seconds": float}``.

    CLI Example:

    .. code-block:: bash

        salt node1 mpi_job.start_worker <job_id> <image> alice '{uid: 2000, gid: 2000}' \\
            /srv/dockermpi /var/lib/dockermpi/jobs 20000 10.0.0.0/24 '{...}'
    """
    _check_job_id(job_id)
    uid, gid = _check_guest(guest)
    address = _cluster_address(cluster_network)
    data_dir, job_dir = _user_dirs(storage_path, user, job_id)
    secret_dir = _secret_dir(job_root, job_id)
    started = time.monotonic()
    _write_secrets(secret_dir, files, uid, gid)
    _as_guest(uid, gid, ["mkdir", "-p", "-m", "0700", data_dir])
    _as_guest(uid, gid, ["mkdir", "-p", job_dir])
    options = _container_options(job_id, "worker", user, uid, gid, data_dir, secret_dir, shm_size)
    try:
        container = _client().containers.run(
            image, ["/usr/sbin/sshd", "-D", "-e", "-f", f"{RUN_DIR}/sshd_config"], **options
        )
    except docker.errors.APIError as exc:
        raise CommandExecutionError(f"cannot start the worker of job {job_id}: {exc}") from exc
    deadline = time.monotonic() + ready_timeout
    while not _sshd_answers(address, int(port)):
        container.reload()
        if container.status != "running":
            logs = container.logs(tail=20).decode(errors="replace")
            raise CommandExecutionError(f"worker sshd of job {job_id} exited: {logs.strip()}")
        if time.monotonic() > deadline:
            raise CommandExecutionError(
                f"worker sshd of job {job_id} did not answer on {address}:{port} "
                f"within {ready_timeout}s"
            )
        time.sleep(0.05)
    return {"container": options["name"], "sshd_ready_seconds": time.monotonic() - started}


def start_launcher(job_id, image, user, guest, storage_path, job_root, argv, environment=None,
                   status=None, shm_size="512m"):
    """
    Start the container that runs ``mpirun`` for a job (on the job's first node).

    job_id, image, user, guest, storage_path, job_root, shm_size
        As for :func:`start_worker`, which must have run on this node first.
    argv
        The launcher command (a list; no shell parses it).
    environment
        ``{name: value}`` set in the launcher, forwarded to the ranks with ``-x``.
    status
        Optional status record, written as ``status.json`` once the launcher runs.

    CLI Example:

    .. code-block:: bash

        salt node1 mpi_job.start_launcher <job_id> <image> alice '{uid: 2000, gid: 2000}' \\
            /srv/dockermpi /var/lib/dockermpi/jobs '[mpirun, ...]'
    """
    _check_job_id(job_id)
    uid, gid = _check_guest(guest)
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise SaltInvocationError("argv must be a non-empty list of strings")
    data_dir, _ = _user_dirs(storage_path, user, job_id)
    secret_dir = _secret_dir(job_root, job_id)
    if not os.path.isdir(secret_dir):
        raise CommandExecutionError(f"job {job_id} has no worker on this node")
    options = _container_options(job_id, "launcher", user, uid, gid, data_dir, secret_dir,
                                 shm_size)
    env = dict(environment or {})
    env["HOME"] = DATA_MOUNT
    try:
        _client().containers.run(image, argv, environment=env, **options)
    except docker.errors.APIError as exc:
        raise CommandExecutionError(f"cannot start the launcher of job {job_id}: {exc}") from exc
    if status is not None:
        write_status(job_id, storage_path, user, guest, status)
    return {"container": options["name"]}


def cleanup(job_id, job_root, status=None, status_node=None, storage_path=None, user=None,
            guest=None):
    """
    Remove every container and secret of a job from this node; idempotent.

    job_id, job_root
        As for :func:`start_worker`.
    status
        Optional final status record, written first as ``status.json`` in the job's
        output directory (needs ``storage_path``, ``user`` and ``guest``).
    status_node
        Only the node with this id writes ``status``: one call serves all of a job's
        nodes, and the shared file is written once.

    Returns ``{"removed": [container names], "secrets_removed": bool}``.

    CLI Example:

    .. code-block:: bash

        salt '*' mpi_job.cleanup <job_id> /var/lib/dockermpi/jobs
    """
    _check_job_id(job_id)
    if status is not None and status_node in (None, __opts__["id"]):
        try:
            write_status(job_id, storage_path, user, guest, status)
        except (CommandExecutionError, SaltInvocationError) as exc:
            log.error("job %s: cannot write status.json: %s", job_id, exc)
    removed = []
    client = _client()
    for container in client.containers.list(all=True, filters={"label": f"{LABEL_JOB}={job_id}"}):
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
    return {"removed": sorted(removed), "secrets_removed": had_secrets}


def write_status(job_id, storage_path, user, guest, status):
    """
    Write a job's status record as ``status.json`` in its output directory, as the guest.

    CLI Example:

    .. code-block:: bash

        salt node1 mpi_job.write_status <job_id> /srv/dockermpi alice \\
            '{uid: 2000, gid: 2000}' '{state: running}'
    """
    _check_job_id(job_id)
    uid, gid = _check_guest(guest)
    _, job_dir = _user_dirs(storage_path, user, job_id)
    _as_guest(uid, gid, ["mkdir", "-p", job_dir])
    _write_as_guest(uid, gid, os.path.join(job_dir, "status.json"),
                    json.dumps(status, indent=2, sort_keys=True) + "\n")
    return True


def jobs(job_root="/var/lib/dockermpi/jobs"):
    """
    List the DockerMPI job containers and secret directories on this node.

    Returns ``{job_id: {"containers": {name: status}, "secrets": bool}}``.

    CLI Example:

    .. code-block:: bash

        salt '*' mpi_job.jobs
    """
    found = {}
    for container in _client().containers.list(all=True, filters={"label": LABEL_JOB}):
        job = found.setdefault(container.labels[LABEL_JOB], {"containers": {}, "secrets": False})
        job["containers"][container.name] = container.status
    if os.path.isdir(job_root):
        for name in os.listdir(job_root):
            found.setdefault(name, {"containers": {}, "secrets": False})["secrets"] = True
    return found


def _read_tail(storage_path, user, job_id, stream, tail_bytes):
    """
    The last ``tail_bytes`` of ``<storage>/users/<user>/mpi-jobs/<job_id>/<stream>``.

    The user's directory is writable from inside the user's jobs, so the file is opened
    only if it resolves inside that directory, is not a symlink and is a regular file
    (a FIFO must not block the caller). Raises OSError when it cannot be read.
    """
    data_dir, job_dir = _user_dirs(storage_path, user, job_id)
    path = os.path.join(job_dir, stream)
    real_data = os.path.realpath(data_dir)
    if os.path.commonpath([real_data, os.path.realpath(job_dir)]) != real_data:
        raise OSError(f"{job_dir} leads outside {data_dir}")
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"{path} is not a regular file")
        handle.seek(max(0, info.st_size - tail_bytes))
        return handle.read(tail_bytes).decode(errors="replace")


def read_output(job_id, storage_path, user, stream="stdout", tail_bytes=TAIL_BYTES):
    """
    Return the tail of a job's standard output or standard error (text).

    job_id
        The job id.
    storage_path
        Where the shared storage is on this node.
    user
        Whose job it is (the output is under ``<storage_path>/users/<user>/mpi-jobs``).
    stream
        ``stdout`` or ``stderr``.
    tail_bytes
        At most this many bytes from the end of the file (default 64 KiB).

    CLI Example:

    .. code-block:: bash

        salt node1 mpi_job.read_output <job_id> /srv/dockermpi alice stream=stderr
    """
    _check_job_id(job_id)
    if stream not in OUTPUT_STREAMS:
        raise SaltInvocationError(f"stream must be one of {OUTPUT_STREAMS}, got {stream!r}")
    try:
        tail_bytes = int(tail_bytes)
    except (TypeError, ValueError):
        raise SaltInvocationError(f"tail_bytes must be an integer, got {tail_bytes!r}") from None
    if tail_bytes < 1:
        raise SaltInvocationError(f"tail_bytes must be positive, got {tail_bytes}")
    try:
        return _read_tail(storage_path, user, job_id, stream, tail_bytes)
    except OSError as exc:
        raise CommandExecutionError(f"cannot read the {stream} of job {job_id}: {exc}") from exc


def _job_peers(secret_dir):
    """(the job's sshd port, [node addresses from the hostfile]) or (None, [])."""
    try:
        with open(os.path.join(secret_dir, "sshd_config"), errors="replace") as handle:
            match = _PORT_RE.search(handle.read())
        with open(os.path.join(secret_dir, "hostfile"), errors="replace") as handle:
            lines = handle.read().splitlines()
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
            addresses.append(str(ipaddress.ip_address(words[0])))
        except ValueError:
            log.warning("%s/hostfile: ignoring %r", secret_dir, line)
    return int(match.group(1)), addresses


def _own_addresses(cluster_network):
    """This node's addresses that are never a job's peers."""
    if cluster_network is None:
        return set(__grains__.get("ipv4", []))
    try:
        return {_cluster_address(cluster_network)}
    except CommandExecutionError as exc:
        log.warning("%s; treating every local address as this node", exc)
        return set(__grains__.get("ipv4", []))


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


def _engine_jobs(engine_timeout):
    """{job_id: {"user", "containers", "launcher_exit_code"}} from the Docker engine."""
    client = docker.from_env(timeout=engine_timeout)
    try:
        containers = client.containers.list(
            all=True, filters={"label": LABEL_JOB}, ignore_removed=True
        )
    finally:
        client.close()
    found = {}
    for container in containers:
        labels = container.labels
        job_id, role = labels.get(LABEL_JOB), labels.get(LABEL_ROLE)
        if not _JOB_ID_RE.match(job_id or "") or role not in ("worker", "launcher"):
            log.warning("ignoring container %s with labels %s", container.name, labels)
            continue
        job = found.setdefault(job_id, _empty_job())
        user = labels.get(LABEL_USER)
        if job["user"] is None and user and _USER_RE.match(user):
            job["user"] = user
        job["containers"][role] = container.status
        if role == "launcher" and container.status in ("exited", "dead"):
            job["launcher_exit_code"] = container.attrs.get("State", {}).get("ExitCode")
    return found


def _empty_job():
    return {
        "user": None,
        "containers": {"worker": None, "launcher": None},
        "launcher_exit_code": None,
        "failure": None,
        "secrets": False,
        "peers": {},
    }


def report(storage_path, job_root="/var/lib/dockermpi/jobs", cluster_network=None,
           probe_timeout=0.5, engine_timeout=5):
    """
    Report what this node knows about every DockerMPI job on it.

    storage_path
        Where the shared storage is on this node (to read a failed job's stderr).
    job_root
        Node-local directory of per-job secrets.
    cluster_network
        The cluster network (CIDR); this node's address in it is not probed as a peer.
        Default: none of this node's addresses is.
    probe_timeout
        Seconds each TCP probe of a peer may take; all probes run at once.
    engine_timeout
        Seconds the Docker engine has to answer.

    Jobs come from containers labelled ``io.dockermpi.job`` and from secret directories
    in ``job_root``. Returns::

        {"engine": "ok" or the error text when the Docker engine cannot be reached,
         "jobs": {job_id: {"user": str or None,
                           "containers": {"worker": status or None,
                                          "launcher": status or None},
                           "launcher_exit_code": int or None,
                           "failure": which rank failed (from stderr) or None,
                           "secrets": bool,
                           "peers": {address: bool}}},
         "time": unix time}

    ``peers`` holds, while the job's worker or launcher runs, whether each other node
    of the job (from its hostfile) accepts a TCP connection on the job's sshd port.
    With the engine down, jobs come from ``job_root`` only and nothing is probed.

    CLI Example:

    .. code-block:: bash

        salt '*' mpi_job.report /srv/dockermpi cluster_network=10.0.0.0/24
    """
    if not os.path.isabs(str(storage_path)):
        raise SaltInvocationError(f"storage path must be absolute, got {storage_path!r}")
    if not os.path.isabs(str(job_root)):
        raise SaltInvocationError(f"job_root must be absolute, got {job_root!r}")
    try:
        probe_timeout = float(probe_timeout)
        engine_timeout = float(engine_timeout)
    except (TypeError, ValueError):
        raise SaltInvocationError("probe_timeout and engine_timeout must be numbers") from None
    if probe_timeout <= 0 or engine_timeout <= 0:
        raise SaltInvocationError("probe_timeout and engine_timeout must be positive")
    own = _own_addresses(cluster_network)
    now = time.time()

    engine = "ok"
    try:
        found = _engine_jobs(engine_timeout)
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        engine = str(exc) or type(exc).__name__
        found = {}
    try:
        names = os.listdir(job_root)
    except FileNotFoundError:
        names = []
    except OSError as exc:
        raise CommandExecutionError(f"cannot list {job_root}: {exc}") from exc
    for name in names:
        if _JOB_ID_RE.match(name) and os.path.isdir(os.path.join(job_root, name)):
            found.setdefault(name, _empty_job())["secrets"] = True

    wanted = {}
    for job_id, job in found.items():
        code = job["launcher_exit_code"]
        if code not in (None, 0) and job["user"] is not None:
            try:
                text = _read_tail(storage_path, job["user"], job_id, "stderr", TAIL_BYTES)
                job["failure"] = __utils__["mpi_launch.parse_mpirun_failure"](text)
            except (OSError, CommandExecutionError, SaltInvocationError) as exc:
                log.debug("job %s: cannot read stderr: %s", job_id, exc)
        running = "running" in job["containers"].values()
        if running and job["secrets"]:
            port, addresses = _job_peers(os.path.join(job_root, job_id))
            if port is not None:
                wanted[job_id] = [(a, port) for a in addresses if a not in own]
    results = _probe_all({t for targets in wanted.values() for t in targets}, probe_timeout)
    for job_id, targets in wanted.items():
        found[job_id]["peers"] = {address: results[(address, port)] for address, port in targets}
    return {"engine": engine, "jobs": found, "time": now}
