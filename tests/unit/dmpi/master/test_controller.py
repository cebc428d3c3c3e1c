"""
Unit tests of the job controller (:mod:`dmpi.master.controller`) over a real job store: evidence in,
decisions out. The nodes are a recording transport (the engine on the real cluster is
tested by tests/integration); every other module is the real one.
"""

import math
import threading
import time

import pytest
from dmpi.errors import StartFailure

from dmpi.jobs import rules
from dmpi.jobs import store as store_module
from dmpi.master import controller, selftest, user_calls

CONFIG = {
    "cluster_network": "10.0.0.0/16", "job_root": "/var/lib/dockermpi/jobs",
    "job_network": {"name": "dmpi-jobs", "addresses": "10.0.1.128/29", "standby": 2},
    "ports": {"sshd": [20000, 20000], "oob": [20100, 20299], "btl": [20300, 20999]},
    "storage": {"path": "/srv/dockermpi"}, "slots_per_node": 2, "placement": "pack",
    "limits": {"memory_per_slot_mb": 512, "pids_per_slot": 128, "cpus_per_slot": 1,
               "tmp_size_mb": 64},
}
NODES = ["node1", "node2", "node3"]
IMAGE_REF = "r@sha256:" + "0" * 64
# A healthy node holding the jobs' image (mpi_job.health).
HEALTH = {"docker": "ok", "storage": "ok", "images": [IMAGE_REF], "job_ca": "ok", "agent": "ok",
          "job_ca_public": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeJobCaPublicKeyForTestsOnly0000000000000"}
# Bound of every wait on the engine's background work: generous, since the unit tests
# share two cores with the test cluster's build; a wait ends as soon as its condition holds.
SETTLE_TIMEOUT = 60


class Transport:
    """Records calls; nodes answer as told in ``failing``."""

    def __init__(self):
        self.calls, self.events, self.failing = [], [], {}
        self.hosts_up = set()  # addresses whose hosts answer probes

    def call(self, minions, fun, timeout, **kwargs):
        self.calls.append((fun, list(minions), kwargs))
        if fun in self.failing:
            raise RuntimeError(self.failing[fun])
        if fun == "mpi_job.start_worker":
            return {m: {"container": "w", "sshd_ready_seconds": 0.1,
                        "launcher": "l" if kwargs["launcher"]["node"] == m else None}
                    for m in minions}
        return {m: True for m in minions}

    def call_async(self, minions, fun, **kwargs):
        self.calls.append((fun, list(minions), kwargs))

    def seal_for(self, minion, value):
        return {"sealed_for": minion, "value": value}

    def fire(self, tag, data):
        self.events.append(tag)

    def probe_host(self, address, port, timeout=1.0):
        """The engine's TCP probe of a silent node's host: ``hosts_up`` answer."""
        self.calls.append(("probe", [address], {"port": port}))
        if address in self.hosts_up:
            return True, f"its host answers on port {port} (connection refused)"
        return False, f"no answer from {address} port {port} within {timeout} s"

    def host_addresses(self, minions, network):
        return {m: f"10.0.0.{10 + NODES.index(m)}" for m in minions}  # node2 -> .11

    def funs(self):
        return [c[0] for c in self.calls]


class Clock:
    def __init__(self):
        self.now = time.time()

    def __call__(self):
        return self.now


@pytest.fixture
def world(tmp_path):
    store = store_module.open_store(str(tmp_path / "jobs.sqlite"))
    store.set_meta("site", {"config": CONFIG, "read": time.time()})
    transport, clock = Transport(), Clock()
    engine = _new_engine(store, transport, clock)
    for node in NODES:
        engine.node_report(node, {"engine": "ok", "jobs": {}, "time": clock.now, "digest": "d0",
                                  "health": HEALTH})
    yield store, transport, clock, engine
    engine.pool.shutdown(wait=True)


def _spec():
    return {"image_ref": IMAGE_REF, "candidates": NODES, "count": None,
            "per_node": None, "env": {}, "workdir": "/data", "config": CONFIG}


def _submit(store, clock, np=2, job_id=None, **spec):
    job_id = job_id or f"20261201-000000-{len(store.jobs()):06x}"
    record = {
        "job_id": job_id, "user": "alice", "uid": 100000, "image": "mpi", "np": np,
        "cmd": ["hostname"], "walltime": 60, "state": "queued", "reason": None,
        "submitted": clock.now, "history": [{"state": "queued", "at": clock.now}],
        "output": {"dir_in_job": f"/data/mpi-jobs/{job_id}"}, "timings": {},
        "spec": _spec(),
    }
    record.update(spec)
    store.add(record)
    return job_id


class InFlight:
    """Work handed to an engine's thread pools and not yet done, shared by its pools. A
    task counts until it returns, so work it hands on (a clean-up that plans, a plan that
    starts a job) is counted before it ends: zero means nothing is left to happen."""

    def __init__(self):
        self.count, self.errors = 0, []
        self.changed = threading.Condition()

    def pool(self, max_workers):
        counter = self

        class CountingPool(controller.ThreadPoolExecutor):
            def submit(self, fn, *args, **kwargs):
                with counter.changed:
                    counter.count += 1
                try:
                    future = super().submit(fn, *args, **kwargs)
                except BaseException:
                    counter.done(None)
                    raise
                future.add_done_callback(counter.done)
                return future

        return CountingPool(max_workers=max_workers)

    def done(self, future):
        with self.changed:
            if future is not None and future.exception() is not None:
                self.errors.append(future.exception())
            self.count -= 1
            self.changed.notify_all()

    def wait_idle(self, timeout=SETTLE_TIMEOUT):
        with self.changed:
            idle = self.changed.wait_for(lambda: self.count == 0, timeout)
        assert idle, f"the engine still had {self.count} tasks in flight after {timeout} s"
        assert not self.errors, f"an engine task raised: {self.errors!r}"


def _new_engine(store, transport, clock):
    """An engine whose thread pools tell when its background work is done."""
    engine = controller.JobController(store, transport, clock)
    engine.in_flight = InFlight()
    engine.pool.shutdown(wait=True)
    engine.probe_pool.shutdown(wait=True)
    engine.pool = engine.in_flight.pool(8)
    engine.probe_pool = engine.in_flight.pool(4)
    engine.probe_host = transport.probe_host
    return engine


def _restart(engine, store, transport, clock):
    """The engine stops once its work is done, and a new one starts on the same store."""
    _settle(engine)
    engine.pool.shutdown(wait=True)
    engine.probe_pool.shutdown(wait=True)
    return _new_engine(store, transport, clock)


def _settle(engine):
    """Wait until everything the engine started in its threads is done, work those
    threads handed on included (never a fixed time, never a pool shut down under a task
    that still submits)."""
    engine.in_flight.wait_idle()


def _until(condition, what, timeout=SETTLE_TIMEOUT):
    """Wait for ``condition()`` to hold; fail naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"still not {what} after {timeout} s"
        time.sleep(0.01)


def _started(store, clock, engine, **kwargs):
    """Submit a job, tell the engine and let it start it; returns the job id."""
    job_id = _submit(store, clock, **kwargs)
    engine.job_requested(job_id)
    _settle(engine)
    return job_id


def _wait_while_queued(store, job_id):
    """Wait for a worker thread of the engine to take the job off the queue."""
    _until(lambda: store.get(job_id)["state"] != "queued", f"{job_id} off the queue")


def _hold_cleanups(transport):
    """Make every clean-up call wait until the returned event is set."""
    release = threading.Event()
    plain_call = transport.call

    def call(minions, fun, timeout, **kwargs):
        if fun == "mpi_job.cleanup":
            assert release.wait(SETTLE_TIMEOUT), "the test never released the clean-up"
        return plain_call(minions, fun, timeout, **kwargs)

    transport.call = call
    return release


def _running_report(clock, job_id, **job):
    info = {"containers": {"worker": "running", "launcher": "running"},
            "launcher_exit_code": None, "failure": None, "limits_hit": [],
            "unreachable_peers": []}
    info.update(job)
    return {"engine": "ok", "time": clock.now, "jobs": {job_id: info}, "digest": "d1"}


def test_a_queued_job_is_placed_started_and_running(world):
    store, transport, clock, engine = world
    job_id = _started(store, clock, engine, np=4)
    record = store.get(job_id)
    assert record["state"] == "running" and record["placement"] == {"node1": 2, "node2": 2}
    assert transport.funs() == ["mpi_job.start_worker"]  # one publish starts the job
    launcher = transport.calls[0][2]["launcher"]
    assert launcher["node"] == "node1" and "mpirun" in launcher["argv"]
    assert launcher["status"]["state"] == "running"
    assert set(record["job_addresses"].values()) <= {"10.0.1.129", "10.0.1.130",
                                                       "10.0.1.131", "10.0.1.132"}
    assert f"mpi/job/{job_id}/starting" in transport.events
    assert f"mpi/job/{job_id}/running" in transport.events


def test_the_start_carries_no_private_key_and_seals_the_users_environment(world):
    """One publish starts the job: it names each node's job CA (public keys only; the
    nodes make the job's keys) and seals the environment to the launcher's node."""
    store, transport, clock, engine = world
    job_id = _started(store, clock, engine, np=4,
                      spec=dict(_spec(), env={"SECRET_TOKEN": "s3cr3t-value"}))
    kwargs = transport.calls[0][2]
    assert kwargs["job_cas"] == {n: HEALTH["job_ca_public"] for n in ("node1", "node2")}
    assert kwargs["valid_seconds"] == store.get(job_id)["walltime"]
    assert "PRIVATE KEY" not in repr(kwargs)
    sealed = kwargs["launcher"]["environment"]
    assert sealed["sealed_for"] == "node1" and sealed["value"]["SECRET_TOKEN"] == "s3cr3t-value"
    plain = {k: v for k, v in kwargs.items() if k != "launcher"}
    assert "s3cr3t-value" not in repr(plain)
    assert "s3cr3t-value" not in repr(dict(kwargs["launcher"], environment=None))


def test_a_node_that_reported_no_job_ca_takes_no_job(world):
    store, transport, clock, engine = world
    for node in NODES:
        engine.node_report(node, {"engine": "ok", "time": clock.now, "jobs": {}, "digest": "x",
                                  "health": dict(HEALTH, job_ca="cannot make the job CA")})
    job_id = _submit(store, clock, np=1)
    engine.job_requested(job_id)
    _settle(engine)
    assert store.get(job_id)["state"] == "queued"
    assert "mpi_job.start_worker" not in transport.funs()


def test_a_job_may_connect_only_to_its_own_containers_on_the_cluster_network(world):
    store, transport, clock, engine = world
    config = dict(CONFIG, job_network=dict(CONFIG["job_network"],
                                           unreachable=["192.168.10.0/24"]))
    store.set_meta("site", {"config": config, "read": time.time()})
    job_id = _started(store, clock, engine, np=4, spec=dict(_spec(), config=config))
    allowed = transport.calls[0][2]["allowed_sources"]
    assert allowed["peers"] == sorted(store.get(job_id)["job_addresses"].values())
    assert allowed["unreachable"] == ["10.0.0.0/16", "192.168.10.0/24"]


@pytest.mark.parametrize("placement, placements", [
    ("pack", [{"node1": 1, "node2": 1}, {"node1": 1, "node2": 1}]),
    ("spread", [{"node1": 1, "node2": 1}, {"node3": 1, "node1": 1}, {"node2": 1, "node3": 1}]),
])
def test_the_sites_placement_policy_decides_where_jobs_go(world, placement, placements):
    store, _, clock, engine = world
    store.set_meta("site", {"config": dict(CONFIG, placement=placement), "read": time.time()})
    spec = dict(_spec(), count=2, config=dict(CONFIG, placement=placement))
    jobs = [_submit(store, clock, np=2, job_id=f"20261201-000000-00000{i}", spec=spec,
                    user=user) for i, user in enumerate(("alice", "bob", "carol"))]
    engine.job_requested(jobs[0])
    _settle(engine)
    records = [store.get(j) for j in jobs]
    assert [r["placement"] for r in records if r["state"] == "running"] == placements


@pytest.mark.parametrize("queue_order, order", [("fair", ["a1", "b1", "a2"]),
                                                ("fifo", ["a1", "a2", "a3"])])
def test_queued_jobs_start_in_the_sites_queue_order(world, queue_order, order):
    # Every job takes every slot: alice's a1 runs, then alice queues two more and bob one.
    store, _, clock, engine = world
    config = dict(CONFIG, queue_order=queue_order)
    store.set_meta("site", {"config": config, "read": time.time()})
    spec = dict(_spec(), config=config)
    jobs = {name: _submit(store, clock, np=6, job_id=f"20261201-000000-00000{i}", spec=spec,
                          user="bob" if name == "b1" else "alice")
            for i, name in enumerate(("a1", "a2", "a3", "b1"))}
    started = []
    for _ in order:  # three starts: an ended job holds its addresses until its clean-up
        engine.job_requested(jobs["a1"])
        _settle(engine)
        [running] = [name for name, job_id in jobs.items()
                     if store.get(job_id)["state"] == "running"]
        started.append(running)
        clock.now += 2
        engine.node_report("node1", _running_report(clock, jobs[running],
                                                    launcher_exit_code=0))
        _settle(engine)
    assert started == order


def test_usage_survives_a_restart_and_queued_jobs_show_their_priority(world):
    # alice's job ran and ended; after a restart, her queued job still ranks below bob's.
    store, transport, clock, engine = world
    first = _submit(store, clock, np=6, job_id="20261201-000000-000001", user="alice")
    engine.job_requested(first)
    _settle(engine)
    clock.now += 60
    engine.node_report("node1", _running_report(clock, first, launcher_exit_code=0))
    _settle(engine)
    assert store.get(first)["state"] == "succeeded"
    used = store.get_meta("fair_usage")["alice"][0]
    assert 6 * 59 < used <= 6 * 60  # ranks x seconds, barely decayed
    engine = _restart(engine, store, transport, clock)
    # every slot held, so both wait and show their priority
    holder = _submit(store, clock, np=6, job_id="20261201-000000-000002", user="carol")
    engine.job_requested(holder)
    _settle(engine)
    queued = {user: _submit(store, clock, np=6, job_id=f"20261201-000000-00000{i}", user=user)
              for i, user in ((3, "alice"), (4, "bob"))}
    engine.job_requested(queued["alice"])
    _settle(engine)
    shown = {user: user_calls.public(store, store.get(job_id))["priority"]
             for user, job_id in queued.items()}
    assert shown["bob"]["priority"] > shown["alice"]["priority"]
    assert shown["alice"]["fairshare"] < 1.0 and set(shown["bob"]) == {"priority", "fairshare",
                                                                        "age"}


def test_the_sites_half_life_decays_a_job_that_ends_after_a_restart(world):
    # The job runs across a restart and ends in the new controller before it planned:
    # its 60 s at 6 ranks count as the pillar's half-life of a minute says.
    store, transport, clock, engine = world
    config = dict(CONFIG, fair_share={"half_life": "1m"})
    store.set_meta("site", {"config": config, "read": time.time()})
    job_id = _started(store, clock, engine, np=6, spec=dict(_spec(), config=config),
                      job_id="20261201-000000-000001")
    engine = _restart(engine, store, transport, clock)
    clock.now += 60
    engine.node_report("node1", _running_report(clock, job_id, launcher_exit_code=0))
    _settle(engine)
    assert store.get(job_id)["state"] == "succeeded"
    [value, as_of] = store.get_meta("fair_usage")["alice"]
    assert as_of == clock.now
    assert value == pytest.approx(6 * 60 / math.log(2) / 2)  # np x H/ln2 x (1 - 1/2)
    assert user_calls.fair_share_now(store, clock.now + 60)["alice"] == {
        "decayed_core_hours": round(value / 2 / 3600, 6), "fairshare": 0.5}  # all usage hers


def test_the_launchers_exit_ends_the_job_at_once_and_cleanup_follows(world):
    store, transport, clock, engine = world
    job_id = _started(store, clock, engine, np=4)
    clock.now += 2
    engine.node_report("node1", _running_report(clock, job_id, launcher_exit_code=0))
    record = store.get(job_id)
    assert record["state"] == "succeeded" and record["exit_code"] == 0
    assert "total" in record["timings"]
    _settle(engine)
    record = store.get(job_id)
    assert record["closed"] and "cleanup" in record["timings"]
    assert transport.funs()[-1] == "mpi_job.cleanup"
    assert transport.events[-2:] == [f"mpi/job/{job_id}/succeeded", f"mpi/job/{job_id}/closed"]


def test_an_ended_job_keeps_its_slots_until_its_containers_are_gone(world):
    # A failed job's other ranks run until the clean-up removes their containers: the
    # next job must not be placed on those slots before then.
    store, transport, clock, engine = world
    release = _hold_cleanups(transport)
    first = _started(store, clock, engine, np=6)
    second = _submit(store, clock, np=2)
    engine.job_requested(second)
    clock.now += 2
    engine.node_report("node1", _running_report(clock, first, launcher_exit_code=1,
                                                failure={"rank": 3, "exit_code": 1}))
    assert store.get(first)["state"] == "failed"
    engine.tick()
    assert store.get(second)["state"] == "queued"  # node slots still held by the first
    release.set()
    _wait_while_queued(store, second)  # the clean-up, when done, plans at once
    _until(lambda: store.get(second)["state"] == "running", f"{second} running")
    assert store.get(first)["closed"]


def test_a_succeeded_jobs_slots_are_free_before_its_clean_up(world):
    store, transport, clock, engine = world
    release = _hold_cleanups(transport)
    first = _started(store, clock, engine, np=6)
    second = _submit(store, clock, np=6)
    engine.job_requested(second)
    clock.now += 2
    engine.node_report("node1", _running_report(clock, first, launcher_exit_code=0))
    assert store.get(first)["state"] == "succeeded" and not store.get(first)["closed"]
    _wait_while_queued(store, second)  # planned at once, not at the next tick
    assert store.get(second)["state"] in ("starting", "running")
    release.set()
    _settle(engine)


def test_an_ended_job_is_never_seen_without_its_timings(world):
    # mpi.wait returns as soon as it reads a final state: the timings must be in the
    # same write (a launch once returned a failed job with no mpirun time).
    store, transport, clock, engine = world
    job_id = _started(store, clock, engine, np=2)
    reader = store_module.open_store(store.path)
    seen = []
    transition = store.transition

    def transition_then_look(*args, **kwargs):
        moved = transition(*args, **kwargs)
        seen.append(reader.get(job_id))  # another connection, as the runner's
        return moved

    store.transition = transition_then_look
    clock.now += 2
    engine.node_report("node1", _running_report(clock, job_id, launcher_exit_code=0))
    ended = reader.get(job_id)
    assert ended["state"] == "succeeded" and ended["timings"]["mpirun"] == 2
    assert seen and all(r["state"] == "running" or "mpirun" in r["timings"] for r in seen)


def test_reports_during_a_jobs_clean_up_do_not_ask_for_a_second_one(world):
    # The launcher's exit is reported while its containers are still there: the
    # engine's own clean-up removes them; a second (leftover) clean-up per node would
    # double the work of every job on the nodes.
    store, transport, clock, engine = world
    release = _hold_cleanups(transport)
    job_id = _started(store, clock, engine, np=4)
    clock.now += 2
    ended = _running_report(clock, job_id, launcher_exit_code=0,
                            containers={"worker": "running", "launcher": "exited"})
    engine.node_report("node1", ended)
    engine.node_report("node2", _running_report(clock, job_id))
    assert store.get(job_id)["state"] == "succeeded"
    release.set()
    _settle(engine)
    cleanups = [c for c in transport.calls if c[0] == "mpi_job.cleanup"]
    assert [c[1] for c in cleanups] == [["node1", "node2"]] and cleanups[0][2]["status"]
    # Once the clean-up returned, containers a node still reports are leftovers.
    clock.now += 1
    engine.node_report("node2", _running_report(clock, job_id))
    cleanups = [c for c in transport.calls if c[0] == "mpi_job.cleanup"]
    assert [c[1] for c in cleanups] == [["node1", "node2"], ["node2"]]


def test_slots_being_cleaned_up_are_reserved_for_the_head_of_the_queue(world):
    # While a cancelled job's containers are removed, a long job must not backfill the
    # idle node that the head of the queue needs as soon as the clean-up is done.
    store, transport, clock, engine = world
    release = _hold_cleanups(transport)
    blocker = _started(store, clock, engine, np=4,
                       spec=dict(_spec(), candidates=["node1", "node2"]))
    head = _submit(store, clock, np=6)
    long_ = _submit(store, clock, np=2, walltime=600)
    engine.job_requested(long_)
    assert store.get(long_)["state"] == "queued"
    store.update(blocker, cancel_requested=True)
    engine.job_requested(blocker)
    assert store.get(blocker)["state"] == "cancelled"
    engine.tick()
    assert store.get(long_)["state"] == "queued"
    assert store.get_meta("waiting")[long_] == f"reserved for {head}"
    release.set()
    _wait_while_queued(store, head)
    _settle(engine)
    assert store.get(head)["state"] == "running"


def test_each_waiting_job_has_its_place_in_the_queue_and_it_moves_up(world):
    store, transport, clock, engine = world
    blocker = _started(store, clock, engine, np=6)
    first = _submit(store, clock, np=2)
    second = _submit(store, clock, np=2)
    engine.job_requested(second)
    _settle(engine)
    assert store.get_meta("queue_places") == {first: 1, second: 2}
    public = user_calls.public(store, store.get(second))
    assert public["queue_place"] == 2 and public["waiting_for"] == "resources"
    store.update(first, cancel_requested=True)
    engine.job_requested(first)
    _settle(engine)
    assert store.get_meta("queue_places") == {second: 1}
    assert "queue_place" not in user_calls.public(store, store.get(blocker))


def test_reports_taken_while_the_job_came_up_do_not_fail_it(world):
    # While a job starts, a node sees peers whose sshd is not up yet and no launcher:
    # that evidence is older than the start and must not end the job once it runs.
    store, transport, clock, engine = world
    plain_call = transport.call
    job_id = _submit(store, clock, np=6)

    def call(minions, fun, timeout, **kwargs):
        if fun == "mpi_job.start_worker":
            clock.now += 2
            engine.node_report("node2", _running_report(
                clock, job_id, containers={"worker": "running"},
                unreachable_peers=["10.0.1.131"]))
            engine.node_report("node1", _running_report(clock, job_id,
                                                        containers={"worker": "running"}))
            clock.now += 1
        return plain_call(minions, fun, timeout, **kwargs)

    transport.call = call
    engine.job_requested(job_id)
    _settle(engine)
    assert store.get(job_id)["state"] == "running"
    clock.now += 2
    engine.tick()
    assert store.get(job_id)["state"] == "running"
    engine.node_report("node2", _running_report(clock, job_id,
                                                unreachable_peers=["10.0.1.131"]))
    record = store.get(job_id)
    assert record["state"] == "failed" and "network partition" in record["reason"]


def test_a_failed_start_is_recorded_once_and_the_queue_goes_on(world):
    store, transport, clock, engine = world
    transport.failing["mpi_job.start_worker"] = "node2: cannot start the worker"
    first = _started(store, clock, engine, np=4)
    record = store.get(first)
    assert record["state"] == "failed"
    assert record["reason"] == "could not start: node2: cannot start the worker"
    assert transport.funs().count("mpi_job.start_worker") == 1
    transport.failing.clear()
    second = _submit(store, clock, np=2)
    engine.tick()
    _settle(engine)
    assert store.get(second)["state"] == "running"


@pytest.mark.parametrize("kind, dir_still_ready", [
    ("user_dir", False), ("storage", True), ("node", True)])
def test_only_a_start_failing_on_the_users_directory_has_it_made_again(
        world, kind, dir_still_ready):
    """A node names why a start failed by kind: the user's directory is checked again
    before the user's next job only when it was the directory (a missing storage mount
    reads "not ready" too, and is no fault of the directory)."""
    store, transport, clock, engine = world
    store.user_uid("alice", 100000, 100999)
    store.set_user_dir_ready("alice")
    message = {"user_dir": "the directory of user alice is not ready: found None",
               "storage": "shared storage is not ready: /srv/dockermpi/users does not exist",
               "node": "docker: no space left on device"}[kind]
    failure = StartFailure(kind, message)
    transport.failing["mpi_job.start_worker"] = (
        f"mpi_job.start_worker failed on node2: ERROR: {failure.wire()}")
    job_id = _started(store, clock, engine, np=4)
    record = store.get(job_id)
    assert record["state"] == "failed"
    assert record["reason"] == (
        f"could not start: mpi_job.start_worker failed on node2: ERROR: {message}")
    assert store.users()["alice"]["dir_ready"] is dir_still_ready


def test_cancel_while_queued_running_and_starting(world):
    store, transport, clock, engine = world
    big = _submit(store, clock, np=6)
    waiting = _submit(store, clock, np=6)
    engine.job_requested(big)
    _settle(engine)
    assert store.get(waiting)["state"] == "queued"
    store.update(waiting, cancel_requested="by alice")
    engine.job_requested(waiting)
    assert store.get(waiting)["state"] == "cancelled"
    store.update(big, cancel_requested="by alice")
    engine.job_requested(big)
    assert store.get(big)["state"] == "cancelled"
    _settle(engine)
    assert store.get(big)["closed"]


def _seconds(engine, clock, seconds, heard=("node1", "node3")):
    """Let ``seconds`` pass, one tick a second, with only ``heard`` sending heartbeats."""
    for _ in range(seconds):
        clock.now += 1
        for node in heard:
            engine.heartbeat(node, "d0")
        engine.tick()
        _settle(engine)  # the host probes the pass started run in threads


def test_a_silent_node_ends_its_jobs_after_the_node_timeout(world):
    store, transport, clock, engine = world
    job_id = _started(store, clock, engine, np=4)
    _seconds(engine, clock, rules.NODE_TIMEOUT)
    assert store.get(job_id)["state"] == "running"
    _seconds(engine, clock, 2)
    record = store.get(job_id)
    assert record["state"] == "failed" and "node2 stopped answering" in record["reason"]


def test_a_silent_node_whose_host_answers_keeps_its_job_for_the_grace(world):
    # A minion restart or a Salt upgrade: the node is silent, its host and containers
    # are fine. The job is kept (and says so) and goes on when the node reports again.
    store, transport, clock, engine = world
    transport.hosts_up = {"10.0.0.11"}  # node2's host (host_addresses: node2 -> .11)
    job_id = _started(store, clock, engine, np=4)
    _seconds(engine, clock, 30)
    record = store.get(job_id)
    assert record["state"] == "running"
    assert set(record["silent_nodes"]) == {"node2"}
    assert "answers on port 22" in record["silent_nodes"]["node2"]["host"]
    assert [s["node"] for s in record["silences"]] == ["node2"]
    probes = [c for c in transport.calls if c[0] == "probe"]
    assert probes and all(c[2]["port"] == 22 for c in probes)
    assert len(probes) <= 30 // rules.PROBE_EVERY + 1  # not one per pass
    assert store.get_meta("silent_nodes")["node2"]["host_answers"] is True
    engine.node_report("node2", _running_report(clock, job_id))
    engine.tick()
    record = store.get(job_id)
    assert record["state"] == "running" and record["silent_nodes"] == {}
    assert len(record["silences"]) == 1  # the record keeps what happened


def test_a_job_ending_as_its_silent_node_returns_keeps_no_silent_node(world):
    # The node's heartbeat and the launcher's exit can arrive before any pass clears the
    # silence: the final record still says the job is kept for no node.
    store, transport, clock, engine = world
    transport.hosts_up = {"10.0.0.11"}
    job_id = _started(store, clock, engine, np=4)
    _seconds(engine, clock, 10)
    assert set(store.get(job_id)["silent_nodes"]) == {"node2"}
    engine.heartbeat("node2", "d0")
    engine.node_report("node1", _running_report(clock, job_id, launcher_exit_code=0))
    record = store.get(job_id)
    assert record["state"] == "succeeded" and record["silent_nodes"] == {}
    assert [s["node"] for s in record["silences"]] == ["node2"]


def test_a_silent_node_whose_host_answers_is_lost_when_the_grace_runs_out(world):
    store, transport, clock, engine = world
    transport.hosts_up = {"10.0.0.11"}
    store.set_meta("site", {"config": dict(CONFIG, engine={"silent_grace": 20,
                                                            "probe_port": 2222}),
                            "read": clock.now})
    job_id = _started(store, clock, engine, np=4)
    _seconds(engine, clock, 20)
    assert store.get(job_id)["state"] == "running"
    _seconds(engine, clock, 2)
    record = store.get(job_id)
    assert record["state"] == "failed" and "mpi:engine:silent_grace (20 s)" in record["reason"]
    assert {c[2]["port"] for c in transport.calls if c[0] == "probe"} == {2222}


def test_a_silent_node_whose_host_stops_answering_is_lost_at_once(world):
    store, transport, clock, engine = world
    transport.hosts_up = {"10.0.0.11"}
    job_id = _started(store, clock, engine, np=4)
    _seconds(engine, clock, 15)
    assert store.get(job_id)["state"] == "running"
    transport.hosts_up = set()  # the host goes down during the silence
    _seconds(engine, clock, 2 + rules.PROBE_EVERY)
    record = store.get(job_id)
    assert record["state"] == "failed" and "its host does not answer" in record["reason"]


def test_a_silent_node_a_peer_cannot_reach_is_lost_even_if_its_host_answers(world):
    store, transport, clock, engine = world
    transport.hosts_up = {"10.0.0.11"}
    job_id = _started(store, clock, engine, np=4)
    node2 = store.get(job_id)["job_addresses"]["node2"]
    for _ in range(rules.NODE_TIMEOUT + 2):
        clock.now += 1
        engine.node_report("node1", _running_report(clock, job_id, unreachable_peers=[node2]))
        engine.heartbeat("node3", "d0")
        engine.tick()
        _settle(engine)  # the host probes the pass started run in threads
    record = store.get(job_id)
    assert record["state"] == "failed" and "node1 cannot reach" in record["reason"]


def test_after_a_restart_a_node_not_heard_again_is_lost_only_after_the_grace(world):
    store, transport, clock, engine = world
    job_id = _started(store, clock, engine, np=4)
    _seconds(engine, clock, 2, heard=NODES)
    engine.tick()  # flushes what the engine knows of the nodes to the store
    clock.now += 10  # the master is down for 10 s, then a new engine starts
    engine = _restart(engine, store, transport, clock)
    assert set(engine.active) == {job_id}
    _seconds(engine, clock, rules.RESTART_GRACE - 1)  # node2's minion reconnects slowly
    assert store.get(job_id)["state"] == "running"
    _seconds(engine, clock, 2)
    record = store.get(job_id)
    assert record["state"] == "failed" and "node2 stopped answering" in record["reason"]


def test_after_a_restart_no_job_starts_on_a_node_until_it_is_heard_again(world):
    # Its minion may not have reconnected yet: a start published to it would be lost.
    store, transport, clock, engine = world
    clock.now += controller.FLUSH_SECONDS
    engine.tick()  # flushes the nodes' reports to the store
    engine = _restart(engine, store, transport, clock)
    transport.calls.clear()
    job_id = _submit(store, clock, np=2, spec=dict(_spec(), candidates=["node2"]))
    engine.job_requested(job_id)
    _seconds(engine, clock, 2, heard=("node1", "node3"))
    assert store.get(job_id)["state"] == "queued" and transport.funs() == []
    _seconds(engine, clock, 1, heard=("node2",))
    assert store.get(job_id)["state"] != "queued"
    assert transport.funs() == ["mpi_job.start_worker"]
    assert list(transport.calls[0][1]) == ["node2"]


def test_a_stalled_engine_gives_nodes_a_grace_before_judging_silence(world):
    store, transport, clock, engine = world
    job_id = _started(store, clock, engine, np=4)
    _seconds(engine, clock, rules.RESTART_GRACE + 1, heard=NODES)
    clock.now += 30  # nothing was read for 30 s
    engine.tick()
    assert store.get(job_id)["state"] == "running"
    _seconds(engine, clock, rules.NODE_TIMEOUT + 1, heard=NODES)
    assert store.get(job_id)["state"] == "running"


def test_a_heartbeat_with_another_fingerprint_makes_the_evidence_unusable(world):
    store, transport, clock, engine = world
    job_id = _started(store, clock, engine, np=4)
    clock.now += 2
    engine.node_report("node2", dict(_running_report(clock, job_id), jobs={}))  # gone
    assert store.get(job_id)["state"] == "failed"
    other = _submit(store, clock, np=4)
    # The failed job's slots are free once its clean-up returned; the next pass places
    # the other job and its start thread ends before anything else is looked at.
    engine.tick()
    _settle(engine)
    engine.tick()
    _settle(engine)
    assert store.get(other)["state"] == "running"
    clock.now += 2
    engine.heartbeat("node1", "something-else")
    assert engine.node_book.seen["node1"]["usable"] is False
    engine.tick()
    assert store.get(other)["state"] == "running"


def test_leftovers_of_ended_jobs_are_removed_but_not_asked_for_every_second(world):
    store, transport, clock, engine = world
    report = _running_report(clock, "20261201-000000-ffffff")
    engine.node_report("node3", report)
    engine.node_report("node3", report)
    cleanups = [c for c in transport.calls if c[0] == "mpi_job.cleanup"]
    assert len(cleanups) == 1 and cleanups[0][1] == ["node3"]
    clock.now += 11
    engine.node_report("node3", report)
    assert len([c for c in transport.calls if c[0] == "mpi_job.cleanup"]) == 2


def test_heartbeats_and_reports_are_written_to_the_store_in_batches(world):
    store, transport, clock, engine = world
    assert store.nodes() == {}  # the first reports are not written one by one
    clock.now += 2
    engine.tick()
    before = store.nodes()["node1"]["last_seen"]
    assert set(store.nodes()) == set(NODES)
    clock.now += 1
    engine.heartbeat("node1", "d0")
    heard_at = clock.now
    assert store.nodes()["node1"]["last_seen"] == before
    clock.now += 2
    engine.tick()
    assert store.nodes()["node1"]["last_seen"] == heard_at > before
    assert store.get_meta("engine")["pid_alive"] == clock.now


def test_addresses_of_uncleaned_containers_are_held_until_their_node_reports_them_gone(world):
    store, transport, clock, engine = world
    job_id = _started(store, clock, engine, np=4)
    addresses = store.get(job_id)["job_addresses"]
    transport.failing["mpi_job.cleanup"] = "node1, node2: no answer"
    clock.now += 2
    engine.node_report("node1", _running_report(clock, job_id, launcher_exit_code=1,
                                                failure={"rank": 0, "exit_code": 1}))
    _settle(engine)
    held = store.get_meta("address_holds")
    assert set(held) == set(addresses.values())
    # while held, no new job gets them
    other = _started(store, clock, engine, np=2)
    assert not set(store.get(other)["job_addresses"].values()) & set(held)
    # The worker is gone, the standby namespace that holds its address is not yet.
    holder_only = {"containers": {"worker": None, "launcher": None, "netns": "running"}}
    engine.node_report("node1", {"engine": "ok", "jobs": {job_id: holder_only},
                                 "time": clock.now, "digest": "d2"})
    assert set(store.get_meta("address_holds")) == set(addresses.values())
    engine.node_report("node1", {"engine": "ok", "jobs": {}, "time": clock.now, "digest": "d3"})
    assert set(store.get_meta("address_holds")) == {addresses["node2"]}


def test_a_clean_up_keeps_the_sites_standby_namespaces(world):
    store, transport, clock, engine = world
    job_id = _started(store, clock, engine, np=2)
    clock.now += 2
    engine.node_report("node1", _running_report(clock, job_id, launcher_exit_code=0))
    _settle(engine)
    cleanups = [c for c in transport.calls if c[0] == "mpi_job.cleanup"]
    assert cleanups and cleanups[0][2]["standby"] == 2


# ------------------------------------------------------------------- maintenance


def test_a_drained_node_takes_no_new_job_running_ones_go_on_and_resume_brings_it_back(world):
    store, transport, clock, engine = world
    running = _started(store, clock, engine, np=2, spec=dict(_spec(), candidates=["node2"]))
    store.drain("node2", "disk swap", by="root")
    engine.nodes_changed()
    queued = _submit(store, clock, np=2, spec=dict(_spec(), candidates=["node2"]))
    anywhere = _submit(store, clock, np=6)
    engine.job_requested(queued)
    _settle(engine)
    assert store.get(running)["state"] == "running"  # not touched by the drain
    assert store.get(queued)["state"] == "queued"
    waiting = store.get_meta("waiting")
    assert waiting[queued] == "node2 drained (disk swap)"
    assert waiting[anywhere] == "resources; node2 drained (disk swap)"
    store.resume("node2")
    engine.node_report("node2", _running_report(clock, running, launcher_exit_code=0))
    engine.nodes_changed()
    _settle(engine)
    assert store.get(queued)["state"] == "running"


def test_drains_survive_an_engine_restart(world):
    store, transport, clock, engine = world
    store.drain("node1", "kernel update")
    engine = _restart(engine, store, transport, clock)
    job_id = _started(store, clock, engine, np=2, spec=dict(_spec(), candidates=["node1"]))
    assert store.get(job_id)["state"] == "queued"


def _health(**changes):
    return dict(HEALTH, **changes)


@pytest.mark.parametrize("health, words", [
    (_health(storage="not writable: [Errno 30] Read-only file system"),
     "node1 unhealthy: storage not writable"),
    (_health(docker="connection refused"), "node1 unhealthy: Docker engine not answering"),
])
def test_an_unhealthy_node_is_not_scheduled_and_the_queue_says_why(world, health, words):
    store, transport, clock, engine = world
    engine.node_report("node1", {"engine": "ok", "jobs": {}, "time": clock.now,
                                 "digest": "d2", "health": health})
    job_id = _submit(store, clock, np=2, spec=dict(_spec(), candidates=["node1"]))
    other = _submit(store, clock, np=2)
    engine.job_requested(job_id)
    _settle(engine)
    assert store.get(job_id)["state"] == "queued"
    assert store.get_meta("waiting")[job_id].startswith(words)
    assert "node1" not in store.get(other)["placement"]
    engine.node_report("node1", {"engine": "ok", "jobs": {}, "time": clock.now,
                                 "digest": "d3", "health": HEALTH})
    engine.tick()
    _settle(engine)
    assert store.get(job_id)["state"] == "running"


def test_a_missing_image_is_pulled_on_the_nodes_a_job_could_use_before_it_starts(world):
    store, transport, clock, engine = world
    other_ref = "r/other@sha256:" + "1" * 64
    job_id = _submit(store, clock, np=2, image="other",
                     spec=dict(_spec(), image_ref=other_ref, candidates=["node1", "node2"]))
    engine.job_requested(job_id)
    _settle(engine)
    assert store.get(job_id)["state"] == "queued"
    assert store.get_meta("waiting")[job_id] == "image other being pulled on node1, node2"
    pulls = [c for c in transport.calls if c[0] == "mpi_image.pull"]
    assert pulls == [("mpi_image.pull", ["node1", "node2"], {"reference": other_ref})]
    engine.tick()
    _settle(engine)
    assert len([c for c in transport.calls if c[0] == "mpi_image.pull"]) == 1  # not again
    engine.node_report("node2", {"engine": "ok", "jobs": {}, "time": clock.now, "digest": "d4",
                                 "health": _health(images=[IMAGE_REF, other_ref])})
    engine.tick()
    _settle(engine)
    record = store.get(job_id)
    assert record["state"] == "running" and record["placement"] == {"node2": 2}


def test_a_node_without_health_evidence_takes_no_job(world):
    store, transport, clock, engine = world
    engine.node_book.seen["node3"].pop("health")
    job_id = _started(store, clock, engine, np=2, spec=dict(_spec(), candidates=["node3"]))
    assert store.get_meta("waiting")[job_id] == "node3 unhealthy: no health report yet"


def test_a_restarted_engine_knows_the_nodes_health_from_the_store(world):
    store, transport, clock, engine = world
    clock.now += controller.FLUSH_SECONDS
    engine.tick()  # flushes the nodes' reports to the store
    clock.now += 1
    engine = _restart(engine, store, transport, clock)
    _seconds(engine, clock, 1, heard=NODES)  # heartbeats only: no new full report
    job_id = _started(store, clock, engine, np=2)
    assert store.get(job_id)["state"] == "running"


def test_with_exclusion_on_a_node_the_self_test_found_at_fault_takes_only_its_jobs(world):
    store, transport, clock, engine = world
    on = dict(CONFIG, selftest={"user": "dockermpi-selftest", "exclude_failed_nodes": True})
    store.set_meta("site", {"config": on, "read": time.time()})
    store.set_meta(selftest.VERDICTS_KEY, {
        "node2": {"at": clock.now, "passed": False, "problems": ["node2: ..."],
                  "at_fault": "its own pair was flagged: job TCP bandwidth 9 MB/s ..."}})
    engine.nodes_changed()
    there = dict(_spec(), candidates=["node2"], config=on)
    alices = _submit(store, clock, np=2, spec=there)
    engine.job_requested(alices)
    _settle(engine)
    assert store.get(alices)["state"] == "queued"
    assert store.get_meta("waiting")[alices].startswith(
        "node2 failed the network self-test (its own pair was flagged: job TCP bandwidth 9")
    # The self-test's own job goes there: how else would the node pass again?
    retest = _started(store, clock, engine, np=2, spec=there, user="dockermpi-selftest")
    assert store.get(retest)["placement"] == {"node2": 2}
    engine.node_report("node2", _running_report(clock, retest, launcher_exit_code=0))
    _settle(engine)
    assert store.get(alices)["state"] == "queued"
    store.set_meta(selftest.VERDICTS_KEY, {
        "node2": {"at": clock.now, "passed": True, "problems": [], "at_fault": None}})
    engine.nodes_changed()
    _settle(engine)
    assert store.get(alices)["placement"] == {"node2": 2}


def test_without_exclusion_a_node_at_fault_still_takes_jobs(world):
    store, transport, clock, engine = world
    store.set_meta(selftest.VERDICTS_KEY, {
        "node2": {"at": clock.now, "passed": False, "problems": [], "at_fault": "..."}})
    engine.nodes_changed()
    job_id = _started(store, clock, engine, np=2, spec=dict(_spec(), candidates=["node2"]))
    assert store.get(job_id)["placement"] == {"node2": 2}
