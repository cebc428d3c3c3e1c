"""The storage's own directories, made on a real file system as every node's highstate
makes them at once (:mod:`dmpi.storage.shared`)."""

import multiprocessing
import os
import stat

import pytest

from dmpi.errors import DockerMPIError, RequestError
from dmpi.storage import shared

ME = (os.getuid(), os.getgid())


def _facts(path):
    found = os.lstat(path)
    return stat.S_ISDIR(found.st_mode), (found.st_uid, found.st_gid), stat.S_IMODE(found.st_mode)


def test_a_missing_directory_is_made_with_its_owner_and_mode(tmp_path):
    path = str(tmp_path / "users")
    assert shared.ensure_directory(path, *ME, "0711") == {
        "directory": "new", "owner": f"{ME[0]}:{ME[1]}", "mode": "0711"}
    assert _facts(path) == (True, ME, 0o711)
    assert shared.ensure_directory(path, *ME, "0711") == {}


def test_test_mode_says_what_it_would_do_and_does_nothing(tmp_path):
    path = tmp_path / "users"
    assert shared.ensure_directory(str(path), *ME, "0711", test=True) == {
        "directory": "new", "owner": f"{ME[0]}:{ME[1]}", "mode": "0711"}
    assert not path.exists()
    path.mkdir(mode=0o755)
    path.chmod(0o755)
    assert shared.ensure_directory(str(path), *ME, 0o711, test=True) == {"mode": "0711"}
    assert _facts(path)[2] == 0o755


def test_a_wrong_mode_is_set_and_reported(tmp_path):
    path = tmp_path / "health"
    path.mkdir()
    path.chmod(0o777)
    assert shared.ensure_directory(str(path), *ME, "0700") == {"mode": "0700"}
    assert _facts(path)[2] == 0o700


@pytest.mark.skipif(os.geteuid() != 0, reason="only root gives a directory away")
def test_a_wrong_owner_is_set_and_reported(tmp_path):
    path = tmp_path / "users"
    path.mkdir(mode=0o711)
    path.chmod(0o711)
    assert shared.ensure_directory(str(path), 65534, 65534, "0711") == {"owner": "65534:65534"}
    assert _facts(path) == (True, (65534, 65534), 0o711)


def _ensure_at_the_barrier(barrier, path, results):
    barrier.wait()
    try:
        results.put(shared.ensure_directory(path, *ME, "0711"))
    except Exception as exc:  # the test reports any failure of any racer
        results.put(repr(exc))


def test_hosts_making_it_at_the_same_moment_all_succeed_and_one_made_it(tmp_path):
    # As every node's highstate on one shared file system: processes released together.
    racers = 8
    path = str(tmp_path / "users")
    context = multiprocessing.get_context("fork")
    barrier, results = context.Barrier(racers), context.Queue()
    processes = [context.Process(target=_ensure_at_the_barrier, args=(barrier, path, results))
                 for _ in range(racers)]
    for process in processes:
        process.start()
    answers = [results.get(timeout=60) for _ in processes]
    for process in processes:
        process.join()
    assert not [answer for answer in answers if not isinstance(answer, dict)], answers
    assert [answer.get("directory") for answer in answers].count("new") == 1
    assert _facts(path) == (True, ME, 0o711)


def test_a_directory_another_host_made_first_is_no_failure(tmp_path, monkeypatch):
    # The other host's mkdir lands between this host's look and its own mkdir.
    path = tmp_path / "users"
    real_mkdir = os.mkdir

    def made_by_another_host_first(target, mode=0o777):
        real_mkdir(target, 0o711)
        os.chmod(target, 0o711)
        real_mkdir(target, mode)

    monkeypatch.setattr(shared.os, "mkdir", made_by_another_host_first)
    assert shared.ensure_directory(str(path), *ME, "0711") == {}
    assert _facts(path) == (True, ME, 0o711)


def test_a_missing_parent_is_never_made(tmp_path):
    path = tmp_path / "unmounted" / "users"
    with pytest.raises(DockerMPIError, match="parent directory does not exist"):
        shared.ensure_directory(str(path), *ME, "0711")
    assert not (tmp_path / "unmounted").exists()


@pytest.mark.parametrize("kind", ["file", "symlink", "dangling symlink"])
def test_anything_but_a_directory_is_refused_and_left_alone(tmp_path, kind):
    path = tmp_path / "users"
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o755)
    target.chmod(0o755)
    if kind == "file":
        path.write_text("x")
    elif kind == "symlink":
        path.symlink_to(target)
    else:
        path.symlink_to(tmp_path / "nothing")
    with pytest.raises(DockerMPIError, match="is not a directory: left as it is"):
        shared.ensure_directory(str(path), *ME, "0700")
    assert _facts(target)[2] == 0o755
    assert not (tmp_path / "nothing").exists()


@pytest.mark.parametrize("user, group, mode, error", [
    ("no-such-user-dmpi", "root", "0711", "no user 'no-such-user-dmpi'"),
    ("root", "no-such-group-dmpi", "0711", "no group 'no-such-group-dmpi'"),
    ("root", "root", "0789", "mode '0789' is not an octal file mode"),
    ("root", "root", "17777", "mode '17777' is not an octal file mode"),
])
def test_bad_arguments_are_named_and_nothing_is_made(tmp_path, user, group, mode, error):
    path = tmp_path / "users"
    with pytest.raises(RequestError, match=error):
        shared.ensure_directory(str(path), user, group, mode)
    assert not path.exists()
