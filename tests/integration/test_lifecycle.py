"""The job queue and lifecycle on the real cluster: durable records, scheduling, and every
kind of failure ending in the right state with nothing left on any node.

Faults are made for real: firewall rules inside a node, a stopped minion or engine, a
removed container, a restarted master. Bounds come from the issue: a lost node fails its
job within 15 s of the cut; walltime and cancel clean up within 10 s.
"""

import time
import uuid

import pytest

from tests.cluster.testcluster import ClusterError

pytestmark = pytest.mark.cluster

SLEEPER = "sleep 300"


# --------------------------------------------------------------------------- helpers


def run(cluster, fun, retries=20, **kwargs):
    """salt-run on the master, retrying while the master restarts."""
    code = data = None
    for _ in range(retries):
        try:
            code, data = cluster.run_json(fun, **kwargs)
        except ClusterError:  # no JSON at all: the master is restarting
            time.sleep(1)
            continue
        if data != {}:  # {} is what an unreachable master gives
            return code, data
        time.sleep(1)
    raise AssertionError(f"{fun} never answered: {code} {data!r}")


def submit(cluster, **kwargs):
    kwargs.setdefault("image", "mpi")
    kwargs.setdefault("user", "lifecycle")
    code, job = run(cluster, "mpi.submit", **kwargs)
    assert code == 0 and job["state"] == "queued", job
    return job["job_id"]


def status(cluster, job_id):
    return run(cluster, "mpi.status", job_id=job_id)[1]


def wait_for(cluster, job_id, states, timeout):
    """Poll until the job is in one of states; returns its record."""
    deadline = time.monotonic() + timeout
    while True:
        job = status(cluster, job_id)
        if job["state"] in states and (job["state"] not in ("succeeded", "failed", "cancelled",
                                                            "timed_out") or "total" in job["timings"]):
            return job
        assert time.monotonic() < deadline, f"{job_id} still {job['state']} after {timeout}s"
        time.sleep(0.5)


def entered(job, state):
    """When the job entered a state (from its history)."""
    return next(h["at"] for h in job["history"] if h["state"] == state)


def containers_on(cluster, node, job_id):
    code, out = cluster.exec(node, ["docker", "ps", "-aq", "--filter", f"label=io.dockermpi.job={job_id}"],
                             check=False)
    return out.split() if code == 0 else None


def wait_clean(cluster, job_id, nodes, timeout):
    """Seconds until no container or key of the job is on the nodes."""
    start = time.monotonic()
    while True:
        left = {}
        for node in nodes:
            found = containers_on(cluster, node, job_id)
            code, _ = cluster.exec(node, ["test", "-e", f"/var/lib/dockermpi/jobs/{job_id}"], check=False)
            if found or found is None or code == 0:
                left[node] = found
        if not left:
            return time.monotonic() - start
        assert time.monotonic() - start < timeout, f"{job_id} left on {left} after {timeout}s"
        time.sleep(0.5)


@pytest.fixture(autouse=True)
def nothing_left_behind(cluster):
    """After every test no job is active and no job container or key remains on any node
    (given a moment for the queue to remove leftovers from a node that just came back).
    Stragglers are cancelled first, so one failing test does not fail the next ones."""
    yield
    active, left = cluster.settle()
    assert left == {}
    assert active == [], "the test left jobs queued or running"


def held(tag):
    """A job program that runs until the test releases it (no fixed sleeps to wait out)."""
    return ["/bin/sh", "-c", f"while [ ! -e /data/{tag} ]; do sleep 0.3; done"]


def release(cluster, user, tag):
    cluster.as_user(user, ["touch", f"/srv/dockermpi/users/{user}/{tag}"])


@pytest.fixture
def restore(cluster):
    """Undo faults made on nodes, whatever the test's outcome."""
    undo = []
    yield undo.append
    for node, argv in reversed(undo):
        cluster.exec(node, argv, check=False)


def wait_reporting(cluster, node, timeout=60):
    deadline = time.monotonic() + timeout
    while not run(cluster, "mpi.nodes")[1][node]["reachable"]:
        assert time.monotonic() < deadline, f"{node} does not report again"
        time.sleep(1)


# --------------------------------------------------------------------------- lifecycle


def test_submit_returns_at_once_and_the_record_tells_the_whole_story(cluster):
    started = time.monotonic()
    job_id = submit(cluster, np=4, cmd=["python3", "-c",
                                        "from mpi4py import MPI; print(MPI.COMM_WORLD.Get_rank())"])
    assert time.monotonic() - started < 10
    code, job = run(cluster, "mpi.wait", job_id=job_id, timeout=60)
    assert code == 0 and job["state"] == "succeeded", job
    assert [h["state"] for h in job["history"]] == ["queued", "starting", "running", "succeeded"]
    times = [h["at"] for h in job["history"]]
    assert times == sorted(times)
    _, out = run(cluster, "mpi.logs", job_id=job_id)
    assert sorted(out.split()) == ["0", "1", "2", "3"]
    _, listed = run(cluster, "mpi.list", user="lifecycle", state="succeeded")
    assert job_id in [j["job_id"] for j in listed]
    code, missing = run(cluster, "mpi.status", job_id="20000101-000000-000000")
    assert code == 1 and "no such job" in missing["error"]


def test_killing_the_submitting_salt_run_leaves_the_job_running_and_tracked(cluster):
    cluster.container("master").exec_run(
        ["salt-run", "mpi.launch", "user=detached", "image=mpi", "np=2", "cmd=sleep 6"], detach=True
    )
    deadline = time.monotonic() + 30
    while not (jobs := run(cluster, "mpi.list", user="detached", state="running")[1]):
        assert time.monotonic() < deadline
        time.sleep(0.5)
    cluster.exec("master", ["pkill", "-KILL", "-f", "salt-run mpi.launch user=detached"])
    job = wait_for(cluster, jobs[0]["job_id"], ("succeeded", "failed", "cancelled"), 60)
    assert job["state"] == "succeeded", job


def test_nodes_show_slots_use_and_jobs(cluster):
    job_id = submit(cluster, np=2, nodes="node3", cmd=SLEEPER)
    wait_for(cluster, job_id, ("running",), 30)
    _, nodes = run(cluster, "mpi.nodes")
    assert nodes["node3"] == dict(nodes["node3"], slots=2, used=2, jobs=[job_id], reachable=True,
                                  engine="ok")
    assert nodes["node1"]["used"] == 0
    run(cluster, "mpi.cancel", job_id=job_id)


# -------------------------------------------------------------------------- scheduling


def test_more_jobs_than_capacity_run_in_order_without_double_booking(cluster):
    # One user: fair share orders users by their recent usage, a user's own jobs by
    # submission.
    ids = [submit(cluster, np=6, cmd="sleep 1", user="order") for _ in range(4)]
    jobs = [wait_for(cluster, i, ("succeeded",), 120) for i in ids]
    starts = [entered(j, "running") for j in jobs]
    assert starts == sorted(starts), "jobs did not start in submission order"
    for earlier, later in zip(jobs, jobs[1:]):
        # Each job needs the whole cluster: the next may start only after the last ended.
        assert entered(later, "starting") >= earlier["ended"]


def test_backfill_uses_idle_slots_only_when_the_head_cannot_be_delayed(cluster):
    # Users new to the cluster: with no usage to rank them (fair share), the older job
    # is the head, also on a cluster where this test ran before.
    a, b, c, d = (f"bf-{uuid.uuid4().hex[:8]}" for _ in range(4))
    blocker = submit(cluster, np=4, nodes="node1,node2", cmd=SLEEPER, walltime="60s", user=a)
    wait_for(cluster, blocker, ("running",), 30)
    # head needs the whole cluster; short ends before the head could start; long_ would
    # hold node3 past that time.
    head = submit(cluster, np=6, cmd="hostname", user=b)
    short = submit(cluster, np=2, cmd="hostname", walltime="20s", user=c)
    long_ = submit(cluster, np=2, cmd=SLEEPER, walltime="10m", user=d)
    assert wait_for(cluster, short, ("succeeded",), 30)["state"] == "succeeded"
    waiting = {j["job_id"]: j for j in run(cluster, "mpi.list", state="queued")[1]}
    assert waiting[head]["waiting_for"] == "resources"
    assert waiting[long_]["waiting_for"] == f"reserved for {head}"
    assert (waiting[head]["queue_place"], waiting[long_]["queue_place"]) == (1, 2)
    run(cluster, "mpi.cancel", job_id=blocker)
    head_job = wait_for(cluster, head, ("succeeded",), 30)
    long_job = wait_for(cluster, long_, ("running",), 30)
    assert entered(long_job, "starting") >= entered(head_job, "starting")
    run(cluster, "mpi.cancel", job_id=long_)


def test_a_user_over_the_limit_waits_while_others_run(cluster):
    # pillar/testcluster.sls: max_running_jobs_per_user: 2
    mine = [submit(cluster, np=1, nodes="node1", cmd=SLEEPER, user="greedy") for _ in range(2)]
    for job_id in mine:
        wait_for(cluster, job_id, ("running",), 30)
    third = submit(cluster, np=1, cmd=SLEEPER, user="greedy")
    other = submit(cluster, np=1, cmd="hostname", user="modest")
    assert wait_for(cluster, other, ("succeeded",), 30)["state"] == "succeeded"
    assert status(cluster, third) == dict(status(cluster, third), state="queued",
                                          waiting_for="user limit")
    run(cluster, "mpi.cancel", job_id=mine[0])
    wait_for(cluster, third, ("running",), 30)
    for job_id in (mine[1], third):
        run(cluster, "mpi.cancel", job_id=job_id)


# ---------------------------------------------------------------------------- failures


def test_cancel_of_a_running_job_removes_everything_within_10s(cluster):
    job_id = submit(cluster, np=4, cmd=SLEEPER)
    wait_for(cluster, job_id, ("running",), 30)
    asked = time.time()
    code, job = run(cluster, "mpi.cancel", job_id=job_id)
    assert job["state"] == "cancelled" and job["reason"] == "cancelled by request"
    assert wait_clean(cluster, job_id, cluster.nodes, 10) + (time.time() - asked) < 20
    assert job["ended"] - asked < 10


def test_cancel_of_a_queued_job_takes_it_out_of_the_queue(cluster):
    blocker = submit(cluster, np=6, cmd=SLEEPER)
    wait_for(cluster, blocker, ("running",), 30)
    queued = submit(cluster, np=2, cmd="hostname")
    assert status(cluster, queued)["state"] == "queued"
    _, job = run(cluster, "mpi.cancel", job_id=queued)
    assert job["state"] == "cancelled" and "placement" not in job
    run(cluster, "mpi.cancel", job_id=blocker)
    cluster.closed(blocker)
    # A job submitted once the blocker's slots are free runs: the queue was planned, and
    # the cancelled job was not started on those slots.
    after = submit(cluster, np=6, cmd="hostname")
    assert wait_for(cluster, after, ("succeeded",), 60)["state"] == "succeeded"
    assert status(cluster, queued)["state"] == "cancelled"


def test_walltime_ends_the_job_as_timed_out_and_cleans_within_10s(cluster):
    job_id = submit(cluster, np=4, cmd=SLEEPER, walltime="4s")
    job = wait_for(cluster, job_id, ("timed_out",), 40)
    assert "walltime" in job["reason"]
    overrun = job["ended"] - (entered(job, "running") + 4)
    assert overrun < 10, f"timed out {overrun:.1f}s after the walltime"
    assert wait_clean(cluster, job_id, cluster.nodes, 10) < 10


def test_a_worker_container_that_disappears_fails_the_job(cluster):
    job_id = submit(cluster, np=4, slots_per_node=2, cmd=SLEEPER)
    job = wait_for(cluster, job_id, ("running",), 30)
    victim = list(job["placement"])[1]
    cut = time.time()
    cluster.exec(victim, ["docker", "rm", "-f", f"dmpi-{job_id}-worker"])
    job = wait_for(cluster, job_id, ("failed",), 20)
    # The node's report or mpirun (losing its daemon there) may notice first.
    assert victim in job["reason"] or job["reason"].startswith("mpirun exited"), job["reason"]
    assert job["ended"] - cut < 15
    wait_clean(cluster, job_id, cluster.nodes, 10)


ENGINE_RESTART_GRACE = 30  # dmpi.node.evidence.ENGINE_RESTART_GRACE


def test_a_node_engine_that_dies_fails_the_job_and_its_leftovers_go_when_it_returns(cluster, restore):
    """With live-restore the job's containers outlive their engine, so a silent engine
    is taken for a restart for ENGINE_RESTART_GRACE seconds (test_operations restarts
    one for real); one that stays down fails the job then."""
    job_id = submit(cluster, np=4, slots_per_node=2, cmd=SLEEPER)
    job = wait_for(cluster, job_id, ("running",), 30)
    victim = list(job["placement"])[1]
    restore((victim, ["systemctl", "start", "docker.socket", "docker"]))
    cut = time.time()
    cluster.exec(victim, ["systemctl", "stop", "docker.socket", "docker"])
    time.sleep(6)  # past the 5 s a silent node was given before live-restore
    assert status(cluster, job_id)["state"] == "running"
    job = wait_for(cluster, job_id, ("failed",), ENGINE_RESTART_GRACE + 20)
    assert f"the Docker engine on {victim} is not answering" in job["reason"], job["reason"]
    assert ENGINE_RESTART_GRACE - 1 <= job["ended"] - cut < ENGINE_RESTART_GRACE + 15
    survivors = [n for n in job["placement"] if n != victim]
    wait_clean(cluster, job_id, survivors, 10)
    cluster.exec(victim, ["systemctl", "start", "docker.socket", "docker"])
    wait_clean(cluster, job_id, [victim], 30)


@pytest.mark.parametrize("cut_master", [True, False], ids=["node-isolated", "nodes-only"])
def test_a_partition_fails_the_job_within_15s_and_nothing_is_orphaned(cluster, cut_master):
    job_id = submit(cluster, np=4, slots_per_node=2, nodes="node1,node2", cmd=SLEEPER)
    job = wait_for(cluster, job_id, ("running",), 30)
    victim = [cluster.host_address("node2"), job["job_addresses"]["node2"]]
    peers = [cluster.host_address("node1"), job["job_addresses"]["node1"]]
    if cut_master:
        peers.append(cluster.host_address("master"))
    heal = cluster.cut(victim, peers)
    try:
        cut = time.time()
        job = wait_for(cluster, job_id, ("failed",), 30)
        detected = job["ended"] - cut
        assert detected < 15, f"failed {detected:.1f}s after the cut"
        if cut_master:
            assert "node2 stopped answering" in job["reason"] or "cannot reach" in job["reason"]
        else:
            assert "cannot reach" in job["reason"]
        assert wait_clean(cluster, job_id, ["node1"], 10) < 10
    finally:
        heal()
    wait_clean(cluster, job_id, ["node2"], 30)


def _lose(cluster, node, job, others):
    """Make ``node`` lost to the master and to the job's other nodes (hosts and job
    addresses), as a dead node is; a minion that is only silent while its host answers
    keeps its jobs for a while (test_maintenance.py). Returns the undo."""
    victim = [cluster.host_address(node), job["job_addresses"][node]]
    rest = [cluster.host_address("master")]
    for other in others:
        rest += [cluster.host_address(other), job["job_addresses"][other]]
    return cluster.cut(victim, rest)


def test_a_lost_node_fails_its_job_and_is_not_used_until_it_is_back(cluster):
    job_id = submit(cluster, np=4, slots_per_node=2, nodes="node2,node3", cmd=SLEEPER)
    job = wait_for(cluster, job_id, ("running",), 30)
    heal = _lose(cluster, "node3", job, ["node2"])
    try:
        cut = time.time()
        job = wait_for(cluster, job_id, ("failed",), 30)
        assert "node3 stopped answering" in job["reason"] or "cannot reach" in job["reason"]
        assert job["ended"] - cut < 15
        wait_clean(cluster, job_id, ["node2"], 10)
        # While node3 is away a 6-rank job waits; a 4-rank one runs on the others.
        big = submit(cluster, np=6, cmd="hostname")
        small = submit(cluster, np=4, cmd="hostname")
        small_job = wait_for(cluster, small, ("succeeded",), 30)
        assert set(small_job["placement"]) == {"node1", "node2"}
        assert status(cluster, big)["state"] == "queued"
    finally:
        heal()
    wait_reporting(cluster, "node3")
    assert wait_for(cluster, big, ("succeeded",), 60)["state"] == "succeeded"
    wait_clean(cluster, job_id, ["node3"], 30)


def test_a_master_restart_loses_nothing_and_the_queue_resumes(cluster):
    done = submit(cluster, np=2, cmd="hostname")
    wait_for(cluster, done, ("succeeded",), 30)
    tag = f"go-restart-{int(time.time())}"  # the job runs until the test lets it end
    running = submit(cluster, np=6, walltime="2m", cmd=held(tag))
    wait_for(cluster, running, ("running",), 30)
    queued = submit(cluster, np=2, cmd="hostname")
    cluster.exec("master", ["systemctl", "restart", "salt-master"])
    time.sleep(3)
    assert status(cluster, done)["state"] == "succeeded"
    assert status(cluster, queued)["state"] == "queued"
    assert status(cluster, running)["state"] == "running"
    for node in cluster.nodes:  # (until then the master refuses what needs a node)
        wait_reporting(cluster, node)
    release(cluster, "lifecycle", tag)
    job = wait_for(cluster, running, ("succeeded", "failed"), 60)
    assert job["state"] == "succeeded", "a running job with live nodes must survive the restart"
    assert wait_for(cluster, queued, ("succeeded",), 60)["state"] == "succeeded"


def test_a_job_whose_node_died_while_the_master_was_down_is_failed_on_restart(cluster):
    job_id = submit(cluster, np=4, slots_per_node=2, nodes="node1,node2", cmd=SLEEPER)
    job = wait_for(cluster, job_id, ("running",), 30)
    cluster.exec("master", ["systemctl", "stop", "salt-master"])
    # Lost to the master only: the ranks still reach each other, so mpirun does not end
    # the job itself; the restarted master must find node2 gone and end it.
    heal = _lose(cluster, "node2", job, [])
    try:
        cluster.exec("master", ["systemctl", "start", "salt-master"])
        job = wait_for(cluster, job_id, ("failed",), 60)
        assert "node2 stopped answering" in job["reason"], job["reason"]
        wait_clean(cluster, job_id, ["node1"], 10)
    finally:
        heal()
    wait_reporting(cluster, "node2")
    wait_clean(cluster, job_id, ["node2"], 40)
