"""Unit tests of where the ``mpi`` runner reads the site's settings: the pillar the nodes
last received (the master's minion data cache), rendered only when the master has none."""

import copy

import salt.cache
import salt.config
from tests.extension import load_extension

runner = load_extension("_runners/mpi.py", "mpi_runner_site")


def _master(tmp_path, monkeypatch, **opts):
    opts = dict(copy.deepcopy(salt.config.DEFAULT_MASTER_OPTS), cachedir=str(tmp_path), **opts)
    rendered = []

    def show_pillar(minion):
        rendered.append(minion)
        return {"mpi": {"slots_per_node": 8}}

    monkeypatch.setattr(runner, "__opts__", opts, raising=False)
    monkeypatch.setattr(runner, "__salt__", {"pillar.show_pillar": show_pillar}, raising=False)
    return opts, rendered


def test_the_pillar_a_node_last_received_is_read_not_rendered(tmp_path, monkeypatch):
    opts, rendered = _master(tmp_path, monkeypatch, minion_data_cache=True)
    salt.cache.factory(opts).store("pillar", "node1", {"mpi": {"slots_per_node": 4}})
    assert runner._node_pillar("node1") == {"mpi": {"slots_per_node": 4}}
    assert rendered == []


def test_a_node_the_master_has_no_pillar_of_gets_it_rendered(tmp_path, monkeypatch):
    opts, rendered = _master(tmp_path, monkeypatch, minion_data_cache=True)
    salt.cache.factory(opts).store("pillar", "node1", {"mpi": {"slots_per_node": 4}})
    assert runner._node_pillar("node2") == {"mpi": {"slots_per_node": 8}}
    assert rendered == ["node2"]


def test_without_the_minion_data_cache_the_pillar_is_rendered(tmp_path, monkeypatch):
    opts, rendered = _master(tmp_path, monkeypatch, minion_data_cache=False)
    salt.cache.factory(dict(opts, minion_data_cache=True)).store(
        "pillar", "node1", {"mpi": {"slots_per_node": 4}})
    assert runner._node_pillar("node1") == {"mpi": {"slots_per_node": 8}}
    assert rendered == ["node1"]
