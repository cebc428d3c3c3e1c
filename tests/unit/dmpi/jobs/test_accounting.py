"""Unit tests of ``dmpi.jobs.accounting``: the accounting figures of mpi.history and
mpi.usage, computed by hand here."""

import csv
import io

import pytest

from dmpi.jobs import accounting


def _job(job_id, user, state, np, submitted, started, ended, **extra):
    return dict({"job_id": job_id, "user": user, "state": state, "np": np,
                 "submitted": submitted, "started": started, "ended": ended,
                 "placement": {"node2": 1, "node1": np - 1}}, **extra)


def test_history_row_core_hours_are_ranks_times_elapsed():
    row = accounting.history_row(_job("j", "alice", "succeeded", 4, 100.0, 160.0, 1960.0,
                                       exit_code=0, name="sim"))
    assert row["elapsed"] == 1800.0
    assert row["core_hours"] == 2.0  # 4 ranks x half an hour
    assert row["queue_wait"] == 60.0
    assert row["nodes"] == ["node1", "node2"]
    assert set(row) == set(accounting.HISTORY_FIELDS)


def test_a_history_row_needs_only_the_record_fields_the_store_picks_out():
    record = _job("j", "alice", "failed", 4, 100.0, 160.0, 1960.0, exit_code=3, name="sim",
                  reason="rank 1 exited 3", spec={"cmd": ["a"]}, history=[], timings={})
    picked = {key: record.get(key) for key in accounting.RECORD_FIELDS}
    assert accounting.history_row(picked) == accounting.history_row(record)
    assert accounting.history_row(picked)["nodes"] == ["node1", "node2"]


def test_a_job_cancelled_in_the_queue_used_nothing():
    row = accounting.history_row(_job("j", "alice", "cancelled", 8, 100.0, None, 400.0))
    assert (row["elapsed"], row["core_hours"], row["queue_wait"]) == (0.0, 0.0, 300.0)


def test_usage_per_user_and_totals():
    rows = [accounting.history_row(r) for r in (
        _job("a1", "alice", "succeeded", 2, 0.0, 10.0, 3610.0),   # 2 core-hours, wait 10
        _job("a2", "alice", "failed", 4, 0.0, 30.0, 930.0),       # 1 core-hour, wait 30
        _job("a3", "alice", "cancelled", 4, 0.0, None, 50.0),     # never started
        _job("b1", "bob", "timed_out", 1, 0.0, 100.0, 7300.0),    # 2 core-hours, wait 100
    )]
    active = [{"user": "bob", "state": "queued"}, {"user": "carol", "state": "starting"},
              {"user": "carol", "state": "running"}]
    found = accounting.usage(rows, active)
    alice = found["users"]["alice"]
    assert alice["jobs"] == {"succeeded": 1, "failed": 1, "cancelled": 1, "timed_out": 0,
                             "total": 3}
    assert alice["core_hours"] == pytest.approx(3.0)
    assert (alice["queue_wait_mean"], alice["queue_wait_max"]) == (20.0, 30.0)
    assert found["users"]["bob"]["jobs"]["queued"] == 1
    assert found["users"]["bob"]["jobs"]["total"] == 2
    assert found["users"]["carol"]["jobs"] == {"succeeded": 0, "failed": 0, "cancelled": 0,
                                               "timed_out": 0, "running": 2, "total": 2}
    assert found["users"]["carol"]["queue_wait_mean"] is None
    total = found["total"]
    assert total["core_hours"] == pytest.approx(5.0)
    assert total["jobs"]["total"] == 7
    assert total["queue_wait_max"] == 100.0
    assert total["queue_wait_mean"] == pytest.approx(140 / 3, abs=1e-3)


def test_usage_of_nothing_is_zero():
    assert accounting.usage([]) == {"users": {}, "total": {
        "jobs": {"succeeded": 0, "failed": 0, "cancelled": 0, "timed_out": 0, "total": 0},
        "core_hours": 0.0, "elapsed": 0.0, "queue_wait_mean": None, "queue_wait_max": None}}


def test_csv_has_a_header_and_one_line_per_job_with_commas_quoted():
    rows = [accounting.history_row(_job("j1", "alice", "failed", 2, 0.0, 1.0, 3.0,
                                         reason="rank 1 exited with code 3, badly"))]
    text = accounting.to_csv(rows)
    parsed = list(csv.DictReader(io.StringIO(text)))
    assert list(parsed[0]) == list(accounting.HISTORY_FIELDS)
    assert parsed[0]["reason"] == "rank 1 exited with code 3, badly"
    assert parsed[0]["nodes"] == "node1,node2"
    assert len(text.splitlines()) == 2
