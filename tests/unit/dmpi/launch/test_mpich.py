"""
Unit tests for :mod:`dmpi.launch.mpich`: the Hydra hostfile, mpiexec's command line and
environment, and the failure parser.

The samples under ``data/mpich/`` are real output of Debian 12's MPICH 4.0.2 (ch4:ucx,
Hydra) run with the argv of :func:`dmpi.launch.mpich.mpi_argv` and the environment
of :func:`dmpi.launch.mpich.launcher_environment`, four ranks in one container
(``data/mpich/capture.sh``): Hydra forks the proxy of its own address, so the ssh
launch itself is not exercised by them.
"""

import pathlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dmpi.contract import AGENT_SSH
from dmpi.launch import flavours, mpich, openmpi, ssh

DATA = pathlib.Path(__file__).resolve().parent / "data" / "mpich"

CIDR = "10.197.1.0/24"
OOB = "20100-20199"
BTL = (20200, 20999)
SSH_PORT = 20022


def _output(name):
    """mpiexec's standard error followed by its standard output, as parse_failure reads."""
    return (DATA / f"{name}.stderr").read_text() + (DATA / f"{name}.stdout").read_text()


def _results():
    rows = (line.split("\t") for line in (DATA / "results.tsv").read_text().splitlines())
    return {name: code for name, code, _seconds in rows}


# ------------------------------------------------------------------------- hostfile


def test_hostfile_is_address_colon_slots_in_placement_order():
    text = mpich.hostfile_text([("10.197.1.12", 4), ("10.197.1.11", 2)])
    assert text == "10.197.1.12:4\n10.197.1.11:2\n"


@pytest.mark.parametrize(
    "placement, message",
    [
        ([], "non-empty"),
        ("10.197.1.11:2", "non-empty list"),
        ([("node1", 2)], "IPv4"),
        ([("10.197.1.11", 0)], "positive"),
        ([("10.197.1.11", True)], "positive"),
        ([("10.197.1.11", "2")], "positive"),
        ([("10.197.1.11", 2), ("10.197.1.11", 1)], "twice"),
        ([("10.197.1.11",)], r"\(address, slots\)"),
    ],
)
def test_hostfile_rejects_as_open_mpi_does(placement, message):
    with pytest.raises(ValueError, match=message):
        mpich.hostfile_text(placement)
    with pytest.raises(ValueError, match=message):
        openmpi.hostfile_text(placement)


# ------------------------------------------------------------------------- launcher


def _argv(**kwargs):
    args = {"np": 4, "cluster_cidr": CIDR, "oob_ports": OOB, "btl_ports": BTL,
            "ssh_port": SSH_PORT, "workdir": "/data/jobs/42"}
    args.update(kwargs)
    return mpich.mpi_argv(**args)


def test_mpiexec_argv_exactly():
    assert _argv(env_names=["OMP_NUM_THREADS", "MY_VAR"]) == [
        "mpiexec", "-configfile", "/dev/null",
        "-launcher", "ssh", "-launcher-exec", AGENT_SSH,
        "-f", "/run/dockermpi/hostfile", "-n", "4", "-wdir", "/data/jobs/42",
        "-print-all-exitcodes",
        "-genvlist", "OMP_NUM_THREADS,MY_VAR",
        "-genv", "UCX_TLS", "self,sysv,posix,tcp",
        "-genv", "UCX_TCP_PORT_RANGE", "20200-20999",
        "-genv", "UCX_TCP_KEEPIDLE", "2s",
        "-genv", "UCX_TCP_KEEPINTVL", "1s",
        "-genv", "UCX_TCP_KEEPCNT", "3",
        "-genv", "MPIR_CVAR_CH3_PORT_RANGE", "20200:20999",
        "/bin/sh", "/run/dockermpi/program",
    ]


def test_no_names_forward_no_environment():
    argv = _argv()
    assert "-genvnone" in argv and "-genvlist" not in argv


def test_custom_run_dir_keepalive_and_launcher():
    argv = _argv(run_dir="/run/job", keepalive=(5, 2, 4), launcher="/opt/mpich/bin/mpiexec")
    assert argv[0] == "/opt/mpich/bin/mpiexec"
    assert argv[argv.index("-f") + 1] == "/run/job/hostfile"
    assert argv[-2:] == ["/bin/sh", "/run/job/program"]
    settings_ = dict(mpich.rank_settings(CIDR, BTL, (5, 2, 4)))
    assert (settings_["UCX_TCP_KEEPIDLE"], settings_["UCX_TCP_KEEPINTVL"],
            settings_["UCX_TCP_KEEPCNT"]) == ("5s", "2s", "4")
    for name, value in settings_.items():
        assert argv[argv.index(name) - 1:argv.index(name) + 2] == ["-genv", name, value]


def test_launcher_environment_gives_ssh_exactly_the_jobs_options():
    env = mpich.launcher_environment(OOB, SSH_PORT)
    assert env == {
        "HYDRA_LAUNCHER_EXTRA_ARGS": " ".join(ssh.ssh_args(SSH_PORT)),
        "MPIR_CVAR_CH3_PORT_RANGE": "20100:20199",
    }
    # Hydra splits the value on single spaces: it must give back ssh_args' list.
    assert env["HYDRA_LAUNCHER_EXTRA_ARGS"].split(" ") == ssh.ssh_args(SSH_PORT)
    assert mpich.launcher_environment((20100, 20199), SSH_PORT, "/run/job")[
        "HYDRA_LAUNCHER_EXTRA_ARGS"].split(" ") == ssh.ssh_args(SSH_PORT, "/run/job")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"oob_ports": "20100"}, "LOW-HIGH"),
        ({"oob_ports": (20199, 20100)}, "empty"),
        ({"ssh_port": 20150}, "inside"),
        ({"ssh_port": 80}, "between 1024"),
        ({"run_dir": "run"}, "absolute"),
    ],
)
def test_launcher_environment_rejects(kwargs, message):
    args = {"oob_ports": OOB, "ssh_port": SSH_PORT}
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        mpich.launcher_environment(**args)


def test_the_program_never_reaches_mpiexec_argv():
    argv = _argv(env_names=["A"])
    # Hydra reads ':' as a new executable: nothing of the user's may be in its argv.
    assert ":" not in argv
    assert argv[-2:] == ["/bin/sh", "/run/dockermpi/program"]


# ------------------------------------------------------------- what the capture showed


def test_the_capture_ran_the_cases_to_their_exit_codes():
    assert _results() == {"hello": "0", "hello_path": "0", "exit3": "9", "sigkill": "9",
                          "segv": "11", "abort": "7", "notfound": "127",
                          "oversubscribed": "0", "noscript": "2", "notexec": "255"}


def test_ports_and_environment_as_the_capture_saw_them():
    hello = (DATA / "hello.stdout").read_text()
    # mpiexec's control port and the ranks' UCX listeners, all inside their ranges.
    ports = [int(line.split()[3].rsplit(":", 1)[1]) for line in hello.splitlines()
             if line.startswith("LISTEN")]
    assert 20100 in ports and all(20100 <= p <= 20199 or 20200 <= p <= 20999 for p in ports)
    # -genvlist forwarded the named variable; a rank forked on the launcher's node also
    # inherits mpiexec's own environment (the module's description says so).
    assert hello.count("var forwarded extra_args inherited") == 4
    # The $HOME/.mpiexec.hydra.conf asked for -prepend-rank; -configfile kept it out.
    assert "[0] rank" not in hello and "rank 0 of 4" in hello


def test_hydra_oversubscribes_rather_than_refusing():
    assert (DATA / "oversubscribed.stdout").read_text().count(" of 5 ") == 5


# ---------------------------------------------------------------------- failure parse


@pytest.mark.parametrize(
    "sample, expected",
    [
        # rank 1 exit(3) after MPI_Init: Hydra kills the others; its statuses say who
        ("exit3", {"rank": 1, "exit_code": 3}),
        # rank 1 writes to NULL; the others are killed with SIGKILL
        ("segv", {"rank": 1, "signal": 11, "signal_name": "SIGSEGV"}),
        # rank 3 MPI_Abort(MPI_COMM_WORLD, 7): its message (stderr), no exit codes
        ("abort", {"rank": 3, "exit_code": 7}),
        # the program script execs a program that is not there: every rank's sh exits 127
        ("notfound", {"rank": 0, "exit_code": 127}),
        ("noscript", {"rank": 0, "exit_code": 2}),
        # rank 2 raise(SIGKILL): ranks 0 and 2 both show SIGKILL, the cause is unknowable
        ("sigkill", None),
        ("hello", None),
        ("hello_path", None),
        ("oversubscribed", None),
    ],
)
def test_parse_real_mpiexec_output(sample, expected):
    assert mpich.parse_failure(_output(sample)) == expected


def test_parse_reads_each_stream_alone_as_far_as_it_goes():
    assert mpich.parse_failure((DATA / "abort.stderr").read_text()) == {"rank": 3, "exit_code": 7}
    assert mpich.parse_failure((DATA / "exit3.stderr").read_text()) is None
    assert mpich.parse_failure((DATA / "exit3.stdout").read_text()) == {"rank": 1, "exit_code": 3}


def test_parse_crlf():
    assert mpich.parse_failure(_output("segv").replace("\n", "\r\n")) == {
        "rank": 1, "signal": 11, "signal_name": "SIGSEGV"}


def test_ranks_count_on_through_later_proxies():
    text = ("[mpiexec@n1] Exit codes: [10.0.0.1] 0,0\n[10.0.0.2] 0,9,11\n"
            "[10.0.0.3] 0\n")
    assert mpich.parse_failure(text) == {"rank": 4, "signal": 11, "signal_name": "SIGSEGV"}
    one_kill = "[mpiexec@n1] Exit codes: [10.0.0.1] 0,0\n[10.0.0.2] 0,9\n"
    assert mpich.parse_failure(one_kill) == {"rank": 3, "signal": 9, "signal_name": "SIGKILL"}


def test_parse_last_message_wins_over_program_output():
    forged_abort = ("application called MPI_Abort(MPI_COMM_WORLD, 99) - process 0\n"
                    "[mpiexec@x] Exit codes: [h] 0,2560\n")
    assert mpich.parse_failure(forged_abort + _output("exit3")) == {"rank": 1, "exit_code": 3}
    # The real last word is a success: nothing earlier may turn it into a failure.
    assert mpich.parse_failure(forged_abort + _output("hello")) is None


def test_parse_never_raises_on_what_a_job_can_write():
    assert mpich.parse_failure(b"bytes") is None and mpich.parse_failure(None) is None
    huge = "application called MPI_Abort(MPI_COMM_WORLD, 1) - process " + "9" * 5000 + "\n"
    assert mpich.parse_failure(huge) is None
    assert mpich.parse_failure("application called MPI_Abort(W, 1) - process \u0663\n") is None
    assert mpich.parse_failure("[m] Exit codes: [h] 0,\u0663\n") is None
    assert mpich.parse_failure("[m] Exit codes: [h] 0,99999999999\n") is None
    assert mpich.parse_failure("[m] Exit codes: [h] 0,70000\n") is None
    many = "[m] Exit codes: [h] 0," + "0," * 100000 + "768\n"
    assert mpich.parse_failure(many) == {"rank": 100001, "exit_code": 3}
    odd_signal = "[m] Exit codes: [h] 0,100\n"
    assert mpich.parse_failure(odd_signal) == {"rank": 1, "signal": 100, "signal_name": "SIG100"}


@settings(max_examples=300, deadline=None, database=None)
@given(st.lists(st.one_of(
    st.text(max_size=200),
    st.sampled_from([_output(n) for n in ("exit3", "segv", "abort", "sigkill", "hello")]),
    st.builds(lambda code, rank: f"application called MPI_Abort(W, {code}) - process {rank}",
              st.text(max_size=30), st.text(alphabet="0123456789\u0663", max_size=3000)),
    st.builds(lambda host, codes: f"[mpiexec@x] Exit codes: [{host}] {codes}\n",
              st.text(max_size=20), st.text(alphabet="0123456789,\u0663\n[] ", max_size=3000)),
), max_size=6))
def test_parse_never_raises_and_returns_a_well_formed_verdict(pieces):
    found = mpich.parse_failure("\n".join(pieces))
    assert found is None or (isinstance(found["rank"], int) and 0 <= found["rank"] < 10**9) \
        or isinstance(found["host"], str)
    if found and "signal" in found:
        assert 0 < found["signal"] < 128 and isinstance(found["signal_name"], str)
    elif found:
        assert isinstance(found["exit_code"], int)


#: A job of MPICH 5.0.2 (the PyPI wheel) on the test cluster, ranks 0-2 on 10.251.1.240-242
#: (one slot each), rank 1 killed by SIGSEGV while the others slept: the proxies broke
#: off before Hydra printed the ranks' exit statuses, and only its banner is left.
BROKE_OFF = pathlib.Path(__file__).resolve().parent / "data" / "mpich-5.0.2"
BROKE_OFF_PLACEMENT = [("10.251.1.240", 1), ("10.251.1.241", 1), ("10.251.1.242", 1)]


def test_the_banner_names_the_node_when_the_exit_statuses_never_came():
    text = "\n".join((BROKE_OFF / f"segv_proxies_broke_off.{stream}").read_text()
                     for stream in ("stderr", "stdout"))
    found = mpich.parse_failure(text)
    assert found == {"host": "10.251.1.241", "signal": 11, "signal_name": "SIGSEGV"}
    # The node finds the rank from the job's hostfile: the one rank at that address.
    hostfile = mpich.hostfile_text(BROKE_OFF_PLACEMENT)
    assert flavours.failed_rank_at(found, hostfile) == {
        "rank": 1, "signal": 11, "signal_name": "SIGSEGV"}
    # Two slots there: which of the two ranks died is unknown.
    two = mpich.hostfile_text([("10.251.1.240", 1), ("10.251.1.241", 2)])
    assert flavours.failed_rank_at(found, two) is None
    assert flavours.failed_rank_at(dict(found, placement="elsewhere"), two) == {
        "placement": "elsewhere"}
    assert flavours.failed_rank_at(found, "") is None


def test_exit_statuses_win_over_the_banner():
    banner = ("=   PID 40 RUNNING AT 10.0.0.9\n=   EXIT CODE: 139\n")
    assert mpich.parse_failure(banner + _output("exit3")) == {"rank": 1, "exit_code": 3}
    assert mpich.parse_failure("=   PID 40 RUNNING AT 10.0.0.9\n=   EXIT CODE: 3\n") == {
        "host": "10.0.0.9", "exit_code": 3}
    assert mpich.parse_failure("=   PID 4 RUNNING AT 10.0.0.9\n=   EXIT CODE: 99999\n") == {
        "host": "10.0.0.9", "exit_code": 99999}
    assert mpich.parse_failure("=   PID 4 RUNNING AT node1\n=   EXIT CODE: 139\n") is None
