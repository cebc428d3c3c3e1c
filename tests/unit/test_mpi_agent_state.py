"""Unit tests of the mpi_agent state: what it says and does for a current agent, one to
build again, and a build that fails, and that test=True builds nothing. The execution
module builds the agent for real in tests/unit/dmpi/node/test_agent.py and on the
cluster's nodes."""

import pytest
from salt.exceptions import CommandExecutionError
from tests.extension import load_extension

state = load_extension("_states/mpi_agent.py", "mpi_agent_state")
WANTED = {"openssh-client": "1:9.2p1-2+deb12u10", "openssh-server": "1:9.2p1-2+deb12u10"}


class Node:
    def __init__(self, problems, build="aaaa", fail=None):
        self.problems, self.build_name, self.fail, self.builds = problems, build, fail, 0

    def status(self):
        manifest = {"build": self.build_name} if self.build_name else None
        return {"path": "/usr/lib/dockermpi/agent", "manifest": manifest, "wanted": WANTED,
                "problems": self.problems}

    def build(self):
        self.builds += 1
        if self.fail:
            raise CommandExecutionError(self.fail)
        self.problems, self.build_name = [], "bbbb"
        return {"build": "bbbb"}


@pytest.fixture
def node(monkeypatch):
    def make(test=False, **kwargs):
        found = Node(**kwargs)
        monkeypatch.setattr(state, "__salt__", {"mpi_agent.status": found.status,
                                                "mpi_agent.build": found.build},
                            raising=False)
        monkeypatch.setattr(state, "__opts__", {"test": test}, raising=False)
        return found
    return make


def test_a_current_agent_is_no_change(node):
    found = node(problems=[])
    ret = state.present("agent")
    assert ret["result"] is True and ret["changes"] == {} and found.builds == 0
    assert ret["comment"] == "the remote-start agent at /usr/lib/dockermpi/agent is current " \
        "(build aaaa)"


def test_an_agent_of_other_packages_is_built_again(node):
    found = node(problems=["it holds openssh-server 1:9.2p1-2+deb12u6, not 1:9.2p1-2+deb12u10"])
    ret = state.present("agent")
    assert ret["result"] is True and found.builds == 1
    assert ret["changes"] == {"agent": {"old": "aaaa", "new": "bbbb"}}
    assert ret["comment"] == "the remote-start agent was built: it holds openssh-server " \
        "1:9.2p1-2+deb12u6, not 1:9.2p1-2+deb12u10"


def test_test_mode_says_why_it_would_build_and_builds_nothing(node):
    found = node(test=True, problems=["there is no agent"], build=None)
    ret = state.present("agent")
    assert ret["result"] is None and found.builds == 0
    assert ret["comment"] == "the remote-start agent would be built: there is no agent"
    assert ret["changes"]["agent"]["old"] is None
    assert "openssh-server 1:9.2p1-2+deb12u10" in ret["changes"]["agent"]["new"]


def test_a_failed_build_fails_the_state_with_the_reason(node):
    found = node(problems=["sbin/sshd is missing"], fail="cannot build the remote-start "
                 "agent: cannot download openssh-server: apt-get exited 100")
    ret = state.present("agent")
    assert ret["result"] is False and ret["changes"] == {} and found.builds == 1
    assert ret["comment"].endswith("apt-get exited 100")


def test_apt_that_cannot_answer_fails_the_state(node, monkeypatch):
    node(problems=[])

    def broken():
        raise CommandExecutionError("apt has no candidate of openssh-server")

    monkeypatch.setitem(state.__salt__, "mpi_agent.status", broken)
    ret = state.present("agent")
    assert ret["result"] is False and ret["comment"] == "apt has no candidate of openssh-server"
