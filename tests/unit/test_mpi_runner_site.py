"""Unit tests of where the ``mpi`` runner reads the site's settings: the pillar the
master renders now from its pillar tree for a node's grains, never the pillar it cached
for the node (which a dry run with a pillar override leaves behind)."""

import copy
import pathlib
import shutil

import pytest
import salt.cache
import salt.config
from salt.exceptions import CommandExecutionError

from tests.extension import load_extension

runner = load_extension("_runners/mpi.py", "mpi_runner_site")
import dmpi.settings  # noqa: E402
DEFAULTS = pathlib.Path(__file__).resolve().parents[2] / "salt" / "dockermpi" / "defaults.yaml"

TOP = """base:
  'roles:mpi-node':
    - match: grain
    - site
"""


def _master(tmp_path, monkeypatch, site="mpi:\n  slots_per_node: 8\n"):
    pillar_root = tmp_path / "pillar"
    pillar_root.mkdir()
    (pillar_root / "top.sls").write_text(TOP)
    (pillar_root / "site.sls").write_text(site)
    opts = dict(copy.deepcopy(salt.config.DEFAULT_MASTER_OPTS), cachedir=str(tmp_path / "cache"),
                pillar_roots={"base": [str(pillar_root)]}, file_roots={"base": []},
                minion_data_cache=True, extension_modules=str(tmp_path / "extmods"))
    rendered = []

    def show_pillar(minion):
        rendered.append(minion)
        return {"mpi": {"slots_per_node": 2}}

    monkeypatch.setattr(runner, "__opts__", opts, raising=False)
    monkeypatch.setattr(runner, "__salt__", {"pillar.show_pillar": show_pillar}, raising=False)
    return opts, rendered


def test_an_override_a_dry_run_left_in_the_cache_is_not_the_sites_pillar(
        tmp_path, monkeypatch):
    opts, rendered = _master(tmp_path, monkeypatch)
    cache = salt.cache.factory(opts)
    cache.store("grains", "node1", {"id": "node1", "roles": ["mpi-node"]})
    # what `salt node1 state.apply test=True pillar='{"mpi": {"slots_per_node": 0}}'`
    # leaves in the master's minion data cache
    cache.store("pillar", "node1", {"mpi": {"slots_per_node": 0}})
    assert runner._node_pillar("node1", runner._node_grains("node1"))["mpi"] == {"slots_per_node": 8}
    assert rendered == []


def test_the_pillar_is_rendered_for_the_nodes_own_grains(tmp_path, monkeypatch):
    opts, _ = _master(tmp_path, monkeypatch)
    salt.cache.factory(opts).store("grains", "hub", {"id": "hub", "roles": ["mpi-hub"]})
    assert "mpi" not in runner._node_pillar("hub", runner._node_grains("hub"))


def test_a_pillar_that_does_not_render_is_refused_with_the_reason(tmp_path, monkeypatch):
    opts, _ = _master(tmp_path, monkeypatch, site="mpi: {{ broken\n")
    salt.cache.factory(opts).store("grains", "node1", {"id": "node1", "roles": ["mpi-node"]})
    with pytest.raises(CommandExecutionError, match="the pillar of node1 does not render"):
        runner._node_pillar("node1", runner._node_grains("node1"))


def test_a_node_the_master_has_no_grains_of_gets_it_rendered_by_show_pillar(
        tmp_path, monkeypatch):
    _, rendered = _master(tmp_path, monkeypatch)
    assert runner._node_pillar("node2", runner._node_grains("node2")) == {
        "mpi": {"slots_per_node": 2}}
    assert rendered == ["node2"]


#: A valid site (as the test cluster's, on NFS); {slots} is slots_per_node.
SITE = """mpi:
  slots_per_node: {slots}
  cluster_network: 10.251.1.0/24
  job_network: {{addresses: 10.251.1.128/25}}
  storage: {{type: nfs, nfs: {{server: 10.251.1.10}}}}
"""


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A master whose settings renderings are counted: (opts, the pillar root, renders)."""
    opts, _ = _master(tmp_path, monkeypatch, site=SITE.format(slots=8))
    file_root = tmp_path / "salt"
    (file_root / "dockermpi").mkdir(parents=True)
    shutil.copy(DEFAULTS, file_root / "dockermpi" / "defaults.yaml")
    opts["file_roots"] = {"base": [str(file_root)]}
    opts["fileserver_backend"] = ["roots"]
    monkeypatch.setattr(runner, "__utils__", {
        "mpi_config.validate": dmpi.settings.validate, "mpi_config.merge": dmpi.settings.merge},
        raising=False)
    monkeypatch.setattr(runner, "_SETTINGS", {})
    salt.cache.factory(opts).store("grains", "node1", {"id": "node1", "roles": ["mpi-node"]})
    renders = []
    render = runner._node_pillar

    def counted(minion, grains):
        renders.append(minion)
        return render(minion, grains)

    monkeypatch.setattr(runner, "_node_pillar", counted)
    return opts, tmp_path / "pillar", renders


def test_the_settings_are_rendered_again_only_when_what_they_come_from_changed(site):
    opts, pillar_root, renders = site
    assert runner._site_config("node1")["slots_per_node"] == 8
    assert runner._site_config("node1")["slots_per_node"] == 8
    assert len(renders) == 1
    # the same size, the same second: a rewrite of the file is seen all the same
    (pillar_root / "site.sls").write_text(SITE.format(slots=9))
    assert runner._site_config("node1")["slots_per_node"] == 9
    (pillar_root / "more.sls").write_text("other: 1\n")
    runner._site_config("node1")
    salt.cache.factory(opts).store("grains", "node1", {"id": "node1", "roles": ["mpi-node"],
                                                      "rack": "a"})
    runner._site_config("node1")
    assert len(renders) == 4
    # an admin's read (salt-run mpi.settings) renders whatever
    runner._site_config("node1", fresh=True)
    assert len(renders) == 5


def test_a_change_in_the_defaults_file_is_seen(site):
    opts, _, renders = site
    runner._site_config("node1")
    defaults = pathlib.Path(opts["file_roots"]["base"][0]) / "dockermpi" / "defaults.yaml"
    defaults.write_text(defaults.read_text() + "\n")
    runner._site_config("node1")
    assert len(renders) == 2


def test_a_reused_rendering_is_a_copy_and_expires(site, monkeypatch):
    _, _, renders = site
    runner._site_config("node1")["slots_per_node"] = 99
    assert runner._site_config("node1")["slots_per_node"] == 8
    monkeypatch.setattr(runner, "SETTINGS_REUSE", 0)
    runner._site_config("node1")
    assert len(renders) == 2


@pytest.mark.parametrize("opts_change", [{"ext_pillar": [{"cmd_yaml": "cat /x"}]},
                                         {"fileserver_backend": ["gitfs"]}])
def test_sources_no_file_here_speaks_for_are_rendered_every_time(site, opts_change):
    opts, _, _ = site
    assert runner._settings_sources({"id": "node1"}) is not None
    opts.update(opts_change)
    assert runner._settings_sources({"id": "node1"}) is None


def test_an_admins_read_of_the_settings_shows_no_registry_password(site, monkeypatch):
    opts, pillar_root, _ = site
    (pillar_root / "site.sls").write_text(SITE.format(slots=8) + """  docker:
    registry_credentials:
      '10.251.1.2:5000': {username: dockermpi, password: s3cret-registry-login}
""")
    monkeypatch.setattr(runner, "_require_admin", lambda function: None)
    monkeypatch.setattr(runner, "_store", lambda: None)
    monkeypatch.setattr(runner, "_mpi_nodes", lambda: ["node1"])
    site_config = runner._site_config
    monkeypatch.setattr(runner, "_refresh_site",
                        lambda store, minion, fresh: site_config(minion, fresh=fresh))
    monkeypatch.setattr(runner, "__context__", {}, raising=False)
    shown = runner.settings()
    assert shown["docker"]["registry_credentials"] == {
        "10.251.1.2:5000": {"username": "dockermpi", "password": "(hidden)"}}, shown
    # the engine's own copy keeps it (nodes pull with it)
    assert runner._site_config("node1")["docker"]["registry_credentials"][
        "10.251.1.2:5000"]["password"] == "s3cret-registry-login"
