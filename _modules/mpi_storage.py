"""
DockerMPI's shared storage, on the host that serves it and on every node: the Salt face of
:mod:`dmpi.storage`. For ``mpi:storage:type`` glusterfs, run on the GlusterFS server
(role ``mpi-glusterfs-server``): the volume made and set as DockerMPI needs it, and
each user directory's quota of bytes and files set and read. On every node: the storage's
own directories, made as several nodes may make them at once, and the hosts' port floor
checked. Errors become Salt's: a bad argument ``SaltInvocationError``, anything gluster
or the file system refuses ``CommandExecutionError``.

:depends: gluster (Debian package glusterfs-server) for the volume and quota functions
"""

import functools

import dmpi_current

# A minion that outlived an upgrade imports the library below anew (dmpi_current).
dmpi_current.ensure()

import dmpi.settings
from dmpi.errors import DockerMPIError, RequestError
from dmpi.storage import glusterfs, hosts, shared
from salt.exceptions import CommandExecutionError, SaltInvocationError

__virtualname__ = "mpi_storage"


def __virtual__():
    return __virtualname__


def _salt_errors(function):
    """The library's errors as Salt's, one place for every function of this module."""

    @functools.wraps(function)
    def translated(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except RequestError as exc:
            raise SaltInvocationError(str(exc)) from exc
        except DockerMPIError as exc:
            raise CommandExecutionError(str(exc)) from exc

    return translated


@_salt_errors
def volume(name):
    """
    The GlusterFS volume's facts: ``{"name", "started", "bricks", "options"}``, or None
    when it does not exist.

    CLI Example:

    .. code-block:: bash

        salt storage mpi_storage.volume dockermpi
    """
    return glusterfs.volume(name)


@_salt_errors
def ensure_volume(name, bricks, clients, options=None, test=False):
    """
    Make the GlusterFS volume ``name`` over ``bricks`` as DockerMPI needs it (quotas
    enforced at once, privileged client ports only, ``auth.allow`` = ``clients``, the
    site's ``options`` over those) and start it. Returns the changes made, or with
    ``test`` those it would make; ``[]`` when nothing differs.

    CLI Example:

    .. code-block:: bash

        salt storage mpi_storage.ensure_volume dockermpi '[10.251.1.6:/export/dockermpi-brick]' '[10.251.1.6, 10.251.1.11]' test=True
    """
    return glusterfs.ensure_volume(name, list(bricks), options, list(clients), test=test)


@_salt_errors
def clients(cluster_network, job_addresses, listed=None):
    """
    The addresses the volume's ``auth.allow`` lists: ``listed`` (pillar
    ``mpi:storage:glusterfs:clients``) when given, else patterns matching every address
    of the cluster network but the job address pool (``10.0.3.*`` for a whole /24).

    CLI Example:

    .. code-block:: bash

        salt storage mpi_storage.clients 10.251.1.0/24 10.251.1.128/25
    """
    networks = dmpi.settings.host_networks(cluster_network, job_addresses)
    return glusterfs.client_addresses(networks, listed or ())


@_salt_errors
def set_quota(volume, path, size_mb, files, test=False):
    """
    Limit ``path`` inside the volume (``/users/alice``, which must exist) to ``size_mb``
    MiB and ``files`` files and directories (0: no limit). Returns the changes made, or
    with ``test`` those it would make; ``[]`` when nothing differs.

    CLI Example:

    .. code-block:: bash

        salt storage mpi_storage.set_quota dockermpi /users/alice 102400 1000000
    """
    return glusterfs.set_quota(volume, path, size_mb, files, test=test)


@_salt_errors
def quota_usage(volume):
    """
    Every path of the volume under a limit: ``{path: {"bytes_used", "bytes_limit",
    "files_used", "files_limit"}}`` (a limit of 0: none; a use of None: not counted
    without that limit).

    CLI Example:

    .. code-block:: bash

        salt storage mpi_storage.quota_usage dockermpi
    """
    return glusterfs.quota_usage(volume)


@_salt_errors
def set_user_quotas(volume, mount, limits, test=False):
    """
    Put every user directory of the volume (``users/<name>`` under ``mount``, where this
    host mounts it) under its quota from ``limits`` (pillar ``mpi:storage:quota``:
    ``size_mb``, ``files``, ``users``), and ``users/`` as a whole under the volume's
    size less ``reserve_percent``. Returns ``{user: changes}`` of the users whose limits
    changed (or would, with ``test``; ``users/`` for the whole).

    CLI Example:

    .. code-block:: bash

        salt storage mpi_storage.set_user_quotas dockermpi /srv/dockermpi '{size_mb: 102400, files: 1000000}'
    """
    return glusterfs.set_user_quotas(volume, mount, limits, test=test)


@_salt_errors
def port_floor_problem():
    """
    Why this host's unprivileged accounts could speak to the shared storage as any uid
    (``net.ipv4.ip_unprivileged_port_start`` below 1024 lets them bind a privileged
    port, which GlusterFS and NFS ``sec=sys`` trust), or None when they cannot.

    CLI Example:

    .. code-block:: bash

        salt '*' mpi_storage.port_floor_problem
    """
    return hosts.port_floor_problem()


@_salt_errors
def shared_directory(path, user, group, mode, test=False):
    """
    Make ``path`` on the shared storage a directory owned by ``user``:``group`` with
    ``mode``, as every node's highstate does at the same moment (the first to make it
    wins; the others find it made). Its parent is never made. Returns what changed (or
    would, with ``test=True``): ``{}`` when nothing did.

    CLI Example:

    .. code-block:: bash

        salt '*' mpi_storage.shared_directory /srv/dockermpi/users mpiguest mpiguest 0711
    """
    return shared.ensure_directory(path, user, group, mode, test=test)
