"""The hosts' privileged-port floor that the shared storage's trust relies on
(:mod:`dmpi.storage.hosts`), read from a file standing in for the kernel's."""

import pytest

from dmpi.errors import DockerMPIError
from dmpi.storage import hosts


def _floor(tmp_path, text):
    path = tmp_path / "ip_unprivileged_port_start"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("text", ["1024\n", "2048\n"])
def test_a_floor_of_1024_or_more_is_no_problem(tmp_path, text):
    assert hosts.port_floor_problem(_floor(tmp_path, text)) is None


@pytest.mark.parametrize("text, shown", [("0\n", "is 0"), ("80\n", "is 80"),
                                         ("1023\n", "is 1023")])
def test_a_lower_floor_is_named_with_how_to_set_it_back(tmp_path, text, shown):
    problem = hosts.port_floor_problem(_floor(tmp_path, text))
    assert problem.startswith(f"net.ipv4.ip_unprivileged_port_start {shown} on this host")
    assert "sysctl net.ipv4.ip_unprivileged_port_start=1024" in problem


@pytest.mark.parametrize("text", ["", "lots\n"])
def test_an_unreadable_floor_is_an_error_naming_the_file(tmp_path, text):
    path = _floor(tmp_path, text)
    with pytest.raises(DockerMPIError, match=f"^cannot read {path}"):
        hosts.port_floor_problem(path)
    with pytest.raises(DockerMPIError, match="^cannot read /nonexistent"):
        hosts.unprivileged_port_start("/nonexistent")


def test_this_hosts_floor_is_read():
    assert 0 <= hosts.unprivileged_port_start() <= 65536
