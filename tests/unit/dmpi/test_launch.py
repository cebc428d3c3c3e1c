"""
Unit tests for :mod:`dmpi.launch`: the text and argv builders of a DockerMPI job.

The mpirun failure samples under ``data/mpirun/`` are real standard error captured from
Open MPI 4.1.4 (Debian bookworm's openmpi-bin, image ``dockermpi/mpi:dev``) running
``mpirun -np 4`` from a launcher container over ssh into two worker containers.
"""

import pathlib
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dmpi import launch

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


# ------------------------------------------------------------------------------ keys


def test_keypair_is_openssh_ed25519_and_matches():
    from cryptography.hazmat.primitives import serialization

    private, public = launch.generate_ed25519_keypair("job-42")
    assert private.startswith("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    assert private.endswith("-----END OPENSSH PRIVATE KEY-----\n")
    keytype, blob, comment = public.split(" ")
    assert (keytype, comment) == ("ssh-ed25519", "job-42")
    loaded = serialization.load_ssh_private_key(private.encode(), password=None)
    derived = loaded.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    ).decode()
    assert derived == f"{keytype} {blob}"


def test_keypairs_differ():
    assert launch.generate_ed25519_keypair()[0] != launch.generate_ed25519_keypair()[0]


@pytest.mark.parametrize("comment", ["", "two words", None])
def test_keypair_rejects_bad_comment(comment):
    with pytest.raises(ValueError, match="comment"):
        launch.generate_ed25519_keypair(comment)


# ---------------------------------------------------------------------- ssh config text


def test_sshd_config_for_unprivileged_sshd():
    text = launch.sshd_config_text(SSH_PORT, "guest")
    lines = text.splitlines()
    for expected in (
        "Port 20022",
        "HostKey /run/dockermpi/ssh_host_key",
        "HostCertificate /run/dockermpi/ssh_host_key-cert.pub",
        "TrustedUserCAKeys /run/dockermpi/user_ca.pub",
        "AuthorizedPrincipalsFile /run/dockermpi/principals",
        "AuthorizedKeysFile none",
        "AllowUsers guest",
        "UsePAM no",
        "PidFile none",
        "PasswordAuthentication no",
        "AllowTcpForwarding no",
        "KexAlgorithms curve25519-sha256,curve25519-sha256@libssh.org",
    ):
        assert expected in lines
    assert not any(line.startswith("ListenAddress") for line in lines)
    assert text.endswith("\n")


def test_sshd_config_listen_address():
    text = launch.sshd_config_text(SSH_PORT, "guest", listen_address="10.197.1.11")
    assert "ListenAddress 10.197.1.11" in text.splitlines()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"port": 22}, "between 1024 and 65535"),
        ({"port": 70000}, "between 1024 and 65535"),
        ({"port": "20022"}, "integer"),
        ({"port": True}, "integer"),
        ({"user": "Guest Name"}, "POSIX name"),
        ({"user": "a\nMatch all"}, "POSIX name"),
        ({"run_dir": "relative/dir"}, "absolute"),
        ({"listen_address": "node1"}, "IPv4"),
    ],
)
def test_sshd_config_rejects(kwargs, message):
    args = {"port": SSH_PORT, "user": "guest", **kwargs}
    with pytest.raises(ValueError, match=message):
        launch.sshd_config_text(**args)


def _ssh_keygen_list(tmp_path, cert_line):
    """What OpenSSH's own ssh-keygen reads in a certificate (``-L``)."""
    path = tmp_path / "key-cert.pub"
    path.write_text(cert_line + "\n")
    return subprocess.run(["ssh-keygen", "-L", "-f", str(path)], capture_output=True,
                          text=True, check=True).stdout


def test_host_certificate_is_read_by_ssh_keygen(tmp_path):
    ca_private, ca_public = launch.generate_ed25519_keypair("ca")
    _, host_public = launch.generate_ed25519_keypair("host")
    cert = launch.sign_ssh_certificate(ca_private, host_public, "host", "job-1@node1",
                                           ["10.197.1.130"], 1_800_000_000, 1_800_003_600)
    listed = _ssh_keygen_list(tmp_path, cert)
    assert "host certificate" in listed
    assert 'Key ID: "job-1@node1"' in listed
    assert "10.197.1.130" in listed.split("Principals:")[1].split("Critical")[0]
    assert "Extensions: (none)" in listed
    ca_fingerprint = subprocess.run(["ssh-keygen", "-l", "-f", "/dev/stdin"],
                                    input=ca_public, capture_output=True, text=True,
                                    check=True).stdout.split()[1]
    assert f"Signing CA: ED25519 {ca_fingerprint}" in listed
    facts = launch.read_ssh_certificate(cert)
    assert facts == {"kind": "host", "key_id": "job-1@node1", "principals": ["10.197.1.130"],
                     "valid_after": 1_800_000_000, "valid_before": 1_800_003_600,
                     "ca": " ".join(ca_public.split()[:2])}


def test_user_certificate_binds_principal_and_source_and_grants_nothing(tmp_path):
    ca_private, _ = launch.generate_ed25519_keypair("ca")
    _, user_public = launch.generate_ed25519_keypair("user")
    principal = launch.job_principal("20261202-101010-abcdef")
    cert = launch.sign_ssh_certificate(ca_private, user_public, "user", "job", [principal],
                                           1_800_000_000, 1_800_003_600,
                                           source_addresses=["10.197.1.130"])
    listed = _ssh_keygen_list(tmp_path, cert)
    assert "user certificate" in listed
    assert principal in listed
    assert "source-address 10.197.1.130/32" in listed
    assert "Extensions: (none)" in listed  # no pty, no forwarding, no rc
    assert launch.read_ssh_certificate(cert)["principals"] == [principal]


def test_read_certificate_refuses_a_forged_signature():
    ca_private, _ = launch.generate_ed25519_keypair("ca")
    _, host_public = launch.generate_ed25519_keypair("host")
    cert = launch.sign_ssh_certificate(ca_private, host_public, "host", "id",
                                           ["10.0.0.1"], 1, 2)
    keytype, blob, _ = cert.split()
    import base64
    raw = bytearray(base64.b64decode(blob))
    # Change the principal's last digit: the signature no longer covers the body.
    at = raw.index(b"10.0.0.1") + len(b"10.0.0.1") - 1
    raw[at] = ord("2")
    with pytest.raises(ValueError, match="does not verify"):
        launch.read_ssh_certificate(f"{keytype} {base64.b64encode(bytes(raw)).decode()}")


@pytest.mark.parametrize("line", ["", "ssh-ed25519 AAAA", "ssh-ed25519-cert-v01@openssh.com !!",
                                  "ssh-ed25519-cert-v01@openssh.com AAAAAAAA"])
def test_read_certificate_refuses_garbage(line):
    with pytest.raises(ValueError):
        launch.read_ssh_certificate(line)


@pytest.mark.parametrize("kwargs, message", [
    ({"kind": "both"}, "user or host"),
    ({"key_id": "two words"}, "key id"),
    ({"principals": "10.0.0.1"}, "principals"),
    ({"principals": ["a,b"]}, "principals"),
    ({"valid_after": 5, "valid_before": 5}, "validity"),
])
def test_sign_certificate_rejects(kwargs, message):
    ca_private, _ = launch.generate_ed25519_keypair("ca")
    _, public = launch.generate_ed25519_keypair("k")
    args = {"ca_private_text": ca_private, "public_line": public, "kind": "host",
            "key_id": "id", "principals": ["10.0.0.1"], "valid_after": 1, "valid_before": 2}
    with pytest.raises(ValueError, match=message):
        launch.sign_ssh_certificate(**dict(args, **kwargs))


def test_job_principal_names_the_job():
    assert launch.job_principal("20261202-101010-abcdef") == \
        "dockermpi-job-20261202-101010-abcdef"
    with pytest.raises(ValueError):
        launch.job_principal("a b")


def test_known_hosts_trusts_each_nodes_ca_for_its_own_address_only():
    _, ca1 = launch.generate_ed25519_keypair("ca1")
    _, ca2 = launch.generate_ed25519_keypair("ca2")
    text = launch.known_hosts_text({"10.0.0.20": ca2, "10.0.0.3": ca1}, SSH_PORT)
    assert text.splitlines() == [
        f"@cert-authority [10.0.0.3]:20022 {' '.join(ca1.split()[:2])}",
        f"@cert-authority [10.0.0.20]:20022 {' '.join(ca2.split()[:2])}",
    ]


@pytest.mark.parametrize("cas", [{}, {"node1": "ssh-ed25519 AAAA"}, {"10.0.0.1": "not a key"}])
def test_known_hosts_rejects(cas):
    with pytest.raises(ValueError):
        launch.known_hosts_text(cas, SSH_PORT)


def test_job_keys_give_each_node_its_own_part():
    cas = {n: launch.generate_ed25519_keypair(f"{n}-ca") for n in ("node1", "node2")}
    addresses = {"node1": "10.0.1.130", "node2": "10.0.1.131"}
    public = {n: cas[n][1] for n in cas}
    job = "20261202-101010-abcdef"
    made = {n: launch.job_keys(cas[n][0], job, n, addresses, public, "node1", SSH_PORT,
                                   100, 200) for n in cas}
    assert set(made["node1"]) == {"ssh_host_key", "ssh_host_key-cert.pub", "user_ca.pub",
                                  "principals", "id_ed25519", "id_ed25519-cert.pub",
                                  "known_hosts"}
    # A worker that runs no mpirun gets no user key and trusts no host.
    assert set(made["node2"]) == {"ssh_host_key", "ssh_host_key-cert.pub", "user_ca.pub",
                                  "principals"}
    for node, keys in made.items():
        host = launch.read_ssh_certificate(keys["ssh_host_key-cert.pub"])
        assert (host["kind"], host["principals"]) == ("host", [addresses[node]])
        assert host["ca"] == public[node].rsplit(" ", 1)[0]  # signed by its own node's CA
        assert keys["user_ca.pub"] == public["node1"].rsplit(" ", 1)[0] + "\n"
        assert keys["principals"] == f"dockermpi-job-{job}\n"
    user = launch.read_ssh_certificate(made["node1"]["id_ed25519-cert.pub"])
    assert (user["kind"], user["principals"]) == ("user", [f"dockermpi-job-{job}"])
    assert made["node1"]["known_hosts"] == launch.known_hosts_text(
        {addresses[n]: public[n] for n in addresses}, SSH_PORT)
    assert made["node1"]["ssh_host_key"] != made["node2"]["ssh_host_key"]


def test_job_keys_need_every_nodes_ca():
    ca_private, ca_public = launch.generate_ed25519_keypair("ca")
    with pytest.raises(ValueError, match="every node"):
        launch.job_keys(ca_private, "20261202-101010-abcdef", "node1",
                            {"node1": "10.0.1.130", "node2": "10.0.1.131"},
                            {"node1": ca_public}, "node1", SSH_PORT, 100, 200)


# ---------------------------------------------------------------------- passwd / group


def test_passwd_names_guest_with_data_home():
    text = launch.passwd_text("guest", 2000, 2000)
    entries = {fields[0]: fields for fields in (line.split(":") for line in text.splitlines())}
    assert all(len(fields) == 7 for fields in entries.values())
    assert entries["guest"] == ["guest", "x", "2000", "2000", "DockerMPI user", "/data", "/bin/sh"]
    assert entries["root"][2] == "0"
    assert "sshd" in entries


def test_group_names_guest_group():
    lines = launch.group_text("guest", 2000).splitlines()
    assert "guest:x:2000:" in lines


@pytest.mark.parametrize(
    "args, message",
    [
        (("guest", 0, 2000), "not root"),
        (("guest", 2000, 0), "not root"),
        (("root", 2000, 2000), "clashes"),
        (("guest", 65534, 2000), "clashes"),
        (("bad:name", 2000, 2000), "POSIX name"),
    ],
)
def test_passwd_rejects(args, message):
    with pytest.raises(ValueError, match=message):
        launch.passwd_text(*args)


def test_group_rejects_root_gid():
    with pytest.raises(ValueError, match="not root"):
        launch.group_text("guest", 0)


# ------------------------------------------------------------------------- hostfile


def test_hostfile_keeps_placement_order():
    text = launch.hostfile_text([("10.197.1.12", 4), ("10.197.1.11", 2)])
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
        launch.hostfile_text(placement)


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
    return launch.mpirun_argv(**args)


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


def test_ssh_args_reach_the_job_port_with_job_keys():
    rsh_args = _mca(_argv())["plm_rsh_args"].split(" ")
    # Open MPI splits plm_rsh_args on spaces: every option must survive that split.
    assert rsh_args == launch.ssh_args(SSH_PORT)
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


def test_program_script_runs_every_word_as_data(tmp_path):
    script = tmp_path / "program"
    script.write_text(launch.program_script_text(HOSTILE_PROGRAM))
    result = subprocess.run(["/bin/sh", str(script)], cwd=tmp_path, capture_output=True,
                            check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.decode().split("\0")[:-1] == HOSTILE_PROGRAM[2:]
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "pwned2").exists()


def test_program_script_keeps_the_exit_code_and_reports_a_missing_program(tmp_path):
    script = tmp_path / "program"
    script.write_text(launch.program_script_text(["sh", "-c", "exit 7"]))
    assert subprocess.run(["/bin/sh", str(script)], check=False).returncode == 7
    script.write_text(launch.program_script_text(["no-such-program-here"]))
    assert subprocess.run(["/bin/sh", str(script)], capture_output=True,
                          check=False).returncode == 127


@pytest.mark.parametrize(
    "program, message",
    [("python3 app.py", "list"), ([], "non-empty"), (["a", 3], "strings"),
     (["a\0b"], "NUL"), ([""], "program name")],
)
def test_program_script_rejects(program, message):
    with pytest.raises(ValueError, match=message):
        launch.program_script_text(program)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"np": 0}, "np"),
        ({"np": "4"}, "np"),
        ({"cluster_cidr": "eth0"}, "CIDR"),
        ({"cluster_cidr": "10.197.1.5/24"}, "not a network"),
        ({"cluster_cidr": "fd00::/64"}, "IPv4"),
        ({"oob_ports": "20100"}, "LOW-HIGH"),
        ({"oob_ports": (20199, 20100)}, "empty"),
        ({"oob_ports": (80, 200)}, "between 1024"),
        ({"btl_ports": (20150, 20300)}, "overlap"),
        ({"ssh_port": 20150}, "inside"),
        ({"workdir": "data/x"}, "absolute"),
        ({"workdir": "/data/my job"}, "whitespace"),
        ({"env_names": "PATH"}, "list"),
        ({"env_names": ["A=B"]}, "not valid"),
        ({"env_names": ["1X"]}, "not valid"),
        ({"keepalive": (0, 1, 3)}, "positive"),
    ],
)
def test_mpirun_argv_rejects(kwargs, message):
    with pytest.raises(ValueError, match=message):
        _argv(**kwargs)


def test_launcher_argv_wraps_mpirun_in_fixed_script():
    argv = launch.launcher_argv(
        "/data/jobs/42/stdout", "/data/jobs/42/stderr", 4, CIDR, OOB, BTL, SSH_PORT,
        "/data/jobs/42",
    )
    assert argv[:6] == ["/bin/sh", "-c", launch.LAUNCHER_SCRIPT, "sh",
                        "/data/jobs/42/stdout", "/data/jobs/42/stderr"]
    assert argv[6:] == _argv()


def test_launcher_argv_rejects_same_output_file():
    with pytest.raises(ValueError, match="differ"):
        launch.launcher_argv("/data/o", "/data/o", 1, CIDR, OOB, BTL, SSH_PORT, "/data")


def test_launcher_script_redirects_and_keeps_exit_code(tmp_path):
    """Run the fixed wrapper with a stand-in for mpirun: hostile strings stay data."""
    out, err = tmp_path / "out", tmp_path / "err"
    hostile = ["$(touch pwned)", "; touch pwned2", "`id`", "a b"]
    script = 'printf "%s\\n" "$@"; echo oops >&2; exit 7'
    argv = ["/bin/sh", "-c", launch.LAUNCHER_SCRIPT, "sh", str(out), str(err),
            "/bin/sh", "-c", script, "inner"] + hostile
    result = subprocess.run(argv, cwd=tmp_path, capture_output=True, check=False)
    assert result.returncode == 7
    assert result.stdout == b"" and result.stderr == b""
    assert out.read_text().splitlines() == hostile
    assert err.read_text() == "oops\n"
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "pwned2").exists()


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
    assert launch.parse_mpirun_failure(_sample(sample)) == expected


def test_parse_crlf():
    text = _sample("exit3").replace("\n", "\r\n")
    assert launch.parse_mpirun_failure(text) == {"rank": 1, "exit_code": 3}


def test_parse_last_message_wins_over_program_output():
    forged = _sample("segv").replace("rank 1 with", "rank 0 with").replace("signal 11", "signal 6")
    # The program printed a look-alike first; mpirun's real verdict comes last.
    text = forged + _sample("exit3os")
    assert launch.parse_mpirun_failure(text) == {"rank": 1, "exit_code": 3}


def test_parse_unknown_signal_number_keeps_text():
    text = ("mpirun noticed that process rank 5 with PID 12 on node 10.0.0.1 exited on "
            "signal 99 (Odd signal).\n")
    assert launch.parse_mpirun_failure(text) == {"rank": 5, "signal": 99, "signal_name": "Odd signal"}


def test_parse_never_raises_on_what_a_job_can_write():
    assert launch.parse_mpirun_failure(b"bytes") is None
    huge_rank = ("mpirun noticed that process rank " + "9" * 5000 + " with PID 12 on node n "
                 "exited on signal 11 (Segmentation fault).\n")
    assert launch.parse_mpirun_failure(huge_rank) is None
    unicode_digits = "MPI_ABORT was invoked on rank \u0663 in communicator W\nwith errorcode 1.\n"
    assert launch.parse_mpirun_failure(unicode_digits) is None
    odd_signal = ("mpirun noticed that process rank 1 with PID 12 on node n exited on "
                  "signal 999.\n")
    assert launch.parse_mpirun_failure(odd_signal) == {"rank": 1, "signal": 999,
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
    found = launch.parse_mpirun_failure("\n".join(pieces))
    assert found is None or (isinstance(found["rank"], int) and 0 <= found["rank"] < 10**9)
    if found and "signal" in found:
        assert isinstance(found["signal_name"], str) and len(found["signal_name"]) <= 40
