"""
The job's ssh, the transport MPI starts ranks over: per-job keys and certificates made
on the nodes that use them (only CAs' public keys travel), the worker's sshd
configuration, known_hosts, and the ssh options launchers pass.

Job keys are made on the nodes that use them, never sent: each node keeps a job CA and
certifies the host key it makes for its worker (principal: the worker's address); the
launcher's node certifies the user key it makes (principal: :func:`job_principal`). Only
the CAs' public keys travel, so no private key is ever in a Salt publish or return.

Key files must be owned by the job's uid and have mode 0600: sshd and ssh refuse a key
that is readable by others, and cannot read one owned by root with mode 0600.

:depends: cryptography (keys and certificates)
"""

import base64
import ipaddress
import os
import re

from dmpi.contract import RUN_DIR
from dmpi.launch.values import (check_abs_path, check_name, check_port, check_pubkey)

#: Where the per-job directory is mounted (read-only) inside job containers.
DEFAULT_RUN_DIR = RUN_DIR
#: File names in the per-job directory, shared by the node that writes them and the
#: configuration that reads them.
USER_KEY = "id_ed25519"
USER_CERT = "id_ed25519-cert.pub"
HOST_KEY = "ssh_host_key"
HOST_CERT = "ssh_host_key-cert.pub"
USER_CA = "user_ca.pub"
PRINCIPALS = "principals"
KNOWN_HOSTS = "known_hosts"

# The key exchanges a job's sshd offers (sshd_config_text says why these).
KEX_ALGORITHMS = "curve25519-sha256,curve25519-sha256@libssh.org"


def generate_ed25519_keypair(comment="dockermpi"):
    """
    Generate a fresh ed25519 key pair in OpenSSH formats.

    comment
        Comment appended to the public key line (no whitespace).

    Returns ``(private_text, public_line)``: the private key as an
    ``-----BEGIN OPENSSH PRIVATE KEY-----`` block (unencrypted, newline-terminated) and the
    public key as ``"ssh-ed25519 AAAA... comment"`` without a trailing newline. Used both
    for the per-job user key and the per-job host key.
    """
    if not isinstance(comment, str) or not comment or any(c.isspace() for c in comment):
        raise ValueError(f"key comment must be a non-empty word, got {comment!r}")
    # Imported here so the rest of the module stays stdlib-only.
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        encoding=serialization.Encoding.PEM,
        format=serialization.PrivateFormat.OpenSSH,
        encryption_algorithm=serialization.NoEncryption(),
    ).decode("ascii")
    public = key.public_key().public_bytes(
        encoding=serialization.Encoding.OpenSSH,
        format=serialization.PublicFormat.OpenSSH,
    ).decode("ascii")
    return private, f"{public} {comment}"


# ---------------------------------------------------------------------- ssh config text


def sshd_config_text(port, user, run_dir=DEFAULT_RUN_DIR, listen_address=None):
    """
    Return the ``sshd_config`` of a worker's unprivileged sshd.

    port
        TCP port sshd listens on (the job's ssh port, 1024-65535: the worker has no
        capabilities, so it cannot bind below 1024).
    user
        The job's account name (the only account allowed to log in).
    run_dir
        Where the per-job directory is mounted: the host key and its certificate, the
        user CA (the launcher node's job CA) and the principals file
        (:func:`job_principal`) are read from there.
    listen_address
        Optional IPv4 address to bind (the node's cluster address); default all.

    sshd runs as the job's uid, so there is no privilege separation, no PAM, no pid
    file and no login records; only ``user`` may log in, with a certificate of the
    launcher node's job CA naming the job's principal (no authorized keys at all), and
    all forwarding is off.
    """
    check_port(port, "ssh port")
    check_name(user, "user")
    check_abs_path(run_dir, "run_dir")
    lines = [
        "# DockerMPI per-job sshd, run as the job's user (generated, do not edit)",
        f"Port {port}",
    ]
    if listen_address is not None:
        try:
            addr = ipaddress.IPv4Address(listen_address)
        except ValueError:
            raise ValueError(f"listen_address must be an IPv4 address, got {listen_address!r}") from None
        lines.append(f"ListenAddress {addr}")
    lines += [
        f"HostKey {run_dir}/{HOST_KEY}",
        f"HostCertificate {run_dir}/{HOST_CERT}",
        f"TrustedUserCAKeys {run_dir}/{USER_CA}",
        f"AuthorizedPrincipalsFile {run_dir}/{PRINCIPALS}",
        "AuthorizedKeysFile none",
        f"AllowUsers {user}",
        "PidFile none",
        "UsePAM no",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "HostbasedAuthentication no",
        "PermitRootLogin no",
        "PermitUserEnvironment no",
        "PermitUserRC no",
        "StrictModes yes",
        "AllowTcpForwarding no",
        "AllowAgentForwarding no",
        "AllowStreamLocalForwarding no",
        "X11Forwarding no",
        "PermitTunnel no",
        "GatewayPorts no",
        "PrintMotd no",
        "PrintLastLog no",
        "UseDNS no",
        "Compression no",
        # Every job proves its sshds (ssh-keyscan) and mpirun logs in to each node: the
        # default post-quantum hybrid key exchange costs about 60 ms of CPU a connection
        # (curve25519 about 7 ms) and protects nothing that matters here, since the
        # job's MPI traffic itself is plain TCP on the cluster network.
        f"KexAlgorithms {KEX_ALGORITHMS}",
        "ClientAliveInterval 5",
        "ClientAliveCountMax 3",
        "MaxStartups 64:30:256",
        "MaxSessions 64",
        "LogLevel ERROR",
        "Subsystem sftp internal-sftp",
    ]
    return "\n".join(lines) + "\n"


def job_principal(job_id):
    """The principal a job's user certificate carries and its sshds accept: the job's own
    id, so one job's certificate logs in to no other job's sshd."""
    if not isinstance(job_id, str) or not re.fullmatch(r"[0-9A-Za-z][0-9A-Za-z_.-]{0,63}", job_id):
        raise ValueError(f"job id must be a simple word, got {job_id!r}")
    return f"dockermpi-job-{job_id}"


def _ssh_string(data):
    return len(data).to_bytes(4, "big") + data


def _ssh_strings(values):
    return b"".join(_ssh_string(v.encode("ascii")) for v in values)


def _ed25519_blob(public_line, what):
    line = check_pubkey(public_line, what)
    keytype, blob = line.split()[:2]
    if keytype != "ssh-ed25519":
        raise ValueError(f"{what} must be an ed25519 key, got {keytype}")
    return base64.b64decode(blob)


def _ed25519_public(blob, what):
    parts = _SshReader(blob, what)
    if parts.string() != b"ssh-ed25519":
        raise ValueError(f"{what} is not an ed25519 key")
    key = parts.string()
    parts.end()
    if len(key) != 32:
        raise ValueError(f"{what} is not an ed25519 key")
    return key


class _SshReader:
    """Reads the SSH wire encoding (RFC 4251) of one blob, refusing anything short."""

    def __init__(self, data, what):
        self.data, self.at, self.what = data, 0, what

    def take(self, size):
        if self.at + size > len(self.data):
            raise ValueError(f"{self.what} is truncated")
        chunk = self.data[self.at:self.at + size]
        self.at += size
        return chunk

    def uint(self, size):
        return int.from_bytes(self.take(size), "big")

    def string(self):
        return self.take(self.uint(4))

    def strings(self):
        inner = _SshReader(self.string(), self.what)
        values = []
        while inner.at < len(inner.data):
            values.append(inner.string().decode("ascii", "replace"))
        return values

    def end(self):
        if self.at != len(self.data):
            raise ValueError(f"{self.what} has trailing bytes")


_CERT_TYPE = "ssh-ed25519-cert-v01@openssh.com"
_CERT_KINDS = {"user": 1, "host": 2}


def sign_ssh_certificate(ca_private_text, public_line, kind, key_id, principals,
                         valid_after, valid_before, source_addresses=()):
    """
    Sign an ed25519 public key with a CA key into an OpenSSH certificate (the format of
    OpenSSH's PROTOCOL.certkeys, as ``ssh-keygen -s`` makes it).

    ca_private_text
        The CA's ed25519 private key, OpenSSH format.
    public_line
        The key to certify, an ``ssh-ed25519 AAAA...`` line.
    kind
        ``"user"`` or ``"host"``.
    key_id
        Identifier sshd logs for the certificate (a word).
    principals
        Users (user certificate) or host names (host certificate) it is valid for.
    valid_after, valid_before
        Unix times bounding its validity.
    source_addresses
        For a user certificate: the only addresses (``a.b.c.d/32`` or networks) it may
        log in from, enforced by sshd as the ``source-address`` critical option.

    The certificate grants no extensions: no pty, no forwarding, no ``~/.ssh/rc``.
    Returns the certificate's public line, ``ssh-ed25519-cert-v01@openssh.com AAAA... key_id``.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    if kind not in _CERT_KINDS:
        raise ValueError(f"certificate kind must be user or host, got {kind!r}")
    if not isinstance(key_id, str) or not key_id or any(c.isspace() for c in key_id):
        raise ValueError(f"certificate key id must be a word, got {key_id!r}")
    if isinstance(principals, str) or not principals or not all(
            isinstance(p, str) and p and not any(c.isspace() or c == "," for c in p)
            for p in principals):
        raise ValueError(f"certificate principals must be a list of words, got {principals!r}")
    if not 0 <= int(valid_after) < int(valid_before) < 2**64:
        raise ValueError("certificate validity must be a non-empty span of Unix time")
    ca = serialization.load_ssh_private_key(ca_private_text.encode("ascii"), password=None)
    if not isinstance(ca, Ed25519PrivateKey):
        raise ValueError("the CA key must be an ed25519 key")
    ca_blob = ca.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                           serialization.PublicFormat.OpenSSH).split()[1]
    key = _ed25519_public(_ed25519_blob(public_line, "public key"), "public key")
    critical = b""
    if source_addresses:
        networks = [str(ipaddress.ip_network(a, strict=False)) for a in source_addresses]
        critical = _ssh_string(b"source-address") + _ssh_string(
            _ssh_string(",".join(networks).encode("ascii")))
    body = b"".join([
        _ssh_string(_CERT_TYPE.encode("ascii")),
        _ssh_string(os.urandom(32)),
        _ssh_string(key),
        (0).to_bytes(8, "big"),
        _CERT_KINDS[kind].to_bytes(4, "big"),
        _ssh_string(key_id.encode("ascii")),
        _ssh_string(_ssh_strings(principals)),
        int(valid_after).to_bytes(8, "big"),
        int(valid_before).to_bytes(8, "big"),
        _ssh_string(critical),
        _ssh_string(b""),  # extensions: none
        _ssh_string(b""),  # reserved
        _ssh_string(base64.b64decode(ca_blob)),
    ])
    signature = _ssh_string(b"ssh-ed25519") + _ssh_string(ca.sign(body))
    cert = body + _ssh_string(signature)
    return f"{_CERT_TYPE} {base64.b64encode(cert).decode('ascii')} {key_id}"


def read_ssh_certificate(cert_line):
    """
    Read an ed25519 OpenSSH certificate line and check its CA's signature.

    Returns ``{"kind": "user" or "host", "key_id", "principals", "valid_after",
    "valid_before", "ca": "ssh-ed25519 AAAA..." (the signing CA's public key)}``.
    Raises ValueError for anything that is not such a certificate, or whose signature
    does not verify.
    """
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    words = cert_line.split() if isinstance(cert_line, str) else []
    if len(words) < 2 or words[0] != _CERT_TYPE:
        raise ValueError("not an ed25519 OpenSSH certificate")
    try:
        cert = base64.b64decode(words[1], validate=True)
    except ValueError:
        raise ValueError("certificate is not base64") from None
    reader = _SshReader(cert, "certificate")
    if reader.string() != _CERT_TYPE.encode("ascii"):
        raise ValueError("certificate type does not match its line")
    reader.string()  # nonce
    _ = reader.string()  # the certified key
    reader.uint(8)  # serial
    kind = {v: k for k, v in _CERT_KINDS.items()}.get(reader.uint(4))
    key_id = reader.string().decode("ascii", "replace")
    principals = reader.strings()
    valid_after, valid_before = reader.uint(8), reader.uint(8)
    reader.string(), reader.string(), reader.string()  # critical options, extensions, reserved
    ca_blob = reader.string()
    signed = cert[:reader.at]
    signature = _SshReader(reader.string(), "certificate signature")
    reader.end()
    if kind is None or signature.string() != b"ssh-ed25519":
        raise ValueError("certificate is neither a user nor a host ed25519 certificate")
    sig = signature.string()
    signature.end()
    try:
        Ed25519PublicKey.from_public_bytes(_ed25519_public(ca_blob, "certificate CA")).verify(
            sig, signed)
    except InvalidSignature:
        raise ValueError("certificate signature does not verify") from None
    return {"kind": kind, "key_id": key_id, "principals": principals,
            "valid_after": valid_after, "valid_before": valid_before,
            "ca": f"ssh-ed25519 {base64.b64encode(ca_blob).decode('ascii')}"}


def known_hosts_text(cas_by_address, port):
    """
    Return ``known_hosts`` text trusting, for each job address, the host certificates
    its node's CA signs (``@cert-authority [address]:port ca``).

    cas_by_address
        ``{address: CA public line}``: each job container's address and the CA of the
        node it runs on.
    port
        The job's sshd port.

    ssh then accepts at each address only a host certificate of that node's CA naming
    that address as its principal.
    """
    check_port(port, "ssh port")
    if not isinstance(cas_by_address, dict) or not cas_by_address:
        raise ValueError("known_hosts needs at least one address and CA")
    lines = []
    for address in sorted(cas_by_address, key=ipaddress.IPv4Address):
        ipaddress.IPv4Address(address)
        keytype, blob = check_pubkey(cas_by_address[address], "CA public key").split()[:2]
        lines.append(f"@cert-authority [{address}]:{port} {keytype} {blob}")
    return "\n".join(lines) + "\n"


def job_keys(ca_private_text, job_id, node, addresses, job_cas, launcher_node, port,
             valid_after, valid_before):
    """
    Make and certify the ssh keys of one node's part of a job, with that node's job CA.

    ca_private_text
        The node's job CA private key.
    job_id, node
        The job, and the node these keys are for.
    addresses
        ``{node id: job address}`` of every node of the job.
    job_cas
        ``{node id: job CA public line}`` of every node of the job.
    launcher_node
        The node that runs mpirun.
    port
        The job's sshd port.
    valid_after, valid_before
        Unix times bounding the certificates' validity.

    Returns ``{file name: text}`` for the job's directory: the worker's host key and its
    certificate (principal: the node's job address), the CA its sshd trusts for users
    (the launcher node's) and the job's principal; on the launcher's node also the user
    key, its certificate (principal: the job, from the launcher's address only) and
    ``known_hosts`` trusting each node's CA for that node's address alone.
    """
    if node not in addresses or launcher_node not in addresses or set(addresses) - set(job_cas):
        raise ValueError("addresses and job_cas must name this node, the launcher's and every node")
    address = str(ipaddress.IPv4Address(addresses[node]))
    principal = job_principal(job_id)
    host_private, host_public = generate_ed25519_keypair("dockermpi-host")
    keys = {
        HOST_KEY: host_private,
        HOST_CERT: sign_ssh_certificate(ca_private_text, host_public, "host",
                                        f"{job_id}@{node}", [address], valid_after,
                                        valid_before) + "\n",
        USER_CA: " ".join(check_pubkey(job_cas[launcher_node], "CA public key").split()[:2])
        + "\n",
        PRINCIPALS: principal + "\n",
    }
    if node == launcher_node:
        user_private, user_public = generate_ed25519_keypair("dockermpi-job")
        keys[USER_KEY] = user_private
        keys[USER_CERT] = sign_ssh_certificate(
            ca_private_text, user_public, "user", job_id, [principal], valid_after,
            valid_before, source_addresses=[address]) + "\n"
        keys[KNOWN_HOSTS] = known_hosts_text({addresses[n]: job_cas[n] for n in addresses},
                                             port)
    return keys


def ssh_args(ssh_port, run_dir=DEFAULT_RUN_DIR):
    """
    Return the ssh options (a list) Open MPI passes when it starts ``orted`` on workers.

    ssh_port
        The workers' sshd port.
    run_dir
        Where the per-job directory (the user key, its certificate, ``known_hosts``) is
        mounted.

    Open MPI splits ``plm_rsh_args`` on spaces, so no element may contain whitespace.
    """
    check_port(ssh_port, "ssh port")
    check_abs_path(run_dir, "run_dir")
    return [
        "-F", "/dev/null",
        "-p", str(ssh_port),
        "-i", f"{run_dir}/{USER_KEY}",
        "-o", f"CertificateFile={run_dir}/{USER_CERT}",
        "-o", "IdentitiesOnly=yes",
        "-o", "BatchMode=yes",
        "-o", "StrictHostKeyChecking=yes",
        "-o", f"UserKnownHostsFile={run_dir}/{KNOWN_HOSTS}",
        "-o", "GlobalKnownHostsFile=/dev/null",
        "-o", "UpdateHostKeys=no",
        "-o", "ConnectTimeout=10",
        "-o", "ServerAliveInterval=5",
        "-o", "ServerAliveCountMax=3",
        "-o", "LogLevel=ERROR",
    ]
