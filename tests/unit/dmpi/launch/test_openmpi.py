"""
Unit tests for :mod:`dmpi.launch.openmpi`: the hostfile, mpirun's command line and
parameters, the launcher script, and the failure parser.

The mpirun failure samples under ``data/mpirun/`` are real standard error captured from
Open MPI 4.1.4 (Debian bookworm's openmpi-bin, image ``dockermpi/mpi:dev``) running
``mpirun -np 4`` from a launcher container over ssh into two worker containers.
"""

import pathlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dmpi.launch import openmpi, ssh

DATA = pathlib.Path(__file__).resolve().parent / "data" / "mpirun"


CIDR = "10.197.1.0/24"
OOB = "20100-20199"
BTL = (20200, 20999)
SSH_PORT = 20022



def _sample(name):
    return (DATA / f"{name}.stderr").read_text()


def _mca(argv):
    """Map ``--mca NAME VALUE`` triples of an argv to a dict."""
    out = {}
    for i, arg in enumerate(argv):
        if arg == "--mca":
            out[argv[i + 1]] = argv[i + 2]
    return out



# ------------------------------------------------------------------------- hostfile


def test_hostfile_keeps_placement_order():
    text = openmpi.hostfile_text([("10.197.1.12", 4), ("10.197.1.11", 2)])
    assert text == "10.197.1.12 slots=4 max_slots=4\n10.197.1.11 slots=2 max_slots=2\n"


@pytest.mark.parametrize(
    "placement, message",
    [
        ([], "non-empty"),
        ([("node1", 2)], "IPv4"),
        ([("10.197.1.11", 0)], "positive"),
        ([("10.197.1.11", "2")], "positive"),
        ([("10.197.1.11", 2), ("10.197.1.11", 1)], "twice"),
        ([("10.197.1.11",)], "(address, slots)"),
    ],
)
def test_hostfile_rejects(placement, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        openmpi.hostfile_text(placement)


# ------------------------------------------------------------------------- launcher


def _argv(**kwargs):
    args = {
        "np": 4,
        "cluster_cidr": CIDR,
        "oob_ports": OOB,
        "btl_ports": BTL,
        "ssh_port": SSH_PORT,
        "workdir": "/data/jobs/42",
    }
    args.update(kwargs)
    return openmpi.mpi_argv(**args)


def test_mpirun_argv_settings():
    argv = _argv(env_names=["OMP_NUM_THREADS", "MY_VAR"])
    assert argv[:7] == ["mpirun", "--hostfile", "/run/dockermpi/hostfile", "-np", "4",
                        "--wdir", "/data/jobs/42"]
    assert argv[-2:] == ["/bin/sh", "/run/dockermpi/program"]
    mca = _mca(argv)
    assert mca["oob_tcp_if_include"] == CIDR
    assert mca["btl_tcp_if_include"] == CIDR
    assert mca["oob_tcp_dynamic_ipv4_ports"] == "20100-20199"
    assert mca["oob_tcp_dynamic_ipv6_ports"] == "20100-20199"
    assert (mca["btl_tcp_port_min_v4"], mca["btl_tcp_port_range_v4"]) == ("20200", "800")
    assert (mca["btl_tcp_port_min_v6"], mca["btl_tcp_port_range_v6"]) == ("20200", "800")
    assert mca["btl_vader_single_copy_mechanism"] == "none"
    assert (mca["oob_tcp_keepalive_time"], mca["oob_tcp_keepalive_intvl"],
            mca["oob_tcp_keepalive_probes"]) == ("2", "1", "3")
    assert mca["btl"] == "self,vader,tcp"
    xs = [argv[i + 1] for i, a in enumerate(argv) if a == "-x"]
    assert xs == ["OMP_NUM_THREADS", "MY_VAR"]


def test_mpirun_by_the_path_the_image_probe_found():
    argv = _argv(launcher="/opt/venv/bin/mpirun")
    assert argv[0] == "/opt/venv/bin/mpirun" and argv[1] == "--hostfile"


def test_ssh_args_reach_the_job_port_with_job_keys():
    rsh_args = _mca(_argv())["plm_rsh_args"].split(" ")
    # Open MPI splits plm_rsh_args on spaces: every option must survive that split.
    assert rsh_args == ssh.ssh_args(SSH_PORT)
    joined = " ".join(rsh_args)
    for expected in ("-p 20022", "-i /run/dockermpi/id_ed25519",
                     "CertificateFile=/run/dockermpi/id_ed25519-cert.pub",
                     "UserKnownHostsFile=/run/dockermpi/known_hosts", "StrictHostKeyChecking=yes",
                     "BatchMode=yes"):
        assert expected in joined


def test_custom_keepalive():
    mca = _mca(_argv(keepalive=(5, 2, 4)))
    assert (mca["oob_tcp_keepalive_time"], mca["oob_tcp_keepalive_intvl"],
            mca["oob_tcp_keepalive_probes"]) == ("5", "2", "4")


HOSTILE_PROGRAM = ["printf", "%s\\0", "$(touch pwned)", "; touch pwned2", "`id`", "a b", ":",
                   "-np", "6", "--host", "x:6", "--mca", "plm", "isolated", "it's", "\n", "",
                   "\\", "*"]


def test_the_program_never_reaches_mpirun_argv():
    argv = _argv()
    # mpirun reads ':' as a new program group: nothing of the user's may be in its argv.
    assert ":" not in argv
    assert argv[-2:] == ["/bin/sh", "/run/dockermpi/program"]


# ---------------------------------------------------------------------- failure parse


@pytest.mark.parametrize(
    "sample, expected",
    [
        # rank 1: sys.exit(3) (mpi4py still finalizes) and os._exit(3)
        ("exit3", {"rank": 1, "exit_code": 3}),
        ("exit3os", {"rank": 1, "exit_code": 3}),
        # rank 1 kills itself with SIGSEGV; the sample also holds Open MPI's backtrace
        ("segv", {"rank": 1, "signal": 11, "signal_name": "SIGSEGV"}),
        ("sigkill", {"rank": 2, "signal": 9, "signal_name": "SIGKILL"}),
        # rank 3: MPI.COMM_WORLD.Abort(5)
        ("abort", {"rank": 3, "exit_code": 5}),
        # not a rank's failure: success, a worker killed, a missing program
        ("hello", None),
        ("lostnode", None),
        ("notfound", None),
    ],
)
def test_parse_real_mpirun_stderr(sample, expected):
    assert openmpi.parse_failure(_sample(sample)) == expected


def test_parse_crlf():
    text = _sample("exit3").replace("\n", "\r\n")
    assert openmpi.parse_failure(text) == {"rank": 1, "exit_code": 3}


def test_parse_last_message_wins_over_program_output():
    forged = _sample("segv").replace("rank 1 with", "rank 0 with").replace("signal 11", "signal 6")
    # The program printed a look-alike first; mpirun's real verdict comes last.
    text = forged + _sample("exit3os")
    assert openmpi.parse_failure(text) == {"rank": 1, "exit_code": 3}


def test_parse_unknown_signal_number_keeps_text():
    text = ("mpirun noticed that process rank 5 with PID 12 on node 10.0.0.1 exited on "
            "signal 99 (Odd signal).\n")
    assert openmpi.parse_failure(text) == {"rank": 5, "signal": 99, "signal_name": "Odd signal"}


def test_parse_never_raises_on_what_a_job_can_write():
    assert openmpi.parse_failure(b"bytes") is None
    huge_rank = ("mpirun noticed that process rank " + "9" * 5000 + " with PID 12 on node n "
                 "exited on signal 11 (Segmentation fault).\n")
    assert openmpi.parse_failure(huge_rank) is None
    unicode_digits = "MPI_ABORT was invoked on rank \u0663 in communicator W\nwith errorcode 1.\n"
    assert openmpi.parse_failure(unicode_digits) is None
    odd_signal = ("mpirun noticed that process rank 1 with PID 12 on node n exited on "
                  "signal 999.\n")
    assert openmpi.parse_failure(odd_signal) == {"rank": 1, "signal": 999,
                                                           "signal_name": "SIG999"}


@settings(max_examples=300, deadline=None, database=None)
@given(st.lists(st.one_of(
    st.text(max_size=200),
    st.sampled_from([_sample(n) for n in ("exit3", "segv", "abort", "sigkill", "lostnode")]),
    st.builds(lambda rank, sig: f"mpirun noticed that process rank {rank} with PID 1 on node "
              f"n exited on signal {sig} (x).", st.text(max_size=30), st.text(max_size=30)),
    st.builds(lambda rank, code: "Process name:  [[1,0]," + rank + "]\nExit code: " + code,
              st.text(alphabet="0123456789\u0663", max_size=6000), st.text(max_size=40)),
), max_size=6))
def test_parse_never_raises_and_returns_a_well_formed_verdict(pieces):
    found = openmpi.parse_failure("\n".join(pieces))
    assert found is None or (isinstance(found["rank"], int) and 0 <= found["rank"] < 10**9)
    if found and "signal" in found:
        assert isinstance(found["signal_name"], str) and len(found["signal_name"]) <= 40
