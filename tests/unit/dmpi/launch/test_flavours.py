"""Unit tests of dmpi.launch.flavours: every flavour the probe lets jobs run on has a
launch module, and a job's failure is read whatever its MPI."""

import inspect
import os
import pathlib
import shutil
import subprocess

import pytest
from dmpi.launch import flavours, intelmpi, mpich, openmpi, openmpi5, probe

DATA = pathlib.Path(__file__).parent / "data"
PLACEMENT = [("10.0.1.130", 2), ("10.0.1.131", 1)]
ARGS = (3, "10.0.0.0/24", (20100, 20299), (20300, 20999), 20000, "/data/mpi-jobs/j")


def test_every_flavour_jobs_may_run_on_has_a_launch_module():
    assert set(flavours.MODULES) == set(probe.LAUNCHABLE)
    assert flavours.module(None) is openmpi and flavours.DEFAULT == probe.LAUNCHABLE[0]
    for name, module in flavours.MODULES.items():
        for function in ("hostfile_text", "mpi_argv", "parse_failure"):
            assert callable(getattr(module, function)), (name, function)
        assert list(inspect.signature(module.mpi_argv).parameters) == list(
            inspect.signature(openmpi.mpi_argv).parameters), name


def test_a_flavour_it_cannot_launch_is_a_clear_error():
    with pytest.raises(ValueError, match="cannot launch jobs of MPI flavour 'openmpi' "
                       r"\(it launches intelmpi, mpich, openmpi4, openmpi5\)"):
        flavours.module("openmpi")


@pytest.mark.parametrize("flavour", sorted(flavours.MODULES))
def test_each_flavour_launches_with_the_nodes_ssh_and_the_jobs_program(flavour):
    module = flavours.module(flavour)
    argv = flavours.launcher_argv(module, "/data/o", "/data/e", *ARGS, env_names=["PATH"],
                                  launcher="/opt/venv/bin/mpirun")
    script = getattr(module, "LAUNCHER_PRELUDE", "") + flavours.LAUNCHER_SCRIPT
    assert argv[:6] == ["/bin/sh", "-c", script, "sh", "/data/o", "/data/e"]
    assert argv[6:] == module.mpi_argv(*ARGS, env_names=["PATH"],
                                       launcher="/opt/venv/bin/mpirun")
    assert argv[6] == "/opt/venv/bin/mpirun"
    assert argv[-2:] == ["/bin/sh", "/run/dockermpi/program"]
    assert module.hostfile_text(PLACEMENT).count("\n") == 2


@pytest.mark.parametrize("flavour", sorted(flavours.MODULES))
@pytest.mark.parametrize("kwargs, message", [
    ({"np": 0}, "np"), ({"np": "4"}, "np"), ({"np": True}, "np"),
    ({"cluster_cidr": "eth0"}, "CIDR"),
    ({"cluster_cidr": "10.197.1.5/24"}, "not a network"),
    ({"cluster_cidr": "fd00::/64"}, "IPv4"),
    ({"oob_ports": "20100"}, "LOW-HIGH"),
    ({"oob_ports": (20199, 20100)}, "empty"),
    ({"oob_ports": (80, 200)}, "between 1024"),
    ({"btl_ports": (20150, 20300)}, "overlap"),
    ({"ssh_port": 20150}, "inside"),
    ({"ssh_port": 22}, "between 1024"),
    ({"workdir": "data/x"}, "absolute"),
    ({"workdir": "/data/my job"}, "whitespace"),
    ({"run_dir": "/run/my dir"}, "whitespace"),
    ({"env_names": "PATH"}, "list"),
    ({"env_names": ["A=B"]}, "not valid"), ({"env_names": ["A,B"]}, "not valid"),
    ({"env_names": ["1X"]}, "not valid"), ({"env_names": [None]}, "not valid"),
    ({"keepalive": (0, 1, 3)}, "positive"),
    ({"keepalive": (2, 1)}, "time, intvl, probes"),
    ({"keepalive": (2, 1, True)}, "positive"),
    ({"launcher": "bin/mpirun"}, "launcher must be an absolute path"),
    ({"launcher": "/opt/my mpi/mpirun"}, "whitespace"),
    ({"stdout_path": "out"}, "absolute"),
    ({"stderr_path": "/data/o"}, "must differ"),
])
def test_every_flavour_refuses_bad_launch_values_by_name(flavour, kwargs, message):
    args = dict(zip(("np", "cluster_cidr", "oob_ports", "btl_ports", "ssh_port", "workdir"),
                    ARGS), stdout_path="/data/o", stderr_path="/data/e")
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        flavours.launcher_argv(flavours.module(flavour), **args)


def test_the_launcher_script_redirects_and_keeps_the_exit_code(tmp_path):
    """The fixed wrapper with a stand-in for mpirun: hostile strings stay data."""
    out, err = tmp_path / "out", tmp_path / "err"
    hostile = ["$(touch pwned)", "; touch pwned2", "`id`", "a b"]
    script = 'printf "%s\\n" "$@"; echo oops >&2; exit 7'
    argv = ["/bin/sh", "-c", flavours.LAUNCHER_SCRIPT, "sh", str(out), str(err),
            "/bin/sh", "-c", script, "inner"] + hostile
    result = subprocess.run(argv, cwd=tmp_path, capture_output=True, check=False)
    assert result.returncode == 7
    assert result.stdout == b"" and result.stderr == b""
    assert out.read_text().splitlines() == hostile
    assert err.read_text() == "oops\n"
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "pwned2").exists()


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


@pytest.mark.parametrize("flavour", sorted(flavours.MODULES))
def test_the_nodes_addresses_are_read_back_from_every_flavours_hostfile(flavour):
    # The node probes a running job's peers at the addresses of its hostfile.
    placement = [("10.251.1.130", 2), ("10.251.1.131", 1), ("10.251.1.132", 4)]
    text = flavours.module(flavour).hostfile_text(placement)
    assert flavours.hostfile_addresses(text) == [a for a, _ in placement]


def test_hostfile_lines_that_are_no_address_are_skipped():
    text = "# comment\n\n10.0.0.1:2\nnode9 slots=1\n999.1.1.1:1\n10.0.0.2 slots=1\n\x00:\n"
    assert flavours.hostfile_addresses(text) == ["10.0.0.1", "10.0.0.2"]


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                    reason="needs root to make a network namespace")
def test_intel_mpis_launcher_names_the_namespaces_one_interface(tmp_path):
    # A job's namespace as the kernel shows it: lo and one Ethernet interface, whatever
    # its name (a bridge here: this kernel has no dummy interfaces), and a device of
    # another type that sorts after it (a host's tunnel modules add tunl0 and sit0).
    argv = flavours.launcher_argv(intelmpi, str(tmp_path / "out"), str(tmp_path / "err"),
                                  *ARGS, launcher="/opt/venv/bin/mpirun")
    shown = subprocess.run(
        ["unshare", "--net", "--mount", "sh", "-c",
         'mount -t sysfs sysfs /sys && ip link add eth7 type bridge '
         '&& ip tuntap add dev tun9 mode tun && exec "$@"', "sh",
         *argv[:6], "sh", "-c", 'echo "$I_MPI_HYDRA_IFACE"; echo said >&2'],
        env=dict(os.environ, I_MPI_HYDRA_IFACE="users-own"),
        capture_output=True, text=True, timeout=30)
    assert shown.returncode == 0, shown.stderr
    assert (tmp_path / "out").read_text() == "eth7\n"
    assert (tmp_path / "err").read_text() == "said\n"
