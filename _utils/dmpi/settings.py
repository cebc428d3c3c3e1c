"""
The DockerMPI site settings (the ``mpi`` pillar over ``salt/dockermpi/defaults.yaml``).

One merge, one check, for everyone who reads the settings: ``map.jinja`` (through the
``mpi_config`` execution module) for the states, the ``mpi_config.valid`` state that every
other state of the formula requires, and the ``mpi`` runner on the master.

- :func:`merge` lays the pillar over the defaults: mappings merge key by key, anything
  else (lists included) set in pillar replaces the default, as
  ``salt.utils.dictupdate.merge(defaults, pillar, merge_lists=False)`` does.
- :func:`problems` lists everything wrong with merged settings, one line each, naming the
  pillar key (``mpi:ports:oob 20100-20299 overlaps mpi:ports:btl 20250-20999``).
- :func:`validate` returns the settings normalised (canonical networks and paths, port
  ranges as ``[first, last]`` of ints, ``cpus_per_slot`` a float) or raises
  :class:`ConfigError` holding every problem, one per line.

The Salt faces import it (``import dmpi.settings``); the names master and nodes agree on
are in :mod:`dmpi.contract`. Pure: no I/O.
"""

import copy
import hashlib
import ipaddress
import math
import re
import urllib.parse

from dmpi.contract import (ACCOUNT_RE, API_SERVICE_NAME, DOCKER_NAME_RE,
                           IMAGE_NAME_RE, IMAGE_REFERENCE_RE, MAX_STANDBY_NAMESPACES,
                           USER_RE)
from dmpi.errors import ConfigError, RequestError
from dmpi.jobs.request import parse_duration
from dmpi.launch.probe import FLAVOUR_NAMES
from dmpi.storage.glusterfs import MAX_OPTION_CHARS, OWN_OPTIONS, address_patterns

__all__ = [
    "endpoint",
    "is_encrypted_or_local",
    "is_loopback",
    "user_for_identity",
    "merge",
    "problems",
    "validate",
]

# ------------------------------------------------------------------ limits of settings

#: Ports jobs may use: unprivileged ones (:mod:`dmpi.launch` refuses the others).
PORT_MIN = 1024
PORT_MAX = 65535
#: The port ranges under ``mpi:ports``: a job's sshd (its first port), Open MPI's
#: out-of-band and TCP byte-transfer layer.
PORT_RANGES = ("sshd", "oob", "btl")
#: OOB ports a job namespace needs: mpirun and an orted, each listening on IPv4 and IPv6.
MIN_OOB_PORTS = 4
#: BTL ports a job namespace needs per slot: each rank listens on IPv4 and IPv6.
BTL_PORTS_PER_SLOT = 2
#: Lowest uid (and gid) handed to users: below it are the hosts' system accounts.
UID_FLOOR = 1000
#: Highest uid or gid DockerMPI hands out (the kernel's largest minus the overflow id).
ID_MAX = 2**31 - 2
#: nobody/nogroup, which NFS maps root to (root_squash): never a user's uid.
NOBODY_ID = 65534
#: How every node sees the shared storage (``mpi:storage:type``).
STORAGE_TYPES = ("nfs", "glusterfs", "preshared")
#: NFS security flavours (``mpi:storage:nfs:security``): the export's ``sec=`` and the
#: mounts'. ``sys`` trusts the uid a host sends; the Kerberos ones authenticate (krb5),
#: add integrity (krb5i) or encrypt as well (krb5p).
NFS_SECURITY = ("sys", "krb5", "krb5i", "krb5p")
#: iptables chains owned by the kernel or by Docker; DockerMPI needs one of its own.
FOREIGN_CHAINS = ("INPUT", "OUTPUT", "FORWARD", "PREROUTING", "POSTROUTING", "DOCKER")

_SHOWN_CHARS = 60
_CHAIN_RE = re.compile(r"^[A-Za-z0-9_-]{1,28}\Z")
_VERSION_RE = re.compile(r"^[0-9A-Za-z][0-9A-Za-z.-]{0,31}\Z")
_PACKAGE_RE = re.compile(r"^[a-z0-9][a-z0-9+.-]+\Z")
_LOG_SIZE_RE = re.compile(r"^[1-9][0-9]*[kKmMgG]?\Z")
_HOSTNAME_RE = re.compile(
    r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\Z"
)
_INTERFACE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,14}\Z")
_MOUNT_OPTION_RE = re.compile(r"^[^\s,]+\Z")
_GLUSTER_VOLUME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}\Z")
_GLUSTER_CLIENT_RE = re.compile(r"^[A-Za-z0-9*][A-Za-z0-9.*:-]{0,252}\Z")
_GLUSTER_OPTION_RE = re.compile(r"^[a-z][a-z0-9.-]{1,80}\Z")
_REGISTRY_RE = re.compile(r"^[^\s/]+(?:/[0-9]{1,2})?\Z")
_REGISTRY_HOST_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?(?::[0-9]{1,5})?\Z")
_URL_RE = re.compile(r"^(?P<scheme>[a-z]+)://(?P<host>[A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])"
                     r"(?::[0-9]{1,5})?(?:/[^\s]*)?\Z")
_PINNED_PACKAGE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9][A-Za-z0-9.+!-]*\Z")
#: Where the scheduler puts a job's ranks (``mpi:placement``; ``dmpi.jobs.sched.PLACEMENTS``).
PLACEMENTS = ("pack", "spread")
#: In what order queued jobs are considered (``mpi:queue_order``): by fair-share priority
#: (``dmpi.jobs.fairshare``, pillar ``mpi:fair_share``) or submission order.
QUEUE_ORDERS = ("fair", "fifo")
#: The fair-share settings (``mpi:fair_share``): durations (as a walltime is written) and
#: weights with their bounds.
FAIR_SHARE_DURATIONS = ("half_life", "max_age")
FAIR_SHARE_WEIGHTS = {"weight_fairshare": (0, 1_000_000), "weight_age": (0, 1_000_000)}

#: The network self-test's settings (``mpi:selftest``, ``dmpi.master.selftest``): whole
#: numbers with their bounds, and thresholds (0 or more; 0 turns that check off).
SELFTEST_COUNTS = {"size": (1, 64 << 20), "lat_iters": (1, 1_000_000),
                   "bw_iters": (1, 1_000_000)}
SELFTEST_THRESHOLDS = ("min_bandwidth_mb_per_s", "far_below", "min_ratio")

#: Per-user limits of the user API (``mpi:api:limits``).
API_LIMITS = ("requests_per_second", "burst", "streams", "body_bytes", "log_bytes",
              "wait_seconds", "page_jobs")

#: How users log in to the hub (``mpi:hub:authenticator``).
HUB_AUTHENTICATORS = ("dummy", "github")
#: A TLS endpoint's files, as PEM text in pillar (``mpi:hub:tls``, ``mpi:api:tls``): its
#: certificate (chain), its private key and the CA its clients verify it with.
TLS_KEYS = ("cert", "key", "ca")
_PEM_KINDS = {"cert": ("CERTIFICATE",), "ca": ("CERTIFICATE",),
              "key": ("PRIVATE KEY", "RSA PRIVATE KEY", "EC PRIVATE KEY")}

#: Every setting: the keys of each mapping under ``mpi`` (the limits that are not in
#: defaults.yaml are read by ``dmpi.jobs.request`` when a site sets them).
_KEYS = {
    "": ("users", "guest", "cluster_network", "ports", "slots_per_node", "placement",
         "queue_order", "fair_share", "selftest", "limits",
         "retention", "storage", "docker", "job_network", "images", "image_facts", "job_root",
         "firewall", "hub", "api", "engine"),
    "users": ("uid_min", "uid_max"),
    "ports": PORT_RANGES,
    "guest": ("user", "group", "uid", "gid"),
    "limits": ("max_walltime", "max_running_jobs_per_user", "max_slots_per_user",
               "max_queued_jobs_per_user", "max_np", "max_cmd_bytes", "max_cmd_words",
               "max_env_bytes", "max_env_vars", "memory_per_slot_mb", "pids_per_slot",
               "cpus_per_slot", "tmp_size_mb"),
    "storage": ("type", "path", "nfs", "glusterfs", "quota"),
    "storage:glusterfs": ("server", "volume", "brick", "clients", "options", "mount_options"),
    "storage:quota": ("size_mb", "files", "users", "reserve_percent"),
    "storage:nfs": ("server", "export", "mount_options", "security"),
    "retention": ("job_records_days", "job_dirs_days"),
    "fair_share": FAIR_SHARE_DURATIONS + tuple(FAIR_SHARE_WEIGHTS),
    "selftest": ("user", "image", *SELFTEST_COUNTS, *SELFTEST_THRESHOLDS,
                 "exclude_failed_nodes"),
    "docker": ("package", "log_max_size", "log_max_file", "insecure_registries",
               "registry_credentials"),
    "job_network": ("name", "addresses", "parent", "standby", "unreachable"),
    "firewall": ("chain", "rules_file", "rules_file_ipv6"),
    "hub": ("image", "images", "bind_url", "hub_bind_url", "hub_api_url", "api_url", "api_service_url",
            "subdomain_host", "notebook_hosts", "tls", "authenticator", "admin_users",
            "admin_token", "dummy", "github", "pip", "limits", "panel_refresh_seconds", "venv",
            "state_dir"),
    "hub:tls": TLS_KEYS,
    "hub:dummy": ("password", "allowed_users"),
    "hub:github": ("package", "client_id", "client_secret", "callback_url",
                   "allowed_organizations"),
    "hub:pip": ("index_url", "find_links", "no_index"),
    "hub:limits": ("memory_mb", "pids", "cpus", "tmp_size_mb"),
    "api": ("host", "port", "allowed_clients", "hub_api_url", "tls", "token_cache_seconds",
            "limits"),
    "api:tls": TLS_KEYS,
    "api:limits": API_LIMITS,
    "engine": ("probe_port", "silent_grace"),
}
#: Limits a site may leave out (defaults.yaml has them all but these).
_OPTIONAL = {"limits": ("max_cmd_words", "max_env_vars")}
#: Limits that must be at least 1, and those where 0 means "no limit".
_POSITIVE_LIMITS = ("max_walltime", "max_np", "max_cmd_bytes", "max_cmd_words",
                    "max_env_bytes", "max_env_vars", "memory_per_slot_mb", "pids_per_slot",
                    "tmp_size_mb")
_ZERO_MEANS_NONE_LIMITS = ("max_running_jobs_per_user", "max_slots_per_user",
                           "max_queued_jobs_per_user")


# ------------------------------------------------------------------------ identities


def user_for_identity(identity):
    """
    The DockerMPI user name (directory, labels, records) of a JupyterHub user: the hub
    name itself when it is already a valid user name (:data:`USER_RE`), else its
    lowercased letters and digits with ``-`` for the rest, cut to 40, then ``-`` and 8
    hex digits of the name's SHA-256 (``Ann.Lee@example.org`` -> ``ann-lee-example-org-
    <hash>``), so two hub names never share a directory. (Someone may still register a
    hub name equal to another's mapped name: the master's store binds each user name to
    the first identity that used it.) RequestError for an empty or non-text identity.

    CLI Example:

    .. code-block:: python

        dmpi.settings.user_for_identity("Ann.Lee@example.org")
    """
    if not isinstance(identity, str) or not identity or len(identity) > 255:
        raise RequestError(f"{_shown(identity)} is not a hub user name")
    if USER_RE.match(identity):
        return identity
    base = re.sub(r"[^a-z0-9]+", "-", identity.lower()).strip("-")[:40].strip("-")
    digest = hashlib.sha256(identity.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{base or 'user'}-{digest}"


# ----------------------------------------------------------------------------- merge


def merge(defaults, pillar_mpi):
    """
    The ``mpi`` settings: ``pillar_mpi`` laid over ``defaults``, neither changed.

    Where both hold a mapping under a key, the mappings merge key by key; anything else
    set in pillar (a list, a scalar, ``None``) replaces the default. A missing or empty
    pillar (``None``) gives the defaults.

    defaults
        The ``mpi`` mapping of ``salt/dockermpi/defaults.yaml``.
    pillar_mpi
        The site's ``mpi`` pillar. Raises :class:`ConfigError` when it is not a mapping.

    CLI Example:

    .. code-block:: python

        config = dmpi.settings.merge(defaults["mpi"], pillar.get("mpi"))
    """
    if pillar_mpi is None:
        pillar_mpi = {}
    if not isinstance(defaults, dict):
        raise ConfigError([f"the defaults of mpi must be a mapping, got {_shown(defaults)}"])
    if not isinstance(pillar_mpi, dict):
        raise ConfigError([f"mpi must be a mapping of settings, got {_shown(pillar_mpi)}"])
    return _merged(defaults, pillar_mpi)


def _merged(base, over):
    result = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(result.get(key), dict) and isinstance(value, dict):
            result[key] = _merged(result[key], value)
        else:
            result[key] = copy.deepcopy(value)
    return result


# -------------------------------------------------------------------------- validate


def problems(config):
    """
    Everything wrong with merged ``mpi`` settings: a list of one-line messages, each
    naming the pillar key (``mpi:slots_per_node must be a whole number of at least 1,
    got 0``); empty when the settings are valid.

    config
        The merged settings (:func:`merge`).

    CLI Example:

    .. code-block:: python

        for line in dmpi.settings.problems(config):
            log.error("%s", line)
    """
    return _Checker(config).run()[1]


def validate(config):
    """
    The ``mpi`` settings, checked and normalised; raises :class:`ConfigError` with every
    problem, one per line, when anything is wrong.

    Normalised: networks in canonical CIDR form, absolute paths without trailing or
    doubled slashes, port ranges as ``[first, last]`` lists of ints, ``cpus_per_slot``
    a float. Everything else is returned as given, in a copy.

    config
        The merged settings (:func:`merge`).

    CLI Example:

    .. code-block:: python

        config = dmpi.settings.validate(dmpi.settings.merge(defaults, pillar))
    """
    normalised, found = _Checker(config).run()
    if found:
        raise ConfigError(found)
    return normalised


# --------------------------------------------------------------------------- helpers


def _shown(value):
    """``value`` for a message: one line of at most about 60 characters."""
    text = repr(value)
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS - 3] + "..."


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _key(*parts):
    return ":".join(("mpi",) + tuple(p for p in parts if p))


class _Checker:
    """One pass over the settings: ``run()`` returns (normalised copy, problems)."""

    def __init__(self, config):
        self.config = config
        self.found = []
        self.out = None

    def problem(self, message):
        self.found.append(message)

    def run(self):
        if not isinstance(self.config, dict):
            self.problem(f"mpi must be a mapping of settings, got {_shown(self.config)}")
            return self.config, self.found
        self.out = copy.deepcopy(self.config)
        sections = {}
        for section in ("users", "guest", "ports", "limits", "retention", "fair_share",
                        "selftest", "storage", "docker", "job_network", "firewall"):
            sections[section] = self.mapping(section)
        self.keys("", self.out)
        for section, value in sections.items():
            if value is not None:
                self.keys(section, value)
        nfs = gluster = quota = None
        if sections["storage"] is not None:
            found = {}
            for part in ("nfs", "glusterfs", "quota"):
                if part in sections["storage"]:
                    found[part] = self.mapping("storage", part)
                    if found[part] is not None:
                        self.keys(f"storage:{part}", found[part])
            nfs, gluster, quota = (found.get(p) for p in ("nfs", "glusterfs", "quota"))

        self.check_ids(sections["users"], sections["guest"])
        cluster = self.check_cluster_network()
        slots = self.whole("slots_per_node", minimum=1)
        self.choice(PLACEMENTS, "placement")
        self.choice(QUEUE_ORDERS, "queue_order")
        self.check_ports(sections["ports"], slots)
        self.check_limits(sections["limits"])
        if sections["retention"] is not None:
            for name in ("job_records_days", "job_dirs_days"):
                self.whole("retention", name, minimum=0, maximum=36500,
                           note=" (days; 0: keep forever)")
        if sections["fair_share"] is not None:
            for name in FAIR_SHARE_DURATIONS:
                self.duration("fair_share", name)
            for name, (low, high) in FAIR_SHARE_WEIGHTS.items():
                self.whole("fair_share", name, minimum=low, maximum=high)
        self.check_selftest(sections["selftest"])
        self.check_storage(sections["storage"], nfs)
        self.check_glusterfs(sections["storage"], gluster)
        self.check_quota(quota)
        self.check_docker(sections["docker"])
        self.check_job_network(sections["job_network"], cluster)
        self.check_images()
        self.check_image_facts()
        self.check_firewall(sections["firewall"])
        self.check_hub()
        self.check_api()
        self.check_engine()
        return self.out, self.found

    # ------------------------------------------------------------------- structure

    def mapping(self, *path):
        """The mapping at ``path`` (in the copy), or None after saying why."""
        parent = self.out
        for part in path[:-1]:
            parent = parent[part]
        if path[-1] not in parent:
            return None  # reported by keys() as missing
        value = parent[path[-1]]
        if not isinstance(value, dict):
            self.problem(f"{_key(*path)} must be a mapping, got {_shown(value)}")
            return None
        return value

    def keys(self, section, value):
        """Unknown keys (a typo leaves the default in force unnoticed) and missing ones."""
        known = _KEYS[section]
        optional = _OPTIONAL.get(section, ())
        for key in value:
            if key not in known:
                self.problem(
                    f"{_key(section, str(key))} is not a DockerMPI setting "
                    f"(the keys of {_key(section)} are: {', '.join(known)})"
                )
        for key in known:
            if key not in value and key not in optional:
                self.problem(f"{_key(section, key)} is required")

    def get(self, *path):
        """The value at ``path``, or a _Missing marker when a parent is unusable."""
        value = self.out
        for part in path:
            if not isinstance(value, dict) or part not in value:
                return _MISSING
            value = value[part]
        return value

    def put(self, path, value):
        parent = self.out
        for part in path[:-1]:
            parent = parent[part]
        parent[path[-1]] = value

    # ----------------------------------------------------------------- value checks

    def whole(self, *path, minimum=None, maximum=None, note=""):
        """A whole number at ``path`` within [minimum, maximum], or None after a problem."""
        value = self.get(*path)
        if value is _MISSING:
            return None
        bounds = ""
        if minimum is not None and maximum is not None:
            bounds = f" from {minimum} to {maximum}"
        elif minimum is not None:
            bounds = f" of at least {minimum}"
        if not _is_int(value) or (minimum is not None and value < minimum) or (
                maximum is not None and value > maximum):
            self.problem(f"{_key(*path)} must be a whole number{bounds}{note}, "
                         f"got {_shown(value)}")
            return None
        return value

    def number(self, *path, minimum=0):
        """A finite number at ``path`` of at least ``minimum``, or None after a problem."""
        value = self.get(*path)
        if value is _MISSING:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                not math.isfinite(value) or value < minimum:
            self.problem(f"{_key(*path)} must be a number of at least {minimum}, "
                         f"got {_shown(value)}")
            return None
        return value

    def boolean(self, *path):
        """True or False at ``path``, or None after a problem (YAML's ``yes`` is True
        already; a quoted ``"false"`` is a string, and refused)."""
        value = self.get(*path)
        if value is _MISSING:
            return None
        if not isinstance(value, bool):
            self.problem(f"{_key(*path)} must be true or false, got {_shown(value)}")
            return None
        return value

    def duration(self, *path):
        """Seconds of a duration at ``path``, written as a walltime is (``7d``, ``12h``;
        :func:`dmpi.jobs.request.parse_duration`), or None after a problem."""
        value = self.get(*path)
        if value is _MISSING:
            return None
        try:
            return parse_duration(value, _key(*path))
        except RequestError as exc:
            self.problem(str(exc))
            return None

    def choice(self, choices, *path):
        """One of ``choices`` at ``path`` (as it is when missing), or None after a problem."""
        value = self.get(*path)
        if value is not _MISSING and value not in choices:
            self.problem(f"{_key(*path)} must be one of {', '.join(choices)}, "
                         f"got {_shown(value)}")
            return None
        return value

    def text(self, *path, pattern, what, allow_empty=False):
        value = self.get(*path)
        if value is _MISSING:
            return None
        if allow_empty and value in ("", None):
            return value
        if not isinstance(value, str) or not pattern.match(value):
            self.problem(f"{_key(*path)} {_shown(value)} is not {what}")
            return None
        return value

    def path(self, *path):
        """An absolute path, normalised in the copy; None after a problem."""
        value = self.get(*path)
        if value is _MISSING:
            return None
        if not isinstance(value, str) or not value.startswith("/"):
            self.problem(f"{_key(*path)} must be an absolute path, got {_shown(value)}")
            return None
        if any(c.isspace() or not c.isprintable() for c in value):
            self.problem(f"{_key(*path)} {_shown(value)} must not contain white space "
                         "or control characters")
            return None
        parts = [p for p in value.split("/") if p not in ("", ".")]
        if ".." in parts:
            self.problem(f"{_key(*path)} {_shown(value)} must not contain '..'")
            return None
        if not parts:
            self.problem(f"{_key(*path)} must not be the root directory /")
            return None
        normalised = "/" + "/".join(parts)
        self.put(path, normalised)
        return normalised

    def network(self, *path):
        value = self.get(*path)
        if value is _MISSING:
            return None
        net = self.parsed_network(value, f"{_key(*path)} {_shown(value)}")
        if net is not None:
            self.put(path, str(net))
        return net

    def parsed_network(self, value, shown):
        """``value`` as an IPv4Network, or None after a problem naming it as ``shown``."""
        try:
            if not isinstance(value, str):
                raise ValueError("not text")
            return ipaddress.IPv4Network(value, strict=True)
        except ValueError as exc:
            self.problem(f"{shown} is not an IPv4 network in CIDR form with no host bits "
                         f"set ({exc})")
            return None

    def listing(self, *path, what):
        """The list at ``path`` (``key:`` with every entry commented out is an empty
        one), or None when it is missing or, after a problem, not a list."""
        value = self.get(*path)
        if value is _MISSING:
            return None
        if value is None:
            value = []
            self.put(path, value)
        if not isinstance(value, list):
            self.problem(f"{_key(*path)} must be a list of {what}, got {_shown(value)}")
            return None
        return value

    # ----------------------------------------------------------------------- checks

    def check_ids(self, users, guest):
        uid_min = uid_max = None
        if users is not None:
            uid_min = self.whole("users", "uid_min", minimum=UID_FLOOR, maximum=ID_MAX,
                                 note=" (below it are the hosts' system accounts)")
            uid_max = self.whole("users", "uid_max", minimum=UID_FLOOR, maximum=ID_MAX)
            if uid_min is not None and uid_max is not None:
                if uid_min >= uid_max:
                    self.problem(f"mpi:users:uid_min {uid_min} must be below "
                                 f"mpi:users:uid_max {uid_max}")
                    uid_min = uid_max = None
                elif uid_min <= NOBODY_ID <= uid_max:
                    self.problem(f"mpi:users {uid_min}-{uid_max} includes {NOBODY_ID} "
                                 "(nobody, which NFS maps root to): move the range")
        if guest is None:
            return
        self.text("guest", "user", pattern=ACCOUNT_RE,
                  what="a POSIX account name (a-z, 0-9, '_', '-', at most 32)")
        self.text("guest", "group", pattern=ACCOUNT_RE,
                  what="a POSIX group name (a-z, 0-9, '_', '-', at most 32)")
        for key, why in (("uid", "a user's uid must differ from the guest account's"),
                         ("gid", "a user's private group (gid = uid) must differ from the "
                                 "guest group")):
            value = self.whole("guest", key, minimum=1, maximum=ID_MAX, note=" (not root)")
            if None not in (value, uid_min, uid_max) and uid_min <= value <= uid_max:
                self.problem(f"mpi:guest:{key} {value} lies inside mpi:users "
                             f"{uid_min}-{uid_max}: {why}")

    def check_cluster_network(self):
        net = self.network("cluster_network")
        if net is not None and net.prefixlen > 30:
            self.problem(f"mpi:cluster_network {net} is too small: it must hold the nodes, "
                         "a gateway and the job address pool")
            return None
        return net

    def check_ports(self, ports, slots):
        if ports is None:
            return
        ranges = {}
        for name in (n for n in PORT_RANGES if n in ports):
            value = ports[name]
            if not isinstance(value, (list, tuple)) or len(value) != 2 or \
                    not all(_is_int(p) for p in value):
                self.problem(f"mpi:ports:{name} must be a list of two whole numbers "
                             f"[first, last], got {_shown(value)}")
                continue
            first, last = value
            if not (PORT_MIN <= first <= PORT_MAX and PORT_MIN <= last <= PORT_MAX):
                self.problem(f"mpi:ports:{name} {first}-{last} must lie within "
                             f"{PORT_MIN}-{PORT_MAX} (jobs listen on them as their "
                             "user's uid)")
                continue
            if first > last:
                self.problem(f"mpi:ports:{name} {first}-{last} is empty: the first port "
                             "is above the last")
                continue
            ranges[name] = (first, last)
            self.put(("ports", name), [first, last])
        checked = list(ranges.items())
        for i, (name, (first, last)) in enumerate(checked):
            for other, (ofirst, olast) in checked[i + 1:]:
                if first <= olast and ofirst <= last:
                    self.problem(f"mpi:ports:{name} {first}-{last} overlaps "
                                 f"mpi:ports:{other} {ofirst}-{olast}")
        if "oob" in ranges:
            first, last = ranges["oob"]
            if last - first + 1 < MIN_OOB_PORTS:
                self.problem(f"mpi:ports:oob {first}-{last} has {last - first + 1} port(s); "
                             f"a job needs at least {MIN_OOB_PORTS} (mpirun and an orted, "
                             "each on IPv4 and IPv6)")
        if "btl" in ranges and slots is not None:
            first, last = ranges["btl"]
            needed = BTL_PORTS_PER_SLOT * slots
            if last - first + 1 < needed:
                self.problem(f"mpi:ports:btl {first}-{last} has {last - first + 1} port(s); "
                             f"mpi:slots_per_node {slots} needs at least {needed} (each "
                             "rank listens on IPv4 and IPv6)")

    def check_limits(self, limits):
        if limits is None:
            return
        for name in _POSITIVE_LIMITS:
            if name in limits:
                self.whole("limits", name, minimum=1)
        for name in _ZERO_MEANS_NONE_LIMITS:
            self.whole("limits", name, minimum=0, note=" (0: no limit)")
        if "cpus_per_slot" in limits:
            value = limits["cpus_per_slot"]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                    not math.isfinite(value) or value <= 0:
                self.problem("mpi:limits:cpus_per_slot must be a number above 0 (CPUs per "
                             f"rank), got {_shown(value)}")
            else:
                self.put(("limits", "cpus_per_slot"), float(value))

    def check_selftest(self, selftest):
        if selftest is None:
            return
        self.text("selftest", "user", pattern=USER_RE, what="a DockerMPI user name")
        self.text("selftest", "image", pattern=IMAGE_NAME_RE,
                  what="an image short name (a key of mpi:images)")
        for name, (low, high) in SELFTEST_COUNTS.items():
            self.whole("selftest", name, minimum=low, maximum=high)
        for name in SELFTEST_THRESHOLDS:
            self.number("selftest", name)
        self.boolean("selftest", "exclude_failed_nodes")

    def check_storage(self, storage, nfs):
        if storage is None:
            return
        kind = self.choice(STORAGE_TYPES, "storage", "type")
        path = self.path("storage", "path")
        export = None
        if nfs is not None:
            self.storage_server(kind, "nfs", "NFS")
            export = self.path("storage", "nfs", "export")
            self.choice(NFS_SECURITY, "storage", "nfs", "security")
            options = nfs.get("mount_options", _MISSING)
            if self.mount_options("nfs") and options is not _MISSING and \
                    any(o.startswith("sec=") for o in options):
                self.problem("mpi:storage:nfs:mount_options must not hold sec=: "
                             "mpi:storage:nfs:security sets it for the export and the "
                             "mounts alike")
        job_root = self.path("job_root")
        if job_root is None:
            return
        shared = [("mpi:storage:path", path)]
        if kind == "nfs":
            shared.append(("mpi:storage:nfs:export", export))
        for key, where in shared:
            if where is not None and _inside(job_root, where):
                self.problem(f"mpi:job_root {job_root} lies inside {key} {where}: per-job "
                             "secrets must stay on node-local disk")

    def check_glusterfs(self, storage, gluster):
        if storage is None or gluster is None:
            return
        self.storage_server(storage.get("type"), "glusterfs", "GlusterFS")
        self.text("storage", "glusterfs", "volume", pattern=_GLUSTER_VOLUME_RE,
                  what="a GlusterFS volume name (letters, digits, '-', '_')")
        brick = self.path("storage", "glusterfs", "brick")
        path = storage.get("path")
        if brick is not None and storage.get("type") == "glusterfs" and \
                isinstance(path, str) and path.strip("/") and _inside(brick, path):
            self.problem(f"mpi:storage:glusterfs:brick {brick} lies inside mpi:storage:path: "
                         "the brick is the server's own directory, never the mount")
        clients = self.listing("storage", "glusterfs", "clients",
                               what="host addresses, names or GlusterFS patterns")
        if clients and not all(isinstance(c, str) and _GLUSTER_CLIENT_RE.match(c)
                               for c in clients):
            self.problem("mpi:storage:glusterfs:clients must list addresses, host names or "
                         f"GlusterFS patterns (10.0.0.*), got {_shown(clients)}")
        elif clients and len(",".join(clients)) > MAX_OPTION_CHARS:
            self.problem(f"mpi:storage:glusterfs:clients takes {len(','.join(clients))} "
                         f"characters in auth.allow, more than the {MAX_OPTION_CHARS} "
                         "glusterd saves safely: give patterns (10.0.0.*) for whole "
                         "networks of hosts")
        elif storage.get("type") == "glusterfs" and clients == []:
            self.check_glusterfs_clients_derived()
        options = gluster.get("options", _MISSING)
        if options is not _MISSING and options is not None and not (
                isinstance(options, dict) and all(
                    isinstance(k, str) and _GLUSTER_OPTION_RE.match(k)
                    and isinstance(v, (str, int)) and not isinstance(v, bool)
                    for k, v in options.items())):
            self.problem("mpi:storage:glusterfs:options must map GlusterFS volume options "
                         f"to values ({{performance.cache-size: 256MB}}), got {_shown(options)}")
        elif isinstance(options, dict) and (taken := sorted(set(options) & set(OWN_OPTIONS))):
            self.problem("mpi:storage:glusterfs:options cannot set DockerMPI's own volume "
                         f"options: {', '.join(taken)}")
        self.mount_options("glusterfs")

    def storage_server(self, kind, part, shown):
        """``mpi:storage:<part>:server``: required when the storage type is ``part``, a
        host name or IPv4 address when given."""
        server = self.get("storage", part, "server")
        if kind == part and server in ("", None):
            self.problem(f"mpi:storage:{part}:server must name the {shown} server when "
                         f"mpi:storage:type is {part}")
        elif server not in ("", None, _MISSING) and not _is_host(server):
            self.problem(f"mpi:storage:{part}:server {_shown(server)} is not a host name "
                         "or IPv4 address")

    def mount_options(self, part):
        """Whether ``mpi:storage:<part>:mount_options`` is missing or a list of mount
        options (one per item, no commas); says why not."""
        options = self.get("storage", part, "mount_options")
        if options is _MISSING or (isinstance(options, list) and all(
                isinstance(o, str) and _MOUNT_OPTION_RE.match(o) for o in options)):
            return True
        self.problem(f"mpi:storage:{part}:mount_options must be a list of mount "
                     f"options (one per item, no commas), got {_shown(options)}")
        return False

    def check_glusterfs_clients_derived(self):
        """Without clients listed, auth.allow gets patterns of the hosts' part of the
        cluster network (:func:`dmpi.storage.glusterfs.address_patterns`): too many of
        them is a problem to name now."""
        try:
            networks = host_networks(self.get("cluster_network"),
                                     self.get("job_network", "addresses"))
        except (TypeError, ValueError):
            return  # named by the network checks
        try:
            address_patterns(networks)
        except RequestError as exc:
            self.problem(f"mpi:storage:glusterfs:clients must be given: {exc}")

    def check_quota(self, quota):
        if quota is None:
            return
        for name in ("size_mb", "files"):
            self.whole("storage", "quota", name, minimum=0, note=" (0: no limit)")
        self.whole("storage", "quota", "reserve_percent", minimum=0, maximum=99,
                   note=" (percent of the volume; 0: none)")
        users = self.get("storage", "quota", "users")
        if users is _MISSING:
            return
        if users is None:
            self.put(("storage", "quota", "users"), {})
            return
        if not isinstance(users, dict):
            self.problem("mpi:storage:quota:users must map user names to their limits, got "
                         f"{_shown(users)}")
            return
        for user, limits in users.items():
            where = f"mpi:storage:quota:users:{user}"
            if not isinstance(user, str) or not USER_RE.match(user):
                self.problem(f"mpi:storage:quota:users has {_shown(user)}, not a user name")
            elif not isinstance(limits, dict) or not limits or \
                    not set(limits) <= {"size_mb", "files"}:
                self.problem(f"{where} must set size_mb, files or both, got {_shown(limits)}")
            else:
                for name, value in limits.items():
                    if not _is_int(value) or value < 0:
                        self.problem(f"{where}:{name} must be a whole number of at least 0 "
                                     f"(0: no limit), got {_shown(value)}")

    def check_docker(self, docker):
        if docker is None:
            return
        self.text("docker", "package", pattern=_PACKAGE_RE, what="a Debian package name")
        size = docker.get("log_max_size", _MISSING)
        if size is not _MISSING and not (
                (_is_int(size) and size >= 1)
                or (isinstance(size, str) and _LOG_SIZE_RE.match(size))):
            self.problem("mpi:docker:log_max_size must be a size such as 10m (a whole "
                         f"number, optionally with k, m or g), got {_shown(size)}")
        self.whole("docker", "log_max_file", minimum=1)
        registries = self.listing("docker", "insecure_registries", what="host:port entries")
        for entry in registries or ():
            if not isinstance(entry, str) or not _REGISTRY_RE.match(entry):
                self.problem(f"mpi:docker:insecure_registries entry {_shown(entry)} must be "
                             "host:port (or a CIDR), without a scheme or path")
        credentials = self.get("docker", "registry_credentials")
        if credentials is None:
            credentials = {}
            self.put(("docker", "registry_credentials"), credentials)
        if credentials is not _MISSING and not isinstance(credentials, dict):
            self.problem("mpi:docker:registry_credentials must be a mapping of registry "
                         f"(host:port) to username and password, got a "
                         f"{type(credentials).__name__}")
        elif credentials is not _MISSING:
            for registry, login in credentials.items():
                if not isinstance(registry, str) or not _REGISTRY_HOST_RE.match(registry):
                    self.problem(f"mpi:docker:registry_credentials key {_shown(registry)} "
                                 "must be a registry as image references name it (host or "
                                 "host:port, without a scheme or path)")
                    continue
                if not isinstance(login, dict) or set(login) != {"username", "password"} \
                        or not all(isinstance(v, str) and v for v in login.values()):
                    # Never show the value: it holds a password.
                    self.problem(f"mpi:docker:registry_credentials:{registry} must be a "
                                 "mapping of exactly username and password, both non-empty "
                                 "text")

    def check_job_network(self, job_network, cluster):
        if job_network is None:
            return
        self.text("job_network", "name", pattern=DOCKER_NAME_RE,
                  what="a Docker network name (letters, digits, '_', '.', '-', starting "
                       "with a letter or digit, at most 64)")
        self.text("job_network", "parent", pattern=_INTERFACE_RE, allow_empty=True,
                  what="an interface name (at most 15 letters, digits, '_', '.', '-'; "
                       "'' for the one holding the node's cluster address)")
        self.whole("job_network", "standby", minimum=0, maximum=MAX_STANDBY_NAMESPACES,
                   note=" (network namespaces a node keeps made ahead of jobs)")
        self.check_unreachable()
        addresses = job_network.get("addresses", _MISSING)
        if addresses is _MISSING:
            return
        if addresses in ("", None):
            self.problem("mpi:job_network:addresses is required: it must name the job "
                         "address pool, an IPv4 network (CIDR) inside mpi:cluster_network "
                         "holding no node's address, e.g. 10.0.200.0/24")
            return
        pool = self.network("job_network", "addresses")
        if pool is None:
            return
        hosts = pool.num_addresses if pool.prefixlen >= 31 else pool.num_addresses - 2
        if hosts < 2:
            self.problem(f"mpi:job_network:addresses {pool} has {hosts} host address; "
                         "a job on two nodes needs at least 2")
        if cluster is None:
            return
        if not pool.subnet_of(cluster):
            self.problem(f"mpi:job_network:addresses {pool} is not inside "
                         f"mpi:cluster_network {cluster}")
        elif pool == cluster:
            self.problem(f"mpi:job_network:addresses {pool} is the whole of "
                         "mpi:cluster_network: the pool must leave room for the nodes "
                         "and the gateway")

    def check_unreachable(self):
        networks = self.listing("job_network", "unreachable", what="IPv4 networks (CIDR)")
        if networks is None:
            return
        parsed = [self.parsed_network(entry,
                                      f"mpi:job_network:unreachable entry {_shown(entry)}")
                  for entry in networks]
        self.put(("job_network", "unreachable"), [str(net) for net in parsed if net])

    def top_mapping(self, key, what):
        """The mapping ``mpi:<key>`` ({} when every entry is commented out), or None when
        it is missing or, after saying so, not a mapping."""
        value = self.get(key)
        if value is _MISSING:
            return None
        if value is None:
            value = {}
            self.put((key,), value)
        if not isinstance(value, dict):
            self.problem(f"mpi:{key} must be {what}, got {_shown(value)}")
            return None
        return value

    def check_images(self):
        images = self.top_mapping("images", "a mapping of short names to image references "
                                            "pinned by digest")
        if images is None:
            return
        for name, reference in images.items():
            if not isinstance(name, str) or not IMAGE_NAME_RE.match(name):
                self.problem(f"mpi:images: {_shown(name)} is not an image short name "
                             "(letters, digits, '.', '_', '-', at most 128)")
                continue
            if not isinstance(reference, str) or not IMAGE_REFERENCE_RE.match(reference):
                self.problem(f"mpi:images:{name} {_shown(reference)} is not pinned by digest: "
                             "expected registry/repo@sha256:<64 lower-case hex digits>, "
                             "with no tag")

    def check_image_facts(self):
        """``mpi:image_facts:<approved name>``: the MPI a site says an image holds, in
        place of what the nodes' probe found (flavour, version, launcher)."""
        facts = self.top_mapping("image_facts", "a mapping of approved image names to "
                                                "{flavour, version, launcher}")
        if facts is None:
            return
        images = self.get("images")
        approved = images if isinstance(images, dict) else {}
        for name, given in facts.items():
            if name not in approved:
                self.problem(f"mpi:image_facts: {_shown(name)} is not an approved image "
                             f"(mpi:images has: {', '.join(sorted(map(str, approved))) or 'none'})")
                continue
            if not isinstance(given, dict) or not given \
                    or set(given) - {"flavour", "version", "launcher"}:
                self.problem(f"mpi:image_facts:{name} must be a mapping of some of flavour, "
                             f"version, launcher; got {_shown(given)}")
                continue
            self.choice(tuple(FLAVOUR_NAMES), "image_facts", name, "flavour")
            self.text("image_facts", name, "version", pattern=_VERSION_RE,
                      what="a version (digits, letters, '.', '-', at most 32)")
            self.path("image_facts", name, "launcher")

    def check_firewall(self, firewall):
        if firewall is None:
            return
        chain = self.text("firewall", "chain", pattern=_CHAIN_RE,
                          what="an iptables chain name (1-28 letters, digits, '-', '_')")
        if chain is not None and (chain.upper() in FOREIGN_CHAINS
                                  or chain.upper().startswith("DOCKER-")):
            self.problem(f"mpi:firewall:chain {chain} belongs to iptables or Docker: "
                         "DockerMPI needs a chain of its own")
        rules = self.path("firewall", "rules_file")
        rules6 = self.path("firewall", "rules_file_ipv6")
        if rules is not None and rules == rules6:
            self.problem(f"mpi:firewall:rules_file_ipv6 {rules6} is the same file as "
                         "mpi:firewall:rules_file")

    def check_hub(self):
        """``mpi:hub``: the JupyterHub host (salt/dockermpi/hub). What only the hub needs
        (its URLs, a password or OAuth client) may stay empty here; the hub's own states
        refuse to run without it."""
        hub = self.mapping("hub")
        if hub is None:
            return
        self.keys("hub", hub)
        parts = {}
        for part in ("dummy", "github", "pip", "limits", "tls"):
            if part in hub:
                parts[part] = self.mapping("hub", part)
                if parts[part] is not None:
                    self.keys(f"hub:{part}", parts[part])
        default = self.text("hub", "image", pattern=IMAGE_NAME_RE,
                            what="an approved image's short name (a key of mpi:images)")
        offered = self.get("hub", "images")
        if offered is not _MISSING and offered is not None:
            if not isinstance(offered, list) or not all(
                    isinstance(n, str) and IMAGE_NAME_RE.match(n) for n in offered):
                self.problem(f"mpi:hub:images must be a list of approved images' short names "
                             f"(keys of mpi:images), got {_shown(offered)}")
            elif offered and default is not None and default not in offered:
                self.problem(f"mpi:hub:images must hold mpi:hub:image ({default}), the image "
                             f"the spawn form offers first, got {_shown(offered)}")
        for key, schemes, required in (("bind_url", ("http", "https"), True),
                                       ("hub_bind_url", ("http",), True),
                                       ("hub_api_url", ("http", "https"), False),
                                       ("api_url", ("http", "https"), False),
                                       ("api_service_url", ("http", "https"), False)):
            self.url(("hub", key), schemes, required)
        self.token_hop(("hub", "api_service_url"), "the hub's proxy and spawner send users' "
                       "tokens there", "mpi:api:tls")
        service_url = self.get("hub", "api_service_url")
        found = endpoint(service_url)
        if found and not is_loopback(found[0]) and not _is_address(found[0]):
            self.problem("mpi:hub:api_service_url must name the API's host by its IPv4 address "
                         "(notebooks call the API there, and the hub host's firewall lets "
                         f"them reach that address alone), got {_shown(service_url)}")
        if parts.get("tls") is not None:
            self.pem("hub", "tls")
        self.check_hub_origins()
        self.path("hub", "venv")
        self.path("hub", "state_dir")
        kind = self.choice(HUB_AUTHENTICATORS, "hub", "authenticator")
        for path in (("admin_users",), ("dummy", "allowed_users"),
                     ("github", "allowed_organizations")):
            value = self.get("hub", *path)
            if value is None:
                value = []
                if path[0] in hub and (len(path) == 1 or parts.get(path[0]) is not None):
                    self.put(("hub",) + path, value)
            if value is not _MISSING and (
                    not isinstance(value, list)
                    or not all(isinstance(v, str) and v.strip() == v and v for v in value)):
                self.problem(f"{_key('hub', *path)} must be a list of names, got "
                             f"{_shown(value)}")
        for path in (("admin_token",), ("dummy", "password"), ("github", "client_id"),
                     ("github", "client_secret")):
            value = self.get("hub", *path)
            if value is not _MISSING and value is not None and not isinstance(value, str):
                self.problem(f"{_key('hub', *path)} must be text, got a {type(value).__name__}")
        token = self.get("hub", "admin_token")
        if isinstance(token, str) and token and len(token) < 16:
            self.problem("mpi:hub:admin_token must be at least 16 characters (it is an admin "
                         "API token of the hub), or '' for no admin service")
        package = self.get("hub", "github", "package")
        if package is not _MISSING and not (
                isinstance(package, str) and _PINNED_PACKAGE_RE.match(package)):
            self.problem("mpi:hub:github:package must be a pinned requirement "
                         f"name==version, got {_shown(package)}")
        if kind == "github":
            for key in ("client_id", "client_secret", "callback_url"):
                if self.get("hub", "github", key) in ("", None):
                    self.problem(f"mpi:hub:github:{key} is required when "
                                 "mpi:hub:authenticator is github")
            self.url(("hub", "github", "callback_url"), ("https", "http"), False)
        if parts.get("pip") is not None:
            self.url(("hub", "pip", "index_url"), ("https", "http"), False)
            links = self.get("hub", "pip", "find_links")
            if links not in ("", None, _MISSING) and not (
                    isinstance(links, str) and not any(c.isspace() for c in links)):
                self.problem("mpi:hub:pip:find_links must be a directory or URL without "
                             f"white space, got {_shown(links)}")
            no_index = self.boolean("hub", "pip", "no_index")
            if no_index is True and links in ("", None):
                self.problem("mpi:hub:pip:no_index needs mpi:hub:pip:find_links (where "
                             "else would pip find the hub's packages?)")
        if parts.get("limits") is not None:
            self.whole("hub", "limits", "memory_mb", minimum=64)
            self.whole("hub", "limits", "pids", minimum=16)
            self.whole("hub", "limits", "tmp_size_mb", minimum=16)
            cpus = self.get("hub", "limits", "cpus")
            if cpus is not _MISSING:
                if isinstance(cpus, bool) or not isinstance(cpus, (int, float)) or \
                        not math.isfinite(cpus) or cpus <= 0:
                    self.problem("mpi:hub:limits:cpus must be a number above 0 (CPUs of "
                                 f"a notebook), got {_shown(cpus)}")
                else:
                    self.put(("hub", "limits", "cpus"), float(cpus))
        self.whole("hub", "panel_refresh_seconds", minimum=5, maximum=3600)

    def token_hop(self, path, why, tls):
        """A URL that users' tokens travel to between hosts: https, or http to loopback."""
        value = self.get(*path)
        match = isinstance(value, str) and _URL_RE.match(value)
        if match and match.group("scheme") == "http" and not is_encrypted_or_local(value):
            self.problem(f"{_key(*path)} must be https (or http to a loopback address): "
                         f"{why}, so a host on the network could read them; got "
                         f"{_shown(value)} (give the endpoint a certificate: {tls})")

    def pem(self, section, part):
        """``mpi:<section>:<part>``: each of cert, key, ca '' or PEM text of its kind."""
        for key, kinds in _PEM_KINDS.items():
            value = self.get(section, part, key)
            if value in (_MISSING, None, ""):
                if value is None:
                    self.put((section, part, key), "")
                continue
            begins = [f"-----BEGIN {kind}-----" for kind in kinds]
            if not isinstance(value, str) or not any(b in value for b in begins):
                self.problem(f"{_key(section, part, key)} must be PEM text beginning "
                             f"{begins[0]} (or ''), got {_shown(value)}")

    def check_hub_origins(self):
        """``mpi:hub:subdomain_host`` (each user's server on a subdomain of its own, the
        API on one of its own) and ``mpi:hub:notebook_hosts`` (names notebooks resolve)."""
        public_scheme = None
        bind_url = self.get("hub", "bind_url")
        if isinstance(bind_url, str) and _URL_RE.match(bind_url):
            public_scheme = urllib.parse.urlsplit(bind_url).scheme
            # The proxy serves users, the hub's pages and the API on its one port, so each
            # of its public URLs has the scheme it listens with.
            for key in ("subdomain_host", "api_url"):
                value = self.get("hub", key)
                scheme = (isinstance(value, str) and _URL_RE.match(value)
                          and urllib.parse.urlsplit(value).scheme)
                if scheme in ("http", "https") and scheme != public_scheme:
                    self.problem(f"mpi:hub:{key} must be {public_scheme}:// as the proxy "
                                 f"listens (mpi:hub:bind_url {bind_url}), got {_shown(value)}")
        subdomain_host = self.url(("hub", "subdomain_host"), ("https", "http"), False)
        if subdomain_host is not None:
            parsed = urllib.parse.urlsplit(subdomain_host)
            if parsed.path not in ("", "/"):
                self.problem("mpi:hub:subdomain_host must be scheme://host[:port] without a "
                             f"path (users' servers are <name>.host), got {_shown(subdomain_host)}")
            elif not _is_host(parsed.hostname) or _is_address(parsed.hostname):
                self.problem("mpi:hub:subdomain_host needs a DNS name whose subdomains "
                             f"resolve to the hub (wildcard DNS), got {_shown(subdomain_host)}")
            else:
                api_url = self.get("hub", "api_url")
                service_host = f"{API_SERVICE_NAME}--service.{parsed.hostname.lower()}"
                api_host = (urllib.parse.urlsplit(api_url).hostname
                            if isinstance(api_url, str) and _URL_RE.match(api_url) else None)
                if api_host is not None and api_host != service_host:
                    self.problem(
                        f"mpi:hub:api_url must be on the API's own origin, host "
                        f"{service_host}, when mpi:hub:subdomain_host is set (the proxy serves "
                        f"the {API_SERVICE_NAME} service there and nowhere else), got "
                        f"{_shown(api_url)}")
        hosts = self.get("hub", "notebook_hosts")
        if hosts is None:
            self.put(("hub", "notebook_hosts"), {})
        elif hosts is not _MISSING:
            if not isinstance(hosts, dict):
                self.problem("mpi:hub:notebook_hosts must be a mapping of host name to IPv4 "
                             f"address, got {_shown(hosts)}")
                return
            for name, address in hosts.items():
                if not _is_host(name) or _is_address(name):
                    self.problem(f"mpi:hub:notebook_hosts: {_shown(name)} is not a host name")
                elif not _is_address(address):
                    self.problem(f"mpi:hub:notebook_hosts:{name} must be an IPv4 address, "
                                 f"got {_shown(address)}")

    def check_engine(self):
        """``mpi:engine``: how the master's job controller judges a silent node (dmpi.jobs.rules)."""
        engine = self.mapping("engine")
        if engine is None:
            return
        self.keys("engine", engine)
        self.whole("engine", "probe_port", minimum=1, maximum=PORT_MAX,
                   note=" (a TCP port every node's host answers or refuses on)")
        # Longer than a node's heartbeat timeout, or the grace could never apply; a day
        # at most, so a node that never comes back still ends its jobs.
        self.whole("engine", "silent_grace", minimum=0, maximum=86400,
                   note=" (seconds; 0: a silent node's jobs fail after 5 s, whatever its "
                        "host answers)")

    def check_api(self):
        """``mpi:api``: DockerMPI's user API on the master (salt/dockermpi/api)."""
        api = self.mapping("api")
        if api is None:
            return
        self.keys("api", api)
        host = self.get("api", "host")
        if host is not _MISSING:
            try:
                ipaddress.ip_address(host if isinstance(host, str) else "")
            except ValueError:
                self.problem(f"mpi:api:host must be an IP address to listen on, got {_shown(host)}")
        self.whole("api", "port", minimum=1, maximum=PORT_MAX)
        self.whole("api", "token_cache_seconds", minimum=0, maximum=3600)
        self.url(("api", "hub_api_url"), ("http", "https"), False)
        self.token_hop(("api", "hub_api_url"), "the API sends each caller's token "
                       "there to ask the hub whose it is", "mpi:hub:tls, and this URL on the hub's proxy")
        if "tls" in api and self.mapping("api", "tls") is not None:
            self.keys("api:tls", self.get("api", "tls"))
            self.pem("api", "tls")
        clients = self.listing("api", "allowed_clients", what="IP addresses or networks")
        for client in clients or ():
            try:
                ipaddress.ip_network(client if isinstance(client, str) else "", strict=False)
            except ValueError:
                self.problem("mpi:api:allowed_clients must list IP addresses or networks, got "
                             f"{_shown(client)}")
        if "limits" in api and self.mapping("api", "limits") is not None:
            self.keys("api:limits", self.get("api", "limits"))
            for key in API_LIMITS:
                self.whole("api", "limits", key, minimum=1)

    def url(self, path, schemes, required):
        """An absolute URL with one of ``schemes`` and a host; '' allowed unless required."""
        value = self.get(*path)
        if value is _MISSING or (not required and value in ("", None)):
            return None
        match = isinstance(value, str) and _URL_RE.match(value)
        if not match or match.group("scheme") not in schemes:
            shapes = " or ".join(f"{s}://host[:port][/path]" for s in schemes)
            self.problem(f"{_key(*path)} must be a URL {shapes}, got {_shown(value)}")
            return None
        return value


class _Missing:
    """A key absent from the settings (reported once, by ``keys``)."""

    def __repr__(self):
        return "<missing>"


_MISSING = _Missing()


def _inside(path, directory):
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def is_encrypted_or_local(url):
    """A token sent to ``url`` is encrypted (https) or never leaves this machine (http to
    a loopback address)."""
    parsed = urllib.parse.urlsplit(url if isinstance(url, str) else "")
    return parsed.scheme == "https" or (parsed.scheme == "http" and is_loopback(parsed.hostname))


def endpoint(url):
    """``(host, port)`` a URL connects to (the scheme's port when it names none), or None
    for what is no http(s) URL with a host.

    CLI Example:

    .. code-block:: python

        dmpi.settings.endpoint("https://10.0.0.2:8001")  # ("10.0.0.2", 8001)
    """
    parsed = urllib.parse.urlsplit(url if isinstance(url, str) else "")
    try:
        port = parsed.port
    except ValueError:
        return None
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        return None
    return parsed.hostname, port or (443 if parsed.scheme == "https" else 80)


def host_networks(cluster_network, job_addresses):
    """The cluster network without the job address pool, as the fewest CIDRs in address
    order: where hosts are, and no job is (an NFS export's clients, say)."""
    cluster = ipaddress.IPv4Network(cluster_network)
    pool = ipaddress.IPv4Network(job_addresses)
    if not pool.subnet_of(cluster):
        return [str(cluster)]
    return [str(net) for net in sorted(cluster.address_exclude(pool))]


def is_loopback(host):
    """``host`` (of a URL) is this machine's loopback: localhost or 127/8, ::1."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host or "").is_loopback
    except ValueError:
        return False


def _is_address(value):
    try:
        ipaddress.IPv4Address(value if isinstance(value, str) else "")
        return True
    except ValueError:
        return False


def _is_host(value):
    if not isinstance(value, str):
        return False
    try:
        ipaddress.IPv4Address(value)
        return True
    except ValueError:
        pass
    # a dotted quad that is not an address (10.0.0.300) is no host name either
    if re.match(r"^[0-9.]+\Z", value):
        return False
    return bool(_HOSTNAME_RE.match(value)) and len(value) <= 253
