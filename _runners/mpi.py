"""
Run users' MPI programs across DockerMPI nodes, from the Salt master.

``salt-run mpi.launch`` validates a job, allocates slots on reachable nodes, hands each
node the job's freshly generated keys through Salt's encrypted channel, starts a worker
container (sshd as the guest uid) on every node, runs ``mpirun`` from a launcher
container on the first node, records the outcome in the user's directory and always
removes every container and key of the job, whether it succeeds, fails, runs out of
walltime or ``salt-run`` is interrupted.

Site settings come from the ``mpi`` pillar of the nodes merged over
``salt://dockermpi/defaults.yaml``; slot and port allocations live in a small SQLite
store in the master's cache directory, so concurrent launches never share a slot or an
sshd port.

Every transition is fired on the master event bus as ``mpi/job/<id>/<state>``.

:depends: the ``mpi_job`` execution module on the nodes, the ``mpi_launch`` utils module
"""

import contextlib
import ipaddress
import json
import logging
import math
import os
import posixpath
import re
import secrets
import shlex
import signal
import sqlite3
import time

import salt.client
import salt.fileclient
import salt.utils.dictupdate
import salt.utils.event
import salt.utils.yaml
from salt.exceptions import CommandExecutionError, SaltInvocationError

log = logging.getLogger(__name__)

__virtualname__ = "mpi"

NODE_TARGET = "G@roles:mpi-node"
ACTIVE_STATES = ("starting", "running")
DATA_MOUNT = "/data"
JOBS_SUBDIR = "mpi-jobs"
WAIT_SLICE = 5  # seconds one mpi_job.wait call may block on the node
# mpirun listens on every port of its OOB range, so each job gets its own block.
OOB_PORTS_PER_JOB = 2
RESERVED_ENV_PREFIXES = ("OMPI_", "PMIX_", "OPAL_", "ORTE_")
RESERVED_ENV_NAMES = ("HOME",)

_USER_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
_ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_WALLTIME_RE = re.compile(r"^(?:(?P<days>\d+)-)?(?P<rest>\d+(?::\d+){0,2})$")


def __virtual__():
    return __virtualname__


class _Interrupted(Exception):
    """salt-run received SIGTERM."""


# --------------------------------------------------------------------------- input


def _parse_walltime(value):
    """Slurm's formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S. Returns seconds."""
    text = str(value).strip()
    match = _WALLTIME_RE.match(text)
    if isinstance(value, bool) or not match:
        raise SaltInvocationError(
            f"walltime {value!r} is not a time: use minutes, MM:SS, HH:MM:SS or D-HH:MM:SS"
        )
    parts = [int(p) for p in match.group("rest").split(":")]
    if match.group("days") is not None:
        parts += [0] * (3 - len(parts))
        hours, minutes, seconds = parts
        seconds += int(match.group("days")) * 86400
    elif len(parts) == 1:
        hours, minutes, seconds = 0, parts[0], 0
    elif len(parts) == 2:
        hours, (minutes, seconds) = 0, parts
    else:
        hours, minutes, seconds = parts
    total = hours * 3600 + minutes * 60 + seconds
    if total <= 0:
        raise SaltInvocationError(f"walltime {value!r} must be longer than zero")
    return total


def _validate_request(user, image, np, cmd, nodes, slots_per_node, walltime, env, workdir,
                      max_walltime):
    """Check every argument that needs no cluster state; returns the normalised request."""
    if not isinstance(user, str) or not _USER_RE.match(user):
        raise SaltInvocationError(
            f"user {user!r} is not a valid user name: letters, digits, '-' and '_' only, "
            "starting with a letter or digit, at most 64 characters"
        )
    if not isinstance(image, str) or not image:
        raise SaltInvocationError("image is required: the short name of an approved image")
    if isinstance(np, bool) or not isinstance(np, int) or np < 1:
        raise SaltInvocationError(f"np must be a positive whole number of ranks, got {np!r}")
    if isinstance(cmd, str):
        try:
            program = shlex.split(cmd)
        except ValueError as exc:
            raise SaltInvocationError(f"cmd cannot be split into words: {exc}") from None
    elif isinstance(cmd, (list, tuple)) and all(isinstance(a, str) for a in cmd):
        program = list(cmd)
    else:
        raise SaltInvocationError("cmd is required: the program and its arguments")
    if not program or not program[0]:
        raise SaltInvocationError("cmd is empty: give the program to run")
    if program[0].startswith("-"):
        raise SaltInvocationError(f"cmd must start with a program, not an option: {program[0]!r}")
    if any("\0" in arg for arg in program):
        raise SaltInvocationError("cmd must not contain NUL characters")
    if slots_per_node is not None and (
        isinstance(slots_per_node, bool) or not isinstance(slots_per_node, int)
        or slots_per_node < 1
    ):
        raise SaltInvocationError(f"slots_per_node must be a positive whole number, got {slots_per_node!r}")
    seconds = _parse_walltime("1:00:00" if walltime is None else walltime)
    if seconds > max_walltime:
        raise SaltInvocationError(
            f"walltime {walltime} exceeds the site's limit of {max_walltime} seconds"
        )
    environment = {}
    if env is not None:
        if not isinstance(env, dict):
            raise SaltInvocationError("env must be a mapping of variable names to values")
        for name, value in env.items():
            if not isinstance(name, str) or not _ENV_RE.match(name):
                raise SaltInvocationError(f"environment variable name {name!r} is not valid")
            if name in RESERVED_ENV_NAMES or name.startswith(RESERVED_ENV_PREFIXES):
                raise SaltInvocationError(
                    f"environment variable {name} is reserved: DockerMPI sets it for the job"
                )
            if isinstance(value, (dict, list)) or value is None or "\0" in str(value):
                raise SaltInvocationError(f"environment variable {name} needs a plain value")
            environment[name] = str(value)
    workdir = DATA_MOUNT if workdir in (None, "") else str(workdir)
    resolved = posixpath.normpath(posixpath.join(DATA_MOUNT, workdir))
    if resolved != DATA_MOUNT and not resolved.startswith(DATA_MOUNT + "/"):
        raise SaltInvocationError(
            f"workdir {workdir!r} leaves the user's data directory (seen as {DATA_MOUNT})"
        )
    if isinstance(nodes, bool):
        raise SaltInvocationError("nodes must be a count, a list of nodes or a target expression")
    return {
        "user": user,
        "image": image,
        "np": np,
        "program": program,
        "nodes": nodes,
        "slots_per_node": slots_per_node,
        "walltime": seconds,
        "env": environment,
        "workdir": resolved,
    }


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


def _target(nodes):
    """(target, tgt_type, wanted node count or None) from the ``nodes`` argument."""
    if nodes is None:
        return NODE_TARGET, "compound", None
    if isinstance(nodes, int):
        if nodes < 1:
            raise SaltInvocationError(f"nodes={nodes}: need at least one node")
        return NODE_TARGET, "compound", nodes
    if isinstance(nodes, (list, tuple)):
        return [str(n) for n in nodes], "list", None
    text = str(nodes).strip()
    if text.isdigit():
        return _target(int(text))
    if re.fullmatch(r"[A-Za-z0-9_.-]+(,[A-Za-z0-9_.-]+)+", text):
        return text.split(","), "list", None
    return f"{NODE_TARGET} and ( {text} )", "compound", None


def _reachable_nodes(client, nodes):
    target, tgt_type, count = _target(nodes)
    answers = client.cmd(target, "test.ping", tgt_type=tgt_type, timeout=5)
    reachable = sorted(m for m, ok in answers.items() if ok is True)
    if tgt_type == "list":
        missing = sorted(set(target) - set(reachable))
        if missing:
            raise SaltInvocationError(f"nodes not reachable or not MPI nodes: {missing}")
    if not reachable:
        raise SaltInvocationError(f"no reachable MPI node matches nodes={nodes!r}")
    return reachable, count


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


# ----------------------------------------------------------------------- job store


@contextlib.contextmanager
def _store():
    """The master's job store; the connection holds a write lock inside ``with`` blocks."""
    folder = os.path.join(__opts__["cachedir"], "dockermpi")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    conn = sqlite3.connect(os.path.join(folder, "jobs.sqlite"), timeout=30, isolation_level=None)
    try:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS jobs (id TEXT PRIMARY KEY, user TEXT NOT NULL,"
            " state TEXT NOT NULL, port_slot INTEGER NOT NULL, placement TEXT NOT NULL, record TEXT NOT NULL,"
            " created REAL NOT NULL, updated REAL NOT NULL)"
        )
        yield conn
    finally:
        conn.close()


def _port_slots(config):
    """How many jobs can share a node: each takes one sshd port and an OOB port block."""
    sshd_low, sshd_high = (int(p) for p in config["ports"]["sshd"])
    oob_low, oob_high = (int(p) for p in config["ports"]["oob"])
    return min(sshd_high - sshd_low + 1, (oob_high - oob_low + 1) // OOB_PORTS_PER_JOB)


def _slot_ports(config, slot):
    """(sshd port, (first, last) OOB port) of a port slot."""
    sshd_low = int(config["ports"]["sshd"][0])
    oob_low = int(config["ports"]["oob"][0]) + slot * OOB_PORTS_PER_JOB
    return sshd_low + slot, (oob_low, oob_low + OOB_PORTS_PER_JOB - 1)


def _allocate(job_id, request, candidates, count, config, record):
    """Choose nodes, ranks per node and a port slot, atomically against other jobs."""
    node_slots = int(config["slots_per_node"])
    with _store() as conn:
        conn.execute("BEGIN IMMEDIATE")
        try:
            used = {}
            busy_ports = {}
            for placement, slot in conn.execute(
                f"SELECT placement, port_slot FROM jobs WHERE state IN {ACTIVE_STATES!r}"
            ):
                for node, ranks in json.loads(placement).items():
                    used[node] = used.get(node, 0) + ranks
                    busy_ports.setdefault(node, set()).add(slot)
            free = {n: node_slots - used.get(n, 0) for n in candidates}
            placement = _place(request["np"], free, count, request["slots_per_node"], node_slots)
            taken = set().union(*(busy_ports.get(n, set()) for n in placement))
            slot = next((s for s in range(_port_slots(config)) if s not in taken), None)
            if slot is None:
                raise SaltInvocationError(
                    "every sshd port / Open MPI port block on the chosen nodes is in use"
                )
            now = time.time()
            conn.execute(
                "INSERT INTO jobs VALUES (?, ?, 'starting', ?, ?, ?, ?, ?)",
                (job_id, request["user"], slot, json.dumps(placement), json.dumps(record), now, now),
            )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    return placement, slot


def _place(np, free, count, per_node, node_slots):
    """{node: ranks}: block distribution over nodes in order, all or nothing."""
    if per_node is not None and per_node > node_slots:
        raise SaltInvocationError(
            f"slots_per_node={per_node} exceeds the {node_slots} slots each node has"
        )
    if count is not None:
        if count > len(free):
            raise SaltInvocationError(f"nodes={count} but only {len(free)} MPI nodes are reachable")
        per_node = per_node or math.ceil(np / count)
        if per_node * count < np:
            raise SaltInvocationError(f"np={np} does not fit {count} nodes x {per_node} slots")
    total = sum(max(0, f) for f in free.values())
    if per_node is None and np > total:
        raise SaltInvocationError(
            f"np={np} is more than the {total} free slots on the matching nodes ({free})"
        )
    placement, remaining = {}, np
    for node, available in free.items():
        if remaining == 0 or (count is not None and len(placement) == count):
            break
        take = min(available, remaining) if per_node is None else min(per_node, remaining)
        if take <= 0 or take > available:
            continue
        placement[node] = take
        remaining -= take
    if remaining:
        raise SaltInvocationError(
            f"np={np} cannot be placed{f' with {per_node} ranks per node' if per_node else ''}"
            f": free slots per node are {free}"
        )
    return placement


def _finish(job_id, state, record):
    with _store() as conn:
        conn.execute(
            "UPDATE jobs SET state = ?, record = ?, updated = ? WHERE id = ?",
            (state, json.dumps(record), time.time(), job_id),
        )


# ------------------------------------------------------------------------- the job


def _fire(job_id, state, data):
    with salt.utils.event.get_master_event(__opts__, __opts__["sock_dir"], listen=False) as bus:
        bus.fire_event(dict(data, job_id=job_id, state=state), f"mpi/job/{job_id}/{state}")


def _new_job_id():
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)


def _job_files(config, placement, addresses, port):
    launch = __utils__
    user_private, user_public = launch["mpi_launch.generate_ed25519_keypair"]("dockermpi-job")
    host_private, host_public = launch["mpi_launch.generate_ed25519_keypair"]("dockermpi-host")
    guest = config["guest"]
    return {
        "id_ed25519": user_private,
        "authorized_keys": launch["mpi_launch.authorized_keys_text"](user_public),
        "ssh_host_key": host_private,
        "known_hosts": launch["mpi_launch.known_hosts_text"](host_public),
        "sshd_config": launch["mpi_launch.sshd_config_text"](port, guest["user"],
                                                              listen_address="0.0.0.0"),
        "passwd": launch["mpi_launch.passwd_text"](guest["user"], guest["uid"], guest["gid"],
                                                   home=DATA_MOUNT),
        "group": launch["mpi_launch.group_text"](guest["group"], guest["gid"]),
        "hostfile": launch["mpi_launch.hostfile_text"](
            [(addresses[node], ranks) for node, ranks in placement.items()]
        ),
    }


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
        Time limit, Slurm style: minutes, ``MM:SS``, ``HH:MM:SS`` or ``D-HH:MM:SS``.
        Default one hour; at most pillar ``mpi:limits:max_walltime`` seconds.
    env
        ``{NAME: value}`` exported to every rank.
    workdir
        Working directory of the ranks, relative to the user's directory. Default: it.

    Returns the job record: ``job_id``, ``state`` (succeeded, failed, timed_out,
    cancelled, rejected), ``exit_code``, ``failure`` (``rank`` with ``exit_code`` or
    ``signal``), ``reason``, ``placement`` (node: ranks), ``timings`` (seconds for
    allocate, containers_up, sshd_ready, mpirun, cleanup, total), ``output`` (where
    stdout, stderr and status.json are), ``retcode`` (0 only when the job succeeded;
    ``salt-run`` exits with it). A rejected job returns ``state``, ``error``, ``retcode``.

    CLI Example:

    .. code-block:: bash

        salt-run mpi.launch user=alice image=mpi np=6 \\
            cmd='python3 -m mpi4py.bench helloworld' --out=json
    """
    started = time.monotonic()
    try:
        request = _validate_request(user, image, np, cmd, nodes, slots_per_node, walltime,
                                    env, workdir, max_walltime=_max_walltime_default())
        client = _client()
        candidates, count = _reachable_nodes(client, request["nodes"])
        config = _site_config(candidates[0])
        request["walltime_limit"] = int(config.get("limits", {}).get("max_walltime", 86400))
        if request["walltime"] > request["walltime_limit"]:
            raise SaltInvocationError(
                f"walltime exceeds the site's limit of {request['walltime_limit']} seconds"
            )
        images = config.get("images") or {}
        if request["image"] not in images:
            raise SaltInvocationError(
                f"image {request['image']!r} is not approved; approved images: {sorted(images)}"
            )
    except (SaltInvocationError, CommandExecutionError) as exc:
        return _rejected(exc)
    return _run(client, request, config, candidates, count, started)


def _max_walltime_default():
    # The site's limit is checked again once the pillar is read; this bounds parsing.
    return 366 * 86400


def _run(client, request, config, candidates, count, started):
    job_id = _new_job_id()
    storage = config["storage"]["path"]
    job_dir = posixpath.join(storage, "users", request["user"], JOBS_SUBDIR, job_id)
    record = {
        "job_id": job_id,
        "user": request["user"],
        "image": request["image"],
        "np": request["np"],
        "cmd": request["program"],
        "state": "starting",
        "submitted": time.time(),
        "output": {
            "dir": job_dir,
            "dir_in_job": posixpath.join(DATA_MOUNT, JOBS_SUBDIR, job_id),
            "stdout": posixpath.join(job_dir, "stdout"),
            "stderr": posixpath.join(job_dir, "stderr"),
            "status": posixpath.join(job_dir, "status.json"),
        },
        "timings": {},
    }
    timings = record["timings"]
    mark = time.monotonic()
    try:
        placement, slot = _allocate(job_id, request, candidates, count, config, record)
    except SaltInvocationError as exc:
        return _rejected(exc)
    port, oob_ports = _slot_ports(config, slot)
    record["placement"] = placement
    timings["allocate"] = round(time.monotonic() - mark, 3)
    nodes = list(placement)
    common = {
        "job_id": job_id,
        "user": request["user"],
        "guest": {"uid": config["guest"]["uid"], "gid": config["guest"]["gid"]},
        "storage_path": storage,
    }
    previous_handler = _trap_sigterm()
    state, reason = "failed", None
    try:
        _fire(job_id, "starting", {"user": request["user"], "placement": placement})
        addresses = _cluster_addresses(nodes, config["cluster_network"])
        files = _job_files(config, placement, addresses, port)
        mark = time.monotonic()
        workers = _call(
            client, nodes, "mpi_job.start_worker", timeout=60, image=config["images"][request["image"]],
            job_root=config["job_root"], port=port, cluster_network=config["cluster_network"],
            files=files, **common,
        )
        timings["containers_up"] = round(time.monotonic() - mark, 3)
        timings["sshd_ready"] = round(max(w["sshd_ready_seconds"] for w in workers.values()), 3)
        argv = __utils__["mpi_launch.launcher_argv"](
            posixpath.join(record["output"]["dir_in_job"], "stdout"),
            posixpath.join(record["output"]["dir_in_job"], "stderr"),
            request["np"], request["program"], config["cluster_network"],
            oob_ports, config["ports"]["btl"], port, request["workdir"],
            env_names=sorted(request["env"]),
        )
        record.update(state="running", started=time.time())
        mark = time.monotonic()
        _call(client, nodes[:1], "mpi_job.start_launcher", timeout=60,
              image=config["images"][request["image"]], job_root=config["job_root"],
              argv=argv, environment=request["env"], status=record, **common)
        _set_state(job_id, "running", record)
        state, reason, exit_info = _wait(client, nodes[0], common, request["walltime"], mark)
        timings["mpirun"] = round(time.monotonic() - mark, 3)
        record.update(exit_info)
    except _Interrupted:
        state, reason = "cancelled", "salt-run was terminated"
    except KeyboardInterrupt:
        state, reason = "cancelled", "salt-run was interrupted"
    except (CommandExecutionError, SaltInvocationError) as exc:
        state, reason = "failed", str(exc)
    finally:
        record.update(state=state, reason=reason, ended=time.time())
        mark = time.monotonic()
        try:
            _call(client, nodes, "mpi_job.cleanup", timeout=60, job_id=job_id,
                  job_root=config["job_root"], status=record, status_node=nodes[0],
                  storage_path=storage, user=request["user"], guest=common["guest"])
        except CommandExecutionError as exc:
            record["cleanup_error"] = str(exc)
            log.error("job %s: cleanup incomplete: %s", job_id, exc)
        timings["cleanup"] = round(time.monotonic() - mark, 3)
        timings["total"] = round(time.monotonic() - started, 3)
        _finish(job_id, state, record)
        _fire(job_id, state, {"reason": reason, "exit_code": record.get("exit_code")})
        signal.signal(signal.SIGTERM, previous_handler) if previous_handler else None
    record["retcode"] = 0 if state == "succeeded" else 1
    __context__["retcode"] = record["retcode"]
    return record


def _rejected(exc):
    """What a job that never started returns; salt-run exits with ``retcode``."""
    __context__["retcode"] = 1
    return {"state": "rejected", "error": str(exc), "retcode": 1}


def _set_state(job_id, state, record):
    with _store() as conn:
        conn.execute("UPDATE jobs SET state = ?, record = ?, updated = ? WHERE id = ?",
                     (state, json.dumps(record), time.time(), job_id))
    _fire(job_id, state, {})


def _wait(client, launcher_node, common, walltime, started):
    """Wait for the launcher to exit; returns (state, reason, exit details)."""
    deadline = started + walltime
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return "timed_out", f"walltime of {walltime} seconds exceeded", {}
        result = _call(client, [launcher_node], "mpi_job.wait",
                       timeout=min(remaining, WAIT_SLICE) + 15, job_id=common["job_id"],
                       storage_path=common["storage_path"], user=common["user"],
                       seconds=min(remaining, WAIT_SLICE))[launcher_node]
        if result["state"] == "missing":
            return "failed", "the launcher container disappeared", {}
        if result["state"] == "exited":
            details = {"exit_code": result["exit_code"], "failure": result["failure"]}
            if result["exit_code"] == 0:
                return "succeeded", None, details
            failure = result["failure"]
            if failure and "signal" in failure:
                reason = f"rank {failure['rank']} died of {failure['signal_name']}"
            elif failure:
                reason = f"rank {failure['rank']} exited with code {failure['exit_code']}"
            else:
                reason = f"mpirun exited with code {result['exit_code']}"
            return "failed", reason, details


def _trap_sigterm():
    """Turn SIGTERM into an exception so the job is cleaned up; returns the old handler."""

    def handler(signum, frame):
        raise _Interrupted()

    try:
        return signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not in the main thread (e.g. called through the API)
        return None
