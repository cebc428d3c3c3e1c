"""The admins' maintenance commands (``dmpi.master.admin_calls``: ``drain``,
``resume``, ``nodes``) over a real job store, and the ``mpi`` runner's face of them:
what they record and show, and how a refusal reaches ``salt-run``. The master's minion
list and event bus are a Site subclass that records; the job controller's part is in
tests/unit/dmpi/master/test_controller.py, the whole on the cluster in
tests/integration/test_maintenance.py. (Users cannot reach these at all: the user API
serves ``dmpi.master.user_calls`` only, test_user_calls.py.)"""

import time

import pytest
from dmpi.errors import RequestError
from dmpi.master import admin_calls
from dmpi.master.site import Site
from tests.extension import load_extension

runner = load_extension("_runners/mpi.py", "mpi_runner_maintenance")

REF = "10.251.1.2:5000/dockermpi/mpi@sha256:" + "a" * 64
HEALTH = {"docker": "ok", "storage": "ok", "images": [REF, "other@sha256:" + "b" * 64],
          "job_ca": "ok", "agent": "ok", "job_ca_public": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeJobCaPublicKeyForTestsOnly0000000000000"}


class RecordingSite(Site):
    """Three MPI nodes; what would go on the event bus is recorded in ``fired``."""

    def __init__(self, cachedir):
        super().__init__({"cachedir": str(cachedir)})
        self.fired = []

    def mpi_nodes(self):
        return ["node1", "node2", "node3"]

    def fire(self, tag, data):
        self.fired.append(tag)


@pytest.fixture
def master(tmp_path, monkeypatch):
    site = RecordingSite(tmp_path)
    store = site.store()
    store.set_meta("site", {"config": {"slots_per_node": 2, "images": {"mpi": REF}}})
    now = time.time()
    store.nodes_seen({
        "node1": (now, {"engine": "ok", "jobs": {}, "health": HEALTH}),
        "node2": (now, {"engine": "ok", "jobs": {},
                        "health": dict(HEALTH, storage="not writable: Read-only file system")}),
        "node3": (now - 60, {"engine": "ok", "jobs": {}, "health": HEALTH}),
    })
    monkeypatch.setattr(runner, "_SITE", [site])
    monkeypatch.setattr(runner, "__context__", {}, raising=False)
    # Salt's name for the salt-run caller (drain records it)
    monkeypatch.setattr(runner, "__user__", "root", raising=False)
    return site


def test_drain_records_who_why_and_since_and_tells_the_controller(master):
    store, fired = master.store(), master.fired
    drained = runner.drain("node1", reason="disk swap, ticket 4711")
    assert drained["node"] == "node1" and drained["running_jobs"] == []
    assert drained["drained"]["reason"] == "disk swap, ticket 4711"
    assert drained["drained"]["by"] == "root"
    assert fired == ["mpi/nodes/changed"]
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
                                       "job_ca": "ok", "agent": "ok"}
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
    with pytest.raises(RequestError, match=words):
        admin_calls.drain(master, by="root", **args)
    assert master.store().drains() == {} and master.fired == []


def test_a_refusal_reaches_salt_run_as_an_error_and_exit_code_1(master):
    answer = runner.drain("node9", reason="x")
    assert answer == {"error": "'node9' is not an MPI node", "retcode": 1}
    assert runner.__context__["retcode"] == 1
    assert master.store().drains() == {} and master.fired == []


def test_a_refused_submit_reaches_salt_run_as_rejected_and_queues_nothing(master):
    answer = runner.submit(user="alice", image="mpi", np=2, cmd="hostname", name="../x")
    assert answer["state"] == "rejected" and answer["retcode"] == 1
    assert "is not a job name" in answer["error"]
    assert runner.__context__["retcode"] == 1
    assert master.store().jobs(None) == [] and master.fired == []
