"""
Checks of the values launch text is built from (ports, ranges, paths, ids, names,
public keys, networks): each returns the value normalised or raises ValueError naming
it. Shared by the modules of :mod:`dmpi.launch`.
"""

import ipaddress
import re
import signal

from dmpi.contract import ACCOUNT_RE

_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
_PUBKEY_RE = re.compile(r"^(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(256|384|521)) [A-Za-z0-9+/]+=*( \S+)?$")


def check_port(value, what):
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what} must be an integer, got {value!r}")
    if not 1024 <= value <= 65535:
        raise ValueError(f"{what} must be between 1024 and 65535, got {value}")
    return value


def check_range(value, what):
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
    check_port(low, f"{what} low end")
    check_port(high, f"{what} high end")
    if low > high:
        raise ValueError(f"{what} is empty: {low} > {high}")
    return low, high


def check_abs_path(value, what):
    if not isinstance(value, str) or not value.startswith("/"):
        raise ValueError(f"{what} must be an absolute path, got {value!r}")
    if any(c in value for c in "\n\0") or any(c.isspace() for c in value):
        raise ValueError(f"{what} must not contain whitespace or NUL, got {value!r}")
    return value


def check_id(value, what):
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 2**31 - 2:
        raise ValueError(f"{what} must be a positive integer (not root), got {value!r}")
    return value


def check_name(value, what):
    if not isinstance(value, str) or not ACCOUNT_RE.match(value):
        raise ValueError(
            f"{what} must be a lowercase POSIX name (letters, digits, '_', '-', "
            f"at most 32 characters), got {value!r}"
        )
    return value


def check_pubkey(line, what):
    if not isinstance(line, str):
        raise ValueError(f"{what} must be a string, got {line!r}")
    line = line.strip()
    if not _PUBKEY_RE.fullmatch(line):
        raise ValueError(f"{what} is not an OpenSSH public key line: {line[:60]!r}")
    return line


def check_cidr(value):
    if not isinstance(value, str) or "/" not in value:
        raise ValueError(f"cluster CIDR must be a network like '10.197.1.0/24', got {value!r}")
    try:
        net = ipaddress.ip_network(value, strict=True)
    except ValueError as exc:
        raise ValueError(f"cluster CIDR {value!r} is not a network: {exc}") from None
    if net.version != 4:
        raise ValueError(f"cluster CIDR must be IPv4, got {value!r}")
    return str(net)


def check_oob_and_ssh_ports(oob_ports, ssh_port):
    """The OOB range ``(low, high)``, which must not hold the job's ssh port."""
    oob_low, oob_high = check_range(oob_ports, "OOB port range")
    check_port(ssh_port, "ssh port")
    if oob_low <= ssh_port <= oob_high:
        raise ValueError(f"ssh port {ssh_port} lies inside the OOB port range")
    return oob_low, oob_high


def check_job_ports(oob_ports, btl_ports, ssh_port):
    """The job's port ranges, apart: ``((oob low, high), (btl low, high))``; the
    launcher's and daemons' (OOB) and the ranks' (BTL) ranges may not overlap, nor hold
    the job's ssh port."""
    check_port(ssh_port, "ssh port")
    oob_low, oob_high = check_range(oob_ports, "OOB port range")
    btl_low, btl_high = check_range(btl_ports, "BTL port range")
    if not (oob_high < btl_low or btl_high < oob_low):
        raise ValueError(f"OOB ports {oob_low}-{oob_high} overlap BTL ports {btl_low}-{btl_high}")
    if oob_low <= ssh_port <= oob_high or btl_low <= ssh_port <= btl_high:
        raise ValueError(f"ssh port {ssh_port} lies inside the OOB or BTL port range")
    return (oob_low, oob_high), (btl_low, btl_high)


def check_keepalive(keepalive):
    """``(time, intvl, probes)`` of a TCP keepalive, each a positive whole number."""
    try:
        ka_time, ka_intvl, ka_probes = keepalive
    except (TypeError, ValueError):
        raise ValueError(f"keepalive must be (time, intvl, probes), got {keepalive!r}") from None
    for value in (ka_time, ka_intvl, ka_probes):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"keepalive values must be positive integers, got {keepalive!r}")
    return ka_time, ka_intvl, ka_probes


def check_ranks(np, workdir, env_names, launcher, default):
    """What every launcher's command line takes: ``np`` ranks (a positive whole
    number), their absolute ``workdir``, the ``env_names`` forwarded to them (returned as
    a list) and the ``launcher``, ``default`` (found on PATH) or an absolute path."""
    if launcher != default:
        check_abs_path(launcher, "launcher")
    if isinstance(np, bool) or not isinstance(np, int) or np < 1:
        raise ValueError(f"np must be a positive integer, got {np!r}")
    check_abs_path(workdir, "workdir")
    if isinstance(env_names, str):
        raise ValueError("env_names must be a list of variable names, not a string")
    env_names = list(env_names)
    for name in env_names:
        if not isinstance(name, str) or not _ENV_NAME_RE.match(name):
            raise ValueError(f"environment variable name {name!r} is not valid")
    return env_names


def check_output_paths(stdout_path, stderr_path):
    """The launcher's standard output and error files: absolute, and two."""
    check_abs_path(stdout_path, "stdout_path")
    check_abs_path(stderr_path, "stderr_path")
    if stdout_path == stderr_path:
        raise ValueError("stdout_path and stderr_path must differ")


def status_failure(status):
    """What a shell's exit status says of the program it ran, as a failure's fields:
    ``{"signal": n, "signal_name": ...}`` for 129-192 (128 + the signal that killed
    it), ``{"exit_code": status}`` for any other non-zero status, None for 0."""
    if 128 < status < 128 + 65:
        return {"signal": status - 128, "signal_name": signal_name(status - 128)}
    return {"exit_code": status} if status else None


def signal_name(number, text=None):
    """``SIGSEGV`` for 11; for a number no signal has, ``text`` (the MPI's own word) or
    ``SIG<number>``."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return text or f"SIG{number}"
