"""
Unit tests for :mod:`dmpi.launch.intelmpi`: the hostfile, Intel MPI's mpirun command line
and environment, and the failure parser it shares with MPICH's Hydra.

The samples under ``data/intelmpi/`` are real output of Intel MPI 2021.18.1 (PyPI wheel
``impi-rt``, Intel's Hydra, libfabric's tcp provider) run with this module's argv and
environment (``data/intelmpi/capture.sh``): four ranks in one container, and over ssh
from a launcher container (one slot) to a worker (three slots) with the job's ssh.
``results.tsv`` there holds mpirun's exit codes ("timeout": killed 60 s after the cut).
"""

import pathlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dmpi.contract import AGENT_SSH
from dmpi.launch import flavours, intelmpi, mpich, ssh

DATA = pathlib.Path(__file__).resolve().parent / "data" / "intelmpi"

CIDR = "10.197.1.0/24"
OOB = "20100-20199"
BTL = (20200, 20999)
SSH_PORT = 20022


def _output(name):
    """mpirun's standard error followed by its standard output, as parse_failure reads."""
    return (DATA / f"{name}.stderr").read_text() + (DATA / f"{name}.stdout").read_text()


def _results():
    rows = (line.split("\t") for line in (DATA / "results.tsv").read_text().splitlines())
    return {name: code for name, code, _seconds in rows}


def _argv(**kwargs):
    args = {"np": 4, "cluster_cidr": CIDR, "oob_ports": OOB, "btl_ports": BTL,
            "ssh_port": SSH_PORT, "workdir": "/data/jobs/42"}
    args.update(kwargs)
    return intelmpi.mpi_argv(**args)


def _genv(argv):
    return {argv[i + 1]: argv[i + 2] for i, arg in enumerate(argv) if arg == "-genv"}


# ------------------------------------------------------------------------- hostfile


def test_hostfile_is_hydras_address_colon_slots():
    placement = [("10.197.1.12", 4), ("10.197.1.11", 2)]
    assert intelmpi.hostfile_text(placement) == mpich.hostfile_text(placement) == (
        "10.197.1.12:4\n10.197.1.11:2\n")


@pytest.mark.parametrize("placement", [[], [("node1", 2)], [("10.197.1.11", 0)],
                                       [("10.197.1.11", 2), ("10.197.1.11", 1)]])
def test_hostfile_rejects(placement):
    with pytest.raises(ValueError):
        intelmpi.hostfile_text(placement)


# ------------------------------------------------------------------------- mpirun argv


def test_mpirun_argv_exactly():
    assert _argv(env_names=["OMP_NUM_THREADS", "MY_VAR"]) == [
        "mpirun", "-launcher", "ssh", "-launcher-exec", AGENT_SSH,
        # Not -f: Intel's Hydra ignores its :N and spreads the ranks evenly.
        "-machinefile", "/run/dockermpi/hostfile", "-n", "4", "-wdir", "/data/jobs/42",
        "-print-all-exitcodes",
        "-genvlist", "OMP_NUM_THREADS,MY_VAR",
        "-genv", "I_MPI_FABRICS", "shm:ofi",
        "-genv", "I_MPI_OFI_PROVIDER", "tcp",
        "-genv", "FI_PROVIDER", "tcp",
        "-genv", "I_MPI_PIN", "0",
        "/bin/sh", "/run/dockermpi/program",
    ]


def test_no_names_forward_no_environment():
    argv = _argv()
    assert "-genvnone" in argv and "-genvlist" not in argv
    assert "-genvlist" in _argv(env_names=["A"]) and "-genvnone" not in _argv(env_names=["A"])


def test_no_mpich_only_options():
    # Intel's mpiexec crashes on -configfile /dev/null; -f would ignore the slot counts.
    argv = _argv()
    assert "-configfile" not in argv and "-f" not in argv
    assert not any(arg.startswith(("UCX_", "MPIR_CVAR_")) for arg in argv)


def test_run_dir_keepalive_and_launcher():
    argv = _argv(run_dir="/run/job7", keepalive=(5, 2, 4), launcher="/opt/venv/bin/mpirun")
    assert argv[0] == "/opt/venv/bin/mpirun"
    assert argv[argv.index("-machinefile") + 1] == "/run/job7/hostfile"
    assert argv[-2:] == ["/bin/sh", "/run/job7/program"]
    # libfabric's tcp provider takes no keepalive: the settings do not change with it.
    assert _genv(argv) == dict(intelmpi.rank_settings(CIDR, BTL)) == dict(
        intelmpi.rank_settings(CIDR, "20200-20999", (5, 2, 4)))


def test_the_program_never_reaches_mpirun_argv():
    # Hydra reads ':' as a new executable: nothing of the user's may be in its argv.
    argv = _argv(env_names=["A"])
    assert ":" not in argv and argv[-2:] == ["/bin/sh", "/run/dockermpi/program"]


@pytest.mark.parametrize(
    "kwargs, named",
    [
        ({"np": 0}, "0"), ({"np": "4"}, "'4'"), ({"np": True}, "True"),
        ({"cluster_cidr": "eth0"}, "'eth0'"),
        ({"cluster_cidr": "10.197.1.5/24"}, "'10.197.1.5/24'"),
        ({"cluster_cidr": "fd00::/64"}, "'fd00::/64'"),
        ({"oob_ports": "20100"}, "'20100'"),
        ({"oob_ports": (20199, 20100)}, "20199 > 20100"),
        ({"btl_ports": (20150, 20300)}, "20150-20300"),
        ({"btl_ports": (20300, 70000)}, "70000"),
        ({"ssh_port": 20150}, "20150"),
        ({"ssh_port": 22}, "22"),
        ({"workdir": "data/x"}, "'data/x'"),
        ({"workdir": "/data/my dir"}, "'/data/my dir'"),
        ({"env_names": ["OK", "A=B"]}, "'A=B'"),
        ({"env_names": ["1X"]}, "'1X'"),
        ({"run_dir": "run/job"}, "'run/job'"),
        ({"launcher": "bin/mpirun"}, "'bin/mpirun'"),
        ({"keepalive": (0, 1, 3)}, "(0, 1, 3)"),
        ({"keepalive": "2,1,3"}, "'2,1,3'"),
    ],
)
def test_bad_inputs_raise_naming_the_value(kwargs, named):
    with pytest.raises(ValueError) as raised:
        _argv(**kwargs)
    assert named in str(raised.value)


def test_env_names_as_one_string_is_refused():
    with pytest.raises(ValueError, match="not a string"):
        _argv(env_names="PATH")


# --------------------------------------------------------------- launcher environment


def test_launcher_environment_gives_ssh_exactly_the_jobs_options():
    env = intelmpi.launcher_environment(OOB, SSH_PORT)
    assert env == {
        "I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS": " ".join(ssh.ssh_args(SSH_PORT)),
        "I_MPI_HYDRA_BRANCH_COUNT": "-1",
    }
    # Hydra splits the value on spaces: it must give back ssh_args' list.
    assert env["I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS"].split(" ") == ssh.ssh_args(SSH_PORT)
    assert intelmpi.launcher_environment((20100, 20199), SSH_PORT, "/run/job")[
        "I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS"].split(" ") == ssh.ssh_args(SSH_PORT, "/run/job")
    assert flavours.launcher_environment(intelmpi, OOB, SSH_PORT) == env


@pytest.mark.parametrize(
    "kwargs, named",
    [
        ({"oob_ports": "20100"}, "'20100'"),
        ({"oob_ports": (20199, 20100)}, "20199 > 20100"),
        ({"ssh_port": 20150}, "20150"),
        ({"ssh_port": 80}, "80"),
        ({"run_dir": "run"}, "'run'"),
    ],
)
def test_launcher_environment_rejects_naming_the_value(kwargs, named):
    args = {"oob_ports": OOB, "ssh_port": SSH_PORT}
    args.update(kwargs)
    with pytest.raises(ValueError) as raised:
        intelmpi.launcher_environment(**args)
    assert named in str(raised.value)


def test_the_launcher_script_names_the_interface_first():
    argv = flavours.launcher_argv(intelmpi, "/data/o", "/data/e", 4, CIDR, OOB, BTL,
                                  SSH_PORT, "/data/jobs/42")
    assert argv[:3] == ["/bin/sh", "-c", intelmpi.LAUNCHER_PRELUDE + flavours.LAUNCHER_SCRIPT]
    assert argv[6:] == _argv(workdir="/data/jobs/42")


# ------------------------------------------------------------- what the capture showed

EXPECTED = {
    # rank 1 os._exit(3): Hydra kills the others (SIGKILL); its statuses say who
    "exit3": {"rank": 1, "exit_code": 3},
    "ssh_exit3": {"rank": 3, "exit_code": 3},
    # rank 1 (2 on the worker) sends itself SIGSEGV; the others are killed
    "segv": {"rank": 1, "signal": 11, "signal_name": "SIGSEGV"},
    "ssh_segv": {"rank": 2, "signal": 11, "signal_name": "SIGSEGV"},
    # rank 3 MPI_Abort(7): its message, and its node's ranks all exiting with 7
    "abort": {"rank": 3, "exit_code": 7},
    "ssh_abort": {"rank": 3, "exit_code": 7},
    # the program script execs a missing program (sh: 127), or is missing itself (sh: 2)
    "notfound": {"rank": 0, "exit_code": 127},
    "noscript": {"rank": 0, "exit_code": 2},
    # rank 2 kills itself with SIGKILL: every rank shows SIGKILL, the cause is unknowable
    "sigkill": None,
    # not a rank's failure
    "hello": None,
    "hello_path": None,
    "ssh_hello": None,
    "ssh_noiface": None,
    "ssh_lostnode": None,
    "ssh_partition": None,
}


def test_every_capture_ran_to_the_exit_code_it_did():
    # Intel's mpirun exits 255 for a rank's exit or signal, the code for an MPI_Abort,
    # the one status every rank shares (notfound, noscript).
    assert _results() == {
        "hello": "0", "hello_path": "0", "exit3": "255", "sigkill": "255", "segv": "255",
        "abort": "7", "notfound": "127", "noscript": "2",
        "ssh_hello": "0", "ssh_noiface": "255", "ssh_exit3": "255", "ssh_segv": "255",
        "ssh_abort": "7", "ssh_lostnode": "255", "ssh_partition": "timeout"}
    assert set(_results()) == set(EXPECTED)


@pytest.mark.parametrize("sample, expected", sorted(EXPECTED.items()))
def test_parse_real_output(sample, expected):
    assert intelmpi.parse_failure(_output(sample)) == expected
    # The node does not know the job's flavour: every flavour's parser reads it.
    assert flavours.parse_failure(_output(sample)) == expected


def test_parse_reads_each_stream_alone_as_far_as_it_goes():
    abort = (DATA / "abort.stderr").read_text()
    assert intelmpi.parse_failure(abort) == {"rank": 3, "exit_code": 7}
    # Without the message, the statuses alone say every rank exited with 7.
    assert intelmpi.parse_failure((DATA / "abort.stdout").read_text()) == {
        "rank": 0, "exit_code": 7}
    assert intelmpi.parse_failure((DATA / "ssh_exit3.stdout").read_text()) == {
        "rank": 3, "exit_code": 3}
    # The lost node's words are on stderr: stdout alone blames its lone killed rank.
    assert intelmpi.parse_failure((DATA / "ssh_lostnode.stdout").read_text()) == {
        "rank": 0, "signal": 9, "signal_name": "SIGKILL"}


def test_multi_proxy_exit_codes_block():
    # One line per proxy, "[address:0]", in hostfile order; ranks counted on through them.
    stdout = (DATA / "ssh_exit3.stdout").read_text()
    assert stdout.endswith("] Exit codes: [10.231.9.11:0] 9\n[10.231.9.12:0] 9,9,768\n")
    assert "RANK 3 " not in stdout  # a rank that exited non-zero gets no banner
    assert (DATA / "ssh_hello.stdout").read_text().endswith(
        "] Exit codes: [10.231.9.11:0] 0\n[10.231.9.12:0] 0,0,0\n")


def test_ranks_placed_per_machinefile_slots_and_environment_forwarded():
    hello = (DATA / "hello.stdout").read_text()
    for rank in range(4):
        assert (f"rank {rank} of 4 sum 6 PMI_RANK {rank} MPI_LOCALNRANKS 4 var forwarded "
                "extra_args inherited") in hello
    # 1 + 3 slots (an even spread would be 2 + 2), the worker reached over ssh.
    ssh_hello = (DATA / "ssh_hello.stdout").read_text()
    assert "rank 0 on 10.231.9.11 PMI_RANK 0 MPI_LOCALNRANKS 1 var True" in ssh_hello
    for rank in (1, 2, 3):
        assert f"rank {rank} on 10.231.9.12 PMI_RANK {rank} MPI_LOCALNRANKS 3 var True" \
            in ssh_hello
    # Ranks started over ssh get sshd's PATH, not the image's.
    assert "rank 1 PATH=/usr/local/bin:/usr/bin:/bin:/usr/games" in ssh_hello


def test_ports_as_the_capture_saw_them():
    # mpiexec's control port and every rank's listener are the kernel's (ephemeral), none
    # in the job's OOB or BTL range, where Intel MPI's listeners draw ports at random.
    for name, prefix in (("hello", "listen "), ("ssh_hello", "rank ")):
        ports = [int(line.split()[-2].rsplit(":", 1)[1])
                 for line in (DATA / f"{name}.stdout").read_text().splitlines()
                 if line.startswith(prefix) and " LISTEN " in line
                 and not line.split()[-2].startswith(("127.0.0.11:", "0.0.0.0:20022",
                                                      "[::]:20022"))]
        assert len(ports) == 5 and len(set(ports)) == 5, ports
        assert all(32768 <= p <= 60999 for p in ports), ports


def test_without_the_interface_the_worker_dials_itself():
    # Every container of a job has the same host name: without I_MPI_HYDRA_IFACE the
    # worker's bootstrap proxy connects to its own address, and mpirun fails.
    stderr = (DATA / "ssh_noiface.stderr").read_text()
    assert "Error setting up the bootstrap proxies" in stderr
    assert 'unable to connect from "impicap-node" to "impicap-node"' in stderr
    assert _results()["ssh_noiface"] == "255"


def test_lost_node_and_partition():
    lost = (DATA / "ssh_lostnode.stderr").read_text()
    assert "Error: Downstream from host 10.231.9.12 exited abnormally" in lost
    # mpiexec does not notice a partition: no word, killed 60 s after the cut.
    assert _output("ssh_partition").count("ready") == 4
    assert "Exit codes" not in _output("ssh_partition")
    assert flavours.lost_daemon(lost) is None


# ---------------------------------------------------------------------- failure parse


def test_parse_crlf_and_none_input():
    assert intelmpi.parse_failure(_output("ssh_segv").replace("\n", "\r\n")) == {
        "rank": 2, "signal": 11, "signal_name": "SIGSEGV"}
    assert intelmpi.parse_failure(b"bytes") is None
    assert intelmpi.parse_failure(None) is None


def test_parse_last_message_wins_over_program_output():
    forged = ("[mpiexec@x] Exit codes: [10.0.0.1:0] 0,2560\n"
              "application called MPI_Abort(MPI_COMM_WORLD, 99) - process 0\n"
              "=   RANK 0 PID 1 RUNNING AT 10.0.0.1\n=   KILLED BY SIGNAL: 6 (Aborted)\n"
              "[mpiexec@x] Error: Downstream from host 10.0.0.2 exited abnormally\n")
    for name in ("exit3", "ssh_exit3", "segv", "ssh_segv", "abort", "ssh_abort"):
        stderr = (DATA / f"{name}.stderr").read_text()
        stdout = (DATA / f"{name}.stdout").read_text()
        # printed by a rank on either stream, before Hydra's own words
        assert intelmpi.parse_failure(forged + stderr + stdout) == EXPECTED[name]
        assert intelmpi.parse_failure(stderr + forged + stdout) == EXPECTED[name]
    # The real last word is a success: nothing earlier may turn it into a failure.
    assert intelmpi.parse_failure(forged + _output("ssh_hello")) is None
    assert intelmpi.parse_failure(forged + _output("hello")) is None


def test_an_abort_needs_statuses_that_show_it():
    # The message names rank 3, code 7; statuses where rank 3 did not exit with 7 are
    # read for themselves.
    text = (DATA / "ssh_abort.stderr").read_text()
    assert intelmpi.parse_failure(text + "[m] Exit codes: [a:0] 9\n[b:0] 1792,1792,9\n") \
        == {"rank": 1, "exit_code": 7}
    assert intelmpi.parse_failure(text + "[m] Exit codes: [a:0] 9\n[b:0] 9,11,9\n") \
        == {"rank": 2, "signal": 11, "signal_name": "SIGSEGV"}
    # A rank's own MPI_Abort with a negative code: an exit keeps its low 8 bits.
    negative = ("application called MPI_Abort(MPI_COMM_WORLD, -1) - process 1\n"
                "[m] Exit codes: [a:0] 9,65280\n")
    assert intelmpi.parse_failure(negative) == {"rank": 1, "exit_code": -1}


def test_a_lost_node_pins_no_sigkill_but_a_real_failure_stands():
    lost = "[mpiexec@n] Error: Downstream from host 10.0.0.2 exited abnormally\n"
    assert intelmpi.parse_failure(lost + "[mpiexec@n] Exit codes: [10.0.0.1:0] 9\n") is None
    assert intelmpi.parse_failure(lost + "[mpiexec@n] Exit codes: [10.0.0.1:0] 9,11\n") == {
        "rank": 1, "signal": 11, "signal_name": "SIGSEGV"}
    assert intelmpi.parse_failure("[mpiexec@n] Exit codes: [10.0.0.1:0] 9\n") == {
        "rank": 0, "signal": 9, "signal_name": "SIGKILL"}


#: A first capture's exit3, with the listeners' ports in a range: MPI_Init itself failed
#: in rank 0 (two listeners drew the same port); mpirun exited 143.
INIT_FAILED = (
    "Abort(69354639) on node 0 (rank 0 in comm 0): Fatal error in internal_Init_thread: "
    "Other MPI error, error stack:\n"
    "internal_Init_thread(43701)..: MPI_Init_thread(argc=(nil), argv=(nil), required=3, "
    "provided=0x7ffc75c6d2d0) failed\n"
    "MPII_Init_thread(118)........: \nMPID_Init(1778)..............: \n"
    "MPIDI_OFI_mpi_init_hook(1739): \ncreate_vni_context(2379).....: OFI EP enable failed "
    "(ofi_init.c:2379:create_vni_context:Address already in use)\n"
    "[mpiexec@07e9091c5762] Exit codes: [172.17.0.2:0] 574918400,574918400,574918400,"
    "574918400\n")


def test_an_mpi_init_failure_is_pinned_on_no_rank():
    # Hydra prints the abort code shifted into 32 bits: no wait status, no verdict.
    assert intelmpi.parse_failure(INIT_FAILED) is None
    assert flavours.parse_failure(INIT_FAILED) is None


def test_banners_alone_name_the_rank():
    banners = "".join(line for line in _output("ssh_segv").splitlines(keepends=True)
                      if "Exit codes" not in line and not line.startswith("[10."))
    assert intelmpi.parse_failure(banners) == {"rank": 2, "signal": 11,
                                                "signal_name": "SIGSEGV"}
    assert intelmpi.parse_failure(banners.replace("SIGNAL: 11", "SIGNAL: 9")) is None


def test_parse_never_raises_on_what_a_job_can_write():
    huge = "application called MPI_Abort(MPI_COMM_WORLD, 1) - process " + "9" * 5000 + "\n"
    assert intelmpi.parse_failure(huge) is None
    # A status line that is not Hydra's: the abort's own message stands.
    assert intelmpi.parse_failure(
        "application called MPI_Abort(W, 7) - process 1\n[m] Exit codes: [h:0] 9,"
        + "1792," * 3 + "9" * 5000 + "\n") == {"rank": 1, "exit_code": 7}
    assert intelmpi.parse_failure("application called MPI_Abort(W, 1) - process \u0663\n") \
        is None
    assert intelmpi.parse_failure("[m] Exit codes: [h:0] 0,\u0663\n") is None
    assert intelmpi.parse_failure("[m] Exit codes: [h:0] 0,99999999999\n") is None
    assert intelmpi.parse_failure("=   RANK \u0663 PID 1 RUNNING AT h\n"
                                  "=   KILLED BY SIGNAL: 11 (x)\n") is None
    assert intelmpi.parse_failure("=   RANK " + "9" * 5000 + " PID 1 RUNNING AT h\n"
                                  "=   KILLED BY SIGNAL: 11 (x)\n") is None
    assert intelmpi.parse_failure("=   RANK 999999999 PID 1 RUNNING AT h\n"
                                  "=   KILLED BY SIGNAL: 11 (x)\n") is None
    many = "[m] Exit codes: [h:0] 0," + "0," * 100000 + "768\n"
    assert intelmpi.parse_failure(many) == {"rank": 100001, "exit_code": 3}
    aborts = "application called MPI_Abort(W, 5) - process 2\n" * 20000
    assert intelmpi.parse_failure(aborts + "[m] Exit codes: [h:0] " + "9," * 50000
                                  + "1280\n") == {"rank": 50000, "exit_code": 5}


@settings(max_examples=300, deadline=None, database=None)
@given(st.lists(st.one_of(
    st.text(max_size=200),
    st.sampled_from([_output(n) for n in sorted(EXPECTED)]),
    st.builds(lambda code, rank: f"application called MPI_Abort(W, {code}) - process {rank}\n",
              st.text(alphabet="-0123456789\u0663", max_size=12),
              st.text(alphabet="0123456789\u0663", max_size=3000)),
    st.builds(lambda host, codes: f"[mpiexec@x] Exit codes: [{host}:0] {codes}\n",
              st.text(max_size=20), st.text(alphabet="0123456789,\u0663\n[]: ", max_size=3000)),
    st.builds(lambda rank, sig: f"=   RANK {rank} PID 1 RUNNING AT h\n=   KILLED BY SIGNAL: "
              f"{sig} (x)\n", st.text(alphabet="0123456789\u0663", max_size=30),
              st.text(alphabet="0123456789\u0663", max_size=6)),
    st.just("[mpiexec@n] Error: Downstream from host 10.0.0.2 exited abnormally\n"),
), max_size=6))
def test_parse_never_raises_and_returns_a_well_formed_verdict(pieces):
    for parse in (intelmpi.parse_failure, flavours.parse_failure):
        found = parse("".join(pieces))
        assert found is None or (isinstance(found.get("rank"), int)
                                 and 0 <= found["rank"] < 10**9) \
            or isinstance(found.get("host"), str)
        if found and "signal" in found:
            assert 0 < found["signal"] < 128 and isinstance(found["signal_name"], str)
        elif found:
            assert isinstance(found["exit_code"], int)
