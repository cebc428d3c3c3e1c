"""The master engine's reader of the site's settings (``mpi_master._read_settings``): the
job controller plans with what the pillar says now, without waiting for a submit."""

import logging
import types

import pytest
from dmpi.errors import ClusterError
from tests.extension import load_extension

mpi_master = load_extension("_engines/mpi_master.py", "mpi_master_engine")


class Stop(Exception):
    """Ends the reader's endless loop after the rounds a test wants."""


def _rounds(monkeypatch, answers):
    """Run the reader over ``answers`` (one per round: a return or an exception of
    ``Site.settings``); returns the seconds it slept before each round."""
    slept, pending = [], list(answers)

    def sleep(seconds):
        if not pending:
            raise Stop
        slept.append(seconds)

    def settings(fresh):
        assert fresh
        answer = pending.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(mpi_master.time, "sleep", sleep)
    with pytest.raises(Stop):
        mpi_master._read_settings(types.SimpleNamespace(settings=settings), 60.0)
    return slept


def test_the_settings_are_read_every_interval_and_first_after_one(monkeypatch):
    config = {"slots_per_node": 2}
    assert _rounds(monkeypatch, [config, config, config]) == [60.0, 60.0, 60.0]


def test_a_bad_pillar_is_logged_once_and_its_end_once(monkeypatch, caplog):
    bad = ClusterError("the site's mpi pillar is invalid, so no job can be accepted:\n"
                       "mpi:slots_per_node must be a whole number of at least 1")
    with caplog.at_level(logging.INFO, logger=mpi_master.log.name):
        _rounds(monkeypatch, [{"slots_per_node": 2}, bad, bad, KeyError("settings"),
                              {"slots_per_node": 3}, {"slots_per_node": 3}])
    said = [(r.levelname, r.getMessage().split(":", 1)[1].strip()) for r in caplog.records]
    assert said == [
        ("WARNING", "the site's settings were not read again, the last ones stay: "
                    + str(bad)),
        ("WARNING", "the site's settings were not read again, the last ones stay: "
                    "'settings'"),
        ("INFO", "the site's settings are read again"),
    ]
