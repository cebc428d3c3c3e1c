"""Unit tests of the mpi_standby state: what it says and does for each node state, and
that test=True changes nothing (the execution module runs on the cluster)."""

import pytest
from salt.exceptions import CommandExecutionError
from tests.extension import load_extension

state = load_extension("_states/mpi_standby.py", "mpi_standby_state")
IMAGE = "registry.test:5000/mpi/openmpi@sha256:" + "ab" * 32


class Node:
    def __init__(self, ready, not_running=0, fail=None):
        self.ready, self.not_running, self.fail, self.calls = ready, not_running, fail, []

    def status(self):
        if self.fail:
            raise CommandExecutionError(self.fail)
        return {"ready": self.ready, "not_running": self.not_running}

    def standby(self, image, count):
        self.calls.append((image, count))
        made = [f"dmpi-standby-{i}" for i in range(max(0, count - self.ready))]
        removed = ["dmpi-standby-old"] * (self.not_running + max(0, self.ready - count))
        self.ready, self.not_running = count, 0
        return {"made": made, "removed": removed, "ready": count}


@pytest.fixture
def node(monkeypatch):
    def make(test=False, **kwargs):
        found = Node(**kwargs)
        monkeypatch.setattr(state, "__salt__", {"mpi_job.standby_status": found.status,
                                                "mpi_job.standby": found.standby},
                            raising=False)
        monkeypatch.setattr(state, "__opts__", {"test": test}, raising=False)
        return found
    return make


def test_enough_ready_is_no_change(node):
    found = node(ready=2)
    ret = state.present("openmpi", IMAGE, 2)
    assert ret["result"] is True and ret["changes"] == {} and found.calls == []
    assert ret["comment"] == "2 standby network namespaces are ready"


def test_missing_ones_are_made_from_the_image(node):
    found = node(ready=0)
    ret = state.present("openmpi", IMAGE, 2)
    assert ret["result"] is True and found.calls == [(IMAGE, 2)]
    assert ret["changes"] == {"made": ["dmpi-standby-0", "dmpi-standby-1"], "removed": []}


@pytest.mark.parametrize("ready,not_running,count,plan", [
    (0, 0, 2, {"made": 2, "removed": 0}),
    (3, 1, 2, {"made": 0, "removed": 2}),
    (2, 0, 0, {"made": 0, "removed": 2}),
])
def test_test_mode_tells_what_would_change_and_changes_nothing(node, ready, not_running,
                                                                count, plan):
    found = node(test=True, ready=ready, not_running=not_running)
    ret = state.present("openmpi", IMAGE, count)
    assert ret["result"] is None and ret["changes"] == plan and found.calls == []


def test_an_engine_that_does_not_answer_fails_the_state_with_the_reason(node):
    node(ready=0, fail="cannot reach the Docker engine: boom")
    ret = state.present("openmpi", IMAGE, 2)
    assert ret["result"] is False
    assert ret["comment"] == "standby network namespaces: cannot reach the Docker engine: boom"
