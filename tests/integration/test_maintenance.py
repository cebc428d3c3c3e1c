"""Day-2 operations on the real cluster: an admin maintains nodes without killing jobs.

A minion restart (or a longer minion outage, as a Salt upgrade makes) leaves a running
job alone while its node's host still answers the master; a real loss of the node is
still a failure, named as such. Drained nodes finish their jobs and take no new one
until resumed, across a master restart. A node whose shared storage is not writable is
not scheduled, and the queue says why. Faults are real and undone in ``finally``.
Times are printed for the record, never asserted: the bounds are the engine's unit
tests' business (tests/unit/dmpi/jobs/test_rules.py, tests/unit/dmpi/master/test_controller.py).
"""

import asyncio
import time

import pytest
import yaml

from tests.integration.test_engine import SITE_PILLAR
from tests.integration.test_lifecycle import (held, release, restore, run,  # noqa: F401
                                              status, submit, wait_clean, wait_for,
                                              wait_reporting)

pytestmark = pytest.mark.cluster

STORAGE = "/srv/dockermpi"
FINAL = ("succeeded", "failed", "cancelled", "timed_out")


@pytest.fixture(autouse=True)
def nothing_left_behind(cluster):
    """No drain, no active job, no job container or key is left after a test."""
    yield
    for node in cluster.nodes:
        run(cluster, "mpi.resume", node=node)
    active, left = cluster.settle()
    assert left == {}
    assert active == [], "the test left jobs queued or running"


def waiting_for(cluster, job_id, words, timeout=40):
    """Wait until the queued job's waiting_for contains ``words``; returns it."""
    deadline = time.monotonic() + timeout
    while True:
        job = status(cluster, job_id)
        assert job["state"] == "queued", job
        if words in (job.get("waiting_for") or ""):
            return job["waiting_for"]
        assert time.monotonic() < deadline, f"waiting_for is {job.get('waiting_for')!r}"
        time.sleep(1)


# ------------------------------------------------------------------- silent minions


@pytest.mark.parametrize("outage", ["restart", "stopped-12s"])
def test_a_silent_minion_whose_host_answers_leaves_its_running_job_alone(cluster, restore,
                                                                        outage):
    # restart: `systemctl restart salt-minion` (the minion takes 8-10 s to stop);
    # stopped-12s: what a Salt upgrade does to a node, well inside silent_grace (90 s).
    tag = f"go-{outage}-{int(time.time())}"
    job_id = submit(cluster, np=4, slots_per_node=2, nodes="node1,node2", cmd=held(tag),
                    walltime="3m", user="maint-restart")
    wait_for(cluster, job_id, ("running",), 30)
    restore(("node2", ["systemctl", "start", "salt-minion"]))
    began = time.time()
    if outage == "restart":
        cluster.exec("node2", ["systemctl", "restart", "salt-minion"])
    else:
        cluster.exec("node2", ["systemctl", "stop", "salt-minion"])
        deadline = time.monotonic() + 60  # well inside silent_grace
        while "node2" not in (job := status(cluster, job_id)).get("silent_nodes", {}):
            assert job["state"] == "running", job
            assert time.monotonic() < deadline, f"node2's silence never recorded: {job}"
            time.sleep(0.5)
        assert job["state"] == "running", job  # the record says why it goes on
        while time.time() - began < 12:  # the outage lasts 12 s at least
            time.sleep(0.5)
        assert status(cluster, job_id)["state"] == "running"
        cluster.exec("node2", ["systemctl", "start", "salt-minion"])
    wait_reporting(cluster, "node2", timeout=90)
    print(f"\nnode2 reports again {time.time() - began:.1f} s after its minion went down")
    assert status(cluster, job_id)["state"] == "running"
    release(cluster, "maint-restart", tag)
    job = wait_for(cluster, job_id, FINAL, 120)
    assert job["state"] == "succeeded", job
    assert not job.get("silent_nodes")  # none left once it reports again
    if outage == "restart":
        return  # a restart may take under the 5 s a silence needs to count: it survived
    silences = [s for s in job.get("silences") or [] if s["node"] == "node2"]
    # Without a silence of over 5 s this test would prove nothing about the grace.
    assert silences, f"node2 was never silent for over 5 s: {job}"
    assert "answers on port" in silences[0]["host"]


def test_an_admins_kill_job_on_a_node_brings_its_minion_back_and_leaves_its_job_alone(
        cluster, restore):
    # The nodes' minions run calls in threads (multiprocessing: False), where Salt's
    # saltutil.kill_job signals the minion's own process: systemd must bring it back,
    # whatever the unit Salt's package or the site installed says.
    assert cluster.unit_property("node2", "salt-minion", "Restart") == "always"
    tag = f"go-kill-job-{int(time.time())}"
    job_id = submit(cluster, np=4, slots_per_node=2, nodes="node1,node2", cmd=held(tag),
                    walltime="3m", user="maint-kill-job")
    wait_for(cluster, job_id, ("running",), 30)
    restore(("node2", ["systemctl", "start", "salt-minion"]))
    before = cluster.unit_property("node2", "salt-minion", "MainPID")
    _, said = cluster.exec("master", ["salt", "node2", "test.sleep", "300", "--async"],
                           stdout_only=True)
    jid = said.split()[-1]
    deadline = time.monotonic() + 30
    while jid not in cluster.exec("master", ["salt", "node2", "saltutil.running",
                                             "--out=json"], stdout_only=True)[1]:
        assert time.monotonic() < deadline, f"the call {jid} never ran on node2"
        time.sleep(0.5)
    cluster.exec("master", ["salt", "node2", "saltutil.kill_job", jid], check=False)
    deadline = time.monotonic() + 60
    while cluster.unit_property("node2", "salt-minion", "MainPID") in (before, "0", ""):
        assert time.monotonic() < deadline, "node2's minion did not come back"
        time.sleep(0.5)
    deadline = time.monotonic() + 60
    while cluster.exec("master", ["salt", "--out=txt", "node2", "test.ping"],
                       check=False, stdout_only=True)[1].strip() != "node2: True":
        assert time.monotonic() < deadline, "node2's new minion does not answer"
        time.sleep(1)
    wait_reporting(cluster, "node2", timeout=90)
    assert status(cluster, job_id)["state"] == "running"
    release(cluster, "maint-kill-job", tag)
    job = wait_for(cluster, job_id, FINAL, 120)
    assert job["state"] == "succeeded", job


# ---------------------------------------------------------------- no false alarms

# The calm job's ranks keep talking (a barrier five times a second) on node2 and node3
# until the test touches /data/<tag>; the hog's spin on every CPU of node1 for as long
# as the load lasts, then end by themselves.
CALM = r'''
import os, sys, time
from mpi4py import MPI
comm = MPI.COMM_WORLD
while not comm.bcast(os.path.exists(sys.argv[1]) if comm.Get_rank() == 0 else None):
    comm.Barrier()
    time.sleep(0.2)
if comm.Get_rank() == 0:
    print("calm to the end", flush=True)
'''
SPIN = "import sys, time\nend = time.monotonic() + float(sys.argv[1])\n" \
       "while time.monotonic() < end:\n    pass\n"
LOAD_SECONDS = 40  # past every silence the master acts on (the longest: 30 s)
POLLERS = 50


async def _poll_as_hub_users(count, seconds, calls, errors):
    """``count`` hub users with tokens of their own list their jobs and ask who they are,
    5 calls a second each (spread over the period, as notebooks' panels poll), for
    ``seconds``."""
    from bench import api_load

    http, _ca_file = api_load.http_client()
    hub = api_load.Hub(http)
    names = [f"maint-poller-{i:02d}" for i in range(count)]
    tokens = await asyncio.gather(*(hub.token(name) for name in names))
    users = [api_load.User(http, name, token) for name, token in zip(names, tokens)]
    until = time.monotonic() + seconds
    try:
        await asyncio.gather(*(api_load.poll(user, ["/jobs", "/whoami"], until, 5, calls,
                                             errors, i / (count * 5))
                               for i, user in enumerate(users)))
    finally:
        await asyncio.gather(*(hub.remove(name) for name in names))


def test_a_job_holding_every_cpu_of_its_node_and_50_polling_users_fail_no_healthy_job(cluster):
    # Load is no fault: neither the hog's own job nor another user's job on other nodes
    # may be taken for lost or cut off while node1's CPUs are all the hog's and the
    # master's API serves 50 users polling.
    tag = f"calm-{int(time.time())}"
    began = time.time()
    calm = submit(cluster, np=2, nodes="node2,node3", slots_per_node=1, user="maint-calm",
                  cmd=["python3", "-c", CALM, f"/data/{tag}"], walltime="4m")
    hog = submit(cluster, np=2, nodes="node1", slots_per_node=2, user="maint-hog",
                 cmd=["python3", "-c", SPIN, str(LOAD_SECONDS)], walltime="4m")
    for job_id in (calm, hog):
        wait_for(cluster, job_id, ("running",), 60)
    print(f"\nboth running {time.time() - began:.1f} s after the submits")
    calls, errors = [], []
    try:
        asyncio.run(_poll_as_hub_users(POLLERS, LOAD_SECONDS, calls, errors))
        # (while the hog spins, anything else on this machine crawls: let it end first)
        ended = {hog: wait_for(cluster, hog, FINAL, 60)}
    finally:
        release(cluster, "maint-calm", tag)
    ended[calm] = wait_for(cluster, calm, FINAL, 60)
    print(f"\n{len(calls)} API calls answered in {LOAD_SECONDS} s, {len(errors)} not "
          f"({errors[:3]}); both ended {time.time() - began:.1f} s after their submits")
    assert calls, errors[:5]  # the master really was busy
    # Both succeeding is both running through the load: a false alarm would have ended them.
    assert [ended[j]["state"] for j in (calm, hog)] == ["succeeded", "succeeded"], ended
    assert cluster.read_shared(ended[calm]["output"]["stdout"]).strip() == "calm to the end"
    # On a slow machine a node this busy (all the cluster's nodes share its cores) may
    # send no heartbeat for a while: its jobs are then kept while its host answers, which
    # is no alarm, and the only silence allowed.
    for job in ended.values():
        assert all("its host answers" in s.get("host", "")
                   for s in job.get("silences") or []), job


@pytest.mark.parametrize("peers_cut", [False], ids=["master-only"])
def test_a_node_the_master_cannot_reach_still_ends_its_job(cluster, peers_cut):
    # master-only: the nodes still reach each other, so only the master's silence and its
    # probe of node2's host (which now times out) can tell; the job must fail all the
    # same. (A full partition: test_lifecycle's partition and lost-node tests.)
    job_id = submit(cluster, np=4, slots_per_node=2, nodes="node1,node2", cmd="sleep 300",
                    user="maint-cut")
    job = wait_for(cluster, job_id, ("running",), 30)
    victim = [cluster.host_address("node2"), job["job_addresses"]["node2"]]
    others = [cluster.host_address("master")]
    if peers_cut:
        others += [cluster.host_address("node1"), job["job_addresses"]["node1"]]
    heal = cluster.cut(victim, others)
    try:
        cut = time.time()
        job = wait_for(cluster, job_id, ("failed",), 60)
        print(f"\nfailed {job['ended'] - cut:.1f} s after the cut: {job['reason']}")
        if peers_cut:
            assert "node2 stopped answering" in job["reason"] or \
                "cannot reach" in job["reason"], job["reason"]
        else:
            assert "node2 stopped answering" in job["reason"], job["reason"]
            assert "its host does not answer" in job["reason"], job["reason"]
        assert not job.get("silences"), "a lost node was taken for a restarting minion"
        wait_clean(cluster, job_id, ["node1"], 15)
    finally:
        heal()
    wait_reporting(cluster, "node2")
    wait_clean(cluster, job_id, ["node2"], 40)


# ---------------------------------------------------------------------------- drains


def test_drain_lets_running_jobs_finish_starts_nothing_new_and_resume_undoes_it(cluster):
    tag = f"go-drain-{int(time.time())}"
    running = submit(cluster, np=2, nodes="node3", cmd=held(tag), walltime="2m",
                     user="maint-drain")
    wait_for(cluster, running, ("running",), 30)
    code, drained = run(cluster, "mpi.drain", node="node3", reason="maintenance test")
    assert code == 0, drained
    assert drained["drained"]["reason"] == "maintenance test"
    assert drained["running_jobs"] == [running]
    queued = submit(cluster, np=2, nodes="node3", cmd="hostname", user="maint-drain")
    anywhere = submit(cluster, np=2, cmd="hostname", user="maint-other")
    assert waiting_for(cluster, queued, "node3 drained") == "node3 drained (maintenance test)"
    shown = run(cluster, "mpi.nodes")[1]["node3"]
    assert shown["drained"]["reason"] == "maintenance test" and shown["drained"]["since"]
    assert shown["eligible"] is False and shown["jobs"] == [running]
    elsewhere = wait_for(cluster, anywhere, ("succeeded",), 30)
    assert "node3" not in elsewhere["placement"]
    release(cluster, "maint-drain", tag)
    assert wait_for(cluster, running, ("succeeded", "failed"), 60)["state"] == "succeeded"
    # The drain outlives a master restart; the queued job still does not start.
    cluster.exec("master", ["systemctl", "restart", "salt-master"])
    assert run(cluster, "mpi.nodes")[1]["node3"]["drained"]["reason"] == "maintenance test"
    # A job submitted after the restart and run elsewhere proves the new engine planned
    # the queue; the job held for node3 must still be waiting then.
    after = wait_for(cluster, submit(cluster, np=2, cmd="hostname", user="maint-other"),
                     ("succeeded",), 60)
    assert "node3" not in after["placement"]
    assert status(cluster, queued)["state"] == "queued"
    code, resumed = run(cluster, "mpi.resume", node="node3")
    assert code == 0 and resumed["drained"] is None, resumed
    job = wait_for(cluster, queued, ("succeeded",), 60)
    assert job["placement"] == {"node3": 2}
    assert run(cluster, "mpi.nodes")[1]["node3"]["eligible"] is True


def test_drain_needs_a_known_node_and_a_reason(cluster):
    code, answer = run(cluster, "mpi.drain", node="node9", reason="x")
    assert code == 1 and "not an MPI node" in answer["error"]
    code, answer = run(cluster, "mpi.drain", node="node1")
    assert code == 1 and "reason is required" in answer["error"]
    assert run(cluster, "mpi.nodes")[1]["node1"]["drained"] is None


# ---------------------------------------------------------------------------- health


def _mounts(cluster, node):
    """How many file systems are mounted on the storage path in the node's mount
    namespace (a bind stacks one more), from its mountinfo (field 5: the mount point)."""
    _, out = cluster.exec(node, ["cat", "/proc/self/mountinfo"])
    return sum(1 for line in out.splitlines()
               if len(line.split()) > 4 and line.split()[4] == STORAGE)


def _unstack(cluster, node, count):
    """Unmount what was stacked on the storage path above its ``count`` mounts. A bind
    still busy (a process with a file or its working directory on it) is tried again,
    and detached lazily if it stays busy: the node's storage must be writable again
    whatever the test found, or every later test on the node fails for this one."""
    deadline = time.monotonic() + 30
    while _mounts(cluster, node) > count:
        code, said = cluster.exec(node, ["umount", STORAGE], check=False)
        if code != 0:
            print(f"\numount {STORAGE} on {node}: {said.strip()}")
            if time.monotonic() > deadline:
                cluster.exec(node, ["umount", "--lazy", STORAGE])
            else:
                time.sleep(0.5)


def test_a_node_whose_storage_is_not_writable_is_not_scheduled(cluster):
    # The storage path made read-only on node3 only: a read-only bind of itself over it,
    # stacked on the shared volume, undone by unmounting that bind alone.
    before = _mounts(cluster, "node3")
    assert before >= 1
    cluster.exec("node3", ["mount", "--bind", STORAGE, STORAGE])
    try:
        cluster.exec("node3", ["mount", "-o", "remount,bind,ro", STORAGE])
        deadline = time.monotonic() + 40
        while not (shown := run(cluster, "mpi.nodes")[1]["node3"])[
                "not_eligible_because"]:
            assert time.monotonic() < deadline, "node3 still counts as healthy"
            time.sleep(1)
        assert shown["not_eligible_because"].startswith("unhealthy: storage not writable"), \
            shown
        assert shown["health"]["storage"].startswith("not writable")
        pinned = submit(cluster, np=1, nodes="node3", cmd="hostname", user="maint-health")
        assert waiting_for(cluster, pinned, "node3 unhealthy").startswith(
            "node3 unhealthy: storage not writable")
        spread = submit(cluster, np=6, cmd="hostname", user="maint-health")  # needs node3
        assert "node3 unhealthy" in waiting_for(cluster, spread, "node3 unhealthy")
        others = submit(cluster, np=4, cmd="hostname", user="maint-other")
        job = wait_for(cluster, others, ("succeeded",), 30)
        assert set(job["placement"]) == {"node1", "node2"}
        assert status(cluster, pinned)["state"] == "queued"
    finally:
        _unstack(cluster, "node3", before)
    assert _mounts(cluster, "node3") == before
    # Healthy again within the node's next health look: both start, node3 included.
    assert wait_for(cluster, pinned, ("succeeded",), 60)["placement"] == {"node3": 1}
    assert "node3" in wait_for(cluster, spread, ("succeeded",), 60)["placement"]


# ------------------------------------------------------------------ network self-test

#: A hostile user's job: connects to the self-test's port on every node's host (and
#: the master's) for as long as it runs, and counts what it reached. argv: the port,
#: seconds, then the addresses.
PROBE_HOSTS = r"""
import socket, sys, time
port, seconds, addresses = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3:]
reached, tries = [], 0
end = time.monotonic() + seconds
while time.monotonic() < end:
    for address in addresses:
        tries += 1
        try:
            socket.create_connection((address, port), timeout=0.3).close()
            reached.append(address)
        except OSError:
            pass
    time.sleep(0.05)
print("PROBED", tries, "REACHED", sorted(set(reached)))
"""


def test_the_network_self_test_measures_every_pair_and_a_users_job_cannot_reach_it(cluster):
    from tests.cluster.testcluster import MASTER_ADDR, node_address

    port = 20999  # the top of mpi:ports:btl, where the self-test's ping-pongs meet
    hosts = [node_address(i) for i in range(1, len(cluster.nodes) + 1)] + [MASTER_ADDR]
    # While the self-test runs, a user's job on node3 keeps knocking on that port of
    # every host: from a job's namespace no host port is reachable, so it neither
    # meets an echo nor spoils a figure (node3's own pair waits for its slots).
    hostile = submit(cluster, np=1, nodes="node3", user="maint-knocker", walltime="2m",
                     cmd=["python3", "-c", PROBE_HOSTS, str(port), "12", *hosts])
    wait_for(cluster, hostile, ("running",), 60)
    code, report = run(cluster, "mpi.selftest", lat_iters=200, bw_iters=4, size=1 << 20)
    print("\n".join(report.get("matrix", [])) or report)
    assert "error" not in report, report
    assert code == (0 if report["passed"] else 1), (code, report["passed"])
    nodes = sorted(cluster.nodes)
    expected = [[n, n] for n in nodes] + [[a, b] for i, a in enumerate(nodes)
                                         for b in nodes[i + 1:]]
    assert [p["pair"] for p in report["pairs"]] == expected
    for pair in report["pairs"]:
        # Figures for every pair; a flag under load (far below the median) is allowed,
        # a failed job or a host side that did not answer is not.
        assert pair["job"] and pair["host"], pair
        for figures in (pair["job"]["mpi"], pair["job"]["tcp"], pair["host"]):
            assert figures["latency_us"] > 0 and figures["bandwidth_mb_per_s"] > 0, pair
        assert not [p for p in pair["problems"] if "median" not in p], pair
    shown = run(cluster, "mpi.nodes")[1]
    for node in nodes:
        assert shown[node]["selftest"]["at"] == report["started"], shown[node]
    # Its jobs ran as the self-test's own user and are gone.
    listed = run(cluster, "mpi.list", user="dockermpi-selftest")[1]
    mine = [j for j in listed if j["job_id"] in {p["job_id"] for p in report["pairs"]}]
    assert len(mine) == len(expected) and {j["state"] for j in mine} == {"succeeded"}, listed
    knocked = wait_for(cluster, hostile, ("succeeded",), 60)
    out = cluster.read_shared(knocked["output"]["stdout"])
    assert "REACHED []" in out and "PROBED 0" not in out, out


def _selftest_pillar(cluster, original, **selftest_settings):
    """The site's pillar with ``mpi:selftest`` settings over it, seen by every minion and
    handed to the job controller (``mpi.settings``)."""
    changed = yaml.safe_load(original)
    changed["mpi"].setdefault("selftest", {}).update(selftest_settings)
    cluster.put_file("master", SITE_PILLAR, yaml.safe_dump(changed).encode())
    cluster.salt(["salt", "*", "saltutil.refresh_pillar", "wait=True"])
    code, settings = run(cluster, "mpi.settings")
    assert code == 0 and all(settings["selftest"][k] == v
                             for k, v in selftest_settings.items()), settings


def test_with_exclusion_a_node_that_failed_the_self_test_takes_no_job_until_it_passes(cluster):
    original = cluster.read("master", ["cat", SITE_PILLAR])
    small = {"nodes": "node1", "lat_iters": 50, "bw_iters": 2, "size": 65536}
    try:
        # node2's and node3's verdicts start clean: an earlier self-test under load may
        # have flagged them (allowed there), and exclusion would now hold them back too.
        _selftest_pillar(cluster, original, exclude_failed_nodes=True,
                         min_bandwidth_mb_per_s=0, far_below=0)
        code, report = run(cluster, "mpi.selftest", **{**small, "nodes": "node2,node3"})
        assert code == 0 and report["passed"], report
        # A floor no link reaches: node1's own pair is flagged, so node1 is at fault.
        _selftest_pillar(cluster, original, exclude_failed_nodes=True,
                         min_bandwidth_mb_per_s=10 ** 12)
        code, report = run(cluster, "mpi.selftest", **small)
        assert code == 1 and not any(p["passed"] for p in report["pairs"]), report
        shown = run(cluster, "mpi.nodes")[1]
        assert shown["node1"]["eligible"] is False, shown["node1"]
        assert shown["node1"]["not_eligible_because"].startswith(
            "failed the network self-test (its own pair was flagged: job TCP bandwidth"), \
            shown["node1"]
        assert shown["node2"]["eligible"] is shown["node3"]["eligible"] is True, \
            {node: shown[node] for node in ("node2", "node3")}
        held_back = submit(cluster, np=2, nodes="node1", cmd="hostname", user="maint-victim")
        assert "node1 failed the network self-test" in waiting_for(
            cluster, held_back, "self-test")
        elsewhere = wait_for(cluster, submit(cluster, np=4, cmd="hostname",
                                             user="maint-other"), ("succeeded",), 60)
        assert elsewhere["placement"] == {"node2": 2, "node3": 2}, elsewhere
        # The self-test's own jobs still run there, and its pass gives the nodes back.
        _selftest_pillar(cluster, original, exclude_failed_nodes=True,
                         min_bandwidth_mb_per_s=0, far_below=0)
        code, report = run(cluster, "mpi.selftest", **small)
        assert code == 0 and report["passed"], report
        assert selftest_verdicts(cluster)["node1"]["at_fault"] is None
        job = wait_for(cluster, held_back, ("succeeded",), 60)
        assert job["placement"] == {"node1": 2}
    finally:
        cluster.put_file("master", SITE_PILLAR, original.encode())
        cluster.salt(["salt", "*", "saltutil.refresh_pillar", "wait=True"])
        run(cluster, "mpi.settings")


def selftest_verdicts(cluster):
    return {node: shown["selftest"] for node, shown in run(cluster, "mpi.nodes")[1].items()}
