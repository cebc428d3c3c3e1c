"""
Unit tests of the ``mpi_node`` engine's reporter: configuration checks, when it sends a
full report and when only a heartbeat, and how it turns single probe results into
``unreachable_peers`` (only after consecutive failures). ``mpi_job.report`` is replaced
by a scripted sequence of reports; the report itself is tested in
test_mpi_job_report.py, and the engine on the cluster.
"""

from unittest.mock import MagicMock

import pytest
from tests.extension import load_extension

mpi_node = load_extension("_engines/mpi_node.py", "mpi_node_engine")

JOB = "20261130-120000-abcdef"
OTHER_JOB = "20261130-120001-012345"
PEER = "10.0.0.12"
PEER2 = "10.0.0.13"
CONFIG = {"storage_path": "/srv/dockermpi", "job_root": "/var/lib/dockermpi/jobs"}


def _report(peers_by_job, engine="ok"):
    return {
        "engine": engine,
        "jobs": {
            job_id: {
                "user": "alice",
                "containers": {"worker": "running", "launcher": None},
                "launcher_exit_code": None,
                "failure": None,
                "secrets": True,
                "peers": dict(peers),
            }
            for job_id, peers in peers_by_job.items()
        },
        "time": 1.0,
    }


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


@pytest.fixture
def report_fn():
    return MagicMock(return_value=_report({}))


@pytest.fixture
def clock():
    return Clock()


def _reporter(report_fn, clock, **config):
    return mpi_node.Reporter(mpi_node.check_config(dict(CONFIG, **config)), report_fn, clock)


def _unreachable(reports, report_fn, clock, **config):
    """One look per report; [{job: unreachable_peers}] per look."""
    reporter = _reporter(report_fn, clock, **config)
    seen = []
    for report in reports:
        report_fn.return_value = report
        evidence = reporter.evidence()
        seen.append({job: data["unreachable_peers"] for job, data in evidence["jobs"].items()})
    return seen


def test_defaults_fill_missing_keys():
    conf = mpi_node.check_config(CONFIG)
    assert conf["interval"] == 1.0 and conf["heartbeat"] == 2.0 and conf["refresh"] == 10.0
    assert conf["probe_timeout"] == 0.5 and conf["failures"] == 2


@pytest.mark.parametrize(
    "config, why",
    [
        ({"job_root": "/var/lib/dockermpi/jobs"}, "storage_path"),
        ({"storage_path": "srv/dockermpi"}, "storage_path"),
        ({"storage_path": "/srv", "job_root": "jobs"}, "job_root"),
        ({"storage_path": "/srv", "probe_timeout": -1}, "probe_timeout"),
        ({"storage_path": "/srv", "interval": "soon"}, "interval"),
        ({"storage_path": "/srv", "failures": 0}, "failures"),
        ({"storage_path": "/srv", "failures": True}, "failures"),
    ],
)
def test_bad_config_is_refused_with_a_reason(config, why):
    with pytest.raises(ValueError, match=why):
        mpi_node.check_config(config)


def test_the_first_look_sends_the_full_report(report_fn, clock):
    report_fn.return_value = _report({JOB: {PEER: True}}, engine="boom")
    kind, data = _reporter(report_fn, clock).next_event()
    assert kind == "report"
    report = data["report"]
    assert report["engine"] == "boom" and report["jobs"][JOB]["unreachable_peers"] == []
    assert report["digest"] == mpi_node.fingerprint(report)
    report_fn.assert_called_once_with("/srv/dockermpi", job_root="/var/lib/dockermpi/jobs",
                                      probe_timeout=0.5)


def test_nothing_changed_sends_only_a_heartbeat_each_second(report_fn, clock):
    reporter = _reporter(report_fn, clock, heartbeat=1)
    first = reporter.next_event()
    clock.now += 0.4
    assert reporter.next_event() is None  # nothing new, and the last event is recent
    clock.now += 0.7
    report_fn.return_value = dict(_report({}), time=5.0)  # only the time differs
    kind, data = reporter.next_event()
    assert kind == "alive" and data["digest"] == first[1]["report"]["digest"]


def test_a_change_is_sent_at_once(report_fn, clock):
    reporter = _reporter(report_fn, clock)
    reporter.next_event()
    clock.now += 0.1
    report_fn.return_value = _report({JOB: {}})
    kind, data = reporter.next_event()
    assert kind == "report" and JOB in data["report"]["jobs"]


def test_the_full_report_is_repeated_every_refresh(report_fn, clock):
    reporter = _reporter(report_fn, clock, refresh=10, heartbeat=1)
    kinds = []
    for _ in range(25):
        event = reporter.next_event()
        kinds.append(event[0] if event else None)
        clock.now += 1
    assert kinds.count("report") == 3 and kinds.count("alive") == 22


def test_a_failing_report_still_sends_the_heartbeat_with_the_error(report_fn, clock):
    report_fn.side_effect = RecursionError("maximum recursion depth exceeded")
    kind, data = _reporter(report_fn, clock).next_event()
    assert kind == "report" and data["report"]["jobs"] == {}
    assert data["report"]["error"] == "RecursionError: maximum recursion depth exceeded"


def test_a_report_of_the_wrong_shape_is_an_error_not_a_crash(report_fn, clock):
    report_fn.return_value = {"engine": "ok", "jobs": ["not", "a", "dict"]}
    kind, data = _reporter(report_fn, clock).next_event()
    assert kind == "report" and "error" in data["report"]


def test_a_peer_is_unreachable_after_two_failed_probes_in_a_row(report_fn, clock):
    seen = _unreachable(
        [
            _report({JOB: {PEER: True, PEER2: True}}),
            _report({JOB: {PEER: False, PEER2: True}}),
            _report({JOB: {PEER: False, PEER2: True}}),
            _report({JOB: {PEER: False, PEER2: False}}),
        ],
        report_fn, clock,
    )
    assert seen == [{JOB: []}, {JOB: []}, {JOB: [PEER]}, {JOB: [PEER]}]


def test_one_good_probe_resets_the_count(report_fn, clock):
    seen = _unreachable(
        [
            _report({JOB: {PEER: False}}),
            _report({JOB: {PEER: False}}),
            _report({JOB: {PEER: True}}),
            _report({JOB: {PEER: False}}),
            _report({JOB: {PEER: False}}),
        ],
        report_fn, clock,
    )
    assert seen == [{JOB: []}, {JOB: [PEER]}, {JOB: []}, {JOB: []}, {JOB: [PEER]}]


def test_counts_are_per_job(report_fn, clock):
    seen = _unreachable(
        [
            _report({JOB: {PEER: False}}),
            _report({JOB: {PEER: False}, OTHER_JOB: {PEER: False}}),
            _report({OTHER_JOB: {PEER: False}}),
        ],
        report_fn, clock,
    )
    assert seen == [{JOB: []}, {JOB: [PEER], OTHER_JOB: []}, {OTHER_JOB: [PEER]}]


def test_a_peer_not_probed_loses_its_count(report_fn, clock):
    # The job's containers stopped running (no probes), then it is probed again.
    seen = _unreachable(
        [_report({JOB: {PEER: False}}), _report({JOB: {}}), _report({JOB: {PEER: False}})],
        report_fn, clock,
    )
    assert seen == [{JOB: []}, {JOB: []}, {JOB: []}]


def test_a_peer_that_failed_a_probe_is_a_suspect_until_settled(report_fn, clock):
    # A suspect makes the engine look again at once instead of an interval later.
    reporter = _reporter(report_fn, clock)
    suspects = []
    for peers in ({PEER: True}, {PEER: False}, {PEER: False}, {PEER: False}, {PEER: True},
                  {PEER: False}, {}):
        report_fn.return_value = _report({JOB: peers})
        reporter.evidence()
        suspects.append(reporter.suspects())
    assert suspects == [False, True, False, False, False, True, False]


def test_failures_is_configurable(report_fn, clock):
    seen = _unreachable([_report({JOB: {PEER: False}})] * 3, report_fn, clock, failures=3)
    assert seen == [{JOB: []}, {JOB: []}, {JOB: [PEER]}]


# ---------------------------------------------------------------------------- health

HEALTHY = {"docker": "ok", "storage": "ok", "images": ["r@sha256:" + "a" * 64],
           "job_ca": "ok", "agent": "ok", "job_ca_public": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeJobCaPublicKeyForTestsOnly0000000000000"}


def _health_reporter(report_fn, clock, results):
    health_fn = MagicMock(side_effect=results)
    reporter = mpi_node.Reporter(mpi_node.check_config(dict(CONFIG, health=10)), report_fn,
                                 clock, health_fn=health_fn)
    return reporter, health_fn


def test_health_goes_with_every_report_but_is_looked_at_only_every_health_seconds(
        report_fn, clock):
    reporter, health_fn = _health_reporter(report_fn, clock, [HEALTHY, HEALTHY])
    kind, data = reporter.next_event()
    assert kind == "report" and data["report"]["health"] == HEALTHY
    for _ in range(9):
        clock.now += 1
        reporter.next_event()
    assert health_fn.call_count == 1
    health_fn.assert_called_with("/srv/dockermpi", engine_timeout=2)
    clock.now += 1
    kind, data = reporter.next_event()
    assert health_fn.call_count == 2
    assert kind == "report"  # the refresh: health unchanged keeps the same fingerprint
    assert data["report"]["digest"] == mpi_node.fingerprint(data["report"])


def test_a_change_of_health_is_a_new_report_at_once_when_the_images_change(report_fn, clock):
    pulled = dict(HEALTHY, images=HEALTHY["images"] + ["r@sha256:" + "b" * 64])
    report_fn.side_effect = lambda *args, **kwargs: _report({})  # a new dict each look
    reporter, health_fn = _health_reporter(report_fn, clock, [HEALTHY, pulled])
    first = reporter.next_event()
    clock.now += 0.5
    reporter.health_due.set()  # Docker said: an image was pulled
    kind, data = reporter.next_event()
    assert kind == "report" and data["report"]["health"] == pulled
    assert data["report"]["digest"] != first[1]["report"]["digest"]


def test_a_failing_health_check_is_reported_not_raised(report_fn, clock):
    reporter, _ = _health_reporter(report_fn, clock, [OSError("boom")])
    kind, data = reporter.next_event()
    assert data["report"]["health"]["storage"] == "unknown"
    assert "boom" in data["report"]["health"]["error"]
