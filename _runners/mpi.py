"""
Run users' MPI programs across DockerMPI nodes, from the Salt master: the commands admins
call with ``salt-run mpi.<name>``. A thin face over :mod:`dmpi.master`: the commands
users may also call (through the user API) are :mod:`dmpi.master.user_calls`, the
admins' own :mod:`dmpi.master.admin_calls`; here they run as an admin, who names whom a
job is for and sees every job.

``salt-run mpi.submit`` validates a job and queues it; the queue starts jobs first come,
first served, all or nothing across nodes, backfilling smaller jobs only where that
cannot delay the head of the queue, within per-user limits. ``mpi.launch`` is submit and
wait. A job does not depend on the ``salt-run`` that submitted it.

Jobs' lives belong to the job controller (:mod:`dmpi.master.controller`, run by the
``mpi_master`` engine on the master), which takes the nodes' evidence from the
``mpi_node`` engine on each node. These commands only write requests to the job store
and announce them on the event bus (``mpi/job/<id>/queued``, ``mpi/job/<id>/cancel``);
the controller fires every transition as ``mpi/job/<id>/<state>``.

A refused command returns ``{"error": ...}`` (``{"state": "rejected", "error": ...}``
for a job) and ``salt-run`` exits with 1.

:depends: the ``dmpi`` package (``_utils``); the ``mpi_master`` engine on the master;
    the ``mpi_job`` execution module and ``mpi_node`` engine on the nodes
"""

import signal

from dmpi.errors import DockerMPIError, RequestError
from dmpi.jobs import mpijob as mpi_operator
from dmpi.master import admin_calls, selftest as network_selftest, user_calls
from dmpi.master.site import Site

__virtualname__ = "mpi"
__func_alias__ = {"list_": "list"}

_SITE = []  # this process's Site, made on first use


def __virtual__():
    return __virtualname__


class _Interrupted(Exception):
    """salt-run received SIGTERM."""


def _site():
    if not _SITE:
        _SITE.append(Site(__opts__))
    return _SITE[0]


def _admin():
    """The admin calling: root on the master, by the name Salt gives (``__user__``)."""
    return user_calls.Caller(name=globals().get("__user__"))


def _answer(fun, *args, **kwargs):
    """``fun``'s answer, or ``{"error": ...}`` with the exit code 1 when it refused."""
    try:
        return fun(*args, **kwargs)
    except DockerMPIError as exc:
        __context__["retcode"] = 1
        return {"error": str(exc), "retcode": 1}


# -------------------------------------------------------------------------- jobs


def submit(user=None, image=None, np=None, cmd=None, nodes=None, slots_per_node=None,
           walltime=None, env=None, workdir=None, name=None):
    """
    Queue an MPI job and return its id at once; it starts when all its slots are free.

    Arguments are those of :func:`launch`. Returns the job record (``job_id``,
    ``state: queued``, ...) or ``{"state": "rejected", "error": ...}`` when any argument
    is wrong or the job could never run; nothing is queued then.

    CLI Example:

    .. code-block:: bash

        salt-run mpi.submit user=alice image=mpi np=6 cmd='python3 /data/pi.py' walltime=10m
    """
    queued = _answer(user_calls.submit, _site(), _admin(), user=user, image=image, np=np,
                     cmd=cmd, nodes=nodes, slots_per_node=slots_per_node, walltime=walltime,
                     env=env, workdir=workdir, name=name)
    if "error" in queued:
        return dict(queued, state="rejected")  # nothing was queued
    return dict(queued, retcode=0)  # queued is what submit promises


def submit_mpijob(path=None, user=None, image=None, mpijob=None):
    """
    Queue a Kubeflow MPI Operator job (``kind: MPIJob``, ``kubeflow.org/v2beta1`` or
    ``v1``) as a DockerMPI job and return its record at once, as :func:`submit` does.
    The launcher's ``mpirun -n N`` wrapper is removed (``N`` must be Worker replicas x
    slotsPerWorker), Worker replicas and slotsPerWorker become nodes and ranks per node,
    the launcher's env the ranks' environment, ``runPolicy.activeDeadlineSeconds`` the
    walltime; resources must fit the slots' limits. Anything else it cannot honour is
    refused, naming the field.

    path
        A file on the master holding the MPIJob's YAML (Salt's command line cannot carry
        text of many lines).
    user
        Whose job it is, as for :func:`launch`.
    image
        The approved image to run it in; default: the approved image whose reference or
        digest the manifest's image names.
    mpijob
        The MPIJob itself instead of ``path``: a mapping (JSON on the command line).

    CLI Example:

    .. code-block:: bash

        salt-run mpi.submit_mpijob /srv/jobs/pi.yaml user=alice image=pi
    """
    queued = _answer(_submit_mpijob, path, mpijob, user, image)
    if "error" in queued:
        return dict(queued, state="rejected")
    return dict(queued, retcode=0)


def _submit_mpijob(path, mpijob, user, image):
    if (path is None) == (mpijob is None):
        raise RequestError("give the MPIJob as path= (a file on the master) or as mpijob=")
    if path is not None:
        try:
            with open(path, encoding="utf-8") as handle:
                mpijob = handle.read(mpi_operator.MAX_MANIFEST_BYTES + 1)
        except (OSError, UnicodeDecodeError) as exc:
            raise RequestError(f"cannot read the MPIJob {path}: {exc}") from None
    return user_calls.submit_mpijob(_site(), _admin(), mpijob=mpijob, user=user, image=image)


def launch(user=None, image=None, np=None, cmd=None, nodes=None, slots_per_node=None,
           walltime=None, env=None, workdir=None, name=None):
    """
    Run an MPI program across nodes in an approved image and wait for it to end.

    user
        Whose job it is (admins only: a hub user calling through the API is always
        themselves, and may not name anyone else). Only ``<storage>/users/<user>`` is
        mounted, at ``/data`` (also HOME); output goes to ``/data/mpi-jobs/<job id>/``.
    image
        Short name of an approved image (pillar ``mpi:images``).
    np
        Number of MPI ranks.
    cmd
        The program and its arguments, split like a shell would split words (no shell
        runs it), or a list.
    nodes
        Which nodes: a count (``nodes=2``: spread evenly over two nodes), a list or
        comma-separated node ids, or a Salt compound target (``'G@rack:a'``). Default:
        any MPI node, filling nodes in order.
    slots_per_node
        Ranks per node (at most the node's slots). Default: fill free slots.
    walltime
        Time limit with a unit: ``90s``, ``30m``, ``2h``, ``1d``, or Slurm's ``MM:SS``,
        ``HH:MM:SS``, ``D-HH:MM:SS``; a bare number is refused (seconds or minutes?).
        Default one hour; at most pillar ``mpi:limits:max_walltime``.
    env
        ``{NAME: value}`` exported to every rank.
    workdir
        Working directory of the ranks, relative to the user's directory (``.`` is the
        directory itself). Default: the job's own directory, ``mpi-jobs/<job id>``, which
        no other job shares (ranks see it as ``DMPI_JOB_DIR``).
    name
        A name for the job (like Slurm's ``--job-name``): letters, digits, ``.``, ``_``,
        ``+``, ``-``, at most 64; ranks see it as ``DMPI_JOB_NAME``.

    The job waits in the queue while its slots are taken. Ctrl-C or SIGTERM cancels it
    (like ``srun``); a ``salt-run`` killed otherwise leaves it running and tracked
    (``mpi.status``, ``mpi.wait``).

    Returns the job record: ``job_id``, ``state`` (succeeded, failed, timed_out,
    cancelled, rejected), ``exit_code``, ``failure`` (``rank`` with ``exit_code`` or
    ``signal``), ``reason``, ``placement`` (node: ranks), ``timings`` (seconds: queued,
    containers_up, sshd_ready, mpirun, cleanup, total), ``history`` (each state with its
    time and reason), ``output`` (where stdout, stderr and status.json are), ``retcode``
    (0 only when the job succeeded; ``salt-run`` exits with it).

    CLI Example:

    .. code-block:: bash

        salt-run mpi.launch user=alice image=mpi np=6 \
            cmd='python3 -m mpi4py.bench helloworld' --out=json
    """
    submitted = submit(user=user, image=image, np=np, cmd=cmd, nodes=nodes,
                       slots_per_node=slots_per_node, walltime=walltime, env=env,
                       workdir=workdir, name=name)
    if submitted["state"] == "rejected":
        return submitted
    job_id = submitted["job_id"]
    previous = _trap_sigterm()
    try:
        return wait(job_id)
    except (_Interrupted, KeyboardInterrupt) as exc:
        why = "salt-run was terminated" if isinstance(exc, _Interrupted) else "salt-run was interrupted"
        cancel(job_id, reason=why)
        return wait(job_id, timeout=30)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _trap_sigterm():
    """Turn SIGTERM into an exception so the job can be cancelled; returns the old handler."""

    def handler(signum, frame):
        raise _Interrupted()

    try:
        return signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not in the main thread
        return None


def wait(job_id, timeout=None):
    """
    Wait until a job has ended and return its record, as soon as its final state is
    known (``closed`` becomes true a moment later, once its containers are gone and
    status.json is written).

    timeout
        Seconds to wait at most; then the current record is returned (retcode 1).

    CLI Example:

    .. code-block:: bash

        salt-run mpi.wait 20261130-132321-b26398 timeout=600
    """
    view = _answer(user_calls.wait, _site(), _admin(), job_id, timeout=timeout)
    __context__["retcode"] = view["retcode"]
    return view


def status(job_id):
    """
    Return a job's record, with the history of its states.

    CLI Example:

    .. code-block:: bash

        salt-run mpi.status 20261130-132321-b26398
    """
    return _answer(user_calls.status, _site(), _admin(), job_id)


def list_(user=None, state=None, limit=None, after=None):
    """
    List jobs, oldest first: id, name, user, state, np, placement, times and reason
    (a hub user sees only their own).

    user
        Only this user's jobs.
    state
        Only jobs in this state (or a comma-separated list of states).
    limit, after
        A page: at most ``limit`` jobs, those submitted after the job ``after``.

    CLI Example:

    .. code-block:: bash

        salt-run mpi.list user=alice state=queued,running
        salt-run mpi.list state=succeeded limit=100 after=20261130-132321-b26398
    """
    return _answer(user_calls.list_jobs, _site(), _admin(), user=user, state=state,
                   limit=limit, after=after)


def cancel(job_id, reason="cancelled by request"):
    """
    Cancel a job: a queued job leaves the queue; a running one is stopped and every
    container and key of it removed.

    CLI Example:

    .. code-block:: bash

        salt-run mpi.cancel 20261130-132321-b26398
    """
    return _answer(user_calls.cancel, _site(), _admin(), job_id, reason=reason)


def logs(job_id, stream="stdout", tail=65536, offset=None):
    """
    Return the end of a job's standard output or error (read on one of the nodes).

    stream
        ``stdout`` or ``stderr``.
    tail
        How many bytes from the end, at most.
    offset
        Follow a running job instead: return ``{"data": text, "offset": n}``, at most
        ``tail`` bytes from byte ``offset`` on; call again with ``n``.

    CLI Example:

    .. code-block:: bash

        salt-run mpi.logs 20261130-132321-b26398 stream=stderr
    """
    return _answer(user_calls.logs, _site(), _admin(), job_id, stream=stream, tail=tail,
                   offset=offset)


def history(user=None, since=None, until=None, state=None, format=None,  # pylint: disable=redefined-builtin
            limit=None, after=None):
    """
    Ended jobs, oldest first, with what they used (like Slurm's ``sacct``): id, name,
    user, state, exit code, reason, ranks, nodes, submitted/started/ended, queue wait,
    elapsed seconds and core-hours (ranks x elapsed). A hub user sees only their own.

    user
        Only this user's jobs (admins).
    since, until
        Only jobs that ended in this window: ISO dates or times (UTC unless given),
        e.g. ``2026-12-01`` or ``2026-12-01T14:30``, or epoch seconds.
    state
        Only these final states (comma-separated), e.g. ``failed,timed_out``.
    format
        ``json`` (the default): a list of rows (print it with ``--out=json``);
        ``csv``: one text, a header line then one line per job, for a spreadsheet
        (``--out=txt`` prints it as it is).
    limit, after
        A page: at most ``limit`` jobs, those submitted after the job ``after``
        (jobs are in submission order).

    CLI Example:

    .. code-block:: bash

        salt-run mpi.history user=alice since=2026-12-01 --out=json
        salt-run mpi.history since=2026-12-01 format=csv --out=txt > jobs.csv
        salt-run mpi.history user=alice limit=500 after=20261130-132321-b26398
    """
    return _answer(user_calls.history, _site(), _admin(), user=user, since=since, until=until,
                   state=state, format=format, limit=limit, after=after)


def usage(user=None, since=None, until=None):
    """
    Usage per user and in total, like Slurm's ``sreport``: jobs by final state, core-hours
    (ranks x elapsed), elapsed seconds, queue wait mean and max (of jobs that started),
    over the jobs that ended in the window; without ``until``, jobs queued or running
    now are counted too (``queued``, ``running``), using nothing yet, and
    ``fair_share`` gives each user's fair-share standing now, like Slurm's ``sshare``:
    ``decayed_core_hours`` (usage halved every ``mpi:fair_share:half_life``, running
    jobs so far included) and ``fairshare``, the factor of their jobs' priority; where
    the storage enforces quotas (``mpi:storage:type`` glusterfs), ``storage`` gives each
    user directory's ``bytes_used``, ``bytes_limit``, ``files_used`` and ``files_limit``
    (0: no limit), like ``quota -s``. Admins see every user; a hub user (through the
    API) sees only themselves.

    user
        Only this user.
    since, until
        The window on the jobs' end: ISO dates or times (UTC unless given) or epoch
        seconds.

    CLI Example:

    .. code-block:: bash

        salt-run mpi.usage since=2026-12-01 until=2027-01-01
        salt-run mpi.usage user=alice
    """
    return _answer(user_calls.usage, _site(), _admin(), user=user, since=since, until=until)


def whoami():
    """
    Who is calling, as DockerMPI sees it: ``{"admin": true, "caller": name}`` from
    ``salt-run``. (Through the user API a hub user gets their DockerMPI user name, uid
    and directory, made on first use; JupyterHub's spawner asks it before it starts the
    user's notebook as that uid.)

    CLI Example:

    .. code-block:: bash

        salt-run mpi.whoami
    """
    return _answer(user_calls.whoami, _site(), _admin())


def images():
    """
    The approved images jobs may run in (pillar ``mpi:images``), by short name, with
    the reference each is pinned to.

    CLI Example:

    .. code-block:: bash

        salt-run mpi.images
    """
    return _answer(user_calls.images, _site(), _admin())


# ------------------------------------------------------------------------- admin


def nodes():
    """
    Show every MPI node: slots, used slots, running jobs, whether it reports, its engine,
    its health (Docker engine, shared storage, approved images present), whether an admin
    drained it (why, since when, by whom), whether it may take new jobs and, if not, why;
    for a silent node running jobs, whether its host still answers the job controller's probe.

    CLI Example:

    .. code-block:: bash

        salt-run mpi.nodes
    """
    return _answer(admin_calls.nodes, _site())


def selftest(nodes=None, size=None, lat_iters=None, bw_iters=None):
    """
    Test the network between every pair of MPI nodes, and within each node: a
    ping-pong through job namespaces (a real job of the self-test's user on the image
    ``mpi:selftest:image``: MPI and TCP between its two ranks) beside a TCP ping-pong
    between the nodes' hosts, one pair at a time. Flags a pair whose job failed, whose
    job TCP bandwidth is below ``mpi:selftest:min_bandwidth_mb_per_s`` or far below the
    median of its kind (``mpi:selftest:far_below`` times it), or below
    ``mpi:selftest:min_ratio`` times the hosts'. The last result shows in ``mpi.nodes``.
    Other jobs keep running meanwhile; the self-test's jobs queue like any job, so run it
    on an idle cluster for figures that mean something.

    nodes
        Which nodes (a list or comma-separated ids); default every MPI node reporting.
    size
        Bandwidth message bytes (default ``mpi:selftest:size``, 4 MiB).
    lat_iters, bw_iters
        Round trips of 1 byte and of ``size`` bytes (defaults 2000 and 20).

    Returns ``passed``, ``matrix`` (a line per pair: job MPI and TCP latency in us and
    bandwidth in MB/s, host TCP, their bandwidth ratio, the result) and ``pairs`` with
    every figure; ``salt-run`` exits with 1 when a pair is flagged.

    CLI Example:

    .. code-block:: bash

        salt-run mpi.selftest
        salt-run mpi.selftest nodes=node1,node2 size=1048576
    """
    report = _answer(network_selftest.run, _site(), _admin(), nodes=nodes, size=size,
                     lat_iters=lat_iters, bw_iters=bw_iters)
    if "error" in report:
        return report
    # salt-run takes its exit code from the answer's retcode; __context__ marks the job
    retcode = 0 if report["passed"] else 1
    __context__["retcode"] = retcode
    return dict(report, matrix=network_selftest.matrix(report).splitlines(), retcode=retcode)


def drain(node, reason=None):
    """
    Drain a node for maintenance: jobs running there finish, no new job starts there
    (queued jobs that can only run there wait, saying so). Kept across master restarts
    until :func:`resume`. Admins only.

    node
        The node's minion id.
    reason
        Why (shown by ``mpi.nodes`` and in queued jobs' ``waiting_for``); required.

    CLI Example:

    .. code-block:: bash

        salt-run mpi.drain node2 reason='disk swap, ticket 4711'
    """
    return _answer(admin_calls.drain, _site(), node, reason, by=_admin().name)


def resume(node):
    """
    Undo :func:`drain`: the node takes new jobs again (when it is healthy). Admins only.

    node
        The node's minion id.

    CLI Example:

    .. code-block:: bash

        salt-run mpi.resume node2
    """
    return _answer(admin_calls.resume, _site(), node)


def prune(job_records_days=None, job_dirs_days=None):
    """
    Apply the retention settings (pillar ``mpi:retention``): remove the master's
    records of jobs that ended more than ``job_records_days`` ago (never a queued or
    running job), and, when ``job_dirs_days`` is set, the users' job directories
    (``<storage>/users/<user>/mpi-jobs/<job id>``) of jobs submitted more than that many
    days ago and untouched since, by a node, as each user's own uid, never following a
    link; a job still queued or running keeps its directory. 0 means keep forever. The
    master runs this every hour (``schedule`` in its configuration).

    job_records_days, job_dirs_days
        Override the pillar's for this run.

    CLI Example:

    .. code-block:: bash

        salt-run mpi.prune
        salt-run mpi.prune job_records_days=30
    """
    return _answer(admin_calls.prune, _site(), job_records_days=job_records_days,
                   job_dirs_days=job_dirs_days)


def settings():
    """
    Read the site's settings again, as the nodes see them (the pillar the master renders
    for the first MPI node, over the defaults, checked), and hand them to the job controller,
    which plans the queue with them from its next pass. The controller reads them itself
    every minute and each submit reads them, so a pillar change reaches an idle queue
    without a submit; this is the way to have it at once. Returns the settings, or fails
    naming every problem of a bad pillar (the job controller then keeps the settings it has).

    CLI Example:

    .. code-block:: bash

        salt-run mpi.settings
    """
    return _answer(admin_calls.settings, _site())


def backup(path=None):
    """
    Copy the master's job store (records, users and their uids) to a new file with
    SQLite's online backup API, consistent while jobs run. The file is mode 0600 (it
    names users and their jobs); an existing file is never overwritten.

    path
        Absolute path of the new file on the master. Default:
        ``<cachedir>/dockermpi/backups/jobs-<UTC time>.sqlite``.

    CLI Example:

    .. code-block:: bash

        salt-run mpi.backup
        salt-run mpi.backup /var/backups/dockermpi-jobs.sqlite
    """
    return _answer(admin_calls.backup, _site(), path)


def restore(path):
    """
    Replace the master's job records with those of a backup (``mpi.backup``), e.g. on a
    rebuilt master. Refused while any job is queued or running (cancel them or wait);
    a backup of an older schema is migrated (in a copy), a newer one refused. Users are
    merged, never lost, and no uid is ever handed out twice; node reports stay live;
    jobs the backup caught queued or running are recorded as failed (outcome unknown).

    path
        The backup file on the master.

    CLI Example:

    .. code-block:: bash

        salt-run mpi.restore /var/backups/dockermpi-jobs.sqlite
    """
    return _answer(admin_calls.restore, _site(), path)


def add_user(user):
    """
    Give a user their own uid (from ``mpi:users``, allocated once and never reused) and
    their directory ``<storage>/users/<user>`` owned by it, mode 0700. Submitting a
    first job does the same; this is for admins who want the directory before that.

    CLI Example:

    .. code-block:: bash

        salt-run mpi.add_user alice
    """
    return _answer(admin_calls.add_user, _site(), user)


def users():
    """
    List every user the master has given a uid: ``{name: {uid, created, dir_ready}}``.

    CLI Example:

    .. code-block:: bash

        salt-run mpi.users
    """
    return _answer(admin_calls.users, _site())


def migrate_users(from_uid=None):
    """
    Move a shared tree from the seed's single guest uid to one uid per user: every
    directory in ``<storage>/users`` owned by ``from_uid`` (default: pillar
    ``mpi:guest:uid``) gets its user's own uid (allocated now if needed), and every entry
    inside it that the guest owned changes owner too (symlinks are never followed).
    Safe to run again.

    CLI Example:

    .. code-block:: bash

        salt-run mpi.migrate_users
    """
    return _answer(admin_calls.migrate_users, _site(), from_uid=from_uid)
