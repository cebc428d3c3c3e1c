"""A node's storage check (dmpi.node.health) on a real file system that is full: a tmpfs
of a few pages, or of a few inodes, filled by a user's files. Needs root to mount (CI
runs as root)."""

import os
import pathlib
import shutil
import subprocess
import tempfile

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


def test_the_room_left_in_a_users_directory_is_read_as_the_user(monkeypatch):
    # What a failed job's evidence asks (dmpi.node.evidence._directory_full), as the
    # user's uid: a directory whose file system is full has no room left. (A base an
    # unprivileged child can reach: tmp_path's parents are private to root.)
    from dmpi.node import userdirs, userfs  # pylint: disable=import-outside-toplevel

    monkeypatch.setattr(userfs, "CHILD_PYTHON", "/usr/bin/python3")
    base = tempfile.mkdtemp(prefix="mpi-room-")
    os.chmod(base, 0o755)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k,mode=0755", "tmpfs", base],
                   check=True)
    try:
        mallory = os.path.join(base, "users", "mallory")
        os.makedirs(mallory)
        os.chmod(os.path.join(base, "users"), 0o711)
        os.chown(mallory, 100123, 100123)
        before = userdirs.room(base, "mallory", 100123, 100123)
        assert before["bytes_total"] == 512 * 1024 and before["bytes_free"] > 256 * 1024
        _fill(pathlib.Path(mallory))
        assert userdirs.room(base, "mallory", 100123, 100123)["bytes_free"] < 64 * 1024
    finally:
        subprocess.run(["umount", base], check=True)
        os.rmdir(base)
