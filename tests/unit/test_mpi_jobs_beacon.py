"""
Unit tests of the ``mpi_jobs`` beacon: configuration checks, the event it returns and
how it turns single probe results into ``unreachable_peers`` (only after consecutive
failures). ``mpi_job.report`` is replaced by a scripted sequence of reports; the report
itself is tested in test_mpi_job_report.py and on the cluster.
"""

from unittest.mock import MagicMock

import pytest
from tests.extension import load_extension




mpi_jobs = load_extension("_beacons/mpi_jobs.py", "mpi_jobs_beacon")

JOB = "20261130-120000-abcdef"
OTHER_JOB = "20261130-120001-012345"
PEER = "10.0.0.12"
PEER2 = "10.0.0.13"
CONFIG = [
    {"storage_path": "/srv/dockermpi"},
    {"job_root": "/var/lib/dockermpi/jobs"},
    {"interval": 1},
]


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


@pytest.fixture
def report_fn():
    return MagicMock(return_value=_report({}))


@pytest.fixture
def configure_loader_modules(report_fn):
    return {mpi_jobs: {"__salt__": {"mpi_job.report": report_fn}, "__context__": {}}}


def _unreachable(reports, report_fn, config=CONFIG):
    """Run the beacon once per report; [{job: unreachable_peers}] per call."""
    seen = []
    for report in reports:
        report_fn.return_value = report
        events = mpi_jobs.beacon(config)
        assert len(events) == 1
        seen.append({job: data["unreachable_peers"] for job, data in events[0]["jobs"].items()})
    return seen


def test_valid_config_passes():
    assert mpi_jobs.validate(CONFIG) == (True, "valid beacon configuration")


@pytest.mark.parametrize(
    "config, why",
    [
        ({"storage_path": "/srv"}, "must be a list"),
        ([{"job_root": "/var/lib/dockermpi/jobs"}], "storage_path"),
        ([{"storage_path": "srv/dockermpi"}], "storage_path"),
        ([{"storage_path": "/srv"}, {"job_root": "jobs"}], "job_root"),
        ([{"storage_path": "/srv"}, {"probe_timeout": -1}], "probe_timeout"),
        ([{"storage_path": "/srv"}, {"failures": 0}], "failures"),
        (["storage_path"], "list of dicts"),
    ],
)
def test_bad_config_is_refused_with_a_reason(config, why):
    valid, message = mpi_jobs.validate(config)
    assert valid is False
    assert why in message


def test_validate_needs_the_execution_module():
    mpi_jobs.__salt__.pop("mpi_job.report")
    valid, message = mpi_jobs.validate(CONFIG)
    assert valid is False
    assert "mpi_job" in message


def test_one_event_tagged_report_carries_the_report(report_fn):
    report_fn.return_value = _report({JOB: {PEER: True}}, engine="boom")
    events = mpi_jobs.beacon(CONFIG)
    assert events == [
        {
            "tag": "report",
            "engine": "boom",
            "time": 1.0,
            "jobs": {
                JOB: {
                    **_report({JOB: {PEER: True}})["jobs"][JOB],
                    "unreachable_peers": [],
                }
            },
        }
    ]
    report_fn.assert_called_once_with(
        "/srv/dockermpi",
        job_root="/var/lib/dockermpi/jobs",
        probe_timeout=0.5,
    )


def test_defaults_fill_missing_keys(report_fn):
    mpi_jobs.beacon([{"storage_path": "/data"}])
    report_fn.assert_called_once_with(
        "/data", job_root="/var/lib/dockermpi/jobs", probe_timeout=0.5
    )


def test_a_failing_report_still_sends_the_heartbeat_with_the_error(report_fn):
    report_fn.side_effect = RecursionError("maximum recursion depth exceeded")
    events = mpi_jobs.beacon(CONFIG)
    assert len(events) == 1 and events[0]["tag"] == "report" and events[0]["jobs"] == {}
    assert events[0]["error"] == "RecursionError: maximum recursion depth exceeded"


def test_a_peer_is_unreachable_after_two_failed_probes_in_a_row(report_fn):
    seen = _unreachable(
        [
            _report({JOB: {PEER: True, PEER2: True}}),
            _report({JOB: {PEER: False, PEER2: True}}),
            _report({JOB: {PEER: False, PEER2: True}}),
            _report({JOB: {PEER: False, PEER2: False}}),
        ],
        report_fn,
    )
    assert seen == [{JOB: []}, {JOB: []}, {JOB: [PEER]}, {JOB: [PEER]}]


def test_one_good_probe_resets_the_count(report_fn):
    seen = _unreachable(
        [
            _report({JOB: {PEER: False}}),
            _report({JOB: {PEER: False}}),
            _report({JOB: {PEER: True}}),
            _report({JOB: {PEER: False}}),
            _report({JOB: {PEER: False}}),
        ],
        report_fn,
    )
    assert seen == [{JOB: []}, {JOB: [PEER]}, {JOB: []}, {JOB: []}, {JOB: [PEER]}]


def test_counts_are_per_job(report_fn):
    seen = _unreachable(
        [
            _report({JOB: {PEER: False}}),
            _report({JOB: {PEER: False}, OTHER_JOB: {PEER: False}}),
            _report({OTHER_JOB: {PEER: False}}),
        ],
        report_fn,
    )
    assert seen == [{JOB: []}, {JOB: [PEER], OTHER_JOB: []}, {OTHER_JOB: [PEER]}]


def test_a_peer_not_probed_loses_its_count(report_fn):
    # The job's containers stopped running (no probes), then it is probed again.
    seen = _unreachable(
        [
            _report({JOB: {PEER: False}}),
            _report({JOB: {}}),
            _report({JOB: {PEER: False}}),
        ],
        report_fn,
    )
    assert seen == [{JOB: []}, {JOB: []}, {JOB: []}]


def test_failures_is_configurable(report_fn):
    config = CONFIG + [{"failures": 3}]
    seen = _unreachable([_report({JOB: {PEER: False}})] * 3, report_fn, config)
    assert seen == [{JOB: []}, {JOB: []}, {JOB: [PEER]}]
