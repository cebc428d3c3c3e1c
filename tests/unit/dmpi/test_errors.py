"""The exception hierarchy (``dmpi.errors``): caught by class, a start failure by kind."""

import pytest

from dmpi import errors
from dmpi.errors import StartFailure


def test_every_error_is_a_dockermpi_error_and_keeps_its_builtin_base():
    assert issubclass(errors.ConfigError, errors.DockerMPIError)
    assert issubclass(errors.ConfigError, ValueError)
    assert issubclass(errors.RequestError, ValueError)
    assert issubclass(errors.StoreError, RuntimeError)
    assert issubclass(errors.NoSuchJob, errors.RequestError)
    assert issubclass(errors.ClusterError, errors.DockerMPIError)
    assert issubclass(errors.ClusterError, RuntimeError)
    assert issubclass(StartFailure, errors.DockerMPIError)


def test_a_config_error_holds_one_line_per_problem():
    exc = errors.ConfigError(["mpi:ports:oob overlaps", "mpi:storage:path is relative"])
    assert exc.problems == ["mpi:ports:oob overlaps", "mpi:storage:path is relative"]
    assert str(exc) == "mpi:ports:oob overlaps\nmpi:storage:path is relative"
    assert errors.ConfigError("one").problems == ["one"]


@pytest.mark.parametrize("kind", StartFailure.KINDS)
def test_a_start_failure_crosses_salt_with_its_kind(kind):
    sent = StartFailure(kind, "the directory of user a is not ready: found None")
    # What the master gets back from LocalClient for the node that failed.
    received = StartFailure.from_wire(
        f"mpi_job.start_worker failed on node1: ERROR: {sent.wire()}")
    assert received.kind == kind
    assert received.message == (
        "mpi_job.start_worker failed on node1: ERROR: the directory of user a is not ready: "
        "found None")


def test_the_kind_is_never_read_from_the_words_of_a_message():
    text = ("mpi_job.start_worker failed on node1: ERROR: shared storage is not ready: "
            "/srv/dockermpi/users does not exist on this node")
    assert StartFailure.from_wire(text).kind == "node"
    marked = StartFailure("storage", "shared storage is not ready: /srv/x/users is missing")
    assert StartFailure.from_wire("node1: " + marked.wire()).kind == "storage"


def test_of_two_nodes_the_storage_failure_counts_first():
    text = (f"node1: {StartFailure('user_dir', 'users/a is not ready').wire()}; "
            f"node2: {StartFailure('storage', 'no storage').wire()}")
    received = StartFailure.from_wire(text)
    assert received.kind == "storage"
    assert received.message == "node1: users/a is not ready; node2: no storage"


def test_an_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="kind must be one of storage, user_dir, node"):
        StartFailure("disk", "x")
