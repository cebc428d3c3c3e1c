"""Unit tests of the test cluster tool's own checks (no Docker engine needed)."""

import types

import pytest

from tests.cluster import testcluster
from tests.cluster.testcluster import REPO, ClusterError

# Not imported by name: pytest would take a class called Test... for tests.
_check_same_checkout = testcluster.TestCluster._check_same_checkout


def _host(name, mounts):
    return types.SimpleNamespace(name=name, attrs={"Mounts": [
        {"Destination": dest, "Source": source} for dest, source in mounts.items()]})


def _wanted():
    return {str(REPO / "salt"): {"bind": "/srv/salt", "mode": "ro"},
            "dmpi-master-pki": {"bind": "/etc/salt/pki", "mode": "rw"}}


def test_a_host_of_this_checkout_is_reused():
    _check_same_checkout(
        _host("dmpi-master", {"/srv/salt": str(REPO / "salt"),
                              "/etc/salt/pki": "/var/lib/docker/volumes/dmpi-master-pki/_data"}),
        _wanted())


def test_a_host_built_from_another_checkout_is_refused_with_the_fix():
    with pytest.raises(ClusterError) as raised:
        _check_same_checkout(
            _host("dmpi-master", {"/srv/salt": "/old/checkout/salt"}), _wanted())
    message = str(raised.value)
    assert "dmpi-master" in message and "/old/checkout/salt" in message
    assert "dmpi-cluster down" in message and str(testcluster.REPO) in message


class SilentMaster:
    """The cluster tool's view of a master whose minions answer only once it was
    restarted (after ``answers_after_restart`` more looks), on a fake clock."""

    def __init__(self, answers_after_restart):
        self.now = 0.0
        self.restarts = 0
        self.looks_left = answers_after_restart
        self.cluster = object.__new__(testcluster.TestCluster)
        self.cluster.node_count = 1
        self.cluster.salt_json = self.salt_json
        self.cluster.salt = lambda argv, **kwargs: (0, "")
        self.cluster.exec = self.exec

    def salt_json(self, argv):
        self.now += 5  # a test.ping that times out
        if argv[0] == "salt-key":
            return 0, {"minions": self.cluster.minions}
        if self.restarts and not self.looks_left:
            return 0, {minion: True for minion in self.cluster.minions}
        self.looks_left -= bool(self.restarts)
        return 0, {}

    def exec(self, host, argv):
        assert (host, argv) == ("master", ["systemctl", "restart", "salt-master"])
        self.restarts += 1


@pytest.fixture
def silent_master(monkeypatch):
    def make(answers_after_restart):
        master = SilentMaster(answers_after_restart)
        monkeypatch.setattr(testcluster.time, "monotonic", lambda: master.now)
        monkeypatch.setattr(testcluster.time, "sleep", lambda seconds: None)
        return master
    return make


def test_minions_silent_behind_a_broken_master_get_it_restarted_once(silent_master):
    master = silent_master(answers_after_restart=2)
    master.cluster.wait_for_minions(timeout=120)
    assert master.restarts == 1
    assert testcluster.MINION_REPAIR_AFTER <= master.now < 120


def test_minions_still_silent_after_the_restart_fail_naming_them(silent_master):
    master = silent_master(answers_after_restart=10**6)
    with pytest.raises(ClusterError,
                       match=r"minions not answering: \['master', 'storage', 'hub', 'node1'\]"):
        master.cluster.wait_for_minions(timeout=120)
    assert master.restarts == 1


class LossyEngine:
    """Runs a host's commands here, with a real shell, and loses the whole output of
    the first ``losses`` of them as Docker's exec sometimes does."""

    def __init__(self, losses):
        self.losses = losses
        self.runs = 0
        self.cluster = object.__new__(testcluster.TestCluster)
        self.cluster.exec = self.exec

    def exec(self, host, argv, stdout_only=False):
        import subprocess
        done = subprocess.run(argv, capture_output=True, text=True, check=True)
        self.runs += 1
        if self.losses:
            self.losses -= 1
            return 0, ""
        return 0, done.stdout


@pytest.mark.parametrize("text", ["one line\n", "no newline at the end", "", "\n\n"])
def test_a_read_whose_output_docker_lost_runs_again_and_comes_whole(tmp_path, text):
    engine = LossyEngine(losses=2)
    (tmp_path / "file").write_text(text)
    assert engine.cluster.read("node1", ["cat", str(tmp_path / "file")]) == text
    assert engine.runs == 3


def test_a_read_that_keeps_losing_its_output_fails_saying_so(tmp_path):
    engine = LossyEngine(losses=10)
    with pytest.raises(ClusterError, match="lost the output 3 times in a row"):
        engine.cluster.read("node1", ["true"])
