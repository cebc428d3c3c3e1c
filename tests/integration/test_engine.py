"""The job controller on the real test cluster: what users can and cannot reach, a bad pillar,
a start that fails, and the master's event-driven evidence."""

import json
import time

import pytest
import yaml

pytestmark = pytest.mark.cluster

SITE_PILLAR = "/srv/pillar-local/testcluster_images.sls"


@pytest.fixture(autouse=True)
def nothing_left_behind(cluster):
    yield
    active, left = cluster.settle()
    assert active == [] and left == {}


def test_the_engine_is_not_a_salt_function_users_could_call(cluster):
    for fun in ("mpi.node_report", "mpi.tick", "mpi.schedule", "mpi_master.start"):
        # (salt-run exits 0 even then: judge what it says)
        _, output = cluster.salt(["salt-run", fun], check=False)
        assert f"'{fun}' is not available" in output, (fun, output)


def test_the_newcomer_path_finds_the_engine_serving(cluster):
    # What `up` checks before it says the cluster is up: the runner answers a dict and
    # every node's evidence reaches the engine.
    assert cluster.engine_answers() is None


def _node_slots(cluster):
    """The slots per node the engine plans with (mpi.nodes shows the engine's settings)."""
    _, nodes = cluster.run_json("mpi.nodes")
    return {info["slots"] for info in nodes.values()}


def _until_node_slots(cluster, slots, timeout=120):
    deadline = time.monotonic() + timeout
    while _node_slots(cluster) != {slots}:
        assert time.monotonic() < deadline, (
            f"the engine still plans with {_node_slots(cluster)} slots per node, not {slots}")
        time.sleep(1)


def test_a_pillar_change_reaches_the_idle_engine_without_a_submit(cluster):
    """Nothing is submitted: the engine reads the site's settings itself (every 5 s on
    this cluster), so an idle queue plans with what the pillar says now."""
    original = cluster.read("master", ["cat", SITE_PILLAR])
    (slots,) = _node_slots(cluster)
    changed = yaml.safe_load(original)
    changed["mpi"]["slots_per_node"] = slots + 1
    try:
        cluster.put_file("master", SITE_PILLAR, yaml.safe_dump(changed).encode())
        _until_node_slots(cluster, slots + 1)
    finally:
        cluster.put_file("master", SITE_PILLAR, original.encode())
    code, settings = cluster.run_json("mpi.settings")
    assert code == 0 and settings["slots_per_node"] == slots, settings
    assert _node_slots(cluster) == {slots}


def test_a_bad_pillar_fails_submit_and_highstate_with_a_clear_message(cluster):
    original = cluster.read("master", ["cat", SITE_PILLAR])
    bad = yaml.safe_load(original)
    bad["mpi"]["ports"] = {"sshd": [20000, 20000], "oob": [20100, 20299],
                           "btl": [20250, 20999]}
    try:
        cluster.put_file("master", SITE_PILLAR, yaml.safe_dump(bad).encode())
        cluster.salt(["salt", "*", "saltutil.refresh_pillar", "wait=True"])
        code, job = cluster.run_json("mpi.submit", user="alice", image="mpi", np=1,
                                     cmd="hostname")
        assert code == 1 and job["state"] == "rejected"
        assert "mpi:ports:oob 20100-20299 overlaps mpi:ports:btl 20250-20999" in job["error"]
        _, queued = cluster.run_json("mpi.list", state="queued,starting,running")
        assert queued == []
        code, states = cluster.salt_json(["salt", cluster.nodes[0], "state.apply", "test=True"])
        results = states[cluster.nodes[0]]
        check = next(v for k, v in results.items() if "mpi-config-settings-valid" in k)
        assert check["result"] is False
        assert "mpi:ports:oob 20100-20299 overlaps mpi:ports:btl 20250-20999" in check["comment"]
        assert all(not v.get("changes") for v in results.values())
    finally:
        cluster.put_file("master", SITE_PILLAR, original.encode())
        cluster.salt(["salt", "*", "saltutil.refresh_pillar", "wait=True"])
    code, job = cluster.run_json("mpi.launch", user="alice", image="mpi", np=1, cmd="hostname")
    assert code == 0 and job["state"] == "succeeded", job


def test_a_start_that_fails_ends_the_job_once_with_the_reason(cluster):
    # A working directory that exists but that mpirun's command line cannot carry was
    # once accepted and then sat in "starting" with its worker up.
    cluster.as_user("alice", ["mkdir", "-p", "/srv/dockermpi/users/alice/a b"])
    code, job = cluster.run_json("mpi.launch", user="alice", image="mpi", np=2,
                                 cmd="hostname", workdir="a b", walltime="60s")
    assert code == 1
    if job["state"] != "rejected":
        assert job["state"] == "failed" and job["reason"].startswith("could not start"), job
        assert [h["state"] for h in job["history"]] == ["queued", "starting", "failed"]
    _, active = cluster.run_json("mpi.list", state="queued,starting,running")
    assert active == []


def test_launch_returns_with_the_result_before_the_clean_up(cluster):
    code, job = cluster.run_json("mpi.launch", user="alice", image="mpi", np=2,
                                 cmd="hostname")
    assert code == 0 and job["state"] == "succeeded"
    closed = cluster.closed(job["job_id"])
    assert closed["closed"] and closed["cleanup"]["pending"] == []
    status = json.loads(cluster.read_shared(job["output"]["status"]))
    assert status["state"] == "succeeded" and status["closed"] is True


def test_idle_nodes_send_heartbeats_not_reports(cluster):
    # With nothing running, a node's evidence does not change: the master hears a
    # heartbeat every 2 s and a full report every 10 s, not a report every second.
    code, events = cluster.exec("master", [
        "timeout", "12", "salt-run", "state.event", "tagmatch=mpi/node/*", "count=-1",
    ], check=False)
    lines = [line for line in events.splitlines() if line.startswith("mpi/node/")]
    reports = [l for l in lines if "/report" in l.split()[0]]
    alive = [l for l in lines if "/alive" in l.split()[0]]
    nodes = len(cluster.nodes)
    assert len(alive) >= 3 * nodes, lines
    assert len(reports) <= 2 * nodes, lines
