"""Reading GlusterFS 10.3's answers (``--xml``, captured from a real volume in gluster/)
and checking arguments before gluster runs (``dmpi.storage.glusterfs``). The volume
made, set and quota'd for real: tests/integration (the test cluster's storage host)."""

import pathlib
import xml.etree.ElementTree as ElementTree

import dmpi.settings
import pytest
from dmpi.errors import RequestError
from dmpi.storage import glusterfs

ANSWERS = pathlib.Path(__file__).parent / "gluster"


def answer(name):
    return ElementTree.fromstring((ANSWERS / f"{name}.xml").read_text())


def test_a_volumes_facts_its_bricks_options_and_state():
    found = glusterfs.parse_volume(answer("info_started"))
    assert found["name"] == "vol1" and found["started"] is True
    assert found["bricks"] == ["172.17.0.2:/export/brick"]
    assert found["options"]["features.quota"] == "on"
    assert found["options"]["client.bind-insecure"] == "off"
    assert glusterfs.parse_volume(answer("info_missing")) is None


def test_quota_figures_join_the_size_and_the_file_limits_by_path():
    found = glusterfs.parse_quota(answer("quota_list"), answer("quota_objects"))
    assert found == {
        "/users/alice": {"bytes_used": 5242880, "bytes_limit": 20971520,
                         "files_used": 4, "files_limit": 100},
        # no file limit: gluster does not count its files
        "/users/bob": {"bytes_used": 0, "bytes_limit": 1073741824,
                       "files_used": None, "files_limit": 0},
    }
    assert glusterfs.parse_quota(None, None) == {}


def test_every_required_option_is_wanted_and_the_site_adds_its_own():
    wanted = glusterfs.wanted_options({"performance.cache-size": "256MB"},
                                      ["10.0.0.5", "10.0.0.11"])
    assert wanted["auth.allow"] == "10.0.0.5,10.0.0.11"
    assert wanted["server.allow-insecure"] == "off" == wanted["client.bind-insecure"]
    assert wanted["features.hard-timeout"] == "0" == wanted["features.soft-timeout"]
    assert wanted["performance.cache-size"] == "256MB"
    assert wanted["performance.flush-behind"] == "off"
    with pytest.raises(RequestError, match="volume option performance.flush-behind is "
                                           "DockerMPI's own"):
        glusterfs.wanted_options({"performance.flush-behind": "on"}, ["10.0.0.5"])
    with pytest.raises(RequestError, match="at least one client address"):
        glusterfs.wanted_options(None, [])
    with pytest.raises(RequestError, match="volume option 'x y' is not valid"):
        glusterfs.wanted_options({"x y": 1}, ["10.0.0.5"])


def test_auth_allow_matches_every_host_address_never_the_job_pool():
    networks = dmpi.settings.host_networks("10.251.1.0/24", "10.251.1.128/25")
    assert glusterfs.client_addresses(networks) == [f"10.251.1.{n}" for n in range(128)]
    assert glusterfs.client_addresses(networks, ["10.0.0.*"]) == ["10.0.0.*"]
    # whole octets as patterns: a /16 without its last /24 is 255 of them
    networks = dmpi.settings.host_networks("10.0.0.0/16", "10.0.255.0/24")
    found = glusterfs.address_patterns(networks)
    assert found == [f"10.0.{n}.*" for n in range(255)]
    assert glusterfs.address_patterns(["10.0.0.0/8", "172.16.0.0/12"]) == \
        ["10.*"] + [f"172.{n}.*" for n in range(16, 32)]
    # a /16 without a /25: 255 patterns and 128 addresses, past what glusterd saves
    wide = dmpi.settings.host_networks("10.0.0.0/16", "10.0.255.128/25")
    with pytest.raises(RequestError, match="list the nodes' and the hub's addresses"):
        glusterfs.address_patterns(wide)


def test_no_option_value_longer_than_glusterd_saves():
    with pytest.raises(RequestError, match="volume option auth.allow has 3135 characters"):
        glusterfs.wanted_options(None, [f"10.9.{n // 256}.{n % 256}" for n in range(300)])


@pytest.mark.parametrize("call, message", [
    (lambda: glusterfs.set_quota("vol;rm", "/users/a", 1, 1), "volume name 'vol;rm'"),
    (lambda: glusterfs.set_quota("vol", "/users/../etc", 1, 1), "path '/users/../etc'"),
    (lambda: glusterfs.set_quota("vol", "users/a", 1, 1), "path 'users/a'"),
    (lambda: glusterfs.set_quota("vol", "/users/a", -1, 1), "size_mb must be a whole"),
    (lambda: glusterfs.set_quota("vol", "/users/a", 1, True), "files must be a whole"),
    (lambda: glusterfs.ensure_volume("vol", [], clients=["10.0.0.5"]), "at least one brick"),
    (lambda: glusterfs.ensure_volume("vol", ["host:relative"], clients=["10.0.0.5"]),
     "brick 'host:relative'"),
    (lambda: glusterfs.quota_usage("-x"), "volume name '-x'"),
    (lambda: glusterfs.set_users_share("vol", "/srv", 100), "reserve_percent must be a whole"),
    (lambda: glusterfs.set_users_share("vol", "/srv", True), "reserve_percent must be a whole"),
])
def test_bad_arguments_are_refused_before_gluster_runs(call, message, monkeypatch):
    monkeypatch.setattr(glusterfs, "GLUSTER", "/nonexistent/gluster")
    with pytest.raises(RequestError, match=message.replace("(", r"\(").replace(".", r"\.")):
        call()


FAKE_GLUSTER = """#!/bin/sh
# A gluster that says another transaction is in progress while $STATE/busy holds a
# count above 0, and notes when each command starts and ends.
echo "start $$" >> "$STATE/log"
busy=$(cat "$STATE/busy" 2>/dev/null || echo 0)
sleep 0.2
echo "end $$" >> "$STATE/log"
if [ "$busy" -gt 0 ]; then
    echo $((busy - 1)) > "$STATE/busy"
    echo '<cliOutput><opRet>-1</opRet><opErrno>30800</opErrno><opErrstr>Another \
transaction is in progress for dockermpi. Please try again after some time.</opErrstr>\
</cliOutput>'
else
    echo '<cliOutput><opRet>0</opRet><opErrno>0</opErrno><opErrstr/></cliOutput>'
fi
"""


@pytest.fixture
def fake_gluster(tmp_path, monkeypatch):
    program = tmp_path / "gluster"
    program.write_text(FAKE_GLUSTER)
    program.chmod(0o755)
    monkeypatch.setattr(glusterfs, "GLUSTER", str(program))
    monkeypatch.setattr(glusterfs, "LOCK_PATH", str(tmp_path / "lock"))
    monkeypatch.setenv("STATE", str(tmp_path))
    return tmp_path


def test_a_command_glusterd_finds_busy_runs_again_until_it_is_taken(fake_gluster):
    (fake_gluster / "busy").write_text("2")
    glusterfs.gluster("volume", "quota", "dockermpi", "limit-usage", "/users/a", "1048576")
    assert (fake_gluster / "log").read_text().count("start") == 3


def test_busy_past_the_wait_is_an_error_naming_glusters_message(fake_gluster, monkeypatch):
    monkeypatch.setattr(glusterfs, "BUSY_WAIT", 0.3)
    (fake_gluster / "busy").write_text("100")
    with pytest.raises(glusterfs.GlusterError, match="Another transaction is in progress"):
        glusterfs.gluster("volume", "quota", "dockermpi", "enable")


def test_commands_from_several_processes_never_overlap(fake_gluster):
    # As the Salt minion runs each call in a process of its own.
    import multiprocessing
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=glusterfs.gluster, args=("volume", "info"))
               for _ in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    assert [worker.exitcode for worker in workers] == [0] * 4
    lines = (fake_gluster / "log").read_text().split("\n")[:-1]
    assert len(lines) == 8
    # each start is followed by the end of the same command
    assert all(lines[i].split()[1] == lines[i + 1].split()[1] and
               lines[i].startswith("start") and lines[i + 1].startswith("end")
               for i in range(0, 8, 2)), lines
