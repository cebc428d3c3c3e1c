"""
Arguments the master sends a node, checked before the node acts on them: each check
returns the value normalised or raises :class:`~dmpi.errors.RequestError` naming it.
"""

import ipaddress
import os

from dmpi.contract import JOB_ID_RE, USER_RE
from dmpi.errors import RequestError


def check_job_id(job_id):
    if not isinstance(job_id, str) or not JOB_ID_RE.match(job_id):
        raise RequestError(f"invalid job id {job_id!r}")


def check_user(user):
    if not isinstance(user, str) or not USER_RE.match(user):
        raise RequestError(f"invalid user name {user!r}")


def check_ids(uid, gid):
    """The job's uid and gid as ints; never root's."""
    try:
        uid, gid = int(uid), int(gid)
    except (TypeError, ValueError):
        raise RequestError(f"uid and gid must be numbers, got {uid!r}, {gid!r}") from None
    if uid <= 0 or gid <= 0:
        raise RequestError("a job's uid and gid must not be root's")
    return uid, gid


def check_abs(path, what):
    if not isinstance(path, str) or not os.path.isabs(path):
        raise RequestError(f"{what} must be an absolute path, got {path!r}")
    return path


def check_ipv4(value, what):
    try:
        return str(ipaddress.IPv4Address(value))
    except (ipaddress.AddressValueError, ValueError, TypeError):
        raise RequestError(f"{what} must be an IPv4 address, got {value!r}") from None


def check_ipv4_network(value, what):
    try:
        return str(ipaddress.IPv4Network(value, strict=True))
    except (ipaddress.AddressValueError, ipaddress.NetmaskValueError, ValueError,
            TypeError):
        raise RequestError(
            f"{what} must be an IPv4 network in CIDR form, got {value!r}") from None
