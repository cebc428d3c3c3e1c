"""The master's API states (dockermpi.api, role mpi-master) as highstate renders them."""

import pytest

from tests.functional.test_render import PRESHARED_PILLAR, _args, _highstate, _minion

HUB_API = "http://hub.test:8081/hub/api"
USER_FUNCTIONS = "^mpi\\.(whoami|submit|launch|wait|status|list|history|usage|logs|cancel)$"


@pytest.fixture(scope="module")
def api_high(tmp_path_factory):
    pillar = dict(PRESHARED_PILLAR, hub={"hub_api_url": HUB_API},
                  api={"subject_alt_names": ["DNS:master.test", "IP:172.30.0.2"]})
    return _highstate(_minion(tmp_path_factory.mktemp("api"), ["mpi-master"], pillar))


def test_hub_tokens_reach_only_the_user_functions_of_the_mpi_runner(api_high):
    config = _args(api_high, "mpi-api-master-config", "file.serialize")["dataset"]
    assert config["external_auth"] == {
        "jupyterhub": {"^url": HUB_API, "*": [{"@runner": [USER_FUNCTIONS]}]}}
    assert config["auth_dirs"] == ["/var/lib/dockermpi/salt-auth"]
    assert config["netapi_enable_clients"] == ["runner"]
    assert config["rest_cherrypy"]["ssl_crt"] == "/etc/dockermpi/api/tls.crt"
    assert "disable_ssl" not in config["rest_cherrypy"]


def test_the_certificate_names_come_from_pillar_and_is_published(api_high):
    cert = _args(api_high, "mpi-api-tls-certificate", "x509.certificate_managed")
    assert cert["subjectAltName"] == "DNS:master.test, IP:172.30.0.2"
    published = _args(api_high, "mpi-api-certificate-published",
                      "mpi_api.certificate_published")
    assert published["path"] == cert["name"]


def test_the_master_restarts_only_when_its_api_configuration_changes(api_high):
    restart = _args(api_high, "mpi-api-master-restart", "module.run")
    assert restart["onchanges"] == [{"file": "mpi-api-master-config"},
                                    {"file": "mpi-api-eauth-module"}]


def test_every_api_state_requires_the_settings_check(api_high):
    for sid, body in api_high.items():
        if sid.startswith("__") or sid == "mpi-config-settings-valid":
            continue
        for items in body.values():
            if isinstance(items, list):
                requires = next((i["require"] for i in items
                                 if isinstance(i, dict) and "require" in i), [])
                assert {"sls": "dockermpi.config"} in requires, sid
