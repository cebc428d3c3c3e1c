"""
Run the containers of DockerMPI jobs on this node: the Salt face of :mod:`dmpi.node`.

The ``mpi`` runner on the master decides everything about a job (placement, the user's
uid, the job's addresses, limits, the mpirun command line) and calls these functions on
the chosen nodes; the ``mpi_node`` engine calls :func:`report` and :func:`health`. What
they do is in :mod:`dmpi.node`; here each function checks nothing itself, gives the
library this minion's id and keys, and turns its errors into Salt's: a bad argument
into ``SaltInvocationError``, anything the node cannot do into
``CommandExecutionError`` (a failed start carries its kind, :class:`StartFailure`).

:depends: docker (Docker SDK for Python), nsenter (util-linux), iptables-restore,
    ip6tables-restore and ssh-keyscan on the node
"""

import functools
import os
import shutil

from dmpi.errors import DockerMPIError, RequestError, StartFailure
from salt.exceptions import CommandExecutionError, SaltInvocationError

try:
    from dmpi.node import cleanup as node_cleanup
    from dmpi.node import evidence, jobca, start, userdirs
    from dmpi.node import health as node_health
    from dmpi.node import standby as node_standby

    HAS_DOCKER = True
except ImportError:
    HAS_DOCKER = False

__virtualname__ = "mpi_job"


def __virtual__():
    if not HAS_DOCKER:
        return False, "mpi_job needs the Docker SDK for Python (pip package 'docker')"
    for tool in ("nsenter", "iptables-restore", "ssh-keyscan"):
        if not shutil.which(tool):
            return False, f"mpi_job needs {tool} on the node (util-linux, iptables, openssh-client)"
    return __virtualname__


def _salt_errors(function):
    """The library's errors as Salt's, one place for every function of this module."""

    @functools.wraps(function)
    def translated(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except StartFailure as exc:
            raise CommandExecutionError(exc.wire()) from exc
        except RequestError as exc:
            raise SaltInvocationError(str(exc)) from exc
        except DockerMPIError as exc:
            raise CommandExecutionError(str(exc)) from exc

    return translated


@_salt_errors
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
    return userdirs.ensure_user_dir(storage_path, user, uid, gid)


@_salt_errors
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
    return userdirs.prune_job_dirs(storage_path, user, uid, gid, older_than, keep)


@_salt_errors
def migrate_user_dir(storage_path, user, from_uid, uid, gid):
    """
    Hand a directory tree that the old shared guest uid owned to the user's own uid:
    every entry of ``users/<user>`` owned by ``from_uid`` (never following a symlink)
    changes owner, then the directory is closed to others (0700).

    CLI Example:

    .. code-block:: bash

        salt node1 mpi_job.migrate_user_dir /srv/dockermpi alice 2000 100000 100000
    """
    return userdirs.migrate_user_dir(storage_path, user, from_uid, uid, gid)


@_salt_errors
def user_dirs(storage_path):
    """
    List the user directories on the shared storage: ``{name: {"uid": owner, "mode":
    "0700"}}`` (entries that are not directories, or not valid user names, are left out).

    CLI Example:

    .. code-block:: bash

        salt node1 mpi_job.user_dirs /srv/dockermpi
    """
    return userdirs.user_dirs(storage_path)


@_salt_errors
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
    return node_standby.keep(image, count, __opts__["id"])


@_salt_errors
def standby_status():
    """
    The standby network namespaces on this node (:func:`standby`): ``{"ready": n,
    "not_running": m}``, spares that run and spares that do not (a stopped engine's).

    CLI Example:

    .. code-block:: bash

        salt node1 mpi_job.standby_status
    """
    return node_standby.status()


@_salt_errors
def job_ca():
    """
    The public key of this node's job CA, which certifies the ssh keys this node makes
    for jobs (made on first use; the private key stays in ``/var/lib/dockermpi/job-ca``).

    CLI Example:

    .. code-block:: bash

        salt node1 mpi_job.job_ca
    """
    return jobca.public_line()


@_salt_errors
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
    return start.start_worker(
        job_id, image, user, uid, gid, storage_path, job_root, network, addresses,
        allowed_sources, sshd_port, files, launcher, job_cas, valid_seconds, limits,
        ready_timeout, node_id=__opts__["id"],
        node_key=os.path.join(__opts__["pki_dir"], "minion.pem"))


@_salt_errors
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
    return node_cleanup.cleanup(__opts__["id"], job_id, job_root, status, status_node,
                                storage_path, user, uid, gid, standby)


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



@_salt_errors
def jobs(job_root="/var/lib/dockermpi/jobs"):
    """
    List the DockerMPI job containers and secret directories on this node.

    Returns ``{job_id: {"containers": {name: status}, "secrets": bool}}``.

    CLI Example:

    .. code-block:: bash

        salt '*' mpi_job.jobs
    """
    return node_cleanup.jobs(job_root)


@_salt_errors
def read_output(job_id, storage_path, user, uid, gid, stream="stdout", tail_bytes=None,
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
    seal_to = os.path.join(__opts__["pki_dir"], "minion_master.pub") if seal else None
    return userdirs.read_output(job_id, storage_path, user, uid, gid, stream, tail_bytes,
                                offset, seal_to)


@_salt_errors
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
    return evidence.report(storage_path, job_root, probe_timeout, engine_timeout)


@_salt_errors
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
    return node_health.health(__opts__["id"], storage_path, engine_timeout)
