"""
Unit tests of :mod:`dmpi.node.userfs`: file operations the node does inside a user's directory.

Everything runs on real files in a fake storage with ``users/alice`` (the attacker, whose
jobs may plant anything in her directory) and ``users/bob`` (the victim). Each attack
test checks bob's tree and a sibling directory outside ``users`` byte for byte and
stat for stat afterwards. Confined tests run the child as unprivileged uids, so the
suite must run as root, as it does on the test machines.
"""

import contextlib
import json
import importlib.util
import os
import pathlib
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from dmpi.node import userfs
from tests.extension import REPO

UserPathError = userfs.UserPathError

MODULE_PATH = str(REPO / "_utils" / "dmpi" / "node" / "userfs.py")
# The venv's interpreter lives under /root (mode 0700): an unprivileged child cannot
# execute it, so confined tests run the child with the system interpreter.
SYSTEM_PYTHON = "/usr/bin/python3"

JOB = "20261130-120000-abcdef"
ALICE_UID = ALICE_GID = 23456
BOB_UID = BOB_GID = 23457
GUEST_UID = GUEST_GID = 23400
OTHER_UID = 23999
SHARED_GID = 23500
BOB_SECRET = b"bob's secret, never to be read by alice"
BOB_STATUS = b'{"state": "bob-running"}'
OUTSIDE = b"outside users/, never to be touched"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown and drop uid")


def _make_storage(base):
    """``base/users/{alice,bob}`` and ``base/outside``; returns the users directory."""
    users = base / "users"
    (users / "alice").mkdir(parents=True)
    bob_job = users / "bob" / "mpi-jobs" / JOB
    bob_job.mkdir(parents=True)
    (bob_job / "status.json").write_bytes(BOB_STATUS)
    (bob_job / "stderr").write_bytes(BOB_SECRET)
    (users / "bob" / "secret.txt").write_bytes(BOB_SECRET)
    (base / "outside").mkdir()
    (base / "outside" / "outside.txt").write_bytes(OUTSIDE)
    return users


@pytest.fixture
def users(tmp_path):
    return _make_storage(tmp_path / "storage")


@pytest.fixture
def shared_users(monkeypatch):
    """Storage an unprivileged child can reach (tmp_path's parents are private to root):
    alice's directory owned by her uid, bob's by his, both mode 0700."""
    base = pathlib.Path(tempfile.mkdtemp(prefix="mpi-userfs-"))
    try:
        base.chmod(0o755)
        users = _make_storage(base)
        _chown_tree_to(users / "alice", ALICE_UID, ALICE_GID)
        _chown_tree_to(users / "bob", BOB_UID, BOB_GID)
        (users / "alice").chmod(0o700)
        (users / "bob").chmod(0o700)
        monkeypatch.setattr(userfs, "CHILD_PYTHON", SYSTEM_PYTHON)
        yield users
    finally:
        shutil.rmtree(base)


def _chown_tree_to(top, uid, gid):
    for dirpath, dirnames, filenames in os.walk(top):
        for name in [".", *dirnames, *filenames]:
            os.chown(os.path.join(dirpath, name), uid, gid, follow_symlinks=False)


def _snapshot(top):
    """Everything an escape could change below ``top``: type, mode, owner, size, times
    (not atime) and content or link target of every entry, links never followed."""
    top = pathlib.Path(top)
    entries, pending = {}, [top]
    while pending:
        path = pending.pop()
        found = path.lstat()
        content = None
        if stat.S_ISLNK(found.st_mode):
            content = os.readlink(path)
        elif stat.S_ISREG(found.st_mode):
            content = path.read_bytes()
        elif stat.S_ISDIR(found.st_mode):
            pending.extend(path.iterdir())
        entries[str(path.relative_to(top))] = (
            found.st_mode, found.st_uid, found.st_gid, found.st_size,
            found.st_mtime_ns, found.st_ctime_ns, content,
        )
    return entries


def _victims(users):
    """Snapshots of everything alice must never change: bob's tree and ``outside``."""
    return {"bob": _snapshot(users / "bob"), "outside": _snapshot(users.parent / "outside")}


# A blocked open or read blocks for ever: a bound this wide tells it from a busy machine.
BLOCKED_AFTER = 30


def _within(seconds, function, *args, **kwargs):
    """``function(*args, **kwargs)`` in a daemon thread; fails the test if it blocks."""
    outcome = {}

    def target():
        try:
            outcome["result"] = function(*args, **kwargs)
        except BaseException as exc:  # handed to the test thread below
            outcome["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"{function.__name__} still blocked after {seconds} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


def _job_dir(users):
    path = users / "alice" / "mpi-jobs" / JOB
    path.mkdir(parents=True)
    return path


# --- check_component ---------------------------------------------------------------


@pytest.mark.parametrize("name", ["status.json", JOB, ".hidden", "é" * 127, "a" * 255, "..."])
def test_check_component_accepts_one_component(name):
    assert userfs.check_component(name) == name


@pytest.mark.parametrize(
    "name", ["", ".", "..", "a/b", "/", "a\0b", "a" * 256, "é" * 128, "\udc80", None, 7, b"x"]
)
def test_check_component_refuses_anything_else(name):
    with pytest.raises(UserPathError, match="path component"):
        userfs.check_component(name)


def test_bad_arguments_are_programming_errors(users):
    root = str(users)
    with pytest.raises(TypeError, match="parts must be a list"):
        userfs.makedirs(root, "alice/mpi-jobs")
    with pytest.raises(ValueError, match="absolute"):
        userfs.makedirs("storage/users", ["alice"])
    with pytest.raises(TypeError, match="data must be bytes"):
        userfs.write_file(root, ["alice"], "status.json", "text")
    for max_bytes, error in [(0, ValueError), (-1, ValueError), (16 * 2**20 + 1, ValueError),
                             (True, TypeError), ("10", TypeError)]:
        with pytest.raises(error, match="max_bytes"):
            userfs.read_tail(root, ["alice"], "stderr", max_bytes)


def test_bad_components_in_parts_raise_user_path_error(users):
    with pytest.raises(UserPathError, match="path component '..'"):
        userfs.makedirs(str(users), ["alice", "..", "bob", "planted"])
    assert not (users / "bob" / "planted").exists()


# --- normal behaviour --------------------------------------------------------------


def test_makedirs_creates_the_missing_directories_once(users):
    parts = ["alice", "mpi-jobs", JOB]
    assert userfs.makedirs(str(users), parts) is None
    created = users.joinpath(*parts)
    assert created.is_dir() and not created.is_symlink()
    assert stat.S_IMODE(created.stat().st_mode) == 0o700
    (created / "keep").write_bytes(b"kept")
    userfs.makedirs(str(users), parts)
    assert (created / "keep").read_bytes() == b"kept"


def test_write_file_replaces_the_file_atomically_with_exact_mode(users):
    root, parts = str(users), ["alice", "mpi-jobs", JOB]
    previous_umask = os.umask(0o077)
    try:
        userfs.write_file(root, parts, "status.json", b'{"state": "queued"}')
        userfs.write_file(root, parts, "status.json", b'{"state": "running"}', mode=0o640)
    finally:
        os.umask(previous_umask)
    job_dir = users.joinpath(*parts)
    assert os.listdir(job_dir) == ["status.json"]  # no temporary file left behind
    assert (job_dir / "status.json").read_bytes() == b'{"state": "running"}'
    assert stat.S_IMODE((job_dir / "status.json").stat().st_mode) == 0o640


def test_write_file_with_a_maximal_name_still_gets_a_temporary_name(users):
    name = "s" * 255
    userfs.write_file(str(users), ["alice"], name, b"long")
    assert (users / "alice" / name).read_bytes() == b"long"


def test_read_tail_returns_the_last_bytes(users):
    job_dir = _job_dir(users)
    (job_dir / "stderr").write_bytes(b"line one\nline two\n")
    (job_dir / "empty").write_bytes(b"")
    root, parts = str(users), ["alice", "mpi-jobs", JOB]
    assert userfs.read_tail(root, parts, "stderr", 9) == b"line two\n"
    assert userfs.read_tail(root, parts, "stderr", 1000) == b"line one\nline two\n"
    assert userfs.read_tail(root, parts, "empty", 10) == b""


def test_read_tail_never_creates_and_names_a_missing_path(users):
    with pytest.raises(UserPathError) as raised:
        userfs.read_tail(str(users), ["alice", "mpi-jobs", JOB], "stderr", 10)
    assert str(raised.value) == "alice/mpi-jobs: does not exist"
    assert os.listdir(users / "alice") == []


def test_read_tail_of_a_sparse_terabyte_reads_only_the_tail(users):
    job_dir = _job_dir(users)
    with open(job_dir / "stdout", "wb") as sparse:
        sparse.truncate(2**40 - 8)
        sparse.seek(0, os.SEEK_END)
        sparse.write(b"THE END\n")
    before = _bytes_read()
    tail = userfs.read_tail(str(users), ["alice", "mpi-jobs", JOB], "stdout", 4096)
    assert _bytes_read() - before < 2**20  # the tail, not the terabyte before it
    assert tail == bytes(4088) + b"THE END\n"


def _bytes_read():
    """Bytes this process has read through read(2) and pread(2) so far."""
    with open("/proc/self/io") as counters:
        return next(int(line.split()[1]) for line in counters if line.startswith("rchar:"))


# --- symbolic links ----------------------------------------------------------------


@pytest.mark.parametrize("relative", [False, True], ids=["absolute-link", "relative-link"])
def test_a_linked_directory_component_never_reaches_bob(users, relative):
    target = users / "bob" / "mpi-jobs"
    (users / "alice" / "mpi-jobs").symlink_to("../bob/mpi-jobs" if relative else target)
    before = _victims(users)
    root, parts = str(users), ["alice", "mpi-jobs", JOB]
    calls = [
        lambda: userfs.makedirs(root, ["alice", "mpi-jobs", "planted"]),
        lambda: userfs.write_file(root, parts, "status.json", b"overwritten"),
        lambda: userfs.read_tail(root, parts, "stderr", 4096),
    ]
    for call in calls:
        with pytest.raises(UserPathError) as raised:
            call()
        assert str(raised.value) == "alice/mpi-jobs: is a symbolic link, which is never followed"
    assert _victims(users) == before


def test_write_file_replaces_a_linked_file_name_without_touching_its_target(users):
    job_dir = _job_dir(users)
    bob_status = users / "bob" / "mpi-jobs" / JOB / "status.json"
    (job_dir / "status.json").symlink_to(bob_status)
    before = _victims(users)
    userfs.write_file(str(users), ["alice", "mpi-jobs", JOB], "status.json", b"alice's")
    assert not (job_dir / "status.json").is_symlink()
    assert (job_dir / "status.json").read_bytes() == b"alice's"
    assert _victims(users) == before


def test_read_tail_refuses_a_linked_file_name(users):
    job_dir = _job_dir(users)
    (job_dir / "stderr").symlink_to(users / "bob" / "secret.txt")
    with pytest.raises(UserPathError, match="stderr: is a symbolic link"):
        userfs.read_tail(str(users), ["alice", "mpi-jobs", JOB], "stderr", 4096)


def test_a_chain_of_1100_links_fails_cleanly_at_its_first_link(users):
    chain = users / "alice" / "chain"
    chain.mkdir()
    (chain / "link-1099").symlink_to(users / "bob" / "mpi-jobs")
    for index in range(1098, -1, -1):
        (chain / f"link-{index}").symlink_to(f"link-{index + 1}")
    (users / "alice" / "mpi-jobs").symlink_to("chain/link-0")
    before = _victims(users)
    root, parts = str(users), ["alice", "mpi-jobs", JOB]
    for call in [
        lambda: userfs.makedirs(root, parts),
        lambda: userfs.write_file(root, parts, "status.json", b"x"),
        lambda: userfs.read_tail(root, parts, "stderr", 10),
    ]:
        with pytest.raises(UserPathError, match="^alice/mpi-jobs: is a symbolic link"):
            call()
    assert _victims(users) == before


# --- other file types --------------------------------------------------------------


def test_write_file_never_opens_planted_fifos(users):
    job_dir = _job_dir(users)
    for name in ["status.json", "status.json.tmp", ".status.json.tmp"]:
        os.mkfifo(job_dir / name)
    _within(BLOCKED_AFTER, userfs.write_file, str(users), ["alice", "mpi-jobs", JOB],
            "status.json", b"written")
    assert (job_dir / "status.json").read_bytes() == b"written"
    assert stat.S_ISFIFO((job_dir / "status.json.tmp").lstat().st_mode)


def test_write_file_never_opens_a_planted_file_even_at_its_exact_temporary_name(users,
                                                                               monkeypatch):
    job_dir = _job_dir(users)
    monkeypatch.setattr(userfs.os, "urandom", lambda size: b"guessed!"[:size])
    guessed = f".status.json.{b'guessed!'.hex()}.tmp"
    (job_dir / guessed).symlink_to(users / "bob" / "secret.txt")
    before = _victims(users)
    with pytest.raises(UserPathError, match=f"^alice/mpi-jobs/{JOB}/status.json: "):
        userfs.write_file(str(users), ["alice", "mpi-jobs", JOB], "status.json", b"x")
    assert _victims(users) == before
    assert (job_dir / guessed).is_symlink()


def test_read_tail_refuses_a_fifo_without_blocking(users):
    os.mkfifo(_job_dir(users) / "stderr")
    with pytest.raises(UserPathError, match="stderr: is a FIFO, not a regular file"):
        _within(BLOCKED_AFTER, userfs.read_tail, str(users), ["alice", "mpi-jobs", JOB],
                "stderr", 10)


def test_read_tail_refuses_a_socket(users, monkeypatch):
    monkeypatch.chdir(_job_dir(users))  # relative bind: the full path is too long for AF_UNIX
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind("stderr")
        with pytest.raises(UserPathError, match="stderr: is a socket, not a regular file"):
            _within(BLOCKED_AFTER, userfs.read_tail, str(users), ["alice", "mpi-jobs", JOB],
                "stderr", 10)


def test_read_tail_refuses_a_directory(users):
    (_job_dir(users) / "stderr").mkdir()
    with pytest.raises(UserPathError, match="stderr: is a directory, not a regular file"):
        userfs.read_tail(str(users), ["alice", "mpi-jobs", JOB], "stderr", 10)


def test_write_file_onto_a_directory_fails_and_removes_its_temporary_file(users):
    job_dir = _job_dir(users)
    (job_dir / "status.json").mkdir()
    with pytest.raises(UserPathError, match=f"^alice/mpi-jobs/{JOB}/status.json: is a directory"):
        userfs.write_file(str(users), ["alice", "mpi-jobs", JOB], "status.json", b"x")
    assert os.listdir(job_dir) == ["status.json"]
    assert (job_dir / "status.json").is_dir()


def test_a_file_where_a_directory_belongs_is_refused(users):
    (users / "alice" / "mpi-jobs").write_bytes(b"not a directory")
    with pytest.raises(UserPathError, match="alice/mpi-jobs: is a regular file, not a directory"):
        userfs.makedirs(str(users), ["alice", "mpi-jobs", JOB])


# --- a race between check and use --------------------------------------------------

# Swaps two names atomically (renameat2 RENAME_EXCHANGE, so the raced name always exists)
# until killed. A separate process with random pauses: a swapper in step with the test
# (a thread under the GIL, even a tight loop) can show it the same side every time.
_SWAPPER = """
import ctypes, os, random, sys, time
libc = ctypes.CDLL(None, use_errno=True)
first, second = map(os.fsencode, sys.argv[1:3])
print("swapping", flush=True)
while not libc.renameat2(-100, first, -100, second, 2):
    time.sleep(random.random() / 10000)  # random pauses: never in step with the test
sys.exit("renameat2: " + os.strerror(ctypes.get_errno()))
"""


def test_swapping_a_component_for_a_link_during_the_walk_never_reaches_bob(users):
    alice = users / "alice"
    (alice / "mpi-jobs").mkdir()
    (alice / "decoy").symlink_to(users / "bob" / "mpi-jobs")
    before = _victims(users)
    outcomes, refusals = {"done": 0, "refused": 0}, set()
    with subprocess.Popen([SYSTEM_PYTHON, "-c", _SWAPPER, alice / "mpi-jobs", alice / "decoy"],
                          stdout=subprocess.PIPE, text=True) as swapper:
        try:
            assert swapper.stdout.readline() == "swapping\n"
            # A few hundred rounds, more until both sides were met often enough (an
            # operation on the link fails fast, so the directory is met less often).
            for index in range(3000):
                if index >= 300 and min(outcomes.values()) >= 10:
                    break
                for call in [
                    lambda: userfs.write_file(str(users), ["alice", "mpi-jobs", f"w-{index}"],
                                                  "status.json", b"raced"),
                    lambda: userfs.makedirs(str(users), ["alice", "mpi-jobs", f"d-{index}"]),
                ]:
                    try:
                        call()
                        outcomes["done"] += 1
                    except UserPathError as refusal:
                        outcomes["refused"] += 1
                        refusals.add(str(refusal))
        finally:
            swapper.kill()
    assert swapper.returncode == -signal.SIGKILL  # it swapped until the end
    assert _victims(users) == before
    # The race really ran: both the directory and the link were met.
    assert min(outcomes.values()) >= 10, outcomes
    assert refusals <= {"alice/mpi-jobs: is a symbolic link, which is never followed",
                        "alice/mpi-jobs: was replaced while being opened"}


# --- confinement in a child with the user's uid ------------------------------------


def test_confined_write_runs_as_the_user(shared_users):
    parts = ["alice", "mpi-jobs", JOB]
    result = userfs.run_confined("write_file", uid=ALICE_UID, gid=ALICE_GID,
                                     root=str(shared_users), parts=parts, name="status.json",
                                     data=b'{"state": "running"}')
    assert result is None
    written = shared_users.joinpath(*parts, "status.json")
    assert written.read_bytes() == b'{"state": "running"}'
    for path in [written, written.parent, written.parent.parent]:
        assert (path.stat().st_uid, path.stat().st_gid) == (ALICE_UID, ALICE_GID)


def test_confined_read_returns_binary_content_intact(shared_users):
    userfs.run_confined("write_file", uid=ALICE_UID, gid=ALICE_GID, root=str(shared_users),
                            parts=["alice", "mpi-jobs", JOB], name="stdout",
                            data=bytes(range(256)))
    tail = userfs.run_confined("read_tail", uid=ALICE_UID, gid=ALICE_GID,
                                   root=str(shared_users), parts=["alice", "mpi-jobs", JOB],
                                   name="stdout", max_bytes=200)
    assert tail == bytes(range(56, 256))


@pytest.mark.parametrize("dir_mode, file_mode", [(0o700, 0o644), (0o711, 0o600)],
                         ids=["bob-dir-closed", "bob-file-closed"])
def test_confined_child_cannot_read_bobs_file_even_by_a_direct_path(shared_users, dir_mode,
                                                                    file_mode):
    (shared_users / "bob").chmod(dir_mode)
    (shared_users / "bob" / "secret.txt").chmod(file_mode)
    kwargs = {"root": str(shared_users), "parts": ["bob"], "name": "secret.txt", "max_bytes": 100}
    assert userfs.read_tail(**kwargs) == BOB_SECRET  # only the uid stands in the way
    with pytest.raises(UserPathError, match="permission denied"):
        userfs.run_confined("read_tail", uid=ALICE_UID, gid=ALICE_GID, **kwargs)


def test_confined_child_cannot_write_into_bobs_directory(shared_users):
    (shared_users / "bob").chmod(0o755)
    before = _victims(shared_users)
    with pytest.raises(UserPathError, match="^bob/mpi-jobs/.*permission denied"):
        userfs.run_confined("write_file", uid=ALICE_UID, gid=ALICE_GID,
                                root=str(shared_users), parts=["bob", "mpi-jobs", JOB],
                                name="status.json", data=b"overwritten")
    assert _victims(shared_users) == before


def test_confined_child_drops_the_callers_supplementary_groups(shared_users):
    bob = shared_users / "bob"
    os.chown(bob, BOB_UID, SHARED_GID)
    bob.chmod(0o750)
    caller_groups = os.getgroups()
    os.setgroups([SHARED_GID])  # the caller could read bob's directory through this group
    try:
        with pytest.raises(UserPathError, match="^bob: permission denied"):
            userfs.run_confined("read_tail", uid=ALICE_UID, gid=ALICE_GID,
                                    root=str(shared_users), parts=["bob"], name="secret.txt",
                                    max_bytes=100)
    finally:
        os.setgroups(caller_groups)


def test_confined_child_refuses_links_too(shared_users):
    (shared_users / "alice" / "mpi-jobs").symlink_to(shared_users / "bob" / "mpi-jobs")
    with pytest.raises(UserPathError, match="^alice/mpi-jobs: is a symbolic link"):
        userfs.run_confined("read_tail", uid=ALICE_UID, gid=ALICE_GID,
                                root=str(shared_users), parts=["alice", "mpi-jobs", JOB],
                                name="stderr", max_bytes=100)


def test_argument_errors_come_back_from_the_child_as_they_are(users):
    with pytest.raises(ValueError, match="max_bytes must be between"):
        userfs.run_confined("read_tail", root=str(users), parts=["alice"], name="stderr",
                                max_bytes=0)
    with pytest.raises(TypeError, match="parts must be a list"):
        userfs.run_confined("makedirs", root=str(users), parts="alice")


@pytest.mark.parametrize("op", ["ensure_owned_dir", "chown_tree", "main", "os.system"])
def test_run_confined_accepts_only_the_user_operations(users, op):
    with pytest.raises(ValueError, match="op must be one of"):
        userfs.run_confined(op, root=str(users), name="alice")


def test_run_confined_wants_uid_and_gid_together(users):
    with pytest.raises(ValueError, match="together"):
        userfs.run_confined("makedirs", uid=ALICE_UID, root=str(users), parts=["alice"])


def test_the_child_script_enforces_the_allowlist_itself(users):
    request = {"op": "chown_tree", "kwargs": {"root": str(users), "name": "bob", "from_uid": 0,
                                              "to_uid": ALICE_UID, "to_gid": ALICE_GID}}
    before = _victims(users)
    child = subprocess.run([SYSTEM_PYTHON, "-I", "-S", MODULE_PATH],
                           input=json.dumps(request).encode(), capture_output=True, timeout=30,
                           check=True)
    reply = json.loads(child.stdout)
    assert reply["kind"] == "ValueError" and "not allowed" in reply["error"]
    assert _victims(users) == before


def _fake_child(tmp_path, body):
    """An executable standing in for the interpreter; it ignores its arguments."""
    script = tmp_path / "fake-python"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return str(script)


@pytest.mark.parametrize("interpreter, timeout", [(SYSTEM_PYTHON, 0.001), ("sleep", 0.5)],
                         ids=["real-child-tiny-timeout", "hanging-child"])
def test_a_slow_child_is_killed_at_the_timeout(users, tmp_path, monkeypatch, interpreter,
                                               timeout):
    if interpreter == "sleep":
        interpreter = _fake_child(tmp_path, "exec sleep 30")
    monkeypatch.setattr(userfs, "CHILD_PYTHON", interpreter)
    started = []

    class RecordingPopen(subprocess.Popen):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            started.append(self)

    monkeypatch.setattr(subprocess, "Popen", RecordingPopen)
    began = time.monotonic()
    with pytest.raises(UserPathError, match=f"did not finish within {timeout} s"):
        userfs.run_confined("makedirs", timeout=timeout, root=str(users), parts=["alice", "x"])
    assert time.monotonic() - began < timeout + 5
    assert started[0].returncode == -signal.SIGKILL


@pytest.mark.parametrize("body, message", [
    ("echo 'Traceback (most recent call last):' >&2; echo 'boom' >&2; exit 3",
     "exited with status 3: boom$"),
    ("kill -TERM $$", "killed by SIGTERM"),
    ("cat >/dev/null; echo 'not json'", "gave no valid reply"),
    ("cat >/dev/null; echo '[1, 2]'", "gave no valid reply"),
    ("exec cat /dev/zero", "printed more than"),
    ("exec head -c 100000000 /dev/zero >&2", "gave no valid reply"),
], ids=["exit-status", "signal", "not-json", "not-an-object", "endless-stdout", "huge-stderr"])
def test_a_misbehaving_child_raises_user_path_error(users, tmp_path, monkeypatch, body, message):
    monkeypatch.setattr(userfs, "CHILD_PYTHON", _fake_child(tmp_path, body))
    with pytest.raises(UserPathError, match=message) as raised:
        userfs.run_confined("makedirs", timeout=20, root=str(users), parts=["alice"])
    assert len(str(raised.value)) < 1000


def test_a_child_of_another_python_refuses_the_callers_code_by_name(users, monkeypatch):
    monkeypatch.setattr(userfs.sys.implementation, "cache_tag", "cpython-299")
    with pytest.raises(UserPathError, match="exited with status 1: the confined child runs "
                                            r"cpython-3\d+, not the caller's cpython-299$"):
        userfs.run_confined("makedirs", root=str(users), parts=["alice", "x"])
    assert not (users / "alice" / "x").exists()


def test_the_child_imports_only_what_it_runs(tmp_path):
    """The child starts for every read of a job's output: what only the caller needs
    (subprocess, selectors, signal) stays out of it."""
    probe = tmp_path / "probe.py"
    probe.write_text(f"exec(open({MODULE_PATH!r}).read().replace('\\nif __name__', "
                     "'\\nif False and __name__'))\n"
                     "import sys\nprint(' '.join(sorted(sys.modules)))\n")
    child = subprocess.run([SYSTEM_PYTHON, "-I", "-S", str(probe)], capture_output=True,
                           timeout=30, check=True)
    loaded = set(child.stdout.decode().split())
    assert "json" in loaded
    assert not loaded & {"subprocess", "selectors", "signal", "base64", "secrets", "calendar"}


def test_a_child_that_cannot_start_raises_user_path_error(users, monkeypatch):
    monkeypatch.setattr(userfs, "CHILD_PYTHON", "/nonexistent/python3")
    with pytest.raises(UserPathError, match="cannot start the confined child"):
        userfs.run_confined("makedirs", root=str(users), parts=["alice"])


def test_the_child_runs_where_salt_keeps_utils_only_root_can_read(shared_users, tmp_path):
    # Salt syncs utils to extmods/utils, mode 0700: the user's uid cannot read the file,
    # and a users/ directory of 0711 lets it pass through but not list.
    private = pathlib.Path(tempfile.mkdtemp(prefix="mpi-userfs-extmods-"))
    try:
        shutil.copy(REPO / "_utils" / "dmpi" / "node" / "userfs.py", private / "userfs.py")
        private.chmod(0o700)
        shared_users.chmod(0o711)
        copy = load_extension_from(private / "userfs.py")
        copy.CHILD_PYTHON = SYSTEM_PYTHON
        parts = ["alice", "mpi-jobs", JOB]
        copy.run_confined("write_file", uid=ALICE_UID, gid=ALICE_GID, root=str(shared_users),
                          parts=parts, name="status.json", data=b"{}")
        assert copy.run_confined("read_tail", uid=ALICE_UID, gid=ALICE_GID,
                                 root=str(shared_users), parts=parts, name="status.json",
                                 max_bytes=10) == b"{}"
    finally:
        shutil.rmtree(private)


def load_extension_from(path):
    spec = importlib.util.spec_from_file_location("mpi_userfs_private_copy", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- root-only operations ----------------------------------------------------------


def test_ensure_owned_dir_creates_then_leaves_a_correct_directory_alone(users):
    result = userfs.ensure_owned_dir(str(users), "carol", ALICE_UID, ALICE_GID)
    assert result == {"created": True, "changed": True}  # made by root, then given away
    found = (users / "carol").lstat()
    assert stat.S_ISDIR(found.st_mode) and stat.S_IMODE(found.st_mode) == 0o700
    assert (found.st_uid, found.st_gid) == (ALICE_UID, ALICE_GID)
    assert userfs.ensure_owned_dir(str(users), "carol", ALICE_UID, ALICE_GID) == {
        "created": False, "changed": False}


def test_ensure_owned_dir_fixes_owner_and_mode(users):
    (users / "alice").chmod(0o2755)
    result = userfs.ensure_owned_dir(str(users), "alice", ALICE_UID, ALICE_GID, mode=0o750)
    assert result == {"created": False, "changed": True}
    found = (users / "alice").stat()
    assert (found.st_uid, found.st_gid, stat.S_IMODE(found.st_mode)) == (ALICE_UID, ALICE_GID,
                                                                        0o750)


@pytest.mark.parametrize("plant", ["link-to-bob", "file"])
def test_ensure_owned_dir_refuses_anything_but_a_directory(users, plant):
    if plant == "file":
        (users / "carol").write_bytes(b"planted")
    else:
        (users / "carol").symlink_to(users / "bob")
    before = _victims(users)
    with pytest.raises(UserPathError, match="^carol: is "):
        userfs.ensure_owned_dir(str(users), "carol", ALICE_UID, ALICE_GID)
    assert _victims(users) == before


def test_chown_tree_moves_only_guest_entries_and_never_follows_links(users):
    alice, outside = users / "alice", users.parent / "outside"
    (alice / "data" / "deep").mkdir(parents=True)
    (alice / "data" / "deep" / "result.txt").write_bytes(b"r")
    os.mkfifo(alice / "data" / "fifo")
    (alice / "escape-file").symlink_to(outside / "outside.txt")
    (alice / "escape-dir").symlink_to(outside)
    _chown_tree_to(alice, GUEST_UID, GUEST_GID)
    _chown_tree_to(outside, GUEST_UID, GUEST_GID)
    (alice / "not-guest.txt").write_bytes(b"n")
    os.chown(alice / "not-guest.txt", OTHER_UID, OTHER_UID)
    before_outside = _snapshot(outside)

    changed = userfs.chown_tree(str(users), "alice", GUEST_UID, ALICE_UID, ALICE_GID)

    moved = ["", "data", "data/deep", "data/deep/result.txt", "data/fifo", "escape-file",
             "escape-dir"]
    assert changed == len(moved)
    for relative in moved:
        found = (alice / relative).lstat()
        assert (found.st_uid, found.st_gid) == (ALICE_UID, ALICE_GID), relative
    assert (alice / "not-guest.txt").lstat().st_uid == OTHER_UID
    assert _snapshot(outside) == before_outside
    assert userfs.chown_tree(str(users), "alice", GUEST_UID, ALICE_UID, ALICE_GID) == 0


def test_chown_tree_refuses_a_link_at_the_top(users):
    outside = users.parent / "outside"
    _chown_tree_to(outside, GUEST_UID, GUEST_GID)
    (users / "carol").symlink_to(outside)
    before = _snapshot(outside)
    with pytest.raises(UserPathError, match="^carol: is a symbolic link"):
        userfs.chown_tree(str(users), "carol", GUEST_UID, ALICE_UID, ALICE_GID)
    assert _snapshot(outside) == before


def test_chown_tree_stops_at_its_depth_limit(users):
    deep = users / "alice" / "/".join(["d"] * (userfs.MAX_TREE_DEPTH + 1))
    deep.mkdir(parents=True)
    with pytest.raises(UserPathError, match="deeper than"):
        userfs.chown_tree(str(users), "alice", GUEST_UID, ALICE_UID, ALICE_GID)


# --- property: whatever alice plants, nothing outside her directory changes -----------

# Mostly a few names, so operations often meet what was planted; sometimes any name.
_NAMES = ["mpi-jobs", "j", "status.json", "stderr", "status.json.tmp"]
_name = st.one_of(
    st.sampled_from(_NAMES), st.sampled_from(_NAMES), st.sampled_from(_NAMES),
    st.text(st.characters(blacklist_characters="/\0", blacklist_categories=("Cs",)),
            min_size=1, max_size=8).filter(lambda name: name not in (".", "..")),
)
_any_name = _name | st.sampled_from(["", ".", "..", "a/b", "x\0", "../bob"])
# Links out of alice's directory and FIFOs are the attacks: planted most often.
_KINDS = ["dir", "file", "fifo", "fifo", "link-inside", "link-outside", "link-outside",
          "link-bob-dir", "link-bob-dir", "link-bob-file", "link-bob-file", "link-dangling",
          "link-loop"]


def _link_target(kind, users, name):
    return {
        "link-inside": str(users / "alice" / "mpi-jobs"),
        "link-outside": str(users.parent / "outside"),
        "link-bob-dir": str(users / "bob" / "mpi-jobs"),
        "link-bob-file": str(users / "bob" / "secret.txt"),
        "link-dangling": "/nonexistent/target",
        "link-loop": name,
    }[kind]


def _plant(users, parts, kind):
    """Create ``alice/parts...`` of ``kind``, walking with O_NOFOLLOW so the setup itself
    never writes through a link planted by an earlier entry; skips what cannot be made."""
    fd = os.open(users / "alice", os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts[:-1]:
            parent_fd = fd
            try:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, dir_fd=parent_fd)
                fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent_fd)
            except OSError:
                return  # the finally below closes parent_fd, which fd still is
            os.close(parent_fd)
        name = parts[-1]
        try:
            if kind == "dir":
                os.mkdir(name, dir_fd=fd)
            elif kind == "file":
                file_fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, dir_fd=fd)
                os.write(file_fd, b"alice's own data")
                os.close(file_fd)
            elif kind == "fifo":
                os.mkfifo(name, dir_fd=fd)
            else:
                os.symlink(_link_target(kind, users, name), name, dir_fd=fd)
        except OSError:
            pass
    finally:
        os.close(fd)


def _operations(data, tree):
    """Operations on random paths, mostly aimed at what was planted: a planted path, maybe
    extended, split into the directory parts and the name the operation acts on."""
    planted = [parts for parts, _ in tree] or [[]]
    operations = []
    for _ in range(data.draw(st.integers(1, 6), label="count")):
        if data.draw(st.integers(0, 4), label="aim"):
            path = data.draw(st.sampled_from(planted)) + data.draw(st.lists(_any_name, max_size=2))
        else:
            path = data.draw(st.lists(_any_name, max_size=4))
        path = path or [data.draw(_any_name)]
        split = data.draw(st.integers(0, len(path) - 1))
        operations.append((data.draw(st.sampled_from(["makedirs", "write_file", "read_tail"])),
                           path[:split], path[split], data.draw(st.integers(1, 64))))
    return operations


@settings(max_examples=100, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    tree=st.lists(st.tuples(st.lists(_name, min_size=1, max_size=3), st.sampled_from(_KINDS)),
                  min_size=1, max_size=12),
    data=st.data(),
)
def test_whatever_alice_plants_nothing_outside_her_directory_changes(users, tree, data):
    alice = users / "alice"
    shutil.rmtree(alice)
    alice.mkdir()
    for parts, kind in tree:
        _plant(users, parts, kind)
    operations = _operations(data, tree)
    before = _victims(users)
    root = str(users)

    def run_all():
        for op, parts, name, max_bytes in operations:
            parts = ["alice", *parts]
            try:
                if op == "makedirs":
                    userfs.makedirs(root, parts + [name])
                elif op == "write_file":
                    userfs.write_file(root, parts, name, b"written by the node")
                else:
                    tail = userfs.read_tail(root, parts, name, max_bytes)
                    assert tail in b"alice's own data" or tail in b"written by the node", tail
            except UserPathError:
                pass

    _within(BLOCKED_AFTER, run_all)  # a blocked operation fails here
    assert _victims(users) == before
    assert sorted(os.listdir(users)) == ["alice", "bob"]
    assert sorted(os.listdir(users.parent)) == ["outside", "users"]


# ------------------------------------------------------------------ prune_job_dirs

OLD_JOB, NEW_JOB, KEPT_JOB = "20200101-000000-aaaaaa", "20991231-000000-bbbbbb", \
    "20200101-000001-cccccc"


def _aged_job_dir(users, name, age_days):
    top = users / "alice" / "mpi-jobs" / name
    (top / "sub").mkdir(parents=True)
    (top / "stdout").write_text("out")
    (top / "sub" / "deep").write_text("x")
    then = time.time() - age_days * 86400
    for path in (top / "sub" / "deep", top / "sub", top / "stdout", top):
        os.utime(path, (then, then), follow_symlinks=False)
    return top


def test_prune_job_dirs_removes_old_untouched_job_dirs_only(users, tmp_path):
    outside = tmp_path / "victim"
    outside.mkdir()
    (outside / "precious").write_text("keep")
    old = _aged_job_dir(users, OLD_JOB, 100)
    os.symlink(outside, old / "sub" / "link")  # a link inside is removed, never followed
    for path in (old / "sub", old):
        os.utime(path, (time.time() - 100 * 86400,) * 2)
    _aged_job_dir(users, NEW_JOB, 0)
    _aged_job_dir(users, KEPT_JOB, 100)
    touched = _aged_job_dir(users, "20200102-000000-dddddd", 100)
    (touched / "stdout").write_text("the user changed it today")
    (users / "alice" / "mpi-jobs" / "notes").write_text("not a job dir")
    removed = userfs.prune_job_dirs(str(users), ["alice", "mpi-jobs"],
                                        time.time() - 30 * 86400, keep=[KEPT_JOB])
    assert removed == [OLD_JOB]
    assert sorted(os.listdir(users / "alice" / "mpi-jobs")) == sorted(
        [NEW_JOB, KEPT_JOB, "20200102-000000-dddddd", "notes"])
    assert (outside / "precious").read_text() == "keep"


def test_prune_job_dirs_of_a_user_without_jobs_removes_nothing(users):
    assert userfs.prune_job_dirs(str(users), ["alice", "mpi-jobs"], time.time()) == []


def test_prune_job_dirs_refuses_a_linked_mpi_jobs(users, tmp_path):
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", users / "alice" / "mpi-jobs")
    with pytest.raises(userfs.UserPathError, match="symbolic link"):
        userfs.prune_job_dirs(str(users), ["alice", "mpi-jobs"], time.time())


def test_prune_job_dirs_runs_confined_as_the_user(shared_users):
    _aged_job_dir(shared_users, OLD_JOB, 100)
    for path, _, files in os.walk(shared_users / "alice"):
        for name in [path] + [os.path.join(path, f) for f in files]:
            os.lchown(name, ALICE_UID, ALICE_GID)
    removed = userfs.run_confined("prune_job_dirs", uid=ALICE_UID, gid=ALICE_GID,
                                      root=str(shared_users), parts=["alice", "mpi-jobs"],
                                      older_than=time.time() - 86400, keep=[])
    assert removed == [OLD_JOB]
