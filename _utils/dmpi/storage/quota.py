"""
Users' storage quotas as pillar ``mpi:storage:quota`` sets them: a size and a file
count per user directory (``size_mb``, ``files``; 0: no limit), the same for every user
unless ``users`` names one. Pure functions; the storage applies them
(:mod:`dmpi.storage.glusterfs`).
"""

import posixpath

from dmpi.contract import USER_RE

USERS_DIR = "/users"


def limits(quota, user):
    """``(size_mb, files)`` for ``user``: their own entry in ``quota["users"]`` over the
    site's defaults, key by key."""
    own = (quota.get("users") or {}).get(user) or {}
    return (int(own.get("size_mb", quota["size_mb"])), int(own.get("files", quota["files"])))


def user_path(user):
    """The user's directory as a path inside the volume (``/users/<user>``)."""
    if not USER_RE.fullmatch(user):
        raise ValueError(f"not a DockerMPI user name: {user!r}")
    return posixpath.join(USERS_DIR, user)


def by_user(found):
    """``{user: figures}`` of the storage's ``{path: figures}``
    (:func:`dmpi.storage.glusterfs.quota_usage`): user directories only."""
    users = {}
    for path, figures in found.items():
        parent, name = posixpath.split(posixpath.normpath(path))
        if parent == USERS_DIR and USER_RE.fullmatch(name):  # not /users as a whole
            users[name] = figures
    return dict(sorted(users.items()))
