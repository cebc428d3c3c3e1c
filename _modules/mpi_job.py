"""
Run the containers of DockerMPI jobs on this node.

The ``mpi`` runner on the master decides everything about a job (placement, ports, keys,
the mpirun command line) and calls these functions on the chosen nodes. This module
only acts on the local Docker engine and local disk:

- :func:`start_worker` writes the job's secrets to node-local disk (readable only by the
  guest uid), starts the job's worker container (sshd as the guest uid, ``--net=host``)
  and waits until its sshd answers.
- :func:`start_launcher` starts the container that runs ``mpirun`` on the first node.
- :func:`wait` waits (bounded) for the launcher to exit and reads how the job ended.
- :func:`cleanup` writes the status file, then removes every container and secret of a
  job. It is idempotent.
- :func:`jobs` lists what of which job is on this node.

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


def wait(job_id, storage_path, user, seconds=5):
    """
    Wait up to ``seconds`` for a job's launcher to exit.

    Returns ``{"state": "running"}`` or ``{"state": "exited", "exit_code": int,
    "failure": {...} or None}``, where ``failure`` says which rank failed and how (from
    mpirun's standard error), or ``{"state": "missing"}`` when no launcher exists.

    CLI Example:

    .. code-block:: bash

        salt node1 mpi_job.wait <job_id> /srv/dockermpi alice seconds=5
    """
    _check_job_id(job_id)
    _, job_dir = _user_dirs(storage_path, user, job_id)
    try:
        container = _client().containers.get(f"dmpi-{job_id}-launcher")
    except docker.errors.NotFound:
        return {"state": "missing"}
    try:
        exit_code = container.wait(timeout=float(seconds))["StatusCode"]
    except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
        return {"state": "running"}
    failure = None
    if exit_code != 0:
        try:
            with open(os.path.join(job_dir, "stderr"), errors="replace") as handle:
                failure = __utils__["mpi_launch.parse_mpirun_failure"](handle.read())
        except OSError as exc:
            log.warning("job %s: cannot read stderr: %s", job_id, exc)
    return {"state": "exited", "exit_code": exit_code, "failure": failure}


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
