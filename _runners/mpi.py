"""
Run users' MPI programs across DockerMPI nodes, from the Salt master: the commands users
and admins call (submit, launch, wait, status, list, cancel, logs, nodes, users,
history, usage, prune, backup, restore).

``salt-run mpi.submit`` validates a job and queues it; the queue starts jobs first come,
first served, all or nothing across nodes, backfilling smaller jobs only where that
cannot delay the head of the queue, within per-user limits. ``mpi.launch`` is submit and
wait. A job does not depend on the ``salt-run`` that submitted it.

Jobs' lives belong to the job controller, a long-lived process on the master (the
``mpi_master`` engine, ``mpi_engine`` utils), which takes the nodes' evidence from the
``mpi_node`` engine on each node. This runner only writes requests to the job store and
announces them on the event bus (``mpi/job/<id>/queued``, ``mpi/job/<id>/cancel``); the
engine fires every transition as ``mpi/job/<id>/<state>``.

Records live in a SQLite store in the master's cache directory and survive restarts;
after a restart, running jobs are kept when their nodes report them alive and failed
when not.

:depends: the ``mpi_master`` engine on the master; the ``mpi_job`` execution module and
    ``mpi_node`` engine on the nodes; the ``dmpi.jobs`` package; the ``mpi_engine`` and
    ``mpi_caller`` utils modules
"""

import copy
import datetime
import logging
import os
import posixpath
import re
import secrets
import signal
import threading
import time

import salt.cache
import salt.client
import salt.fileclient
import salt.pillar
import salt.utils.event
import salt.utils.json
import salt.utils.minions
import salt.utils.yaml
import dmpi.seal
import dmpi.settings
from dmpi.master import controller
from dmpi.contract import (ACTIVE, DATA_MOUNT, DRAINS_TAG, FINAL, JOB_ID_RE,
                           JOB_TAG_PREFIX, NODE_ROLE, job_tag)
from dmpi.errors import ConfigError, RequestError, StoreError
from dmpi.jobs import accounting, rules, sched
from dmpi.jobs import record as job_record
from dmpi.jobs import request as job_request
from dmpi.jobs import store as job_store
from salt.exceptions import CommandExecutionError, SaltInvocationError

log = logging.getLogger(__name__)

__virtualname__ = "mpi"
__func_alias__ = {"list_": "list"}

NODE_TARGET = f"G@roles:{NODE_ROLE}"
ENGINE_SILENCE = 30  # seconds without a sign of the job controller before submit refuses
CANCEL_WAIT = 15  # seconds cancel waits for the engine to end the job
_JOB_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}\Z")
DEFAULTS_FILE = "dockermpi/defaults.yaml"
# Seconds a rendering of the settings is used again while none of its sources changed:
# a bound on what no file here shows (a pillar that reads something else as it renders).
SETTINGS_REUSE = 60
_SETTINGS = {}  # minion -> (sources, when rendered, settings)
_THREAD = threading.local()  # each thread's LocalClient


def __virtual__():
    return __virtualname__


class _Interrupted(Exception):
    """salt-run received SIGTERM."""


# --------------------------------------------------------------------------- input


def _validate_request(user, image, np, cmd, nodes, slots_per_node, walltime, env, workdir,
                      limits):
    """Every check that needs no cluster state (``dmpi.jobs.request``); SaltInvocationError."""
    try:
        return job_request.validate_request(
            user, image, np, cmd, nodes, slots_per_node, walltime, env, workdir, limits
        )
    except RequestError as exc:
        raise SaltInvocationError(str(exc)) from None


# ------------------------------------------------------------------------ callers


def _hub_identity():
    """The JupyterHub user calling through DockerMPI's API (the ``mpi_api`` engine marks
    the thread it calls in: ``mpi_caller``), or None for an admin: root on the master
    (``salt-run``) or the job controller."""
    return __utils__["mpi_caller.hub_user"]()


def _acting_user(user):
    """(whose job it is, hub identity or None): an admin names the user; a hub user is
    themselves, whatever ``user`` says."""
    identity = _hub_identity()
    if identity is None:
        return user, None
    try:
        own = dmpi.settings.user_for_identity(identity)
    except ValueError as exc:
        raise SaltInvocationError(str(exc)) from None
    if user is not None and user not in (identity, own):
        raise SaltInvocationError(
            "user cannot be chosen: a hub user's jobs always run as themselves")
    return own, identity


def _require_admin(what):
    if _hub_identity() is not None:
        raise SaltInvocationError(f"{what} is for DockerMPI admins only")


# ------------------------------------------------------------------- cluster access


def _client():
    """This thread's LocalClient, made once: making one costs more than most calls made
    with it (the user API follows jobs' output with a call a second per stream)."""
    client = getattr(_THREAD, "client", None)
    if client is None:
        client = _THREAD.client = salt.client.get_local_client(mopts=__opts__)
    return client


def _call(client, minions, fun, timeout, **kwargs):
    """Run fun on minions in parallel; returns {minion: ret}; raises if any failed."""
    returns = client.cmd(
        list(minions), fun, kwarg=kwargs, tgt_type="list", timeout=timeout, full_return=True
    )
    results, errors = controller.minion_returns(returns, minions)
    if errors:
        raise CommandExecutionError(
            controller.failed_calls_message(fun, errors),
            info={"results": results, "errors": errors},
        )
    return results


def _defaults():
    client = salt.fileclient.FSClient(__opts__)
    try:
        path = client.cache_file(f"salt://{DEFAULTS_FILE}")
    finally:
        client.destroy()
    if not path:
        raise CommandExecutionError(f"salt://{DEFAULTS_FILE} is not on the master's file server")
    with open(path) as handle:
        return salt.utils.yaml.safe_load(handle)["mpi"]


def _node_grains(minion):
    """The node's grains as the master last received them (None when it holds none)."""
    return salt.cache.factory(__opts__).fetch("grains", minion) or None


def _node_pillar(minion, grains):
    """The pillar the master renders for a node now: its pillar tree over the node's
    ``grains``. Never the pillar the master cached for the node, nor written there: a
    dry run with ``pillar=...`` (``state.apply test=True pillar=...``) leaves its override
    there until the next refresh. Rendered by ``pillar.show_pillar`` when the master
    holds no grains of the node."""
    if not grains:
        return __salt__["pillar.show_pillar"](minion) or {}
    saltenv = __opts__.get("pillarenv") or __opts__.get("saltenv") or "base"
    # salt.pillar.Pillar itself, not get_pillar's PillarCache: reading the settings (every
    # minute by the job controller) must not write the master's cache of the node's pillar.
    pillar = salt.pillar.Pillar(__opts__, grains, minion, saltenv,
                                pillarenv=__opts__.get("pillarenv"))
    rendered = pillar.compile_pillar()
    if rendered.get("_errors"):
        raise CommandExecutionError(
            f"the pillar of {minion} does not render, so no job can be accepted: "
            + "; ".join(str(e) for e in rendered["_errors"]))
    return rendered


def _file_stats(paths):
    """(path, inode, size, mtime, ctime) of each of ``paths`` that is a file and of every
    file under those that are directories, in order: any write, replacement or removal
    changes them (ctime whatever a writer sets mtime to); a path that is missing is
    (path, None)."""
    stats = []

    def add(path):
        try:
            found = os.stat(path)
        except OSError:
            stats.append((path, None))
            return
        stats.append((path, found.st_ino, found.st_size, found.st_mtime_ns,
                      found.st_ctime_ns))

    for top in paths:
        if not os.path.isdir(top):
            add(top)
            continue
        for directory, dirs, files in os.walk(top):
            dirs.sort()
            for name in sorted(files):
                add(os.path.join(directory, name))
    return stats


def _settings_sources(grains):
    """What the settings are rendered from, to tell when a rendering is still good: every
    file under the pillar roots, the formula's defaults file in the file roots, the
    node's grains. None when the master has sources of pillar or files that files here
    cannot speak for (ext_pillar, a file server backend other than roots): then the
    settings are rendered every time."""
    if __opts__.get("ext_pillar") or list(__opts__.get("fileserver_backend") or ["roots"]) \
            != ["roots"]:
        return None
    saltenv = __opts__.get("saltenv") or "base"
    file_roots = (__opts__.get("file_roots") or {}).get(saltenv) or []
    defaults = [os.path.join(root, DEFAULTS_FILE) for root in file_roots]
    pillar_roots = [root for roots in (__opts__.get("pillar_roots") or {}).values()
                    for root in roots]
    return salt.utils.json.dumps([_file_stats(pillar_roots), _file_stats(defaults), grains],
                                 sort_keys=True, default=str)


def _site_config(minion, fresh=False):
    """The ``mpi`` settings as the nodes see them: their pillar merged over the defaults
    and checked (:mod:`dmpi.settings`); CommandExecutionError naming every problem of a bad
    pillar. A rendering is used again while nothing it was rendered from changed, for at
    most SETTINGS_REUSE seconds (rendering a node's pillar costs the caller's process a
    tenth of a second of CPU, and every submit, whoami and images call needs the
    settings); ``fresh`` renders them whatever."""
    grains = _node_grains(minion)
    sources = _settings_sources(grains)
    kept = _SETTINGS.get(minion)
    if not fresh and sources is not None and kept and kept[0] == sources \
            and time.monotonic() - kept[1] < SETTINGS_REUSE:
        return copy.deepcopy(kept[2])
    pillar = _node_pillar(minion, grains)
    try:
        config = dmpi.settings.validate(
            dmpi.settings.merge(_defaults(), pillar.get("mpi")))
    except ConfigError as exc:
        raise CommandExecutionError(
            f"the site's mpi pillar is invalid, so no job can be accepted:\n{exc}") from None
    if sources is not None:
        _SETTINGS[minion] = (sources, time.monotonic(), copy.deepcopy(config))
    return config


def _public(record, store=None):
    waiting = store.get_meta("waiting", {}) if store and record["state"] == "queued" else None
    return job_record.public(record, waiting)


def _alive(store, now):
    return rules.alive(store.nodes(), now)


def _check_engine(store):
    """Submitting needs the job controller running on the master."""
    seen = (store.get_meta("engine") or {}).get("pid_alive", 0)
    if time.time() - seen > ENGINE_SILENCE:
        raise CommandExecutionError(
            "the DockerMPI job controller is not running on the master (master config: "
            "engines: [mpi_master: {}], then restart salt-master); nothing was queued")


def _store():
    return job_store.open_store(
        os.path.join(__opts__["cachedir"], "dockermpi", "jobs.sqlite")
    )


def _fire(job_id, state, data=None):
    with salt.utils.event.get_master_event(__opts__, __opts__["sock_dir"], listen=False) as bus:
        bus.fire_event(dict(data or {}, job_id=job_id, state=state), job_tag(job_id, state))


def _rejected(exc):
    """What a job that never started returns; salt-run exits with ``retcode``."""
    __context__["retcode"] = 1
    return {"state": "rejected", "error": str(exc), "retcode": 1}


def _failed_call(message):
    __context__["retcode"] = 1
    return {"error": message, "retcode": 1}


def _mpi_nodes():
    """Every minion that is an MPI node, known from the master's cache (no network)."""
    found = salt.utils.minions.CkMinions(__opts__).check_minions(NODE_TARGET, "compound")
    return sorted(found["minions"])


def _candidates(nodes, all_nodes):
    """(candidate node ids, exact node count or None) for a parsed ``nodes`` argument:
    a count, a node list or one grain match; never pillar or another target type."""
    if nodes is None:
        return all_nodes, None
    if "count" in nodes:
        if nodes["count"] > len(all_nodes):
            raise SaltInvocationError(
                f"nodes={nodes['count']} but only {len(all_nodes)} MPI nodes exist"
            )
        return all_nodes, nodes["count"]
    if "grain" in nodes:
        found = salt.utils.minions.CkMinions(__opts__).check_minions(
            f"{NODE_TARGET} and G@{nodes['grain']}", "compound"
        )["minions"]
        if not found:
            raise SaltInvocationError(f"no MPI node has the grain G@{nodes['grain']}")
        return sorted(found), None
    unknown = sorted(set(nodes["list"]) - set(all_nodes))
    if unknown:
        raise SaltInvocationError(f"nodes not known as MPI nodes (not reachable?): {unknown}")
    return list(nodes["list"]), None


def _storage_owner(config):
    """(minion, storage path there) of the host that is root on the shared storage: the
    NFS server for NFS (its export), any reporting node for a cluster file system."""
    storage = config["storage"]
    if storage["type"] == "nfs":
        found = salt.utils.minions.CkMinions(__opts__).check_minions(
            "G@roles:mpi-nfs-server", "compound")["minions"]
        if not found:
            raise CommandExecutionError("no minion has the role mpi-nfs-server")
        return sorted(found)[0], storage["nfs"]["export"]
    alive = sorted(_alive(_store(), time.time()))
    if not alive:
        raise CommandExecutionError("no MPI node is reporting; cannot reach shared storage")
    return alive[0], storage["path"]


def _user_uid(store, config, user, check_dir=False, identity=None):
    """The user's own uid (allocated on first use from ``mpi:users``, bound to the hub
    ``identity`` when one calls), with their directory owned by it (made once, or
    checked again with ``check_dir``: a job that finds it gone resets that);
    CommandExecutionError when that cannot be had."""
    users = config["users"]
    try:
        uid, _ = store.user_uid(user, int(users["uid_min"]), int(users["uid_max"]),
                                identity=identity)
    except StoreError as exc:  # uid range used up, name taken
        raise CommandExecutionError(str(exc)) from None
    if check_dir or not store.users().get(user, {}).get("dir_ready"):
        minion, path = _storage_owner(config)
        _call(_client(), [minion], "mpi_job.ensure_user_dir", timeout=15, storage_path=path,
              user=user, uid=uid, gid=uid)
        store.set_user_dir_ready(user)
    return uid


def _job_name(name):
    if name is None:
        return None
    if not isinstance(name, str) or not _JOB_NAME_RE.match(name):
        raise SaltInvocationError(
            f"name {str(name)[:60]!r} is not a job name: letters, digits, '.', '_', '+' "
            "and '-', starting with a letter or digit, at most 64 characters")
    return name


def _refresh_site(store, minion, fresh=False):
    """The site settings as the nodes see them now, handed to the job controller (in the
    store) when they are not what it has."""
    config = _site_config(minion, fresh)
    if fresh or (store.get_meta("site") or {}).get("config") != config:
        store.set_meta("site", {"config": config, "read": time.time()})
    return config


def _fresh_site(store, fresh=False):
    """The site settings read now, as the nodes see them."""
    all_nodes = _mpi_nodes()
    if not all_nodes:
        raise SaltInvocationError("there are no MPI nodes (grain roles:mpi-node)")
    return _refresh_site(store, all_nodes[0], fresh)


# -------------------------------------------------------------------- public: jobs


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
    try:
        user, identity = _acting_user(user)
        job_name = _job_name(name)
        all_nodes = _mpi_nodes()
        if not all_nodes:
            raise SaltInvocationError("there are no MPI nodes (grain roles:mpi-node)")
        store = _store()
        _check_engine(store)
        config = _refresh_site(store, all_nodes[0])
        limits = config["limits"]
        request = _validate_request(user, image, np, cmd, nodes, slots_per_node, walltime,
                                    env, workdir, limits)
        images = config.get("images") or {}
        if request["image"] not in images:
            raise SaltInvocationError(
                f"image {request['image']!r} is not approved; approved images: {sorted(images)}"
            )
        candidates, count = _candidates(request["nodes"], all_nodes)
        node_slots = int(config["slots_per_node"])
        try:
            sched.place(request["np"], {n: node_slots for n in candidates},
                        count, request["slots_per_node"], node_slots)
        except ValueError as exc:
            raise SaltInvocationError(
                f"this job can never run: {exc} (each node has {node_slots} slots)"
            ) from None
        queued_limit = int(limits["max_queued_jobs_per_user"])
        if queued_limit and len(store.jobs(["queued"], user=request["user"])) >= queued_limit:
            raise SaltInvocationError(
                f"user {request['user']} already has {queued_limit} jobs queued, the site's "
                "limit (mpi:limits:max_queued_jobs_per_user); wait for some to start"
            )
        uid = _user_uid(store, config, request["user"], identity=identity)
    except (SaltInvocationError, CommandExecutionError) as exc:
        return _rejected(exc)
    job_id = time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)
    record = job_record.new(
        job_id, request, name=job_name, uid=uid, image_ref=images[request["image"]],
        # None: any MPI node, as the queue finds them (not a copy of today's list).
        candidates=None if request["nodes"] is None or "count" in request["nodes"]
        else candidates,
        count=count, workdir=workdir, config=config, now=time.time())
    store.add(record)
    _fire(job_id, "queued", {"user": request["user"]})
    return dict(_public(record), retcode=0)  # queued is what submit promises


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

        salt-run mpi.launch user=alice image=mpi np=6 \\
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
    except ValueError:  # not in the main thread (e.g. called through the API)
        return None


def _known_job(store, job_id):
    """The record of an existing job the caller may see (a hub user sees only their
    own); SaltInvocationError for a bad id or any other job, alike."""
    if not isinstance(job_id, str) or not JOB_ID_RE.match(job_id):
        raise SaltInvocationError(f"{str(job_id)[:40]!r} is not a job id (YYYYMMDD-HHMMSS-xxxxxx)")
    record = store.get(job_id)
    if record is not None and _hub_identity() is not None:
        own, _ = _acting_user(None)
        if record["user"] != own:
            record = None
    if record is None:
        raise SaltInvocationError(f"no such job: {job_id}")
    return record


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
    store = _store()
    try:
        _known_job(store, job_id)
    except SaltInvocationError as exc:
        return _failed_call(str(exc))
    deadline = None if timeout is None else time.monotonic() + float(timeout)
    with salt.utils.event.get_master_event(__opts__, __opts__["sock_dir"], listen=True) as bus:
        bus.subscribe(f"{JOB_TAG_PREFIX}{job_id}/")
        while True:
            record = store.get(job_id)
            # The result is known once the state is final; the clean-up (containers,
            # status.json) follows and is not waited for (``closed`` says it is done).
            if record["state"] in FINAL or (deadline and time.monotonic() > deadline):
                view = _public(record, store)
                __context__["retcode"] = view["retcode"]
                return view
            # Events make this prompt; reading the store each second makes it certain.
            bus.get_event(wait=1, tag=f"{JOB_TAG_PREFIX}{job_id}/", match_type="startswith")


def status(job_id):
    """
    Return a job's record, with the history of its states.

    CLI Example:

    .. code-block:: bash

        salt-run mpi.status 20261130-132321-b26398
    """
    try:
        store = _store()
        return _public(_known_job(store, job_id), store)
    except SaltInvocationError as exc:
        return _failed_call(str(exc))


def _states(state):
    """The job states a ``state`` argument names (None: all); SaltInvocationError."""
    if not state:
        return None
    states = [s.strip() for s in (state if isinstance(state, list) else str(state).split(","))]
    unknown = sorted(set(states) - set(("queued",) + ACTIVE + FINAL))
    if unknown:
        raise SaltInvocationError(f"unknown job states: {str(unknown)[:200]}")
    return states


def list_(user=None, state=None):
    """
    List jobs, oldest first: id, name, user, state, np, placement, times and reason
    (a hub user sees only their own).

    user
        Only this user's jobs.
    state
        Only jobs in this state (or a comma-separated list of states).

    CLI Example:

    .. code-block:: bash

        salt-run mpi.list user=alice state=queued,running
    """
    try:
        user, _ = _acting_user(user)
        states = _states(state)
    except SaltInvocationError as exc:
        return _failed_call(str(exc))
    keys = ("job_id", "name", "user", "state", "np", "placement", "submitted", "started",
            "ended", "reason")
    store = _store()
    found = store.jobs(states, user=user, keys=keys)
    # Why queued jobs wait, as the engine last planned: read only when one is listed.
    waiting = store.get_meta("waiting", {}) if any(
        r["state"] == "queued" for r in found) else {}
    return [dict(r, waiting_for=waiting.get(r["job_id"]) if r["state"] == "queued" else None)
            for r in found]


def cancel(job_id, reason="cancelled by request"):
    """
    Cancel a job: a queued job leaves the queue; a running one is stopped and every
    container and key of it removed.

    CLI Example:

    .. code-block:: bash

        salt-run mpi.cancel 20261130-132321-b26398
    """
    store = _store()
    try:
        record = _known_job(store, job_id)
    except SaltInvocationError as exc:
        return _failed_call(str(exc))
    if record["state"] in FINAL:
        return dict(_public(record), note=f"job had already ended ({record['state']})")
    store.update(job_id, cancel_requested=str(reason)[:200])
    _fire(job_id, "cancel")
    ended = wait(job_id, timeout=CANCEL_WAIT)
    if ended.get("state") not in FINAL:
        ended["note"] = "cancel requested; the job controller has not ended the job yet"
    return ended


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
    try:
        if stream not in ("stdout", "stderr"):
            raise SaltInvocationError("stream must be stdout or stderr")
        store = _store()
        record = _known_job(store, job_id)
        alive = _alive(store, time.time())
        readers = [n for n in record.get("placement") or {} if n in alive] or sorted(alive)
        if not readers:
            raise CommandExecutionError("no MPI node is reporting; cannot read shared storage")
        config = record["spec"]["config"]
        sealed = _call(_client(), readers[:1], "mpi_job.read_output", timeout=15,
                       job_id=job_id, storage_path=config["storage"]["path"],
                       user=record["user"], uid=record["uid"], gid=record["uid"],
                       stream=stream, tail_bytes=_tail_bytes(tail), offset=_offset(offset),
                       seal=True)[readers[0]]
        return _opened_output(sealed, readers[0])
    except (SaltInvocationError, CommandExecutionError) as exc:
        return _failed_call(str(exc))


def _opened_output(sealed, node):
    """What a node read of a job's output, sealed to the master's key (so the job cache
    and the event bus hold only ciphertext of users' output)."""
    try:
        return salt.utils.json.loads(dmpi.seal.unseal(
            os.path.join(__opts__["pki_dir"], "master.pem"), sealed))
    except (OSError, ValueError) as exc:
        raise CommandExecutionError(f"{node} answered with output the master cannot open: "
                                    f"{exc}") from exc


def _offset(offset):
    if offset is None:
        return None
    try:
        offset = int(offset)
    except (TypeError, ValueError, OverflowError):
        raise SaltInvocationError(f"offset must be a byte offset, got {str(offset)[:40]!r}") from None
    if not 0 <= offset < 1 << 62:
        raise SaltInvocationError("offset must be a byte offset, 0 or more")
    return offset


def _tail_bytes(tail):
    try:
        tail = int(tail)
    except (TypeError, ValueError, OverflowError):
        raise SaltInvocationError(f"tail must be a number of bytes, got {str(tail)[:40]!r}") from None
    if not 1 <= tail <= 16 << 20:
        raise SaltInvocationError("tail must be between 1 byte and 16 MiB")
    return tail


def nodes():
    """
    Show every MPI node: slots, used slots, running jobs, whether it reports, its engine,
    its health (Docker engine, shared storage, approved images present), whether an admin
    drained it (why, since when, by whom), whether it may take new jobs and, if not, why;
    for a silent node running jobs, whether its host still answers the engine's probe.

    CLI Example:

    .. code-block:: bash

        salt-run mpi.nodes
    """
    try:
        _require_admin("mpi.nodes")
    except SaltInvocationError as exc:
        return _failed_call(str(exc))
    store = _store()
    now = time.time()
    seen = store.nodes()
    alive = rules.alive(seen, now)
    site = store.get_meta("site") or {}
    config = site.get("config") or {}
    slots = int(config.get("slots_per_node", 0))
    approved = {ref: name for name, ref in (config.get("images") or {}).items()}
    drains = store.drains()
    silent = store.get_meta("silent_nodes", {})
    jobs = store.jobs(ACTIVE)
    result = {}
    for node in sorted(set(_mpi_nodes()) | set(seen)):
        info = seen.get(node)
        mine = [j for j in jobs if node in (j.get("placement") or {})]
        health = (info or {}).get("report", {}).get("health")
        drain = drains.get(node)
        problem = rules.node_problem({"health": health}, drain) \
            if info and node in alive else "not reporting"
        result[node] = {
            "slots": slots,
            "used": sum(j["placement"][node] for j in mine),
            "jobs": [j["job_id"] for j in mine],
            "reachable": bool(info) and node in alive,
            "last_report_seconds_ago": round(now - info["last_seen"], 1) if info else None,
            "engine": info["report"].get("engine") if info else None,
            "health": None if not isinstance(health, dict) else {
                "docker": health.get("docker"), "storage": health.get("storage"),
                "job_ca": health.get("job_ca"),
                "images": sorted(approved[r] for r in health.get("images") or []
                                 if r in approved)},
            "drained": None if drain is None else dict(
                drain, since_utc=_utc(drain["since"])),
            "eligible": problem is None,
            "not_eligible_because": problem,
            "silent": silent.get(node),
        }
    return result


def _utc(moment):
    return datetime.datetime.fromtimestamp(moment, datetime.timezone.utc).strftime(
        "%Y-%m-%dT%H:%M:%SZ")


def _known_node(node):
    """A node id the master knows as an MPI node (grain roles:mpi-node) or has heard."""
    if not isinstance(node, str) or node not in set(_mpi_nodes()) | set(_store().nodes()):
        raise SaltInvocationError(f"{str(node)[:100]!r} is not an MPI node")
    return node


def _drains_changed():
    with salt.utils.event.get_master_event(__opts__, __opts__["sock_dir"], listen=False) as bus:
        bus.fire_event({}, DRAINS_TAG)


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
    try:
        _require_admin("mpi.drain")
        _known_node(node)
        if not isinstance(reason, str) or not reason.strip() or len(reason) > 200:
            raise SaltInvocationError(
                "reason is required: why the node is drained, in at most 200 characters")
        store = _store()
        drained = store.drain(node, reason.strip(), by=globals().get("__user__") or "root")
        _drains_changed()
    except (SaltInvocationError, CommandExecutionError, RuntimeError) as exc:
        return _failed_call(str(exc))
    running = [j["job_id"] for j in store.jobs(ACTIVE) if node in (j.get("placement") or {})]
    return {"node": node, "drained": dict(drained, since_utc=_utc(drained["since"])),
            "running_jobs": running}


def resume(node):
    """
    Undo :func:`drain`: the node takes new jobs again (when it is healthy). Admins only.

    node
        The node's minion id.

    CLI Example:

    .. code-block:: bash

        salt-run mpi.resume node2
    """
    try:
        _require_admin("mpi.resume")
        _known_node(node)
        lifted = _store().resume(node)
        _drains_changed()
    except (SaltInvocationError, CommandExecutionError, RuntimeError) as exc:
        return _failed_call(str(exc))
    return {"node": node, "drained": None, "was": lifted}


def _moment(value, what):
    """Epoch seconds from ``value``: a number, or an ISO date/time (UTC unless it says)."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    try:
        when = datetime.datetime.fromisoformat(str(value)[:40])
    except ValueError:
        raise SaltInvocationError(
            f"{what} must be a date like 2026-12-01 or 2026-12-01T14:30, got "
            f"{str(value)[:40]!r}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return when.timestamp()


def _ended_rows(user, since, until, state):
    """History rows (``dmpi.jobs.accounting``) of the caller's ended jobs in the window."""
    user, _ = _acting_user(user)
    start, end = _moment(since, "since"), _moment(until, "until")
    states = _states(state) or list(FINAL)
    if set(states) - set(FINAL):
        raise SaltInvocationError(f"history holds ended jobs only: {', '.join(FINAL)}")
    rows = [accounting.history_row(record)
            for record in _store().jobs(states, user=user)]
    return user, end, [row for row in rows
                       if accounting.in_window(row, start, end)]


def history(user=None, since=None, until=None, state=None, format=None):  # pylint: disable=redefined-builtin
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

    CLI Example:

    .. code-block:: bash

        salt-run mpi.history user=alice since=2026-12-01 --out=json
        salt-run mpi.history since=2026-12-01 format=csv --out=txt > jobs.csv
    """
    try:
        if format not in (None, "json", "csv"):
            raise SaltInvocationError("format must be json or csv")
        _, _, rows = _ended_rows(user, since, until, state)
    except SaltInvocationError as exc:
        return _failed_call(str(exc))
    return accounting.to_csv(rows) if format == "csv" else rows


def usage(user=None, since=None, until=None):
    """
    Usage per user and in total, like Slurm's ``sreport``: jobs by final state, core-hours
    (ranks x elapsed), elapsed seconds, queue wait mean and max (of jobs that started),
    over the jobs that ended in the window; without ``until``, jobs queued or running
    now are counted too (``queued``, ``running``), using nothing yet. Admins see every
    user; a hub user (through the API) sees only themselves.

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
    try:
        user, end, rows = _ended_rows(user, since, until, None)
    except SaltInvocationError as exc:
        return _failed_call(str(exc))
    active = _store().jobs(["queued"] + list(ACTIVE), user=user) if end is None else []
    return accounting.usage(rows, active)


# ------------------------------------------------------------------ public: admin


def _retention():
    """Pillar ``mpi:retention`` as the nodes see it, checked."""
    return _fresh_site(_store())["retention"]


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
    try:
        _require_admin("mpi.prune")
        retention = _retention() if None in (job_records_days, job_dirs_days) else {}
        records_days = _days(job_records_days, retention.get("job_records_days"),
                             "job_records_days")
        dirs_days = _days(job_dirs_days, retention.get("job_dirs_days"), "job_dirs_days")
        store = _store()
        now = time.time()
        pruned = store.prune(now - records_days * 86400) if records_days else []
        dirs = _prune_job_dirs(store, dirs_days, now) if dirs_days else {}
    except (SaltInvocationError, CommandExecutionError) as exc:
        return _failed_call(str(exc))
    if pruned:
        log.info("mpi.prune removed %d job records", len(pruned))
    return {"job_records_removed": len(pruned), "job_records_days": records_days,
            "job_dirs_removed": dirs, "job_dirs_days": dirs_days}


def _days(value, default, what):
    value = default if value is None else value
    try:
        days = float(value)
    except (TypeError, ValueError):
        raise SaltInvocationError(f"{what} must be a number of days, got {str(value)[:40]!r}"
                                  ) from None
    if not 0 <= days < 100000:
        raise SaltInvocationError(f"{what} must be 0 (keep forever) or more days")
    return days


def _prune_job_dirs(store, days, now):
    """``{user: [job ids removed]}``: old job directories, removed on the host that owns
    the shared storage as each user's uid."""
    config = (store.get_meta("site") or {}).get("config") or _fresh_site(store)
    minion, path = _storage_owner(config)
    keep = {}
    for record in store.jobs(["queued"] + list(ACTIVE)):
        keep.setdefault(record["user"], []).append(record["job_id"])
    removed = {}
    for user, info in sorted(store.users().items()):
        if not info["dir_ready"]:
            continue
        gone = _call(_client(), [minion], "mpi_job.prune_job_dirs", timeout=120,
                     storage_path=path, user=user, uid=info["uid"], gid=info["uid"],
                     older_than=now - days * 86400, keep=keep.get(user, []))[minion]
        if gone:
            removed[user] = gone
    return removed


def settings():
    """
    Read the site's settings again, as the nodes see them (the pillar the master renders
    for the first MPI node, over the defaults, checked), and hand them to the job controller,
    which plans the queue with them from its next pass. The engine reads them itself
    every minute and each submit reads them, so a pillar change reaches an idle queue
    without a submit; this is the way to have it at once. Returns the settings, or fails
    naming every problem of a bad pillar (the engine then keeps the settings it has).

    CLI Example:

    .. code-block:: bash

        salt-run mpi.settings
    """
    try:
        _require_admin("mpi.settings")
        return _without_secrets(_fresh_site(_store(), fresh=True))
    except (SaltInvocationError, CommandExecutionError) as exc:
        return _failed_call(str(exc))


def _without_secrets(config):
    """A copy of the settings to show: registry passwords replaced, so that no terminal
    or log of an admin's command holds them."""
    shown = copy.deepcopy(config)
    logins = (shown.get("docker") or {}).get("registry_credentials") or {}
    for login in logins.values():
        if isinstance(login, dict) and "password" in login:
            login["password"] = "(hidden)"
    return shown


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
    try:
        _require_admin("mpi.backup")
        if path is None:
            folder = os.path.join(__opts__["cachedir"], "dockermpi", "backups")
            os.makedirs(folder, mode=0o700, exist_ok=True)
            path = os.path.join(folder, time.strftime("jobs-%Y%m%d-%H%M%S.sqlite", time.gmtime()))
        if not isinstance(path, str) or not os.path.isabs(path):
            raise SaltInvocationError("path must be an absolute path on the master")
        try:
            schema = _store().backup(path)
        except FileExistsError:
            raise CommandExecutionError(f"{path} exists; a backup never overwrites") from None
        except (OSError, RuntimeError) as exc:
            raise CommandExecutionError(f"cannot back up the job store to {path}: {exc}") from None
    except (SaltInvocationError, CommandExecutionError) as exc:
        return _failed_call(str(exc))
    return {"path": path, "bytes": os.path.getsize(path), "schema": schema}


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
    try:
        _require_admin("mpi.restore")
        if not isinstance(path, str) or not os.path.isabs(path) or not os.path.isfile(path):
            raise SaltInvocationError("path must be the absolute path of a backup file on the master")
        try:
            return _store().restore(path)
        except StoreError as exc:
            raise CommandExecutionError(f"not restored: {exc}") from None
    except (SaltInvocationError, CommandExecutionError) as exc:
        return _failed_call(str(exc))


# ------------------------------------------------------------------- public: users


def whoami():
    """
    Who is calling, as DockerMPI sees it. For a hub user (through the API): their hub
    name, DockerMPI user name, uid and directory, made on first use; JupyterHub's
    spawner asks this before it starts the user's notebook as that uid. For an admin:
    ``{"admin": true, "caller": name}``.

    CLI Example:

    .. code-block:: bash

        salt-run mpi.whoami
    """
    try:
        user, identity = _acting_user(None)
        if identity is None:
            return {"admin": True, "caller": globals().get("__user__")}
        store = _store()
        config = _fresh_site(store)
        uid = _user_uid(store, config, user, identity=identity)
    except (SaltInvocationError, CommandExecutionError) as exc:
        return _failed_call(str(exc))
    return {"user": identity, "account": user, "uid": uid, "gid": uid,
            "dir": posixpath.join(config["storage"]["path"], "users", user),
            "dir_in_job": DATA_MOUNT}


def images():
    """
    The approved images jobs may run in (pillar ``mpi:images``), by short name, with
    the reference each is pinned to.

    CLI Example:

    .. code-block:: bash

        salt-run mpi.images
    """
    try:
        found = _fresh_site(_store()).get("images") or {}
    except (SaltInvocationError, CommandExecutionError) as exc:
        return _failed_call(str(exc))
    return {"images": [{"name": name, "reference": found[name]} for name in sorted(found)]}


def add_user(user):
    """
    Give a user their own uid (from ``mpi:users``, allocated once and never reused) and
    their directory ``<storage>/users/<user>`` owned by it, mode 0700. Submitting a
    first job does the same; this is for admins who want the directory before that.

    CLI Example:

    .. code-block:: bash

        salt-run mpi.add_user alice
    """
    try:
        _require_admin("mpi.add_user")
        if not job_request.valid_user(user):
            raise SaltInvocationError(
                "user is not a valid user name: letters, digits, '-' and '_' only, starting "
                "with a letter or digit, at most 64 characters")
        store = _store()
        config = _fresh_site(store)
        uid = _user_uid(store, config, user, check_dir=True)
    except (SaltInvocationError, CommandExecutionError) as exc:
        return _failed_call(str(exc))
    return {"user": user, "uid": uid, "gid": uid,
            "dir": posixpath.join(config["storage"]["path"], "users", user)}


def users():
    """
    List every user the master has given a uid: ``{name: {uid, created, dir_ready}}``.

    CLI Example:

    .. code-block:: bash

        salt-run mpi.users
    """
    try:
        _require_admin("mpi.users")
    except SaltInvocationError as exc:
        return _failed_call(str(exc))
    return _store().users()


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
    try:
        _require_admin("mpi.migrate_users")
        store = _store()
        config = _fresh_site(store)
        from_uid = int(config["guest"]["uid"] if from_uid is None else from_uid)
        minion, path = _storage_owner(config)
        client = _client()
        found = _call(client, [minion], "mpi_job.user_dirs", timeout=30,
                      storage_path=path)[minion]
        migrated = {}
        for name, info in sorted(found.items()):
            if info["uid"] != from_uid:
                continue
            uid, _ = store.user_uid(name, int(config["users"]["uid_min"]),
                                    int(config["users"]["uid_max"]))
            migrated[name] = _call(client, [minion], "mpi_job.migrate_user_dir", timeout=600,
                                   storage_path=path, user=name, from_uid=from_uid, uid=uid,
                                   gid=uid)[minion]
            migrated[name]["uid"] = uid
            store.set_user_dir_ready(name)
    except (SaltInvocationError, CommandExecutionError, RuntimeError, ValueError) as exc:
        return _failed_call(str(exc))
    return {"migrated": migrated,
            "left": sorted(n for n, i in found.items() if i["uid"] != from_uid)}
