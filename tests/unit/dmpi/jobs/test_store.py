"""
Unit tests for ``dmpi.jobs.store``: the master's SQLite record of jobs and nodes.

The store is what ``salt-run mpi.status``/``mpi.list`` show and what decides which of
several racing parties (the job controller's threads, ``mpi.cancel``) ends a job, so these tests
check what a reader sees after each write, and that a job ends exactly once even when
two processes race for it.
"""

import json
import multiprocessing
import sqlite3
import threading
import time

import pytest

from dmpi.contract import FINAL
from dmpi.jobs import store as job_store


def _record(job_id, user="alice", **extra):
    return dict({"job_id": job_id, "user": user, "state": "queued", "np": 2}, **extra)


@pytest.fixture
def store(tmp_path):
    return job_store.open_store(str(tmp_path / "cache" / "mpi" / "jobs.sqlite"))


# ------------------------------------------------------------------------------- jobs


def test_add_then_get_returns_the_record(store):
    store.add(_record("j1", cmd=["hostname"]))
    record = store.get("j1")
    assert record["job_id"] == "j1"
    assert record["state"] == "queued"
    assert record["cmd"] == ["hostname"]


def test_get_unknown_job_is_none(store):
    assert store.get("nope") is None


def test_add_same_id_twice_is_refused(store):
    store.add(_record("j1"))
    with pytest.raises(sqlite3.IntegrityError):
        store.add(_record("j1"))
    assert len(store.jobs()) == 1


def test_jobs_come_in_submission_order(store):
    for job_id in ("c", "a", "b"):
        store.add(_record(job_id))
    assert [r["job_id"] for r in store.jobs()] == ["c", "a", "b"]


def test_jobs_filter_by_state_and_user(store):
    store.add(_record("a1", user="alice"))
    store.add(_record("b1", user="bob"))
    store.add(_record("a2", user="alice"))
    store.transition("a1", "running")
    store.transition("b1", "starting")
    assert [r["job_id"] for r in store.jobs(states=["queued"])] == ["a2"]
    assert [r["job_id"] for r in store.jobs(states=("starting", "running"))] == ["a1", "b1"]
    assert [r["job_id"] for r in store.jobs(user="alice")] == ["a1", "a2"]
    assert [r["job_id"] for r in store.jobs(states=["running"], user="bob")] == []
    assert store.jobs(states=["failed"]) == []


def test_transition_records_state_time_and_reason(store):
    store.add(_record("j1", history=[{"state": "queued", "at": 1.0, "reason": None}]))
    before = time.time()
    record = store.transition("j1", "failed", reason="rank 3 exited with 1",
                              expect=("queued",), exit_code=1)
    after = time.time()
    assert record["state"] == "failed"
    assert record["reason"] == "rank 3 exited with 1"
    assert record["exit_code"] == 1
    assert [h["state"] for h in record["history"]] == ["queued", "failed"]
    last = record["history"][-1]
    assert last["reason"] == "rank 3 exited with 1"
    assert before <= last["at"] <= after
    assert store.get("j1") == record


def test_transition_keeps_whole_history(store):
    store.add(_record("j1"))
    store.transition("j1", "starting")
    store.transition("j1", "running")
    store.transition("j1", "succeeded")
    history = store.get("j1")["history"]
    assert [h["state"] for h in history] == ["starting", "running", "succeeded"]
    assert history[0]["at"] <= history[1]["at"] <= history[2]["at"]
    assert store.get("j1")["reason"] is None


def test_transition_to_final_clears_an_earlier_reason(store):
    store.add(_record("j1"))
    store.transition("j1", "running", reason="started late")
    assert store.get("j1")["reason"] == "started late"
    assert store.transition("j1", "succeeded")["reason"] is None


def test_transition_refused_when_job_not_in_expected_state(store):
    store.add(_record("j1"))
    assert store.transition("j1", "failed", expect=("running",)) is None
    assert store.get("j1")["state"] == "queued"
    assert "history" not in store.get("j1")


def test_transition_of_unknown_job_is_none(store):
    assert store.transition("nope", "failed") is None


def test_transition_to_unknown_state_raises(store):
    store.add(_record("j1"))
    with pytest.raises(job_store.StoreError, match="unknown job state 'done'"):
        store.transition("j1", "done")
    assert store.get("j1")["state"] == "queued"


def test_only_first_of_two_final_transitions_wins(store):
    store.add(_record("j1"))
    store.transition("j1", "running")
    first = store.transition("j1", "cancelled", reason="cancelled by request", expect=("running",))
    second = store.transition("j1", "failed", reason="node lost", expect=("running",))
    assert first["state"] == "cancelled"
    assert second is None
    record = store.get("j1")
    assert record["state"] == "cancelled"
    assert record["reason"] == "cancelled by request"
    assert [h["state"] for h in record["history"]] == ["running", "cancelled"]


def test_fields_of_a_transition_are_kept_by_later_ones(store):
    store.add(_record("j1"))
    assert store.transition("j1", "starting", placement={"n1": 2})["placement"] == {"n1": 2}
    assert store.jobs()[0]["placement"] == {"n1": 2}
    assert store.transition("j1", "running")["placement"] == {"n1": 2}
    assert store.get("j1")["placement"] == {"n1": 2}


def test_update_merges_fields_without_changing_state(store):
    store.add(_record("j1"))
    store.transition("j1", "starting", placement={"n1": 2})
    store.update("j1", waiting_for=None, timings={"pull": 1.5})
    record = store.get("j1")
    assert record["state"] == "starting"
    assert record["timings"] == {"pull": 1.5}
    assert record["waiting_for"] is None
    assert record["np"] == 2
    assert record["placement"] == {"n1": 2}
    assert [h["state"] for h in record["history"]] == ["starting"]


def test_update_unknown_job_is_none(store):
    assert store.update("nope", x=1) is None
    assert store.jobs() == []


# ------------------------------------------------------------------------------ nodes


def test_node_seen_inserts_then_replaces(store):
    assert store.nodes() == {}
    store.node_seen("n1", {"jobs": {}}, when=100.0)
    store.node_seen("n2", {"engine": True}, when=101.0)
    store.node_seen("n1", {"jobs": {"j1": "running"}}, when=102.0)
    assert store.nodes() == {
        "n1": {"last_seen": 102.0, "report": {"jobs": {"j1": "running"}}},
        "n2": {"last_seen": 101.0, "report": {"engine": True}},
    }


def test_node_seen_defaults_to_now(store):
    before = time.time()
    store.node_seen("n1", {})
    assert before <= store.nodes()["n1"]["last_seen"] <= time.time()


# ------------------------------------------------------------------------------- meta


def test_meta_default_then_set_then_overwrite(store):
    assert store.get_meta("site") is None
    assert store.get_meta("next_counter", 0) == 0
    store.set_meta("site", {"config": {"slots_per_node": 4}})
    store.set_meta("next_counter", 5)
    store.set_meta("next_counter", 6)
    assert store.get_meta("site") == {"config": {"slots_per_node": 4}}
    assert store.get_meta("next_counter", 0) == 6


# ------------------------------------------------------------------------ transactions


def test_transaction_rolls_back_everything_on_exception(store):
    store.add(_record("j1"))
    with pytest.raises(RuntimeError):
        with store.transaction() as conn:
            assert store.transition("j1", "starting", conn=conn)["state"] == "starting"
            store.update("j1", conn=conn, waiting_for="resources")
            store.set_meta("next_counter", 3, conn=conn)
            assert store.get("j1", conn=conn)["state"] == "starting"
            raise RuntimeError("schedule crashed")
    record = store.get("j1")
    assert record["state"] == "queued"
    assert "waiting_for" not in record
    assert store.get_meta("next_counter") is None


def test_transaction_commits_on_success(store):
    store.add(_record("j1"))
    with store.transaction() as conn:
        store.transition("j1", "starting", conn=conn)
        store.set_meta("next_counter", 1, conn=conn)
    assert store.get("j1")["state"] == "starting"
    assert store.get_meta("next_counter") == 1


# ---------------------------------------------------------------------------- schema


def test_reopening_keeps_the_data(tmp_path):
    path = str(tmp_path / "jobs.sqlite")
    job_store.open_store(path).add(_record("j1"))
    assert job_store.open_store(path).get("j1")["job_id"] == "j1"


def test_schema_version_mismatch_raises(tmp_path):
    path = tmp_path / "jobs.sqlite"
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {job_store.SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(job_store.StoreError, match=f"has schema {job_store.SCHEMA_VERSION + 1}"):
        job_store.open_store(str(path))


# The schema as DockerMPI 1 (stop 5) wrote it, to prove an upgrade keeps its records.
_SCHEMA_V1 = """
CREATE TABLE jobs (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE,
    user TEXT NOT NULL, state TEXT NOT NULL, port_slot INTEGER, record TEXT NOT NULL);
CREATE INDEX jobs_state ON jobs (state);
CREATE TABLE nodes (id TEXT PRIMARY KEY, last_seen REAL NOT NULL, report TEXT NOT NULL);
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
PRAGMA user_version = 1;
"""


def test_a_version_1_store_is_migrated_with_its_records_intact(tmp_path):
    path = tmp_path / "jobs.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript(_SCHEMA_V1)
    old = _record("j1")
    conn.execute("INSERT INTO jobs (id, user, state, port_slot, record) VALUES (?, ?, ?, ?, ?)",
                 ("j1", "alice", "succeeded", 4, json.dumps(old)))
    conn.execute("INSERT INTO meta (key, value) VALUES ('next_port_slot', '5')")
    conn.commit()
    conn.close()
    store = job_store.open_store(str(path))
    record = store.get("j1")
    assert record["job_id"] == "j1" and "port_slot" not in record
    assert store.get_meta("next_port_slot") == 5
    assert store.user_uid("alice", 100000, 100009) == (100000, True)
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == job_store.SCHEMA_VERSION
    conn.close()


# The schema 3 store (hub identities, before drains), as the previous release left it.
_SCHEMA_V3 = _SCHEMA_V1.replace("PRAGMA user_version = 1;", "") + """
CREATE TABLE users (name TEXT PRIMARY KEY, uid INTEGER NOT NULL UNIQUE, created REAL NOT NULL,
    dir_ready INTEGER NOT NULL DEFAULT 0, identity TEXT);
CREATE UNIQUE INDEX users_identity ON users (identity);
PRAGMA user_version = 3;
"""


def test_a_version_3_store_is_migrated_with_its_records_intact(tmp_path):
    path = tmp_path / "jobs.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript(_SCHEMA_V3)
    conn.execute("INSERT INTO jobs (id, user, state, port_slot, record) VALUES (?, ?, ?, ?, ?)",
                 ("j1", "alice", "running", None, json.dumps(_record("j1"))))
    conn.execute("INSERT INTO users (name, uid, created, dir_ready, identity) "
                 "VALUES ('alice', 100004, 1.0, 1, 'Alice@hub')")
    conn.execute("INSERT INTO nodes (id, last_seen, report) VALUES ('node1', 5.0, '{}')")
    conn.execute("INSERT INTO meta (key, value) VALUES ('next_uid', '100005')")
    conn.commit()
    conn.close()
    store = job_store.open_store(str(path))
    assert store.get("j1")["job_id"] == "j1" and store.jobs(["running"])[0]["job_id"] == "j1"
    assert store.users()["alice"] == {"uid": 100004, "created": 1.0, "dir_ready": True,
                                      "identity": "Alice@hub"}
    assert store.nodes() == {"node1": {"last_seen": 5.0, "report": {}}}
    assert store.get_meta("next_uid") == 100005
    assert store.drains() == {}
    store.drain("node1", "maintenance")
    assert job_store.open_store(str(path)).drains()["node1"]["reason"] == "maintenance"
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == job_store.SCHEMA_VERSION == 7
    assert {"jobs_user", "jobs_user_ended"} <= {r[0] for r in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'index'")}
    conn.close()


def test_a_path_is_opened_and_its_schema_checked_once_per_process(tmp_path):
    path = str(tmp_path / "jobs.sqlite")
    store = job_store.open_store(path)
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {job_store.SCHEMA_VERSION + 1}")
    conn.close()
    # Every API call opens the store: it is the same one, not checked again.
    assert job_store.open_store(path) is store


def test_a_store_file_replaced_at_its_path_is_opened_and_checked_anew(tmp_path):
    path = tmp_path / "jobs.sqlite"
    store = job_store.open_store(str(path))
    store.add(_record("j1"))
    assert store.get("j1")["job_id"] == "j1"  # this thread's reader holds the old file
    for name in ("jobs.sqlite", "jobs.sqlite-wal", "jobs.sqlite-shm"):
        (tmp_path / name).unlink(missing_ok=True)
    conn = sqlite3.connect(path)
    conn.executescript(_SCHEMA_V1)
    conn.execute("INSERT INTO jobs (id, user, state, record) VALUES (?, ?, ?, ?)",
                 ("j2", "alice", "queued", json.dumps(_record("j2"))))
    conn.commit()
    conn.close()
    reopened = job_store.open_store(str(path))
    assert reopened is not store
    assert reopened.get("j2")["job_id"] == "j2" and reopened.get("j1") is None
    assert reopened.drains() == {}  # migrated: schema 4 has drains
    assert store.get("j2")["job_id"] == "j2"  # the old object reads the new file too


def test_reads_see_every_write_committed_before_them_by_any_connection(store):
    store.add(_record("j1"))
    assert store.get("j1")["state"] == "queued"
    assert store.jobs(states=["queued"], keys=["job_id", "state"]) == [
        {"job_id": "j1", "state": "queued"}]
    # Another connection (another process, as the job controller) writes in between reads.
    conn = sqlite3.connect(store.path, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("UPDATE jobs SET state = 'running', record = json_set(record, '$.state', "
                 "'running') WHERE id = 'j1'")
    assert store.get("j1")["state"] == "queued"  # not committed yet
    conn.execute("COMMIT")
    conn.close()
    assert store.get("j1")["state"] == "running"
    assert store.jobs(states=["running"], keys=["job_id", "state"]) == [
        {"job_id": "j1", "state": "running"}]
    store.set_meta("waiting", {"j2": "free slots"})
    assert store.get_meta("waiting") == {"j2": "free slots"}


def test_each_thread_reads_through_a_connection_of_its_own(store):
    store.add(_record("j1"))
    results, errors = [], []

    def read():
        try:
            for _ in range(50):
                results.append(store.get("j1")["job_id"])
        except Exception as exc:  # pylint: disable=broad-except
            errors.append(exc)

    threads = [threading.Thread(target=read) for _ in range(4)]
    for thread in threads:
        thread.start()
    for i in range(20):
        store.update("j1", tick=i)
    for thread in threads:
        thread.join(30)
    assert errors == [] and results == ["j1"] * 200
    assert store.get("j1")["tick"] == 19


def _read_in_child(store, results):
    results.put(store.get("j1")["state"])


def test_a_forked_child_opens_its_own_reader_and_leaves_the_parents_alone(store):
    store.add(_record("j1"))
    assert store.get("j1")["state"] == "queued"  # the parent's reader is open
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    child = ctx.Process(target=_read_in_child, args=(store, results))
    child.start()
    assert results.get(timeout=30) == "queued"
    child.join(30)
    assert child.exitcode == 0
    store.transition("j1", "running")
    assert store.get("j1")["state"] == "running"


def test_jobs_with_keys_gives_those_fields_as_whole_records_hold_them(store):
    store.add(_record("a1", name="x", submitted=1764686400.1234567, np=3))
    store.add(_record("b1", user="bob", submitted=0.1 + 0.2))
    store.transition("a1", "running", placement={"node1": 2, "node2": 1}, started=1e-7)
    keys = ("job_id", "name", "state", "np", "placement", "submitted", "started", "nope")
    full = [{k: r.get(k) for k in keys} for r in store.jobs()]
    assert store.jobs(keys=keys) == full
    assert full[0]["placement"] == {"node1": 2, "node2": 1}
    assert full[0]["submitted"] == 1764686400.1234567 and full[1]["submitted"] == 0.1 + 0.2
    assert store.jobs(states=["running"], user="alice", keys=["job_id"]) == [{"job_id": "a1"}]
    assert store.jobs(user="carol", keys=keys) == []


def test_jobs_ended_in_a_window_are_picked_by_their_end_half_open_on_its_end(store):
    store.add(_record("early", submitted=10.0, ended=99.5, state="succeeded"))
    store.add(_record("on-since", submitted=20.0, ended=100.0, state="failed"))
    store.add(_record("on-until", submitted=30.0, ended=200.0, state="succeeded"))
    store.add(_record("never-ran", submitted=150.0, state="cancelled"))  # ends as submitted
    store.add(_record("bob-in", user="bob", submitted=40.0, ended=120.0, state="failed"))

    def ids(**given):
        return [r["job_id"] for r in store.jobs(keys=("job_id",), **given)]

    assert ids(ended_in=(100.0, 200.0)) == ["on-since", "never-ran", "bob-in"]
    assert ids(ended_in=(100.0, 200.0), user="alice", states=["failed", "cancelled"]) == [
        "on-since", "never-ran"]
    assert ids(ended_in=(None, 100.0)) == ["early"]
    assert ids(ended_in=(200.0, None)) == ["on-until"]
    assert ids(ended_in=(None, None)) == ids() == [
        "early", "on-since", "on-until", "never-ran", "bob-in"]
    assert [r["job_id"] for r in store.jobs(ended_in=(150.0, 150.5))] == ["never-ran"]


def test_jobs_come_in_pages_after_a_jobs_place_in_submission_order(store):
    for job_id, user in (("a1", "alice"), ("b1", "bob"), ("a2", "alice"), ("a3", "alice")):
        store.add(_record(job_id, user=user))
    assert store.seq_of("a1") < store.seq_of("b1") < store.seq_of("a2")
    assert store.seq_of("b1", user="alice") is None and store.seq_of("nope") is None

    def ids(**given):
        return ([r["job_id"] for r in store.jobs(user="alice", **given)],
                [r["job_id"] for r in store.jobs(user="alice", keys=("job_id",), **given)])

    assert ids(limit=2) == (["a1", "a2"],) * 2
    assert ids(after=store.seq_of("a2"), limit=2) == (["a3"],) * 2
    assert ids(after=store.seq_of("b1")) == (["a2", "a3"],) * 2
    assert ids(limit=0) == ([],) * 2
    for limit in (-1, 1.0, "1; DROP TABLE jobs", True):
        with pytest.raises(ValueError, match="limit must be a whole number of rows"):
            store.jobs(limit=limit)
    assert len(store.jobs()) == 4


def test_a_users_window_of_history_is_searched_by_index_not_read_whole(store):
    # The planner must find the index's expression in the query: a user with years of
    # jobs asks for last week's without SQLite decoding every record of theirs.
    query, args = store._where(list(FINAL), "alice", None, (100.0, 200.0))
    plan = " ".join(str(row[-1]) for row in sqlite3.connect(store.path).execute(
        f"EXPLAIN QUERY PLAN SELECT record FROM jobs{query} ORDER BY seq", args))
    assert "USING INDEX jobs_user_ended" in plan, plan


# -------------------------------------------------------------------------- drains


def test_a_drain_is_kept_until_resumed_and_a_second_drain_keeps_its_start(store):
    first = store.drain("node2", "disk swap", by="root")
    assert first["reason"] == "disk swap" and first["by"] == "root"
    again = store.drain("node2", "disk swap, then firmware")
    assert again["since"] == first["since"] and again["reason"] == "disk swap, then firmware"
    assert set(store.drains()) == {"node2"}
    assert store.resume("node2")["reason"] == "disk swap, then firmware"
    assert store.drains() == {} and store.resume("node2") is None


# ---------------------------------------------------------------------------- users


def test_each_user_gets_their_own_uid_once_and_for_good(store):
    assert store.user_uid("alice", 100000, 100009) == (100000, True)
    assert store.user_uid("bob", 100000, 100009) == (100001, True)
    assert store.user_uid("alice", 100000, 100009) == (100000, False)
    assert store.users()["bob"]["uid"] == 100001


def test_a_uid_is_never_reused_even_when_its_user_row_is_gone(store, tmp_path):
    store.user_uid("alice", 100000, 100009)
    with store.transaction() as conn:
        conn.execute("DELETE FROM users WHERE name = 'alice'")
    assert store.user_uid("carol", 100000, 100009) == (100001, True)


def test_an_exhausted_uid_range_is_a_clear_error(store):
    store.user_uid("alice", 100000, 100000)
    with pytest.raises(job_store.StoreError, match="range 100000-100000 is used up"):
        store.user_uid("bob", 100000, 100000)


def test_user_directory_readiness_is_recorded(store):
    store.user_uid("alice", 100000, 100009)
    assert store.users()["alice"]["dir_ready"] is False
    store.set_user_dir_ready("alice")
    assert store.users()["alice"]["dir_ready"] is True


# ------------------------------------------------------------------------ concurrency

RACE_JOBS = 50


def _race(path, name, barrier, results):
    """Try to fail every job that is running; report the ones this process ended."""
    store = job_store.open_store(path)
    barrier.wait()
    won = []
    for i in range(RACE_JOBS):
        if store.transition(f"j{i}", "failed", reason=name, expect=("running",)) is not None:
            won.append(f"j{i}")
    results.put((name, won))


def test_two_processes_racing_to_end_jobs_each_job_ends_once(tmp_path):
    path = str(tmp_path / "jobs.sqlite")
    store = job_store.open_store(path)
    for i in range(RACE_JOBS):
        store.add(_record(f"j{i}"))
        store.transition(f"j{i}", "running")
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_race, args=(path, name, barrier, results)) for name in ("p1", "p2")]
    for proc in procs:
        proc.start()
    won = dict(results.get(timeout=60) for _ in procs)
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    assert not set(won["p1"]) & set(won["p2"])
    assert sorted(won["p1"] + won["p2"]) == sorted(f"j{i}" for i in range(RACE_JOBS))
    for i in range(RACE_JOBS):
        record = store.get(f"j{i}")
        winner = "p1" if f"j{i}" in won["p1"] else "p2"
        assert record["state"] == "failed"
        assert record["reason"] == winner
        assert [h["state"] for h in record["history"]] == ["running", "failed"]


# ------------------------------------------------------------- schema moves on


# The schema of version 3 exactly as it is today: a store written now must survive the
# next schema change with its records intact.
_SCHEMA_V3 = """
CREATE TABLE jobs (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE,
    user TEXT NOT NULL, state TEXT NOT NULL, port_slot INTEGER, record TEXT NOT NULL);
CREATE INDEX jobs_state ON jobs (state);
CREATE TABLE nodes (id TEXT PRIMARY KEY, last_seen REAL NOT NULL, report TEXT NOT NULL);
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE users (name TEXT PRIMARY KEY, uid INTEGER NOT NULL UNIQUE, created REAL NOT NULL,
    dir_ready INTEGER NOT NULL DEFAULT 0, identity TEXT UNIQUE);
PRAGMA user_version = 3;
"""


_SCHEMA_V4_ADDS = """
CREATE TABLE drains (
    node TEXT PRIMARY KEY,
    reason TEXT NOT NULL,
    since REAL NOT NULL,
    by TEXT
);
"""


_SCHEMA_V5_ADDS = "CREATE INDEX jobs_user ON jobs (user, seq);\n"
_SCHEMA_V6_CHANGES = "ALTER TABLE jobs DROP COLUMN port_slot;\n"
_SCHEMA_V7_ADDS = ("CREATE INDEX jobs_user_ended ON jobs (user, COALESCE(json_extract("
                   "record, '$.ended'), json_extract(record, '$.submitted')));\n")


def _index_sql(conn):
    """Each index's expression, spaces and case aside (index_info names no expression)."""
    return {name: " ".join(sql.upper().replace("CREATE INDEX IF NOT EXISTS",
                                               "CREATE INDEX").split())
            for name, sql in conn.execute(
                "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL")}


def test_todays_schema_is_version_7_as_frozen_here(tmp_path):
    """If this fails the schema changed: add a migration from 7 and a frozen copy of 8."""
    store = job_store.open_store(str(tmp_path / "new.sqlite"))
    frozen = sqlite3.connect(":memory:")
    frozen.executescript(_SCHEMA_V3 + _SCHEMA_V4_ADDS + _SCHEMA_V5_ADDS + _SCHEMA_V6_CHANGES
                         + _SCHEMA_V7_ADDS)

    def columns(conn):
        tables = [r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name != 'sqlite_sequence'")]
        indexes = {t: sorted((r[1], tuple(c[2] for c in conn.execute(
            f"PRAGMA index_info({r[1]})"))) for r in conn.execute(f"PRAGMA index_list({t})")
            if r[3] == "c") for t in tables}
        return ({t: [r[1:3] for r in conn.execute(f"PRAGMA table_info({t})")] for t in tables},
                indexes)

    with store._connect() as conn:
        assert columns(conn) == columns(frozen)
        assert _index_sql(conn) == _index_sql(frozen)
    assert job_store.SCHEMA_VERSION == 7


def test_a_version_3_store_is_migrated_with_its_records_intact_when_the_schema_moves_on(
        tmp_path, monkeypatch):
    path = str(tmp_path / "jobs.sqlite")
    conn = sqlite3.connect(path)
    conn.executescript(_SCHEMA_V3)
    conn.execute("INSERT INTO jobs (id, user, state, port_slot, record) VALUES (?, ?, ?, ?, ?)",
                 ("j1", "alice", "succeeded", 3, json.dumps(_record("j1", state="succeeded",
                                                                    ended=5.0))))
    conn.execute("INSERT INTO users VALUES ('alice', 100000, 1.0, 1, 'alice@hub')")
    conn.execute("INSERT INTO meta VALUES ('next_uid', '100001')")
    conn.commit()
    conn.close()
    # Today's steps from 3 and one after them that adds a column: every step must keep
    # every record.
    monkeypatch.setattr(job_store, "SCHEMA_VERSION", 8)
    monkeypatch.setitem(job_store._MIGRATIONS, 7, "ALTER TABLE jobs ADD COLUMN ended REAL;\n")
    store = job_store.open_store(path)
    record = store.get("j1")
    assert (record["state"], record["ended"]) == ("succeeded", 5.0)
    assert "port_slot" not in record
    assert store.drains() == {}
    assert store.users()["alice"] == {"uid": 100000, "created": 1.0, "dir_ready": True,
                                      "identity": "alice@hub"}
    assert store.user_uid("bob", 100000, 100009) == (100001, True)
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 8
    assert [r[1] for r in conn.execute("PRAGMA table_info(jobs)")] == [
        "seq", "id", "user", "state", "record", "ended"]
    conn.close()


# ------------------------------------------------------------------ retention


def _ended(store, job_id, state, ended, user="alice"):
    store.add(_record(job_id, user=user))
    store.transition(job_id, state, ended=ended)


def test_prune_removes_only_jobs_that_ended_before_the_cutoff(store):
    _ended(store, "old-ok", "succeeded", 100.0)
    _ended(store, "old-failed", "failed", 150.0)
    _ended(store, "new", "succeeded", 300.0)
    store.add(_record("queued-long-ago", submitted=1.0))
    store.add(_record("running-long-ago"))
    store.transition("running-long-ago", "running", started=2.0, ended=3.0)  # no end: active
    assert sorted(store.prune(200.0)) == ["old-failed", "old-ok"]
    assert [r["job_id"] for r in store.jobs()] == ["new", "queued-long-ago", "running-long-ago"]
    assert store.prune(200.0) == []


# --------------------------------------------------------------- backup, restore


def test_backup_then_restore_gives_back_the_records(store, tmp_path):
    _ended(store, "j1", "succeeded", 10.0)
    _ended(store, "j2", "failed", 20.0, user="bob")
    store.user_uid("alice", 100000, 100009, identity="alice@hub")
    store.set_meta("engine", {"pid_alive": 1.0})
    backup = str(tmp_path / "backup.sqlite")
    assert store.backup(backup) == job_store.SCHEMA_VERSION
    assert oct(__import__("os").stat(backup).st_mode & 0o777) == "0o600"
    # Later: more jobs, a new user, then something goes wrong and the backup comes back.
    _ended(store, "j3", "succeeded", 30.0)
    store.user_uid("carol", 100000, 100009)
    with store.transaction() as conn:
        conn.execute("DELETE FROM jobs WHERE id = 'j1'")
    done = store.restore(backup)
    assert done == {"jobs": 2, "users_added": 0, "unfinished_failed": [],
                    "schema": job_store.SCHEMA_VERSION}
    assert [r["job_id"] for r in store.jobs()] == ["j1", "j2"]
    assert store.get("j2")["user"] == "bob" and store.get("j1")["ended"] == 10.0
    # Users are never lost and no uid is handed out twice.
    assert store.users()["carol"]["uid"] == 100001
    assert store.user_uid("dave", 100000, 100009) == (100002, True)
    # New jobs come after every restored one in sequence (the engine reads by it).
    store.add(_record("j4"))
    seqs = dict((r["job_id"], s) for s, r in store.jobs_after(0))
    assert seqs["j4"] > max(seqs["j1"], seqs["j2"])


def test_restore_refuses_while_jobs_are_queued_or_running(store, tmp_path):
    backup = str(tmp_path / "backup.sqlite")
    store.backup(backup)
    store.add(_record("waiting"))
    with pytest.raises(job_store.StoreError, match="1 jobs are queued or running"):
        store.restore(backup)
    assert store.get("waiting")["state"] == "queued"


def test_restore_fails_jobs_the_backup_caught_running_and_keeps_users_it_adds(tmp_path):
    old = job_store.open_store(str(tmp_path / "old.sqlite"))
    old.add(_record("caught"))
    old.transition("caught", "running", started=5.0)
    old.user_uid("erin", 100000, 100009)
    backup = str(tmp_path / "backup.sqlite")
    old.backup(backup)
    fresh = job_store.open_store(str(tmp_path / "fresh.sqlite"))  # a master rebuilt
    done = fresh.restore(backup)
    assert done["unfinished_failed"] == ["caught"] and done["users_added"] == 1
    record = fresh.get("caught")
    assert record["state"] == "failed" and "backup taken while it was running" in record["reason"]
    assert fresh.user_uid("frank", 100000, 100009) == (100001, True)


def test_restore_refuses_a_newer_schema_and_files_that_are_not_stores(store, tmp_path):
    newer = tmp_path / "newer.sqlite"
    conn = sqlite3.connect(newer)
    conn.execute(f"PRAGMA user_version = {job_store.SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(job_store.StoreError, match="has schema"):
        store.restore(str(newer))
    junk = tmp_path / "junk"
    junk.write_bytes(b"not a database" * 100)
    with pytest.raises(job_store.StoreError):
        store.restore(str(junk))
    empty = tmp_path / "empty.sqlite"
    sqlite3.connect(empty).close()
    with pytest.raises(job_store.StoreError, match="not a DockerMPI job store"):
        store.restore(str(empty))


def test_backup_never_overwrites(store, tmp_path):
    existing = tmp_path / "there"
    existing.write_text("keep me")
    with pytest.raises(FileExistsError):
        store.backup(str(existing))
    assert existing.read_text() == "keep me"
