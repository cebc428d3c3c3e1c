"""
A GlusterFS volume as DockerMPI's shared storage, through the ``gluster`` command line
(its ``--xml`` output) on the server: the volume made, started and set as DockerMPI
needs it, and each user directory's quota of bytes and files set and read.

What DockerMPI sets on its volume (:data:`REQUIRED_OPTIONS`, beside ``auth.allow``):

- quotas on, enforced at once (``hard-timeout``/``soft-timeout`` 0: by default a brick
  lets a directory run past its limit for seconds), and ``df`` in a directory under a
  limit shows that limit (``quota-deem-statfs``);
- bricks that serve only clients bound to a privileged port, and clients that bind one
  (``server.allow-insecure off``, ``client.bind-insecure off``): GlusterFS trusts the
  uid a client sends, and below 1024 only a host's root can bind, never a job or a
  notebook (which also cannot reach the server at all: the job firewall, the hub's).

Options are set before the volume starts: a started volume whose clients' binding
changes drops its mounted clients.
"""

import contextlib
import fcntl
import ipaddress
import os
import re
import socket
import subprocess
import time
import xml.etree.ElementTree as ElementTree

from dmpi.errors import DockerMPIError, RequestError
from dmpi.node import userdirs
from dmpi.storage import quota

GLUSTER = "gluster"
TIMEOUT = 120  # seconds one gluster command may take (a quota list walks the limits)
LOCK_PATH = "/run/dockermpi-gluster.lock"
LOCK_WAIT = 600  # seconds to wait for this host's other gluster commands
BUSY_WAIT = 60  # seconds to retry while glusterd runs another transaction
BUSY_RE = re.compile(r"Another transaction is in progress|Locking failed on")
VOLUME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}\Z")
BRICK_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]{0,252}:/[A-Za-z0-9._/-]{1,1023}\Z")
# What a path inside the volume may hold: names DockerMPI makes (users/<name>).
PATH_RE = re.compile(r"^(/[A-Za-z0-9][A-Za-z0-9._-]{0,254}){1,8}\Z")
REQUIRED_OPTIONS = {
    "features.hard-timeout": "0",
    "features.soft-timeout": "0",
    "features.quota-deem-statfs": "on",
    "server.allow-insecure": "off",
    "client.bind-insecure": "off",
    # close() returns once the data is on the brick, so another host reading a job's
    # output as soon as the job ends sees all of it (NFS's close-to-open).
    "performance.flush-behind": "off",
}
#: Options DockerMPI sets itself; a site's own options cannot change them.
OWN_OPTIONS = (*REQUIRED_OPTIONS, "auth.allow")
#: The longest option value set: glusterd 10.3 crashed saving one of about 4 KB.
MAX_OPTION_CHARS = 3000
#: Options gluster takes only once quota is enabled.
QUOTA_OPTIONS = ("features.hard-timeout", "features.soft-timeout",
                 "features.quota-deem-statfs")


class GlusterError(DockerMPIError, RuntimeError):
    """The gluster command failed or answered what cannot be read."""


def _check(pattern, value, what):
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise RequestError(f"{what} {value!r} is not valid")
    return value


def _whole(value, what):
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise RequestError(f"{what} must be a whole number of at least 0, got {value!r}")
    return value


@contextlib.contextmanager
def _one_at_a_time():
    """Hold this host's gluster lock: glusterd refuses a second command while one runs
    ("Another transaction is in progress"), as when new users' first jobs set their
    quotas at once. Waits at most :data:`LOCK_WAIT` seconds."""
    with open(LOCK_PATH, "a", encoding="utf-8") as lock:
        deadline = time.monotonic() + LOCK_WAIT
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise GlusterError(f"another gluster command held {LOCK_PATH} for "
                                       f"{LOCK_WAIT} s") from None
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _run(argv):
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT,
                              check=False)
    except FileNotFoundError:
        raise GlusterError("gluster is not installed (package glusterfs-server)") from None
    except subprocess.TimeoutExpired:
        raise GlusterError(f"{' '.join(argv)} did not answer in {TIMEOUT} s") from None
    try:
        return ElementTree.fromstring(done.stdout)
    except ElementTree.ParseError:
        raise GlusterError(f"{' '.join(argv)} exited {done.returncode}: "
                           f"{(done.stdout + done.stderr).strip()[:500]}") from None


def gluster(*args, check=True):
    """Run ``gluster --mode=script <args> --xml``, one command at a time on this host;
    the parsed ``cliOutput``. While glusterd says another transaction (a peer's, or a
    command from outside DockerMPI) is in progress, the command is run again, for at
    most :data:`BUSY_WAIT` seconds. A failed operation (``opRet`` not 0) raises
    :class:`GlusterError` with gluster's message, unless ``check`` is False."""
    argv = [GLUSTER, "--mode=script", *args, "--xml"]
    deadline = time.monotonic() + BUSY_WAIT
    with _one_at_a_time():
        root = _run(argv)
        while root.findtext("opRet", "-1") != "0" and time.monotonic() < deadline and \
                BUSY_RE.search(root.findtext("opErrstr") or ""):
            time.sleep(0.5)
            root = _run(argv)
    if check and root.findtext("opRet", "-1") != "0":
        raise GlusterError(f"gluster {' '.join(args)}: "
                           f"{root.findtext('opErrstr') or 'failed'}")
    return root


# --------------------------------------------------------------------------- volume


def parse_volume(root):
    """``{"name", "started", "bricks", "options"}`` of a ``volume info`` answer's first
    volume, or None when there is none."""
    volume = root.find("volInfo/volumes/volume")
    if volume is None:
        return None
    return {
        "name": volume.findtext("name"),
        "started": volume.findtext("status") == "1",
        "bricks": [brick.findtext("name") or (brick.text or "").strip()
                   for brick in volume.findall("bricks/brick")],
        "options": {option.findtext("name"): option.findtext("value")
                    for option in volume.findall("options/option")},
    }


def volume(name):
    """The volume's facts (:func:`parse_volume`), None when it does not exist."""
    root = gluster("volume", "info", _check(VOLUME_RE, name, "volume name"), check=False)
    if root.findtext("opRet") != "0":
        return None
    return parse_volume(root)


def address_patterns(networks):
    """
    The ``auth.allow`` patterns matching exactly the addresses of ``networks`` (IPv4
    CIDRs): ``a.b.*`` for a network on an octet boundary, its /8, /16 or /24 pieces as
    such patterns otherwise, and each address of a piece smaller than a /24. GlusterFS
    is not given the CIDRs themselves: its brick matched only some of them (a /25 let
    in an address outside it) while its ``*`` patterns always matched.

    Their comma-joined length stays within :data:`MAX_OPTION_CHARS` (glusterd crashed
    saving a longer option value), else :class:`RequestError`.
    """
    patterns = []
    for network in networks:
        network = ipaddress.IPv4Network(network)
        boundary = next((bits for bits in (8, 16, 24) if bits >= network.prefixlen), None)
        if boundary is None:
            patterns += [str(address) for address in network]
        else:
            pieces = [network] if network.prefixlen == boundary else \
                network.subnets(new_prefix=boundary)
            patterns += [".".join(str(piece.network_address).split(".")[: boundary // 8])
                         + ".*" for piece in pieces]
        if len(",".join(patterns)) > MAX_OPTION_CHARS:
            raise RequestError(
                f"the hosts' part of the cluster network ({', '.join(map(str, networks))}) "
                f"needs more than {MAX_OPTION_CHARS} characters of GlusterFS auth.allow "
                "patterns: list the nodes' and the hub's addresses or patterns in "
                "mpi:storage:glusterfs:clients")
    return patterns


def client_addresses(host_networks, listed=()):
    """
    What ``auth.allow`` lists: ``listed`` when the site gives it (addresses, host names or
    GlusterFS wildcards), else :func:`address_patterns` of ``host_networks`` (the hosts'
    part of the cluster network, :func:`dmpi.settings.host_networks`): never the job
    address pool.
    """
    if listed:
        return [str(entry) for entry in listed]
    return address_patterns(host_networks)


def wanted_options(options, clients):
    """The options DockerMPI's volume must have: :data:`REQUIRED_OPTIONS`, ``auth.allow``
    from ``clients`` (the hosts' addresses), and the site's own ``options`` beside them
    (none of :data:`OWN_OPTIONS`)."""
    if not clients:
        raise RequestError("the volume needs at least one client address (auth.allow)")
    wanted = dict(REQUIRED_OPTIONS, **{"auth.allow": ",".join(clients)})
    for key, value in (options or {}).items():
        if not isinstance(key, str) or not re.fullmatch(r"[a-z][a-z0-9.-]{1,80}", key):
            raise RequestError(f"volume option {key!r} is not valid")
        if key in OWN_OPTIONS:
            raise RequestError(f"volume option {key} is DockerMPI's own and cannot be set")
        wanted[key] = str(value)
    for key, value in wanted.items():
        if len(value) > MAX_OPTION_CHARS:
            raise RequestError(f"volume option {key} has {len(value)} characters, more "
                               f"than the {MAX_OPTION_CHARS} glusterd saves safely")
    return wanted


def _on_root_fs(brick):
    path = brick.split(":", 1)[1]
    while not os.path.exists(path) and path != "/":
        path = os.path.dirname(path)
    return os.stat(path).st_dev == os.stat("/").st_dev


def ensure_volume(name, bricks, options=None, clients=(), test=False):
    """
    Make the volume ``name`` over ``bricks`` (``host:/path``) with its options (see
    :func:`wanted_options`), quotas enabled, and started; returns the changes made (or,
    with ``test``, those it would make), ``[]`` when all was so. A volume whose bricks
    differ is never changed: that raises, as moving data is the admin's.
    """
    _check(VOLUME_RE, name, "volume name")
    if not bricks:
        raise RequestError("the volume needs at least one brick")
    for brick in bricks:
        _check(BRICK_RE, brick, "brick")
    wanted = wanted_options(options, clients)
    found = volume(name)
    changes = []
    if found is None:
        changes.append(f"create volume {name} on {', '.join(bricks)}")
        found = {"started": False, "bricks": list(bricks), "options": {}}
        if not test:
            # "force": a brick on the root file system, as on a test host.
            force = ["force"] if any(_on_root_fs(b) for b in bricks
                                     if b.split(":", 1)[0] in _own_names()) else []
            gluster("volume", "create", name, *bricks, *force)
    elif sorted(found["bricks"]) != sorted(bricks):
        raise GlusterError(f"volume {name} has the bricks {found['bricks']}, not {bricks}: "
                           "DockerMPI does not move a volume's data; change the pillar or "
                           "the volume by hand")
    def set_options(keys):
        for key in keys:
            if found["options"].get(key) != wanted[key]:
                changes.append(f"set {key} {wanted[key]}")
                if not test:
                    gluster("volume", "set", name, key, wanted[key])

    # The clients' binding before the start (it drops mounted clients when it changes),
    # quota's own options once quota is on (gluster refuses them before).
    set_options([key for key in wanted if key not in QUOTA_OPTIONS])
    if not found["started"]:
        changes.append(f"start volume {name}")
        if not test:
            gluster("volume", "start", name)
    if found["options"].get("features.quota") != "on":
        changes.append("enable quota")
        if not test:
            gluster("volume", "quota", name, "enable")
    set_options([key for key in wanted if key in QUOTA_OPTIONS])
    return changes


def _own_names():
    """This host's names and addresses, as a brick's host may be written."""
    names = {socket.gethostname(), socket.getfqdn(), "localhost", "127.0.0.1"}
    try:
        names.update(info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None))
    except OSError:
        pass
    done = subprocess.run(["hostname", "--all-ip-addresses"], capture_output=True,
                          text=True, check=False)
    names.update(done.stdout.split())
    return names


# --------------------------------------------------------------------------- quotas


def _number(limit, tag):
    text = limit.findtext(tag)
    return int(text) if text and text.isdigit() else None


def parse_quota(bytes_root, files_root):
    """``{path: {"bytes_used", "bytes_limit", "files_used", "files_limit"}}`` from the
    answers of ``quota list`` and ``quota list-objects`` (None where that answer has no
    limit for the path: a limit of 0 is no limit)."""
    found = {}

    def entry(path):
        return found.setdefault(path, {"bytes_used": None, "bytes_limit": 0,
                                       "files_used": None, "files_limit": 0})

    for limit in bytes_root.iter("limit") if bytes_root is not None else ():
        figures = entry(limit.findtext("path"))
        figures["bytes_limit"] = _number(limit, "hard_limit") or 0
        figures["bytes_used"] = _number(limit, "used_space")
    for limit in files_root.iter("limit") if files_root is not None else ():
        figures = entry(limit.findtext("path"))
        figures["files_limit"] = _number(limit, "hard_limit") or 0
        files, dirs = _number(limit, "file_count"), _number(limit, "dir_count")
        figures["files_used"] = None if files is None else files + (dirs or 0)
    return found


def _quota_list(name, kind):
    root = gluster("volume", "quota", name, kind, check=False)
    if root.findtext("opRet") == "0":
        return root
    if re.match(r"No (inode )?quota configured", root.findtext("opErrstr") or ""):
        return None
    raise GlusterError(f"gluster volume quota {name} {kind}: "
                       f"{root.findtext('opErrstr') or 'failed'}")


def quota_usage(name):
    """Every path of the volume under a limit: :func:`parse_quota`."""
    _check(VOLUME_RE, name, "volume name")
    return parse_quota(_quota_list(name, "list"), _quota_list(name, "list-objects"))


def set_quota(name, path, size_mb, files, test=False, found=None):
    """
    Limit ``path`` (inside the volume, e.g. ``/users/alice``, which must exist) to
    ``size_mb`` MiB and ``files`` files and directories; 0 removes that limit. Returns the
    changes made (or, with ``test``, those it would make), ``[]`` when all was so.
    ``found``: the volume's :func:`quota_usage` when the caller read it already (one read
    for many paths).
    """
    _check(VOLUME_RE, name, "volume name")
    _check(PATH_RE, path, "path")
    size_mb, files = _whole(size_mb, "size_mb"), _whole(files, "files")
    if found is None:
        found = quota_usage(name)
    have = found.get(path, {"bytes_limit": 0, "files_limit": 0})
    changes = []
    size = size_mb << 20
    if have["bytes_limit"] != size:
        changes.append(f"limit {path} to {size_mb} MiB" if size else f"remove {path}'s size limit")
        if not test:
            if size:
                gluster("volume", "quota", name, "limit-usage", path, str(size))
            else:
                gluster("volume", "quota", name, "remove", path)
    if have["files_limit"] != files:
        changes.append(f"limit {path} to {files} files" if files
                       else f"remove {path}'s file limit")
        if not test:
            if files:
                gluster("volume", "quota", name, "limit-objects", path, str(files))
            else:
                gluster("volume", "quota", name, "remove-objects", path)
    return changes


def set_users_share(name, mount, reserve_percent, test=False, found=None):
    """
    Limit ``/users`` as a whole to the volume's size (as this host's mount at ``mount``
    counts it) less ``reserve_percent``, so users together never fill what the nodes'
    health probe and DockerMPI's own files need (0: no such limit). Returns the
    changes made (or, with ``test``, those it would make); ``found`` as for
    :func:`set_quota`.
    """
    if isinstance(reserve_percent, bool) or not isinstance(reserve_percent, int) or \
            not 0 <= reserve_percent < 100:
        raise RequestError(f"reserve_percent must be a whole number from 0 to 99, got "
                           f"{reserve_percent!r}")
    if not reserve_percent:
        return set_quota(name, "/users", 0, 0, test=test, found=found)
    volume_fs = os.statvfs(mount)
    size_mb = (volume_fs.f_blocks * volume_fs.f_frsize >> 20) * (100 - reserve_percent) // 100
    return set_quota(name, "/users", max(size_mb, 1), 0, test=test, found=found)


def set_user_quotas(name, mount, limits, test=False):
    """
    Put every user directory of the volume (``users/<user>`` under ``mount``, where this
    host mounts it; :func:`dmpi.node.userdirs.user_dirs`) under its quota from
    ``limits`` (pillar ``mpi:storage:quota``), and ``users/`` as a whole under the
    volume's size less ``reserve_percent`` (:func:`set_users_share`), reading the
    volume's limits once. Returns ``{user: changes}`` of the users whose limits changed
    (or would, with ``test``; ``users/`` for the whole), ``{}`` before ``users/`` exists.
    """
    if not os.path.isdir(os.path.join(mount, "users")):
        return {}
    found = quota_usage(name)
    changed = {}
    shared = set_users_share(name, mount, int(limits.get("reserve_percent", 0)),
                             test=test, found=found)
    if shared:
        changed["users/"] = shared
    for user in sorted(userdirs.user_dirs(mount)):
        size_mb, files = quota.limits(limits, user)
        changes = set_quota(name, quota.user_path(user), size_mb, files, test=test,
                            found=found)
        if changes:
            changed[user] = changes
    return changed
