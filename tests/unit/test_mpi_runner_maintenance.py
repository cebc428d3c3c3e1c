"""Unit tests of the ``mpi`` runner's maintenance commands (``drain``, ``resume``,
``nodes``) over a real job store: who may call them, what they record and show. The
master's minion list and event bus are replaced; the job controller's part is in
tests/unit/dmpi/master/test_controller.py, the whole on the cluster in tests/integration/test_maintenance.py."""

import time

import pytest
from dmpi.jobs import store as store_module
from tests.extension import load_extension

caller = load_extension("_utils/mpi_caller.py", "mpi_caller_for_runner")
runner = load_extension("_runners/mpi.py", "mpi_runner_maintenance")

REF = "10.251.1.2:5000/dockermpi/mpi@sha256:" + "a" * 64
HEALTH = {"docker": "ok", "storage": "ok", "images": [REF, "other@sha256:" + "b" * 64],
          "job_ca": "ok", "job_ca_public": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeJobCaPublicKeyForTestsOnly0000000000000"}


@pytest.fixture
def master(tmp_path, monkeypatch):
    store = store_module.open_store(str(tmp_path / "jobs.sqlite"))
    store.set_meta("site", {"config": {"slots_per_node": 2, "images": {"mpi": REF}}})
    now = time.time()
    store.nodes_seen({
        "node1": (now, {"engine": "ok", "jobs": {}, "health": HEALTH}),
        "node2": (now, {"engine": "ok", "jobs": {},
                        "health": dict(HEALTH, storage="not writable: Read-only file system")}),
        "node3": (now - 60, {"engine": "ok", "jobs": {}, "health": HEALTH}),
    })
    fired = []
    monkeypatch.setattr(runner.job_store, "open_store", lambda path: store)
    monkeypatch.setattr(runner, "__utils__", {"mpi_caller.hub_user": caller.hub_user},
                        raising=False)
    monkeypatch.setattr(runner, "__opts__", {"cachedir": str(tmp_path), "user": "root"},
                        raising=False)
    monkeypatch.setattr(runner, "__context__", {}, raising=False)
    # Salt's name for the salt-run caller (drain records it)
    monkeypatch.setattr(runner, "__user__", "root", raising=False)
    monkeypatch.setattr(runner, "_mpi_nodes", lambda: ["node1", "node2", "node3"])
    monkeypatch.setattr(runner, "_drains_changed", lambda: fired.append("mpi/drains/changed"))
    return store, fired


def test_drain_records_who_why_and_since_and_tells_the_engine(master):
    store, fired = master
    drained = runner.drain("node1", reason="disk swap, ticket 4711")
    assert drained["node"] == "node1" and drained["running_jobs"] == []
    assert drained["drained"]["reason"] == "disk swap, ticket 4711"
    assert drained["drained"]["by"] == "root"
    assert fired == ["mpi/drains/changed"]
    shown = runner.nodes()["node1"]
    assert shown["drained"]["reason"] == "disk swap, ticket 4711"
    assert shown["drained"]["since_utc"].endswith("Z")
    assert shown["eligible"] is False
    assert shown["not_eligible_because"] == "drained (disk swap, ticket 4711)"
    resumed = runner.resume("node1")
    assert resumed["drained"] is None and resumed["was"]["reason"] == "disk swap, ticket 4711"
    assert runner.nodes()["node1"]["eligible"] is True
    assert store.drains() == {} and len(fired) == 2


def test_nodes_show_health_and_why_a_node_is_not_eligible(master):
    shown = runner.nodes()
    assert shown["node1"]["health"] == {"docker": "ok", "storage": "ok", "images": ["mpi"],
                                       "job_ca": "ok"}
    assert shown["node2"]["not_eligible_because"] == \
        "unhealthy: storage not writable: Read-only file system"
    assert shown["node3"]["not_eligible_because"] == "not reporting"
    assert shown["node3"]["reachable"] is False


@pytest.mark.parametrize("args, words", [
    ({"node": "node9", "reason": "x"}, "'node9' is not an MPI node"),
    ({"node": "node1"}, "reason is required"),
    ({"node": "node1", "reason": "  "}, "reason is required"),
    ({"node": "node1", "reason": "x" * 201}, "reason is required"),
])
def test_drain_refuses_bad_arguments(master, args, words):
    store, fired = master
    answer = runner.drain(**args)
    assert answer["retcode"] == 1 and words in answer["error"]
    assert runner.__context__["retcode"] == 1
    assert store.drains() == {} and fired == []


@pytest.mark.parametrize("call", [lambda: runner.drain("node1", reason="mine now"),
                                  lambda: runner.resume("node1"), runner.nodes,
                                  runner.settings])
def test_hub_users_cannot_drain_resume_see_nodes_or_reread_settings(master, call):
    store, fired = master
    store.drain("node1", "maintenance")
    with caller.as_hub_user("alice"):  # as the API engine calls for a hub user
        answer = call()
    assert answer["retcode"] == 1 and "for DockerMPI admins only" in answer["error"]
    assert store.drains()["node1"]["reason"] == "maintenance" and fired == []
