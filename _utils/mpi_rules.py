"""
The rules that end a DockerMPI job: pure functions of a job's record, the evidence its
nodes sent and the time. No Salt, no I/O; the job engine (``mpi_engine``) applies them.

Evidence of a node is what the engine knows of it::

    {"last_seen": unix time of its last heartbeat or report,
     "report": its latest report (``mpi_job.report`` plus ``unreachable_peers``),
     "usable": False while that report cannot be trusted (the node said its report
               failed, or the engine missed a change), so only silence counts}
"""

import signal

NODE_TIMEOUT = 5  # seconds without a heartbeat before a node counts as lost
START_TIMEOUT = 90  # seconds a job may stay in "starting"
RESTART_GRACE = 15  # seconds after the engine starts before silent nodes count as lost
REPORT_SKEW = 1  # seconds a node's clock and report may lag behind the master

QUEUED = "queued"
ACTIVE = ("starting", "running")
FINAL = ("succeeded", "failed", "cancelled", "timed_out")

# Exit codes of the job's program script (/bin/sh) that say more than a number.
SHELL_EXITS = {126: "cannot be executed (permission denied or not a program)",
               127: "was not found in the image"}
LIMITS = ("memory", "pids")


def active_states():
    """The states of a job that holds slots (Salt's loader exports functions only)."""
    return ACTIVE


def is_final(state):
    return state in FINAL


def timeouts():
    """The engine's time bounds, in seconds."""
    return {"node": NODE_TIMEOUT, "start": START_TIMEOUT, "restart_grace": RESTART_GRACE}


def outcome(code, failure, program):
    """(state, reason) from the launcher's exit code and the failing rank, if known."""
    if code == 0:
        return "succeeded", None
    if failure and "signal" in failure:
        return "failed", f"rank {failure['rank']} died of {failure['signal_name']}"
    if failure and failure.get("exit_code") in SHELL_EXITS:
        return "failed", (f"rank {failure['rank']}: program {str(program[0])[:100]!r} "
                          f"{SHELL_EXITS[failure['exit_code']]}")
    if failure:
        return "failed", (f"rank {failure['rank']} exited with code {failure['exit_code']}"
                          f"{_signal_meaning(failure['exit_code'])}")
    return "failed", f"mpirun exited with code {code}{_signal_meaning(code)}"


def _signal_meaning(code):
    """What a shell's exit code above 128 says: 128 + the number of the signal that
    killed the program it ran (137: SIGKILL, the out-of-memory killer's, or kill -9)."""
    if isinstance(code, bool) or not isinstance(code, int) or not 128 < code < 128 + 65:
        return ""
    try:
        return f" (128 + {code - 128}: the program was killed by {signal.Signals(code - 128).name})"
    except ValueError:
        return ""


def limit_reason(limit, node, limits):
    """A limit of pillar ``mpi:limits`` that a job ran into, in words."""
    if limit == "memory":
        return (f"memory limit exceeded on {node} ({limits['memory_per_slot_mb']} MiB per "
                "slot, mpi:limits:memory_per_slot_mb); a rank was killed")
    return (f"process limit reached on {node} ({limits['pids_per_slot']} processes per slot, "
            "mpi:limits:pids_per_slot)")


def alive(nodes, now):
    """The nodes heard from within NODE_TIMEOUT."""
    return {n for n, seen in nodes.items() if now - seen["last_seen"] <= NODE_TIMEOUT}


def _job_evidence(nodes, node, job_id):
    """This node's usable report and its view of the job: (report, job info or None)."""
    seen = nodes.get(node) or {}
    report = seen.get("report")
    if not seen.get("usable", True) or not isinstance(report, dict):
        return None, None
    jobs = report.get("jobs")
    info = jobs.get(job_id) if isinstance(jobs, dict) else None
    return report, info if isinstance(info, dict) else None


def _limit_hit(record, nodes):
    """(node, limit) of the first memory or pids limit any of the job's nodes saw."""
    for node in record["placement"]:
        _, info = _job_evidence(nodes, node, record["job_id"])
        found = (info or {}).get("limits_hit")
        hit = [limit for limit in found if limit in LIMITS] if isinstance(found, list) else []
        if hit:
            return node, hit[0]
    return None


def _lost(record, nodes, now):
    lost = [n for n in record["placement"]
            if now - (nodes.get(n) or {}).get("last_seen", 0) > NODE_TIMEOUT]
    if not lost:
        return None
    return (f"{'nodes' if len(lost) > 1 else 'node'} {', '.join(lost)} stopped answering "
            f"(no report for over {NODE_TIMEOUT} s)")


def _node_fault(node, record, report, info):
    """Why this node's report says the running job is broken, or None."""
    if report.get("time", 0) < record["started"] + REPORT_SKEW:
        # Taken before the job's containers were all up: what it lacks says nothing yet.
        return None
    if report.get("engine") != "ok":
        return f"the Docker engine on {node} is not answering: {str(report.get('engine'))[:200]}"
    if info is None:
        return f"the job's containers on {node} are gone"
    containers = info.get("containers") or {}
    if node == next(iter(record["placement"])) and \
            containers.get("launcher") not in ("running", "created"):
        return f"the launcher container on {node} is gone"
    if containers.get("worker") not in ("running", "created"):
        return f"the worker container on {node} is gone"
    unreachable = info.get("unreachable_peers")
    if unreachable and isinstance(unreachable, list):
        names = {a: n for n, a in (record.get("job_addresses") or {}).items()}
        peers = sorted(str(names.get(a, a)) for a in unreachable)
        return f"{node} cannot reach {', '.join(peers)[:200]} (network partition)"
    return None


def verdict(record, nodes, now, judge_silence=True):
    """
    Whether a job must end now: ``(state, reason, fields)`` or None.

    record
        The job's record (``state``, ``placement``, ``started``, ``deadline``, ...).
    nodes
        ``{node: evidence}`` as described in the module docstring.
    now
        The master's clock.
    judge_silence
        False while the engine has just started and nodes had no chance to report: a
        silent node is then not yet a lost one.

    In order: a cancel request; while starting, a failed start or the start timeout; then the launcher's
    exit (the program's own verdict, named after a limit when one was hit), a memory or
    process limit, the walltime, a lost node, and last what each node's report shows.
    """
    cancel = record.get("cancel_requested")
    if cancel and record["state"] not in FINAL:
        return "cancelled", str(cancel), {}
    if record["state"] == "starting":
        if record.get("start_error"):
            return "failed", f"could not start: {record['start_error']}", {}
        since = record["history"][-1]["at"]
        if now - since > START_TIMEOUT:
            return "failed", f"did not start within {START_TIMEOUT} seconds", {}
        return None
    if record["state"] != "running":
        return None
    limits = record["spec"]["config"]["limits"]
    launcher_node = next(iter(record["placement"]))
    _, launcher = _job_evidence(nodes, launcher_node, record["job_id"])
    if launcher and launcher.get("launcher_exit_code") is not None:
        code, failure = launcher["launcher_exit_code"], launcher.get("failure")
        state, reason = outcome(code, failure, record["cmd"])
        hit = _limit_hit(record, nodes) if code else None
        if hit:
            reason = limit_reason(hit[1], hit[0], limits)
        return state, reason, {"exit_code": code, "failure": failure}
    hit = _limit_hit(record, nodes)
    if hit:
        return "failed", limit_reason(hit[1], hit[0], limits), {}
    if now > record["deadline"]:
        return "timed_out", f"walltime of {record['walltime']} seconds exceeded", {}
    if judge_silence:
        lost = _lost(record, nodes, now)
        if lost:
            return "failed", lost, {}
    for node in record["placement"]:
        if now - (nodes.get(node) or {}).get("last_seen", 0) > NODE_TIMEOUT:
            continue  # silent: judged by silence above, once that is allowed
        report, info = _job_evidence(nodes, node, record["job_id"])
        if report is None:
            continue
        fault = _node_fault(node, record, report, info)
        if fault:
            return "failed", fault, {}
    return None


def leftovers(report, records):
    """Job ids this node reports (containers or secrets) whose job is over or unknown
    to the master: ``records`` maps job id to its record or None."""
    jobs = (report or {}).get("jobs")
    if not isinstance(jobs, dict):
        return []
    return [job_id for job_id in jobs
            if records.get(job_id) is None or records[job_id]["state"] in FINAL]
