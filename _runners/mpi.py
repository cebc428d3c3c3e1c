"""
Run users' MPI programs across DockerMPI nodes, from the Salt master.

``salt-run mpi.submit`` validates a job and queues it; the queue starts jobs first come,
first served, all or nothing across nodes, backfilling smaller jobs only where that
cannot delay the head of the queue, within per-user limits. ``mpi.launch`` is submit and
wait. A job does not depend on the ``salt-run`` that submitted it.

Salt's own machinery carries the job's life (no extra daemon):

- the node beacon ``mpi_jobs`` reports every second what each node runs, whether the
  launcher exited (and which rank failed), whether the engine answers and whether the
  node still reaches the job's other nodes; the reactor hands each report to
  :func:`node_report`;
- the master schedule calls :func:`tick` every two seconds: walltimes, nodes that
  stopped reporting, jobs stuck while starting, and the queue;
- every transition is fired as ``mpi/job/<id>/<state>``; ``mpi/job/<id>/queued`` makes
  the reactor call :func:`schedule`.

Records live in a SQLite store in the master's cache directory and survive restarts;
after a restart, running jobs are kept when their nodes report them alive and failed
when not.

:depends: the ``mpi_job`` execution module and ``mpi_jobs`` beacon on the nodes; the
    ``mpi_launch``, ``mpi_sched`` and ``mpi_store`` utils modules
"""

import contextvars
import ipaddress
import logging
import os
import posixpath
import re
import secrets
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import salt.client
import salt.fileclient
import salt.utils.dictupdate
import salt.utils.event
import salt.utils.minions
import salt.utils.yaml
from salt.exceptions import CommandExecutionError, SaltInvocationError

log = logging.getLogger(__name__)

__virtualname__ = "mpi"
__func_alias__ = {"list_": "list"}

NODE_TARGET = "G@roles:mpi-node"
ACTIVE = ("starting", "running")
FINAL = ("succeeded", "failed", "cancelled", "timed_out")
DATA_MOUNT = "/data"
JOBS_SUBDIR = "mpi-jobs"
NODE_TIMEOUT = 5  # seconds without a report before a node counts as lost
START_TIMEOUT = 90  # seconds a job may stay in "starting"
CLEANUP_TIMEOUT = 5  # seconds to wait for a node's clean-up before leaving it to its reports
RESTART_GRACE = 15  # seconds after a master restart before silent nodes count as lost
TICK_SECONDS = 2  # the master schedule's interval for tick (master config)
REPORT_SKEW = 1  # seconds a node's clock and report may lag behind the master
SITE_REFRESH = 60  # seconds between re-reads of the site settings by the tick
MIB = 1 << 20
SLOT_OVERHEAD_MIB = 64  # sshd and orted beside a node's ranks
SLOT_OVERHEAD_PIDS = 32
_ACCOUNT_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}\Z")
_JOB_ID_RE = re.compile(r"^[0-9]{8}-[0-9]{6}-[0-9a-f]{6}\Z")


def __virtual__():
    return __virtualname__


class _Interrupted(Exception):
    """salt-run received SIGTERM."""


# --------------------------------------------------------------------------- input


def _validate_request(user, image, np, cmd, nodes, slots_per_node, walltime, env, workdir,
                      limits):
    """Every check that needs no cluster state (``mpi_request``); SaltInvocationError."""
    try:
        return __utils__["mpi_request.validate_request"](
            user, image, np, cmd, nodes, slots_per_node, walltime, env, workdir, limits
        )
    except ValueError as exc:  # mpi_request.RequestError: a clear one-line reason
        raise SaltInvocationError(str(exc)) from None


# ------------------------------------------------------------------- cluster access


def _client():
    return salt.client.get_local_client(mopts=__opts__)


def _call(client, minions, fun, timeout, **kwargs):
    """Run fun on minions in parallel; returns {minion: ret}; raises if any failed."""
    returns = client.cmd(
        list(minions), fun, kwarg=kwargs, tgt_type="list", timeout=timeout, full_return=True
    )
    errors = {}
    results = {}
    for minion in minions:
        answer = returns.get(minion)
        if not isinstance(answer, dict) or "ret" not in answer:
            errors[minion] = "did not answer"
        elif answer.get("retcode", 0) != 0 or answer.get("success") is False:
            errors[minion] = str(answer["ret"])
        else:
            results[minion] = answer["ret"]
    if errors:
        raise CommandExecutionError(
            f"{fun} failed on " + "; ".join(f"{m}: {e}" for m, e in sorted(errors.items())),
            info={"results": results, "errors": errors},
        )
    return results


def _defaults():
    client = salt.fileclient.FSClient(__opts__)
    try:
        path = client.cache_file("salt://dockermpi/defaults.yaml")
    finally:
        client.destroy()
    if not path:
        raise CommandExecutionError("salt://dockermpi/defaults.yaml is not on the master's file server")
    with open(path) as handle:
        return salt.utils.yaml.safe_load(handle)["mpi"]


def _site_config(minion):
    """The ``mpi`` settings as the nodes see them: pillar merged over the defaults."""
    pillar = __salt__["pillar.show_pillar"](minion) or {}
    return salt.utils.dictupdate.merge(_defaults(), pillar.get("mpi", {}), merge_lists=False)


def _cluster_addresses(minions, network):
    """Each minion's address on the cluster network, from its cached grains."""
    net = ipaddress.ip_network(network)
    grains = __salt__["cache.grains"](tgt=list(minions), tgt_type="list")
    addresses = {}
    for minion in minions:
        found = [a for a in grains.get(minion, {}).get("ipv4", []) if ipaddress.ip_address(a) in net]
        if not found:
            raise CommandExecutionError(f"{minion} has no address in the cluster network {network}")
        addresses[minion] = found[0]
    return addresses


def _job_ports(config):
    """(sshd port, OOB range, BTL range) inside every job's own network namespace."""
    ports = config["ports"]
    return int(ports["sshd"][0]), tuple(int(p) for p in ports["oob"]), \
        tuple(int(p) for p in ports["btl"])


def _account_name(user):
    """The POSIX account name the user has inside job containers."""
    lowered = user.lower()
    if lowered in ("root", "nobody", "sshd") or not _ACCOUNT_RE.match(lowered):
        return "mpiuser"  # system names stay the system's inside the container
    return lowered


def _node_limits(config, ranks):
    """The limits of the container that runs ``ranks`` of a job's ranks on a node."""
    limits = config["limits"]
    return {
        "memory": (ranks * int(limits["memory_per_slot_mb"]) + SLOT_OVERHEAD_MIB) * MIB,
        "pids": ranks * int(limits["pids_per_slot"]) + SLOT_OVERHEAD_PIDS,
        "nano_cpus": int(ranks * float(limits["cpus_per_slot"]) * 1e9),
        "tmp_size": int(limits["tmp_size_mb"]) * MIB,
    }


def _job_files(config, record, job_addresses):
    launch = __utils__
    user_private, user_public = launch["mpi_launch.generate_ed25519_keypair"]("dockermpi-job")
    host_private, host_public = launch["mpi_launch.generate_ed25519_keypair"]("dockermpi-host")
    account = _account_name(record["user"])
    uid = record["uid"]
    sshd_port = _job_ports(config)[0]
    return {
        "id_ed25519": user_private,
        "authorized_keys": launch["mpi_launch.authorized_keys_text"](user_public),
        "ssh_host_key": host_private,
        "known_hosts": launch["mpi_launch.known_hosts_text"](host_public),
        "sshd_config": launch["mpi_launch.sshd_config_text"](sshd_port, account),
        "passwd": launch["mpi_launch.passwd_text"](account, uid, uid, home=DATA_MOUNT),
        "group": launch["mpi_launch.group_text"](account, uid),
        "program": launch["mpi_launch.program_script_text"](record["cmd"]),
        "hostfile": launch["mpi_launch.hostfile_text"](
            [(job_addresses[node], ranks) for node, ranks in record["placement"].items()]
        ),
    }


def _job_environment(record, job_addresses):
    """What every rank is told about its job (like Slurm's SLURM_JOB_ID and friends)."""
    return {
        "DMPI_JOB_ID": record["job_id"],
        "DMPI_JOB_DIR": record["output"]["dir_in_job"],
        "DMPI_NTASKS": str(record["np"]),
        "DMPI_NODELIST": ",".join(record["placement"]),
        "DMPI_ADDRESSES": ",".join(job_addresses[n] for n in record["placement"]),
    }


# ----------------------------------------------------------------- store and state


def _store():
    return __utils__["mpi_store.open_store"](
        os.path.join(__opts__["cachedir"], "dockermpi", "jobs.sqlite")
    )


def _fire(job_id, state, data=None):
    with salt.utils.event.get_master_event(__opts__, __opts__["sock_dir"], listen=False) as bus:
        bus.fire_event(dict(data or {}, job_id=job_id, state=state), f"mpi/job/{job_id}/{state}")


def _public(record):
    """The job record as users see it (no internal scheduling data)."""
    view = {k: v for k, v in record.items() if k not in ("spec", "port_slot", "closed")}
    view["retcode"] = 0 if record["state"] == "succeeded" else 1
    return view


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


def _alive(nodes_seen, now):
    return {n for n, seen in nodes_seen.items() if now - seen["last_seen"] <= NODE_TIMEOUT}


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
    alive = sorted(_alive(_store().nodes(), time.time()))
    if not alive:
        raise CommandExecutionError("no MPI node is reporting; cannot reach shared storage")
    return alive[0], storage["path"]


def _user_uid(store, config, user, check_dir=False):
    """The user's own uid (allocated on first use from ``mpi:users``), with their
    directory owned by it (made once, or checked again with ``check_dir``: a job that
    finds it gone resets that); CommandExecutionError when that cannot be had."""
    users = config["users"]
    try:
        uid, _ = store.user_uid(user, int(users["uid_min"]), int(users["uid_max"]))
    except RuntimeError as exc:  # mpi_store.StoreError: the uid range is used up
        raise CommandExecutionError(str(exc)) from None
    if check_dir or not store.users().get(user, {}).get("dir_ready"):
        minion, path = _storage_owner(config)
        _call(_client(), [minion], "mpi_job.ensure_user_dir", timeout=15, storage_path=path,
              user=user, uid=uid, gid=uid)
        store.set_user_dir_ready(user)
    return uid


def _refresh_site(store, minion):
    config = _site_config(minion)
    store.set_meta("site", {"config": config, "read": time.time()})
    return config


def _fresh_site(store):
    """The site settings read now, as the nodes see them."""
    all_nodes = _mpi_nodes()
    if not all_nodes:
        raise SaltInvocationError("there are no MPI nodes (grain roles:mpi-node)")
    return _refresh_site(store, all_nodes[0])


# -------------------------------------------------------------------- public: jobs


def submit(user=None, image=None, np=None, cmd=None, nodes=None, slots_per_node=None,
           walltime=None, env=None, workdir=None):
    """
    Queue an MPI job and return its id at once; it starts when all its slots are free.

    Arguments are those of :func:`launch`. Returns the job record (``job_id``,
    ``state: queued``, ...) or ``{"state": "rejected", "error": ...}`` when any argument
    is wrong or the job could never run; nothing is queued then.

    CLI Example:

    .. code-block:: bash

        salt-run mpi.submit user=alice image=mpi np=6 cmd='python3 pi.py' walltime=10
    """
    try:
        all_nodes = _mpi_nodes()
        if not all_nodes:
            raise SaltInvocationError("there are no MPI nodes (grain roles:mpi-node)")
        store = _store()
        config = _refresh_site(store, all_nodes[0])
        limits = config["limits"]
        _check_job_network(config)
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
            __utils__["mpi_sched.place"](request["np"], {n: node_slots for n in candidates},
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
        uid = _user_uid(store, config, request["user"])
    except (SaltInvocationError, CommandExecutionError) as exc:
        return _rejected(exc)
    job_id = time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)
    job_dir = posixpath.join(config["storage"]["path"], "users", request["user"], JOBS_SUBDIR,
                             job_id)
    now = time.time()
    record = {
        "job_id": job_id,
        "user": request["user"],
        "uid": uid,
        "image": request["image"],
        "np": request["np"],
        "cmd": request["program"],
        "walltime": request["walltime"],
        "state": "queued",
        "reason": None,
        "submitted": now,
        "history": [{"state": "queued", "at": now, "reason": None}],
        "output": {
            "dir": job_dir,
            "dir_in_job": posixpath.join(DATA_MOUNT, JOBS_SUBDIR, job_id),
            "stdout": posixpath.join(job_dir, "stdout"),
            "stderr": posixpath.join(job_dir, "stderr"),
            "status": posixpath.join(job_dir, "status.json"),
        },
        "timings": {},
        "spec": {
            "image_ref": images[request["image"]],
            "candidates": candidates,
            "count": count,
            "per_node": request["slots_per_node"],
            "env": request["env"],
            "workdir": request["workdir"],
            "config": {k: config[k] for k in ("cluster_network", "job_network", "ports",
                                             "storage", "job_root", "slots_per_node",
                                             "limits")},
        },
    }
    store.add(record)
    _fire(job_id, "queued", {"user": request["user"]})
    return dict(_public(record), retcode=0)  # queued is what submit promises


def launch(user=None, image=None, np=None, cmd=None, nodes=None, slots_per_node=None,
           walltime=None, env=None, workdir=None):
    """
    Run an MPI program across nodes in an approved image and wait for it to end.

    user
        Whose job it is (a JupyterHub user name). Only ``<storage>/users/<user>`` is
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
        Time limit: seconds, ``30m``, ``2h``, or Slurm's ``MM:SS``, ``HH:MM:SS``,
        ``D-HH:MM:SS``. Default one hour; at most pillar ``mpi:limits:max_walltime``.
    env
        ``{NAME: value}`` exported to every rank.
    workdir
        Working directory of the ranks, relative to the user's directory. Default: it.

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
                       workdir=workdir)
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
    """The record of an existing job; SaltInvocationError for a bad or unknown id."""
    if not isinstance(job_id, str) or not _JOB_ID_RE.match(job_id):
        raise SaltInvocationError(f"{job_id!r} is not a job id (YYYYMMDD-HHMMSS-xxxxxx)")
    record = store.get(job_id)
    if record is None:
        raise SaltInvocationError(f"no job {job_id}")
    return record


def wait(job_id, timeout=None):
    """
    Wait until a job has ended and return its record.

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
        bus.subscribe(f"mpi/job/{job_id}/")
        while True:
            record = store.get(job_id)
            # A final job is closed once its clean-up is recorded; a finisher that died
            # in between (master restart) must not make us wait forever.
            closed = record.get("closed") or time.time() - (record.get("ended") or 0) > 30
            if (record["state"] in FINAL and closed) or (deadline and time.monotonic() > deadline):
                view = _public(record)
                __context__["retcode"] = view["retcode"]
                return view
            # Events make this prompt; reading the store each second makes it certain.
            bus.get_event(wait=1, tag=f"mpi/job/{job_id}/", match_type="startswith")


def status(job_id):
    """
    Return a job's record, with the history of its states.

    CLI Example:

    .. code-block:: bash

        salt-run mpi.status 20261130-132321-b26398
    """
    try:
        return _public(_known_job(_store(), job_id))
    except SaltInvocationError as exc:
        return _failed_call(str(exc))


def list_(user=None, state=None):
    """
    List jobs, oldest first: id, user, state, np, placement, times and reason.

    user
        Only this user's jobs.
    state
        Only jobs in this state (or a comma-separated list of states).

    CLI Example:

    .. code-block:: bash

        salt-run mpi.list user=alice state=queued,running
    """
    states = None
    if state:
        states = [s.strip() for s in (state if isinstance(state, list) else str(state).split(","))]
        unknown = sorted(set(states) - set(("queued",) + ACTIVE + FINAL))
        if unknown:
            return _failed_call(f"unknown job states: {unknown}")
    keys = ("job_id", "user", "state", "np", "placement", "submitted", "started", "ended",
            "reason", "waiting_for")
    return [{k: r.get(k) for k in keys} for r in _store().jobs(states, user=user)]


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
    ended = _finish(job_id, "cancelled", reason, expect=("queued",) + ACTIVE)
    schedule()
    return _public(ended or store.get(job_id))


def logs(job_id, stream="stdout", tail=65536):
    """
    Return the end of a job's standard output or error (read on one of the nodes).

    stream
        ``stdout`` or ``stderr``.
    tail
        How many bytes from the end, at most.

    CLI Example:

    .. code-block:: bash

        salt-run mpi.logs 20261130-132321-b26398 stream=stderr
    """
    try:
        if stream not in ("stdout", "stderr"):
            raise SaltInvocationError("stream must be stdout or stderr")
        store = _store()
        record = _known_job(store, job_id)
        alive = _alive(store.nodes(), time.time())
        readers = [n for n in record.get("placement") or {} if n in alive] or sorted(alive)
        if not readers:
            raise CommandExecutionError("no MPI node is reporting; cannot read shared storage")
        config = record["spec"]["config"]
        text = _call(_client(), readers[:1], "mpi_job.read_output", timeout=15, job_id=job_id,
                     storage_path=config["storage"]["path"], user=record["user"],
                     uid=record["uid"], gid=record["uid"], stream=stream,
                     tail_bytes=_tail_bytes(tail))[readers[0]]
    except (SaltInvocationError, CommandExecutionError) as exc:
        return _failed_call(str(exc))
    return text


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
    Show every MPI node: slots, used slots, running jobs, whether it reports, its engine.

    CLI Example:

    .. code-block:: bash

        salt-run mpi.nodes
    """
    store = _store()
    now = time.time()
    seen = store.nodes()
    site = store.get_meta("site") or {}
    slots = int((site.get("config") or {}).get("slots_per_node", 0))
    jobs = store.jobs(ACTIVE)
    result = {}
    for node in sorted(set(_mpi_nodes()) | set(seen)):
        info = seen.get(node)
        mine = [j for j in jobs if node in (j.get("placement") or {})]
        result[node] = {
            "slots": slots,
            "used": sum(j["placement"][node] for j in mine),
            "jobs": [j["job_id"] for j in mine],
            "reachable": bool(info) and now - info["last_seen"] <= NODE_TIMEOUT,
            "last_report_seconds_ago": round(now - info["last_seen"], 1) if info else None,
            "engine": info["report"].get("engine") if info else None,
        }
    return result


# ------------------------------------------------------------------- public: users


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
        if not __utils__["mpi_request.valid_user"](user):
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


# ------------------------------------------------------------ reactor and schedule


def schedule(**kwargs):
    """
    Start every queued job that can start now (reactor: ``mpi/job/*/queued``).

    CLI Example:

    .. code-block:: bash

        salt-run mpi.schedule
    """
    store = _store()
    site = store.get_meta("site")
    if not site:
        return []
    node_slots = int(site["config"]["slots_per_node"])
    limits = site["config"].get("limits") or {}
    now = time.time()
    started = []
    with store.transaction() as conn:
        queued = store.jobs(["queued"], conn=conn)
        if not queued:
            return []
        active = store.jobs(ACTIVE, conn=conn)
        alive = _alive(store.nodes(conn), now)
        used, usage, running = {}, {}, []
        for job in active:
            for node, ranks in job["placement"].items():
                used[node] = used.get(node, 0) + ranks
            mine = usage.setdefault(job["user"], {"jobs": 0, "slots": 0})
            mine["jobs"] += 1
            mine["slots"] += job["np"]
            running.append({"placement": job["placement"],
                            "end": job.get("deadline") or now + job["walltime"]})
        free = {n: node_slots - used.get(n, 0) for n in sorted(alive)}
        waiting = [
            {"id": j["job_id"], "user": j["user"], "np": j["np"], "walltime": j["walltime"],
             "candidates": j["spec"]["candidates"], "count": j["spec"]["count"],
             "per_node": j["spec"]["per_node"]}
            for j in queued
        ]
        starts, blocked = __utils__["mpi_sched.plan"](
            waiting, free, running, now, node_slots,
            {"max_running_jobs": limits.get("max_running_jobs_per_user"),
             "max_slots": limits.get("max_slots_per_user")},
            usage,
        )
        by_id = {j["job_id"]: j for j in queued}
        taken = {a for j in active for a in (j.get("job_addresses") or {}).values()}
        taken |= set(store.get_meta("address_holds", {}, conn=conn))
        next_address = store.get_meta("next_job_address", 0, conn=conn)
        for job_id, placement in starts:
            pool = _address_pool(by_id[job_id]["spec"]["config"])
            # Round-robin through the pool: peers may still cache the link-layer address
            # of a container that just left.
            order = [pool[(next_address + i) % len(pool)] for i in range(len(pool))]
            free_addresses = [a for a in order if a not in taken][:len(placement)]
            if len(free_addresses) < len(placement):
                blocked[job_id] = "job addresses"
                continue
            next_address = (pool.index(free_addresses[-1]) + 1) % len(pool)
            store.set_meta("next_job_address", next_address, conn=conn)
            taken.update(free_addresses)
            record = store.transition(
                job_id, "starting", expect=("queued",), conn=conn, placement=placement,
                job_addresses=dict(zip(placement, free_addresses)), waiting_for=None,
            )
            started.append(record)
        for job_id, why in blocked.items():
            if by_id[job_id].get("waiting_for") != why:
                store.update(job_id, conn=conn, waiting_for=why)
    for record in started:
        _fire(record["job_id"], "starting", {"placement": record["placement"]})
    if started:
        # Salt's dunders live in context variables, which new threads do not inherit.
        with ThreadPoolExecutor(max_workers=min(4, len(started))) as pool:
            futures = [pool.submit(contextvars.copy_context().run, _start, r) for r in started]
            for future in futures:
                future.result()
    return [r["job_id"] for r in started]


def _check_job_network(config):
    """The site's job address pool must be a network inside the cluster network."""
    try:
        pool = ipaddress.ip_network(config["job_network"]["addresses"])
        inside = pool.subnet_of(ipaddress.ip_network(config["cluster_network"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise CommandExecutionError(
            f"the site has no valid job address pool (mpi:job_network:addresses): {exc}"
        ) from None
    if not inside:
        raise CommandExecutionError(
            f"mpi:job_network:addresses {pool} is not inside mpi:cluster_network")


def _address_pool(config):
    """Every address of the job network's pool, in order."""
    pool = ipaddress.ip_network(config["job_network"]["addresses"])
    return [str(a) for a in pool.hosts()]


def _start(record):
    """Bring up a job's workers and launcher; on any failure the job fails cleanly."""
    job_id, spec = record["job_id"], record["spec"]
    config, placement = spec["config"], record["placement"]
    nodes_ = list(placement)
    job_addresses = record["job_addresses"]
    client = _client()
    common = {
        "job_id": job_id,
        "image": spec["image_ref"],
        "user": record["user"],
        "uid": record["uid"],
        "gid": record["uid"],
        "storage_path": config["storage"]["path"],
        "job_root": config["job_root"],
    }
    timings = dict(record["timings"], queued=round(time.time() - record["submitted"], 3))
    try:
        sshd_port, oob_ports, btl_ports = _job_ports(config)
        host_addresses = _cluster_addresses(nodes_, config["cluster_network"])
        files = _job_files(config, record, job_addresses)
        environment = dict(spec["env"], **_job_environment(record, job_addresses))
        argv = __utils__["mpi_launch.launcher_argv"](
            posixpath.join(record["output"]["dir_in_job"], "stdout"),
            posixpath.join(record["output"]["dir_in_job"], "stderr"),
            record["np"], config["cluster_network"], oob_ports, btl_ports, sshd_port,
            spec["workdir"], env_names=sorted(environment),
        )
        launcher_node = nodes_[0]
        allowed = {"peers": sorted(job_addresses.values()), "hosts": sorted(host_addresses.values())}
        mark = time.monotonic()
        # One publish for every node; each node takes its own address and limits. The
        # launcher's node runs its ranks in the launcher container, so its worker gets
        # the small default limits.
        workers = _call(client, nodes_, "mpi_job.start_worker", timeout=30,
                        network=config["job_network"]["name"], addresses=job_addresses,
                        allowed_sources=allowed, sshd_port=sshd_port, files=files,
                        limits={n: _node_limits(config, placement[n])
                                for n in nodes_ if n != launcher_node},
                        **common)
        timings["containers_up"] = round(time.monotonic() - mark, 3)
        timings["sshd_ready"] = round(max(w["sshd_ready_seconds"] for w in workers.values()), 3)
        started = time.time()
        view = dict(_public(record), state="running", started=started, timings=timings)
        _call(client, [launcher_node], "mpi_job.start_launcher", timeout=30, argv=argv,
              environment=environment, status=view,
              limits=_node_limits(config, placement[launcher_node]), **common)
    except (CommandExecutionError, SaltInvocationError, ValueError) as exc:
        # ValueError: a launch builder refused a value (a bad pillar); the job must still
        # end here rather than sit in "starting".
        why = getattr(exc, "error", None) or str(exc)  # without Salt's info dump
        log.warning("job %s could not start: %s", job_id, why)
        if "is not ready" in why:
            _store().set_user_dir_ready(record["user"], False)
        _finish(job_id, "failed", f"could not start: {why}", expect=("starting",),
                timings=timings)
        schedule()
        return
    running = _store().transition(
        job_id, "running", expect=("starting",), started=started,
        deadline=started + record["walltime"], addresses=job_addresses, timings=timings,
    )
    if running is None:  # cancelled while starting: _finish ran before our containers
        _cleanup(_store().get(job_id), status=None)
        return
    _fire(job_id, "running", {"placement": placement})


def _cleanup(record, status):
    """Remove the job's containers and keys from its nodes that report; the rest later.

    Nodes that do not answer within a few seconds are left to the node reports: once a
    node reports containers of an ended job, they are removed (:func:`node_report`).
    """
    placement = record.get("placement") or {}
    store = _store()
    alive = _alive(store.nodes(), time.time())
    reachable = [n for n in placement if n in alive]
    config = record["spec"]["config"]
    answered, error = [], None
    if reachable:
        try:
            answered = list(_call(
                _client(), reachable, "mpi_job.cleanup", timeout=CLEANUP_TIMEOUT,
                job_id=record["job_id"], job_root=config["job_root"], status=status,
                status_node=reachable[0], storage_path=config["storage"]["path"],
                user=record["user"], uid=record.get("uid"), gid=record.get("uid"),
            ))
        except CommandExecutionError as exc:
            answered = list((getattr(exc, "info", None) or {}).get("results", {}))
            error = str(exc)
            log.warning("job %s: cleanup incomplete: %s", record["job_id"], exc)
    return {"cleaned": answered, "pending": [n for n in placement if n not in answered],
            "error": error}


def _finish(job_id, state, reason, expect=ACTIVE, **fields):
    """End a job exactly once: record the final state, clean up, announce it."""
    store = _store()
    now = time.time()
    record = store.transition(job_id, state, reason, expect=expect, ended=now, **fields)
    if record is None:
        return None
    if record.get("started"):
        record["timings"].setdefault("mpirun", round(now - record["started"], 3))
    if record.get("placement"):
        mark = time.monotonic()
        done = _cleanup(record, status=_public(record))
        _hold_addresses(store, record, done["pending"])
        record["timings"]["cleanup"] = round(time.monotonic() - mark, 3)
        record["timings"]["total"] = round(time.time() - record["submitted"], 3)
        record = store.update(job_id, timings=record["timings"], cleanup=done, closed=True) or record
    else:
        record["timings"]["total"] = round(now - record["submitted"], 3)
        record = store.update(job_id, timings=record["timings"], closed=True) or record
    _fire(job_id, state, {"reason": reason, "exit_code": record.get("exit_code")})
    return record


def _hold_addresses(store, record, pending):
    """Keep the addresses of a job's containers on nodes not yet cleaned out of the pool:
    a cut-off node may still run them, and an address must never be on two containers."""
    if not pending:
        return
    with store.transaction() as conn:
        holds = store.get_meta("address_holds", {}, conn=conn)
        for node in pending:
            address = (record.get("job_addresses") or {}).get(node)
            if address:
                holds[address] = {"job_id": record["job_id"], "node": node}
        store.set_meta("address_holds", holds, conn=conn)


def _release_addresses(store, node, reported):
    """A node that reports no container of a job any more frees that job's addresses."""
    holds = store.get_meta("address_holds", {})
    gone = [a for a, h in holds.items()
            if h["node"] == node and not (reported.get(h["job_id"]) or {}).get("containers",
                                                                               {}).get("worker")]
    if gone:
        with store.transaction() as conn:
            holds = store.get_meta("address_holds", {}, conn=conn)
            for address in gone:
                holds.pop(address, None)
            store.set_meta("address_holds", holds, conn=conn)


# Exit codes of the job's program script (/bin/sh) that say more than a number.
_SHELL_EXITS = {126: "cannot be executed (permission denied or not a program)",
                127: "was not found in the image"}


def _outcome(code, failure, program):
    """(state, reason) from the launcher's exit code and the failing rank."""
    if code == 0:
        return "succeeded", None
    if failure and "signal" in failure:
        return "failed", f"rank {failure['rank']} died of {failure['signal_name']}"
    if failure and failure.get("exit_code") in _SHELL_EXITS:
        return "failed", (f"rank {failure['rank']}: program {program[0][:100]!r} "
                          f"{_SHELL_EXITS[failure['exit_code']]}")
    if failure:
        return "failed", f"rank {failure['rank']} exited with code {failure['exit_code']}"
    return "failed", f"mpirun exited with code {code}"


# What a job's container ran into, in the words of the limit (pillar mpi:limits).
def _limit_reason(limit, node, limits):
    if limit == "memory":
        return (f"memory limit exceeded on {node} ({limits['memory_per_slot_mb']} MiB per "
                "slot, mpi:limits:memory_per_slot_mb); a rank was killed")
    return (f"process limit reached on {node} ({limits['pids_per_slot']} processes per slot, "
            "mpi:limits:pids_per_slot)")


def node_report(node=None, report=None, **kwargs):
    """
    Take a node's beacon report (reactor: ``salt/beacon/*/mpi_jobs/report``): record that
    the node is alive and end jobs whose launcher exited, whose containers vanished, whose
    node lost its engine or cannot reach the job's other nodes; remove leftovers of jobs
    that already ended.

    CLI Example:

    .. code-block:: bash

        salt-run mpi.node_report node=node1 report='{"engine": "ok", "jobs": {}}'
    """
    if not node or not isinstance(report, dict):
        return _failed_call("node_report needs node and report")
    store = _store()
    now = time.time()
    store.node_seen(node, report, now)
    if report.get("error"):
        # The node is alive but could not build its report: a heartbeat, no evidence.
        log.warning("%s could not report its jobs: %s", node, report["error"])
        return True
    reported = report.get("jobs") or {}
    if not isinstance(reported, dict):
        reported = {}
    _release_addresses(store, node, reported)
    engine_ok = report.get("engine") == "ok"
    ended = False
    for record in store.jobs(["running"]):
        if node not in record["placement"]:
            continue
        info = reported.get(record["job_id"])
        verdict = _judge(node, record, info if isinstance(info, dict) else None, engine_ok,
                         report, now, store)
        if verdict:
            state, reason, fields = verdict
            ended |= _finish(record["job_id"], state, reason, **fields) is not None
    client = None
    for job_id, info in reported.items():
        if not (info.get("containers") or info.get("secrets")):
            continue
        record = store.get(job_id) if _JOB_ID_RE.match(job_id) else None
        if record is None or record["state"] in FINAL:
            # Leftovers of an ended job (e.g. from a node that was cut off): remove them.
            client = client or _client()
            config = record["spec"]["config"] if record else store.get_meta("site")["config"]
            client.cmd_async([node], "mpi_job.cleanup", tgt_type="list",
                             kwarg={"job_id": job_id, "job_root": config["job_root"]})
    if ended:
        schedule()
    return True


def _limits_hit_by(record, node, info, store):
    """(node, limit) of the first limit the job ran into: this report first, then the
    latest report of each of the job's other nodes; None when no limit was hit."""
    if info and info.get("limits_hit"):
        return node, info["limits_hit"][0]
    seen = store.nodes()
    for other in record["placement"]:
        job = (((seen.get(other) or {}).get("report") or {}).get("jobs") or {}).get(
            record["job_id"]) or {}
        if job.get("limits_hit"):
            return other, job["limits_hit"][0]
    return None


def _judge(node, record, info, engine_ok, report, now, store):
    """Whether a running job must end, from one node's report: (state, reason, fields)."""
    launcher_node = next(iter(record["placement"]))
    limits = record["spec"]["config"]["limits"]
    if info and info.get("limits_hit") and info["limits_hit"][0] in ("memory", "pids"):
        return "failed", _limit_reason(info["limits_hit"][0], node, limits), {}
    if info and node == launcher_node and info.get("launcher_exit_code") is not None:
        code, failure = info["launcher_exit_code"], info.get("failure")
        state, reason = _outcome(code, failure, record["cmd"])
        hit = _limits_hit_by(record, node, info, store) if code else None
        if hit and hit[1] in ("memory", "pids"):
            reason = _limit_reason(hit[1], hit[0], limits)
        return state, reason, {"exit_code": code, "failure": failure}
    if now > record["deadline"]:
        return "timed_out", f"walltime of {record['walltime']} seconds exceeded", {}
    if report.get("time", now) < record["started"] + REPORT_SKEW:
        # Taken before the job's containers were all up (reports can arrive late): what
        # it does not show says nothing about this job yet.
        return None
    if not engine_ok:
        return "failed", f"the Docker engine on {node} is not answering: {report.get('engine')}", {}
    if info is None:
        return "failed", f"the job's containers on {node} are gone", {}
    containers = info.get("containers") or {}
    if node == launcher_node and containers.get("launcher") not in ("running", "created"):
        return "failed", f"the launcher container on {node} is gone", {}
    if containers.get("worker") not in ("running", "created"):
        return "failed", f"the worker container on {node} is gone", {}
    unreachable = info.get("unreachable_peers") or []
    if unreachable:
        names = {a: n for n, a in (record.get("job_addresses") or {}).items()}
        peers = sorted(names.get(a, a) for a in unreachable)
        return "failed", f"{node} cannot reach {', '.join(peers)} (network partition)", {}
    return None


def _master_started():
    """When this salt-master started: its pid file is written at start."""
    try:
        return os.stat(__opts__["pidfile"]).st_mtime
    except (KeyError, OSError):
        return 0.0


def tick(**kwargs):
    """
    The master schedule's pass (every 2 s): walltimes, nodes that stopped reporting,
    jobs stuck starting, then the queue.

    CLI Example:

    .. code-block:: bash

        salt-run mpi.tick
    """
    store = _store()
    now = time.time()
    last = store.get_meta("last_tick")
    store.set_meta("last_tick", now)
    if last is None or now - last > 2 * TICK_SECONDS or now - _master_started() < RESTART_GRACE:
        # The master was down, restarting or stalled, so reports could not arrive: give
        # nodes time to report again before judging them by their silence.
        store.set_meta("grace_until", max(now + 1, _master_started() + RESTART_GRACE))
    grace_until = store.get_meta("grace_until", 0)
    site = store.get_meta("site")
    if site and now - site["read"] > SITE_REFRESH:
        members = _mpi_nodes()
        if members:
            try:
                _refresh_site(store, members[0])
            except CommandExecutionError as exc:
                log.warning("cannot re-read the site settings: %s", exc)
    seen = store.nodes()
    ended = []
    for record in store.jobs(ACTIVE):
        job_id = record["job_id"]
        if record["state"] == "running" and now > record["deadline"]:
            ended.append(_finish(job_id, "timed_out",
                                 f"walltime of {record['walltime']} seconds exceeded"))
            continue
        if record["state"] == "starting":
            since = record["history"][-1]["at"]
            if now - since > START_TIMEOUT:
                ended.append(_finish(job_id, "failed",
                                     f"did not start within {START_TIMEOUT} seconds"))
            continue
        if now < grace_until:
            continue
        lost = [n for n in record["placement"]
                if now - seen.get(n, {}).get("last_seen", 0) > NODE_TIMEOUT]
        if lost:
            ended.append(_finish(job_id, "failed",
                                 f"{'nodes' if len(lost) > 1 else 'node'} {', '.join(lost)} "
                                 f"stopped answering (no report for over {NODE_TIMEOUT} s)"))
    started = schedule()
    return {"ended": [r["job_id"] for r in ended if r], "started": started}
