"""
Users' directories on the shared storage, as a node touches them: made and handed to
the user's own uid, checked before a job starts, and every read or write inside one
(status files, output) done through :mod:`dmpi.node.userfs`, in a child process running as
the user's uid that never follows a link, so a job's symlinks, FIFOs or swapped
directories cannot lead the node anywhere else (and NFS root_squash is no obstacle).
"""

import json
import os
import stat

import dmpi.seal
import dmpi.node.userfs

from dmpi.contract import JOB_ID_RE, JOBS_SUBDIR, USER_RE
from dmpi.errors import NodeError, RequestError, StartFailure
from dmpi.node import checks

OUTPUT_STREAMS = ("stdout", "stderr")
TAIL_BYTES = 65536
USERFS_TIMEOUT = 10  # seconds any file operation in a user's directory may take


def users_root(storage_path):
    """``<storage>/users``: admin-made, the one path the node may follow."""
    root = os.path.join(checks.check_abs(storage_path, "storage path"), "users")
    if not os.path.isdir(root):
        raise NodeError(
            f"shared storage is not ready: {root} does not exist on this node"
        )
    return root


def userfs(op, uid, gid, **kwargs):
    """Run a :mod:`dmpi.node.userfs` operation in a child process as uid:gid."""
    try:
        return dmpi.node.userfs.run_confined(op, uid=uid, gid=gid, timeout=USERFS_TIMEOUT, **kwargs)
    except Exception as exc:  # pylint: disable=broad-except
        # Whatever a user's tree does to the child ends here, as the node's answer about
        # that path (dmpi.node.userfs.UserPathError, or the child's own failure).
        raise NodeError(str(exc)) from exc


def _user_dir_owner(storage_path, user):
    """(uid, mode) of ``users/<user>`` without following a symlink; None when absent."""
    root_fd = os.open(users_root(storage_path), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fd = os.open(user, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                     dir_fd=root_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise NodeError(f"users/{user} is not a directory: {exc.strerror}") from None
    finally:
        os.close(root_fd)
    try:
        info = os.fstat(fd)
    finally:
        os.close(fd)
    return info.st_uid, stat.S_IMODE(info.st_mode)


def require_user_dir(storage_path, user, uid):
    """A job may start in ``users/<user>`` only when it is the user's and closed to
    others; a :class:`~dmpi.errors.StartFailure` of kind ``user_dir`` otherwise."""
    found = _user_dir_owner(storage_path, user)
    if found is None or found[0] != uid or found[1] & 0o077:
        raise StartFailure(
            "user_dir",
            f"the directory of user {user} is not ready: users/{user} must exist, be owned "
            f"by uid {uid} and be closed to others (found {found})")


def ensure_user_dir(storage_path, user, uid, gid):
    """
    Give a user's directory ``<storage_path>/users/<user>`` to the user's own uid:gid,
    mode 0700, creating it when missing. Never follows a symlink. Run it on the node
    that is root on the shared storage (the NFS server, or any node of a cluster file
    system).

    storage_path
        Where the shared storage is on this host (the NFS export on the server).
    user
        The user's name.
    uid, gid
        The user's own ids (from the master's allocation).

    Returns ``{"created": bool, "changed": bool}``.
    """
    checks.check_user(user)
    uid, gid = checks.check_ids(uid, gid)
    try:
        return dmpi.node.userfs.ensure_owned_dir(users_root(storage_path), user, uid, gid, 0o700)
    except NodeError:
        raise
    except Exception as exc:  # pylint: disable=broad-except
        raise NodeError(f"cannot prepare users/{user}: {exc}") from exc


def prune_job_dirs(storage_path, user, uid, gid, older_than, keep=None):
    """
    Remove a user's job directories (``users/<user>/mpi-jobs/<job id>``) of jobs
    submitted before ``older_than`` in which nothing changed since, except the jobs in
    ``keep`` (queued or running). Runs as the user's uid and never follows a link
    (``dmpi.node.userfs.prune_job_dirs``). Run it on the host that owns the shared storage.

    storage_path
        Where the shared storage is on this host.
    user, uid, gid
        The user and their own ids.
    older_than
        Unix time.
    keep
        Job ids whose directories stay.

    Returns the job ids whose directories were removed.
    """
    checks.check_user(user)
    uid, gid = checks.check_ids(uid, gid)
    try:
        older_than = float(older_than)
    except (TypeError, ValueError):
        raise RequestError("older_than must be a Unix time") from None
    keep = [str(job_id) for job_id in keep or []]
    if not all(JOB_ID_RE.match(job_id) for job_id in keep):
        raise RequestError("keep must be a list of job ids")
    return userfs("prune_job_dirs", uid, gid, root=users_root(storage_path),
                  parts=[user, JOBS_SUBDIR], older_than=older_than, keep=keep)


def migrate_user_dir(storage_path, user, from_uid, uid, gid):
    """
    Hand a directory tree that the old shared guest uid owned to the user's own uid:
    every entry of ``users/<user>`` owned by ``from_uid`` (never following a symlink)
    changes owner, then the directory is closed to others (0700).
    """
    checks.check_user(user)
    uid, gid = checks.check_ids(uid, gid)
    from_uid, _ = checks.check_ids(from_uid, gid)
    root = users_root(storage_path)
    try:
        changed = dmpi.node.userfs.chown_tree(root, user, from_uid, uid, gid)
        result = dmpi.node.userfs.ensure_owned_dir(root, user, uid, gid, 0o700)
    except Exception as exc:  # pylint: disable=broad-except
        raise NodeError(f"cannot migrate users/{user}: {exc}") from exc
    return {"entries_changed": changed, **result}


def user_dirs(storage_path):
    """
    List the user directories on the shared storage: ``{name: {"uid": owner, "mode":
    "0700"}}`` (entries that are not directories, or not valid user names, are left out).
    """
    root = users_root(storage_path)
    found = {}
    for name in os.listdir(root):
        if not USER_RE.match(name):
            continue
        info = os.lstat(os.path.join(root, name))
        if stat.S_ISDIR(info.st_mode):
            found[name] = {"uid": info.st_uid, "mode": f"{stat.S_IMODE(info.st_mode):04o}"}
    return found


def write_status(job_id, storage_path, user, uid, gid, status):
    """
    Write a job's status record as ``status.json`` in its output directory, as the
    job's uid, without following anything the job put there.
    """
    checks.check_job_id(job_id)
    checks.check_user(user)
    uid, gid = checks.check_ids(uid, gid)
    text = json.dumps(status, indent=2, sort_keys=True) + "\n"
    userfs("write_file", uid, gid, root=users_root(storage_path),
           parts=[user, JOBS_SUBDIR, job_id], name="status.json", data=text.encode())
    return True


def room(storage_path, user, uid, gid):
    """Free and total bytes where the user's directory is (its quota's, where the
    storage answers per directory), read as the user's uid."""
    return userfs("room", uid, gid, root=users_root(storage_path), parts=[user])


def read_tail(storage_path, user, uid, gid, job_id, stream, tail_bytes, offset=None):
    """Bytes of a job's output file, read as the job's uid."""
    return userfs("read_tail", uid, gid, root=users_root(storage_path),
                  parts=[user, JOBS_SUBDIR, job_id], name=stream, max_bytes=tail_bytes,
                  offset=offset)


def _whole_characters(data):
    """``data`` without a UTF-8 character cut off at its end (the follower reads it next)."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte < 0x80:
            return data
        if byte >= 0xC0:  # the lead byte of the last character
            length = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return data if length <= back else data[:-back]
    return data


def read_output(job_id, storage_path, user, uid, gid, stream="stdout", tail_bytes=None,
                offset=None, seal_to=None):
    """
    Return the tail of a job's standard output or standard error (text); with
    ``offset``, ``{"data": text, "offset": where to read next}`` from that byte on (at
    most ``tail_bytes``), for following a running job.

    job_id
        The job id.
    storage_path
        Where the shared storage is on this node.
    user, uid, gid
        Whose job it is; the file is read as that uid.
    stream
        ``stdout`` or ``stderr``.
    tail_bytes
        At most this many bytes from the end of the file (default 64 KiB).
    seal_to
        The master's public key file: the answer is sealed to it (:mod:`dmpi.seal`), so
        the user's output is not in the master's job cache or on its event bus.
    """
    checks.check_job_id(job_id)
    checks.check_user(user)
    uid, gid = checks.check_ids(uid, gid)
    if stream not in OUTPUT_STREAMS:
        raise RequestError(f"stream must be one of {OUTPUT_STREAMS}, got {stream!r}")
    try:
        tail_bytes = TAIL_BYTES if tail_bytes is None else int(tail_bytes)
    except (TypeError, ValueError):
        raise RequestError(f"tail_bytes must be an integer, got {tail_bytes!r}") from None
    if not 1 <= tail_bytes <= 16 << 20:
        raise RequestError(f"tail_bytes must be between 1 and 16 MiB, got {tail_bytes}")
    if offset is not None and (isinstance(offset, bool) or not isinstance(offset, int)
                               or offset < 0):
        raise RequestError(f"offset must be a non-negative integer, got {offset!r}")
    try:
        data = read_tail(storage_path, user, uid, gid, job_id, stream, tail_bytes, offset)
        if offset is None:
            answer = data.decode(errors="replace")
        else:
            data = _whole_characters(data)
            answer = {"data": data.decode(errors="replace"), "offset": offset + len(data)}
    except NodeError as exc:
        raise NodeError(f"cannot read the {stream} of job {job_id}: {exc}") from exc
    if seal_to is None:
        return answer
    try:
        return dmpi.seal.seal(seal_to, json.dumps(answer).encode())
    except OSError as exc:
        raise NodeError(f"cannot seal the output to the master's key: {exc}") from exc
