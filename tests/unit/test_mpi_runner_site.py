"""Unit tests of where the ``mpi`` runner reads the site's settings: the pillar the
master renders now from its pillar tree for a node's grains, never the pillar it cached
for the node (which a dry run with a pillar override leaves behind)."""

import copy

import pytest
import salt.cache
import salt.config
from salt.exceptions import CommandExecutionError

from tests.extension import load_extension

runner = load_extension("_runners/mpi.py", "mpi_runner_site")

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
    assert runner._node_pillar("node1")["mpi"] == {"slots_per_node": 8}
    assert rendered == []


def test_the_pillar_is_rendered_for_the_nodes_own_grains(tmp_path, monkeypatch):
    opts, _ = _master(tmp_path, monkeypatch)
    salt.cache.factory(opts).store("grains", "hub", {"id": "hub", "roles": ["mpi-hub"]})
    assert "mpi" not in runner._node_pillar("hub")


def test_a_pillar_that_does_not_render_is_refused_with_the_reason(tmp_path, monkeypatch):
    opts, _ = _master(tmp_path, monkeypatch, site="mpi: {{ broken\n")
    salt.cache.factory(opts).store("grains", "node1", {"id": "node1", "roles": ["mpi-node"]})
    with pytest.raises(CommandExecutionError, match="the pillar of node1 does not render"):
        runner._node_pillar("node1")


def test_a_node_the_master_has_no_grains_of_gets_it_rendered_by_show_pillar(
        tmp_path, monkeypatch):
    _, rendered = _master(tmp_path, monkeypatch)
    assert runner._node_pillar("node2") == {"mpi": {"slots_per_node": 2}}
    assert rendered == ["node2"]
