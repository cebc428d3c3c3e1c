"""Unit tests of the mpi_storage state's host check: only root binds a privileged port
(the execution module reads the kernel's floor: tests/unit/dmpi/storage/test_hosts.py),
and of its shared directories over the real execution module."""

import pytest
from salt.exceptions import CommandExecutionError
from tests.extension import load_extension

state = load_extension("_states/mpi_storage.py", "mpi_storage_state")
module = load_extension("_modules/mpi_storage.py", "mpi_storage_module")
LOWERED = "net.ipv4.ip_unprivileged_port_start is 0 on this host: ..."


@pytest.fixture
def host(monkeypatch):
    def make(problem=None, fail=None, test=False):
        def port_floor_problem():
            if fail:
                raise CommandExecutionError(fail)
            return problem
        monkeypatch.setattr(state, "__salt__",
                            {"mpi_storage.port_floor_problem": port_floor_problem},
                            raising=False)
        monkeypatch.setattr(state, "__opts__", {"test": test}, raising=False)
    return make


@pytest.mark.parametrize("test", [False, True])
def test_a_host_where_only_root_binds_passes(host, test):
    host(test=test)
    assert state.privileged_ports_root_only("net.ipv4.ip_unprivileged_port_start") == {
        "name": "net.ipv4.ip_unprivileged_port_start", "result": True, "changes": {},
        "comment": "Below 1024 only root binds on this host"}


@pytest.mark.parametrize("test", [False, True])
def test_a_lowered_floor_fails_with_the_reason_and_changes_nothing(host, test):
    host(problem=LOWERED, test=test)
    ret = state.privileged_ports_root_only("net.ipv4.ip_unprivileged_port_start")
    assert (ret["result"], ret["changes"], ret["comment"]) == (False, {}, LOWERED)


def test_an_unreadable_floor_fails_with_the_error(host):
    host(fail="cannot read /proc/sys/net/ipv4/ip_unprivileged_port_start: gone")
    ret = state.privileged_ports_root_only("net.ipv4.ip_unprivileged_port_start")
    assert ret["result"] is False and ret["comment"].startswith("cannot read")


@pytest.fixture
def storage_dirs(monkeypatch):
    """The state over the real execution module, on a temp directory."""
    def make(test=False):
        monkeypatch.setattr(state, "__salt__",
                            {"mpi_storage.shared_directory": module.shared_directory},
                            raising=False)
        monkeypatch.setattr(state, "__opts__", {"test": test}, raising=False)
    return make


def _me():
    import os
    return os.getuid(), os.getgid()


def test_a_shared_directory_is_made_then_left_as_it_is(storage_dirs, tmp_path):
    storage_dirs()
    path = str(tmp_path / "users")
    uid, gid = _me()
    ret = state.shared_directory(path, uid, gid, "0711")
    assert (ret["result"], ret["changes"]) == (
        True, {"changes": {"directory": "new", "owner": f"{uid}:{gid}", "mode": "0711"}})
    assert state.shared_directory(path, uid, gid, "0711") == {
        "name": path, "result": True, "changes": {},
        "comment": f"Directory {path} is as it should be"}


def test_a_shared_directory_in_test_mode_is_none_and_not_made(storage_dirs, tmp_path):
    storage_dirs(test=True)
    path = tmp_path / "users"
    ret = state.shared_directory(str(path), *_me(), "0711")
    assert ret["result"] is None and ret["changes"]["changes"]["directory"] == "new"
    assert not path.exists()


def test_a_shared_directory_over_a_file_fails_naming_it(storage_dirs, tmp_path):
    storage_dirs()
    path = tmp_path / "users"
    path.write_text("x")
    ret = state.shared_directory(str(path), *_me(), "0711")
    assert (ret["result"], ret["changes"]) == (False, {})
    assert ret["comment"] == f"{path} exists and is not a directory: left as it is"
