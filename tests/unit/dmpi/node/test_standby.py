"""How many standby namespaces a node keeps (``dmpi.node.standby.keep``), against a
stand-in for the Docker engine. Real spares taken by real jobs:
tests/integration/test_tenants.py."""

import docker.errors
import pytest

from dmpi.contract import LABEL_ROLE, STANDBY_PREFIX, STANDBY_ROLE
from dmpi.node import containers, standby


class Spare:
    def __init__(self, engine, name, status="running"):
        self.engine, self.name, self.status = engine, name, status

    def remove(self, force=False):
        if self.name not in self.engine.spares:
            raise docker.errors.NotFound(self.name)
        del self.engine.spares[self.name]


class Engine:
    """The spares a node holds, and what ``containers.run`` does besides making one."""

    def __init__(self, running=0, on_run=None):
        self.spares = {}
        self.on_run = on_run
        self.containers = self
        self.networks = self
        for number in range(running):
            self.add(f"{STANDBY_PREFIX}old{number}")

    def add(self, name):
        self.spares[name] = Spare(self, name)

    def get(self, name):  # networks.get
        return type("Network", (), {"name": name})()

    def list(self, all=False, filters=None, ignore_removed=False):  # noqa: A002
        assert filters == {"label": f"{LABEL_ROLE}={STANDBY_ROLE}"}
        return list(self.spares.values())

    def run(self, image, name, **options):
        self.add(name)
        if self.on_run:
            self.on_run(self)


@pytest.fixture
def engine(monkeypatch, tmp_path):
    monkeypatch.setattr(standby, "STANDBY_LOCK", str(tmp_path / "standby.lock"))
    holder = {}
    monkeypatch.setattr(containers, "client", lambda: holder["engine"])

    def use(running=0, on_run=None):
        holder["engine"] = Engine(running, on_run)
        return holder["engine"]
    return use


def test_missing_spares_are_made_and_extra_ones_removed(engine):
    node = engine(running=1)
    answer = standby.keep("mpi@sha256:" + "a" * 64, 3, "node1")
    assert len(node.spares) == 3 and answer["ready"] == 3 and len(answer["made"]) == 2
    answer = standby.keep("mpi@sha256:" + "a" * 64, 1, "node1")
    assert len(node.spares) == 1 and answer["ready"] == 1 and len(answer["removed"]) == 2


def test_two_clean_ups_keeping_spares_at_once_leave_the_count_not_more(engine):
    # While this call makes the spare it found missing, another clean-up's call makes
    # its own (both counted one running spare of two).
    made_by_the_other = []

    def other_keep(node):
        if not made_by_the_other:
            made_by_the_other.append(f"{STANDBY_PREFIX}other")
            node.add(made_by_the_other[0])

    node = engine(running=1, on_run=other_keep)
    answer = standby.keep("mpi@sha256:" + "a" * 64, 2, "node1")
    assert len(node.spares) == 2 and answer["ready"] == 2, (node.spares, answer)
    assert len(answer["removed"]) == 1
