"""What the queue sees of the cluster when the job controller plans
(``dmpi.master.planner``). The plans themselves are test_controller.py's and
tests/unit/dmpi/jobs/test_sched.py's."""

from dmpi.jobs import rules
from dmpi.master import planner

REF = "registry:5000/mpi@sha256:" + "a" * 64
HEALTHY = {"health": {"docker": "ok", "storage": "ok", "job_ca": "ok", "agent": "ok",
                      "job_ca_public": "ssh-ed25519 AAAA job-ca", "images": [REF]}}
NODES = {"node1": HEALTHY, "node2": HEALTHY, "node3": {"health": dict(
    HEALTHY["health"], images=[])}, "node4": HEALTHY}


def _queued(job_id, candidates=None, user="alice"):
    return {"job_id": job_id, "user": user, "np": 2, "walltime": 60, "image": "mpi",
            "spec": {"candidates": candidates, "image_ref": REF, "count": None,
                     "per_node": None}}


def test_capacity_counts_running_and_closing_jobs_and_leaves_out_drained_nodes():
    active = [{"user": "alice", "np": 3, "placement": {"node1": 2, "node2": 1},
               "deadline": 500.0, "walltime": 60}]
    closing = {"20261204-000000-aaaaaa": {"node2": 1}}
    free, running, usage, problems, returning = planner.capacity(
        active, closing, NODES, {"node4": {"reason": "disk swap"}},
        ["node1", "node2", "node3", "node4"], node_slots=2, now=100.0, cleanup_timeout=5)
    assert free == {"node1": 0, "node2": 0, "node3": 2}
    assert problems == {"node4": "drained (disk swap)"}
    assert returning == {}
    assert usage == {"alice": {"jobs": 1, "slots": 3}}
    assert sorted(r["end"] for r in running) == [105.0, 500.0]


def test_a_node_silent_for_a_moment_is_returning_with_its_free_slots_until_the_grace_ends():
    now = 1000.0
    seen = {name: dict(NODES[name], last_seen=now - ago) for name, ago in
            (("node1", 1), ("node2", 10), ("node3", rules.RESERVE_GRACE + 1), ("node4", 10))}
    seen["node2"]["health"] = dict(HEALTHY["health"])
    active = [{"user": "alice", "np": 1, "placement": {"node2": 1}, "deadline": 2000.0,
               "walltime": 60}]
    free, _, _, _, returning = planner.capacity(
        active, {}, seen, {"node4": {"reason": "disk swap"}}, ["node1"], node_slots=2,
        now=now, cleanup_timeout=5)
    # node3: silent past the grace; node4: drained, so it would take nothing anyway.
    assert free == {"node1": 2} and returning == {"node2": 1}
    seen["node2"]["health"] = dict(HEALTHY["health"], docker="connection refused")
    assert planner.capacity(active, {}, seen, {"node4": {"reason": "swap"}}, ["node1"], 2, now,
                             5)[4] == {}


def test_only_candidates_holding_the_image_are_offered_and_the_others_named():
    free = {"node1": 2, "node2": 2, "node3": 2}
    any_node = sorted(NODES)
    waiting, _, images = planner.waiting_jobs([_queued("a"), _queued("b")], any_node, free,
                                              NODES)
    assert [w["candidates"] for w in waiting] == [["node1", "node2", "node4"]] * 2
    (fit,) = images.values()  # one answer for both jobs: they share the any-node list
    assert fit["missing"] == ["node3"]


def test_a_list_every_candidate_holds_the_image_of_is_shared_not_copied():
    any_node = ["node1", "node2"]
    waiting, _, _ = planner.waiting_jobs([_queued("a")], any_node, {"node1": 2}, NODES)
    assert waiting[0]["candidates"] is any_node


def test_a_job_waiting_for_resources_is_told_which_nodes_it_cannot_use():
    any_node = sorted(NODES)
    queued = [_queued("a"), _queued("b")]
    _, fits, _ = planner.waiting_jobs(queued, any_node, {"node3": 2}, NODES)
    explained = planner.explain({"a": "resources", "b": "user limit"}, queued, fits,
                                {"node4": "drained (disk swap)"})
    assert explained["b"] == "user limit"
    assert "node4" in explained["a"] and "node3" in explained["a"], explained["a"]


def test_withheld_nodes_are_left_out_for_every_user_but_the_exempt_one_and_named():
    any_node, mine = sorted(NODES), ["node2"]
    queued = [_queued("a"), _queued("b", user="bob"), _queued("c", mine),
              _queued("t", mine, user="dockermpi-selftest")]
    withheld = {"node2": "failed the network self-test (...)"}
    waiting, fits, _ = planner.waiting_jobs(queued, any_node, {"node1": 2, "node2": 2, "node3": 2},
                                            NODES, withheld, "dockermpi-selftest")
    offered = {w["id"]: w["candidates"] for w in waiting}
    assert offered == {"a": ["node1", "node4"], "b": ["node1", "node4"], "c": [],
                       "t": ["node2"]}
    assert offered["a"] is offered["b"]  # still one list for every any-node job
    explained = planner.explain({j: "resources" for j in "abct"}, queued, fits,
                                {"node4": "drained (disk swap)"}, withheld,
                                "dockermpi-selftest")
    assert explained["c"] == "node2 failed the network self-test (...)"
    assert "node2 failed the network self-test" in explained["a"]
    assert "node4 drained" in explained["a"] and "node3" in explained["a"]
    assert explained["t"] == "resources"
