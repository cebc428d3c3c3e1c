"""The DockerMPI test cluster: one master host and N node hosts, each a container.

Every host boots systemd, so Salt and (once highstate has run) each node's own Docker
engine are managed as services, as on real hosts. Layout on this machine:

- network ``dmpi-cluster`` (10.251.1.0/24): the cluster network. master .2, nodes .11...
- network ``dmpi-site`` (10.251.2.0/24): the site LAN the nodes also sit on; a host here
  that is not on the cluster network must not reach sshd or MPI ports.
- storage host ``dmpi-storage`` (minion ``storage``, 10.251.1.6, role
  mpi-glusterfs-server): a GlusterFS server (the kernel here has no NFS) whose brick is
  the volume ``dmpi-storage-brick``; highstate makes the volume, and every node and the
  hub mount it at /srv/dockermpi through FUSE (pillar ``storage.type: glusterfs``), with
  each user's directory under a quota.
- volume ``dmpi-<node>-docker``: each node engine's /var/lib/docker (overlay2 needs it).
- hub host ``dmpi-hub`` (minion ``hub``, 10.251.1.5, role mpi-hub): JupyterHub, spawning
  each user's notebook on its own engine (volume ``dmpi-hub-docker``); its proxy's port
  8000 (https, a certificate from the cluster's own CA: tests/cluster/tls.py) is
  published on 127.0.0.1:$DMPI_HUB_PORT (18000). The master host also runs a
  minion (``master``, role mpi-master) for its user API (the mpi_api engine); highstate runs there first.

Everything is built offline: a debootstrapped Debian base, a local wheelhouse for Salt,
and the MPI and notebook images pushed to the registry on the master host.
"""

import concurrent.futures
import contextlib
import fcntl
import functools
import hashlib
import http.client
import io
import json
import os
import pathlib
import posixpath
import shutil
import socket
import ssl
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ElementTree

import docker
import docker.errors
import yaml

from tests.cluster import tls
from tests.cluster.runner_session import RunnerSession, SessionError

REPO = pathlib.Path(__file__).resolve().parents[2]
FILES = pathlib.Path(__file__).resolve().parent / "files"
CACHE = pathlib.Path(os.environ.get("DMPI_CACHE", "/var/cache/dockermpi"))
WHEELHOUSE = CACHE / "wheelhouse"
NPM_CACHE = CACHE / "npm-cache"  # the jobs panel's npm packages (images/notebook/fill-npm-cache)
# The registry's storage outlives the cluster (`down` keeps it), so a rebuilt cluster's
# pushes find their layers there; past REGISTRY_STORE_MAX_BYTES it starts empty again.
REGISTRY_STORE = CACHE / "registry"
REGISTRY_STORE_MAX_BYTES = 12 * 2**30

LABEL = "io.dockermpi.testcluster"
BASE_IMAGE = "dockermpi/debian:bookworm"
CLUSTER_NET = ("dmpi-cluster", "10.251.1.0/24", "10.251.1.1")
SITE_NET = ("dmpi-site", "10.251.2.0/24", "10.251.2.1")
MASTER = "dmpi-master"
MASTER_ADDR = "10.251.1.2"
#: The job store on the master host (the master's cachedir/dockermpi).
JOB_STORE = "/var/cache/salt/master/dockermpi/jobs.sqlite"
REGISTRY = f"{MASTER_ADDR}:5000"  # read-only: what nodes pull from
REGISTRY_PUSH_PORT = 5001  # the same storage, writable from this machine alone
MINION_REPAIR_AFTER = 45  # seconds; minions answer within 20 s of a (re)start here
REGISTRY_HOST_PORT = int(os.environ.get("DMPI_REGISTRY_PORT", "15000"))
SHARED_PATH = "/srv/dockermpi"
STORAGE = "dmpi-storage"
STORAGE_ADDR = "10.251.1.6"
STORAGE_ROLE_GRAINS = {"roles": ["mpi-glusterfs-server"]}
#: Where the storage host keeps the volume's brick (pillar mpi:storage:glusterfs:brick).
STORAGE_BRICK = "/export/dockermpi-brick"
NODE_ROLE_GRAINS = {"roles": ["mpi-node"]}
MASTER_ROLE_GRAINS = {"roles": ["mpi-master"]}
HUB = "dmpi-hub"
HUB_ADDR = "10.251.1.5"
HUB_ROLE_GRAINS = {"roles": ["mpi-hub"]}
HUB_HOST_PORT = int(os.environ.get("DMPI_HUB_PORT", "18000"))
#: The hub's public host (pillar/testcluster.sls mpi:hub:subdomain_host): user alice's
#: server is at alice.<HUB_DOMAIN>, the user API at dockermpi--service.<HUB_DOMAIN>. No
#: DNS answers these names here: TestCluster.public_open connects to HUB_ADDR for them.
HUB_DOMAIN = "hub.dmpi.test"
HUB_PUBLIC_PORT = 8000
HUB_PUBLIC_URL = f"https://{HUB_DOMAIN}:{HUB_PUBLIC_PORT}"
API_PUBLIC_URL = f"https://dockermpi--service.{HUB_DOMAIN}:{HUB_PUBLIC_PORT}/services/dockermpi"
#: The API as notebooks call it: on the master, directly over TLS (DOCKERMPI_API_URL).
API_NOTEBOOK_URL = f"https://{MASTER_ADDR}:8001/services/dockermpi"
#: The generated pillar on the master holding the cluster's certificates and their CA
#: (tests/cluster/tls.py), and the private keys' files (pillar/top.sls gives each to one host).
TLS_PILLAR = "/srv/pillar-local/testcluster_tls.sls"
TLS_KEY_PILLARS = {"hub": "/srv/pillar-local/testcluster_hub_tls.sls",
                   "api": "/srv/pillar-local/testcluster_api_tls.sls"}
#: The notebook containers' names on the hub host (salt/dockermpi/hub/files/dockermpi_spawner.py).
NOTEBOOK_PREFIX = "dmpi-notebook"

# What a container needs to boot systemd and run a nested Docker engine on this kernel
# (--privileged is refused here: the bounding set lacks CAP_SYS_RESOURCE).
SYSTEMD_HOST_OPTIONS = {
    "cap_add": ["ALL"],
    "cap_drop": ["SYS_RESOURCE"],
    "security_opt": ["seccomp=unconfined", "apparmor=unconfined"],
    "device_cgroup_rules": ["a *:* rwm"],
    "tmpfs": {"/run": "", "/run/lock": "", "/tmp": ""},
    "cgroupns": "host",
    "environment": {"container": "docker"},
    # The GlusterFS client mounts the shared storage through FUSE.
    "devices": ["/dev/fuse:/dev/fuse:rwm"],
    # Below 1024 only root binds, as on a real host (Docker lowers it to 0 in its
    # containers): GlusterFS's bricks serve only clients bound to such a port.
    "sysctls": {"net.ipv4.ip_unprivileged_port_start": "1024"},
}


#: A highstate of argv[1] (minion ids, comma-separated; argv[2] "True": test=True) from
#: the master, its returns as JSON. A minion whose return the client missed (on a loaded
#: machine a minion can be too slow to say it still runs the job, and the client gives
#: up on it) is looked up in the master's job cache until it is there, for up to the
#: highstate's own 600 s.
_HIGHSTATE_CALL = """
import json, sys, time, salt.client
minions = sys.argv[1].split(",")
kwarg = {"test": True} if sys.argv[2] == "True" else {}
client = salt.client.LocalClient()
try:
    deadline = time.monotonic() + 600
    job = client.run_job(minions, "state.apply", kwarg=kwarg, tgt_type="list", timeout=600,
                         listen=True)
    returned = {}
    for answer in client.get_cli_event_returns(job["jid"], job["minions"], 600, minions,
                                               "list", gather_job_timeout=60):
        for minion, data in (answer or {}).items():
            if isinstance(data, dict) and "ret" in data:
                returned[minion] = data["ret"]
    while set(minions) - set(returned) and time.monotonic() < deadline:
        time.sleep(2)
        for minion, data in client.get_cache_returns(job["jid"]).items():
            if minion in minions and data.get("ret") is not None:
                returned[minion] = data["ret"]
finally:
    client.destroy()
print(json.dumps({m: returned.get(m, "no return in 600 s") for m in minions}))
"""
#: The hub API as the cluster reaches it (pillar/testcluster.sls mpi:hub:hub_api_url).
HUB_API_URL = f"http://{HUB_ADDR}:8081/hub/api"
#: One hub API call, run by python3 on the hub host: argv method, url, token, JSON body;
#: prints the HTTP status, a newline and the answer's body.
_HUB_API_CALL = """
import sys, urllib.error, urllib.request
method, url, token, body = sys.argv[1:5]
request = urllib.request.Request(url, method=method, data=body.encode() if body else None,
                                 headers={"Authorization": "token " + token,
                                          "Content-Type": "application/json"})
try:
    with urllib.request.urlopen(request, timeout=60) as response:
        status, text = response.status, response.read()
except urllib.error.HTTPError as exc:
    status, text = exc.code, exc.read()
print(status)
print(text.decode(errors="replace"))
"""


class _HubHTTPSConnection(http.client.HTTPSConnection):
    """HTTPS to the hub host whatever name the URL gives (no DNS for the cluster's names
    here), the certificate checked against that name."""

    def connect(self):
        self.sock = self._context.wrap_socket(
            socket.create_connection((HUB_ADDR, self.port), self.timeout),
            server_hostname=self.host)


class _HubHTTPSHandler(urllib.request.HTTPSHandler):
    def https_open(self, req):
        return self.do_open(_HubHTTPSConnection, req, context=self._context)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def hub_admin_token():
    """The admin service's token of the test cluster's hub (pillar/testcluster_hub.sls)."""
    pillar = yaml.safe_load((REPO / "pillar" / "testcluster_hub.sls").read_text())
    return pillar["mpi"]["hub"]["admin_token"]


API_PORT = 8001  # the user API's port on the master host (pillar/testcluster.sls)

#: Reads what the kernel says of the process listening on the user API's port: its pid,
#: user and system CPU seconds, and resident memory in KiB, as one line.
_API_PROCESS = (
    f"pid=$(ss -ltnpH 'sport = :{API_PORT}' | sed -n 's/.*pid=\\([0-9]*\\).*/\\1/p' | head -1); "
    "set -- $(cut -d' ' -f14,15 /proc/$pid/stat); "
    "echo $pid $(( ($1 + $2) * 1000 / $(getconf CLK_TCK) )) "
    "$(sed -n 's/^VmRSS:[[:space:]]*\\([0-9]*\\) kB/\\1/p' /proc/$pid/status)")


def api_process(exec_on_master):
    """``{"pid", "cpu_seconds", "rss_kib"}`` of the master's process that serves the user
    API (the salt-master process its engine runs in), through ``exec_on_master(argv)``
    -> its standard output."""
    pid, cpu_ms, rss = exec_on_master(["sh", "-c", _API_PROCESS]).split()
    return {"pid": int(pid), "cpu_seconds": int(cpu_ms) / 1000, "rss_kib": int(rss)}


class ClusterError(Exception):
    """The test cluster could not be brought to the asked state."""


def wait_for_systemd(container, timeout):
    """Wait until systemd in a host container says it is up (running, or degraded)."""
    deadline = time.monotonic() + timeout
    while True:
        state = container.exec_run(["systemctl", "is-system-running"]).output
        state = state.decode(errors="replace").strip()
        if state in ("running", "degraded"):
            return
        if time.monotonic() > deadline:
            raise ClusterError(f"{container.name}: systemd did not come up ({state})")
        time.sleep(0.5)


def step(message):
    print(f"[cluster {time.strftime('%H:%M:%S')}] {message}", flush=True)


def node_name(index):
    return f"node{index}"


def node_container(index):
    return f"dmpi-{node_name(index)}"


def node_address(index, network=CLUSTER_NET):
    return network[1].rsplit(".", 1)[0] + f".{10 + index}"


#: What an image's definition may hold locally but never sends to its build (npm's
#: packages of a local build of the jobs panel; .dockerignore says the same).
LOCAL_ONLY = "node_modules"


def tree_digest(*paths):
    """A short content hash of files, so a changed image definition gets a new tag."""
    digest = hashlib.sha256()
    for root in paths:
        root = pathlib.Path(root)
        files = sorted(p for p in root.rglob("*") if p.is_file()
                       and LOCAL_ONLY not in p.parts) if root.is_dir() else [root]
        for path in files:
            digest.update(str(path.relative_to(root.parent)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def tar_of(files):
    """An in-memory tar of {archive name: bytes or path}."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, content in files.items():
            if isinstance(content, pathlib.Path):
                archive.add(str(content), arcname=name)
                continue
            info = tarfile.TarInfo(name)
            info.size = len(content)
            info.mode = 0o644
            archive.addfile(info, io.BytesIO(content))
    buffer.seek(0)
    return buffer


#: Runner functions the tests call through a long-lived runner session (see
#: :mod:`tests.cluster.runner_session`) instead of a ``salt-run`` process each: every
#: function of DockerMPI's runner. Salt's own (``saltutil.sync_all``) run as salt-run.
SESSION_RUNNER_PREFIX = "mpi."
RUNNER_SESSIONS_KEPT = 4  # idle sessions kept for the next calls; more are closed
LOCAL_CALL_TIMEOUT = 10  # seconds a minion has to answer, as the salt command's default


class TestCluster:
    """Bring up, inspect and tear down the test cluster; run commands on its hosts."""

    __test__ = False  # not a pytest test class

    def __init__(self, nodes=3, build_cpu_shares=None):
        """``build_cpu_shares``: the CPU weight of the images' builds (None: Docker's
        default)."""
        if not 1 <= nodes <= 9:
            raise ClusterError(f"nodes must be between 1 and 9, got {nodes}")
        self.node_count = nodes
        self.build_cpu_shares = build_cpu_shares
        self.docker = docker.from_env(timeout=600)
        self._idle_sessions = []  # RunnerSession objects no call is using
        self._sessions_lock = threading.Lock()
        self._accounts = {}  # user -> what account() gave

    # --- naming -------------------------------------------------------------------
    @property
    def nodes(self):
        """Minion ids of the nodes, in order."""
        return [node_name(i) for i in range(1, self.node_count + 1)]

    @property
    def minions(self):
        """Every minion id: the master host's own, the storage host's, the hub's, then
        the nodes'."""
        return ["master", "storage", "hub", *self.nodes]

    def container(self, host):
        """The container of ``master``, ``storage``, ``hub`` or a node's minion id."""
        name = MASTER if host == "master" else f"dmpi-{host}"
        return self.docker.containers.get(name)

    # --- running commands ---------------------------------------------------------
    def exec(self, host, argv, check=True, user=None, environment=None, stdout_only=False):
        """Run argv on a host; returns (exit code, output text).

        The output is stdout and stderr together, or stdout alone with ``stdout_only``
        (Salt's CLIs log warnings on stderr that would spoil JSON).
        """
        result = self.container(host).exec_run(
            argv, user=user or "", environment=environment, demux=True
        )
        stdout, stderr = (part.decode(errors="replace") if part else "" for part in result.output)
        output = stdout if stdout_only else stdout + stderr
        if check and result.exit_code != 0:
            raise ClusterError(f"{host}: {argv!r} exited {result.exit_code}:\n{stdout}{stderr}")
        return result.exit_code, output

    #: The ports of an NFS server: rpcbind, nfsd, mountd (as Debian fixes it with -p).
    STORAGE_PORTS = (111, 2049, 20048)
    _STORAGE_STAND_IN = """
import socket, sys, threading
def udp(port):
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(('0.0.0.0', port))
    while True:
        data, peer = u.recvfrom(64); u.sendto(data, peer)
def tcp(port):
    t = socket.socket(); t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    t.bind(('0.0.0.0', port)); t.listen()
    while True:
        c, _ = t.accept(); c.sendall(b'served'); c.close()
for port in map(int, sys.argv[2:]):  # (sys.argv[1]: a marker to find the process by)
    threading.Thread(target=udp, args=(port,), daemon=True).start()
    threading.Thread(target=tcp, args=(port,), daemon=True).start()
threading.Event().wait()
"""

    #: Run by an attacker (``python3 -c STORAGE_PROBE <address> <port>...``): one line per
    #: port, "<port> <TCP connect> <UDP echo>", each "open"/the echo or the error's name.
    STORAGE_PROBE = """
import errno, socket, sys
def name(exc):
    return errno.errorcode.get(exc.errno, 'timeout' if isinstance(exc, TimeoutError) else str(exc))
def tcp(address, port):
    try:
        socket.create_connection((address, port), timeout=5).close()
        return 'open'
    except OSError as exc:
        return name(exc)
def udp(address, port):
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.settimeout(5)
    try:
        u.connect((address, port)); u.send(b'x')
        return u.recv(8).decode() or 'empty'
    except OSError as exc:
        return name(exc)
for port in map(int, sys.argv[2:]):
    print(port, tcp(sys.argv[1], port), udp(sys.argv[1], port), flush=True)
"""

    @staticmethod
    def storage_unanswered(output):
        """The ports of a STORAGE_PROBE's ``output`` that neither accepted a connection
        nor echoed a datagram. (A refusal by ICMP can come as a timeout instead: the
        kernel rate-limits the ICMP errors it sends to one host.)"""
        return [int(port) for port, tcp, udp in map(str.split, output.splitlines())
                if tcp != "open" and udp != "x"]

    @contextlib.contextmanager
    def storage_stand_in(self, host="master"):
        """Echo services on a storage server's ports (:data:`STORAGE_PORTS`, TCP and UDP)
        on ``host``, as root, proven to answer from node1's host first; yields their
        address. Stands in for an NFS server the attacker tests aim at."""
        marker = "dmpi-storage-stand-in"
        kill = ["pkill", "-f", marker]
        address = {"master": MASTER_ADDR, "hub": HUB_ADDR}[host]
        self.exec(host, kill, check=False)
        self.container(host).exec_run(
            ["python3", "-c", self._STORAGE_STAND_IN, marker, *map(str, self.STORAGE_PORTS)],
            detach=True)
        try:
            echo = ("import socket, sys\n"
                    "u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.settimeout(5)\n"
                    "u.connect((sys.argv[1], int(sys.argv[2]))); u.send(b'x')\n"
                    "print(u.recv(8).decode())\n")
            for port in self.STORAGE_PORTS:
                deadline = time.monotonic() + 30
                while self.exec("node1", ["timeout", "5", "bash", "-c",
                                          f"</dev/tcp/{address}/{port}"], check=False)[0]:
                    if time.monotonic() > deadline:
                        raise ClusterError(f"the storage stand-in on {host} does not "
                                           f"answer TCP {port} from node1's host")
                    time.sleep(0.5)
                code, out = self.exec("node1", ["python3", "-c", echo, address, str(port)],
                                      check=False)
                if code != 0 or out.strip() != "x":
                    raise ClusterError(f"the storage stand-in on {host} does not answer "
                                       f"UDP {port} from node1's host: {out}")
            yield address
        finally:
            self.exec(host, kill, check=False)

    def glusterfs_ports(self):
        """The TCP ports the storage host serves GlusterFS on: glusterd's and each brick's
        (from ``gluster volume status``), proven open from node1's host."""
        _, xml = self.exec("storage", ["gluster", "volume", "status", "all", "--xml"],
                           stdout_only=True)
        bricks = [int(port.text) for port in ElementTree.fromstring(xml).iter("port")
                  if port.text and port.text.isdigit() and int(port.text) > 0]
        ports = sorted({24007, *bricks})
        for port in ports:
            code, _ = self.exec("node1", ["timeout", "5", "bash", "-c",
                                          f"</dev/tcp/{STORAGE_ADDR}/{port}"], check=False)
            if code != 0:
                raise ClusterError(f"GlusterFS port {port} of the storage host is not open "
                                   "from node1's host")
        return ports

    #: A userspace GlusterFS client (libgfapi through ctypes), as an attacker runs it:
    #: ``python3 -c GLUSTERFS_CLIENT <server> <volume> <path in the volume> <uid> <gid>``,
    #: with LD_LIBRARY_PATH the client's libraries. It fetches the volume from glusterd,
    #: claims the uid and gid, and reads the file. One JSON line: ``init`` (glfs_init's
    #: return), ``error`` (its errno's text), and ``read`` (the text) or ``open_error``.
    GLUSTERFS_CLIENT = """
import ctypes, json, os, sys
server, volume, path = sys.argv[1:4]
uid, gid = int(sys.argv[4]), int(sys.argv[5])
api = ctypes.CDLL("libgfapi.so.0", use_errno=True)
api.glfs_new.restype = api.glfs_open.restype = ctypes.c_void_p
api.glfs_new.argtypes = [ctypes.c_char_p]
api.glfs_set_volfile_server.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p,
                                        ctypes.c_int]
api.glfs_set_logging.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
api.glfs_init.argtypes = [ctypes.c_void_p]
api.glfs_open.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
api.glfs_read.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
fs = api.glfs_new(volume.encode())
api.glfs_set_volfile_server(fs, b"tcp", server.encode(), 24007)
api.glfs_set_logging(fs, b"-", 5)  # warnings and worse
result = {"init": api.glfs_init(fs), "error": os.strerror(ctypes.get_errno())}
if result["init"] == 0:
    api.glfs_setfsuid(uid)
    api.glfs_setfsgid(gid)
    fd = api.glfs_open(fs, path.encode(), os.O_RDONLY)
    if fd:
        data = ctypes.create_string_buffer(4096)
        count = api.glfs_read(fd, data, 4096, 0)
        result["read"] = data.raw[:max(count, 0)].decode(errors="replace")
    else:
        result["open_error"] = os.strerror(ctypes.get_errno())
print(json.dumps(result), flush=True)
"""

    #: Run on a host with GlusterFS's client, as ``python3 -c _GLUSTERFS_KIT <kit dir>
    #: <where jobs see it>``: copies libgfapi, the libraries it needs (but glibc) and its
    #: plugins (translators, transports) into the kit, and rewrites the plugins' directory
    #: compiled into the libraries to the kit's (a shorter path, padded): what a user
    #: brings to run the client from a container whose root they cannot write.
    _GLUSTERFS_KIT = """
import os, re, shutil, subprocess, sys
kit, seen_as = sys.argv[1], sys.argv[2].encode()
lib = "/usr/lib/x86_64-linux-gnu"
plugins = re.escape(f"{lib}/glusterfs/10.3".encode())
shutil.rmtree(kit, ignore_errors=True)
shutil.copytree(f"{lib}/glusterfs/10.3", f"{kit}/gfs", ignore=shutil.ignore_patterns("*.py*"))
needed = subprocess.run(["ldd", f"{lib}/libgfapi.so.0"], capture_output=True, text=True,
                        check=True).stdout
for path in [f"{lib}/libgfapi.so.0"] + re.findall(r"=> (/\\S+)", needed):
    if not re.search(r"/(libc|ld-linux[^/]*)\\.so", path):
        shutil.copy(path, kit)
def shorter(match):
    return (seen_as + b"/gfs" + match.group(1)).ljust(len(match.group(0)), b"\\0")
for root, _, files in os.walk(kit):
    for name in files:
        with open(os.path.join(root, name), "r+b") as library:
            data = library.read()
            changed = re.sub(plugins + rb"([^\\0]*)\\0", shorter, data)
            assert len(changed) == len(data)
            library.seek(0)
            library.write(changed)
print("kit ready", flush=True)
"""

    def glusterfs_client_kit(self, user):
        """:data:`GLUSTERFS_CLIENT`'s libraries, brought by ``user`` into their own
        directory (made by them from node1's host's GlusterFS client); where their jobs
        and notebooks see it (for LD_LIBRARY_PATH)."""
        seen_as = "/data/gfapi-kit"  # the user's directory in jobs and notebooks
        home = self.account(user)["dir"]
        self.as_user(user, ["python3", "-c", self._GLUSTERFS_KIT, f"{home}/gfapi-kit",
                            seen_as], node="node1")
        return seen_as

    def salt(self, argv, check=True, stdout_only=False):
        """Run a salt CLI (``salt``, ``salt-run``, ``salt-key``) on the master."""
        return self.exec("master", argv, check=check, stdout_only=stdout_only)

    def salt_json(self, argv):
        """Run a salt CLI with --out=json --static and parse its output."""
        static = [] if argv[0] == "salt-key" else ["--static"]
        code, output = self.salt(list(argv) + ["--out=json", *static], check=False,
                                 stdout_only=True)
        try:
            return code, json.loads(output) if output.strip() else {}
        except json.JSONDecodeError as exc:
            raise ClusterError(f"{argv!r} exited {code} without JSON:\n{output}") from exc

    def run_json(self, fun, **kwargs):
        """``salt-run fun key=value ...`` on the master; returns (exit code, parsed output).

        Values that are not plain strings travel as JSON, which Salt's argument parser
        reads back as the same structure. DockerMPI's runner functions run in a runner
        session (:meth:`runner_call`), given the same strings.
        """
        argv = [f"{key}={value if isinstance(value, str) else json.dumps(value)}"
                for key, value in kwargs.items()]
        if fun.startswith(SESSION_RUNNER_PREFIX):
            code, ret, _ = self.runner_call(fun, argv)
            return code, ret
        code, output = self.salt(["salt-run", fun, *argv, "--out=json"], check=False,
                                 stdout_only=True)
        try:
            return code, json.loads(output)
        except json.JSONDecodeError as exc:
            raise ClusterError(f"salt-run {fun} {argv!r} exited {code} without JSON:\n"
                               f"{output}") from exc

    def runner_call(self, fun, argv=(), kwarg=None, timeout=None):
        """``(exit code, return, seconds)`` of ``salt-run fun *argv`` in a runner session
        of the master (one no other call is using, started when none is idle)."""
        return self._in_runner_session("run", fun, argv, kwarg, timeout)

    def _in_runner_session(self, method, *args):
        """``RunnerSession.<method>(*args)`` in an idle session of this cluster's master;
        a session that failed is closed, not used again."""
        with self._sessions_lock:
            session = self._idle_sessions.pop() if self._idle_sessions else None
        try:
            if session is None or not session.alive():
                session = RunnerSession(self.container("master").name)
            result = getattr(session, method)(*args)
        except SessionError as exc:
            if session is not None:
                session.close()
            raise ClusterError(str(exc)) from exc
        with self._sessions_lock:
            if len(self._idle_sessions) < RUNNER_SESSIONS_KEPT:
                self._idle_sessions.append(session)
                session = None
        if session is not None:
            session.close()
        return result

    def close_runner_sessions(self):
        """Close the idle runner sessions (their modules are those loaded when they
        started: after a sync the next calls start new ones)."""
        with self._sessions_lock:
            idle, self._idle_sessions = self._idle_sessions, []
        for session in idle:
            session.close()

    def job_leftovers(self):
        """{node: {job id: containers and secrets}} of every job still on any node; a
        node that does not answer counts as holding something."""
        found = self._in_runner_session("local", self.nodes, "mpi_job.jobs",
                                        LOCAL_CALL_TIMEOUT)
        answers = {node: found.get(node, "did not answer") for node in self.nodes}
        return {node: jobs for node, jobs in answers.items() if jobs}

    def closed(self, job_id, timeout=30):
        """The job's record once its clean-up is done (``closed``): containers removed
        and status.json written, a moment after its result is known."""
        deadline = time.monotonic() + timeout
        while True:
            _, job = self.run_json("mpi.status", job_id=job_id)
            if job.get("closed") or time.monotonic() > deadline:
                return job
            time.sleep(0.5)

    def no_leftovers(self, timeout=20):
        """What is left of jobs on any node once clean-ups had ``timeout`` seconds to
        finish (they run after a job's result is known)."""
        deadline = time.monotonic() + timeout
        while (left := self.job_leftovers()) and time.monotonic() < deadline:
            time.sleep(1)
        return left

    def settle(self, timeout=30):
        """Cancel every job still queued or running and wait (up to timeout) until no job
        container or key is left on any node; returns (the jobs that were still active,
        what is left behind). Tests call it after each test, so one failing test does
        not fail the next ones."""
        active = None
        # The nodes are asked what they hold while the master lists active jobs: after
        # a passing test both are empty and one look at each is all it takes.
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            left_now = pool.submit(self.job_leftovers)
            for _ in range(20):  # the master may still be restarting
                try:
                    _, active = self.run_json("mpi.list", state="queued,starting,running")
                except ClusterError:
                    active = None
                if isinstance(active, list):
                    break
                time.sleep(1)
            else:
                raise ClusterError(f"salt-run mpi.list never answered a list: {active!r}")
            for job in active:
                self.run_json("mpi.cancel", job_id=job["job_id"])
            if not active and not left_now.result():
                return active, {}
        return active, self.no_leftovers(timeout)

    #: Printed around a read-only command's output by ``read``.
    _READ_MARK = "--dmpi-read-mark--"
    _READ_TRIES = 3

    def read(self, host, argv):
        """The stdout of a read-only command on a host, whole.

        Docker's exec sometimes hands back none of a quick command's output though the
        command ran and exited 0; marks printed before and after it show the output came
        whole, and the command runs again when they did not."""
        mark = self._READ_MARK
        wrapped = ["sh", "-c", f'echo {mark}; "$@"; code=$?; echo; echo {mark}; exit $code',
                   "sh", *argv]
        for _ in range(self._READ_TRIES):
            _, output = self.exec(host, wrapped, stdout_only=True)
            head, first, rest = output.partition(mark + "\n")
            body, last, _ = rest.rpartition("\n" + mark + "\n")
            if first and last and not head:
                return body
        raise ClusterError(f"{host}: {argv!r}: Docker's exec lost the output "
                           f"{self._READ_TRIES} times in a row")

    def read_shared(self, path):
        """A file's text from the shared storage, as a node sees it."""
        return self.read(self.nodes[-1], ["cat", path])

    def account(self, user):
        """``salt-run mpi.add_user``: the user's uid, gid and directory (made if needed)."""
        code, found = self.run_json("mpi.add_user", user=user)
        if code != 0 or not isinstance(found, dict) or "uid" not in found:
            raise ClusterError(f"salt-run mpi.add_user {user} failed: {found!r}")
        return found

    def as_user(self, user, argv, node=None, check=True):
        """Run argv on a node as the user's own uid (as the user's notebook would)."""
        if user not in self._accounts:  # a uid and directory stay as they are made
            self._accounts[user] = self.account(user)
        found = self._accounts[user]
        drop = ["setpriv", f"--reuid={found['uid']}", f"--regid={found['gid']}",
                "--clear-groups", "--"]
        return self.exec(node or self.nodes[-1], drop + list(argv), check=check)

    # --- the hub --------------------------------------------------------------------
    def hub_api(self, method, path, body=None, token=None, check=True):
        """Call the hub's REST API (``/hub/api<path>``) from the hub host itself, with
        the admin service's token unless ``token`` is given; returns (HTTP status,
        the parsed JSON answer, or its text, or None when empty). ``check`` raises on an
        answer of 400 or more."""
        argv = ["python3", "-c", _HUB_API_CALL, method, HUB_API_URL + path,
                token or hub_admin_token(), "" if body is None else json.dumps(body)]
        _, output = self.exec("hub", argv)
        status, _, text = output.partition("\n")
        status = int(status)
        try:
            answer = json.loads(text) if text.strip() else None
        except json.JSONDecodeError:
            answer = text
        if check and status >= 400:
            raise ClusterError(f"hub API {method} {path} answered {status}: {answer!r}")
        return status, answer

    def wait_for_hub(self, timeout=90):
        """Wait until the hub's API answers (its version, without a token)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                status, answer = self.hub_api("GET", "/", check=False)
                if status == 200 and isinstance(answer, dict) and "version" in answer:
                    return answer["version"]
            except (ClusterError, ValueError):
                status = answer = None
            if time.monotonic() > deadline:
                _, log = self.exec("hub", ["journalctl", "-u", "dockermpi-hub", "-n", "30",
                                           "--no-pager"], check=False)
                raise ClusterError(f"the hub does not answer ({status}: {answer!r}):\n{log}")
            time.sleep(1)

    def hub_user(self, name):
        """The hub's model of user ``name``, created if missing."""
        quoted = urllib.parse.quote(name, safe="")
        status, found = self.hub_api("GET", f"/users/{quoted}", check=False)
        if status == 404:
            _, found = self.hub_api("POST", f"/users/{quoted}")
        elif status != 200:
            raise ClusterError(f"hub API GET /users/{name} answered {status}: {found!r}")
        return found

    def hub_token(self, name, expires_in=None, scopes=None):
        """A new API token of hub user ``name`` (created if missing), as the user gets
        one from the hub's token page (all the user's permissions unless ``scopes``)."""
        self.hub_user(name)
        body = {"note": "dmpi-cluster test token"}
        if expires_in is not None:
            body["expires_in"] = expires_in
        if scopes is not None:
            body["scopes"] = scopes
        _, found = self.hub_api("POST", f"/users/{urllib.parse.quote(name, safe='')}/tokens",
                                body)
        return found["token"]

    def proxy_route(self, method, spec, target=None):
        """Add (``POST``, to ``target``) or remove (``DELETE``) route ``spec`` (host-routed:
        ``/<host>/<path>``) in the hub's proxy, through its API on the hub host."""
        _, pid = self.exec("hub", ["pgrep", "-o", "-f", "configurable-http-proxy"],
                           stdout_only=True)
        _, environ = self.exec("hub", ["cat", f"/proc/{pid.strip()}/environ"],
                               stdout_only=True)
        token = dict(v.split("=", 1) for v in environ.split("\0") if "=" in v)[
            "CONFIGPROXY_AUTH_TOKEN"]
        body = json.dumps({"target": target}) if target else ""
        argv = ["python3", "-c", _HUB_API_CALL, method,
                f"http://127.0.0.1:8001/api/routes{spec}", token, body]
        _, output = self.exec("hub", argv)
        status = int(output.partition("\n")[0])
        if status >= 400:
            raise ClusterError(f"proxy route {method} {spec} answered {status}: {output!r}")

    def notebook_address(self, name):
        """Hub user ``name``'s notebook container's address on the hub host's bridge."""
        container = self.notebook_container(name)
        if container is None:
            raise ClusterError(f"{name} has no running notebook")
        _, found = self.exec("hub", ["docker", "inspect", container], stdout_only=True)
        return json.loads(found)[0]["NetworkSettings"]["Networks"]["bridge"]["IPAddress"]

    #: The hub host's notebook containers as one JSON list, then an end mark.
    _LIST_NOTEBOOKS = ("docker ps -q --no-trunc --filter label=io.dockermpi.notebook "
                       "| xargs -r docker inspect; echo '#listed'")

    def notebook_container(self, name):
        """The name of hub user ``name``'s notebook container on the hub host, or None.
        An answer without its end mark lost its output on the way (it happened once, in
        a test whose notebook ran throughout) and is asked again, never taken for "no
        notebook"."""
        for _ in range(5):
            _, found = self.exec("hub", ["sh", "-c", self._LIST_NOTEBOOKS], stdout_only=True)
            listed, mark, _ = found.rpartition("#listed")
            if mark:
                break
        else:
            raise ClusterError(f"listing the hub's notebooks lost its output: {found!r}")
        for container in json.loads(listed) if listed.strip() else []:
            if f"JUPYTERHUB_USER={name}" in (container["Config"]["Env"] or []):
                return container["Name"].lstrip("/")
        return None

    def start_notebook(self, name, timeout=180, image=None):
        """Start hub user ``name``'s notebook server (creating the user if missing), of
        the offered ``image`` (default: the hub's), and wait until the hub says it is
        ready; returns its container's name on the hub host. A failed spawn raises
        ClusterError with the hub's message."""
        self.hub_user(name)
        quoted = urllib.parse.quote(name, safe="")
        options = {} if image is None else {"image": image}
        status, answer = self.hub_api("POST", f"/users/{quoted}/server", options, check=False)
        if status not in (201, 202, 400):  # 400: already running or pending
            raise ClusterError(f"starting {name}'s notebook failed ({status}): {answer!r}")
        deadline = time.monotonic() + timeout
        while True:
            _, user = self.hub_api("GET", f"/users/{quoted}")
            server = (user.get("servers") or {}).get("")
            if server and server.get("ready"):
                container = self.notebook_container(name)
                if container is None:
                    raise ClusterError(f"{name}'s notebook is ready but has no container")
                return container
            if not server or time.monotonic() > deadline:
                _, log = self.exec("hub", ["journalctl", "-u", "dockermpi-hub", "-n", "20",
                                           "--no-pager"], check=False)
                why = "never became ready" if server else "failed to start"
                raise ClusterError(f"{name}'s notebook {why} ({status}: {answer!r}):\n{log}")
            time.sleep(1)

    def notebook_exec(self, name, argv, environment=None):
        """Run argv in hub user ``name``'s notebook container as its user; returns
        (exit code, stdout and stderr)."""
        container = self.notebook_container(name)
        if container is None:
            raise ClusterError(f"{name} has no running notebook")
        env = [f"--env={k}={v}" for k, v in (environment or {}).items()]
        return self.exec("hub", ["docker", "exec", *env, container, *argv], check=False)

    def notebook_read(self, name, argv):
        """The stdout of a read-only command in hub user ``name``'s notebook, as its user,
        whole (:meth:`read`: run again when Docker's exec lost it)."""
        container = self.notebook_container(name)
        if container is None:
            raise ClusterError(f"{name} has no running notebook")
        return self.read("hub", ["docker", "exec", container, *argv])

    def stop_notebook(self, name, timeout=60):
        """Stop hub user ``name``'s notebook server and wait until its container is gone."""
        quoted = urllib.parse.quote(name, safe="")
        status, answer = self.hub_api("DELETE", f"/users/{quoted}/server", check=False)
        if status not in (202, 204, 400, 404):
            raise ClusterError(f"stopping {name}'s notebook failed ({status}): {answer!r}")
        deadline = time.monotonic() + timeout
        while True:
            status, user = self.hub_api("GET", f"/users/{quoted}", check=False)
            stopped = status == 404 or not (user.get("servers") or {})
            if stopped and self.notebook_container(name) is None:
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"{name}'s notebook did not stop: {user!r}")
            time.sleep(0.5)

    def delete_hub_user(self, name):
        """Stop hub user ``name``'s notebook and delete the user from the hub."""
        self.stop_notebook(name)
        status, answer = self.hub_api("DELETE", f"/users/{urllib.parse.quote(name, safe='')}",
                                      check=False)
        if status not in (204, 404):
            raise ClusterError(f"deleting hub user {name} failed ({status}): {answer!r}")

    # --- faults -------------------------------------------------------------------
    def cut(self, side_a, side_b):
        """A real partition: drop every packet between the addresses of side_a and those
        of side_b (hosts and job containers alike) on the cluster network's bridge, where
        both host traffic and the job containers' own traffic pass. Returns the undo."""
        rules = [["DOCKER-USER", "-s", a, "-d", b, "-j", "DROP"]
                 for x, y in ((side_a, side_b), (side_b, side_a)) for a in x for b in y]
        for rule in rules:
            subprocess.run(["iptables", "-I", *rule], check=True)

        def heal():
            for rule in rules:
                subprocess.run(["iptables", "-D", *rule], check=False,
                               stderr=subprocess.DEVNULL)

        return heal

    def host_address(self, host):
        if host == "hub":
            return HUB_ADDR
        return MASTER_ADDR if host == "master" else node_address(int(host.removeprefix("node")))

    # --- images -------------------------------------------------------------------
    @staticmethod
    @contextlib.contextmanager
    def _building():
        """One image build at a time on this host (the test cluster's build and the
        Vagrant test's may run at once): a second builder of a tag finds it built."""
        CACHE.mkdir(parents=True, exist_ok=True)
        with open(CACHE / ".image-build.lock", "w", encoding="utf-8") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def ensure_base_image(self, suite="bookworm"):
        """The Debian base image of ``suite`` (``dockermpi/debian:<suite>``), made with
        debootstrap once."""
        with self._building():
            return self._ensure_base_image(suite)

    def _ensure_base_image(self, suite):
        name = f"dockermpi/debian:{suite}"
        try:
            self.docker.images.get(name)
            return name
        except docker.errors.ImageNotFound:
            pass
        step(f"building {name} with debootstrap (about a minute)")
        CACHE.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=CACHE) as scratch:
            rootfs = pathlib.Path(scratch) / "rootfs"
            nice = ["nice", "-n", "10"] if self.build_cpu_shares else []
            subprocess.run(
                [*nice, "debootstrap", "--variant=minbase", suite, str(rootfs)],
                check=True,
                stdout=subprocess.DEVNULL,
            )
            tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
            subprocess.run(
                ["docker", "import", "-c", 'CMD ["/bin/bash"]', "-", name],
                stdin=tar.stdout,
                check=True,
                stdout=subprocess.DEVNULL,
            )
            if tar.wait() != 0:
                raise ClusterError("tar of the debootstrapped root failed")
        return name

    def build_image(self, name, context_dir, extra=None, buildargs=None):
        """Build context_dir (plus extra {name: path}) as name:<content hash>, once.
        buildargs (besides BASE) are part of the hash: a new parent image is a new tag."""
        with self._building():
            return self._build_image(name, context_dir, extra, buildargs)

    def _build_image(self, name, context_dir, extra, buildargs):
        extra = extra or {}
        buildargs = {"BASE": BASE_IMAGE, **(buildargs or {})}
        tag = f"{name}:{tree_digest(context_dir)}"
        if buildargs != {"BASE": BASE_IMAGE}:  # a new parent image is a new tag
            args = json.dumps(buildargs, sort_keys=True).encode()
            tag += "-" + hashlib.sha256(args).hexdigest()[:8]
        try:
            self.docker.images.get(tag)
            return tag
        except docker.errors.ImageNotFound:
            pass
        step(f"building {tag} from {context_dir.relative_to(REPO)}")
        with tempfile.TemporaryDirectory() as scratch:
            context = pathlib.Path(scratch) / "context"
            shutil.copytree(context_dir, context, ignore=shutil.ignore_patterns(LOCAL_ONLY))
            for arcname, source in extra.items():
                shutil.copytree(source, context / arcname, copy_function=os.link)
            started = time.monotonic()
            limits = {"cpushares": self.build_cpu_shares} if self.build_cpu_shares else None
            for chunk in self.docker.api.build(
                path=str(context), tag=tag, rm=True, forcerm=True, decode=True,
                buildargs=buildargs, container_limits=limits,
            ):
                if "error" in chunk:
                    raise ClusterError(f"building {tag}: {chunk['error']}")
                line = chunk.get("stream", "").strip()
                if line.startswith("Step "):
                    print(f"    {line}", flush=True)
        step(f"built {tag} in {time.monotonic() - started:.0f}s")
        return tag

    def host_image(self):
        if not any(WHEELHOUSE.glob("salt-3008.4-*.whl")):
            raise ClusterError(f"no Salt wheel in {WHEELHOUSE}: run tests/cluster/dmpi-cluster")
        tag = self.build_image(
            "dockermpi/testhost", REPO / "images" / "host", {"wheelhouse": WHEELHOUSE}
        )
        # A stable name for the Vagrantfile, which cannot know the content hash.
        self.docker.images.get(tag).tag("dockermpi/testhost", "local")
        return tag

    def mpi_image(self):
        return self.build_image("dockermpi/mpi", REPO / "images" / "mpi")

    def mpi_pi_image(self):
        """The MPI Operator's pi example image, built offline (tests/cluster/images/mpi-pi)."""
        return self.build_image("dockermpi/mpi-pi", REPO / "tests/cluster/images/mpi-pi",
                                buildargs={"RUNTIME": self.mpi_image()})

    def mpi_pi_hydra_image(self, runtime):
        """The MPI Operator's pi example image of MPICH or Intel MPI, on ``runtime`` (a
        test image with that MPI's wheel in /opt/venv), built offline
        (tests/cluster/images/mpi-pi-hydra)."""
        return self.build_image("dockermpi/mpi-pi-hydra",
                                REPO / "tests/cluster/images/mpi-pi-hydra",
                                buildargs={"RUNTIME": runtime})

    def mpi_bullseye_image(self):
        """An Open MPI image of an older Debian (glibc 2.31) with no ssh server
        (tests/cluster/images/mpi-bullseye)."""
        return self.build_image("dockermpi/mpi-bullseye",
                                REPO / "tests/cluster/images/mpi-bullseye",
                                buildargs={"BASE": self.ensure_base_image("bullseye")})

    def mpi_openmpi5_image(self):
        """An image with Open MPI 5 and mpi4py from PyPI in a virtualenv, a USER of its
        own and no ssh (tests/cluster/images/mpi-openmpi5)."""
        return self.build_image("dockermpi/mpi-openmpi5",
                                REPO / "tests/cluster/images/mpi-openmpi5",
                                {"wheelhouse": WHEELHOUSE})

    def mpi_intelmpi_image(self):
        """An image with Intel MPI and mpi4py from PyPI in a virtualenv, no ssh
        (tests/cluster/images/mpi-intelmpi)."""
        return self.build_image("dockermpi/mpi-intelmpi",
                                REPO / "tests/cluster/images/mpi-intelmpi",
                                {"wheelhouse": WHEELHOUSE})

    def mpi_mpich_image(self):
        """An image with Debian's MPICH and mpi4py from PyPI in a virtualenv, no ssh
        (tests/cluster/images/mpi-mpich)."""
        return self.build_image("dockermpi/mpi-mpich", REPO / "tests/cluster/images/mpi-mpich",
                                {"wheelhouse": WHEELHOUSE})

    def notebook_mpich_image(self):
        """The notebook image with MPICH and mpi4py from PyPI in a virtualenv first on
        PATH: a second image offered for notebooks (tests/cluster/images/notebook-mpich)."""
        return self.build_image("dockermpi/notebook-mpich",
                                REPO / "tests/cluster/images/notebook-mpich",
                                {"wheelhouse": WHEELHOUSE},
                                {"BASE": self.notebook_image()})

    def notebook_image(self):
        """The MPI image plus JupyterLab, jupyterhub-singleuser, the mpi client and the
        jobs panel."""
        if not any(NPM_CACHE.glob(".package-lock-*")):
            raise ClusterError(f"no npm cache in {NPM_CACHE}: run tests/cluster/dmpi-cluster")
        return self.build_image(
            "dockermpi/notebook", REPO / "images" / "notebook",
            {"wheelhouse": WHEELHOUSE, "npm-cache": NPM_CACHE},
            {"BASE": self.mpi_image()},
        )

    # --- bring up -------------------------------------------------------------------
    def ensure_network(self, spec):
        name, subnet, gateway = spec
        try:
            return self.docker.networks.get(name)
        except docker.errors.NotFound:
            pool = docker.types.IPAMPool(subnet=subnet, gateway=gateway)
            return self.docker.networks.create(
                name, driver="bridge", ipam=docker.types.IPAMConfig(pool_configs=[pool]),
                labels={LABEL: "1"},
            )

    def ensure_volume(self, name):
        try:
            return self.docker.volumes.get(name)
        except docker.errors.NotFound:
            return self.docker.volumes.create(name, labels={LABEL: "1"})

    def start_host(self, name, hostname, image, address, mounts, extra_networks=(), ports=None,
                   extra_hosts=None):
        """Create (or start) a systemd host container on the cluster network."""
        try:
            container = self.docker.containers.get(name)
        except docker.errors.NotFound:
            container = None
        if container is not None:
            self._check_same_checkout(container, mounts)
            if container.status != "running":
                container.start()
            return container, False
        container = self.docker.containers.create(
            image,
            name=name,
            hostname=hostname,
            labels={LABEL: "1"},
            volumes={**mounts, "/sys/fs/cgroup": {"bind": "/sys/fs/cgroup", "mode": "rw"}},
            network=CLUSTER_NET[0],
            ports=ports or {},
            extra_hosts=extra_hosts or {},
            **SYSTEMD_HOST_OPTIONS,
        )
        # Fixed addresses: connect explicitly (create() only takes the network name).
        cluster = self.docker.networks.get(CLUSTER_NET[0])
        cluster.disconnect(container)
        cluster.connect(container, ipv4_address=address)
        for network, extra_address in extra_networks:
            self.docker.networks.get(network).connect(container, ipv4_address=extra_address)
        container.start()
        return container, True

    @staticmethod
    def _check_same_checkout(container, mounts):
        """An existing host container must mount this checkout's folders: one built from
        another checkout (or one since deleted) would serve that tree's states and modules."""
        wanted = {spec["bind"]: source for source, spec in mounts.items() if source.startswith("/")}
        have = {m["Destination"]: m["Source"] for m in container.attrs.get("Mounts", [])}
        other = sorted(have[dest] for dest, source in wanted.items()
                       if dest in have and have[dest] != source)
        if other:
            raise ClusterError(
                f"{container.name} was built from another checkout (it mounts {other[0]}, "
                f"not {REPO}): run `tests/cluster/dmpi-cluster down` first, or use that checkout")

    def wait_for_systemd(self, host, timeout=60):
        wait_for_systemd(self.container(host), timeout)

    def put_file(self, host, path, content):
        path = pathlib.PurePosixPath(path)
        self.exec(host, ["mkdir", "-p", str(path.parent)])
        self.container(host).put_archive(str(path.parent), tar_of({path.name: content}))

    @staticmethod
    def registry_store():
        """REGISTRY_STORE, emptied first when it has grown past REGISTRY_STORE_MAX_BYTES."""
        size = sum(f.stat().st_size for f in REGISTRY_STORE.rglob("*") if f.is_file()) \
            if REGISTRY_STORE.is_dir() else 0
        if size > REGISTRY_STORE_MAX_BYTES:
            step(f"emptying the registry store {REGISTRY_STORE} ({size / 2**30:.1f} GiB)")
            shutil.rmtree(REGISTRY_STORE)
        REGISTRY_STORE.mkdir(parents=True, exist_ok=True)
        return REGISTRY_STORE

    def up_master(self, image):
        mounts = {
            str(REPO / "salt"): {"bind": "/srv/salt", "mode": "ro"},
            str(REPO / "pillar"): {"bind": "/srv/pillar", "mode": "ro"},
            str(self.registry_store()): {"bind": "/var/lib/docker-registry", "mode": "rw"},
            "dmpi-master-pki": {"bind": "/etc/salt/pki", "mode": "rw"},
            "dmpi-master-cache": {"bind": "/var/cache/salt", "mode": "rw"},
        }
        for folder in ("_modules", "_states", "_runners", "_utils", "_engines"):
            mounts[str(REPO / folder)] = {"bind": f"/srv/salt-ext/{folder}", "mode": "ro"}
        _, created = self.start_host(
            MASTER, "master", image, MASTER_ADDR, mounts,
            ports={f"{REGISTRY_PUSH_PORT}/tcp": ("127.0.0.1", REGISTRY_HOST_PORT)},
            # The API checks tokens with the hub at its public name (no DNS here).
            extra_hosts={HUB_DOMAIN: HUB_ADDR},
        )
        self.wait_for_systemd("master")
        if created:
            self.put_file("master", "/etc/salt/master.d/cluster.conf",
                          (FILES / "master.conf").read_bytes())
            self.put_registry("master", CLUSTER_NET[1], CLUSTER_NET[2])
            self.exec("master", ["mkdir", "-p", "/srv/pillar-local"])
            self.put_tls_pillars()
            self.exec("master", ["systemctl", "enable", "--now", "salt-master"])
            # The master host's own minion: highstate provisions its side (the user API).
            minion = {"id": "master", "master": MASTER_ADDR, "grains": MASTER_ROLE_GRAINS}
            self.put_file("master", "/etc/salt/minion.d/cluster.conf",
                          yaml.safe_dump(minion).encode())
            self.exec("master", ["systemctl", "enable", "--now", "salt-minion"])

    def put_tls_pillars(self):
        """A new CA, the hub's wildcard certificate and the API's, as the master's
        generated pillar: certificates and CA for every host, each key for its host only."""
        made = tls.make(HUB_DOMAIN, MASTER_ADDR)
        pillars = {
            TLS_PILLAR: {"hub": {"tls": {"cert": made["hub_cert"], "ca": made["ca"]}},
                         "api": {"tls": {"cert": made["api_cert"], "ca": made["ca"]}}},
            TLS_KEY_PILLARS["hub"]: {"hub": {"tls": {"key": made["hub_key"]}}},
            TLS_KEY_PILLARS["api"]: {"api": {"tls": {"key": made["api_key"]}}},
        }
        for path, pillar in pillars.items():
            self.put_file("master", path, yaml.safe_dump({"mpi": pillar}).encode())

    @functools.cached_property
    def tls(self):
        """The cluster's CA and the hub's certificate (PEM): {"ca": ..., "hub_cert": ...}."""
        text = self.read("master", ["cat", TLS_PILLAR])
        hub = yaml.safe_load(text)["mpi"]["hub"]["tls"]
        return {"ca": hub["ca"], "hub_cert": hub["cert"]}

    def public_context(self):
        """A TLS context trusting the cluster's CA alone."""
        return ssl.create_default_context(cadata=self.tls["ca"])

    def public_open(self, request, timeout=60, follow_redirects=True):
        """``urllib.request.urlopen`` of an https URL on the hub's public names
        (``HUB_PUBLIC_URL``, ``<user>.HUB_DOMAIN``, ``API_PUBLIC_URL``) from this machine:
        connects to the hub host, checks its certificate against the URL's name and the
        cluster's CA. HTTP errors (and, unless ``follow_redirects``, redirects) are
        raised as urlopen raises them."""
        handlers = [_HubHTTPSHandler(context=self.public_context())]
        if not follow_redirects:
            handlers.append(_NoRedirect())
        return urllib.request.build_opener(*handlers).open(request, timeout=timeout)

    def put_registry(self, host, cluster_network, push_from):
        """The registry on ``host``: read-only on port 5000 for the cluster, writable on
        REGISTRY_PUSH_PORT for ``push_from`` (the address this machine's pushes come
        from) alone."""
        self.put_file(host, "/etc/docker/registry/config.yml",
                      (FILES / "registry.yml").read_bytes())
        self.put_file(host, "/etc/docker/registry/push.yml",
                      (FILES / "registry-push.yml").read_bytes())
        self.put_file(host, "/etc/systemd/system/dockermpi-registry-push.service",
                      (FILES / "dockermpi-registry-push.service").read_bytes())
        self.put_file(host, "/etc/default/dockermpi-registry-push",
                      f"CLUSTER_NETWORK={cluster_network}\nPUSH_FROM={push_from}\n".encode())
        self.exec(host, ["chown", "docker-registry:", "/var/lib/docker-registry"])
        self.exec(host, ["systemctl", "daemon-reload"])
        self.exec(host, ["systemctl", "enable", "--now", "docker-registry",
                         "dockermpi-registry-push"])

    def up_hub(self, image):
        """The hub host: a minion with role mpi-hub, its own engine, the shared storage,
        the wheelhouse (pip has no index here) and the proxy's port on 127.0.0.1."""
        mounts = {
            "dmpi-hub-docker": {"bind": "/var/lib/docker", "mode": "rw"},
            "dmpi-hub-pki": {"bind": "/etc/salt/pki", "mode": "rw"},
            str(WHEELHOUSE): {"bind": str(WHEELHOUSE), "mode": "ro"},
        }
        _, created = self.start_host(
            HUB, "hub", image, HUB_ADDR, mounts,
            ports={"8000/tcp": ("127.0.0.1", HUB_HOST_PORT)},
        )
        self.wait_for_systemd("hub")
        if created:
            minion = {"id": "hub", "master": MASTER_ADDR, "grains": HUB_ROLE_GRAINS}
            self.put_file("hub", "/etc/salt/minion.d/cluster.conf",
                          yaml.safe_dump(minion).encode())
            self.exec("hub", ["systemctl", "enable", "--now", "salt-minion"])

    def up_storage(self, image):
        """The storage host: a minion with role mpi-glusterfs-server; highstate installs
        GlusterFS and makes the volume on the brick."""
        mounts = {
            # The brick's own disk; gluster wants the brick a directory inside it.
            "dmpi-storage-brick": {"bind": posixpath.dirname(STORAGE_BRICK), "mode": "rw"},
            "dmpi-storage-pki": {"bind": "/etc/salt/pki", "mode": "rw"},
        }
        _, created = self.start_host(STORAGE, "storage", image, STORAGE_ADDR, mounts)
        self.wait_for_systemd("storage")
        if created:
            minion = {"id": "storage", "master": MASTER_ADDR, "grains": STORAGE_ROLE_GRAINS}
            self.put_file("storage", "/etc/salt/minion.d/cluster.conf",
                          yaml.safe_dump(minion).encode())
            self.exec("storage", ["systemctl", "enable", "--now", "salt-minion"])

    def up_node(self, index, image):
        name = node_name(index)
        mounts = {
            f"dmpi-{name}-docker": {"bind": "/var/lib/docker", "mode": "rw"},
            f"dmpi-{name}-pki": {"bind": "/etc/salt/pki", "mode": "rw"},
        }
        _, created = self.start_host(
            f"dmpi-{name}", name, image, node_address(index), mounts,
            extra_networks=[(SITE_NET[0], node_address(index, SITE_NET))],
        )
        self.wait_for_systemd(name)
        if created:
            minion = {"id": name, "master": MASTER_ADDR, "grains": NODE_ROLE_GRAINS}
            self.put_file(name, "/etc/salt/minion.d/cluster.conf",
                          yaml.safe_dump(minion).encode())
            self.exec(name, ["systemctl", "enable", "--now", "salt-minion"])

    def wait_for_minions(self, timeout=120):
        """Accept the keys of the cluster's minions (and only theirs) and wait until all
        answer."""
        deadline = time.monotonic() + timeout
        pending = set(self.minions)
        while pending:
            _, keys = self.salt_json(["salt-key", "--list=all"])
            accepted = set(keys.get("minions", []))
            for minion in sorted(pending & set(keys.get("minions_pre", []))):
                self.salt(["salt-key", "--yes", f"--accept={minion}"])
            pending -= accepted
            if pending and time.monotonic() > deadline:
                raise ClusterError(f"minions never asked for key acceptance: {sorted(pending)}")
            if pending:
                time.sleep(1)
        # A salt-master whose worker failed to load its modules at start (Salt logs
        # "worker will be non-functional"; seen once here, a race in Salt's loader)
        # never recovers by itself: restart it once when the minions stay silent.
        repair_at = time.monotonic() + MINION_REPAIR_AFTER
        repaired = False
        while True:
            try:
                _, answers = self.salt_json(["salt", "-L", ",".join(self.minions),
                                             "test.ping", "--timeout=5"])
            except ClusterError:  # the master may be restarting
                answers = {}
            missing = [n for n in self.minions if answers.get(n) is not True]
            if not missing:
                return
            if not repaired and time.monotonic() > repair_at:
                step(f"minions {missing} not answering after {MINION_REPAIR_AFTER}s; "
                     "restarting salt-master once")
                self.exec("master", ["systemctl", "restart", "salt-master"])
                repaired = True
                deadline = max(deadline, time.monotonic() + 60)
            if time.monotonic() > deadline:
                raise ClusterError(f"minions not answering: {missing}")
            time.sleep(1)

    def publish_images(self, tags):
        """Push images ({approved name: local tag}) to the cluster registry; approve them
        by digest in the pillar; returns {name: reference}."""
        references = {name: self.push_image(tag, f"127.0.0.1:{REGISTRY_HOST_PORT}", REGISTRY)
                      for name, tag in tags.items()}
        pillar = {"mpi": {"images": references}}
        self.put_file("master", "/srv/pillar-local/testcluster_images.sls",
                      yaml.safe_dump(pillar).encode())
        return references

    def publish_mpi_image(self, tag):
        """Push the MPI image to the cluster registry; pin its digest in the pillar."""
        return self.publish_images({"mpi": tag})["mpi"]

    def push_image(self, tag, push_to, pull_from):
        """Push a local image (name:version) to the registry reachable from here as
        push_to; returns the reference the nodes pull by digest through pull_from."""
        repository = tag.split(":", 1)[0]
        local = f"{push_to}/{repository}"
        version = tag.split(":", 1)[1]
        self.docker.images.get(tag).tag(local, version)
        deadline = time.monotonic() + 30
        while True:
            try:
                for chunk in self.docker.images.push(local, version, stream=True, decode=True):
                    if "error" in chunk:
                        raise ClusterError(f"push {local}:{version}: {chunk['error']}")
                break
            except docker.errors.APIError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)  # the registry may still be starting
        digest = next(
            d.split("@", 1)[1]
            for d in self.docker.images.get(tag).attrs["RepoDigests"]
            if d.startswith(local + "@")
        )
        return f"{pull_from}/{repository}@{digest}"

    def sync_and_highstate(self):
        """Sync custom modules everywhere, apply highstate to every minion (the master
        host's first), then check the master really serves the job controller (runner,
        engine, node reports) and the hub answers before saying so."""
        self.sync_master()
        # A node's engine keeps the code it loaded at start: the highstate restarts the
        # minion when the synced code's revision is not the running engine's.
        self.salt_json(["salt", "-L", ",".join(self.minions), "saltutil.sync_all"])
        self.salt(["salt", "-L", ",".join(self.minions), "saltutil.refresh_pillar",
                   "wait=True"])
        results = self.highstate()
        self.verify_master()
        self.wait_for_hub()
        return results

    def sync_master(self, force_restart=False):
        """Bring the master's extension modules up to date with the repository."""
        self.salt(["salt-run", "fileserver.update"], check=False)
        # (salt-run prints nothing with --static: read its plain JSON output.)
        code, synced = self.run_json("saltutil.sync_all")
        if code != 0 or not isinstance(synced, dict):
            raise ClusterError(f"salt-run saltutil.sync_all failed on the master: {synced!r}")
        if any(synced.values()):
            self.close_runner_sessions()
        if force_restart or any(synced.get(kind) for kind in ("runners", "utils", "engines")):
            # The job controller keeps the modules it loaded at start.
            self.exec("master", ["systemctl", "restart", "salt-master"])
            self.wait_for_minions()

    def engine_answers(self):
        """Why the master does not serve the job controller yet, or None when it does: the
        runner answers and every node's reports reach the job controller."""
        try:
            code, found = self.run_json("mpi.nodes")
        except ClusterError as exc:
            return f"salt-run mpi.nodes gave no JSON: {exc}"
        if not isinstance(found, dict) or not all(isinstance(v, dict) for v in found.values()):
            return f"salt-run mpi.nodes answered {str(found)[:200]!r}"
        silent = [n for n in self.nodes if not (found.get(n) or {}).get("reachable")]
        return f"no reports reach the master from {silent}" if silent else None

    def verify_master(self, timeout=45):
        """Wait until the master serves the runner and the job controller; repair it once (sync
        again and restart it) when it does not."""
        for attempt in ("check", "repair"):
            deadline = time.monotonic() + timeout
            while (problem := self.engine_answers()) and time.monotonic() < deadline:
                time.sleep(1)
            if problem is None:
                return
            if attempt == "check":
                step(f"the master does not serve the job controller ({problem}); re-syncing it")
                self.sync_master(force_restart=True)
        raise ClusterError(f"the master does not serve the job controller: {problem}")

    def highstate(self, test=False):
        """Apply highstate to the master host's minion, then the storage host's (the
        volume exists before anyone mounts it), then to the hub and every node; returns
        {minion: {id: result}}; raises on failure."""
        started = self.started("master", "salt-master")
        results = self._highstate(["master"], test)
        restarting = any("mpi-api-master-restart" in key and value.get("changes")
                         for key, value in results["master"].items())
        if restarting and not test:
            # Its state restarts salt-master (2 s after it returns) when the API's
            # configuration changed: what is published before that restart is lost.
            deadline = time.monotonic() + 60
            while self.started("master", "salt-master") == started:
                if time.monotonic() > deadline:
                    raise ClusterError("salt-master did not restart after its API changed")
                time.sleep(0.5)
            self.wait_for_minions()
        # After the master's restart: a return that reaches a restarting master is lost.
        results.update(self._highstate(["storage"], test))
        minions_started = {node: self.started(node, "salt-minion") for node in self.nodes}
        results.update(self._highstate(["hub", *self.nodes], test))
        if not test:
            # A node whose engine changed restarts its minion 5 s after its highstate:
            # until it is back, it reports nothing and answers no publish.
            restarting = [node for node in self.nodes if any(
                "mpi-node-engine-minion-restart" in key and value.get("changes")
                for key, value in results[node].items())]
            deadline = time.monotonic() + 60
            while any(self.started(node, "salt-minion") == minions_started[node]
                      for node in restarting):
                if time.monotonic() > deadline:
                    raise ClusterError(f"the minions of {restarting} did not restart after "
                                       "their engine changed")
                time.sleep(0.5)
            if restarting:
                self.wait_for_minions()
        return results

    def started(self, host, unit):
        """When ``unit`` last started on ``host`` (systemd's monotonic timestamp, as text)."""
        return self.unit_property(host, unit, "ActiveEnterTimestampMonotonic")

    def unit_property(self, host, unit, name):
        """A property of systemd ``unit`` on ``host`` (``systemctl show``), as text."""
        _, found = self.exec(host, ["systemctl", "show", unit, "--value", "-p", name],
                             stdout_only=True)
        return found.strip()

    def _highstate(self, minions, test=False):
        started = time.monotonic()
        _, output = self.exec("master", ["/opt/saltstack/salt/bin/python3", "-c",
                                         _HIGHSTATE_CALL, ",".join(minions), str(test)],
                              stdout_only=True)
        results = json.loads(output)
        failed = {}
        for node in minions:
            states = results.get(node)
            if not isinstance(states, dict):
                failed[node] = states
                continue
            bad = {k: v.get("comment") for k, v in states.items() if v.get("result") is False}
            if bad:
                failed[node] = bad
        if failed:
            raise ClusterError("highstate failed:\n" + json.dumps(failed, indent=2))
        changed = {
            node: sorted(k for k, v in results[node].items() if v.get("changes"))
            for node in minions
        }
        step(
            f"highstate{' (test)' if test else ''} on {', '.join(minions)} took "
            f"{time.monotonic() - started:.0f}s; changed states: "
            + ", ".join(f"{n}={len(c)}" for n, c in changed.items())
        )
        return {node: results[node] for node in minions}

    def up(self):
        """Bring the whole cluster up from nothing; safe to run again on a running one."""
        started = time.monotonic()
        self.ensure_base_image()
        host_image = self.host_image()
        mpi_image = self.mpi_image()
        notebook_image = self.notebook_image()
        notebook_mpich_image = self.notebook_mpich_image()
        for spec in (CLUSTER_NET, SITE_NET):
            self.ensure_network(spec)
        for volume in self.volume_names():
            self.ensure_volume(volume)  # labelled, so `down` removes every one
        step("starting master host (salt-master, registry)")
        self.up_master(host_image)
        step("starting the storage host")
        self.up_storage(host_image)
        step("starting the hub host")
        self.up_hub(host_image)
        for index in range(1, self.node_count + 1):
            step(f"starting {node_name(index)}")
            self.up_node(index, host_image)
        step("accepting minion keys, waiting for minions")
        self.wait_for_minions()
        step("pushing the MPI and notebook images to the cluster registry")
        references = self.publish_images({"mpi": mpi_image, "notebook": notebook_image,
                                          "notebook-mpich": notebook_mpich_image})
        for name, reference in references.items():
            step(f"approved image {name} = {reference}")
        step("highstate on the master host, then the hub and all nodes (first run "
             "installs Docker on each)")
        self.sync_and_highstate()
        step(f"cluster up in {time.monotonic() - started:.0f}s")

    def demo(self):
        """Run a real mpi4py program over every node through ``salt-run mpi.launch``."""
        user = "demo"
        account = self.account(user)
        node = self.nodes[0]
        as_user = ["setpriv", f"--reuid={account['uid']}", f"--regid={account['gid']}",
                   "--clear-groups", "--"]
        self.container(node).put_archive("/var/tmp", tar_of({"pi.py": (FILES / "pi.py").read_bytes()}))
        self.exec(node, as_user + ["cp", "/var/tmp/pi.py", f"{account['dir']}/pi.py"])
        np = 2 * len(self.nodes)
        step(f"salt-run mpi.launch user={user} image=mpi np={np} cmd='python3 /data/pi.py'")
        code, job = self.run_json("mpi.launch", user=user, image="mpi", np=np, cmd="python3 /data/pi.py")
        if not isinstance(job, dict):
            raise ClusterError(f"salt-run mpi.launch answered {str(job)[:300]!r} (exit {code})")
        if job.get("state") != "succeeded":
            raise ClusterError("demo job did not succeed:\n" + json.dumps(job, indent=2))
        print(self.read_shared(job["output"]["stdout"]), end="")
        step(f"job {job['job_id']} {job['state']} on {job['placement']}; timings {job['timings']}")
        step(f"output, stderr and status.json are in {job['output']['dir']} (shared storage)")

    # --- inspect and tear down --------------------------------------------------------
    def containers(self):
        return self.docker.containers.list(all=True, filters={"label": LABEL})

    def is_up(self):
        running = {c.name for c in self.containers() if c.status == "running"}
        return {MASTER, STORAGE, HUB, *(f"dmpi-{n}" for n in self.nodes)} <= running

    def status(self):
        """Containers, addresses, whether each minion answers and its engine runs."""
        report = {"containers": {}, "minions": {}}
        for container in sorted(self.containers(), key=lambda c: c.name):
            networks = container.attrs["NetworkSettings"]["Networks"]
            report["containers"][container.name] = {
                "status": container.status,
                "addresses": {net: info["IPAddress"] for net, info in networks.items()},
            }
        if report["containers"].get(MASTER, {}).get("status") == "running":
            _, pings = self.salt_json(["salt", "*", "test.ping", "--timeout=5"])
            _, engines = self.salt_json(["salt", "*", "service.status", "docker", "--timeout=5"])
            for minion in sorted(pings):
                report["minions"][minion] = {
                    "answers": pings[minion] is True,
                    "docker_running": engines.get(minion) is True,
                }
        return report

    def down(self):
        """Remove every container, network and volume of the test cluster."""
        self.close_runner_sessions()
        for container in self.containers():
            step(f"removing {container.name}")
            container.remove(force=True, v=True)
        for network in self.docker.networks.list(filters={"label": LABEL}):
            network.remove()
        for volume in self.docker.volumes.list(filters={"label": LABEL}):
            volume.remove(force=True)
        # Volumes an earlier version let `docker run` create without our label.
        for name in self.volume_names():
            try:
                self.docker.volumes.get(name).remove(force=True)
            except docker.errors.NotFound:
                pass

    def volume_names(self):
        """Every named volume of the cluster's hosts."""
        names = ["dmpi-master-pki", "dmpi-master-cache",
                 "dmpi-storage-brick", "dmpi-storage-pki", "dmpi-hub-docker", "dmpi-hub-pki"]
        for node in self.nodes:
            names += [f"dmpi-{node}-docker", f"dmpi-{node}-pki"]
        return names


def main(argv=None):
    import argparse

    parser = argparse.ArgumentParser(prog="dmpi-cluster", description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=int(os.environ.get("DMPI_NODES", "3")))
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("up", help="bring the cluster up (safe to repeat)")
    sub.add_parser("status", help="show containers and minions")
    sub.add_parser("down", help="remove all containers, networks and volumes")
    sub.add_parser("highstate", help="apply highstate to every node again")
    sub.add_parser("demo", help="bring the cluster up and run an MPI job through salt-run")
    run = sub.add_parser("salt", help="run a salt command on the master, e.g. salt-run mpi.launch")
    run.add_argument("salt_argv", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    cluster = TestCluster(nodes=args.nodes)
    try:
        if args.command == "up":
            cluster.up()
        elif args.command == "status":
            print(json.dumps(cluster.status(), indent=2))
        elif args.command == "down":
            cluster.down()
        elif args.command == "highstate":
            cluster.sync_and_highstate()
        elif args.command == "demo":
            cluster.up()
            cluster.demo()
        elif args.command == "salt":
            return subprocess.run(["docker", "exec", MASTER, *args.salt_argv], check=False).returncode
    except ClusterError as exc:
        print(f"dmpi-cluster: {exc}", file=sys.stderr)
        return 1
    except (docker.errors.DockerException, OSError, LookupError, TypeError, ValueError) as exc:
        # Something answered what the tool did not expect: say what, not where.
        print(f"dmpi-cluster: {args.command} failed: {type(exc).__name__}: {exc}",
              file=sys.stderr)
        return 1
    return 0
