"""The master's API states (dockermpi.api, role mpi-master) as highstate renders them: the
``mpi_api`` engine's configuration from pillar ``mpi:api``, salt-api stopped, the master
restarted only when the configuration changes, and clear failures when the master lacks
what the engine needs (``salt-call --local``, as tests/functional/test_render.py)."""

import pytest
import yaml

from tests.functional.test_render import (
    PRESHARED_PILLAR, REPO, _args, _dry_run, _highstate, _minion)

HUB_API = "http://172.30.0.5:8081/hub/api"
#: Where the API checks tokens: the hub's API through its proxy, over TLS.
TOKEN_URL = "https://hub.test/hub/api"
PEM_CERT = "-----BEGIN CERTIFICATE-----\nMIIBapi\n-----END CERTIFICATE-----\n"
PEM_KEY = "-----BEGIN PRIVATE KEY-----\nMIIEapi\n-----END PRIVATE KEY-----\n"
DEFAULT_API = yaml.safe_load((REPO / "salt/dockermpi/defaults.yaml").read_text())["mpi"]["api"]
CONFIG = "/etc/salt/master.d/dockermpi-api.conf"
TLS_DIR = "/etc/dockermpi/api-tls"


def _pillar(hub_api_url=HUB_API, hub_tls=None, **api):
    api = {"hub_api_url": TOKEN_URL, "tls": {"cert": PEM_CERT, "key": PEM_KEY}, **api}
    if "hub_api_url_of_api" in api:
        api["hub_api_url"] = api.pop("hub_api_url_of_api")
    hub = {"hub_api_url": hub_api_url, **({"tls": hub_tls} if hub_tls else {})}
    return dict(PRESHARED_PILLAR, hub=hub, api=api)


def _engine(high):
    """The one engine the API configuration file starts, and its settings."""
    config = _args(high, "mpi-api-master-config", "file.serialize")
    assert (config["name"], config["serializer"], config["mode"]) == (CONFIG, "yaml", "0600")
    (engine,) = config["dataset"]["engines"]
    ((name, settings),) = engine.items()
    assert name == "mpi_api"
    return config["dataset"], settings


@pytest.fixture(scope="module")
def api_high(tmp_path_factory):
    return _highstate(_minion(tmp_path_factory.mktemp("api"), ["mpi-master"], _pillar()))


def test_the_engine_gets_the_defaults_and_only_the_hub_host_as_client(api_high):
    dataset, settings = _engine(api_high)
    assert list(dataset) == ["engines"]  # nothing of salt-api: no rest_cherrypy, eauth
    assert settings == {
        "hub_api_url": TOKEN_URL,
        "tls_cert": f"{TLS_DIR}/tls.crt",
        "tls_key": f"{TLS_DIR}/tls.key",
        "hub_ca": None,  # the hub's certificate is from a CA the system trusts
        "host": "0.0.0.0",
        "port": 8001,
        "allowed_clients": ["172.30.0.5"],
        "token_cache_seconds": 30,
        "limits": DEFAULT_API["limits"],
    }
    assert DEFAULT_API["limits"] == {"requests_per_second": 20, "burst": 40, "streams": 4,
                                     "body_bytes": 1048576, "log_bytes": 1048576,
                                     "wait_seconds": 60, "page_jobs": 1000}


def test_the_engine_settings_come_from_pillar(tmp_path):
    pillar = _pillar(host="10.0.0.2", port=9443, token_cache_seconds=0,
                     allowed_clients=["10.0.0.5", "10.0.1.0/24"],
                     limits={"streams": 1, "wait_seconds": 5})
    _, settings = _engine(_highstate(_minion(tmp_path, ["mpi-master"], pillar)))
    assert settings == {
        "hub_api_url": TOKEN_URL,
        "tls_cert": f"{TLS_DIR}/tls.crt",
        "tls_key": f"{TLS_DIR}/tls.key",
        "hub_ca": None,
        "host": "10.0.0.2",
        "port": 9443,
        "allowed_clients": ["10.0.0.5", "10.0.1.0/24"],
        "token_cache_seconds": 0,
        # a limit left out keeps its default
        "limits": dict(DEFAULT_API["limits"], streams=1, wait_seconds=5),
    }


def test_a_hub_reached_over_ipv6_is_the_client_by_its_address(tmp_path):
    pillar = _pillar(hub_api_url="https://[fd00:30::5]:8081/hub/api")
    _, settings = _engine(_highstate(_minion(tmp_path, ["mpi-master"], pillar)))
    assert settings["allowed_clients"] == ["fd00:30::5"]


def test_salt_api_is_stopped_and_nothing_of_it_is_set_up(api_high):
    stopped = _args(api_high, "mpi-api-salt-api-stopped", "service.dead")
    assert (stopped["name"], stopped["enable"]) == ("salt-api", False)
    functions = {f"{mod}.{fun}" for sid, body in api_high.items()
                 for mod, items in body.items() if not mod.startswith("__")
                 for fun in items if isinstance(fun, str)}
    assert functions == {"mpi_config.valid", "test.configurable_test_state",
                         "file.serialize", "service.dead", "module.run", "file.absent",
                         "file.directory", "file.managed"}
    # What salt-api was once given (TLS key and certificate, the eauth module) goes too.
    gone = sorted(_args(api_high, sid, "file.absent")["name"] for sid in api_high
                  if sid.startswith("mpi-api-salt-api-leftover-"))
    assert gone == ["/etc/dockermpi/api", "/var/lib/dockermpi/salt-auth"]
    assert not [sid for sid in api_high if "running" in sid]


def test_the_master_restarts_only_when_its_api_configuration_changes(api_high):
    restart = _args(api_high, "mpi-api-master-restart", "module.run")
    assert restart["onchanges"] == [{"file": "mpi-api-master-config"}]
    # later, by a transient timer, so the highstate still returns to the master; no shell
    assert restart["cmd.run_all"] == [
        {"cmd": ["systemd-run", "--on-active=2", "--timer-property=AccuracySec=100ms",
                 "systemctl", "restart", "salt-master"]},
        {"python_shell": False}]


def test_every_api_state_requires_the_settings_check(api_high):
    api_ids = [sid for sid, body in api_high.items() if body["__sls__"] == "dockermpi.api"]
    assert len(api_ids) == 10
    for sid in api_ids:
        assert sid.startswith("mpi-api-"), sid
        args = [a for key, value in api_high[sid].items() if not key.startswith("__")
                for a in value if isinstance(a, dict)]
        requires = [r for a in args for r in a.get("require", [])]
        assert {"sls": "dockermpi.config"} in requires, sid
        if sid in ("mpi-api-master-config", "mpi-api-master-restart"):
            assert {"test": "mpi-api-settings-complete"} in requires, sid


def test_complete_settings_pass_their_check(api_high):
    check = _args(api_high, "mpi-api-settings-complete", "test.configurable_test_state")
    assert (check["result"], check["changes"]) == (True, False)
    assert check["comment"] == "The mpi:api settings are complete"


def _refused(tmp_path, pillar):
    """The settings check's return, after checking that the engine's configuration (and
    so the master's restart) is not touched while it fails; salt-api is still stopped."""
    code, ret = _dry_run(_minion(tmp_path, ["mpi-master"], pillar))
    assert code != 0
    by_id = {r["__id__"]: r for r in ret.values()}
    for sid in ("mpi-api-master-config", "mpi-api-master-restart"):
        assert by_id[sid]["result"] is False and by_id[sid]["changes"] == {}, by_id[sid]
        assert by_id[sid]["comment"].startswith("One or more requisite failed"), by_id[sid]
    assert by_id["mpi-api-salt-api-stopped"]["result"] is not False
    check = by_id["mpi-api-settings-complete"]
    assert check["result"] is False and check["changes"] == {}
    return check["comment"].splitlines()


def test_without_the_hub_api_url_the_master_gets_no_api(tmp_path):
    assert _refused(tmp_path, _pillar(hub_api_url="", hub_api_url_of_api="")) == [
        "The mpi:api settings are incomplete; the API is not set up until they are:",
        "mpi:api:hub_api_url is required on the master: the API asks the hub there whose "
        "token a caller holds",
        "mpi:api:allowed_clients must list the hub host's addresses: mpi:hub:hub_api_url, "
        "which would name the hub host, is ''",
    ]


def test_the_api_serves_tls_with_the_key_only_the_master_is_given(api_high):
    directory = _args(api_high, "mpi-api-tls-directory", "file.directory")
    assert (directory["name"], directory["mode"]) == (TLS_DIR, "0700")
    cert = _args(api_high, "mpi-api-tls-cert", "file.managed")
    key = _args(api_high, "mpi-api-tls-key", "file.managed")
    assert (cert["name"], cert["contents"], cert["mode"]) == (
        f"{TLS_DIR}/tls.crt", PEM_CERT, "0644")
    assert (key["name"], key["contents"], key["mode"], key["show_changes"]) == (
        f"{TLS_DIR}/tls.key", PEM_KEY, "0600", False)
    # no CA of the hub's: none is left behind; a new certificate restarts the master
    assert _args(api_high, "mpi-api-hub-ca", "file.absent")["name"] == f"{TLS_DIR}/hub-ca.pem"
    assert {"module": "mpi-api-master-restart"} in key["onchanges_in"]


def test_the_api_checks_the_hub_with_the_sites_ca(tmp_path):
    high = _highstate(_minion(tmp_path, ["mpi-master"], _pillar(hub_tls={"ca": PEM_CERT})))
    ca = _args(high, "mpi-api-hub-ca", "file.managed")
    assert (ca["name"], ca["contents"]) == (f"{TLS_DIR}/hub-ca.pem", PEM_CERT)
    assert _engine(high)[1]["hub_ca"] == f"{TLS_DIR}/hub-ca.pem"


def test_tokens_to_or_from_the_api_are_never_sent_in_the_clear(tmp_path):
    # with mpi:api:hub_api_url '', the API would ask the hub's own API (http, for notebooks)
    pillar = _pillar(hub_api_url_of_api="", tls={})
    assert _refused(tmp_path, pillar) == [
        "The mpi:api settings are incomplete; the API is not set up until they are:",
        "mpi:api:hub_api_url must be the hub API's https URL (its proxy's, e.g. "
        "https://hub.example.org/hub/api): the API sends users' tokens there, and "
        "http://172.30.0.5:8081/hub/api is plain http to another host",
        "mpi:api:tls:cert and mpi:api:tls:key are required on the master: the hub's proxy "
        "sends users' tokens to the API on 0.0.0.0 (a certificate for the host in "
        "mpi:hub:api_service_url)",
    ]


def test_an_api_and_hub_on_loopback_need_no_certificate(tmp_path):
    pillar = _pillar(hub_api_url="http://127.0.0.1:8081/hub/api", hub_api_url_of_api="",
                     host="127.0.0.1", tls={})
    _, settings = _engine(_highstate(_minion(tmp_path, ["mpi-master"], pillar)))
    assert (settings["hub_api_url"], settings["tls_cert"], settings["tls_key"]) == (
        "http://127.0.0.1:8081/hub/api", None, None)


def test_a_hub_named_by_host_name_needs_its_addresses_listed(tmp_path):
    assert _refused(tmp_path, _pillar(hub_api_url="http://hub.test:8081/hub/api")) == [
        "The mpi:api settings are incomplete; the API is not set up until they are:",
        "mpi:api:allowed_clients must list the hub host's addresses: mpi:hub:hub_api_url "
        "names it hub.test, not by an IP address",
    ]


def test_a_hub_named_by_host_name_with_its_addresses_listed_is_fine(tmp_path):
    pillar = _pillar(hub_api_url="http://hub.test:8081/hub/api", allowed_clients=["172.30.0.5"])
    _, settings = _engine(_highstate(_minion(tmp_path, ["mpi-master"], pillar)))
    assert (settings["hub_api_url"], settings["allowed_clients"]) == (TOKEN_URL, ["172.30.0.5"])
