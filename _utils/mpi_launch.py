"""
Text and argv builders for launching one MPI job in DockerMPI containers.

Shared by the master-side ``mpi`` runner and the node-side execution module. Everything
here is pure: functions take plain values, validate them, and return text or argv lists.
Nothing touches the file system, runs a process or imports Salt.

A job runs like this on each chosen node: a *worker* container (the job image, run as the
job's user's own uid:gid with every capability dropped) runs ``sshd -D -e -f /run/dockermpi/sshd_config``
on a per-job port. The read-only per-job directory ``/run/dockermpi`` holds the files built
here: the user key pair, the host key, ``authorized_keys``, ``known_hosts``, ``sshd_config``,
``hostfile`` and the ``passwd``/``group`` files that are bind-mounted over ``/etc/passwd``
and ``/etc/group``. A *launcher* container on the first node runs :func:`launcher_argv`:
``mpirun`` over ssh to the workers, with its output redirected into the job directory.

Key files must be owned by the job's uid and have mode 0600: sshd and ssh refuse a key
that is readable by others, and cannot read one owned by root with mode 0600.

:depends: cryptography (only for :func:`generate_ed25519_keypair`)
"""

import ipaddress
import re
import shlex
import signal as _signal

__all__ = [
    "DEFAULT_RUN_DIR",
    "DEFAULT_HOST_KEY_ALIAS",
    "generate_ed25519_keypair",
    "sshd_config_text",
    "authorized_keys_text",
    "known_hosts_text",
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
DEFAULT_RUN_DIR = "/run/dockermpi"
#: Name under which the per-job host key is looked up in ``known_hosts``.
DEFAULT_HOST_KEY_ALIAS = "dockermpi-job"

_NAME_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}\Z")
_ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
_ALIAS_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}\Z")
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
    if not isinstance(value, str) or not _NAME_RE.match(value):
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
        Where the per-job directory is mounted; the host key is ``<run_dir>/ssh_host_key``
        and the authorized keys ``<run_dir>/authorized_keys``.
    listen_address
        Optional IPv4 address to bind (the node's cluster address); default all.

    sshd runs as the job's uid, so there is no privilege separation, no PAM, no pid
    file and no login records; only public-key login of ``user`` is allowed and all
    forwarding is off.
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
        f"HostKey {run_dir}/ssh_host_key",
        f"AuthorizedKeysFile {run_dir}/authorized_keys",
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


def authorized_keys_text(public_lines):
    """
    Return ``authorized_keys`` text for the job's user key(s).

    public_lines
        One OpenSSH public key line, or a list of them.

    Each key gets the ``restrict`` option (no pty, no forwarding, no ``~/.ssh/rc``):
    Open MPI only runs ``orted`` through ssh.
    """
    if isinstance(public_lines, str):
        public_lines = [public_lines]
    if not public_lines:
        raise ValueError("authorized_keys needs at least one public key")
    out = [f"restrict {_check_pubkey(line, 'public key')}" for line in public_lines]
    return "\n".join(out) + "\n"


def known_hosts_text(host_public_line, alias=DEFAULT_HOST_KEY_ALIAS):
    """
    Return ``known_hosts`` text naming the per-job host key under ``alias``.

    host_public_line
        The host key's OpenSSH public line (a trailing comment is dropped).
    alias
        The ``HostKeyAlias`` ssh uses for every worker of the job (all workers share
        one per-job host key, so one line covers every node and port).
    """
    line = _check_pubkey(host_public_line, "host public key")
    if not isinstance(alias, str) or not _ALIAS_RE.match(alias):
        raise ValueError(f"host key alias must be a simple host-like name, got {alias!r}")
    keytype, blob = line.split()[:2]
    return f"{alias} {keytype} {blob}\n"


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


def ssh_args(ssh_port, run_dir=DEFAULT_RUN_DIR, alias=DEFAULT_HOST_KEY_ALIAS):
    """
    Return the ssh options (a list) Open MPI passes when it starts ``orted`` on workers.

    ssh_port
        The workers' sshd port.
    run_dir
        Where the per-job directory (``id_ed25519``, ``known_hosts``) is mounted.
    alias
        ``HostKeyAlias`` matching :func:`known_hosts_text`.

    Open MPI splits ``plm_rsh_args`` on spaces, so no element may contain whitespace.
    """
    _check_port(ssh_port, "ssh port")
    _check_abs_path(run_dir, "run_dir")
    if not isinstance(alias, str) or not _ALIAS_RE.match(alias):
        raise ValueError(f"host key alias must be a simple host-like name, got {alias!r}")
    return [
        "-F", "/dev/null",
        "-p", str(ssh_port),
        "-i", f"{run_dir}/id_ed25519",
        "-o", "IdentitiesOnly=yes",
        "-o", "BatchMode=yes",
        "-o", "StrictHostKeyChecking=yes",
        "-o", f"HostKeyAlias={alias}",
        "-o", f"UserKnownHostsFile={run_dir}/known_hosts",
        "-o", "GlobalKnownHostsFile=/dev/null",
        "-o", "UpdateHostKeys=no",
        "-o", "ConnectTimeout=10",
        "-o", "ServerAliveInterval=5",
        "-o", "ServerAliveCountMax=3",
        "-o", "LogLevel=ERROR",
    ]


def mca_params(cluster_cidr, oob_ports, btl_ports, ssh_port, run_dir=DEFAULT_RUN_DIR,
               alias=DEFAULT_HOST_KEY_ALIAS, keepalive=(2, 1, 3)):
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
    ssh_port, run_dir, alias
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
        ("plm_rsh_args", " ".join(ssh_args(ssh_port, run_dir, alias))),
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
                run_dir=DEFAULT_RUN_DIR, alias=DEFAULT_HOST_KEY_ALIAS, keepalive=(2, 1, 3)):
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
    run_dir, alias
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
    params = mca_params(cluster_cidr, oob_ports, btl_ports, ssh_port, run_dir, alias, keepalive)
    argv = ["mpirun", "--hostfile", f"{run_dir}/hostfile", "-np", str(np), "--wdir", workdir]
    for name, value in params:
        argv += ["--mca", name, value]
    for name in env_names:
        argv += ["-x", name]
    return argv + ["/bin/sh", f"{run_dir}/program"]


def launcher_argv(stdout_path, stderr_path, np, cluster_cidr, oob_ports, btl_ports, ssh_port,
                  workdir, env_names=(), run_dir=DEFAULT_RUN_DIR, alias=DEFAULT_HOST_KEY_ALIAS,
                  keepalive=(2, 1, 3)):
    """
    Return the launcher container's command: ``/bin/sh -c <fixed script> sh ...``.

    stdout_path, stderr_path
        Absolute paths (in the job directory under ``/data``) that receive mpirun's
        standard output and error.
    np, cluster_cidr, oob_ports, btl_ports, ssh_port, workdir, env_names, run_dir, alias,
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
                         run_dir, alias, keepalive)
    return ["/bin/sh", "-c", LAUNCHER_SCRIPT, "sh", stdout_path, stderr_path] + mpirun


# ---------------------------------------------------------------------- failure parse

# Open MPI 4.1.4 help messages (orte/tools/orterun/help-orterun.txt, help-mpi-api.txt),
# as captured from real runs in tests/unit/data/mpirun/. mpirun wraps some of them at
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
