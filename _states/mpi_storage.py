"""
DockerMPI's shared storage: on the host serving it, the GlusterFS volume and the users'
quotas on it; on every host that speaks to it, that only root binds a privileged port and
the storage's own directories, which every node ensures at once.

.. code-block:: yaml

    mpi-storage-glusterfs-volume-present:
      mpi_storage.volume_present:
        - name: dockermpi
        - bricks: [10.251.1.6:/export/dockermpi-brick]
        - clients: [10.251.1.5, 10.251.1.11, 10.251.1.12]

    mpi-storage-privileged-ports-root-only:
      mpi_storage.privileged_ports_root_only:
        - name: net.ipv4.ip_unprivileged_port_start

    mpi-storage-preshared-users-directory:
      mpi_storage.shared_directory:
        - name: /srv/dockermpi/users
        - user: mpiguest
        - group: mpiguest
        - mode: '0711'

    mpi-storage-glusterfs-user-quotas:
      mpi_storage.user_quotas:
        - name: dockermpi
        - mount: /srv/dockermpi
        - limits: {size_mb: 102400, files: 1000000, users: {}}

:depends: the ``mpi_storage`` execution module; gluster (glusterfs-server) for the
    volume and its quotas
"""

from salt.exceptions import CommandExecutionError, SaltInvocationError

__virtualname__ = "mpi_storage"


def __virtual__():
    if "mpi_storage.ensure_volume" in __salt__:
        return __virtualname__
    return False, "mpi_storage: the mpi_storage execution module is not available"


def _applied(state_name, function, done_comment, **kwargs):
    ret = {"name": state_name, "result": False, "changes": {}, "comment": ""}
    test = bool(__opts__.get("test"))
    try:
        changes = function(test=test, **kwargs)
    except (CommandExecutionError, SaltInvocationError) as exc:
        ret["comment"] = str(exc)
        return ret
    if not changes:
        ret["result"] = True
        ret["comment"] = done_comment
        return ret
    ret["changes"] = {"changes": changes}
    if test:
        ret["result"] = None
        ret["comment"] = "Would change what is listed in changes"
    else:
        ret["result"] = True
        ret["comment"] = "Changed what is listed in changes"
    return ret


def volume_present(name, bricks, clients, options=None):
    """
    Ensure the GlusterFS volume ``name`` exists over ``bricks``, started, with quotas
    enforced at once, clients on privileged ports only and ``auth.allow`` listing
    ``clients`` (the hosts' addresses), and the site's ``options`` set. A volume whose
    bricks differ is never changed: the state fails saying so.

    name
        The volume's name.

    bricks
        ``host:/path`` of each brick.

    clients
        The addresses allowed to mount it (the nodes and the hub host).

    options
        Further volume options (``{"performance.cache-size": "256MB"}``).
    """
    return _applied(name, __salt__["mpi_storage.ensure_volume"],
                    f"Volume {name} is as it should be",
                    name=name, bricks=bricks, clients=clients, options=options)


def user_quotas(name, mount, limits):
    """
    Ensure every user directory of the volume ``name`` (``users/<user>`` under ``mount``,
    where this host mounts it) has its quota from ``limits`` (pillar
    ``mpi:storage:quota``). Users whose directories appear later get theirs from the
    master when it makes the directory.

    name
        The volume's name.

    mount
        Where this host mounts the volume.

    limits
        ``{"size_mb", "files", "users": {user: {"size_mb", "files"}}}``; 0: no limit.
    """
    return _applied(name, __salt__["mpi_storage.set_user_quotas"],
                    "Every user directory has its quota",
                    volume=name, mount=mount, limits=limits)


def shared_directory(name, user, group, mode):
    """
    Ensure ``name``, on a file system every node mounts, is a directory owned by
    ``user``:``group`` with ``mode`` (octal text, as ``file.directory`` takes it). Every
    node applies this at once: the first makes the directory, the others find it made
    (``file.directory`` looks, then makes, and fails on every node but one). Its parent is
    never made; anything but a directory there fails the state and is left as it is.

    name
        The directory.

    user, group
        Its owner and group (names or ids).

    mode
        Its mode (``'0711'``).
    """
    return _applied(name, __salt__["mpi_storage.shared_directory"],
                    f"Directory {name} is as it should be",
                    path=name, user=user, group=group, mode=mode)


def privileged_ports_root_only(name):
    """
    Check that only root can bind a port below 1024 on this host (``name``: the sysctl,
    ``net.ipv4.ip_unprivileged_port_start``), which the shared storage's trust in a
    host's privileged ports relies on. A check: it changes nothing, and fails (with
    test=True too) naming the setting and how to set it back.
    """
    ret = {"name": name, "result": False, "changes": {}, "comment": ""}
    try:
        problem = __salt__["mpi_storage.port_floor_problem"]()
    except CommandExecutionError as exc:
        ret["comment"] = str(exc)
        return ret
    ret["result"] = problem is None
    ret["comment"] = problem or "Below 1024 only root binds on this host"
    return ret
