"""
Render the hub host's states (grain role mpi-hub -> dockermpi.hub) with ``salt-call
--local``, as tests/functional/test_render.py does for the nodes, and check what a hub
would be given: JupyterHub from pinned packages in its own virtualenv, settings from
pillar, the notebook image by digest, Docker on its unix socket only, no job network,
notebooks kept from the cluster network, and clear failures when the hub's own settings
are missing.
"""

import json
import runpy
import sys
import types

import pytest

from tests.functional.test_render import REPO, _args, _dry_run, _highstate, _minion

NOTEBOOK = "registry.test:5000/dockermpi/notebook@sha256:" + "ab" * 32
MPI = "registry.test:5000/dockermpi/mpi@sha256:" + "cd" * 32
HUB_PILLAR = {
    "cluster_network": "172.30.0.0/16",
    "job_network": {"addresses": "172.30.200.0/24"},
    "storage": {"type": "preshared", "path": "/srv/shared"},
    "images": {"notebook": NOTEBOOK, "mpi": MPI},
    "hub": {
        "hub_api_url": "http://172.30.0.5:8081/hub/api",
        "api_url": "http://172.30.0.5:8000/services/dockermpi",
        "api_service_url": "https://172.30.0.2:8001",
        "admin_token": "t" * 32,
        "dummy": {"password": "secret", "allowed_users": ["alice", "bob"]},
        "pip": {"find_links": "/var/cache/wheels", "no_index": True},
        "limits": {"memory_mb": 1024, "pids": 256, "cpus": 0.5},
        "panel_refresh_seconds": 20,
    },
}
GITHUB = {"authenticator": "github", "github": {
    "client_id": "abc", "client_secret": "s3cret",
    "callback_url": "https://hub.example.org/hub/oauth_callback",
    "allowed_organizations": ["lab"]}}


def _pillar(**hub):
    return dict(HUB_PILLAR, hub={**HUB_PILLAR["hub"], **hub})


@pytest.fixture(scope="module")
def hub_high(tmp_path_factory):
    return _highstate(_minion(tmp_path_factory.mktemp("hub"), ["mpi-hub"], HUB_PILLAR))


def test_hub_gets_docker_storage_and_its_own_states_only(hub_high):
    sls = {body["__sls__"] for body in hub_high.values()}
    assert {"dockermpi.config", "dockermpi.docker.service", "dockermpi.storage.preshared",
            "dockermpi.hub.image", "dockermpi.hub.venv", "dockermpi.hub.service"} <= sls
    # no job network, node engine or MPI firewall: the hub runs no job
    assert not [s for s in sls if s.startswith(("dockermpi.node", "dockermpi.firewall"))]
    assert "mpi-docker-network-present" not in hub_high
    assert "hosts" not in _args(hub_high, "mpi-docker-config-daemon-json",
                                "file.serialize")["dataset"]


def test_every_hub_state_requires_both_checks_and_is_named_by_component(hub_high):
    hub_ids = [sid for sid, body in hub_high.items() if body["__sls__"].startswith("dockermpi.hub")]
    assert len(hub_ids) >= 10
    for sid in hub_ids:
        assert sid.startswith("mpi-hub-"), sid
        body = hub_high[sid]
        args = [a for key, value in body.items() if not key.startswith("__")
                for a in value if isinstance(a, dict)]
        requires = [r for a in args for r in a.get("require", [])]
        assert {"sls": "dockermpi.config"} in requires, sid
        if sid != "mpi-hub-settings-complete":
            assert {"sls": "dockermpi.hub.settings"} in requires, sid


def test_only_the_notebook_image_pulled_by_digest(hub_high):
    image = _args(hub_high, "mpi-hub-image-present-notebook", "mpi_image.present")
    assert (image["name"], image["reference"]) == ("notebook", NOTEBOOK)
    assert [sid for sid in hub_high if sid.startswith("mpi-hub-image-present")] == [
        "mpi-hub-image-present-notebook"]
    assert not [sid for sid in hub_high if sid.startswith("mpi-images-present-")]


def test_every_image_offered_for_notebooks_is_pulled_and_given_to_the_spawner(
        tmp_path, monkeypatch):
    (tmp_path / "minion").mkdir()
    high = _highstate(_minion(tmp_path / "minion", ["mpi-hub"],
                              _pillar(images=["notebook", "mpi"])))
    pulled = {_args(high, sid, "mpi_image.present")["reference"]
              for sid in high if sid.startswith("mpi-hub-image-present-")}
    assert pulled == {NOTEBOOK, MPI}
    settings = _args(high, "mpi-hub-config-settings-json", "file.serialize")["dataset"]
    assert settings["images"] == {"notebook": NOTEBOOK, "mpi": MPI}
    spawner = _hub_config(tmp_path, monkeypatch, settings)["DockerMPISpawner"]
    assert spawner.allowed_images == {"notebook": NOTEBOOK, "mpi": MPI}
    assert (spawner.image, spawner.image_name) == (NOTEBOOK, "notebook")


def test_an_offered_image_that_is_not_approved_fails_before_anything_changes(tmp_path):
    code, ret = _dry_run(_minion(tmp_path, ["mpi-hub"], _pillar(images=["notebook", "x"])))
    assert code != 0
    check = {r["__id__"]: r for r in ret.values()}["mpi-hub-settings-complete"]
    assert check["comment"].splitlines()[1:] == [
        "mpi:hub:images names x, which is not an approved image (mpi:images has: mpi, "
        "notebook)"]


def test_pinned_packages_from_the_wheelhouse_in_the_virtualenv(hub_high):
    venv = _args(hub_high, "mpi-hub-venv-virtualenv-managed", "virtualenv.managed")
    assert venv["name"] == "/opt/dockermpi/hub"
    pip = _args(hub_high, "mpi-hub-venv-pip-installed", "pip.installed")
    assert pip["pkgs"] == ["jupyterhub==5.5.4", "dockerspawner==14.0.0"]
    assert (pip["bin_env"], pip["find_links"], pip["no_index"]) == (
        "/opt/dockermpi/hub", "/var/cache/wheels", True)
    assert "index_url" not in pip
    assert _args(hub_high, "mpi-hub-proxy-package-installed",
                 "pkg.installed")["name"] == "node-configurable-http-proxy"


def test_settings_json_from_pillar_is_private(hub_high):
    settings = _args(hub_high, "mpi-hub-config-settings-json", "file.serialize")
    assert (settings["name"], settings["mode"]) == ("/etc/dockermpi/hub/settings.json", "0600")
    data = settings["dataset"]
    assert (data["image"], data["image_reference"]) == ("notebook", NOTEBOOK)
    assert data["images"] == {"notebook": NOTEBOOK}
    assert data["users_dir"] == "/srv/shared/users"
    assert data["hub_api_url"] == "http://172.30.0.5:8081/hub/api"
    assert data["api_url"] == "http://172.30.0.5:8000/services/dockermpi"
    assert data["api_service_url"] == "https://172.30.0.2:8001"
    assert "api_ca" not in data
    assert data["admin_token"] == "t" * 32
    assert data["authenticator"] == "dummy"
    assert data["dummy"] == {"password": "secret", "allowed_users": ["alice", "bob"]}
    assert data["limits"] == {"memory_mb": 1024, "pids": 256, "cpus": 0.5,
                              "tmp_size_mb": 1024}  # the default
    assert data["panel_refresh_seconds"] == 20
    assert data["state_dir"] == "/var/lib/dockermpi-hub"
    for sid in ("mpi-hub-config-jupyterhub-config", "mpi-hub-config-spawner-module"):
        assert _args(hub_high, sid, "file.managed")["source"].startswith(
            "salt://dockermpi/hub/files/")


def test_service_runs_jupyterhub_and_restarts_on_every_change(hub_high):
    unit = _args(hub_high, "mpi-hub-service-unit-file", "file.managed")["contents"]
    assert "ExecStart=/opt/dockermpi/hub/bin/jupyterhub -f /etc/dockermpi/hub/jupyterhub_config.py" in unit
    assert "WorkingDirectory=/var/lib/dockermpi-hub" in unit
    assert "Environment=PYTHONPATH=/etc/dockermpi/hub" in unit
    service = _args(hub_high, "mpi-hub-service-running", "service.running")
    assert (service["name"], service["enable"]) == ("dockermpi-hub", True)
    assert service["watch"] == [
        {"file": "mpi-hub-service-unit-file"},
        {"file": "mpi-hub-config-settings-json"},
        {"file": "mpi-hub-config-jupyterhub-config"},
        {"file": "mpi-hub-config-spawner-module"},
        # a new certificate or CA (same paths) is loaded by a restart, the proxy's too
        {"file": "mpi-hub-config-ssl-cert"},
        {"file": "mpi-hub-config-ssl-key"},
        {"file": "mpi-hub-config-hub-ca-file"},
        {"file": "mpi-hub-config-api-ca-file"},
        {"pip": "mpi-hub-venv-pip-installed"},
    ]
    assert {"sls": "dockermpi.hub.image"} in service["require"]
    # no notebook starts before the firewall keeps notebooks from the cluster network
    assert {"iptables": "mpi-hub-firewall-notebooks-reach-only-the-hub"} in service["require"]
    assert {"iptables": "mpi-hub-firewall-notebooks-reach-the-hub-host-on-its-api-ports-only"} \
        in service["require"]
    assert {"iptables": "mpi-hub-firewall-notebooks-reach-the-hub-host-over-tcp-only"} in \
        service["require"]
    state_dir = _args(hub_high, "mpi-hub-service-state-directory", "file.directory")
    assert (state_dir["name"], state_dir["mode"]) == ("/var/lib/dockermpi-hub", "0700")


def test_github_login_adds_the_pinned_oauthenticator(tmp_path):
    high = _highstate(_minion(tmp_path, ["mpi-hub"], _pillar(**GITHUB)))
    pip = _args(high, "mpi-hub-venv-pip-installed", "pip.installed")
    assert pip["pkgs"] == ["jupyterhub==5.5.4", "dockerspawner==14.0.0",
                           "oauthenticator==17.4.0"]
    data = _args(high, "mpi-hub-config-settings-json", "file.serialize")["dataset"]
    assert data["authenticator"] == "github"
    assert data["github"]["callback_url"] == "https://hub.example.org/hub/oauth_callback"
    assert data["github"]["allowed_organizations"] == ["lab"]


class _Config:
    """JupyterHub's ``get_config()`` as far as jupyterhub_config.py uses it: a section
    per class name, each an object taking attributes."""

    def __init__(self):
        self.sections = {}

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self.sections.setdefault(name, types.SimpleNamespace())


def _hub_config(tmp_path, monkeypatch, settings):
    """What jupyterhub_config.py configures, given ``settings`` as its settings.json."""
    path = tmp_path / "settings.json"
    path.write_text(json.dumps(settings))
    monkeypatch.setenv("DOCKERMPI_HUB_SETTINGS", str(path))
    spawner = types.ModuleType("dockermpi_spawner")
    spawner.DockerMPISpawner = type("DockerMPISpawner", (), {})
    monkeypatch.setitem(sys.modules, "dockermpi_spawner", spawner)
    config = _Config()
    runpy.run_path(str(REPO / "salt/dockermpi/hub/files/jupyterhub_config.py"),
                   init_globals={"get_config": lambda: config})
    return config.sections


SCOPE = "access:services!service=dockermpi"


def test_the_hub_registers_the_api_and_gives_users_servers_its_scope(
        hub_high, tmp_path, monkeypatch):
    settings = _args(hub_high, "mpi-hub-config-settings-json", "file.serialize")["dataset"]
    hub = _hub_config(tmp_path, monkeypatch, settings)["JupyterHub"]
    assert hub.services == [
        {"name": "dockermpi", "url": "https://172.30.0.2:8001", "display": False},
        {"name": "dockermpi-admin", "api_token": "t" * 32}]
    roles = {role["name"]: role for role in hub.load_roles}
    assert set(roles) == {"user", "server", "dockermpi-admin"}
    # a user's own tokens and their server's token may call the API...
    assert roles["user"]["scopes"] == ["self", SCOPE]
    assert roles["server"]["scopes"] == ["users:activity!user", "access:servers!server", SCOPE]
    # ...the admin service manages the hub, and is no caller of the API
    assert SCOPE not in roles["dockermpi-admin"]["scopes"]
    assert roles["dockermpi-admin"]["services"] == ["dockermpi-admin"]


def test_without_an_admin_token_the_api_is_the_only_service(hub_high, tmp_path, monkeypatch):
    settings = _args(hub_high, "mpi-hub-config-settings-json", "file.serialize")["dataset"]
    hub = _hub_config(tmp_path, monkeypatch, dict(settings, admin_token=""))["JupyterHub"]
    assert [s["name"] for s in hub.services] == ["dockermpi"]
    assert [r["name"] for r in hub.load_roles] == ["user", "server"]


def test_notebooks_and_the_spawner_call_the_api_on_the_master_directly(
        hub_high, tmp_path, monkeypatch):
    settings = _args(hub_high, "mpi-hub-config-settings-json", "file.serialize")["dataset"]
    spawner = _hub_config(tmp_path, monkeypatch, settings)["DockerMPISpawner"]
    assert spawner.api_url == "https://172.30.0.2:8001/services/dockermpi"
    assert spawner.api_service_url == "https://172.30.0.2:8001"
    # no CA of the site's: notebooks and the spawner trust the system's CAs
    assert (spawner.api_ca, spawner.api_service_ca) == ("", "")


def test_an_api_on_the_hub_host_itself_is_called_through_the_proxy(tmp_path, monkeypatch):
    """A notebook's loopback is its own: an API on the hub host's loopback is reached the
    way browsers reach it, and the firewall opens nothing for it."""
    (tmp_path / "minion").mkdir()
    high = _highstate(_minion(tmp_path / "minion", ["mpi-hub"],
                              _pillar(api_service_url="http://127.0.0.1:8001")))
    settings = _args(high, "mpi-hub-config-settings-json", "file.serialize")["dataset"]
    spawner = _hub_config(tmp_path, monkeypatch, settings)["DockerMPISpawner"]
    assert spawner.api_url == "http://172.30.0.5:8000/services/dockermpi"
    assert "mpi-hub-firewall-notebooks-reach-the-api" not in high


PEM_CERT = "-----BEGIN CERTIFICATE-----\nMIIBhub\n-----END CERTIFICATE-----\n"
PEM_KEY = "-----BEGIN PRIVATE KEY-----\nMIIEhub\n-----END PRIVATE KEY-----\n"
PEM_CA = "-----BEGIN CERTIFICATE-----\nMIIBca\n-----END CERTIFICATE-----\n"
TLS_HUB = dict(bind_url="https://0.0.0.0:443", subdomain_host="https://hub.example.org",
               api_url="https://dockermpi--service.hub.example.org/services/dockermpi",
               tls={"cert": PEM_CERT, "key": PEM_KEY, "ca": PEM_CA})


def test_the_proxy_serves_users_over_tls_and_checks_the_apis_certificate(
        tmp_path, monkeypatch):
    pillar = dict(_pillar(**TLS_HUB), api={"tls": {"ca": PEM_CA}})
    (tmp_path / "minion").mkdir()
    high = _highstate(_minion(tmp_path / "minion", ["mpi-hub"], pillar))
    files = {sid: _args(high, sid, "file.managed") for sid in (
        "mpi-hub-config-ssl-cert", "mpi-hub-config-ssl-key", "mpi-hub-config-hub-ca-file",
        "mpi-hub-config-api-ca-file")}
    assert [(f["name"], f["contents"], f["mode"]) for f in files.values()] == [
        ("/etc/dockermpi/hub/tls.crt", PEM_CERT, "0644"),
        ("/etc/dockermpi/hub/tls.key", PEM_KEY, "0600"),
        ("/etc/dockermpi/hub/hub-ca.pem", PEM_CA, "0644"),
        ("/etc/dockermpi/hub/api-ca.pem", PEM_CA, "0644")]
    assert all(f["show_changes"] is False for f in files.values())
    settings = _args(high, "mpi-hub-config-settings-json", "file.serialize")["dataset"]
    config = _hub_config(tmp_path, monkeypatch, settings)
    assert (config["JupyterHub"].ssl_cert, config["JupyterHub"].ssl_key) == (
        "/etc/dockermpi/hub/tls.crt", "/etc/dockermpi/hub/tls.key")
    assert config["ConfigurableHTTPProxy"].command == [
        "/usr/bin/configurable-http-proxy", "--client-ssl-ca", "/etc/dockermpi/hub/api-ca.pem"]
    spawner = config["DockerMPISpawner"]
    # notebooks and the spawner call the API itself: its CA is the one they check
    assert (spawner.api_ca, spawner.api_service_ca) == (
        "/etc/dockermpi/hub/api-ca.pem", "/etc/dockermpi/hub/api-ca.pem")


def test_without_tls_the_proxy_is_plain_and_leaves_no_key_behind(hub_high, tmp_path,
                                                                 monkeypatch):
    for sid in ("mpi-hub-config-ssl-cert", "mpi-hub-config-ssl-key"):
        assert _args(hub_high, sid, "file.absent")
    settings = _args(hub_high, "mpi-hub-config-settings-json", "file.serialize")["dataset"]
    config = _hub_config(tmp_path, monkeypatch, settings)
    assert not hasattr(config["JupyterHub"], "ssl_cert")
    assert config["ConfigurableHTTPProxy"].command == ["/usr/bin/configurable-http-proxy"]


@pytest.mark.parametrize("hub, problem", [
    (dict(TLS_HUB, tls={"cert": "", "key": ""}),
     "mpi:hub:tls:cert and mpi:hub:tls:key are required on the hub host: mpi:hub:bind_url "
     "https://0.0.0.0:443 is https (a certificate for the hub's name and, with "
     "subdomain_host, its wildcard *.name)"),
    ({"tls": {"cert": PEM_CERT, "key": PEM_KEY}},
     "mpi:hub:bind_url must be https:// when mpi:hub:tls has a certificate or key, got "
     "http://0.0.0.0:8000"),
])
def test_tls_half_set_fails_before_anything_changes(tmp_path, hub, problem):
    code, ret = _dry_run(_minion(tmp_path, ["mpi-hub"], _pillar(**hub)))
    assert code != 0
    check = {r["__id__"]: r for r in ret.values()}["mpi-hub-settings-complete"]
    assert check["result"] is False
    assert check["comment"].splitlines()[1:] == [problem]


def test_without_subdomain_host_every_server_shares_the_hubs_origin(
        hub_high, tmp_path, monkeypatch):
    settings = _args(hub_high, "mpi-hub-config-settings-json", "file.serialize")["dataset"]
    config = _hub_config(tmp_path, monkeypatch, settings)
    assert not hasattr(config["JupyterHub"], "subdomain_host")
    assert config["DockerMPISpawner"].extra_host_config["extra_hosts"] == {}


def test_subdomain_host_gives_each_server_and_the_api_an_origin_of_its_own(
        tmp_path, monkeypatch):
    api = "https://dockermpi--service.hub.example.org/services/dockermpi"
    (tmp_path / "minion").mkdir()
    high = _highstate(_minion(tmp_path / "minion", ["mpi-hub"], _pillar(
        subdomain_host="https://hub.example.org", api_url=api,
        notebook_hosts={"dockermpi--service.hub.example.org": "172.30.0.5"})))
    settings = _args(high, "mpi-hub-config-settings-json", "file.serialize")["dataset"]
    config = _hub_config(tmp_path, monkeypatch, settings)
    assert config["JupyterHub"].subdomain_host == "https://hub.example.org"
    assert settings["api_url"] == api  # what browsers call; notebooks call the master
    assert config["DockerMPISpawner"].extra_host_config["extra_hosts"] == {
        "dockermpi--service.hub.example.org": "172.30.0.5"}


def test_user_servers_load_nothing_the_user_wrote(hub_high, tmp_path, monkeypatch):
    settings = _args(hub_high, "mpi-hub-config-settings-json", "file.serialize")["dataset"]
    spawner = _hub_config(tmp_path, monkeypatch, settings)["DockerMPISpawner"]
    assert spawner.disable_user_config is True  # no ~/.jupyter, no user data dir
    assert spawner.cmd == ["python3", "-s", "-m", "jupyterhub.singleuser"]  # no user site


def test_notebooks_reach_no_other_host_of_the_cluster_network(hub_high):
    rule = _args(hub_high, "mpi-hub-firewall-notebooks-reach-only-the-hub", "iptables.insert")
    assert (rule["table"], rule["chain"], rule["position"]) == ("filter", "DOCKER-USER", 1)
    assert (rule["in-interface"], rule["destination"]) == ("docker0", "172.30.0.0/16")
    assert (rule["match"], rule["ctstate"], rule["jump"]) == ("conntrack", "NEW", "REJECT")
    assert rule["save"] is False


def test_notebooks_reach_the_api_and_nothing_else_of_the_master(hub_high):
    rule = _args(hub_high, "mpi-hub-firewall-notebooks-reach-the-api", "iptables.insert")
    assert (rule["table"], rule["chain"], rule["position"]) == ("filter", "DOCKER-USER", 1)
    assert (rule["in-interface"], rule["destination"]) == ("docker0", "172.30.0.2/32")
    assert (rule["proto"], rule["dport"]) == ("tcp", 8001)
    assert (rule["match"], rule["ctstate"], rule["jump"]) == ("conntrack", "NEW", "RETURN")
    # inserted at the top after the refusal of the rest, so it comes first
    assert {"iptables": "mpi-hub-firewall-notebooks-reach-only-the-hub"} in rule["require"]


def test_notebooks_reach_the_hub_hosts_api_ports_and_no_other_port_of_it(hub_high):
    """The hub host is reached through INPUT on any of its addresses: a storage server or
    anything else it serves must not answer notebooks. Two refusals, so no order between
    rules matters (a rule put back alone lands at the top)."""
    tcp = _args(hub_high, "mpi-hub-firewall-notebooks-reach-the-hub-host-on-its-api-ports-only",
                "iptables.insert")
    other = _args(hub_high, "mpi-hub-firewall-notebooks-reach-the-hub-host-over-tcp-only",
                  "iptables.insert")
    for rule in (tcp, other):
        assert (rule["table"], rule["chain"], rule["position"]) == ("filter", "INPUT", 1)
        assert rule["in-interface"] == "docker0" and "destination" not in rule
        assert (rule["ctstate"], rule["jump"], rule["save"]) == ("NEW", "REJECT", False)
    assert (tcp["proto"], tcp["match"], tcp["dports"]) == ("tcp", ["multiport", "conntrack"],
                                                           "! 8081,8001")
    assert (other["proto"], other["match"]) == ("! tcp", "conntrack")


def test_the_notebooks_rules_come_back_with_every_start_of_docker(hub_high):
    """A boot starts with an empty DOCKER-USER chain: a unit that Docker's start pulls in
    puts the same rules back, once each, the API's above the refusal."""
    unit = _args(hub_high, "mpi-hub-firewall-boot-unit-file", "file.managed")
    lines = unit["contents"].splitlines()
    refuse = "-i docker0 -d 172.30.0.0/16 -m conntrack --ctstate NEW -j REJECT"
    api = "-i docker0 -d 172.30.0.2/32 -p tcp --dport 8001 -m conntrack --ctstate NEW -j RETURN"
    refuse_tcp = ("-i docker0 -p tcp -m multiport ! --dports 8081,8001 -m conntrack "
                  "--ctstate NEW -j REJECT")
    refuse_other = "! -p tcp -i docker0 -m conntrack --ctstate NEW -j REJECT"
    starts = [line for line in lines if line.startswith("ExecStart=")]
    assert starts == [f"ExecStart=-/usr/sbin/iptables -w -D DOCKER-USER {refuse}",
                      f"ExecStart=/usr/sbin/iptables -w -I DOCKER-USER 1 {refuse}",
                      f"ExecStart=-/usr/sbin/iptables -w -D INPUT {refuse_tcp}",
                      f"ExecStart=/usr/sbin/iptables -w -I INPUT 1 {refuse_tcp}",
                      f"ExecStart=-/usr/sbin/iptables -w -D INPUT {refuse_other}",
                      f"ExecStart=/usr/sbin/iptables -w -I INPUT 1 {refuse_other}",
                      f"ExecStart=-/usr/sbin/iptables -w -D DOCKER-USER {api}",
                      f"ExecStart=/usr/sbin/iptables -w -I DOCKER-USER 1 {api}"]
    assert {"After=docker.service", "PartOf=docker.service", "WantedBy=docker.service",
            "Before=dockermpi-hub.service"} <= set(lines)
    assert _args(hub_high, "mpi-hub-firewall-boot-unit-enabled", "service.enabled")["name"] == \
        "dockermpi-hub-firewall"


def test_nothing_of_salt_api_is_left_on_the_hub(hub_high):
    # no certificate from the Salt mine: notebooks reach the API through the hub's proxy
    assert not [sid for sid in hub_high if "apica" in sid or "certificate" in sid]
    assert "dockermpi.hub.apica" not in {body["__sls__"] for body in hub_high.values()}
    # and a hub that had salt-api's CA loses it
    assert _args(hub_high, "mpi-hub-config-salt-api-ca-absent", "file.absent")["name"] == \
        "/etc/dockermpi/api-ca.pem"


def test_missing_hub_settings_fail_before_anything_changes(tmp_path):
    pillar = _pillar(hub_api_url="", api_url="", api_service_url="", image="jupyter")
    code, ret = _dry_run(_minion(tmp_path, ["mpi-hub"], pillar))
    assert code != 0
    by_id = {r["__id__"]: r for r in ret.values()}
    check = by_id["mpi-hub-settings-complete"]
    assert check["result"] is False and check["changes"] == {}
    assert check["comment"].splitlines() == [
        "The mpi:hub settings are incomplete; the hub is not set up until they are:",
        "mpi:hub:hub_api_url is required on the hub host",
        "mpi:hub:api_url is required on the hub host",
        "mpi:hub:api_service_url is required on the hub host",
        "mpi:hub:image jupyter is not an approved image (mpi:images has: mpi, notebook)",
    ]
    hub_states = {sid: r for sid, r in by_id.items()
                  if sid.startswith("mpi-hub-") and sid != "mpi-hub-settings-complete"}
    assert hub_states
    for sid, r in hub_states.items():
        assert r["result"] is False and r["changes"] == {}, (sid, r)
        assert r["comment"].startswith("One or more requisite failed"), (sid, r)
