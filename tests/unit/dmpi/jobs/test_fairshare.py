"""Unit tests of dmpi.jobs.fairshare: Slurm's classic fair share over decayed usage."""

import math

import pytest
from dmpi.jobs import fairshare

HOUR = 3600.0
SETTINGS = {"weight_fairshare": 10000, "weight_age": 1000, "max_age": 7 * 24 * HOUR}


def _queued(job_id, user, submitted=0.0):
    return {"job_id": job_id, "user": user, "submitted": submitted}


def _shown(found):
    return fairshare.shown(found)


def test_usage_halves_every_half_life():
    ran = fairshare.job_usage(4, 0.0, 10.0, 10.0, HOUR)
    # ten seconds of 4 ranks, barely decayed while they ran
    assert ran == pytest.approx(40.0, rel=1e-2) and ran < 40.0
    assert fairshare.job_usage(4, 0.0, 10.0, 10.0 + HOUR, HOUR) == pytest.approx(ran / 2)
    assert fairshare.job_usage(4, 0.0, 10.0, 10.0 + 3 * HOUR, HOUR) == pytest.approx(ran / 8)


def test_the_integral_over_a_long_run_is_exact():
    # A run of one half-life seen at its end: np * H/ln2 * (1 - 1/2).
    assert fairshare.job_usage(2, 0.0, HOUR, HOUR, HOUR) == pytest.approx(
        2 * HOUR / math.log(2) / 2)


def test_a_job_ended_before_the_kept_figure_is_decayed_to_its_time():
    kept = {"alice": [100.0, 2 * HOUR]}
    added = fairshare.add_job(kept, "alice", 2, 0.0, HOUR, HOUR)
    assert added["alice"][1] == 2 * HOUR
    assert added["alice"][0] == pytest.approx(
        100.0 + fairshare.job_usage(2, 0.0, HOUR, 2 * HOUR, HOUR))


def test_a_job_that_never_ran_has_no_usage():
    assert fairshare.job_usage(8, None, 10.0, 10.0, HOUR) == 0.0
    assert fairshare.job_usage(8, 10.0, 10.0, 10.0, HOUR) == 0.0


def test_ended_jobs_accumulate_decayed_and_running_ones_accrue():
    kept = fairshare.add_job({}, "alice", 2, 0.0, 100.0, HOUR)
    kept = fairshare.add_job(kept, "alice", 2, 100.0 + HOUR, 200.0 + HOUR, HOUR)
    first = fairshare.job_usage(2, 0.0, 100.0, 200.0 + HOUR, HOUR)
    second = fairshare.job_usage(2, 100.0 + HOUR, 200.0 + HOUR, 200.0 + HOUR, HOUR)
    assert kept["alice"][1] == 200.0 + HOUR
    assert kept["alice"][0] == pytest.approx(first + second)
    now = 200.0 + 2 * HOUR
    used = fairshare.usage(kept, [{"user": "bob", "np": 1, "started": now - 60},
                                  {"user": "carol", "np": 1, "started": None}], now, HOUR)
    assert used["alice"] == pytest.approx((first + second) / 2)
    assert used["bob"] == pytest.approx(fairshare.job_usage(1, now - 60, now, now, HOUR))
    assert "carol" not in used


def test_a_user_without_usage_comes_first_and_one_at_exactly_their_share_gets_half():
    found = _shown(fairshare.priorities([_queued("a", "alice"), _queued("b", "bob")],
                                        {"alice": 10.0, "bob": 0.0, "carol": 20.0}, 0.0,
                                        SETTINGS))
    assert found["b"] == {"priority": 10000, "fairshare": 1.0, "age": 0.0}
    # alice used a third of all usage, her share: 2^-1
    assert found["a"] == {"priority": 5000, "fairshare": 0.5, "age": 0.0}


def test_with_no_usage_anywhere_every_user_is_equal_and_age_breaks_no_tie_early():
    queued = [_queued("a1", "alice", 0.0), _queued("b1", "bob", 5.0)]
    found = fairshare.priorities(queued, {}, 10.0, SETTINGS)
    assert {v["fairshare"] for v in found.values()} == {1.0}
    assert [j["job_id"] for j in fairshare.order(queued, found)] == ["a1", "b1"]


def test_age_adds_up_to_its_weight_and_stops_at_max_age():
    queued = [_queued("old", "alice", 0.0), _queued("new", "alice", 7 * 24 * HOUR)]
    found = fairshare.priorities(queued, {}, 14 * 24 * HOUR, SETTINGS)
    assert _shown(found)["old"] == {"priority": 11000, "fairshare": 1.0, "age": 1.0}
    assert _shown(found)["new"] == {"priority": 11000, "fairshare": 1.0, "age": 1.0}
    # both capped: a tie, which keeps submission order
    assert [j["job_id"] for j in fairshare.order(queued[::-1], found)] == ["new", "old"]
    found = fairshare.priorities(queued, {}, 7 * 24 * HOUR, SETTINGS)
    assert found["old"]["priority"] == 11000 and found["new"]["priority"] == 10000


def test_a_user_with_500_queued_jobs_and_a_running_one_goes_after_a_user_with_one():
    queued = [_queued(f"a{i}", "alice", float(i)) for i in range(500)]
    queued.append(_queued("b0", "bob", 600.0))
    used = fairshare.usage({}, [{"user": "alice", "np": 1, "started": 599.0}], 601.0, HOUR)
    found = fairshare.priorities(queued, used, 601.0, SETTINGS)
    ordered = [j["job_id"] for j in fairshare.order(queued, found)]
    assert ordered[0] == "b0" and ordered[1:] == [f"a{i}" for i in range(500)]


def test_order_takes_the_schedulers_ids_too():
    waiting = [{"id": "x", "user": "alice"}, {"id": "y", "user": "bob"}]
    found = {"x": {"priority": 1}, "y": {"priority": 2}}
    assert [j["id"] for j in fairshare.order(waiting, found)] == ["y", "x"]


def test_the_pillars_durations_are_read_as_walltimes_are():
    assert fairshare.settings(None) == {"half_life": 7 * 86400, "max_age": 7 * 86400,
                                        "weight_fairshare": 10000, "weight_age": 1000}
    assert fairshare.settings({"half_life": "12h", "max_age": "1-00:00:00",
                               "weight_age": 0}) == {
        "half_life": 12 * 3600, "max_age": 86400, "weight_fairshare": 10000, "weight_age": 0}


def test_an_accumulator_halves_exactly_each_half_life_and_takes_later_jobs_decayed():
    kept = fairshare.add_job({}, "alice", 4, 0.0, HOUR, HOUR)
    value = kept["alice"][0]
    assert value == pytest.approx(4 * HOUR / math.log(2) / 2)
    assert fairshare.usage(kept, [], 2 * HOUR, HOUR)["alice"] == pytest.approx(value / 2)
    assert fairshare.usage(kept, [], 4 * HOUR, HOUR)["alice"] == pytest.approx(value / 8)
    # A job that ended before the accumulator's time is added decayed to that time.
    later = fairshare.add_job(kept, "alice", 4, 0.0, HOUR / 2, HOUR)
    assert later["alice"][1] == HOUR
    assert later["alice"][0] == pytest.approx(
        value + fairshare.job_usage(4, 0.0, HOUR / 2, HOUR, HOUR))


def test_users_whose_usage_decayed_to_nothing_leave_the_accumulator_and_the_count():
    kept = fairshare.add_job({}, "old", 1, 0.0, 100.0, HOUR)
    kept = fairshare.add_job(kept, "alice", 1, 40 * HOUR, 40 * HOUR + 100.0, HOUR)
    assert set(kept) == {"alice"}
    assert fairshare.usage({"old": [100.0, 0.0]}, [], 40 * HOUR, HOUR) == {}
    # alice alone has usage: of the two users that count, she used everything
    used = fairshare.usage(kept, [], 40 * HOUR + 100.0, HOUR)
    assert fairshare.factors(used, {"bob"}) == {"alice": 0.25, "bob": 1.0}


def test_a_users_first_job_just_started_ranks_them_below_a_user_without_usage():
    queued = [_queued("a1", "alice", 0.0), _queued("b1", "bob", 5.0)]
    used = fairshare.usage({}, [{"user": "alice", "np": 1, "started": 9.5}], 10.0, HOUR)
    assert 0 < used["alice"] < fairshare.NEGLIGIBLE
    found = fairshare.priorities(queued, used, 10.0, SETTINGS)
    # alice holds all usage of the two users: 2^(-1 / 0.5)
    assert _shown(found)["a1"] == {"priority": 2500, "fairshare": 0.25, "age": 0.0}
    assert [j["job_id"] for j in fairshare.order(queued, found)] == ["b1", "a1"]


def test_the_exact_priority_orders_where_the_shown_integers_tie():
    found = {"x": {"priority": 10000, "exact": 9999.6}, "y": {"priority": 10000,
                                                              "exact": 10000.2}}
    waiting = [{"id": "x"}, {"id": "y"}]
    assert [j["id"] for j in fairshare.order(waiting, found)] == ["y", "x"]


def test_a_flood_holds_another_user_back_by_one_job_at_most_from_an_empty_start():
    queued = [_queued(f"a{i}", "alice", float(i)) for i in range(500)]
    queued.append(_queued("b0", "bob", 600.0))
    # Nobody has usage: alice's first job is the oldest and goes first...
    found = fairshare.priorities(queued, {}, 601.0, SETTINGS)
    assert fairshare.order(queued, found)[0]["job_id"] == "a0"
    # ...and once it runs, bob's comes before every other one of hers.
    rest = queued[1:]
    used = fairshare.usage({}, [{"user": "alice", "np": 1, "started": 601.0}], 602.0, HOUR)
    found = fairshare.priorities(rest, used, 602.0, SETTINGS)
    assert fairshare.order(rest, found)[0]["job_id"] == "b0"


def test_the_usage_report_gives_each_users_decayed_core_hours_and_factor():
    assert fairshare.report({"alice": 7200.0}, {"bob"}) == {
        "alice": {"decayed_core_hours": 2.0, "fairshare": 0.25},
        "bob": {"decayed_core_hours": 0.0, "fairshare": 1.0}}
    assert fairshare.report({}) == {}
