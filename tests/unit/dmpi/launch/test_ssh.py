"""
Unit tests for :mod:`dmpi.launch.ssh`: the job's keys and certificates (read back by
OpenSSH's own ssh-keygen), sshd's configuration, known_hosts.
"""

import subprocess

import pytest

from dmpi.launch import ssh

CIDR = "10.197.1.0/24"
OOB = "20100-20199"
BTL = (20200, 20999)
SSH_PORT = 20022



# ------------------------------------------------------------------------------ keys


def test_keypair_is_openssh_ed25519_and_matches():
    from cryptography.hazmat.primitives import serialization

    private, public = ssh.generate_ed25519_keypair("job-42")
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
    assert ssh.generate_ed25519_keypair()[0] != ssh.generate_ed25519_keypair()[0]


@pytest.mark.parametrize("comment", ["", "two words", None])
def test_keypair_rejects_bad_comment(comment):
    with pytest.raises(ValueError, match="comment"):
        ssh.generate_ed25519_keypair(comment)


# ---------------------------------------------------------------------- ssh config text


def test_sshd_config_for_unprivileged_sshd():
    text = ssh.sshd_config_text(SSH_PORT, "guest")
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
    text = ssh.sshd_config_text(SSH_PORT, "guest", listen_address="10.197.1.11")
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
        ssh.sshd_config_text(**args)


def _ssh_keygen_list(tmp_path, cert_line):
    """What OpenSSH's own ssh-keygen reads in a certificate (``-L``)."""
    path = tmp_path / "key-cert.pub"
    path.write_text(cert_line + "\n")
    return subprocess.run(["ssh-keygen", "-L", "-f", str(path)], capture_output=True,
                          text=True, check=True).stdout


def test_host_certificate_is_read_by_ssh_keygen(tmp_path):
    ca_private, ca_public = ssh.generate_ed25519_keypair("ca")
    _, host_public = ssh.generate_ed25519_keypair("host")
    cert = ssh.sign_ssh_certificate(ca_private, host_public, "host", "job-1@node1",
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
    facts = ssh.read_ssh_certificate(cert)
    assert facts == {"kind": "host", "key_id": "job-1@node1", "principals": ["10.197.1.130"],
                     "valid_after": 1_800_000_000, "valid_before": 1_800_003_600,
                     "ca": " ".join(ca_public.split()[:2])}


def test_user_certificate_binds_principal_and_source_and_grants_nothing(tmp_path):
    ca_private, _ = ssh.generate_ed25519_keypair("ca")
    _, user_public = ssh.generate_ed25519_keypair("user")
    principal = ssh.job_principal("20261202-101010-abcdef")
    cert = ssh.sign_ssh_certificate(ca_private, user_public, "user", "job", [principal],
                                           1_800_000_000, 1_800_003_600,
                                           source_addresses=["10.197.1.130"])
    listed = _ssh_keygen_list(tmp_path, cert)
    assert "user certificate" in listed
    assert principal in listed
    assert "source-address 10.197.1.130/32" in listed
    assert "Extensions: (none)" in listed  # no pty, no forwarding, no rc
    assert ssh.read_ssh_certificate(cert)["principals"] == [principal]


def test_read_certificate_refuses_a_forged_signature():
    ca_private, _ = ssh.generate_ed25519_keypair("ca")
    _, host_public = ssh.generate_ed25519_keypair("host")
    cert = ssh.sign_ssh_certificate(ca_private, host_public, "host", "id",
                                           ["10.0.0.1"], 1, 2)
    keytype, blob, _ = cert.split()
    import base64
    raw = bytearray(base64.b64decode(blob))
    # Change the principal's last digit: the signature no longer covers the body.
    at = raw.index(b"10.0.0.1") + len(b"10.0.0.1") - 1
    raw[at] = ord("2")
    with pytest.raises(ValueError, match="does not verify"):
        ssh.read_ssh_certificate(f"{keytype} {base64.b64encode(bytes(raw)).decode()}")


@pytest.mark.parametrize("line", ["", "ssh-ed25519 AAAA", "ssh-ed25519-cert-v01@openssh.com !!",
                                  "ssh-ed25519-cert-v01@openssh.com AAAAAAAA"])
def test_read_certificate_refuses_garbage(line):
    with pytest.raises(ValueError):
        ssh.read_ssh_certificate(line)


@pytest.mark.parametrize("kwargs, message", [
    ({"kind": "both"}, "user or host"),
    ({"key_id": "two words"}, "key id"),
    ({"principals": "10.0.0.1"}, "principals"),
    ({"principals": ["a,b"]}, "principals"),
    ({"valid_after": 5, "valid_before": 5}, "validity"),
])
def test_sign_certificate_rejects(kwargs, message):
    ca_private, _ = ssh.generate_ed25519_keypair("ca")
    _, public = ssh.generate_ed25519_keypair("k")
    args = {"ca_private_text": ca_private, "public_line": public, "kind": "host",
            "key_id": "id", "principals": ["10.0.0.1"], "valid_after": 1, "valid_before": 2}
    with pytest.raises(ValueError, match=message):
        ssh.sign_ssh_certificate(**dict(args, **kwargs))


def test_job_principal_names_the_job():
    assert ssh.job_principal("20261202-101010-abcdef") == \
        "dockermpi-job-20261202-101010-abcdef"
    with pytest.raises(ValueError):
        ssh.job_principal("a b")


def test_known_hosts_trusts_each_nodes_ca_for_its_own_address_only():
    _, ca1 = ssh.generate_ed25519_keypair("ca1")
    _, ca2 = ssh.generate_ed25519_keypair("ca2")
    text = ssh.known_hosts_text({"10.0.0.20": ca2, "10.0.0.3": ca1}, SSH_PORT)
    assert text.splitlines() == [
        f"@cert-authority [10.0.0.3]:20022 {' '.join(ca1.split()[:2])}",
        f"@cert-authority [10.0.0.20]:20022 {' '.join(ca2.split()[:2])}",
    ]


@pytest.mark.parametrize("cas", [{}, {"node1": "ssh-ed25519 AAAA"}, {"10.0.0.1": "not a key"}])
def test_known_hosts_rejects(cas):
    with pytest.raises(ValueError):
        ssh.known_hosts_text(cas, SSH_PORT)


def test_job_keys_give_each_node_its_own_part():
    cas = {n: ssh.generate_ed25519_keypair(f"{n}-ca") for n in ("node1", "node2")}
    addresses = {"node1": "10.0.1.130", "node2": "10.0.1.131"}
    public = {n: cas[n][1] for n in cas}
    job = "20261202-101010-abcdef"
    made = {n: ssh.job_keys(cas[n][0], job, n, addresses, public, "node1", SSH_PORT,
                                   100, 200) for n in cas}
    assert set(made["node1"]) == {"ssh_host_key", "ssh_host_key-cert.pub", "user_ca.pub",
                                  "principals", "id_ed25519", "id_ed25519-cert.pub",
                                  "known_hosts"}
    # A worker that runs no mpirun gets no user key and trusts no host.
    assert set(made["node2"]) == {"ssh_host_key", "ssh_host_key-cert.pub", "user_ca.pub",
                                  "principals"}
    for node, keys in made.items():
        host = ssh.read_ssh_certificate(keys["ssh_host_key-cert.pub"])
        assert (host["kind"], host["principals"]) == ("host", [addresses[node]])
        assert host["ca"] == public[node].rsplit(" ", 1)[0]  # signed by its own node's CA
        assert keys["user_ca.pub"] == public["node1"].rsplit(" ", 1)[0] + "\n"
        assert keys["principals"] == f"dockermpi-job-{job}\n"
    user = ssh.read_ssh_certificate(made["node1"]["id_ed25519-cert.pub"])
    assert (user["kind"], user["principals"]) == ("user", [f"dockermpi-job-{job}"])
    assert made["node1"]["known_hosts"] == ssh.known_hosts_text(
        {addresses[n]: public[n] for n in addresses}, SSH_PORT)
    assert made["node1"]["ssh_host_key"] != made["node2"]["ssh_host_key"]


def test_job_keys_need_every_nodes_ca():
    ca_private, ca_public = ssh.generate_ed25519_keypair("ca")
    with pytest.raises(ValueError, match="every node"):
        ssh.job_keys(ca_private, "20261202-101010-abcdef", "node1",
                            {"node1": "10.0.1.130", "node2": "10.0.1.131"},
                            {"node1": ca_public}, "node1", SSH_PORT, 100, 200)
