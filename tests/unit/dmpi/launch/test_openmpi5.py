"""
Unit tests for :mod:`dmpi.launch.openmpi5`: the hostfile, the Open MPI 5 mpirun command
line (PRRTE and Open MPI parameters), the launcher script, and the failure parser.

The samples under ``data/openmpi5/`` are real output of Open MPI 5.0.11 (PyPI wheel,
PRRTE 3.0.14) run with this module's argv; ``data/openmpi5/capture.sh`` made them and
``results.tsv`` there holds mpirun's exit codes.
"""

import pathlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dmpi.contract import AGENT_SSH
from dmpi.launch import openmpi, openmpi5, ssh

DATA = pathlib.Path(__file__).resolve().parent / "data" / "openmpi5"

CIDR = "10.197.1.0/24"
OOB = "20100-20199"
BTL = (20200, 20999)
SSH_PORT = 20022


def _sample(name):
    return (DATA / f"{name}.stderr").read_text()


def _results():
    rows = (line.split("\t") for line in (DATA / "results.tsv").read_text().splitlines())
    return {name: int(rc) for name, rc, _ in rows}


def _params(argv, flag):
    """Map ``FLAG NAME VALUE`` triples of an argv to a dict."""
    return {argv[i + 1]: argv[i + 2] for i, arg in enumerate(argv) if arg == flag}


def _argv(**kwargs):
    args = {"np": 4, "cluster_cidr": CIDR, "oob_ports": OOB, "btl_ports": BTL,
            "ssh_port": SSH_PORT, "workdir": "/data/jobs/42"}
    args.update(kwargs)
    return openmpi5.mpi_argv(**args)


# ------------------------------------------------------------------------- hostfile


def test_hostfile_is_open_mpi_4s():
    placement = [("10.197.1.12", 4), ("10.197.1.11", 2)]
    assert openmpi5.hostfile_text(placement) == openmpi.hostfile_text(placement) == (
        "10.197.1.12 slots=4 max_slots=4\n10.197.1.11 slots=2 max_slots=2\n")


@pytest.mark.parametrize("placement", [[], [("node1", 2)], [("10.197.1.11", 0)],
                                       [("10.197.1.11", 2), ("10.197.1.11", 1)]])
def test_hostfile_rejects(placement):
    with pytest.raises(ValueError):
        openmpi5.hostfile_text(placement)


# ------------------------------------------------------------------------- mpirun argv


def test_mpirun_argv_exactly():
    argv = _argv(env_names=["OMP_NUM_THREADS", "MY_VAR"])
    rsh_args = " ".join(ssh.ssh_args(SSH_PORT))
    assert argv == [
        "mpirun", "--hostfile", "/run/dockermpi/hostfile", "-np", "4",
        "--wdir", "/data/jobs/42", "--map-by", "slot:NOOVERSUBSCRIBE", "--bind-to", "none",
        "--prtemca", "plm", "ssh",
        "--prtemca", "plm_ssh_agent", AGENT_SSH,
        "--prtemca", "plm_ssh_args", rsh_args,
        "--prtemca", "plm_ssh_no_tree_spawn", "1",
        "--prtemca", "oob", "tcp",
        "--prtemca", "prte_if_include", CIDR,
        "--prtemca", "oob_tcp_dynamic_ipv4_ports", "20100-20199",
        "--prtemca", "oob_tcp_dynamic_ipv6_ports", "20100-20199",
        "--prtemca", "oob_tcp_disable_ipv6_family", "1",
        "--prtemca", "oob_tcp_keepalive_time", "2",
        "--prtemca", "oob_tcp_keepalive_intvl", "1",
        "--prtemca", "oob_tcp_keepalive_probes", "3",
        "--mca", "pml", "ob1",
        "--mca", "btl", "self,sm,tcp",
        "--mca", "btl_tcp_if_include", CIDR,
        "--mca", "btl_tcp_port_min_v4", "20200",
        "--mca", "btl_tcp_port_range_v4", "800",
        "--mca", "btl_tcp_disable_family", "6",
        "--mca", "btl_tcp_port_min_v6", "20200",
        "--mca", "btl_tcp_port_range_v6", "800",
        "--mca", "smsc", "^cma,knem,xpmem",
        "--mca", "osc", "^ucx",
        "-x", "OMP_NUM_THREADS", "-x", "MY_VAR",
        "/bin/sh", "/run/dockermpi/program",
    ]


def test_no_open_mpi_4_names_and_no_root():
    argv = _argv()
    joined = " ".join(argv)
    for gone in ("plm_rsh", "vader", "orte", "hwloc_base_binding_policy",
                 "rmaps_base_oversubscribe", "oob_tcp_if_include", "--allow-run-as-root"):
        assert gone not in joined
    # PRRTE's parameters go to PRRTE, not to the ranks.
    assert not set(_params(argv, "--mca")) & set(_params(argv, "--prtemca"))


def test_ssh_agent_is_dockermpis_with_job_keys_and_split_safe():
    prte = _params(_argv(run_dir="/run/job7"), "--prtemca")
    assert prte["plm_ssh_agent"] == AGENT_SSH == "/usr/lib/dockermpi/agent/bin/ssh"
    # PRRTE splits plm_ssh_args on spaces: every option must survive that split.
    assert prte["plm_ssh_args"].split(" ") == ssh.ssh_args(SSH_PORT, "/run/job7")


def test_run_dir_keepalive_and_launcher():
    argv = _argv(run_dir="/run/job7", keepalive=(5, 2, 4), launcher="/opt/venv/bin/mpirun")
    assert argv[:3] == ["/opt/venv/bin/mpirun", "--hostfile", "/run/job7/hostfile"]
    assert argv[-2:] == ["/bin/sh", "/run/job7/program"]
    prte = _params(argv, "--prtemca")
    assert [prte[f"oob_tcp_keepalive_{k}"] for k in ("time", "intvl", "probes")] == ["5", "2", "4"]


def test_the_program_never_reaches_mpirun_argv():
    # mpirun reads ':' as a new program group: nothing of the user's may be in its argv.
    argv = _argv()
    assert ":" not in argv and argv[-2:] == ["/bin/sh", "/run/dockermpi/program"]


# ---------------------------------------------------------------------- failure parse

EXPECTED = {
    # rank 1 sys.exit(3) (mpi4py still finalizes), os._exit(3); rank 3 on the ssh worker
    "exit3": {"rank": 1, "exit_code": 3},
    "exit3os": {"rank": 1, "exit_code": 3},
    "ssh_exit3": {"rank": 3, "exit_code": 3},
    # rank 1 of 3 os._exit(3) while the others wait in a barrier (test cluster): the
    # others' connections to it fail, and prterun's daemon logs a line inside its message
    "ssh_exit3_interleaved": {"rank": 1, "exit_code": 3},
    # rank 1 sends itself SIGSEGV (with Open MPI's backtrace), or really faults (C)
    "segv": {"rank": 1, "signal": 11, "signal_name": "SIGSEGV"},
    "segvc": {"rank": 1, "signal": 11, "signal_name": "SIGSEGV"},
    "ssh_segv": {"rank": 2, "signal": 11, "signal_name": "SIGSEGV"},
    "sigkill": {"rank": 2, "signal": 9, "signal_name": "SIGKILL"},
    # rank 3: MPI.COMM_WORLD.Abort(7)
    "abort": {"rank": 3, "exit_code": 7},
    "ssh_abort": {"rank": 3, "exit_code": 7},
    # the program script execs a missing program (sh: 127), or is missing itself (sh: 2)
    "notfound": {"rank": 0, "exit_code": 127},
    "noscript": {"rank": 0, "exit_code": 2},
    # not a rank's failure
    "hello": None,
    "hello_path": None,
    "ssh_hello": None,
    "sockets": None,
    "oversubscribed": None,
    "notexec": None,
    "ssh_lostnode": None,
    "ssh_partition": None,
}


@pytest.mark.parametrize("sample, expected", sorted(EXPECTED.items()))
def test_parse_real_stderr(sample, expected):
    assert openmpi5.parse_failure(_sample(sample)) == expected


def test_every_capture_is_tested_and_failed_as_it_says():
    results = _results()
    assert set(results) == set(EXPECTED)
    for name, verdict in EXPECTED.items():
        if verdict and "exit_code" in verdict:
            assert results[name] == verdict["exit_code"]
        if verdict and "signal" in verdict:
            assert results[name] == 128 + verdict["signal"]


def test_lost_daemon_is_only_in_stderr():
    # mpirun exits 0 when it loses a worker: stderr is the only evidence.
    results = _results()
    for name in EXPECTED:
        assert openmpi5.lost_daemon(_sample(name)) == name.startswith(("ssh_lostnode",
                                                                         "ssh_partition"))
    assert results["ssh_lostnode"] == results["ssh_partition"] == 0
    assert openmpi5.lost_daemon(None) is False


def test_oversubscription_is_refused():
    assert _results()["oversubscribed"] != 0
    assert "There are not enough slots available" in _sample("oversubscribed")


def test_forwarded_env_and_placement_facts():
    hello = (DATA / "hello.stdout").read_text()
    assert hello.count("local size 4 var forwarded") == 4
    ssh_hello = (DATA / "ssh_hello.stdout").read_text()
    assert ssh_hello.count("on om5cap-worker var True") == 2


def test_only_hnp_takes_every_oob_port_and_ranks_listen_in_btl_range():
    ports = {int(line.split()[3].rsplit(":", 1)[1])
             for line in (DATA / "sockets.stdout").read_text().splitlines()
             if not line.split()[3].startswith("127.0.0.1:")}
    # prterun binds every port of the OOB range; four ranks one BTL port each (v4, v6).
    assert ports == set(range(20100, 20200)) | set(range(20200, 20204))


def test_parse_crlf_and_none_input():
    assert openmpi5.parse_failure(_sample("exit3").replace("\n", "\r\n")) == {
        "rank": 1, "exit_code": 3}
    assert openmpi5.parse_failure(b"bytes") is None
    assert openmpi5.parse_failure(None) is None


def test_parse_last_message_wins_over_program_output():
    forged = _sample("segv").replace("rank 1 with", "rank 0 with").replace("signal 11", "signal 6")
    assert openmpi5.parse_failure(forged + _sample("exit3os")) == {"rank": 1, "exit_code": 3}
    assert openmpi5.parse_failure(_sample("exit3os") + forged) == {
        "rank": 0, "signal": 6, "signal_name": "SIGABRT"}


def test_abort_rank_is_the_world_rank_and_needs_the_ranks_message():
    text = _sample("abort").replace("invoked on rank 3 in communicator MPI_COMM_WORLD",
                                    "invoked on rank 0 in communicator MPI_COMM_SELF")
    assert openmpi5.parse_failure(text) == {"rank": 3, "exit_code": 7}
    # prterun's word alone carries no code; an earlier rank's verdict stands.
    prterun_only = _sample("exit3os") + ("prterun has exited due to process rank 3 with PID 0 "
                                         "on node n calling\n\"abort\".\n")
    assert openmpi5.parse_failure(prterun_only) == {"rank": 1, "exit_code": 3}


def test_parse_never_raises_on_what_a_job_can_write():
    huge_rank = ("prterun noticed that process rank " + "9" * 5000 + " with PID 12 on node n "
                 "exited on signal 11 (Segmentation fault).\n")
    assert openmpi5.parse_failure(huge_rank) is None
    unicode_digits = _sample("exit3").replace("Exit code:    3", "Exit code:    \u0663")
    assert openmpi5.parse_failure(unicode_digits) is None
    odd = "prterun noticed that process rank 1 with PID 12 on node n exited on\nsignal 99.\n"
    assert openmpi5.parse_failure(odd) == {"rank": 1, "signal": 99, "signal_name": "SIG99"}


@settings(max_examples=300, deadline=None, database=None)
@given(st.lists(st.one_of(
    st.text(max_size=200),
    st.sampled_from([_sample(n) for n in sorted(EXPECTED)]),
    st.builds(lambda rank, sig: f"prterun noticed that process rank {rank} with PID 1 on node "
              f"n exited on\nsignal {sig} (x).", st.text(max_size=30), st.text(max_size=30)),
    st.builds(lambda rank, code: "Process name: [prterun-h-1@1," + rank + "]\nExit code: " + code,
              st.text(alphabet="0123456789\u0663,", max_size=6000), st.text(max_size=40)),
    st.builds(lambda rank, code: "MPI_ABORT was invoked on rank 0 in communicator C\n  Proc: "
              "[[1,1]," + rank + "]\n  Errorcode: " + code + "\nprterun has exited due to "
              "process rank " + rank + " with PID 0 on node n calling\n\"abort\".",
              st.text(alphabet="0123456789-", max_size=20), st.text(max_size=20)),
), max_size=6))
def test_parse_never_raises_and_returns_a_well_formed_verdict(pieces):
    found = openmpi5.parse_failure("\n".join(pieces))
    assert found is None or (isinstance(found["rank"], int) and 0 <= found["rank"] < 10**9)
    if found and "signal" in found:
        assert isinstance(found["signal_name"], str) and len(found["signal_name"]) <= 40
    if found and "exit_code" in found:
        assert isinstance(found["exit_code"], int)
    assert isinstance(openmpi5.lost_daemon("\n".join(pieces)), bool)
