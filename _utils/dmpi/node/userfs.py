"""
File operations inside a user's storage directory, safe against the user's own jobs.

Job containers run as the user's uid and mount ``<storage>/users/<user>`` read-write, so
everything below that directory is hostile: any component may be a symbolic link (to
another user's files, or a chain of a thousand links), a FIFO, a socket, a directory
where a file belongs, a huge sparse file, or may be swapped between a check and a use.
The node still has to create job directories there, write ``status.json`` and read the
tail of a job's output.

Escape is impossible by construction: only ``root`` (an absolute directory the admin
controls) is opened by path. Every component below it is opened relative to its
parent's file descriptor with ``O_NOFOLLOW`` (and ``O_DIRECTORY`` for directories), so
a symbolic link is never followed and no path string is ever joined and then checked.
As defence in depth, :func:`run_confined` runs ``makedirs``, ``write_file`` and
``read_tail`` in a child process with the user's uid and gid and no supplementary
groups, so the kernel's permission checks apply as well (and NFS ``root_squash`` works).
``ensure_owned_dir`` and ``chown_tree`` need root and run in the caller's process.

Every problem with a user path or its content raises :class:`UserPathError`, whose
message names the path relative to ``root``. Bad arguments from the caller (a ``parts``
that is not a list, a ``max_bytes`` out of range) raise ``TypeError`` or ``ValueError``.

This file is both a module of the node's library (``dmpi.node.userfs.write_file`` ...)
and the whole program the confined child runs (this file compiled by the caller, with a
JSON request on stdin), so it imports nothing but the standard library. The child is
started for every read of a job's output, so at the top it imports only what the child
itself runs; what only the caller or a rare operation needs is imported where it is used.

:depends: none
"""

import binascii
import contextlib
import errno
import json
import marshal
import os
import posixpath
import re
import stat
import sys
import time

__all__ = [
    "MAX_TAIL_BYTES",
    "MAX_TREE_DEPTH",
    "CONFINED_OPS",
    "UserPathError",
    "check_component",
    "makedirs",
    "write_file",
    "read_tail",
    "room",
    "ensure_owned_dir",
    "chown_tree",
    "run_confined",
    "prune_job_dirs",
    "CHILD_PYTHON",
]

#: Largest tail :func:`read_tail` returns.
MAX_TAIL_BYTES = 16 * 1024 * 1024
#: Deepest tree :func:`chown_tree` walks; it holds one descriptor per level.
MAX_TREE_DEPTH = 256
#: Operations :func:`run_confined` accepts; the others need root.
CONFINED_OPS = frozenset({"makedirs", "write_file", "read_tail", "room", "prune_job_dirs"})
#: Interpreter of the confined child; the target uid must be able to execute it, and it
#: must be the caller's own Python, as the child runs code the caller compiled.
CHILD_PYTHON = sys.executable

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO neither blocks nor waits for a writer.
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_NAME_MAX = 255

# The child's reply: a read_tail result in base64 plus room for the JSON around it.
_STDOUT_LIMIT = 4 * (MAX_TAIL_BYTES // 3 + 1) + 64 * 1024
_STDERR_TAIL = 2000
_BYTES_TAG = "base64"

_REASONS = {
    errno.ELOOP: "is a symbolic link, which is never followed",
    errno.ENOTDIR: "is not a directory",
    errno.EISDIR: "is a directory",
    errno.ENXIO: "is a socket or a device, not a regular file",
    errno.ENOENT: "does not exist",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.ENAMETOOLONG: "name too long",
    errno.EMFILE: "too many open files",
}


class UserPathError(Exception):
    """A user path or its content is unusable: a symbolic link, the wrong file type,
    too large, not permitted, or the confined child failed."""


def _kind(st_mode):
    """What a file is, in words, from its ``st_mode``."""
    for test, words in (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(st_mode):
            return words
    return "of an unknown type"


def _error(shown, exc, dir_fd=None, name=None):
    """A UserPathError for an OSError on ``shown`` (a path relative to root).

    With ``dir_fd`` and ``name``, a wrong-type error says what the entry actually is
    (``O_DIRECTORY|O_NOFOLLOW`` reports a link as ENOTDIR)."""
    reason = _REASONS.get(exc.errno) or exc.strerror or str(exc)
    expected = {errno.ENOTDIR: "a directory", errno.ENXIO: "a regular file"}.get(exc.errno)
    if dir_fd is not None and (expected or exc.errno == errno.ELOOP):
        try:
            found = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            found = None
        if found is None:
            pass
        elif stat.S_ISLNK(found.st_mode):
            reason = _REASONS[errno.ELOOP]
        elif expected and _kind(found.st_mode) == expected:
            reason = "was replaced while being opened"
        elif expected:
            reason = f"is {_kind(found.st_mode)}, not {expected}"
    return UserPathError(f"{shown or '.'}: {reason}")


def check_component(name):
    """
    Check that ``name`` is one path component and return it.

    name
        A str, non-empty, at most 255 bytes in UTF-8, without ``/`` or NUL, and not
        ``.`` or ``..``.

    Raises :class:`UserPathError` saying what is wrong.

    Example (utils are called from other modules, not the CLI):

    .. code-block:: python

        dmpi.node.userfs.check_component("status.json")
    """
    if not isinstance(name, str):
        raise UserPathError(f"path component {name!r} is not a string")
    if name in ("", ".", ".."):
        raise UserPathError(f"path component {name!r} is empty, '.' or '..'")
    if "/" in name or "\0" in name:
        raise UserPathError(f"path component {name!r} contains '/' or NUL")
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        raise UserPathError(f"path component {name!r} is not valid UTF-8") from None
    if size > _NAME_MAX:
        raise UserPathError(f"path component {name[:40]!r}... is longer than {_NAME_MAX} bytes")
    return name


def _check_parts(parts):
    if not isinstance(parts, (list, tuple)):
        raise TypeError(f"parts must be a list of path components, not {type(parts).__name__}")
    return [check_component(part) for part in parts]


def _open_root(root):
    """A descriptor of ``root``, which the admin controls, so it may be followed."""
    if not isinstance(root, str):
        raise TypeError(f"root must be a str, not {type(root).__name__}")
    if not os.path.isabs(root):
        raise ValueError(f"root must be an absolute path, not {root!r}")
    try:
        # O_PATH: users/ is 0711, so a user's uid may pass through it but not list it.
        return os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise UserPathError(f"root {root}: {_REASONS.get(exc.errno) or exc.strerror}") from None


def _open_dir(parent_fd, name, shown):
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except OSError as exc:
        raise _error(shown, exc, parent_fd, name) from None


@contextlib.contextmanager
def _directory(root, parts, create=False, mode=0o700):
    """
    Yield ``(fd, shown)``: a descriptor of ``root/parts...`` and that path relative to
    root. Each component is opened relative to its parent and never followed; with
    ``create``, a missing one is made first. At most two descriptors are open at once.
    """
    parts = _check_parts(parts)
    fd = _open_root(root)
    try:
        shown = ""
        for part in parts:
            shown = posixpath.join(shown, part)
            if create:
                try:
                    os.mkdir(part, mode, dir_fd=fd)
                except FileExistsError:
                    pass  # a directory, or something the open below refuses
                except OSError as exc:
                    raise _error(shown, exc) from None
            child = _open_dir(fd, part, shown)
            parent, fd = fd, child
            os.close(parent)
        yield fd, shown
    finally:
        os.close(fd)


def makedirs(root, parts, mode=0o700):
    """
    Create the directories ``root/parts[0]/parts[1]/...`` that are missing.

    root
        Absolute path of a directory the admin controls, e.g. ``/srv/dockermpi/users``;
        it is the only path that may be (or contain) a symbolic link.
    parts
        List of path components below root (see :func:`check_component`).
    mode
        Mode of the directories created, less the process umask, as ``os.mkdir``.

    Raises :class:`UserPathError` when a component is a symbolic link or not a directory,
    or cannot be created.

    Example:

    .. code-block:: python

        dmpi.node.userfs.makedirs("/srv/dockermpi/users", ["alice", "mpi-jobs", job_id])
    """
    with _directory(root, parts, create=True, mode=mode):
        pass


def _temp_name(name):
    # A random name: a FIFO or link planted under a predictable name is never opened.
    token = os.urandom(8).hex()
    temp = f".{name}.{token}.tmp"
    if len(temp.encode("utf-8")) > _NAME_MAX:
        temp = f".{token}.tmp"
    return temp


def write_file(root, parts, name, data, mode=0o644):
    """
    Write ``data`` atomically to ``root/parts.../name``, creating missing directories.

    The data goes to a new temporary file with a random name in the same directory,
    is flushed to disk, then renamed over ``name``. The rename replaces a symbolic link
    or FIFO at ``name`` without following or opening it.

    root
        Absolute path of a directory the admin controls.
    parts
        List of path components of the directory below root; missing ones are created
        with mode 0700 (less the umask).
    name
        File name (see :func:`check_component`).
    data
        The content, bytes.
    mode
        Mode of the file, exactly (the umask does not apply).

    Raises :class:`UserPathError` when a directory component is a symbolic link or not a
    directory, when ``name`` is a directory, or when writing fails; the temporary file
    is removed then.

    Example:

    .. code-block:: python

        dmpi.node.userfs.write_file(
            "/srv/dockermpi/users", ["alice", "mpi-jobs", job_id], "status.json", b"{}"
        )
    """
    check_component(name)
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"data must be bytes, not {type(data).__name__}")
    with _directory(root, parts, create=True) as (dir_fd, shown):
        target = posixpath.join(shown, name)
        temp = _temp_name(name)
        try:
            fd = os.open(temp, _TEMP_FLAGS, 0o600, dir_fd=dir_fd)
        except OSError as exc:
            raise _error(target, exc) from None
        renamed = False
        try:
            try:
                os.fchmod(fd, mode)
                pending = memoryview(data).cast("B")
                while pending:
                    pending = pending[os.write(fd, pending):]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            renamed = True
            os.fsync(dir_fd)  # the rename itself survives a crash
        except OSError as exc:
            raise _error(target, exc) from None
        finally:
            if not renamed:
                with contextlib.suppress(OSError):
                    os.unlink(temp, dir_fd=dir_fd)


def room(root, parts):
    """``{"bytes_free", "bytes_total"}`` of the file system (or the quota: GlusterFS with
    ``quota-deem-statfs`` answers a directory's own) holding ``root/parts...``, as its
    owner may write; nothing is followed or created."""
    with _directory(root, parts) as (fd, shown):
        try:
            found = os.fstatvfs(fd)
        except OSError as exc:
            raise _error(shown, exc) from None
    return {"bytes_free": found.f_bavail * found.f_frsize,
            "bytes_total": found.f_blocks * found.f_frsize}


def read_tail(root, parts, name, max_bytes, offset=None):
    """
    Return the last ``max_bytes`` bytes of the regular file ``root/parts.../name``; with
    ``offset``, at most ``max_bytes`` from there on instead (what a follower reads next;
    nothing past the end).

    Only the tail is read (with ``pread``), so a huge sparse file costs nothing. A FIFO,
    socket or device is refused without blocking.

    root
        Absolute path of a directory the admin controls.
    parts
        List of path components of the directory below root; nothing is created.
    name
        File name (see :func:`check_component`).
    max_bytes
        A positive int, at most 16 MiB.

    Raises :class:`UserPathError` when a component is a symbolic link or missing, or
    ``name`` is not a regular file or cannot be read.

    Example:

    .. code-block:: python

        dmpi.node.userfs.read_tail(
            "/srv/dockermpi/users", ["alice", "mpi-jobs", job_id], "stderr", 65536
        )
    """
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int):
        raise TypeError(f"max_bytes must be an int, not {type(max_bytes).__name__}")
    if not 0 < max_bytes <= MAX_TAIL_BYTES:
        raise ValueError(f"max_bytes must be between 1 and {MAX_TAIL_BYTES}, not {max_bytes}")
    if offset is not None and (isinstance(offset, bool) or not isinstance(offset, int)
                               or offset < 0):
        raise ValueError(f"offset must be a non-negative int, not {offset!r}")
    check_component(name)
    with _directory(root, parts) as (dir_fd, shown):
        target = posixpath.join(shown, name)
        try:
            fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
        except OSError as exc:
            raise _error(target, exc, dir_fd, name) from None
        try:
            found = os.fstat(fd)
            if not stat.S_ISREG(found.st_mode):
                raise UserPathError(f"{target}: is {_kind(found.st_mode)}, not a regular file")
            if offset is None:
                offset = max(0, found.st_size - max_bytes)
            end = min(found.st_size, offset + max_bytes)
            chunks = []
            while offset < end:
                chunk = os.pread(fd, end - offset, offset)
                if not chunk:
                    break  # truncated meanwhile
                chunks.append(chunk)
                offset += len(chunk)
            return b"".join(chunks)
        except OSError as exc:
            raise _error(target, exc) from None
        finally:
            os.close(fd)


def _check_id(value, what):
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what} must be a non-negative int, not {value!r}")


def ensure_owned_dir(root, name, uid, gid, mode=0o700):
    """
    Make ``root/name`` a directory owned by ``uid:gid`` with ``mode``; needs root.

    root
        Absolute path of a directory the admin controls, e.g. ``/srv/dockermpi/users``.
    name
        Directory name (see :func:`check_component`), e.g. the user name.
    uid, gid
        Owner and group the directory must have.
    mode
        Permission bits the directory must have.

    Returns ``{"created": bool, "changed": bool}``: whether the directory was made, and
    whether its owner or mode was changed. A symbolic link at ``name`` is never followed:
    it raises :class:`UserPathError`.

    Example:

    .. code-block:: python

        dmpi.node.userfs.ensure_owned_dir("/srv/dockermpi/users", "alice", 2001, 2001)
    """
    check_component(name)
    _check_id(uid, "uid")
    _check_id(gid, "gid")
    root_fd = _open_root(root)
    try:
        try:
            os.mkdir(name, mode, dir_fd=root_fd)
            created = True
        except FileExistsError:
            created = False
        except OSError as exc:
            raise _error(name, exc) from None
        fd = _open_dir(root_fd, name, name)
    finally:
        os.close(root_fd)
    try:
        found = os.fstat(fd)
        changed = False
        if (found.st_uid, found.st_gid) != (uid, gid):
            os.fchown(fd, uid, gid)
            changed = True
        # After fchown: changing the owner may clear set-id bits.
        if stat.S_IMODE(os.fstat(fd).st_mode) != mode:
            os.fchmod(fd, mode)
            changed = True
        return {"created": created, "changed": changed}
    except OSError as exc:
        raise _error(name, exc) from None
    finally:
        os.close(fd)


def chown_tree(root, name, from_uid, to_uid, to_gid):
    """
    Give every entry of the tree ``root/name`` owned by ``from_uid`` to ``to_uid:to_gid``;
    needs root.

    For migrating a user's tree from the shared guest uid to the user's own uid. The
    directory itself and every entry below it whose own uid (``lstat``) is ``from_uid`` are
    changed, symbolic links included (the link, never its target). Subdirectories are
    opened relative to their parent with ``O_NOFOLLOW``, so nothing outside the tree is
    opened or changed, even if the user swaps entries during the walk.

    root
        Absolute path of a directory the admin controls.
    name
        Top directory name (see :func:`check_component`).
    from_uid
        Owner whose entries change.
    to_uid, to_gid
        New owner and group.

    Returns the number of entries changed. Raises :class:`UserPathError` when ``name`` is
    not a directory, a subdirectory is swapped for something else during the walk, or
    the tree is deeper than :data:`MAX_TREE_DEPTH` levels.

    Example:

    .. code-block:: python

        dmpi.node.userfs.chown_tree("/srv/dockermpi/users", "alice", 1500, 2001, 2001)
    """
    check_component(name)
    for value, what in ((from_uid, "from_uid"), (to_uid, "to_uid"), (to_gid, "to_gid")):
        _check_id(value, what)
    root_fd = _open_root(root)
    try:
        top_fd = _open_dir(root_fd, name, name)
    finally:
        os.close(root_fd)
    # An explicit stack instead of os.fwalk: fwalk opens subdirectories without
    # O_NOFOLLOW (as root, that open alone can reach any file or device) and recurses.
    # Each level is [descriptor, path shown, entries not yet visited].
    stack = [[top_fd, name, None]]
    try:
        changed = 0
        try:
            if os.fstat(top_fd).st_uid == from_uid:
                os.fchown(top_fd, to_uid, to_gid)
                changed += 1
        except OSError as exc:
            raise _error(name, exc) from None
        stack[-1][2] = _listing(top_fd, name)
        while stack:
            dir_fd, shown_dir, entries = stack[-1]
            entry = next(entries, None)
            if entry is None:
                stack.pop()
                os.close(dir_fd)
                continue
            shown = posixpath.join(shown_dir, entry)
            try:
                found = os.stat(entry, dir_fd=dir_fd, follow_symlinks=False)
                if found.st_uid == from_uid:
                    os.chown(entry, to_uid, to_gid, dir_fd=dir_fd, follow_symlinks=False)
                    changed += 1
            except FileNotFoundError:
                continue  # removed meanwhile
            except OSError as exc:
                raise _error(shown, exc) from None
            if stat.S_ISDIR(found.st_mode):
                if len(stack) >= MAX_TREE_DEPTH:
                    raise UserPathError(f"{shown}: tree is deeper than {MAX_TREE_DEPTH} levels")
                stack.append([_open_dir(dir_fd, entry, shown), shown, None])
                stack[-1][2] = _listing(stack[-1][0], shown)
        return changed
    finally:
        for dir_fd, _, _ in stack:
            os.close(dir_fd)


def _remove_tree(parent_fd, name, shown):
    """Remove the directory ``name`` of ``parent_fd`` and everything in it, opening each
    subdirectory relative to its parent with O_NOFOLLOW (a link is removed, never
    followed)."""
    stack = [[_open_dir(parent_fd, name, shown), shown, name, None]]
    stack[-1][3] = _listing(stack[-1][0], shown)
    try:
        while stack:
            dir_fd, shown_dir, _, entries = stack[-1]
            entry = next(entries, None)
            if entry is None:
                stack.pop()
                os.close(dir_fd)
                above = stack[-1][0] if stack else parent_fd
                try:
                    os.rmdir(_name_of(shown_dir), dir_fd=above)
                except OSError as exc:
                    raise _error(shown_dir, exc) from None
                continue
            entry_shown = posixpath.join(shown_dir, entry)
            try:
                found = os.stat(entry, dir_fd=dir_fd, follow_symlinks=False)
                if not stat.S_ISDIR(found.st_mode):
                    os.unlink(entry, dir_fd=dir_fd)
                    continue
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise _error(entry_shown, exc) from None
            if len(stack) >= MAX_TREE_DEPTH:
                raise UserPathError(f"{entry_shown}: tree is deeper than {MAX_TREE_DEPTH} levels")
            stack.append([_open_dir(dir_fd, entry, entry_shown), entry_shown, entry, None])
            stack[-1][3] = _listing(stack[-1][0], entry_shown)
    finally:
        for dir_fd, _, _, _ in stack:
            os.close(dir_fd)


def _name_of(shown):
    return posixpath.basename(shown)


def prune_job_dirs(root, parts, older_than, keep=()):
    """
    Remove the job directories in ``root/parts...`` (a user's ``mpi-jobs``) whose job
    was submitted before ``older_than`` (Unix time, read from the job id) and in which
    nothing changed since (the directory and its entries, by ``lstat``), except those in
    ``keep``. Entries that are not job directories are left alone. Returns the job ids
    removed, sorted.

    Example:

    .. code-block:: python

        dmpi.node.userfs.run_confined(
            "prune_job_dirs", uid=100000, gid=100000, root="/srv/dockermpi/users",
            parts=["alice", "mpi-jobs"], older_than=time.time() - 30 * 86400, keep=[])
    """
    import calendar  # pylint: disable=import-outside-toplevel
    older_than = float(older_than)
    removed = []
    try:
        context = _directory(root, parts)
        dir_fd, shown = context.__enter__()
    except UserPathError as exc:
        if str(exc).endswith(_REASONS[errno.ENOENT]):
            return removed  # no job ever ran: nothing to prune
        raise
    try:
        for name in sorted(os.listdir(dir_fd)):
            if name in keep or not _JOB_DIR_RE.match(name):
                continue
            submitted = calendar.timegm(time.strptime(name[:15], "%Y%m%d-%H%M%S"))  # UTC
            if submitted >= older_than:
                continue
            try:
                top = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                if not stat.S_ISDIR(top.st_mode):
                    continue
                sub = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
                try:
                    newest = max([top.st_mtime] + [
                        os.stat(entry, dir_fd=sub, follow_symlinks=False).st_mtime
                        for entry in os.listdir(sub)])
                finally:
                    os.close(sub)
            except OSError:
                continue  # changed meanwhile: next time
            if newest >= older_than:
                continue
            _remove_tree(dir_fd, name, posixpath.join(shown, name))
            removed.append(name)
    finally:
        context.__exit__(None, None, None)
    return removed


# dmpi.contract.JOB_ID_RE, spelled out: this file is also the confined child's whole
# program, which imports the standard library only (tests/unit/dmpi/test_contract.py
# holds the two equal).
_JOB_DIR_RE = re.compile(r"^[0-9]{8}-[0-9]{6}-[0-9a-f]{6}\Z")


def _listing(dir_fd, shown):
    try:
        return iter(os.listdir(dir_fd))
    except OSError as exc:
        raise _error(shown, exc) from None


_OPS = {"makedirs": makedirs, "write_file": write_file, "read_tail": read_tail,
        "room": room, "prune_job_dirs": prune_job_dirs}
_ERROR_KINDS = {"UserPathError": UserPathError, "ValueError": ValueError, "TypeError": TypeError}


def _encode(value):
    """JSON-ready ``value``: bytes become ``{"base64": "..."}``."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {_BYTES_TAG: binascii.b2a_base64(value, newline=False).decode("ascii")}
    return value


def _decode(value):
    if isinstance(value, dict) and list(value) == [_BYTES_TAG]:
        return binascii.a2b_base64(value[_BYTES_TAG], strict_mode=True)
    return value


def _exchange(process, request, deadline, op):
    """Send ``request`` to the child and collect its stdout (bounded) and the tail of its
    stderr until both close, or raise subprocess.TimeoutExpired at ``deadline``."""
    import select  # pylint: disable=import-outside-toplevel
    import selectors  # pylint: disable=import-outside-toplevel
    import subprocess  # pylint: disable=import-outside-toplevel
    pending = memoryview(request)
    stdout, stderr = bytearray(), bytearray()
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdin, selectors.EVENT_WRITE)
        selector.register(process.stdout, selectors.EVENT_READ, stdout)
        selector.register(process.stderr, selectors.EVENT_READ, stderr)
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise subprocess.TimeoutExpired(process.args, remaining)
            for key, _ in selector.select(remaining):
                if key.fileobj is process.stdin:
                    try:
                        # At most PIPE_BUF: a write select() allows never blocks.
                        pending = pending[os.write(key.fd, pending[: select.PIPE_BUF]):]
                    except BrokenPipeError:
                        pending = pending[:0]
                    if not pending:
                        selector.unregister(process.stdin)
                        process.stdin.close()
                    continue
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fileobj)
                    continue
                key.data.extend(chunk)
                if len(stdout) > _STDOUT_LIMIT:
                    raise UserPathError(f"{op}: the confined child printed more than "
                                        f"{_STDOUT_LIMIT} bytes")
                del stderr[:-_STDERR_TAIL]
    return bytes(stdout), bytes(stderr)


def _signal_name(number):
    import signal  # pylint: disable=import-outside-toplevel
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _stderr_line(stderr):
    """The child's last line of error output, short and printable, for a message."""
    lines = [line for line in stderr.decode("utf-8", "replace").splitlines() if line.strip()]
    if not lines:
        return "no error output"
    return "".join(char if char.isprintable() else "?" for char in lines[-1].strip()[:500])


_PROGRAM = []

# What the child runs first: it loads the compiled program from the head of its stdin
# (its length in argv) and runs it as __main__, which reads the request after it. A
# different Python could not load the code, so the child checks it is the caller's.
_LOADER = (
    "import marshal, sys\n"
    "if sys.implementation.cache_tag != sys.argv[2]:\n"
    "    sys.exit(f'the confined child runs {sys.implementation.cache_tag}, '\n"
    "             f'not the caller\\'s {sys.argv[2]}')\n"
    "exec(marshal.loads(sys.stdin.buffer.read(int(sys.argv[1]))), {'__name__': '__main__'})\n"
)


def _own_program():
    """This file compiled (it is the child's program), once: the child then loads code
    instead of compiling 800 lines at every start."""
    if not _PROGRAM:
        with open(os.path.abspath(__file__), encoding="utf-8") as handle:
            _PROGRAM.append(marshal.dumps(compile(handle.read(), __file__, "exec")))
    return _PROGRAM[0]


def run_confined(op, uid=None, gid=None, timeout=10.0, **kwargs):
    """
    Run ``op(**kwargs)`` in a child process with the user's uid and gid.

    The child is this file, compiled here and run by ``python -I -S`` (the same Python
    as the caller's), with no supplementary groups, no environment and ``/`` as its
    working directory, so the kernel also checks every access against the user's own
    permissions.

    op
        One of :data:`CONFINED_OPS`: ``makedirs``, ``write_file``, ``read_tail``.
    uid, gid
        Credentials of the child; both or neither (then it runs as the caller).
    timeout
        Seconds the child may take; then it is killed.
    kwargs
        Arguments of ``op``; bytes values (``data``) travel base64-encoded.

    Returns what ``op`` returns. Raises :class:`UserPathError` for what ``op`` raises,
    and when the child cannot start, times out, dies or replies with anything but its
    one JSON object; ``ValueError``/``TypeError`` for bad arguments.

    Example:

    .. code-block:: python

        dmpi.node.userfs.run_confined(
            "read_tail", uid=2001, gid=2001, root="/srv/dockermpi/users",
            parts=["alice", "mpi-jobs", job_id], name="stderr", max_bytes=65536,
        )
    """
    if op not in CONFINED_OPS:
        raise ValueError(f"op must be one of {sorted(CONFINED_OPS)}, not {op!r}")
    if (uid is None) != (gid is None):
        raise ValueError("uid and gid must be given together")
    credentials = {}
    if uid is not None:
        _check_id(uid, "uid")
        _check_id(gid, "gid")
        credentials = {"user": uid, "group": gid, "extra_groups": []}
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ValueError(f"timeout must be a positive number, not {timeout!r}")
    import subprocess  # pylint: disable=import-outside-toplevel
    program = _own_program()
    request = program + json.dumps(
        {"op": op, "kwargs": {key: _encode(value) for key, value in kwargs.items()}}
    ).encode("utf-8")
    # The program travels on stdin, read here as root: Salt keeps synced utils in a
    # directory only root may enter, which the child (the user's uid) cannot read.
    argv = [CHILD_PYTHON, "-I", "-S", "-c", _LOADER, str(len(program)),
            sys.implementation.cache_tag]
    deadline = time.monotonic() + timeout
    try:
        process = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            cwd="/", env={}, close_fds=True, **credentials
        )
    except OSError as exc:
        raise UserPathError(f"{op}: cannot start the confined child: {exc.strerror}") from None
    with process:
        try:
            stdout, stderr = _exchange(process, request, deadline, op)
            returncode = process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise UserPathError(f"{op}: the confined child did not finish within "
                                f"{timeout} s and was killed") from None
        except BaseException:
            process.kill()
            process.wait()
            raise
    if returncode < 0:
        raise UserPathError(f"{op}: the confined child was killed by "
                            f"{_signal_name(-returncode)}: {_stderr_line(stderr)}")
    if returncode != 0:
        raise UserPathError(f"{op}: the confined child exited with status {returncode}: "
                            f"{_stderr_line(stderr)}")
    try:
        reply = json.loads(stdout)
    except ValueError:
        reply = None
    if isinstance(reply, dict) and "ok" in reply:
        return _decode(reply["ok"])
    if isinstance(reply, dict) and isinstance(reply.get("error"), str):
        raise _ERROR_KINDS.get(reply.get("kind"), UserPathError)(reply["error"])
    raise UserPathError(f"{op}: the confined child gave no valid reply: {_stderr_line(stderr)}")


def main():
    """Entry point of the confined child: one JSON request on stdin, one reply on stdout."""
    try:
        request = json.loads(sys.stdin.buffer.read())
        op = request["op"]
        if op not in CONFINED_OPS:
            raise ValueError(f"op {op!r} is not allowed in the confined child")
        kwargs = {key: _decode(value) for key, value in request["kwargs"].items()}
        reply = {"ok": _encode(_OPS[op](**kwargs))}
    except (UserPathError, ValueError, TypeError) as exc:
        reply = {"error": str(exc), "kind": type(exc).__name__}
    except (KeyError, AttributeError) as exc:
        reply = {"error": f"malformed request: {exc!r}", "kind": "ValueError"}
    sys.stdout.buffer.write(json.dumps(reply).encode("utf-8"))
    sys.stdout.buffer.flush()


if __name__ == "__main__":
    main()
