"""
The storage's own directories (``users/``, the health probes' directory) on a file system
every node mounts, which every node's highstate ensures at once: the first ``mkdir``
wins and the others find the directory made, where a look-then-make (Salt's
``file.directory``) fails on every host but one.
"""

import errno
import grp
import os
import pwd
import stat

from dmpi.errors import DockerMPIError, RequestError


def _ids(user, group):
    """The uid and gid of ``user`` and ``group`` (names or numbers); RequestError naming
    the one this host does not know."""
    try:
        uid = user if isinstance(user, int) else pwd.getpwnam(str(user)).pw_uid
    except KeyError:
        raise RequestError(f"no user {user!r} on this host") from None
    try:
        gid = group if isinstance(group, int) else grp.getgrnam(str(group)).gr_gid
    except KeyError:
        raise RequestError(f"no group {group!r} on this host") from None
    return uid, gid


def _mode(mode):
    """``mode`` as a number: an int, or octal digits as Salt's states write them."""
    if isinstance(mode, int) and not isinstance(mode, bool):
        number = mode
    else:
        try:
            number = int(str(mode), 8)
        except ValueError:
            raise RequestError(f"mode {mode!r} is not an octal file mode") from None
    if not 0 <= number <= 0o7777:
        raise RequestError(f"mode {mode!r} is not an octal file mode")
    return number


def ensure_directory(path, user, group, mode, test=False):
    """
    Make ``path`` a directory owned by ``user``:``group`` with ``mode``, as several hosts
    may at the same moment. Its parent must exist (never made here: a missing mount point
    must not become a local directory). Returns what changed (or would, with ``test``):
    ``{}`` when it already was so, else some of ``directory`` ("new"), ``owner``
    ("uid:gid") and ``mode`` (octal text). Anything but a directory at ``path``, a
    symbolic link included, is refused and left as it is.
    """
    uid, gid = _ids(user, group)
    wanted_mode = _mode(mode)
    wanted = {"owner": f"{uid}:{gid}", "mode": f"{wanted_mode:04o}"}
    made = False
    if not os.path.lexists(path):
        if test:
            return {"directory": "new", **wanted}
        try:
            # Made private, then handed over: never wider than asked, even for a moment.
            os.mkdir(path, 0o700)
            made = True
        except FileExistsError:
            pass  # another host made it first
        except FileNotFoundError:
            raise DockerMPIError(f"cannot make {path}: its parent directory does not exist") \
                from None
        except OSError as exc:
            raise DockerMPIError(f"cannot make {path}: {exc.strerror}") from None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        if exc.errno in (errno.ENOTDIR, errno.ELOOP):
            raise DockerMPIError(f"{path} exists and is not a directory: left as it is") \
                from None
        raise DockerMPIError(f"cannot open {path}: {exc.strerror}") from None
    changes = {}
    try:
        found = os.fstat(fd)
        if (found.st_uid, found.st_gid) != (uid, gid):
            changes["owner"] = wanted["owner"]
            if not test:
                os.fchown(fd, uid, gid)
        if stat.S_IMODE(found.st_mode) != wanted_mode:
            changes["mode"] = wanted["mode"]
            if not test:
                os.fchmod(fd, wanted_mode)
    except OSError as exc:
        raise DockerMPIError(f"cannot set the owner or mode of {path}: {exc.strerror}") \
            from None
    finally:
        os.close(fd)
    return {"directory": "new", **wanted} if made else changes
