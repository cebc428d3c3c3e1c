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
    with pytest.raises(RequestError, match="at least one client address"):
        glusterfs.wanted_options(None, [])
    with pytest.raises(RequestError, match="volume option 'x y' is not valid"):
        glusterfs.wanted_options({"x y": 1}, ["10.0.0.5"])


def test_auth_allow_lists_every_host_address_never_the_job_pool():
    networks = dmpi.settings.host_networks("10.251.1.0/24", "10.251.1.128/25")
    found = glusterfs.client_addresses(networks)
    assert found == [f"10.251.1.{n}" for n in range(1, 127)]
    assert glusterfs.client_addresses(networks, ["10.0.0.*"]) == ["10.0.0.*"]
    wide = dmpi.settings.host_networks("10.0.0.0/16", "10.0.255.0/24")
    with pytest.raises(RequestError, match="list the nodes' and the hub's addresses"):
        glusterfs.client_addresses(wide)


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
