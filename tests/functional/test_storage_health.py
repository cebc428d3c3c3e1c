"""A node's storage check (dmpi.node.health) on a real file system that is full: a tmpfs
of a few pages, or of a few inodes, filled by a user's files. Needs root to mount (CI
runs as root)."""

import os
import shutil
import subprocess

import pytest
from dmpi.jobs import rules
from dmpi.node import health

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("mount"),
                                reason="needs root to mount a tmpfs")


@pytest.fixture
def small_fs(tmp_path):
    """Mounts a tmpfs with the given options at a fresh directory; yields a function
    that does it and returns the path (the storage root with users/ and the health
    directory, as highstate lays them out)."""
    mounted = []

    def mount(options):
        path = tmp_path / f"storage{len(mounted)}"
        path.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], check=True)
        mounted.append(path)
        (path / "users" / "mallory").mkdir(parents=True)
        (path / health.HEALTH_DIR).mkdir()
        return path

    yield mount
    for path in mounted:
        subprocess.run(["umount", str(path)], check=True)


def _fill(directory):
    """Write files into ``directory`` until the file system refuses."""
    index = 0
    while True:
        try:
            with open(directory / f"fill{index}", "wb") as fill:
                fill.write(b"x" * 65536)
        except OSError:
            return
        index += 1


@pytest.mark.parametrize("options", ["size=256k", "nr_inodes=16"])
def test_a_full_file_system_is_reported_full_and_the_node_still_takes_jobs(small_fs, options):
    storage = small_fs(options)
    assert health._storage_state(str(storage), "probe") == "ok"
    _fill(storage / "users" / "mallory")
    state = health._storage_state(str(storage), "probe")
    assert state == "full: No space left on device"
    assert os.listdir(storage / health.HEALTH_DIR) == []  # no probe file left behind
    report = {"docker": "ok", "storage": state, "job_ca": "ok", "job_ca_public": "ssh-ed25519 x",
              "agent": "ok"}
    assert rules.node_problem({"health": report}) is None


def test_a_read_only_file_system_still_takes_the_node_out(small_fs):
    storage = small_fs("size=256k")
    subprocess.run(["mount", "-o", "remount,ro", str(storage)], check=True)
    state = health._storage_state(str(storage), "probe")
    assert state == "not writable: Read-only file system"
    report = {"docker": "ok", "storage": state, "job_ca": "ok", "job_ca_public": "ssh-ed25519 x",
              "agent": "ok"}
    assert rules.node_problem({"health": report}) == \
        "unhealthy: storage not writable: Read-only file system"
