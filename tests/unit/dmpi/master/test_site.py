"""Where the master reads the site's settings (``dmpi.master.site.Site``): the pillar the
master renders now from its pillar tree for a node's grains, never the pillar it cached
for the node (which a dry run with a pillar override leaves behind)."""

import copy
import pathlib
import shutil

import pytest
import salt.cache
import salt.config
from dmpi.errors import ClusterError
from dmpi.master import admin_calls
from dmpi.master.site import Site, failed_calls_message, minion_returns

DEFAULTS = pathlib.Path(__file__).resolve().parents[4] / "salt" / "dockermpi" / "defaults.yaml"

TOP = """base:
  'roles:mpi-node':
    - match: grain
    - site
"""


def _master(tmp_path, site="mpi:\n  slots_per_node: 8\n"):
    """A Site over a master with a pillar tree whose top gives ``site`` to MPI nodes."""
    pillar_root = tmp_path / "pillar"
    pillar_root.mkdir()
    (pillar_root / "top.sls").write_text(TOP)
    (pillar_root / "site.sls").write_text(site)
    opts = dict(copy.deepcopy(salt.config.DEFAULT_MASTER_OPTS), cachedir=str(tmp_path / "cache"),
                pillar_roots={"base": [str(pillar_root)]}, file_roots={"base": []},
                minion_data_cache=True, extension_modules=str(tmp_path / "extmods"))
    return Site(opts)


def _grains(site, minion):
    return salt.cache.factory(site.opts).fetch("grains", minion) or None


def test_an_override_a_dry_run_left_in_the_cache_is_not_the_sites_pillar(tmp_path):
    site = _master(tmp_path)
    cache = salt.cache.factory(site.opts)
    cache.store("grains", "node1", {"id": "node1", "roles": ["mpi-node"]})
    # what `salt node1 state.apply test=True pillar='{"mpi": {"slots_per_node": 0}}'`
    # leaves in the master's minion data cache
    cache.store("pillar", "node1", {"mpi": {"slots_per_node": 0}})
    assert site._node_pillar("node1", _grains(site, "node1"))["mpi"] == {"slots_per_node": 8}
    assert cache.fetch("pillar", "node1") == {"mpi": {"slots_per_node": 0}}  # not written


def test_the_pillar_is_rendered_for_the_nodes_own_grains(tmp_path):
    site = _master(tmp_path)
    salt.cache.factory(site.opts).store("grains", "hub", {"id": "hub", "roles": ["mpi-hub"]})
    assert "mpi" not in site._node_pillar("hub", _grains(site, "hub"))


def test_a_pillar_that_does_not_render_is_refused_with_the_reason(tmp_path):
    site = _master(tmp_path, site="mpi: {{ broken\n")
    salt.cache.factory(site.opts).store("grains", "node1", {"id": "node1", "roles": ["mpi-node"]})
    with pytest.raises(ClusterError, match="the pillar of node1 does not render"):
        site._node_pillar("node1", _grains(site, "node1"))


def test_a_node_the_master_has_no_grains_of_gets_the_pillar_no_grain_matches(tmp_path):
    # as Salt's pillar.show_pillar renders it: grains {"fqdn": id}, so the grain-matched
    # site pillar is not the node's until its grains reach the master
    site = _master(tmp_path)
    assert _grains(site, "node2") is None
    assert "mpi" not in site._node_pillar("node2", None)


#: A valid site (as the test cluster's, on NFS); {slots} is slots_per_node.
SITE = """mpi:
  slots_per_node: {slots}
  cluster_network: 10.251.1.0/24
  job_network: {{addresses: 10.251.1.128/25}}
  storage: {{type: nfs, nfs: {{server: 10.251.1.10}}}}
"""


class CountedSite(Site):
    """A Site that counts its renderings of node1's pillar, node1 its one MPI node."""

    def __init__(self, opts):
        super().__init__(opts)
        self.renders = []

    def _node_pillar(self, minion, grains):
        self.renders.append(minion)
        return super()._node_pillar(minion, grains)

    def mpi_nodes(self):
        return ["node1"]


@pytest.fixture
def site(tmp_path):
    """A master whose settings renderings are counted: (site, the pillar root)."""
    opts = _master(tmp_path, site=SITE.format(slots=8)).opts
    file_root = tmp_path / "salt"
    (file_root / "dockermpi").mkdir(parents=True)
    shutil.copy(DEFAULTS, file_root / "dockermpi" / "defaults.yaml")
    opts["file_roots"] = {"base": [str(file_root)]}
    opts["fileserver_backend"] = ["roots"]
    salt.cache.factory(opts).store("grains", "node1", {"id": "node1", "roles": ["mpi-node"]})
    return CountedSite(opts), tmp_path / "pillar"


def test_the_settings_are_rendered_again_only_when_what_they_come_from_changed(site):
    site, pillar_root = site
    assert site.node_settings("node1")["slots_per_node"] == 8
    assert site.node_settings("node1")["slots_per_node"] == 8
    assert len(site.renders) == 1
    # the same size, the same second: a rewrite of the file is seen all the same
    (pillar_root / "site.sls").write_text(SITE.format(slots=9))
    assert site.node_settings("node1")["slots_per_node"] == 9
    (pillar_root / "more.sls").write_text("other: 1\n")
    site.node_settings("node1")
    salt.cache.factory(site.opts).store("grains", "node1", {
        "id": "node1", "roles": ["mpi-node"], "rack": "a"})
    site.node_settings("node1")
    assert len(site.renders) == 4
    # an admin's read (salt-run mpi.settings) renders whatever
    site.node_settings("node1", fresh=True)
    assert len(site.renders) == 5


def test_the_job_controller_gets_the_settings_in_the_store(site):
    site, pillar_root = site
    site.node_settings("node1")
    assert site.store().get_meta("site")["config"]["slots_per_node"] == 8
    (pillar_root / "site.sls").write_text(SITE.format(slots=9))
    site.node_settings("node1")
    assert site.store().get_meta("site")["config"]["slots_per_node"] == 9


def test_a_change_in_the_defaults_file_is_seen(site):
    site, _ = site
    site.node_settings("node1")
    defaults = pathlib.Path(site.opts["file_roots"]["base"][0]) / "dockermpi" / "defaults.yaml"
    defaults.write_text(defaults.read_text() + "\n")
    site.node_settings("node1")
    assert len(site.renders) == 2


def test_a_reused_rendering_is_a_copy_and_expires(site, monkeypatch):
    site, _ = site
    site.node_settings("node1")["slots_per_node"] = 99
    assert site.node_settings("node1")["slots_per_node"] == 8
    monkeypatch.setattr("dmpi.master.site.SETTINGS_REUSE", 0)
    site.node_settings("node1")
    assert len(site.renders) == 2


@pytest.mark.parametrize("opts_change", [{"ext_pillar": [{"cmd_yaml": "cat /x"}]},
                                         {"fileserver_backend": ["gitfs"]}])
def test_sources_no_file_here_speaks_for_are_rendered_every_time(site, opts_change):
    site, _ = site
    assert site._settings_sources({"id": "node1"}) is not None
    site.opts.update(opts_change)
    assert site._settings_sources({"id": "node1"}) is None


def test_a_bad_pillar_is_refused_naming_every_problem(site):
    site, pillar_root = site
    (pillar_root / "site.sls").write_text(SITE.format(slots=0))
    with pytest.raises(ClusterError, match="the site's mpi pillar is invalid") as caught:
        site.node_settings("node1")
    assert "slots_per_node" in str(caught.value)
    assert site.store().get_meta("site") is None  # the controller keeps what it had


def test_an_admins_read_of_the_settings_shows_no_registry_password(site):
    site, pillar_root = site
    (pillar_root / "site.sls").write_text(SITE.format(slots=8) + """  docker:
    registry_credentials:
      '10.251.1.2:5000': {username: dockermpi, password: s3cret-registry-login}
""")
    shown = admin_calls.settings(site)
    assert shown["docker"]["registry_credentials"] == {
        "10.251.1.2:5000": {"username": "dockermpi", "password": "(hidden)"}}, shown
    # the controller's own copy keeps it (nodes pull with it)
    assert site.store().get_meta("site")["config"]["docker"]["registry_credentials"][
        "10.251.1.2:5000"]["password"] == "s3cret-registry-login"


def test_minion_returns_sorts_answers_failures_and_silence():
    returns = {
        "node1": {"ret": {"ok": 1}, "retcode": 0},
        "node2": {"ret": "ERROR: no such job", "retcode": 1},
        "node3": {"ret": "boom", "success": False},
        "node4": "Minion did not return",
    }
    results, errors = minion_returns(returns, ["node1", "node2", "node3", "node4", "node5"])
    assert results == {"node1": {"ok": 1}}
    assert errors == {"node2": "ERROR: no such job", "node3": "boom",
                      "node4": "did not answer", "node5": "did not answer"}
    assert failed_calls_message("mpi_job.cleanup", errors).startswith(
        "mpi_job.cleanup failed on node2: ERROR: no such job; node3: boom; node4: did not")
