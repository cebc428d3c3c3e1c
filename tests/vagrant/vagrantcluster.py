"""Host side of the Vagrant cluster (Vagrantfile): the images its docker machines run, the
MPI image pushed to its registry, and what `vagrant destroy` leaves behind.

Images and pushes reuse the test cluster's code (tests/cluster/testcluster.py): the same
debootstrap base, host image and MPI image serve both clusters.
"""

import argparse
import glob
import os
import pathlib
import shutil
import sys

import docker
import docker.errors

from tests.cluster.testcluster import REPO, ClusterError, TestCluster, step

#: Container and volume names of the Vagrant cluster (the test cluster's are dmpi-*).
PREFIX = "vagrant-dmpi-"
#: What the Vagrantfile keeps on the host: minion keys, the VM providers' shared storage.
STATE_DIR = REPO / ".vagrant" / "dockermpi"
VAGRANT_HOST_IMAGE = "dockermpi/vagranthost"
#: The master's registry as the host reaches it (a forwarded port; same default as the
#: Vagrantfile's).
REGISTRY_HOST_PORT = int(os.environ.get("DMPI_VAGRANT_REGISTRY_PORT", "15001"))
#: Where Vagrant packages keep its insecure key pair (Debian's, then HashiCorp's).
VAGRANT_KEY_GLOBS = (
    "/usr/share/rubygems-integration/all/gems/vagrant-*/keys/vagrant.pub",
    "/opt/vagrant/embedded/gems/gems/vagrant-*/keys/vagrant.pub",
)


def vagrant_keys_dir():
    for pattern in VAGRANT_KEY_GLOBS:
        found = sorted(glob.glob(pattern))
        if found:
            return pathlib.Path(found[-1]).parent
    raise ClusterError("Vagrant's insecure public key was not found "
                       f"({', '.join(VAGRANT_KEY_GLOBS)}): is vagrant installed?")


def setup_host(cluster):
    """Build (once) the images the docker provider's machines run, and the MPI image."""
    cluster.ensure_base_image()
    host_tag = cluster.host_image()
    cluster.mpi_image()
    tag = cluster.build_image(VAGRANT_HOST_IMAGE, REPO / "images" / "vagrant",
                              {"vagrant-keys": vagrant_keys_dir()},
                              buildargs={"HOST_IMAGE": host_tag})
    # A stable name for the Vagrantfile, which cannot know the content hash.
    cluster.docker.images.get(tag).tag(VAGRANT_HOST_IMAGE, "local")
    step(f"{VAGRANT_HOST_IMAGE}:local is {tag}")


def publish_image(cluster, push_to, pull_from):
    """Push the MPI image; print the reference pinned by digest (the last line)."""
    reference = cluster.push_image(cluster.mpi_image(), push_to, pull_from)
    print(reference, flush=True)


def cleanup(client):
    """Remove what `vagrant destroy` leaves: the machines' named volumes (once no container
    uses them), the local tags of pushes to the cluster's registry and, when no machine of
    the cluster is left, its keys. Called after each machine's destroy; safe to repeat."""
    containers = client.containers.list(all=True, filters={"name": PREFIX})
    containers = [c for c in containers if c.name.startswith(PREFIX)]
    in_use = {m.get("Name") for c in containers for m in c.attrs.get("Mounts", [])}
    for volume in client.volumes.list():
        if volume.name.startswith(PREFIX) and volume.name not in in_use:
            step(f"removing volume {volume.name}")
            try:
                volume.remove(force=True)
            except docker.errors.NotFound:
                pass  # another machine's clean-up was first
    if containers:
        return
    pushed = f"127.0.0.1:{REGISTRY_HOST_PORT}/"
    for tag in [t for image in client.images.list() for t in image.tags if t.startswith(pushed)]:
        try:
            client.images.remove(tag)  # only the tag: the image keeps its own name
        except docker.errors.NotFound:
            pass
    if STATE_DIR.exists():
        step(f"removing {STATE_DIR.relative_to(REPO)} (minion keys)")
        shutil.rmtree(STATE_DIR, ignore_errors=True)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="dmpi-vagrant", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("setup-host", help="build the images the Vagrant machines run")
    publish = sub.add_parser("publish-image", help="push the MPI image, print its reference")
    publish.add_argument("--push-to", required=True, help="the registry as this host reaches it")
    publish.add_argument("--pull-from", required=True, help="the registry as the nodes reach it")
    sub.add_parser("cleanup", help="remove volumes, tags and keys left by vagrant destroy")
    args = parser.parse_args(argv)
    try:
        if args.command == "cleanup":
            if _docker_answers():
                cleanup(docker.from_env(timeout=120))
            else:  # VM providers on a host without Docker: only the keys are ours
                shutil.rmtree(STATE_DIR, ignore_errors=True)
            return 0
        cluster = TestCluster()
        if args.command == "setup-host":
            setup_host(cluster)
        elif args.command == "publish-image":
            publish_image(cluster, args.push_to, args.pull_from)
    except ClusterError as exc:
        print(f"dmpi-vagrant: {exc}", file=sys.stderr)
        return 1
    except (docker.errors.DockerException, OSError, LookupError, ValueError) as exc:
        print(f"dmpi-vagrant: {args.command} failed: {type(exc).__name__}: {exc}",
              file=sys.stderr)
        return 1
    return 0


def _docker_answers():
    try:
        docker.from_env(timeout=5).ping()
        return True
    except docker.errors.DockerException:
        return False
