"""
Unit tests for ``dmpi.jobs.sched``: where a job's ranks go and which queued jobs start.

What a user sees of these functions is which nodes their ranks land on, whether their
job starts now, and why it waits (``waiting_for``: ``resources``, ``user limit`` or
``reserved for <job>``).
"""

import math
import random

import pytest

import dmpi.settings
from dmpi.jobs import fairshare, sched

NODE_SLOTS = 4
NODES = ["n1", "n2", "n3"]
NOW = 1000.0


def _job(job_id, np, user="alice", candidates=None, count=None, per_node=None, walltime=60):
    return {
        "id": job_id,
        "user": user,
        "np": np,
        "candidates": list(NODES if candidates is None else candidates),
        "count": count,
        "per_node": per_node,
        "walltime": walltime,
    }


def _running(placement, ends_in):
    return {"placement": placement, "end": NOW + ends_in}


def _plan(queued, free, running=(), limits=None, usage=None, placement="pack",
          returning=None):
    return sched.plan(queued, dict(free), list(running), NOW, NODE_SLOTS, limits, usage,
                      placement=placement, returning=returning)


def _per_node_use(starts):
    use = {}
    for _, placement in starts:
        for node, ranks in placement.items():
            use[node] = use.get(node, 0) + ranks
    return use


# ------------------------------------------------------------------------------- place


def test_place_fills_nodes_in_order():
    assert sched.place(6, {"n1": 4, "n2": 4, "n3": 4}) == {"n1": 4, "n2": 2}


def test_place_skips_nodes_without_free_slots():
    assert sched.place(3, {"n1": 0, "n2": 1, "n3": 4}) == {"n2": 1, "n3": 2}


@pytest.mark.parametrize(
    "np, count, expected",
    [
        (6, 3, {"n1": 2, "n2": 2, "n3": 2}),
        (5, 2, {"n1": 3, "n2": 2}),
        (8, 2, {"n1": 4, "n2": 4}),
        (1, 1, {"n1": 1}),
    ],
)
def test_place_count_spreads_ranks_evenly(np, count, expected):
    assert sched.place(np, {"n1": 4, "n2": 4, "n3": 4}, count=count) == expected


def test_place_count_uses_exactly_that_many_nodes():
    # docs/users.md: nodes=3 is "a count (spread evenly)"; the docstring: "Exactly this many nodes".
    placement = sched.place(4, {"n1": 4, "n2": 4, "n3": 4}, count=3)
    assert len(placement) == 3
    assert sum(placement.values()) == 4
    assert max(placement.values()) - min(placement.values()) <= 1


def test_place_count_passes_over_nodes_too_full_for_their_share():
    assert sched.place(6, {"n1": 1, "n2": 4, "n3": 4}, count=2) == {"n2": 3, "n3": 3}


def test_place_per_node_puts_that_many_ranks_on_each_node():
    assert sched.place(5, {"n1": 4, "n2": 4, "n3": 4}, per_node=2) == {
        "n1": 2, "n2": 2, "n3": 1,
    }


def test_place_per_node_passes_over_nodes_with_fewer_free_slots():
    assert sched.place(4, {"n1": 1, "n2": 4, "n3": 4}, per_node=2) == {"n2": 2, "n3": 2}


def test_place_count_and_per_node_together():
    assert sched.place(4, {"n1": 4, "n2": 4, "n3": 4}, count=2, per_node=2) == {
        "n1": 2, "n2": 2,
    }


def test_nofit_is_a_value_error():
    # The runner turns ValueError into "this job can never run: ...".
    assert issubclass(sched.NoFit, ValueError)


def test_nofit_too_few_nodes():
    with pytest.raises(sched.NoFit, match=r"nodes=3 but only 2 nodes are available"):
        sched.place(6, {"n1": 4, "n2": 4}, count=3)


def test_nofit_too_few_slots_says_what_is_free():
    with pytest.raises(sched.NoFit, match=r"np=9 cannot be placed") as info:
        sched.place(9, {"n1": 4, "n2": 4})
    assert "'n1': 4" in str(info.value) and "'n2': 4" in str(info.value)


def test_nofit_count_with_too_few_ranks_per_node():
    with pytest.raises(sched.NoFit, match=r"np=9 does not fit 2 nodes x 4 slots"):
        sched.place(9, {"n1": 4, "n2": 4, "n3": 4}, count=2, per_node=4)


def test_nofit_per_node_leaves_no_room():
    with pytest.raises(sched.NoFit, match=r"with 3 ranks per node"):
        sched.place(6, {"n1": 4, "n2": 2, "n3": 2}, per_node=3)


def test_nofit_per_node_larger_than_a_node():
    with pytest.raises(sched.NoFit, match=r"slots_per_node=5 exceeds the 4 slots each node has"):
        sched.place(5, {"n1": 4, "n2": 4}, per_node=5, node_slots=4)


# -------------------------------------------------------------------------------- fits


def test_fits_uses_only_candidate_nodes():
    free = {"n1": 4, "n2": 4, "n3": 4}
    assert sched.fits(_job("j", 4, candidates=["n2"]), free, NODE_SLOTS) == {"n2": 4}
    assert sched.fits(_job("j", 5, candidates=["n2"]), free, NODE_SLOTS) is None


def test_fits_ignores_candidates_that_are_down():
    assert sched.fits(_job("j", 1, candidates=["n9"]), {"n1": 4}, NODE_SLOTS) is None
    assert sched.fits(_job("j", 4, candidates=["n9", "n1"]), {"n1": 4}, NODE_SLOTS) == {
        "n1": 4,
    }


def test_fits_count_larger_than_candidates():
    job = _job("j", 2, candidates=["n1", "n2"], count=3)
    assert sched.fits(job, {"n1": 4, "n2": 4, "n3": 4}, NODE_SLOTS) is None


# ------------------------------------------------------------------- placement policy


def test_the_policies_are_the_ones_the_pillar_accepts():
    assert sched.PLACEMENTS == dmpi.settings.PLACEMENTS


def test_place_spread_takes_the_nodes_with_most_free_slots_first():
    free = {"n1": 1, "n2": 3, "n3": 4}
    assert sched.place(4, free, placement="spread") == {"n3": 4}
    assert sched.place(5, free, placement="spread") == {"n3": 4, "n2": 1}
    assert sched.place(2, free, count=2, placement="spread") == {"n3": 1, "n2": 1}
    assert sched.place(4, free) == {"n1": 1, "n2": 3}


def test_place_spread_breaks_ties_in_preference_order():
    assert sched.place(2, {"n3": 2, "n1": 2, "n2": 1}, count=2,
                           placement="spread") == {"n3": 1, "n1": 1}


@pytest.mark.parametrize("call", [
    lambda: sched.place(1, {"n1": 1}, placement="random"),
    lambda: sched.fits(_job("j", 1), {"n1": 1}, NODE_SLOTS, placement="Spread"),
    lambda: sched.plan([_job("j", 1)], {"n1": 1}, [], NOW, NODE_SLOTS, placement=None),
])
def test_an_unknown_policy_is_refused(call):
    with pytest.raises(ValueError, match="placement must be one of pack, spread"):
        call()


def test_plan_spread_runs_more_small_jobs_at_once_than_pack():
    # Three nodes of 2 slots, jobs of one rank on each of 2 nodes: packing puts two on
    # n1+n2 and leaves n3 with nobody to pair with; spreading pairs all three nodes.
    queued = [_job(j, 2, count=2) for j in ("a", "b", "c")]
    free = {"n1": 2, "n2": 2, "n3": 2}
    packed, blocked = sched.plan(queued, dict(free), [], NOW, 2)
    assert [j for j, _ in packed] == ["a", "b"] and blocked == {"c": "resources"}
    spread, blocked = sched.plan(queued, dict(free), [], NOW, 2, placement="spread")
    assert spread == [("a", {"n1": 1, "n2": 1}), ("b", {"n3": 1, "n1": 1}),
                      ("c", {"n2": 1, "n3": 1})]
    assert blocked == {}


# -------------------------------------------------------------------------------- plan


def test_plan_starts_in_submission_order():
    queued = [_job("a", 4), _job("b", 4), _job("c", 4)]
    starts, blocked = _plan(queued, {"n1": 4, "n2": 4, "n3": 4})
    assert starts == [("a", {"n1": 4}), ("b", {"n2": 4}), ("c", {"n3": 4})]
    assert blocked == {}


def test_a_user_who_queued_many_jobs_first_holds_another_back_by_one_of_them_at_most():
    # alice's first job runs (she has usage now); bob's single job comes before her 9
    # others in fair-share order, and backfill keeps that order.
    queued = [dict(_job(f"a{i}", 4), job_id=f"a{i}", submitted=float(i)) for i in range(1, 10)]
    queued.append(dict(_job("b0", 4, user="bob"), job_id="b0", submitted=10.0))
    used = fairshare.usage({}, [{"user": "alice", "np": 4, "started": 0.0}], 30.0, 3600.0)
    found = fairshare.priorities(queued, used, 30.0, {"weight_fairshare": 10000,
                                                      "weight_age": 1000, "max_age": 86400})
    starts, blocked = _plan(fairshare.order(queued, found), {"n1": 4})
    assert starts == [("b0", {"n1": 4})]
    assert set(blocked) == {f"a{i}" for i in range(1, 10)}


def test_the_queue_orders_are_the_ones_the_pillar_accepts():
    assert dmpi.settings.QUEUE_ORDERS == ("fair", "fifo")


def test_plan_never_places_a_job_partially():
    starts, blocked = _plan([_job("big", 8)], {"n1": 4, "n2": 3})
    assert starts == []
    assert blocked == {"big": "resources"}


def test_plan_blocked_head_is_not_passed_by_a_long_job_on_its_slots():
    # n1 frees up in 100 s, so the head starts then; a 1000 s job would hold it.
    running = [_running({"n1": 2}, 100)]
    queued = [_job("head", 4, candidates=["n1"]), _job("long", 2, candidates=["n1"], walltime=1000)]
    starts, blocked = _plan(queued, {"n1": 2}, running)
    assert starts == []
    assert blocked == {"head": "resources", "long": "reserved for head"}


def test_plan_backfills_a_job_that_ends_before_the_head_can_start():
    running = [_running({"n1": 2}, 100)]
    queued = [_job("head", 4, candidates=["n1"]), _job("short", 2, candidates=["n1"], walltime=50)]
    starts, blocked = _plan(queued, {"n1": 2}, running)
    assert starts == [("short", {"n1": 2})]
    assert blocked == {"head": "resources"}


def test_plan_backfill_ending_exactly_at_the_shadow_time_starts():
    running = [_running({"n1": 2}, 100)]
    queued = [_job("head", 4, candidates=["n1"]), _job("short", 2, candidates=["n1"], walltime=100)]
    starts, _ = _plan(queued, {"n1": 2}, running)
    assert [s[0] for s in starts] == ["short"]


def test_plan_backfills_a_long_job_on_slots_the_head_will_not_need():
    # The head needs n1 whole once its running job ends; n2 is free and not reserved.
    running = [_running({"n1": 4}, 100)]
    queued = [_job("head", 4, candidates=["n1"]), _job("long", 4, walltime=10_000)]
    starts, blocked = _plan(queued, {"n1": 0, "n2": 4}, running)
    assert starts == [("long", {"n2": 4})]
    assert blocked == {"head": "resources"}


def test_plan_backfill_uses_up_the_unreserved_slots_only_once():
    # At the shadow time (t+100) the head takes n1, n2 and 2 slots of n3: only 2 slots of
    # n3 are free for long jobs, so only one of two 2-slot long jobs may start.
    running = [_running({"n1": 4, "n2": 4}, 100)]
    queued = [
        _job("head", 10),
        _job("long1", 2, candidates=["n3"], walltime=10_000),
        _job("long2", 2, candidates=["n3"], walltime=10_000),
    ]
    starts, blocked = _plan(queued, {"n1": 0, "n2": 0, "n3": 4}, running)
    assert starts == [("long1", {"n3": 2})]
    assert blocked == {"head": "resources", "long2": "reserved for head"}


def test_plan_backfill_cannot_delay_head_behind_a_job_started_in_the_same_plan():
    # An idle 4-slot node and three jobs queued at once: "a" starts and ends in 60 s, so
    # "head" (all 4 slots) can start in 60 s. "long" fits next to "a" now but would hold
    # 2 slots for an hour: starting it delays the head, which backfill must never do.
    queued = [
        _job("a", 2, candidates=["n1"], walltime=60),
        _job("head", 4, candidates=["n1"], walltime=60),
        _job("long", 2, candidates=["n1"], walltime=3600),
    ]
    starts, blocked = _plan(queued, {"n1": 4})
    assert starts == [("a", {"n1": 2})]
    assert blocked == {"head": "resources", "long": "reserved for head"}


def test_plan_user_over_job_limit_waits_without_blocking_others():
    queued = [_job("a1", 1, user="alice"), _job("b1", 1, user="bob")]
    starts, blocked = _plan(
        queued, {"n1": 4}, [_running({"n2": 1}, 100)],
        limits={"max_running_jobs": 1}, usage={"alice": {"jobs": 1, "slots": 1}},
    )
    assert starts == [("b1", {"n1": 1})]
    assert blocked == {"a1": "user limit"}


def test_plan_user_over_slot_limit_waits_without_blocking_others():
    queued = [_job("a1", 4, user="alice"), _job("a2", 2, user="alice"), _job("b1", 4, user="bob")]
    starts, blocked = _plan(
        queued, {"n1": 4, "n2": 4}, limits={"max_slots": 4},
        usage={"alice": {"jobs": 1, "slots": 2}},
    )
    assert starts == [("a2", {"n1": 2}), ("b1", {"n1": 2, "n2": 2})]
    assert blocked == {"a1": "user limit"}


def test_plan_user_limit_counts_jobs_started_in_the_same_plan():
    queued = [_job("a1", 1, user="alice"), _job("a2", 1, user="alice"), _job("b1", 1, user="bob")]
    starts, blocked = _plan(queued, {"n1": 4}, limits={"max_running_jobs": 1})
    assert [s[0] for s in starts] == ["a1", "b1"]
    assert blocked == {"a2": "user limit"}


def test_plan_user_limited_job_does_not_reserve_slots():
    # alice's big job waits for her limit, not for slots: it must not hold back bob.
    queued = [_job("a1", 12, user="alice"), _job("b1", 4, user="bob", walltime=10_000)]
    running = [_running({"n1": 4, "n2": 4}, 100)]
    starts, blocked = _plan(
        queued, {"n1": 0, "n2": 0, "n3": 4}, running,
        limits={"max_running_jobs": 1}, usage={"alice": {"jobs": 1, "slots": 4}},
    )
    assert starts == [("b1", {"n3": 4})]
    assert blocked == {"a1": "user limit"}


def test_plan_no_limit_when_limits_are_zero_or_none():
    queued = [_job("a1", 1), _job("a2", 1)]
    starts, _ = _plan(
        queued, {"n1": 4}, limits={"max_running_jobs": 0, "max_slots": None},
        usage={"alice": {"jobs": 50, "slots": 500}},
    )
    assert [s[0] for s in starts] == ["a1", "a2"]


def test_plan_does_not_change_callers_usage():
    usage = {"alice": {"jobs": 0, "slots": 0}}
    _plan([_job("a1", 1)], {"n1": 4}, limits={"max_running_jobs": 1}, usage=usage)
    assert usage == {"alice": {"jobs": 0, "slots": 0}}


def test_plan_uses_only_nodes_that_are_up():
    # n2 is down: absent from free.
    starts, blocked = _plan([_job("a", 8), _job("b", 1, candidates=["n2"])], {"n1": 4, "n3": 4})
    assert starts == [("a", {"n1": 4, "n3": 4})]
    assert blocked == {"b": "resources"}


def test_plan_head_on_down_nodes_does_not_stop_others():
    queued = [_job("stuck", 2, candidates=["n2"]), _job("other", 4, walltime=10_000)]
    starts, blocked = _plan(queued, {"n1": 4, "n3": 4})
    assert starts == [("other", {"n1": 4})]
    assert blocked == {"stuck": "resources"}


def test_a_head_keeps_its_reservation_while_a_node_it_needs_is_silent_for_a_moment():
    # n2 missed a heartbeat: out of free, but returning with its 4 slots. The head needs
    # all three nodes once n1's job ends; a long job on n3 would delay it, a short one not.
    running = [_running({"n1": 4}, 100)]
    queued = [_job("head", 12, candidates=["n1", "n2", "n3"]),
              _job("long", 4, candidates=["n3"], walltime=10_000),
              _job("short", 4, candidates=["n3"], walltime=50)]
    starts, blocked = _plan(queued, {"n1": 0, "n3": 4}, running, returning={"n2": 4})
    assert starts == [("short", {"n3": 4})]
    assert blocked == {"head": "resources", "long": "reserved for head"}


def test_a_returning_node_takes_no_job_itself():
    starts, blocked = _plan([_job("a", 4, candidates=["n2"], walltime=5)], {"n1": 4},
                            returning={"n2": 4})
    assert starts == [] and blocked == {"a": "resources"}


def test_plan_never_overcommits_a_node():
    free = {"n1": 3, "n2": 2}
    queued = [_job("a", 2), _job("b", 2), _job("c", 1), _job("d", 1), _job("e", 1)]
    starts, blocked = _plan(queued, free)
    use = _per_node_use(starts)
    assert all(use[n] <= free[n] for n in use)
    assert sum(use.values()) == 5
    assert [s[0] for s in starts] == ["a", "b", "c"]
    assert blocked == {"d": "resources", "e": "resources"}


# ------------------------------------------------------------ properties, random cases


def _earliest(job, free, holders):
    """First time ``job`` fits when ``holders`` (placement, end) release their slots."""
    if sched.fits(job, free, NODE_SLOTS) is not None:
        return NOW
    capacity = dict(free)
    for placement, end in sorted(holders, key=lambda h: h[1]):
        for node, ranks in placement.items():
            if node in capacity:
                capacity[node] += ranks
        if sched.fits(job, capacity, NODE_SLOTS) is not None:
            return end
    return math.inf


def _random_case(rng):
    nodes = [f"n{i}" for i in range(1, rng.randint(1, 4) + 1)]
    used = {n: 0 for n in nodes}
    running = []
    for _ in range(rng.randint(0, 4)):
        node = rng.choice(nodes)
        ranks = rng.randint(0, NODE_SLOTS - used[node])
        if ranks:
            used[node] += ranks
            running.append({"placement": {node: ranks}, "end": NOW + rng.choice([10, 50, 100, 500])})
    up = [n for n in nodes if rng.random() > 0.15]
    free = {n: NODE_SLOTS - used[n] for n in up}
    queued = []
    for i in range(rng.randint(1, 6)):
        candidates = nodes if rng.random() < 0.7 else rng.sample(nodes, rng.randint(1, len(nodes)))
        count = per_node = None
        shape = rng.random()
        if shape < 0.2:
            count = rng.randint(1, len(candidates))
        elif shape < 0.35:
            per_node = rng.randint(1, NODE_SLOTS)
        queued.append({
            "id": f"j{i}", "user": rng.choice(["alice", "bob"]), "np": rng.randint(1, 8),
            "candidates": list(candidates), "count": count, "per_node": per_node,
            "walltime": rng.choice([5, 20, 60, 200, 1000]),
        })
    limits = rng.choice([None, {"max_running_jobs": 2}, {"max_slots": 6}])
    return queued, free, running, limits


def test_plan_properties_on_random_queues():
    for seed in range(3000):
        case = _random_case(random.Random(seed))
        try:
            _check_plan_properties(*case)
        except AssertionError as exc:
            raise AssertionError(f"seed {seed}: {exc}\ncase: {case!r}") from None


def _check_plan_properties(queued, free, running, limits):
    starts, blocked = sched.plan(queued, dict(free), running, NOW, NODE_SLOTS, limits)
    by_id = {j["id"]: j for j in queued}

    # Every queued job either starts or says why it waits.
    assert {s[0] for s in starts} | set(blocked) == set(by_id)
    assert not {s[0] for s in starts} & set(blocked)
    # Every start is whole, on its candidate nodes that are up.
    for job_id, placement in starts:
        job = by_id[job_id]
        assert sum(placement.values()) == job["np"]
        assert set(placement) <= set(job["candidates"]) & set(free)
        assert all(r > 0 for r in placement.values())
        if job["count"]:
            assert len(placement) <= job["count"]
        if job["per_node"]:
            assert max(placement.values()) <= job["per_node"]
    # Together they never over-commit a node.
    use = _per_node_use(starts)
    assert all(use[n] <= free[n] for n in use)
    # Starts come in submission order.
    order = [j["id"] for j in queued]
    started = [s[0] for s in starts]
    assert started == sorted(started, key=order.index)

    # First come, first served: until one job must wait for slots, every job within its
    # user's limit that fits what is left starts.
    remaining = dict(free)
    for job in queued:
        if blocked.get(job["id"]) == "user limit":
            continue
        placement = sched.fits(job, remaining, NODE_SLOTS)
        if placement is None:
            head = job
            break
        assert job["id"] in started, f"{job['id']} fits now and nothing before it waits"
        remaining = {n: s - dict(starts)[job["id"]].get(n, 0) for n, s in remaining.items()}
    else:
        head = None

    # Backfill never delays the head: jobs started after it in the queue do not push back
    # the time the head can start.
    if head is not None:
        ends = {j["id"]: NOW + j["walltime"] for j in queued}
        before = [(p, ends[i]) for i, p in starts if order.index(i) < order.index(head["id"])]
        holders = [(r["placement"], r["end"]) for r in running]
        without_backfill = dict(free)
        for placement, _ in before:
            without_backfill = {n: s - placement.get(n, 0) for n, s in without_backfill.items()}
        after_all = dict(free)
        for _, placement in starts:
            after_all = {n: s - placement.get(n, 0) for n, s in after_all.items()}
        expected = _earliest(head, without_backfill, holders + before)
        actual = _earliest(head, after_all, holders + [(p, ends[i]) for i, p in starts])
        assert actual <= expected, (
            f"backfill delayed head {head['id']} from {expected - NOW:+} to {actual - NOW:+}"
        )


# ------------------------------------------- equivalence with the unoptimised algorithm
#
# A verbatim copy of place(), fits() and plan() as they were before plan() was made fast
# (commit c6984db), kept as the reference: the fast plan() must take exactly the same
# decisions (same starts, in the same order, with the same placements, and the same
# reasons to wait) and place() must answer exactly as before, errors included. The
# spread policy came later: in the reference it is the obvious sort of each job's
# candidates by free slots (most first, ties in candidate order).


class _ReferenceNoFit(ValueError):
    pass


def _reference_place(np, free, count=None, per_node=None, node_slots=None):
    if node_slots is not None and per_node is not None and per_node > node_slots:
        raise _ReferenceNoFit(f"slots_per_node={per_node} exceeds the {node_slots} slots each node has")
    if count is not None:
        return _reference_place_on_count(np, free, count, per_node)
    placement, remaining = {}, np
    for node, available in free.items():
        if remaining == 0:
            break
        take = min(available, remaining) if per_node is None else min(per_node, remaining)
        if take <= 0 or take > available:
            continue
        placement[node] = take
        remaining -= take
    if remaining:
        detail = f" with {per_node} ranks per node" if per_node else ""
        raise _ReferenceNoFit(f"np={np} cannot be placed{detail}: free slots per node are {free}")
    return placement


def _reference_place_on_count(np, free, count, per_node):
    if count > len(free):
        raise _ReferenceNoFit(f"nodes={count} but only {len(free)} nodes are available")
    if np < count:
        raise _ReferenceNoFit(f"np={np} is fewer than nodes={count}: every node needs a rank")
    if per_node:
        last = np - per_node * (count - 1)
        if last > per_node:
            raise _ReferenceNoFit(f"np={np} does not fit {count} nodes x {per_node} slots")
        if last <= 0:
            raise _ReferenceNoFit(f"np={np} at {per_node} ranks per node needs fewer than {count} nodes")
        shares = [per_node] * (count - 1) + [last]
    else:
        base, extra = divmod(np, count)
        shares = [base + 1] * extra + [base] * (count - extra)
    shares.sort(reverse=True)
    placement = {}
    for node, available in free.items():
        share = next((s for s in shares if s <= available), None)
        if share is None:
            continue
        placement[node] = share
        shares.remove(share)
        if not shares:
            return placement
    raise _ReferenceNoFit(f"np={np} over {count} nodes cannot be placed: free slots per node are {free}")


def _reference_fits(job, free, node_slots, spread=False):
    candidates = {n: free[n] for n in job["candidates"] if n in free}
    if spread:
        candidates = dict(sorted(candidates.items(), key=lambda item: -item[1]))
    try:
        return _reference_place(job["np"], candidates, job.get("count"), job.get("per_node"), node_slots)
    except _ReferenceNoFit:
        return None


def _reference_subtract(free, placement):
    return {n: s - placement.get(n, 0) for n, s in free.items()}


def _reference_reserve(head, free, running, node_slots, spread=False):
    capacity = dict(free)
    for job in sorted(running, key=lambda r: r["end"]):
        for node, ranks in job["placement"].items():
            if node in capacity:
                capacity[node] += ranks
        placement = _reference_fits(head, capacity, node_slots, spread)
        if placement is not None:
            return job["end"], placement
    return math.inf, None


def _reference_within_limits(job, usage, limits):
    mine = usage.get(job["user"], {"jobs": 0, "slots": 0})
    max_jobs, max_slots = limits.get("max_running_jobs"), limits.get("max_slots")
    if max_jobs and mine["jobs"] + 1 > max_jobs:
        return False
    if max_slots and mine["slots"] + job["np"] > max_slots:
        return False
    return True


def _reference_plan(queued, free, running, now, node_slots, limits=None, usage=None,
                    spread=False):
    limits = limits or {}
    usage = {u: dict(v) for u, v in (usage or {}).items()}
    free = dict(free)
    running = list(running)
    starts, blocked = [], {}
    head, shadow_time, shadow_free = None, None, None
    for job in queued:
        if not _reference_within_limits(job, usage, limits):
            blocked[job["id"]] = "user limit"
            continue
        placement = _reference_fits(job, free, node_slots, spread)
        if head is None:
            if placement is None:
                head = job
                shadow_time, reserved = _reference_reserve(job, free, running, node_slots, spread)
                shadow_free = None
                if reserved is not None:
                    capacity = dict(free)
                    for run in running:
                        if run["end"] <= shadow_time:
                            for node, ranks in run["placement"].items():
                                if node in capacity:
                                    capacity[node] += ranks
                    shadow_free = _reference_subtract(capacity, reserved)
                blocked[job["id"]] = "resources"
                continue
        elif placement is not None:
            ends_in_time = now + job["walltime"] <= shadow_time
            if not ends_in_time:
                if shadow_free is None:
                    pass
                elif any(shadow_free.get(n, 0) < r for n, r in placement.items()):
                    blocked[job["id"]] = f"reserved for {head['id']}"
                    continue
                else:
                    shadow_free = _reference_subtract(shadow_free, placement)
        if placement is None:
            blocked[job["id"]] = "resources"
            continue
        starts.append((job["id"], placement))
        free = _reference_subtract(free, placement)
        running.append({"placement": placement, "end": now + job["walltime"]})
        mine = usage.setdefault(job["user"], {"jobs": 0, "slots": 0})
        mine["jobs"] += 1
        mine["slots"] += job["np"]
    return starts, blocked


def _outcome(call):
    """What a call returns, or the type and message of what it raises."""
    try:
        return "returns", call()
    except (ValueError, ZeroDivisionError) as exc:
        return "raises", "NoFit" if isinstance(exc, ValueError) else type(exc).__name__, str(exc)


def _random_free(rng, nodes, node_slots):
    """Free slots per node, mostly between 0 and node_slots, rarely over-committed."""
    return {n: rng.choice([0, node_slots, rng.randint(0, node_slots), rng.randint(-2, node_slots)])
            for n in nodes}


def test_place_answers_as_the_reference():
    for seed in range(3000):
        rng = random.Random(seed)
        node_slots = rng.randint(1, 8)
        nodes = [f"n{i}" for i in range(rng.randint(0, 8))]
        free = _random_free(rng, nodes, node_slots)
        np = rng.randint(-1, 3 * node_slots)
        count = rng.choice([None, None, rng.randint(-1, len(nodes) + 1)])
        per_node = rng.choice([None, None, rng.randint(0, node_slots + 1)])
        slots = rng.choice([None, node_slots])
        expected = _outcome(lambda: _reference_place(np, dict(free), count, per_node, slots))
        actual = _outcome(lambda: sched.place(np, dict(free), count, per_node, slots))
        assert actual == expected, f"seed {seed}: place({np}, {free}, {count}, {per_node}, {slots})"


def _random_cluster(rng, size):
    """(queued, free, running, now, node_slots, limits, usage) of a random cluster."""
    node_slots = rng.randint(1, 8)
    nodes = [f"n{i}" for i in range(rng.randint(1, size))]
    # Some nodes are down: absent from free, yet running jobs or candidates may name them.
    free = {n: node_slots for n in nodes if rng.random() > 0.1}
    now = 1000
    running, usage = [], {}
    users = ["alice", "bob", "carol"][:rng.randint(1, 3)]
    for _ in range(rng.randint(0, 2 * len(nodes))):
        placement = {}
        for node in rng.sample(nodes, rng.randint(1, min(3, len(nodes)))):
            room = free.get(node, node_slots)
            ranks = rng.randint(1, node_slots)
            if rng.random() < 0.9 and ranks > room:
                continue
            placement[node] = ranks
            if node in free:
                free[node] -= ranks
        if placement:
            # Integer times so ties (ends equal to each other, to the shadow time) happen.
            running.append({"placement": placement, "end": now + rng.choice([0, 10, 50, 100, 500])})
            mine = usage.setdefault(rng.choice(users), {"jobs": 0, "slots": 0})
            mine["jobs"] += 1
            mine["slots"] += sum(placement.values())
    everyone = list(nodes)
    grains = [sorted(rng.sample(nodes, rng.randint(1, len(nodes)))) for _ in range(2)]
    queued = []
    for i in range(rng.randint(1, 4 * size)):
        kind = rng.random()
        if kind < 0.5:
            candidates = everyone                         # one shared list object
        elif kind < 0.7:
            candidates = list(everyone)                   # an equal list of its own
        elif kind < 0.8:
            candidates = list(rng.choice(grains))         # a grain match
        elif kind < 0.9:
            candidates = rng.sample(nodes, rng.randint(1, len(nodes)))  # a node list
        else:
            # Any order, repeats and unknown nodes.
            candidates = [rng.choice(nodes + ["gone"]) for _ in range(rng.randint(0, 6))]
        count = per_node = None
        shape = rng.random()
        if shape < 0.2:
            count = rng.randint(1, len(nodes) + 1)
        elif shape < 0.35:
            per_node = rng.randint(1, node_slots + 1)
        elif shape < 0.45:
            count, per_node = rng.randint(1, len(nodes)), rng.randint(1, node_slots)
        np = rng.choice([1, 1, 2, rng.randint(1, node_slots), rng.randint(1, 3 * node_slots),
                         rng.randint(1, len(nodes) * node_slots)])
        queued.append({
            "id": f"j{i}", "user": rng.choice(users), "np": np, "candidates": candidates,
            "count": count, "per_node": per_node, "walltime": rng.choice([5, 10, 50, 100, 500, 5000, 5000]),
        })
    limits = rng.choice([None, {}, {"max_running_jobs": rng.randint(1, 4)},
                         {"max_slots": rng.randint(1, 4 * node_slots)},
                         {"max_running_jobs": 0, "max_slots": None}])
    return queued, free, running, now, node_slots, limits, rng.choice([usage, None])


@pytest.mark.parametrize("placement", sched.PLACEMENTS)
@pytest.mark.parametrize("size, cases", [(4, 1500), (12, 600), (60, 40)])
def test_plan_decides_as_the_reference(size, cases, placement):
    for seed in range(cases):
        queued, free, running, now, node_slots, limits, usage = _random_cluster(
            random.Random(f"{size}-{seed}"), size
        )
        expected = _reference_plan(queued, dict(free), list(running), now, node_slots, limits,
                                   usage, spread=placement == "spread")
        actual = sched.plan(queued, dict(free), list(running), now, node_slots, limits, usage,
                                placement=placement)
        assert actual == expected, f"size {size}, seed {seed}, {placement}"
        # Dicts compare equal in any order; the runner sees placements in this order.
        assert [list(p) for _, p in actual[0]] == [list(p) for _, p in expected[0]]
