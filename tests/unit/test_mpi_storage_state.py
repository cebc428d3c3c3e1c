"""Unit tests of the mpi_storage state's host check: only root binds a privileged port
(the execution module reads the kernel's floor: tests/unit/dmpi/storage/test_hosts.py)."""

import pytest
from salt.exceptions import CommandExecutionError
from tests.extension import load_extension

state = load_extension("_states/mpi_storage.py", "mpi_storage_state")
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
