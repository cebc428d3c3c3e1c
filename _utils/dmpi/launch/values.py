"""
Checks of the values launch text is built from (ports, ranges, paths, ids, names,
public keys, networks): each returns the value normalised or raises ValueError naming
it. Shared by the modules of :mod:`dmpi.launch`.
"""

import ipaddress
import re

from dmpi.contract import ACCOUNT_RE

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
