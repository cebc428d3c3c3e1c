"""Unit tests of the rules that end a job (``dmpi.jobs.rules``): pure functions of a record,
its nodes' evidence and the time."""

import pytest

from dmpi.jobs import rules

JOB = "20261201-100000-abcdef"
NOW = 10_000.0
LIMITS = {"memory_per_slot_mb": 512, "pids_per_slot": 128}


def _record(state="running", **fields):
    record = {
        "job_id": JOB, "state": state, "placement": {"node1": 2, "node2": 2},
        "started": NOW - 100, "deadline": NOW + 100, "walltime": 200,
        "cmd": ["python3", "pi.py"], "history": [{"state": state, "at": NOW - 100}],
        "job_addresses": {"node1": "10.0.1.130", "node2": "10.0.1.131"},
        "spec": {"config": {"limits": LIMITS}},
    }
    record.update(fields)
    return record


def _job(**fields):
    job = {"containers": {"worker": "running", "launcher": "running"},
           "launcher_exit_code": None, "failure": None, "limits_hit": [],
           "unreachable_peers": []}
    job.update(fields)
    return job


def _nodes(node1=None, node2=None, seen=NOW):
    """Evidence: both nodes heard at ``seen``, each running the job unless told."""
    jobs = {"node1": node1 if node1 is not None else _job(),
            "node2": node2 if node2 is not None else _job(containers={"worker": "running"})}
    return {n: {"last_seen": seen, "usable": True,
                "report": {"engine": "ok", "time": NOW,
                           "jobs": {JOB: jobs[n]} if jobs[n] else {}}}
            for n in ("node1", "node2")}


def test_a_healthy_running_job_goes_on():
    assert rules.verdict(_record(), _nodes(), NOW) is None


def test_a_cancel_request_ends_any_unfinished_job():
    for state in ("queued", "starting", "running"):
        assert rules.verdict(_record(state, cancel_requested="by alice"), _nodes(), NOW) == \
            ("cancelled", "by alice", {})


def test_the_launcher_exit_is_the_programs_verdict():
    ok = rules.verdict(_record(), _nodes(node1=_job(launcher_exit_code=0)), NOW)
    assert ok == ("succeeded", None, {"exit_code": 0, "failure": None})
    failure = {"rank": 1, "exit_code": 3}
    bad = rules.verdict(_record(), _nodes(node1=_job(launcher_exit_code=3, failure=failure)),
                        NOW)
    assert bad == ("failed", "rank 1 exited with code 3", {"exit_code": 3, "failure": failure})


def test_a_launcher_that_lost_a_nodes_daemon_failed_the_job_even_if_it_exited_0():
    lost = {"lost_daemon": "mpirun lost the daemon of one of the job's nodes"}
    assert rules.outcome(0, lost, ["python3"]) == (
        "failed", "mpirun lost the daemon of one of the job's nodes")


@pytest.mark.parametrize("failure, reason", [
    ({"rank": 2, "signal": 11, "signal_name": "SIGSEGV"}, "rank 2 died of SIGSEGV"),
    ({"rank": 0, "exit_code": 127}, "rank 0: program 'python3' was not found in the image"),
    ({"rank": 0, "exit_code": 126}, "rank 0: program 'python3' cannot be executed"),
    (None, "mpirun exited with code 5"),
])
def test_outcomes_are_explained(failure, reason):
    state, text = rules.outcome(5, failure, ["python3"])
    assert state == "failed" and text.startswith(reason)


@pytest.mark.parametrize("code, failure, start", [
    (1, {"rank": 2, "exit_code": 1, "space": "Disk quota exceeded"}, "rank 2 exited with code 1"),
    (1, {"space": "No space left on device"}, "mpirun exited with code 1"),
])
def test_a_job_that_ran_out_of_room_is_told_where(code, failure, start):
    state, reason = rules.outcome(code, failure, ["python3"])
    assert state == "failed" and reason == (
        f"{start}; it reported {failure['space']!r}: the user's directory (/data) is full or "
        "over its quota, or /tmp is full (mpi:limits:tmp_size_mb)")


def test_a_job_that_left_its_users_directory_full_is_told_so_without_having_said_it():
    # Its output could not be written: the directory was full.
    assert rules.outcome(1, {"directory_full": True}, ["python3"]) == (
        "failed", "mpirun exited with code 1; the user's directory (/data) has no room "
        "left: its quota is used up (mpi usage shows it) or the shared storage is full")
    # What the job said comes first.
    _, reason = rules.outcome(1, {"space": "Disk quota exceeded", "directory_full": True},
                              ["python3"])
    assert "it reported 'Disk quota exceeded'" in reason and "no room left" not in reason
    assert rules.outcome(0, {"directory_full": True}, ["sh"]) == ("succeeded", None)


def test_a_job_that_succeeded_is_not_told_it_ran_out_of_room():
    assert rules.outcome(0, {"space": "No space left on device"}, ["sh"]) == ("succeeded", None)


@pytest.mark.parametrize("code, failure, reason", [
    (137, None, "mpirun exited with code 137 (128 + 9: the program was killed by SIGKILL)"),
    (1, {"rank": 3, "exit_code": 143},
     "rank 3 exited with code 143 (128 + 15: the program was killed by SIGTERM)"),
    (200, None, "mpirun exited with code 200"),
    (128, None, "mpirun exited with code 128"),
    (127, None, "program 'sh' was not found in the image"),
])
def test_a_shells_exit_code_above_128_names_the_signal(code, failure, reason):
    assert rules.outcome(code, failure, ["sh"]) == ("failed", reason)


def test_a_limit_names_the_reason_even_when_mpirun_reports_the_exit():
    nodes = _nodes(node1=_job(launcher_exit_code=137),
                   node2=_job(containers={"worker": "running"}, limits_hit=["memory"]))
    state, reason, fields = rules.verdict(_record(), nodes, NOW)
    assert state == "failed" and reason.startswith("memory limit exceeded on node2 (512 MiB")
    assert fields["exit_code"] == 137


def test_a_limit_hit_ends_a_running_job():
    nodes = _nodes(node2=_job(containers={"worker": "running"}, limits_hit=["pids"]))
    assert rules.verdict(_record(), nodes, NOW)[1].startswith("process limit reached on node2")


def test_walltime():
    assert rules.verdict(_record(deadline=NOW - 1), _nodes(), NOW)[:2] == \
        ("timed_out", "walltime of 200 seconds exceeded")


def test_a_silent_node_is_lost_after_the_timeout_unless_silence_is_not_judged_yet():
    nodes = _nodes()
    nodes["node2"]["last_seen"] = NOW - rules.NODE_TIMEOUT - 0.1
    assert rules.verdict(_record(), nodes, NOW)[1] == \
        "node node2 stopped answering (no report for over 5 s)"
    assert rules.verdict(_record(), nodes, NOW, judge_silence=False) is None
    nodes["node2"]["last_seen"] = NOW - rules.NODE_TIMEOUT + 0.1
    assert rules.verdict(_record(), nodes, NOW) is None


def test_what_a_report_shows():
    gone = rules.verdict(_record(), _nodes(node2={}), NOW)
    assert gone[1] == "the job's containers on node2 are gone"
    worker = _nodes(node2=_job(containers={"worker": "exited"}))
    assert rules.verdict(_record(), worker, NOW)[1] == "the worker container on node2 is gone"
    launcher = _nodes(node1=_job(containers={"worker": "running", "launcher": None}))
    assert rules.verdict(_record(), launcher, NOW)[1] == \
        "the launcher container on node1 is gone"
    cut = _nodes(node1=_job(unreachable_peers=["10.0.1.131"]))
    assert rules.verdict(_record(), cut, NOW)[1] == \
        "node1 cannot reach node2 (network partition)"
    engine = _nodes()
    engine["node2"]["report"] = {"engine": "connection refused", "time": NOW, "jobs": {}}
    assert rules.verdict(_record(), engine, NOW)[1].startswith(
        "the Docker engine on node2 is not answering")


def test_a_report_taken_before_the_job_started_says_nothing_about_it():
    nodes = _nodes(node2={})
    nodes["node2"]["report"]["time"] = NOW - 100  # = started: containers not up yet
    assert rules.verdict(_record(), nodes, NOW) is None


def test_an_unusable_report_is_not_evidence_but_the_heartbeat_counts():
    nodes = _nodes(node2={})
    nodes["node2"]["usable"] = False
    assert rules.verdict(_record(), nodes, NOW) is None


def test_starting_jobs_end_on_a_failed_start_or_the_timeout():
    assert rules.verdict(_record("starting", start_error="boom"), {}, NOW) == \
        ("failed", "could not start: boom", {})
    late = _record("starting", history=[{"state": "starting",
                                         "at": NOW - rules.START_TIMEOUT - 1}])
    assert rules.verdict(late, {}, NOW)[1] == "did not start within 90 seconds"
    assert rules.verdict(_record("starting", history=[{"state": "starting", "at": NOW}]),
                         {}, NOW) is None


def test_final_and_queued_jobs_have_no_verdict():
    assert rules.verdict(_record("queued"), _nodes(), NOW) is None
    assert rules.verdict(_record("failed", cancel_requested="x"), _nodes(), NOW) is None


@pytest.mark.parametrize("report", [None, {}, {"jobs": None}, {"jobs": []},
                                    {"jobs": {JOB: "junk"}}, {"jobs": {JOB: {"limits_hit": 7}}}])
def test_odd_reports_never_raise(report):
    nodes = {"node1": {"last_seen": NOW, "usable": True, "report": report},
             "node2": {"last_seen": NOW, "usable": True, "report": report}}
    rules.verdict(_record(), nodes, NOW)


def test_leftovers_are_jobs_over_or_unknown():
    report = {"jobs": {"a": {}, "b": {}, "c": {}}}
    records = {"a": {"state": "running"}, "b": {"state": "failed"}, "c": None}
    assert rules.leftovers(report, records) == ["b", "c"]
    assert rules.leftovers({"jobs": []}, {}) == []


# ------------------------------------------------------------- silence and probes


def _silent(nodes, node="node2", silent_for=10, probe=None):
    nodes[node]["last_seen"] = NOW - silent_for
    if probe is not None:
        nodes[node]["probe"] = probe
    return nodes


def _answer(answered=True, age=1, detail="its host answers on port 22 (connection refused)"):
    return {"started": NOW - age, "answered": answered, "detail": detail}


def test_a_silent_node_whose_host_answers_is_kept_within_the_grace():
    nodes = _silent(_nodes(), probe=_answer())
    assert rules.verdict(_record(), nodes, NOW, silent_grace=90) is None
    judged = rules.silence(_record(), nodes, NOW, silent_grace=90)
    assert judged == {"node2": {"lost": False, "since": NOW - 10, "kept_until": NOW + 80,
                                "host": "its host answers on port 22 (connection refused)"}}


def test_without_a_grace_silence_alone_is_judged_as_before():
    nodes = _silent(_nodes(), probe=_answer())
    assert rules.verdict(_record(), nodes, NOW)[1] == \
        "node node2 stopped answering (no report for over 5 s)"


@pytest.mark.parametrize("probe, words", [
    (None, "its host was not probed in time"),
    (_answer(age=rules.PROBE_FRESH + 1), "its host was not probed in time"),
    (_answer(age=11), "its host was not probed in time"),  # taken before the silence
    (_answer(answered=False, detail="no answer from 10.0.0.12 port 22 within 1.0 s"),
     "its host does not answer: no answer from 10.0.0.12 port 22"),
])
def test_a_silent_node_is_lost_as_fast_as_before_when_its_host_does_not_answer(probe, words):
    nodes = _silent(_nodes(), probe=probe)
    state, reason, _ = rules.verdict(_record(), nodes, NOW, silent_grace=90)
    assert state == "failed" and reason.startswith("node node2 stopped answering")
    assert words in reason


def test_a_silent_node_is_lost_when_the_grace_runs_out():
    nodes = _silent(_nodes(), silent_for=91, probe=_answer())
    reason = rules.verdict(_record(), nodes, NOW, silent_grace=90)[1]
    assert "for 91 s although its host answers" in reason
    assert "mpi:engine:silent_grace (90 s)" in reason


def test_a_silent_node_that_a_peer_cannot_reach_is_lost_although_its_host_answers():
    nodes = _silent(_nodes(node1=_job(unreachable_peers=["10.0.1.131"])), probe=_answer())
    reason = rules.verdict(_record(), nodes, NOW, silent_grace=90)[1]
    assert "node2 stopped answering" in reason and "node1 cannot reach" in reason


def test_a_silent_peers_old_report_is_no_evidence_about_another_silent_node():
    # Both silent (e.g. a Salt upgrade everywhere): node1's last report is stale.
    nodes = _silent(_silent(_nodes(node1=_job(unreachable_peers=["10.0.1.131"])),
                            node="node1", probe=_answer()), probe=_answer())
    assert rules.verdict(_record(), nodes, NOW, silent_grace=90) is None


def test_probes_start_before_silence_is_judged_and_not_every_pass():
    assert not rules.probe_due({"last_seen": NOW - rules.PROBE_AFTER}, NOW, None)
    assert rules.probe_due({"last_seen": NOW - rules.PROBE_AFTER - 0.5}, NOW, None)
    assert rules.PROBE_AFTER + 1 < rules.NODE_TIMEOUT  # one second for the answer
    assert not rules.probe_due({"last_seen": NOW - 10}, NOW, NOW - rules.PROBE_EVERY + 1)
    assert rules.probe_due({"last_seen": NOW - 10}, NOW, NOW - rules.PROBE_EVERY)


# ------------------------------------------------------------------- eligibility

HEALTHY = {"docker": "ok", "storage": "ok", "images": ["r@sha256:" + "a" * 64],
           "job_ca": "ok", "agent": "ok", "job_ca_public": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeJobCaPublicKeyForTestsOnly0000000000000"}


@pytest.mark.parametrize("seen, drain, problem", [
    ({"health": HEALTHY}, None, None),
    ({"health": HEALTHY}, {"reason": "disk swap"}, "drained (disk swap)"),
    ({}, None, "unhealthy: no health report yet"),
    ({"health": dict(HEALTHY, docker="refused")}, None,
     "unhealthy: Docker engine not answering (refused)"),
    ({"health": dict(HEALTHY, storage="not writable: read-only")}, None,
     "unhealthy: storage not writable: read-only"),
    ({"health": dict(HEALTHY, storage="not mounted")}, None, "unhealthy: storage not mounted"),
    # full, not broken: one user who fills the file system must not stop everyone's jobs
    ({"health": dict(HEALTHY, storage="full: No space left on device")}, None, None),
    ({"health": dict(HEALTHY, storage="fullish")}, None, "unhealthy: storage fullish"),
    ({"health": {k: v for k, v in HEALTHY.items() if not k.startswith("job_ca")}}, None,
     "unhealthy: no job CA reported"),
    ({"health": dict(HEALTHY, job_ca="cannot make the job CA /x: [Errno 28] No space")},
     None, "unhealthy: cannot make the job CA /x: [Errno 28] No space"),
    ({"health": {k: v for k, v in HEALTHY.items() if k != "agent"}}, None,
     "unhealthy: no remote-start agent reported"),
    ({"health": dict(HEALTHY, agent="this node has no remote-start agent at /a")}, None,
     "unhealthy: this node has no remote-start agent at /a"),
])
def test_node_problems(seen, drain, problem):
    assert rules.node_problem(seen, drain) == problem


def test_has_image_is_by_the_exact_digest_reference():
    assert rules.has_image({"health": HEALTHY}, "r@sha256:" + "a" * 64)
    assert not rules.has_image({"health": HEALTHY}, "r@sha256:" + "b" * 64)
    assert not rules.has_image({}, "r@sha256:" + "a" * 64)
    assert not rules.has_image({"health": {"images": "junk"}}, "r@sha256:" + "a" * 64)


def test_waiting_reasons_name_the_nodes_a_job_cannot_use():
    problems = {"node2": "drained (disk swap)", "node3": "unhealthy: storage not mounted"}
    assert rules.waiting_reason("user limit", ["node2"], problems, set(), "mpi") == \
        "user limit"
    assert rules.waiting_reason("resources", ["node1"], problems, set(), "mpi") == \
        "resources"
    assert rules.waiting_reason("resources", ["node2"], problems, set(), "mpi") == \
        "node2 drained (disk swap)"
    assert rules.waiting_reason("resources", ["node1", "node2", "node3"], problems, {"node1"},
                                "mpi") == ("image mpi being pulled on node1; node2 drained "
                                           "(disk swap); node3 unhealthy: storage not mounted")
    assert rules.waiting_reason("resources", ["node1", "node2"], problems, set(), "mpi") == \
        "resources; node2 drained (disk swap)"


def test_ranks_not_where_placed_is_the_reason_before_the_ranks_exit_code():
    failure = {"rank": 3, "exit_code": 86,
               "placement": "rank 3 shares its node with 5 ranks where 3 were placed "
                            "(nodes node1,node2: 2,3 ranks)"}
    assert rules.outcome(86, failure, ["./a.out"]) == (
        "failed", "ranks did not run where they were placed: rank 3 shares its node with 5 "
                  "ranks where 3 were placed (nodes node1,node2: 2,3 ranks)")
