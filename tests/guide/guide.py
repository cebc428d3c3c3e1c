"""Run the install guide (docs/install.md) on bare Debian hosts, as an admin would.

The hosts are containers booting systemd with nothing but Debian (tests/guide/host/Dockerfile):
no Salt, no Docker, no DockerMPI, no image. Every ``sh`` block of the guide carries a
comment saying where it runs (``<!-- run on: master -->``); this module takes the blocks
from the document itself and runs them in order, each with the site values the guide
asks an admin to set (its ``<!-- site values -->`` block) set to this machine's.

Hosts here, on network ``dmpi-guide`` (10.253.1.0/24): ``master`` .2 (salt-master, the
registry, where images are built), ``hub`` .5 (JupyterHub), ``node1`` .11 and ``node2``
.12. A Docker volume stands for the site's cluster file system, mounted on the nodes and
the hub. The wheelhouse stands for PyPI (no PyPI inside containers here), and a bare
copy of this checkout's working tree for the project's git repository.

    python -m tests.guide up | run [--from LINE] | down
"""

import argparse
import concurrent.futures
import os
import pathlib
import re
import shlex
import subprocess
import sys
import tempfile
import time

import docker
import docker.errors

from tests import docblocks
from tests.background import Background
from tests.cluster.testcluster import (CACHE, NPM_CACHE, REPO, SYSTEMD_HOST_OPTIONS, WHEELHOUSE,
                                       TestCluster, wait_for_systemd)

GUIDE = REPO / "docs" / "install.md"
HOST_IMAGE_DIR = pathlib.Path(__file__).resolve().parent / "host"
LABEL = "io.dockermpi.guide"
PREFIX = "dmpi-guide"
NETWORK, SUBNET, GATEWAY = "dmpi-guide", "10.253.1.0/24", "10.253.1.1"
ADDRESSES = {"master": "10.253.1.2", "hub": "10.253.1.5",
             "node1": "10.253.1.11", "node2": "10.253.1.12"}
NODES = ["node1", "node2"]
HUB_DOMAIN = "hub.guide.test"
SOURCE_MOUNT = "/mnt/dockermpi.git"
SHARED_PATH = "/srv/dockermpi"
#: Where each kind of block runs.
WHERE = {"every host": ["master", "hub", *NODES], "master": ["master"], "hub": ["hub"],
         "each node": NODES, "notebook": ["notebook"]}
BLOCK_TIMEOUT = 1200  # seconds; the slowest block here (image builds) takes about 4 minutes
#: The bare hosts' CPU weight (the test cluster's hosts have Docker's default, 1024):
#: followed while the integration tests run, the guide takes only what they leave idle.
CPU_SHARES = 128
GUIDE_LOG = pathlib.Path(tempfile.gettempdir()) / "dmpi-guide.log"


class GuideError(Exception):
    """The guide could not be followed to its end."""


def blocks(text=None):
    """Every command block of the guide, in order (:func:`tests.docblocks.blocks`)."""
    if text is None:
        text = GUIDE.read_text(encoding="utf-8")
    found = docblocks.blocks(text, "docs/install.md", set(WHERE))
    unrun = [b for b in found if b.kind == "by"]
    if unrun:
        raise GuideError(f"docs/install.md:{unrun[0].line - 1}: every block of the guide "
                         "runs here, on a host it names (`<!-- run on: ... -->`)")
    for block in found:
        if block.kind == "site values":
            block.where = "site values"
    return found


_EXPORT_RE = re.compile(r"^export ([A-Z_][A-Z0-9_]*)=")


def site_value_names(block):
    """The names the guide's site-values block sets (``export NAME=...`` lines)."""
    return [m.group(1) for m in map(_EXPORT_RE.match, block.text.splitlines()) if m]


def source_commit():
    """A commit of this checkout's working tree as it is (tracked and new files, not
    ignored ones), made without touching the index or any branch."""
    with tempfile.TemporaryDirectory() as scratch:
        env = {**os.environ, "GIT_INDEX_FILE": os.path.join(scratch, "index")}

        def git(*argv):
            return subprocess.run(["git", "-C", str(REPO), *argv], env=env, check=True,
                                  capture_output=True, text=True).stdout.strip()

        git("add", "--all")
        tree = git("write-tree")
        return git("-c", "user.name=guide", "-c", "user.email=guide@localhost",
                   "commit-tree", tree, "-m", "the working tree the guide's test runs")


def site_values(commit):
    """The guide's site values on this machine (``commit``: the source version)."""
    return {
        "MASTER_ADDRESS": ADDRESSES["master"],
        "HUB_ADDRESS": ADDRESSES["hub"],
        "HUB_NAME": "hub",
        "NODES": " ".join(NODES),
        "CLUSTER_NETWORK": SUBNET,
        "JOB_ADDRESSES": "10.253.1.128/25",
        "HUB_DOMAIN": HUB_DOMAIN,
        "SHARED_PATH": SHARED_PATH,
        "DOCKERMPI_GIT": SOURCE_MOUNT,
        "DOCKERMPI_VERSION": commit,
        "WHEELHOUSE": str(WHEELHOUSE),
        "NPM_CACHE": str(NPM_CACHE),
        # No GitHub here: the hub lets users in by name (the guide says: trials only).
        "HUB_LOGIN": "dummy",
        "GITHUB_CLIENT_ID": "",
        "GITHUB_CLIENT_SECRET": "",
        "GITHUB_ORGANIZATION": "guide-test",
        "FIRST_USER": "alice",
    }


class GuideHosts:
    """The bare hosts, and running the guide's blocks on them."""

    def __init__(self, log=print):
        self.docker = docker.from_env(timeout=600)
        self.log = log
        self.repo_dir = CACHE / "guide" / "dockermpi.git"

    # --- hosts ---------------------------------------------------------------------
    def bare_image(self):
        """The bare host's image (tests/guide/host), built once per content."""
        cluster = TestCluster()
        cluster.ensure_base_image()
        return cluster.build_image("dockermpi/barehost", HOST_IMAGE_DIR)

    def container_name(self, host):
        return f"{PREFIX}-{host}"

    def up(self):
        """The four bare hosts, booted; the source repository in place."""
        if not any(WHEELHOUSE.glob("salt-3008.4-*.whl")):
            raise GuideError(f"no Salt wheel in {WHEELHOUSE}: run tests/cluster/dmpi-cluster "
                             "setup-host")
        if self.containers():
            raise GuideError("the guide's hosts are already up: `python -m tests.guide down` "
                             "first")
        image = self.bare_image()
        commit = source_commit()
        subprocess.run(["rm", "-rf", str(self.repo_dir)], check=True)
        subprocess.run(["git", "init", "--quiet", "--bare", str(self.repo_dir)], check=True)
        subprocess.run(["git", "-C", str(REPO), "push", "--quiet", str(self.repo_dir),
                        f"{commit}:refs/heads/guide"], check=True)
        pool = docker.types.IPAMPool(subnet=SUBNET, gateway=GATEWAY)
        network = self.docker.networks.create(
            NETWORK, driver="bridge", labels={LABEL: "1"},
            ipam=docker.types.IPAMConfig(pool_configs=[pool]))
        for host, address in ADDRESSES.items():
            mounts = {f"{PREFIX}-{host}-docker": {"bind": "/var/lib/docker", "mode": "rw"},
                      str(WHEELHOUSE): {"bind": str(WHEELHOUSE), "mode": "ro"},
                      str(NPM_CACHE): {"bind": str(NPM_CACHE), "mode": "ro"},
                      "/sys/fs/cgroup": {"bind": "/sys/fs/cgroup", "mode": "rw"}}
            if host == "master":
                mounts[str(self.repo_dir)] = {"bind": SOURCE_MOUNT, "mode": "ro"}
            else:
                mounts[f"{PREFIX}-shared"] = {"bind": SHARED_PATH, "mode": "rw"}
            for name, spec in mounts.items():
                if not name.startswith("/"):
                    self.docker.volumes.create(name, labels={LABEL: "1"})
            container = self.docker.containers.create(
                image, name=self.container_name(host), hostname=host, labels={LABEL: "1"},
                volumes=mounts, network=NETWORK,
                # The site's DNS: the hub's name (users' servers and the API's origin
                # are names under it; the guide's checks use the hub's own).
                extra_hosts={HUB_DOMAIN: ADDRESSES["hub"]},
                cpu_shares=CPU_SHARES, **SYSTEMD_HOST_OPTIONS)
            network.disconnect(container)
            network.connect(container, ipv4_address=address)
            container.start()
        for host in ADDRESSES:
            wait_for_systemd(self.docker.containers.get(self.container_name(host)), 120)
        (CACHE / "guide" / "commit").write_text(commit)
        self.log(f"bare hosts up: {', '.join(ADDRESSES)} (source {commit[:12]})")

    def containers(self):
        return self.docker.containers.list(all=True, filters={"label": LABEL})

    def down(self):
        for container in self.containers():
            container.remove(force=True, v=True)
        for network in self.docker.networks.list(filters={"label": LABEL}):
            network.remove()
        for volume in self.docker.volumes.list(filters={"label": LABEL}):
            volume.remove(force=True)
        subprocess.run(["rm", "-rf", str(self.repo_dir)], check=True)

    # --- running the guide ----------------------------------------------------------
    def notebook_container(self, user):
        """The name of ``user``'s notebook container on the hub host."""
        listed = self.exec_on("hub", ["docker", "ps", "--filter", "label=io.dockermpi.notebook",
                                      "--format", "{{.Names}}"])
        for name in listed.split():
            env = self.exec_on("hub", ["docker", "inspect", "--format",
                                       "{{range .Config.Env}}{{println .}}{{end}}", name])
            if f"JUPYTERHUB_USER={user}" in env.splitlines():
                return name
        raise GuideError(f"{user} has no notebook container on the hub host")

    def exec_on(self, host, argv, timeout=120):
        done = subprocess.run(["docker", "exec", self.container_name(host), *argv],
                              capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise GuideError(f"{host}: {shlex.join(argv)} exited {done.returncode}: "
                             f"{done.stdout}{done.stderr}")
        return done.stdout

    def run_block(self, block, values):
        """Run one block on each host it names, those at once; returns {host: output}."""
        def run(host):
            if host == "notebook":
                # In the user's notebook terminal: the notebook's own environment only.
                notebook = self.notebook_container(values["FIRST_USER"])
                argv = ["docker", "exec", self.container_name("hub"), "docker", "exec",
                        notebook, "bash", "-c", "set -euo pipefail\n" + block.text]
            else:
                exports = "".join(f"export {name}={shlex.quote(value)}\n"
                                  for name, value in values.items())
                script = "set -euo pipefail\ncd /root\n" + exports + block.text
                argv = ["docker", "exec", "--env", "DEBIAN_FRONTEND=noninteractive",
                        self.container_name(host), "bash", "-c", script]
            started = time.monotonic()
            try:
                done = subprocess.run(argv, capture_output=True, text=True,
                                      timeout=BLOCK_TIMEOUT)
            except subprocess.TimeoutExpired as exc:
                raise GuideError(f"docs/install.md:{block.line} on {host} did not end in "
                                 f"{BLOCK_TIMEOUT} s:\n{exc.stdout or ''}{exc.stderr or ''}")
            output = done.stdout + done.stderr
            self.log(f"  {host}: exit {done.returncode} in {time.monotonic() - started:.0f} s")
            if done.returncode != 0:
                raise GuideError(f"docs/install.md:{block.line} on {host} exited "
                                 f"{done.returncode}:\n{output[-6000:]}")
            return output

        hosts = WHERE[block.where]
        with concurrent.futures.ThreadPoolExecutor(len(hosts)) as pool:
            outputs = dict(zip(hosts, pool.map(run, hosts)))
        return outputs

    def run(self, start_line=0):
        """Run the guide's blocks from the one at or after ``start_line``; returns
        [(block, {host: output})]."""
        found = blocks()
        marked = [b for b in found if b.where == "site values"]
        if len(marked) != 1:
            raise GuideError(f"the guide must have one site-values block, it has {len(marked)}")
        commit = (CACHE / "guide" / "commit").read_text().strip()
        values = site_values(commit)
        names = site_value_names(marked[0])
        if sorted(names) != sorted(values):
            raise GuideError(f"the guide's site values {sorted(names)} are not the ones this "
                             f"test sets {sorted(values)}")
        done = []
        for block in found:
            if block.where == "site values" or block.line < start_line:
                continue
            first = block.text.strip().splitlines()[0]
            self.log(f"docs/install.md:{block.line} on {block.where}: {first[:70]}")
            started = time.monotonic()
            done.append((block, self.run_block(block, values)))
            self.log(f"  done in {time.monotonic() - started:.0f} s")
        return done


class Follower(Background):
    """The guide followed once: the bare hosts brought up and every block run, logging
    to ``GUIDE_LOG``; ``result()`` is ``(hosts, [(block, {host: output})])``."""

    name = "install-guide"

    def __init__(self):
        super().__init__()
        self.hosts = None

    def run(self):
        with open(GUIDE_LOG, "w", encoding="utf-8") as log:
            def say(message):
                log.write(f"[guide {time.strftime('%H:%M:%S')}] {message}\n")
                log.flush()

            try:
                self.hosts = GuideHosts(log=say)
                self.hosts.down()  # what a failed earlier run left (only the guide's own)
                self.hosts.up()
                return self.hosts, self.hosts.run()
            except Exception as exc:
                say(f"failed: {type(exc).__name__}: {exc}")
                raise


#: This process's one following of the guide (tests/conftest.py may start it early).
FOLLOWER = Follower()


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tests.guide", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["up", "run", "down"])
    parser.add_argument("--from", dest="start", type=int, default=0,
                        help="run: start at the block at or after this line of the guide")
    args = parser.parse_args(argv)

    def log(message):
        print(f"[guide {time.strftime('%H:%M:%S')}] {message}", flush=True)

    hosts = GuideHosts(log)
    try:
        if args.command == "up":
            hosts.up()
        elif args.command == "run":
            for block, outputs in hosts.run(args.start):
                for host, output in outputs.items():
                    if output.strip():
                        print(f"--- {host} ---\n{output.rstrip()[-3000:]}")
        else:
            hosts.down()
    except GuideError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0
