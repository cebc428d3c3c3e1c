"""
Unit tests of the order ``mpi_job.start_worker`` keeps in a standby namespace: the
namespace leaves the standby network and gets the job's firewall before the worker
starts in it, and a failure there starts nothing. The Docker SDK is faked (the order of
calls is what a unit test can pin down); the real engine is exercised on the cluster.
"""

from unittest.mock import MagicMock

import docker.errors
import pytest
import dmpi.launch.ssh
from dmpi.errors import StartFailure
from dmpi.contract import AGENT_DIR, AGENT_SSHD, RUN_DIR
from dmpi.errors import NodeError
from dmpi.node import agent, containers, jobca, netns, standby, start, userdirs
from salt.exceptions import CommandExecutionError
from tests.extension import load_extension

mpi_job = load_extension("_modules/mpi_job.py", "mpi_job_module_for_start")
REQUIRE_USER_DIR = userdirs.require_user_dir

JOB = "20261130-120000-abcdef"
ADDRESS = "10.251.1.130"
LAUNCHER_ADDRESS = "10.251.1.131"
FILES = {"sshd_config": "Port 20000\n"}


@pytest.fixture
def configure_loader_modules():
    return {mpi_job: {"__opts__": {"id": "node1", "pki_dir": "/nonexistent"}}}


class Steps(list):
    """The calls made, in order; ``client`` is the fake Docker client."""


@pytest.fixture
def steps(monkeypatch, tmp_path):
    """The calls start_worker makes, in order, with the node's own steps stubbed."""
    done = Steps()
    holder = MagicMock(id="holder-id", attrs={"State": {"Pid": 4242}})
    client = MagicMock()
    client.api.disconnect_container_from_network.side_effect = \
        lambda *args: done.append(("disconnect", args))
    worker = MagicMock(attrs={"State": {"Pid": 4343}})
    worker.start.side_effect = lambda: done.append(("start",))

    def create(image, **options):
        done.append(("create", options["network_mode"]))
        done.options = options
        return worker

    client.containers.create.side_effect = create
    monkeypatch.setattr(containers, "client", lambda: client)
    monkeypatch.setattr(userdirs, "require_user_dir", lambda *args: None)
    monkeypatch.setattr(start, "write_secrets", lambda *args: None)
    monkeypatch.setattr(agent, "host_path", lambda: "/usr/lib/dockermpi/agent.d/0123")
    monkeypatch.setattr(jobca, "JOB_CA_KEY", str(tmp_path / "job-ca" / "ca"))
    monkeypatch.setattr(standby, "take_standby", lambda *args: holder)
    monkeypatch.setattr(netns, "close_namespace",
                        lambda job_id, pid, *args: done.append(("firewall", pid)))
    monkeypatch.setattr(start, "_wait_for_sshd",
                        lambda job_id, container, pid, *args: done.append(("sshd", pid)))
    done.client = client
    (tmp_path / "users" / "alice").mkdir(parents=True)
    done.storage = str(tmp_path)
    return done


def _start(steps):
    """node1's part of a two-node job whose launcher is on node2."""
    _, launcher_ca = dmpi.launch.ssh.generate_ed25519_keypair("node2-ca")
    return mpi_job.start_worker(
        JOB, "registry:5000/mpi@sha256:" + "0" * 64, "alice", 23456, 23456, steps.storage,
        steps.storage, "dmpi-jobs", {"node1": ADDRESS, "node2": LAUNCHER_ADDRESS},
        {"peers": [ADDRESS, LAUNCHER_ADDRESS], "hosts": ["10.251.0.11"]}, 20000, FILES,
        launcher={"node": "node2", "argv": ["mpirun"]},
        job_cas={"node1": mpi_job.job_ca(), "node2": launcher_ca}, valid_seconds=60)


def test_a_standby_namespace_is_sealed_before_the_worker_starts_in_it(steps):
    ret = _start(steps)
    assert ret["namespace"] == "standby"
    names = [step[0] for step in steps]
    assert names.index("disconnect") < names.index("start")
    assert names.index("firewall") < names.index("start")
    assert ("disconnect", ("holder-id", standby.STANDBY_NETWORK)) in steps
    # The firewall and the sshd check act in the holder's namespace.
    assert ("firewall", 4242) in steps and ("sshd", 4242) in steps
    assert ("create", "container:holder-id") in steps
    assert ret["phases"]["firewall"] <= ret["phases"]["container"]


def test_the_worker_runs_the_nodes_sshd_whatever_the_images_entrypoint(steps):
    _start(steps)
    assert steps.options["entrypoint"] == [AGENT_SSHD]
    assert steps.options["command"] == ["-D", "-e", "-f", f"{RUN_DIR}/sshd_config"]
    agent_mounts = [m for m in steps.options["mounts"] if m["Target"] == AGENT_DIR]
    assert agent_mounts == [{"Target": AGENT_DIR, "Source": "/usr/lib/dockermpi/agent.d/0123",
                             "Type": "bind", "ReadOnly": True}]


def test_a_node_without_its_agent_starts_nothing(steps, monkeypatch):
    def no_agent():
        raise NodeError(f"this node has no remote-start agent at {AGENT_DIR}")

    monkeypatch.setattr(agent, "host_path", no_agent)
    with pytest.raises(CommandExecutionError, match="has no remote-start agent"):
        _start(steps)
    assert not steps.client.containers.create.called and steps == []


def test_a_start_without_the_shared_storage_fails_of_kind_storage(steps, tmp_path):
    (tmp_path / "users" / "alice").rmdir()
    (tmp_path / "users").rmdir()
    with pytest.raises(CommandExecutionError) as failed:
        _start(steps)
    failure = StartFailure.from_wire(str(failed.value))
    assert failure.kind == "storage"
    assert failure.message.startswith("shared storage is not ready: ")
    assert not steps.client.containers.create.called


def test_a_start_in_a_directory_not_the_users_fails_of_kind_user_dir(steps, monkeypatch):
    monkeypatch.setattr(userdirs, "require_user_dir", REQUIRE_USER_DIR)
    with pytest.raises(CommandExecutionError) as failed:
        _start(steps)  # users/alice is root's here, not uid 23456's
    failure = StartFailure.from_wire(str(failed.value))
    assert failure.kind == "user_dir"
    assert failure.message.startswith("the directory of user alice is not ready: ")
    assert not steps.client.containers.create.called


def test_a_namespace_that_cannot_leave_the_standby_network_starts_no_worker(steps):
    steps.client.api.disconnect_container_from_network.side_effect = \
        docker.errors.APIError("endpoint busy")
    with pytest.raises(CommandExecutionError, match="off the standby network"):
        _start(steps)
    assert ("start",) not in steps and not any(step[0] == "firewall" for step in steps)


def test_a_node_refuses_to_certify_with_a_ca_the_master_does_not_hold(steps):
    """A node whose job CA changed since its last health report starts nothing: the
    other nodes would not trust what it certifies."""
    _, stale = dmpi.launch.ssh.generate_ed25519_keypair("old-ca")
    mpi_job.job_ca()
    with pytest.raises(CommandExecutionError, match="another job CA for node1"):
        mpi_job.start_worker(
            JOB, "registry:5000/mpi@sha256:" + "0" * 64, "alice", 23456, 23456, steps.storage,
            steps.storage, "dmpi-jobs", {"node1": ADDRESS}, {"peers": [ADDRESS], "hosts": []},
            20000, FILES, launcher={"node": "node1", "argv": ["mpirun"]},
            job_cas={"node1": stale}, valid_seconds=60)
    assert not steps


@pytest.mark.parametrize("job_cas, launcher, words", [
    ({}, {"node": "node1"}, "job_cas must give every node"),
    ({"node1": "ssh-rsa AAAAB3Nza"}, {"node": "node1"}, "job_cas must give every node"),
    ({"node1": "ssh-ed25519 AAAA\nssh-ed25519 BBBB"}, {"node": "node1"}, "job_cas must give"),
    (None, {"node": "node9"}, "launcher must name one of the job's nodes"),
    (None, None, "launcher must name one of the job's nodes"),
])
def test_start_worker_refuses_bad_keys_input(steps, job_cas, launcher, words):
    if job_cas is None:
        job_cas = {"node1": mpi_job.job_ca()}
    with pytest.raises(Exception, match=words):
        mpi_job.start_worker(
            JOB, "registry:5000/mpi@sha256:" + "0" * 64, "alice", 23456, 23456, steps.storage,
            steps.storage, "dmpi-jobs", {"node1": ADDRESS}, {"peers": [ADDRESS], "hosts": []},
            20000, FILES, launcher=launcher, job_cas=job_cas, valid_seconds=60)
    assert not steps


def test_readiness_counts_only_certificates_of_the_right_ca_for_the_right_address(
        monkeypatch):
    """What ssh-keyscan -c prints is trusted per address: a certificate of another
    node's CA, or of this CA for another address, proves nothing."""
    ca1_private, ca1 = dmpi.launch.ssh.generate_ed25519_keypair("ca1")
    ca2_private, ca2 = dmpi.launch.ssh.generate_ed25519_keypair("ca2")
    _, host = dmpi.launch.ssh.generate_ed25519_keypair("host")

    def cert(ca_private, address, kind="host"):
        return dmpi.launch.ssh.sign_ssh_certificate(ca_private, host, kind, "id", [address], 1, 2)

    printed = "\n".join([
        cert(ca1_private, "10.0.0.1"),           # right: node1's CA for node1's address
        cert(ca1_private, "10.0.0.2"),           # node1's CA vouching for node2's address
        cert(ca2_private, "10.0.0.3", "user"),   # a user certificate
        "# 10.0.0.3:20000 SSH-2.0-OpenSSH_9.2p1",
        "garbage",
    ])
    monkeypatch.setattr(netns, "run", lambda argv, timeout: (0, printed, ""))
    monkeypatch.setattr(netns, "netns", lambda pid: [])
    proven = start._answering_with_job_certificate(
        1, {"10.0.0.1": ca1, "10.0.0.2": ca2, "10.0.0.3": ca2}, 20000)
    assert proven == {"10.0.0.1"}
