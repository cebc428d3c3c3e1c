"""Unit tests of dmpi.launch.flavours: every flavour the probe lets jobs run on has a
launch module, and a job's failure is read whatever its MPI."""

import inspect
import pathlib

import pytest
from dmpi.launch import flavours, mpich, openmpi, openmpi5, probe

DATA = pathlib.Path(__file__).parent / "data"
PLACEMENT = [("10.0.1.130", 2), ("10.0.1.131", 1)]
ARGS = (3, "10.0.0.0/24", (20100, 20299), (20300, 20999), 20000, "/data/mpi-jobs/j")


def test_every_flavour_jobs_may_run_on_has_a_launch_module():
    assert set(flavours.MODULES) == set(probe.LAUNCHABLE)
    assert flavours.module(None) is openmpi and flavours.DEFAULT == probe.LAUNCHABLE[0]
    for name, module in flavours.MODULES.items():
        for function in ("hostfile_text", "launcher_argv", "parse_failure"):
            assert callable(getattr(module, function)), (name, function)
        assert list(inspect.signature(module.launcher_argv).parameters) == list(
            inspect.signature(openmpi.launcher_argv).parameters), name


def test_a_flavour_it_cannot_launch_is_a_clear_error():
    with pytest.raises(ValueError, match="cannot launch jobs of MPI flavour 'intelmpi' "
                       r"\(it launches mpich, openmpi4, openmpi5\)"):
        flavours.module("intelmpi")


@pytest.mark.parametrize("flavour", sorted(flavours.MODULES))
def test_each_flavour_launches_with_the_nodes_ssh_and_the_jobs_program(flavour):
    module = flavours.module(flavour)
    argv = module.launcher_argv("/data/o", "/data/e", *ARGS, env_names=["PATH"],
                                launcher="/opt/venv/bin/mpirun")
    assert argv[:6] == ["/bin/sh", "-c", openmpi.LAUNCHER_SCRIPT, "sh", "/data/o", "/data/e"]
    assert argv[6] == "/opt/venv/bin/mpirun"
    assert argv[-2:] == ["/bin/sh", "/run/dockermpi/program"]
    assert module.hostfile_text(PLACEMENT).count("\n") == 2


@pytest.mark.parametrize("flavour, sample, expected", [
    ("openmpi4", "mpirun/exit3.stderr", {"rank": 1, "exit_code": 3}),
    ("openmpi5", "openmpi5/exit3.stderr", {"rank": 1, "exit_code": 3}),
])
def test_a_failure_is_read_whatever_the_jobs_mpi(flavour, sample, expected):
    text = (DATA / sample).read_text()
    assert flavours.parse_failure(text) == flavours.module(flavour).parse_failure(text)
    assert flavours.parse_failure(text) == expected


def test_a_lost_daemon_is_read_from_open_mpi_5_only():
    lost = (DATA / "openmpi5" / "ssh_partition.stderr").read_text()
    assert flavours.lost_daemon(lost) == openmpi5.LOST_DAEMON_REASON
    for sample in ("mpirun/exit3.stderr", "openmpi5/hello.stderr"):
        assert flavours.lost_daemon((DATA / sample).read_text()) is None
    assert flavours.lost_daemon(b"bytes") is None and flavours.parse_failure(None) is None


def test_mpich_is_a_flavour():
    assert flavours.module("mpich") is mpich
