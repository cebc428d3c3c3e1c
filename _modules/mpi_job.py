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

import dmpi_current

# A minion that outlived an upgrade imports the library below anew (dmpi_current).
dmpi_current.ensure()

from dmpi.errors import DockerMPIError, RequestError, StartFailure
from salt.exceptions import CommandExecutionError, SaltInvocationError

try:
    from dmpi.node import cleanup as node_cleanup
    from dmpi.node import evidence, jobca, start, userdirs
    from dmpi.node import health as node_health
    from dmpi.node import standby as node_standby

    MISSING = None
except ImportError as exc:  # the Docker SDK, most often
    MISSING = str(exc)

__virtualname__ = "mpi_job"


def __virtual__():
    if MISSING:
        return False, (f"mpi_job cannot load dmpi.node ({MISSING}): it needs the Docker SDK "
                       "for Python (pip package 'docker') and DockerMPI's _utils synced")
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

    Arguments and answer: :func:`dmpi.node.userdirs.ensure_user_dir`.

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
    (``dmpi.node.userfs.prune_job_dirs``). Run it on the host that owns the shared storage.

    Arguments and answer: :func:`dmpi.node.userdirs.prune_job_dirs`.

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

    Arguments and answer: :func:`dmpi.node.userdirs.migrate_user_dir`.

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

    Arguments and answer: :func:`dmpi.node.userdirs.user_dirs`.

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

    Arguments and answer: :func:`dmpi.node.standby.keep` (this minion's id and key are
    given here).

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

    Arguments and answer: :func:`dmpi.node.standby.status`.

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

    Arguments and answer: :func:`dmpi.node.jobca.public_line`.

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

    Arguments and answer: :func:`dmpi.node.start.start_worker` (this minion's id and key are
    given here).

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

    Arguments and answer: :func:`dmpi.node.cleanup.cleanup` (this minion's id and key are
    given here).

    CLI Example:

    .. code-block:: bash

        salt '*' mpi_job.cleanup <job_id> /var/lib/dockermpi/jobs
    """
    return node_cleanup.cleanup(__opts__["id"], job_id, job_root, status, status_node,
                                storage_path, user, uid, gid, standby)


@_salt_errors
def jobs(job_root="/var/lib/dockermpi/jobs"):
    """
    List the DockerMPI job containers and secret directories on this node.

    Arguments and answer: :func:`dmpi.node.cleanup.jobs`.

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

    With ``seal``, the answer is sealed to the master's key (:mod:`dmpi.seal`), so
    the user's output is not in the master's job cache or on its event bus; the
    ``mpi`` runner opens it.

    Arguments and answer: :func:`dmpi.node.userdirs.read_output`.

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

    Arguments and answer: :func:`dmpi.node.evidence.report`.

    CLI Example:

    .. code-block:: bash

        salt '*' mpi_job.report /srv/dockermpi
    """
    return evidence.report(storage_path, job_root, probe_timeout, engine_timeout)


@_salt_errors
def health(storage_path, engine_timeout=5):
    """
    Whether this node can take new jobs, in evidence the master's job controller judges.

    Arguments and answer: :func:`dmpi.node.health.health` (this minion's id and key are
    given here).

    CLI Example:

    .. code-block:: bash

        salt '*' mpi_job.health /srv/dockermpi
    """
    return node_health.health(__opts__["id"], storage_path, engine_timeout)
