"""Unit tests of ``dmpi.jobs.record``: a new job's record and what its user sees of it."""

import pytest

from dmpi.jobs import record as job_record
from dmpi.jobs import store as job_store

CONFIG = {"cluster_network": "10.0.0.0/16", "job_network": {"name": "dmpi-jobs"},
          "ports": {}, "storage": {"path": "/srv/dockermpi"}, "job_root": "/var/lib/jobs",
          "slots_per_node": 2, "limits": {}, "images": {"mpi": "ref"}}
REQUEST = {"user": "alice", "image": "mpi", "np": 4, "program": ["hostname"],
           "walltime": 60, "slots_per_node": None, "env": {}, "workdir": None, "nodes": None}
JOB = "20261204-010000-abcdef"


def _new(**changed):
    args = dict(name="run", uid=100000, image_ref="ref", candidates=None, count=None,
                workdir=None, config=CONFIG, now=5.0)
    args.update(changed)
    return job_record.new(JOB, REQUEST, **args)


def test_a_new_record_is_queued_with_its_output_under_the_users_directory():
    record = _new()
    assert record["state"] == "queued" and record["submitted"] == 5.0
    assert record["history"] == [{"state": "queued", "at": 5.0, "reason": None}]
    assert record["output"]["stdout"] == f"/srv/dockermpi/users/alice/mpi-jobs/{JOB}/stdout"
    assert record["output"]["dir_in_job"] == f"/data/mpi-jobs/{JOB}"
    assert set(record["spec"]["config"]) == set(job_record.CONFIG_KEYS)
    assert not set(record) & set(job_record.ENGINE_FIELDS)


@pytest.mark.parametrize("workdir", [None, ""])
def test_a_job_without_a_workdir_works_in_its_own_directory(workdir):
    assert _new(workdir=workdir)["spec"]["workdir"] == f"/data/mpi-jobs/{JOB}"


def test_a_named_workdir_is_the_checked_one():
    request = dict(REQUEST, workdir="/data/src")
    record = job_record.new(JOB, request, name=None, uid=1, image_ref="ref", candidates=None,
                            count=None, workdir="src", config=CONFIG, now=0.0)
    assert record["spec"]["workdir"] == "/data/src"


def test_the_public_view_hides_what_only_the_master_reads():
    record = dict(_new(), cancel_requested="admin", start_error="x")
    view = job_record.public(record, {JOB: "resources"})
    assert not set(view) & set(job_record.PRIVATE_FIELDS)
    assert view["waiting_for"] == "resources" and view["retcode"] == 1
    assert view["closed"] is False


def test_the_store_keeps_a_new_record_as_it_is(tmp_path):
    store = job_store.open_store(str(tmp_path / "jobs.sqlite"))
    record = _new()
    store.add(record)
    assert job_record.public(store.get(JOB)) == job_record.public(record)
