"""
Unit tests of the mpi_image execution and state modules: reference validation and
error edges. The Docker SDK is mocked only to produce errors (a registry without
the digest, an engine that cannot be reached, a pull that returns the wrong
image); real pulls are tested on the cluster.
"""

import json
from unittest.mock import MagicMock, patch

import docker.errors
import pytest
from salt.exceptions import CommandExecutionError, SaltInvocationError

from dmpi.launch import probe
from tests.extension import load_extension




mpi_image = load_extension("_modules/mpi_image.py", "mpi_image_module")
mpi_image_state = load_extension("_states/mpi_image.py", "mpi_image_state")

DIGEST = "sha256:" + "0123456789abcdef" * 4
REF = f"registry.test:5000/dockermpi/openmpi@{DIGEST}"
PROBED = {"mpi": {"flavour": "openmpi4", "version": "4.1.4", "launcher": "/usr/bin/mpirun"},
          "commands": {"sshd": "/usr/sbin/sshd"}, "mpi4py": "3.1.4", "why_no_jobs": None,
          "probe_version": probe.PROBE_VERSION}


@pytest.fixture
def state_salt():
    return {
        "mpi_image.parse_reference": mpi_image.parse_reference,
        "mpi_image.inspect": MagicMock(return_value=None),
        "mpi_image.registry_has": MagicMock(return_value=DIGEST),
        "mpi_image.record_pulled": MagicMock(return_value=True),
        "mpi_image.pull": MagicMock(
            return_value={"id": "sha256:feed", "repo_digests": [REF], "repo_tags": []}
        ),
        "mpi_image.facts": MagicMock(return_value=PROBED),
        "mpi_image.probe": MagicMock(return_value=PROBED),
    }


@pytest.fixture
def configure_loader_modules(state_salt):
    return {
        mpi_image: {"__pillar__": {}},
        mpi_image_state: {"__salt__": state_salt, "__opts__": {"test": False}},
    }


def _client_raising(**errors):
    """A docker client whose images.<method> raise the given exceptions."""
    client = MagicMock()
    for method, exc in errors.items():
        getattr(client.images, method).side_effect = exc
    return client


def _not_found(msg):
    response = MagicMock(status_code=404)
    return docker.errors.NotFound(msg, response=response, explanation=msg)


def test_virtual_says_why_without_docker_sdk():
    with patch.object(mpi_image, "HAS_DOCKER", False):
        ret = mpi_image.__virtual__()
    assert ret[0] is False
    assert "docker Python package" in ret[1]


def test_valid_reference_is_split():
    assert mpi_image.parse_reference(REF) == {
        "repository": "registry.test:5000/dockermpi/openmpi",
        "digest": DIGEST,
    }
    assert mpi_image.parse_reference(f"debian@{DIGEST}")["repository"] == "debian"


@pytest.mark.parametrize(
    "reference",
    [
        "registry.test:5000/dockermpi/openmpi:4.1",  # tag only
        "registry.test:5000/dockermpi/openmpi",  # nothing
        "registry.test:5000/dockermpi/openmpi:latest@" + DIGEST,  # tag and digest
        "registry.test:5000/dockermpi/openmpi@sha256:abc",  # short digest
        "registry.test:5000/dockermpi/openmpi@" + DIGEST.upper(),  # not lower hex
        "registry.test:5000/dockermpi/openmpi@sha512:" + "0" * 64,
        "Registry/Upper@" + DIGEST.replace("sha256:", "sha256:"),  # upper-case repo
        "",
        42,
    ],
)
def test_reference_not_pinned_by_digest_is_rejected(reference):
    with pytest.raises(SaltInvocationError):
        mpi_image.parse_reference(reference)


def test_unreachable_engine_is_a_command_error():
    with patch.object(
        mpi_image.docker, "from_env", side_effect=docker.errors.DockerException("no socket")
    ):
        with pytest.raises(CommandExecutionError, match="cannot reach the Docker engine"):
            mpi_image.inspect(REF)


def test_inspect_returns_none_when_image_absent():
    client = _client_raising(get=docker.errors.ImageNotFound("no such image"))
    with patch.object(mpi_image.docker, "from_env", return_value=client):
        assert mpi_image.inspect(REF) is None


def test_pull_of_digest_the_registry_lacks_names_reference_and_cause():
    client = _client_raising(pull=_not_found("manifest unknown"))
    with patch.object(mpi_image.docker, "from_env", return_value=client):
        with pytest.raises(CommandExecutionError) as exc:
            mpi_image.pull(REF)
    assert REF in str(exc.value)
    assert "does not have this digest" in str(exc.value)
    assert "manifest unknown" in str(exc.value)
    client.images.pull.assert_called_once_with(
        "registry.test:5000/dockermpi/openmpi", tag=DIGEST, auth_config=None
    )


LOGINS = {"registry.test:5000": {"username": "dockermpi", "password": "s3cret-pull"},
          "other.test": {"username": "someone", "password": "other-secret"}}


def test_pull_and_registry_check_log_in_to_the_references_registry_only():
    pulled = MagicMock(id="sha256:feed", attrs={"RepoDigests": [REF]})
    client = MagicMock()
    client.images.pull.return_value = pulled
    client.images.get_registry_data.return_value = MagicMock(id=DIGEST)
    pillar = {"mpi": {"docker": {"registry_credentials": LOGINS}}}
    with patch.object(mpi_image.docker, "from_env", return_value=client), \
            patch.dict(mpi_image.__pillar__, pillar), \
            patch.object(mpi_image, "record_pulled"):
        mpi_image.pull(REF)
        mpi_image.registry_has(REF)
        elsewhere = f"elsewhere.test/dockermpi/openmpi@{DIGEST}"
        pulled.attrs = {"RepoDigests": [elsewhere]}
        mpi_image.pull(elsewhere)
    login = {"username": "dockermpi", "password": "s3cret-pull"}
    assert client.images.pull.call_args_list[0].kwargs["auth_config"] == login
    assert client.images.get_registry_data.call_args.kwargs["auth_config"] == login
    # Another registry's login never goes to a registry that has none of its own.
    assert client.images.pull.call_args_list[1].kwargs["auth_config"] is None


def _errors_when_the_engine_says(message, pillar=None):
    """The errors of ``pull`` and of ``registry_has`` when the engine refuses each with
    ``message``, under ``pillar``."""
    refused = docker.errors.APIError(message, response=MagicMock(status_code=500),
                                     explanation=message)
    errors = []
    for method, call in (("pull", mpi_image.pull), ("get_registry_data", mpi_image.registry_has)):
        client = _client_raising(**{method: refused})
        with patch.object(mpi_image.docker, "from_env", return_value=client), \
                patch.dict(mpi_image.__pillar__, pillar or {}):
            with pytest.raises(CommandExecutionError) as exc:
                call(REF)
        errors.append(str(exc.value))
    return errors


@pytest.mark.parametrize("pillar,fix", [
    ({}, "wants a login: set pillar mpi:docker:registry_credentials:registry.test:5000"),
    ({"mpi": {"docker": {"registry_credentials": LOGINS}}},
     "refused the login in pillar mpi:docker:registry_credentials:registry.test:5000"),
])
def test_a_registry_refusing_the_pull_names_the_pillar_key_and_never_the_password(pillar, fix):
    message = ("Head \"https://registry.test:5000/v2/dockermpi/openmpi/manifests/sha256:01\": "
               "no basic auth credentials")
    for error in _errors_when_the_engine_says(message, pillar):
        assert message in error and fix in error
        assert "s3cret" not in error


def test_a_registry_the_hosts_docker_does_not_trust_is_named_with_the_fix():
    message = ('Get "https://registry.test:5000/v2/": http: server gave HTTP response to '
               'HTTPS client')
    for error in _errors_when_the_engine_says(message):
        assert message in error
        assert ("list registry.test:5000 in pillar mpi:docker:insecure_registries and run "
                "highstate") in error


def test_pull_that_yields_other_digest_is_an_error():
    client = MagicMock()
    client.images.pull.return_value = MagicMock(
        id="sha256:beef", attrs={"RepoDigests": ["other/repo@" + DIGEST]}
    )
    with patch.object(mpi_image.docker, "from_env", return_value=client):
        with pytest.raises(CommandExecutionError, match="do not contain it"):
            mpi_image.pull(REF)


def test_registry_has_reports_missing_digest():
    client = _client_raising(get_registry_data=_not_found("manifest unknown"))
    with patch.object(mpi_image.docker, "from_env", return_value=client):
        with pytest.raises(CommandExecutionError, match="does not have"):
            mpi_image.registry_has(REF)


def test_state_rejects_tag_reference_without_touching_docker(state_salt):
    ret = mpi_image_state.present("openmpi", "registry.test:5000/dockermpi/openmpi:4.1")
    assert ret["result"] is False
    assert ret["changes"] == {}
    assert "openmpi" in ret["comment"] and "not pinned by digest" in ret["comment"]
    state_salt["mpi_image.inspect"].assert_not_called()
    state_salt["mpi_image.pull"].assert_not_called()


def test_state_present_image_is_no_change(state_salt):
    state_salt["mpi_image.inspect"].return_value = {"id": "sha256:feed"}
    ret = mpi_image_state.present("openmpi", REF)
    assert (ret["result"], ret["changes"]) == (True, {})
    state_salt["mpi_image.pull"].assert_not_called()


def test_state_test_mode_would_pull_and_does_not(state_salt):
    with patch.dict(mpi_image_state.__opts__, {"test": True}):
        ret = mpi_image_state.present("openmpi", REF)
    assert ret["result"] is None
    assert ret["changes"] == {"pulled": {"old": None, "new": REF}}
    state_salt["mpi_image.pull"].assert_not_called()


def test_state_test_mode_fails_for_digest_registry_lacks(state_salt):
    state_salt["mpi_image.registry_has"].side_effect = CommandExecutionError(
        f"the registry does not have {REF}"
    )
    with patch.dict(mpi_image_state.__opts__, {"test": True}):
        ret = mpi_image_state.present("openmpi", REF)
    assert ret["result"] is False
    assert ret["changes"] == {}
    assert "openmpi" in ret["comment"] and REF in ret["comment"]


def test_state_pull_failure_names_image_reference_and_cause(state_salt):
    state_salt["mpi_image.pull"].side_effect = CommandExecutionError(
        f"cannot pull {REF}: the registry does not have this digest: manifest unknown"
    )
    ret = mpi_image_state.present("openmpi", REF)
    assert ret["result"] is False
    assert ret["changes"] == {}
    for part in ("openmpi", REF, "manifest unknown"):
        assert part in ret["comment"]


def test_state_reports_pull(state_salt):
    ret = mpi_image_state.present("openmpi", REF)
    assert ret["result"] is True
    assert ret["changes"]["pulled"]["new"] == REF


# ------------------------------------------------------------ images no longer approved

OLD = f"registry.test:5000/dockermpi/openmpi@sha256:{'ab' * 32}"


def _unapproved(state_salt, found, removed=None):
    state_salt["mpi_image.unapproved"] = MagicMock(return_value=found)
    state_salt["mpi_image.remove"] = MagicMock(
        side_effect=lambda ref: removed.get(ref, {"removed": True, "reason": None})
        if removed else {"removed": True, "reason": None})


def test_an_unused_unapproved_image_is_removed(state_salt):
    _unapproved(state_salt, [{"reference": OLD, "present": True, "id": "x", "containers": []}])
    ret = mpi_image_state.unapproved_absent("mpi:images", [REF])
    assert ret["result"] is True and ret["changes"] == {"removed": [OLD]}
    state_salt["mpi_image.unapproved"].assert_called_once_with([REF])
    state_salt["mpi_image.remove"].assert_called_once_with(OLD)


def test_test_mode_lists_what_would_go_and_removes_nothing(state_salt):
    _unapproved(state_salt, [{"reference": OLD, "present": True, "id": "x", "containers": []}])
    with patch.dict(mpi_image_state.__opts__, {"test": True}):
        ret = mpi_image_state.unapproved_absent("mpi:images", [REF])
    assert ret["result"] is None and ret["changes"] == {"removed": [OLD]}
    assert "would be removed" in ret["comment"]
    state_salt["mpi_image.remove"].assert_not_called()


def test_an_image_a_container_uses_is_kept_and_named(state_salt):
    _unapproved(state_salt, [{"reference": OLD, "present": True, "id": "x",
                              "containers": ["dmpi-job-worker"]}])
    ret = mpi_image_state.unapproved_absent("mpi:images", [REF])
    assert ret["result"] is True and ret["changes"] == {}
    assert "kept: used by dmpi-job-worker" in ret["comment"]
    state_salt["mpi_image.remove"].assert_not_called()


def test_nothing_to_remove_is_no_change(state_salt):
    _unapproved(state_salt, [])
    ret = mpi_image_state.unapproved_absent("mpi:images", [REF])
    assert ret == {"name": "mpi:images", "result": True, "changes": {},
                   "comment": "no image DockerMPI pulled is outside mpi:images"}


def test_the_ledger_keeps_only_valid_references(tmp_path, monkeypatch):
    ledger = tmp_path / "images.json"
    monkeypatch.setattr(mpi_image, "LEDGER", str(ledger))
    assert mpi_image._ledger() == []
    mpi_image.record_pulled(REF)
    mpi_image.record_pulled(REF)
    ledger.write_text(json.dumps([REF, "not a reference", 5, OLD]))
    assert mpi_image._ledger() == sorted([REF, OLD])
    with pytest.raises(SaltInvocationError):
        mpi_image.record_pulled("registry.test/x:latest")


def test_state_probes_a_present_image_never_probed(state_salt):
    state_salt["mpi_image.inspect"].return_value = {"id": "sha256:feed"}
    state_salt["mpi_image.facts"].return_value = None
    ret = mpi_image_state.present("openmpi", REF)
    assert ret["result"] is True
    assert ret["changes"] == {"probed": {"old": None,
                                         "new": "Open MPI 4.1.4 (/usr/bin/mpirun), "
                                                "mpi4py 3.1.4"}}
    state_salt["mpi_image.probe"].assert_called_once_with(REF)


def test_state_probes_once(state_salt):
    state_salt["mpi_image.inspect"].return_value = {"id": "sha256:feed"}
    ret = mpi_image_state.present("openmpi", REF)
    assert ret["result"] is True and ret["changes"] == {}
    state_salt["mpi_image.probe"].assert_not_called()


def test_state_test_mode_says_it_would_probe(state_salt):
    state_salt["mpi_image.inspect"].return_value = {"id": "sha256:feed"}
    state_salt["mpi_image.facts"].return_value = None
    with patch.dict(mpi_image_state.__opts__, {"test": True}):
        ret = mpi_image_state.present("openmpi", REF)
    assert ret["result"] is None
    assert "probed" in ret["changes"] and "would be probed" in ret["comment"]
    state_salt["mpi_image.probe"].assert_not_called()


def test_state_names_why_jobs_cannot_run_on_the_image(state_salt):
    state_salt["mpi_image.facts"].return_value = None
    state_salt["mpi_image.probe"].return_value = {
        "mpi": None, "commands": {}, "why_no_jobs": "it has no MPI launcher (mpirun or "
                                                    "mpiexec) on its PATH"}
    ret = mpi_image_state.present("plain", REF)
    assert ret["result"] is True  # present, as approved; submits on it are refused
    assert "pulled" in ret["changes"] and "probed" in ret["changes"]
    assert "jobs cannot run on it: it has no MPI launcher" in ret["comment"]


def test_state_fails_when_the_probe_cannot_run(state_salt):
    state_salt["mpi_image.facts"].return_value = None
    state_salt["mpi_image.probe"].side_effect = CommandExecutionError(
        "cannot probe image: engine gone")
    ret = mpi_image_state.present("openmpi", REF)
    assert ret["result"] is False
    assert "probing it failed: cannot probe image: engine gone" in ret["comment"]


def test_state_probes_again_what_an_older_probe_found(state_salt):
    state_salt["mpi_image.inspect"].return_value = {"id": "sha256:feed"}
    state_salt["mpi_image.facts"].return_value = dict(PROBED, probe_version=0)
    ret = mpi_image_state.present("openmpi", REF)
    assert ret["result"] is True and "probed" in ret["changes"]
    state_salt["mpi_image.probe"].assert_called_once_with(REF)
