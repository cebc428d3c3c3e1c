"""
The rules that end a DockerMPI job: pure functions of a job's record, the evidence its
nodes sent and the time. No Salt, no I/O; the job controller (:mod:`dmpi.master.controller`) applies them.

Evidence of a node is what the controller knows of it::

    {"last_seen": unix time of its last heartbeat or report,
     "report": its latest report (``mpi_job.report`` plus ``unreachable_peers``),
     "usable": False while that report cannot be trusted (the node said its report
               failed, or the controller missed a change), so only silence counts,
     "health": the node's latest health evidence (``mpi_job.health``), kept from the
               last report that carried it,
     "probe": the controller's last look at the node's host while it was silent:
              {"started": unix time, "answered": bool, "detail": words}}

A silent node is not always a lost one: a minion restart or a Salt upgrade silences
the node while its Docker engine, containers and network are fine. So silence alone
ends a job only when the controller could not reach the node's host either, when a peer
says the job's containers there are unreachable, or when the silence outlasted the
grace (pillar ``mpi:engine:silent_grace``).
"""

import signal

from dmpi.contract import ACTIVE, FINAL, STORAGE_FULL

NODE_TIMEOUT = 5  # seconds without a heartbeat before a node counts as lost
# Seconds a silent node's slots still count toward the queue head's reservation (no job
# starts there meanwhile): a heartbeat late under load must not let a long job take the
# slots the head waits for; a node silent for longer no longer holds the head's place.
RESERVE_GRACE = 30
START_TIMEOUT = 90  # seconds a job may stay in "starting"
RESTART_GRACE = 15  # seconds after the controller starts before silent nodes count as lost
REPORT_SKEW = 1  # seconds a node's clock and report may lag behind the master
PROBE_AFTER = 3  # seconds of silence before the controller probes the node's host
PROBE_EVERY = 2  # seconds between probes of a host while its node stays silent
# A probe's answer speaks for the host for this long: a new one is due after
# PROBE_EVERY and takes at most a second, so a host that stops answering is judged lost
# within PROBE_EVERY + probe timeout + a pass of the clock.
PROBE_FRESH = 5


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
    """(state, reason) from the launcher's exit code and the failing rank, if known; a
    failure that wrote one of the out-of-space errors says where room ran out, and one
    whose user's directory was left full (perhaps too full to say so) says that."""
    state, reason = _outcome(code, failure, program)
    space = (failure or {}).get("space") if state == "failed" else None
    if isinstance(space, str) and space:
        reason += (f"; it reported {space[:40]!r}: the user's directory (/data) is full or "
                   "over its quota, or /tmp is full (mpi:limits:tmp_size_mb)")
    elif state == "failed" and (failure or {}).get("directory_full"):
        reason += ("; the user's directory (/data) has no room left: its quota is used up "
                   "(mpi usage shows it) or the shared storage is full")
    return state, reason


def _outcome(code, failure, program):
    if failure and failure.get("lost_daemon"):
        return "failed", str(failure["lost_daemon"])[:300]
    if code == 0:
        return "succeeded", None
    if failure and failure.get("placement"):
        return "failed", f"ranks did not run where they were placed: {failure['placement']}"
    if failure and "rank" in failure and "signal" in failure:
        return "failed", f"rank {failure['rank']} died of {failure['signal_name']}"
    if failure and "rank" in failure and failure.get("exit_code") in SHELL_EXITS:
        return "failed", (f"rank {failure['rank']}: program {str(program[0])[:100]!r} "
                          f"{SHELL_EXITS[failure['exit_code']]}")
    if failure and "rank" in failure:
        return "failed", (f"rank {failure['rank']} exited with code {failure['exit_code']}"
                          f"{_signal_meaning(failure['exit_code'])}")
    if code in SHELL_EXITS:  # mpirun passes on the first failing rank's code
        return "failed", f"program {str(program[0])[:100]!r} {SHELL_EXITS[code]}"
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


def probe_due(seen, now, last_probe):
    """Whether the controller should probe a node's host now: it is silent for over
    PROBE_AFTER (before NODE_TIMEOUT, so the answer is in when silence is judged) and
    its last probe (``last_probe``: when it started, or None) is older than PROBE_EVERY."""
    if now - seen.get("last_seen", 0) <= PROBE_AFTER:
        return False
    return last_probe is None or now - last_probe >= PROBE_EVERY


def _peers_cut_off(node, record, nodes, now):
    """The job's other nodes, reporting now, that say they cannot reach the job's
    container on ``node``."""
    address = (record.get("job_addresses") or {}).get(node)
    if not address:
        return []
    found = []
    for peer in record["placement"]:
        seen = nodes.get(peer) or {}
        if peer == node or now - seen.get("last_seen", 0) > NODE_TIMEOUT:
            continue
        _, info = _job_evidence(nodes, peer, record["job_id"])
        unreachable = (info or {}).get("unreachable_peers")
        if isinstance(unreachable, list) and address in unreachable:
            found.append(peer)
    return found


def silence(record, nodes, now, silent_grace=0):
    """
    How to take the silence of a running job's nodes: ``{node: judgement}`` for each
    node of its placement silent for over NODE_TIMEOUT, where a judgement is
    ``{"lost": True, "why": words}`` or, while the job is kept,
    ``{"lost": False, "since": last heard, "kept_until": time, "host": words}``.

    A silent node is kept while its host answered the controller's latest probe (taken
    during this silence and at most PROBE_FRESH old), no peer of the job reports the
    job's container there unreachable, and the silence is shorter than
    ``silent_grace`` seconds. Anything else is lost, as fast as silence alone was.
    """
    judged = {}
    for node in record["placement"]:
        seen = nodes.get(node) or {}
        last = seen.get("last_seen", 0)
        if now - last <= NODE_TIMEOUT:
            continue
        probe = seen.get("probe") if isinstance(seen.get("probe"), dict) else {}
        fresh = probe.get("started", 0) > last and now - probe["started"] <= PROBE_FRESH
        cut_off = _peers_cut_off(node, record, nodes, now)
        if cut_off:
            why = f"and {', '.join(cut_off)} cannot reach the job's container there"
        elif not silent_grace:
            why = None
        elif not fresh:
            why = "and its host was not probed in time"
        elif not probe.get("answered"):
            why = f"and its host does not answer: {str(probe.get('detail'))[:200]}"
        elif now - last > silent_grace:
            why = (f"for {int(now - last)} s although its host answers: longer than "
                   f"mpi:engine:silent_grace ({silent_grace} s)")
        else:
            judged[node] = {"lost": False, "since": last, "kept_until": last + silent_grace,
                            "host": str(probe.get("detail"))[:200]}
            continue
        judged[node] = {"lost": True, "why": why}
    return judged


def _lost(record, nodes, now, silent_grace=0):
    lost = {n: j["why"] for n, j in silence(record, nodes, now, silent_grace).items()
            if j["lost"]}
    if not lost:
        return None
    plain = [n for n, why in lost.items() if why is None]
    reasons = []
    if plain:
        reasons.append(f"{'nodes' if len(plain) > 1 else 'node'} {', '.join(plain)} stopped "
                       f"answering (no report for over {NODE_TIMEOUT} s)")
    reasons += [f"node {n} stopped answering (no report for over {NODE_TIMEOUT} s) {why}"
                for n, why in lost.items() if why is not None]
    return "; ".join(reasons)


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


def verdict(record, nodes, now, judge_silence=True, silent_grace=0):
    """
    Whether a job must end now: ``(state, reason, fields)`` or None.

    record
        The job's record (``state``, ``placement``, ``started``, ``deadline``, ...).
    nodes
        ``{node: evidence}`` as described in the module docstring.
    now
        The master's clock.
    judge_silence
        False while the controller has just started and nodes had no chance to report: a
        silent node is then not yet a lost one.
    silent_grace
        Seconds a silent node whose host still answers is given (see :func:`silence`);
        0 judges silence alone, whatever the probe of the host says.

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
        lost = _lost(record, nodes, now, silent_grace)
        if lost:
            return "failed", lost, {}
    for node in record["placement"]:
        if now - (nodes.get(node) or {}).get("last_seen", 0) > NODE_TIMEOUT:
            continue  # silent: judged by silence above (and kept, or not yet judged)
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


# ------------------------------------------------------------------- eligibility


def node_problem(seen, drain=None):
    """
    Why a reporting node may take no new job whatever its image, or None: drained by
    an admin, or unhealthy by its own health evidence (``seen["health"]``: the Docker
    engine answering, shared storage mounted and writable, or answering but full, a job
    CA to certify the job's keys with, the remote-start agent the job's containers
    mount). A node that never sent health evidence is not known to be healthy, so it
    takes nothing yet.
    """
    if drain:
        return f"drained ({str(drain.get('reason') or 'no reason given')[:200]})"
    health = seen.get("health")
    if not isinstance(health, dict):
        return "unhealthy: no health report yet"
    if health.get("docker") != "ok":
        return f"unhealthy: Docker engine not answering ({str(health.get('docker'))[:200]})"
    storage = str(health.get("storage"))
    if storage != "ok" and not storage.startswith(STORAGE_FULL + ":"):
        return f"unhealthy: storage {storage[:200]}"
    if health.get("job_ca") != "ok" or not isinstance(health.get("job_ca_public"), str):
        return f"unhealthy: {str(health.get('job_ca') or 'no job CA reported')[:200]}"
    if health.get("agent") != "ok":
        return f"unhealthy: {str(health.get('agent') or 'no remote-start agent reported')[:200]}"
    return None


def selftest_withheld(verdicts, selftest_settings):
    """``{node: why}`` of the nodes that take no job but the self-test's own: with
    ``mpi:selftest:exclude_failed_nodes``, those the last self-test of them found at fault
    (``verdicts``: :func:`dmpi.master.selftest.kept_verdicts`)."""
    if not (selftest_settings or {}).get("exclude_failed_nodes"):
        return {}
    return {node: f"failed the network self-test ({str(verdict['at_fault'])[:200]}); "
                  "salt-run mpi.selftest tests it again"
            for node, verdict in (verdicts or {}).items()
            if isinstance(verdict, dict) and verdict.get("at_fault")}


def has_image(seen, image_ref):
    """Whether the node's health evidence shows ``image_ref`` (repo@sha256:...) present."""
    images = (seen.get("health") or {}).get("images") if isinstance(seen, dict) else None
    return isinstance(images, list) and image_ref in images


def waiting_reason(base, candidates, problems, pulling, image, shown=4):
    """
    Why a queued job waits, in words: the scheduler's ``base`` reason ("resources",
    "user limit", ...) and, when the job waits for resources, which of its
    ``candidates`` are left out: ``problems`` ``{node: words}`` (drained, unhealthy)
    and ``pulling`` (nodes pulling the job's ``image`` for it). With none of its
    candidates usable the left-out nodes are the whole reason.
    """
    if base != "resources":
        return base
    out = [n for n in candidates if n in problems or n in pulling]
    if not out:
        return base
    parts = []
    pulls = [n for n in out if n in pulling and n not in problems]
    if pulls:
        more = f" and {len(pulls) - shown} more" if len(pulls) > shown else ""
        parts.append(f"image {image} being pulled on {', '.join(pulls[:shown])}{more}")
    troubled = [n for n in out if n in problems]
    parts += [f"{n} {problems[n]}" for n in troubled[:shown]]
    if len(troubled) > shown:
        parts.append(f"{len(troubled) - shown} more nodes unusable")
    text = "; ".join(parts)
    return text if len(out) == len(set(candidates)) else f"resources; {text}"
