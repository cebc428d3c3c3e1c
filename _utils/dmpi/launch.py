"""
Text and argv builders for launching one MPI job in DockerMPI containers.

Shared by the master-side ``mpi`` runner and the node-side execution module. Everything
here is pure: functions take plain values, validate them, and return text or argv lists.
Nothing touches the file system, runs a process or imports Salt.

A job runs like this on each chosen node: a *worker* container (the job image, run as the
job's user's own uid:gid with every capability dropped) runs ``sshd -D -e -f /run/dockermpi/sshd_config``
on a per-job port. The read-only per-job directory ``/run/dockermpi`` holds the files built
here: ``sshd_config``, ``known_hosts``, ``hostfile`` and the ``passwd``/``group`` files
that are bind-mounted over ``/etc/passwd`` and ``/etc/group``. A *launcher* container on
the first node runs :func:`launcher_argv`: ``mpirun`` over ssh to the workers, with its
output redirected into the job directory.

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
import shlex
import signal as _signal

from dmpi.contract import ACCOUNT_RE, RUN_DIR

__all__ = [
    "DEFAULT_RUN_DIR",
    "generate_ed25519_keypair",
    "sshd_config_text",
    "job_principal",
    "sign_ssh_certificate",
    "read_ssh_certificate",
    "known_hosts_text",
    "job_keys",
    "passwd_text",
    "group_text",
    "hostfile_text",
    "ssh_args",
    "mca_params",
    "program_script_text",
    "mpirun_argv",
    "launcher_argv",
    "parse_mpirun_failure",
]

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

_ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
_PUBKEY_RE = re.compile(r"^(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(256|384|521)) [A-Za-z0-9+/]+=*( \S+)?$")

# The key exchanges a job's sshd offers (sshd_config_text says why these).
KEX_ALGORITHMS = "curve25519-sha256,curve25519-sha256@libssh.org"
# The fixed wrapper script of the launcher container. User strings only ever arrive as
# positional parameters: $1 is the stdout file, $2 the stderr file, the rest is mpirun argv.
LAUNCHER_SCRIPT = 'out="$1"; err="$2"; shift 2; exec "$@" >"$out" 2>"$err"'


# --------------------------------------------------------------------------- helpers


def _check_port(value, what):
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what} must be an integer, got {value!r}")
    if not 1024 <= value <= 65535:
        raise ValueError(f"{what} must be between 1024 and 65535, got {value}")
    return value


def _check_range(value, what):
    """Accept ``(low, high)`` (inclusive) or ``"low-high"``; return ``(low, high)``."""
    if isinstance(value, str):
        parts = value.split("-")
        if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
            raise ValueError(f"{what} must look like 'LOW-HIGH', got {value!r}")
        value = (int(parts[0]), int(parts[1]))
    try:
        low, high = value
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a (low, high) pair, got {value!r}") from None
    _check_port(low, f"{what} low end")
    _check_port(high, f"{what} high end")
    if low > high:
        raise ValueError(f"{what} is empty: {low} > {high}")
    return low, high


def _check_abs_path(value, what):
    if not isinstance(value, str) or not value.startswith("/"):
        raise ValueError(f"{what} must be an absolute path, got {value!r}")
    if any(c in value for c in "\n\0") or any(c.isspace() for c in value):
        raise ValueError(f"{what} must not contain whitespace or NUL, got {value!r}")
    return value


def _check_id(value, what):
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 2**31 - 2:
        raise ValueError(f"{what} must be a positive integer (not root), got {value!r}")
    return value


def _check_name(value, what):
    if not isinstance(value, str) or not ACCOUNT_RE.match(value):
        raise ValueError(
            f"{what} must be a lowercase POSIX name (letters, digits, '_', '-', "
            f"at most 32 characters), got {value!r}"
        )
    return value


def _check_pubkey(line, what):
    if not isinstance(line, str):
        raise ValueError(f"{what} must be a string, got {line!r}")
    line = line.strip()
    if not _PUBKEY_RE.fullmatch(line):
        raise ValueError(f"{what} is not an OpenSSH public key line: {line[:60]!r}")
    return line


def _check_cidr(value):
    if not isinstance(value, str) or "/" not in value:
        raise ValueError(f"cluster CIDR must be a network like '10.197.1.0/24', got {value!r}")
    try:
        net = ipaddress.ip_network(value, strict=True)
    except ValueError as exc:
        raise ValueError(f"cluster CIDR {value!r} is not a network: {exc}") from None
    if net.version != 4:
        raise ValueError(f"cluster CIDR must be IPv4, got {value!r}")
    return str(net)


# ------------------------------------------------------------------------------ keys


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
    _check_port(port, "ssh port")
    _check_name(user, "user")
    _check_abs_path(run_dir, "run_dir")
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
    line = _check_pubkey(public_line, what)
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
    _check_port(port, "ssh port")
    if not isinstance(cas_by_address, dict) or not cas_by_address:
        raise ValueError("known_hosts needs at least one address and CA")
    lines = []
    for address in sorted(cas_by_address, key=ipaddress.IPv4Address):
        ipaddress.IPv4Address(address)
        keytype, blob = _check_pubkey(cas_by_address[address], "CA public key").split()[:2]
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
        USER_CA: " ".join(_check_pubkey(job_cas[launcher_node], "CA public key").split()[:2])
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


# ---------------------------------------------------------------------- passwd / group


def passwd_text(user, uid, gid, home="/data", shell="/bin/sh"):
    """
    Return an ``/etc/passwd`` for job containers that names the job's user.

    user, uid, gid
        The job's account: a POSIX name and the user's own uid and gid (never 0).
    home
        The account's home, the data directory mount (default ``/data``).
    shell
        Login shell; sshd runs ``orted`` through it.

    Keeps ``root``, ``nobody`` and ``sshd`` lines next to the account so tools that look
    those names up keep working.
    """
    _check_name(user, "user")
    _check_id(uid, "uid")
    _check_id(gid, "gid")
    _check_abs_path(home, "home")
    _check_abs_path(shell, "shell")
    if uid == 65534 or user in ("root", "nobody", "sshd"):
        raise ValueError(f"account {user!r} (uid {uid}) clashes with a system account")
    lines = [
        "root:x:0:0:root:/root:/usr/sbin/nologin",
        f"{user}:x:{uid}:{gid}:DockerMPI user:{home}:{shell}",
        "sshd:x:100:65534::/run/sshd:/usr/sbin/nologin",
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin",
    ]
    return "\n".join(lines) + "\n"


def group_text(group, gid):
    """
    Return an ``/etc/group`` for job containers that names the user's own group.

    group, gid
        The user's private group (same id as the uid); gid must not be 0.
    """
    _check_name(group, "group")
    _check_id(gid, "gid")
    if gid == 65534 or group in ("root", "nogroup"):
        raise ValueError(f"group {group!r} (gid {gid}) clashes with a system group")
    lines = [
        "root:x:0:",
        f"{group}:x:{gid}:",
        "nogroup:x:65534:",
    ]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------- hostfile


def hostfile_text(placement):
    """
    Return an Open MPI hostfile for a placement.

    placement
        Ordered list of ``(address, slots)``: each node's cluster IPv4 address and the
        number of ranks it takes. Ranks are laid out in this order (by slot).

    Produces ``"<address> slots=<n> max_slots=<n>"`` lines.
    """
    if not isinstance(placement, (list, tuple)) or not placement:
        raise ValueError("placement must be a non-empty list of (address, slots)")
    seen = set()
    lines = []
    for item in placement:
        try:
            address, slots = item
        except (TypeError, ValueError):
            raise ValueError(f"placement entry must be (address, slots), got {item!r}") from None
        try:
            addr = ipaddress.IPv4Address(address)
        except ValueError:
            raise ValueError(f"placement address must be an IPv4 address, got {address!r}") from None
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise ValueError(f"slots for {addr} must be a positive integer, got {slots!r}")
        if addr in seen:
            raise ValueError(f"address {addr} appears twice in the placement")
        seen.add(addr)
        lines.append(f"{addr} slots={slots} max_slots={slots}")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------- launcher


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
    _check_port(ssh_port, "ssh port")
    _check_abs_path(run_dir, "run_dir")
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


def mca_params(cluster_cidr, oob_ports, btl_ports, ssh_port, run_dir=DEFAULT_RUN_DIR,
               keepalive=(2, 1, 3)):
    """
    Return the ordered list of ``(name, value)`` MCA settings of a DockerMPI job.

    cluster_cidr
        IPv4 network of the cluster links, e.g. ``"10.197.1.0/24"``. Open MPI's OOB and
        TCP BTL bind to interfaces in it (by CIDR, never by interface name: names differ
        between nodes).
    oob_ports
        ``(low, high)`` or ``"low-high"``: ports for mpirun's and orted's out-of-band
        listeners.
    btl_ports
        ``(low, high)`` or ``"low-high"``: ports for the ranks' TCP BTL listeners.
    ssh_port, run_dir
        See :func:`ssh_args`.
    keepalive
        ``(time, intvl, probes)`` of the OOB TCP keepalive, so a partition ends mpirun in
        seconds instead of hanging (defaults in Open MPI are 10/60/3).
    """
    cidr = _check_cidr(cluster_cidr)
    _check_port(ssh_port, "ssh port")
    oob_low, oob_high = _check_range(oob_ports, "OOB port range")
    btl_low, btl_high = _check_range(btl_ports, "BTL port range")
    if not (oob_high < btl_low or btl_high < oob_low):
        raise ValueError(f"OOB ports {oob_low}-{oob_high} overlap BTL ports {btl_low}-{btl_high}")
    if oob_low <= ssh_port <= oob_high or btl_low <= ssh_port <= btl_high:
        raise ValueError(f"ssh port {ssh_port} lies inside the OOB or BTL port range")
    try:
        ka_time, ka_intvl, ka_probes = keepalive
    except (TypeError, ValueError):
        raise ValueError(f"keepalive must be (time, intvl, probes), got {keepalive!r}") from None
    for v in (ka_time, ka_intvl, ka_probes):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"keepalive values must be positive integers, got {keepalive!r}")
    return [
        # Launch: ssh to the workers' unprivileged sshd; every orted from mpirun directly
        # (a tree spawn would need orted-to-orted ssh as well).
        ("plm", "rsh"),
        ("plm_rsh_agent", "ssh"),
        ("plm_rsh_args", " ".join(ssh_args(ssh_port, run_dir))),
        ("plm_rsh_no_tree_spawn", "1"),
        # Out-of-band (mpirun <-> orted <-> ranks) on the cluster network, fixed ports.
        ("oob", "tcp"),
        ("oob_tcp_if_include", cidr),
        ("oob_tcp_dynamic_ipv4_ports", f"{oob_low}-{oob_high}"),
        # The OOB opens a dual-stack IPv6 listener whatever disable_ipv6_family says;
        # giving it the same range keeps it inside the range (or it finds none free).
        ("oob_tcp_dynamic_ipv6_ports", f"{oob_low}-{oob_high}"),
        ("oob_tcp_disable_ipv6_family", "1"),
        ("oob_tcp_keepalive_time", str(ka_time)),
        ("oob_tcp_keepalive_intvl", str(ka_intvl)),
        ("oob_tcp_keepalive_probes", str(ka_probes)),
        # Data path: TCP between nodes, shared memory within a node, no InfiniBand/UCX.
        ("pml", "ob1"),
        ("btl", "self,vader,tcp"),
        ("btl_tcp_if_include", cidr),
        ("btl_tcp_port_min_v4", str(btl_low)),
        ("btl_tcp_port_range_v4", str(btl_high - btl_low + 1)),
        ("btl_tcp_disable_family", "6"),
        # The TCP BTL opens an IPv6 listener regardless; keep it inside the range too.
        ("btl_tcp_port_min_v6", str(btl_low)),
        ("btl_tcp_port_range_v6", str(btl_high - btl_low + 1)),
        # Without CAP_SYS_PTRACE CMA/knem single copy fails; copy through the shm segment.
        ("btl_vader_single_copy_mechanism", "none"),
        ("osc", "^ucx"),
        # Containers see the node's cores; do not pin ranks on behalf of the site.
        ("hwloc_base_binding_policy", "none"),
        ("rmaps_base_oversubscribe", "0"),
    ]


def program_script_text(program):
    """
    Return the script every rank runs: ``exec`` of the user's program, each word quoted.

    program
        The user's program argv (non-empty list of strings without NUL).

    The program reaches mpirun as a file (``<run_dir>/program``, run with ``/bin/sh``),
    never as mpirun arguments: mpirun reads ``:`` anywhere in its argv as the start of
    another program group with its own ``-np`` and ``--host``, so a user's words in its
    argv would be mpirun syntax. Each word is single-quoted (:func:`shlex.quote`), so the
    shell only execs it; ``exec`` keeps the rank's exit code and signals the program's.
    """
    if isinstance(program, str) or not isinstance(program, (list, tuple)) or not program:
        raise ValueError("program must be a non-empty list of strings (argv), not a string")
    for arg in program:
        if not isinstance(arg, str) or "\0" in arg:
            raise ValueError(f"program arguments must be strings without NUL, got {arg!r}")
    if not program[0]:
        raise ValueError("program must start with a program name")
    words = " ".join(shlex.quote(arg) for arg in program)
    return "# DockerMPI: the job's program (generated; each word is data)\nexec " + words + "\n"


def mpirun_argv(np, cluster_cidr, oob_ports, btl_ports, ssh_port, workdir, env_names=(),
                run_dir=DEFAULT_RUN_DIR, keepalive=(2, 1, 3)):
    """
    Return the ``mpirun`` argv of a job (no shell involved).

    np
        Number of ranks (positive integer).
    cluster_cidr, oob_ports, btl_ports, ssh_port, keepalive
        See :func:`mca_params`.
    workdir
        Absolute working directory of every rank (under ``/data``).
    env_names
        Names of environment variables forwarded to the ranks with ``-x``.
    run_dir
        See :func:`ssh_args`; the hostfile is ``<run_dir>/hostfile`` and every rank runs
        ``/bin/sh <run_dir>/program`` (:func:`program_script_text`).
    """
    if isinstance(np, bool) or not isinstance(np, int) or np < 1:
        raise ValueError(f"np must be a positive integer, got {np!r}")
    _check_abs_path(workdir, "workdir")
    if isinstance(env_names, str):
        raise ValueError("env_names must be a list of variable names, not a string")
    env_names = list(env_names)
    for name in env_names:
        if not isinstance(name, str) or not _ENV_RE.match(name):
            raise ValueError(f"environment variable name {name!r} is not valid")
    params = mca_params(cluster_cidr, oob_ports, btl_ports, ssh_port, run_dir, keepalive)
    argv = ["mpirun", "--hostfile", f"{run_dir}/hostfile", "-np", str(np), "--wdir", workdir]
    for name, value in params:
        argv += ["--mca", name, value]
    for name in env_names:
        argv += ["-x", name]
    return argv + ["/bin/sh", f"{run_dir}/program"]


def launcher_argv(stdout_path, stderr_path, np, cluster_cidr, oob_ports, btl_ports, ssh_port,
                  workdir, env_names=(), run_dir=DEFAULT_RUN_DIR,
                  keepalive=(2, 1, 3)):
    """
    Return the launcher container's command: ``/bin/sh -c <fixed script> sh ...``.

    stdout_path, stderr_path
        Absolute paths (in the job directory under ``/data``) that receive mpirun's
        standard output and error.
    np, cluster_cidr, oob_ports, btl_ports, ssh_port, workdir, env_names, run_dir,
    keepalive
        See :func:`mpirun_argv`.

    The script is a constant (:data:`LAUNCHER_SCRIPT`); the paths and the whole mpirun
    argv arrive as positional parameters, so no user string is parsed by a shell. The
    script ``exec``\\ s mpirun, so the container's exit code is mpirun's.
    """
    _check_abs_path(stdout_path, "stdout_path")
    _check_abs_path(stderr_path, "stderr_path")
    if stdout_path == stderr_path:
        raise ValueError("stdout_path and stderr_path must differ")
    mpirun = mpirun_argv(np, cluster_cidr, oob_ports, btl_ports, ssh_port, workdir, env_names,
                         run_dir, keepalive)
    return ["/bin/sh", "-c", LAUNCHER_SCRIPT, "sh", stdout_path, stderr_path] + mpirun


# ---------------------------------------------------------------------- failure parse

# Open MPI 4.1.4 help messages (orte/tools/orterun/help-orterun.txt, help-mpi-api.txt),
# as captured from real runs in tests/unit/dmpi/data/mpirun/. mpirun wraps some of them at
# fixed columns, so whitespace between words is matched loosely.
# Numbers are ASCII and bounded ([0-9]{1,9}): the text is the job's, and a rank of 5000
# digits, or Unicode digits, must make the verdict vaguer, never raise.
_RE_SIGNAL = re.compile(
    r"mpirun noticed that process rank (?P<rank>[0-9]{1,9}) with PID [0-9]{1,12} on node "
    r"\S{1,255}\s{1,80}exited on signal (?P<signal>[0-9]{1,3})(?: \((?P<name>[^)\n]{0,40})\))?\."
)
_RE_EXIT = re.compile(
    r"mpirun detected that one or more processes exited with non-zero status,\s{1,80}"
    r"thus causing\s{1,80}the job to be terminated\. The first process to do so was:\s{1,80}"
    r"Process name:\s{1,80}\[\[[0-9]{1,12},[0-9]{1,12}\],(?P<rank>[0-9]{1,9})\]\s{1,80}"
    r"Exit code:\s{1,80}(?P<code>[0-9]{1,9})\b"
)
_RE_ABORT = re.compile(
    r"MPI_ABORT was invoked on rank (?P<rank>[0-9]{1,9}) in communicator \S{1,255}\s{1,80}"
    r"with errorcode (?P<code>-?[0-9]{1,10})\."
)


def _signal_name(number, text):
    try:
        return _signal.Signals(number).name
    except ValueError:
        return text or f"SIG{number}"


def parse_mpirun_failure(stderr_text):
    """
    Find which rank made an Open MPI 4.1 job fail, from mpirun's standard error.

    stderr_text
        mpirun's standard error (str). It may hold the ranks' own standard error too.

    Returns ``{"rank": int, "exit_code": int}`` when a rank exited non-zero or called
    ``MPI_Abort`` (the abort's error code), ``{"rank": int, "signal": int,
    "signal_name": str}`` when a rank died on a signal (``signal_name`` like
    ``"SIGSEGV"``), or ``None`` when no such message is present: success, or a failure
    that is not a rank's (lost daemon, program not found, ssh failure). It never raises:
    the text is written by the user's job.

    mpirun prints its verdict after every rank has gone, so the *last* message wins; a
    program that prints look-alike text earlier cannot mask the real one.
    """
    if not isinstance(stderr_text, str):
        return None
    text = stderr_text.replace("\r\n", "\n")
    found = []
    for kind, regex in (("signal", _RE_SIGNAL), ("exit", _RE_EXIT), ("abort", _RE_ABORT)):
        for match in regex.finditer(text):
            found.append((match.start(), kind, match))
    if not found:
        return None
    _, kind, match = max(found, key=lambda item: item[0])
    rank = int(match.group("rank"))
    if kind == "signal":
        number = int(match.group("signal"))
        return {"rank": rank, "signal": number, "signal_name": _signal_name(number, match.group("name"))}
    return {"rank": rank, "exit_code": int(match.group("code"))}
