"""
Unit tests of the order ``mpi_job.start_worker`` keeps in a standby namespace: the
namespace leaves the standby network and gets the job's firewall before the worker
starts in it, and a failure there starts nothing. The Docker SDK is faked (the order of
calls is what a unit test can pin down); the real engine is exercised on the cluster.
"""

from unittest.mock import MagicMock

import docker.errors
import pytest
from salt.exceptions import CommandExecutionError
from tests.extension import load_extension

mpi_job = load_extension("_modules/mpi_job.py", "mpi_job_module_for_start")

JOB = "20261130-120000-abcdef"
ADDRESS = "10.251.1.130"
FILES = {"known_hosts": "[10.251.1.130]:20000 ssh-ed25519 AAAAC3Nza host"}


@pytest.fixture
def configure_loader_modules():
    return {mpi_job: {"__opts__": {"id": "node1"}}}


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

    def create(image, argv, **options):
        done.append(("create", options["network_mode"]))
        return worker

    client.containers.create.side_effect = create
    monkeypatch.setattr(mpi_job, "_client", lambda: client)
    monkeypatch.setattr(mpi_job, "_require_user_dir", lambda *args: None)
    monkeypatch.setattr(mpi_job, "_write_secrets", lambda *args: None)
    monkeypatch.setattr(mpi_job, "_take_standby", lambda *args: holder)
    monkeypatch.setattr(mpi_job, "_close_namespace",
                        lambda job_id, pid, *args: done.append(("firewall", pid)))
    monkeypatch.setattr(mpi_job, "_wait_for_sshd",
                        lambda job_id, container, pid, *args: done.append(("sshd", pid)))
    done.client = client
    (tmp_path / "users" / "alice").mkdir(parents=True)
    done.storage = str(tmp_path)
    return done


def _start(steps):
    return mpi_job.start_worker(
        JOB, "registry:5000/mpi@sha256:" + "0" * 64, "alice", 23456, 23456, steps.storage,
        steps.storage, "dmpi-jobs", {"node1": ADDRESS},
        {"peers": [ADDRESS], "hosts": ["10.251.0.11"]}, 20000, FILES)


def test_a_standby_namespace_is_sealed_before_the_worker_starts_in_it(steps):
    ret = _start(steps)
    assert ret["namespace"] == "standby"
    names = [step[0] for step in steps]
    assert names.index("disconnect") < names.index("start")
    assert names.index("firewall") < names.index("start")
    assert ("disconnect", ("holder-id", mpi_job.STANDBY_NETWORK)) in steps
    # The firewall and the sshd check act in the holder's namespace.
    assert ("firewall", 4242) in steps and ("sshd", 4242) in steps
    assert ("create", "container:holder-id") in steps
    assert ret["phases"]["firewall"] <= ret["phases"]["container"]


def test_a_namespace_that_cannot_leave_the_standby_network_starts_no_worker(steps):
    steps.client.api.disconnect_container_from_network.side_effect = \
        docker.errors.APIError("endpoint busy")
    with pytest.raises(CommandExecutionError, match="off the standby network"):
        _start(steps)
    assert ("start",) not in steps and not any(step[0] == "firewall" for step in steps)
