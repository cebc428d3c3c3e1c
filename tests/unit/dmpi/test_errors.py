"""The exception hierarchy (``dmpi.errors``): caught by class."""

from dmpi import errors


def test_every_error_is_a_dockermpi_error_and_keeps_its_builtin_base():
    assert issubclass(errors.ConfigError, errors.DockerMPIError)
    assert issubclass(errors.ConfigError, ValueError)
    assert issubclass(errors.RequestError, ValueError)
    assert issubclass(errors.StoreError, RuntimeError)


def test_a_config_error_holds_one_line_per_problem():
    exc = errors.ConfigError(["mpi:ports:oob overlaps", "mpi:storage:path is relative"])
    assert exc.problems == ["mpi:ports:oob overlaps", "mpi:storage:path is relative"]
    assert str(exc) == "mpi:ports:oob overlaps\nmpi:storage:path is relative"
    assert errors.ConfigError("one").problems == ["one"]
