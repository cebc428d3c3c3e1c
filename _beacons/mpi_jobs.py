"""
Fire this node's evidence about every DockerMPI job as an event, every interval.

Each call returns one event, tagged ``salt/beacon/<minion id>/mpi_jobs/report`` on the
master, holding :func:`mpi_job.report <_modules.mpi_job.report>` (Docker engine health,
each job's containers, launcher exit code and failed rank, and whether this node
reaches the job's other containers), plus, per job, ``unreachable_peers``: the peers
that failed the last ``failures`` probes in a row (one failed probe is not yet a
partition). The event is also the node's heartbeat: the master reads silence as a lost
node, so nothing may stop it: when building the report fails for any reason, the event
still goes out, saying so in ``error`` (jobs are then judged by the master's other
evidence, not failed for it).

Configuration (``interval: 1`` keeps the master within about two seconds of the node):

.. code-block:: yaml

    beacons:
      mpi_jobs:
        - storage_path: /srv/dockermpi
        - job_root: /var/lib/dockermpi/jobs
        - interval: 1

Optional keys: ``probe_timeout`` (seconds per TCP probe, default 0.5; probes run in
parallel, so a dropped peer costs at most this once per interval) and ``failures``
(consecutive failed probes before a peer is unreachable, default 2).

:depends: the ``mpi_job`` execution module
"""

import logging
import os
import time

import salt.utils.beacons

log = logging.getLogger(__name__)

__virtualname__ = "mpi_jobs"

DEFAULTS = {
    "job_root": "/var/lib/dockermpi/jobs",
    "probe_timeout": 0.5,
    "failures": 2,
}
_CONTEXT_KEY = "mpi_jobs.probe_failures"


def __virtual__():
    return __virtualname__


def _config(config):
    merged = salt.utils.beacons.list_to_dict(config)
    return {**DEFAULTS, **{k: v for k, v in merged.items() if v is not None}}


def validate(config):
    """Check the beacon configuration: a list of one-key dicts."""
    if not isinstance(config, list):
        return False, "mpi_jobs beacon configuration must be a list"
    if not all(isinstance(item, dict) for item in config):
        return False, "mpi_jobs beacon configuration must be a list of dicts"
    if "mpi_job.report" not in __salt__:
        return False, "mpi_jobs beacon needs the mpi_job execution module (saltutil.sync_all)"
    conf = _config(config)
    for key in ("storage_path", "job_root"):
        value = conf.get(key)
        if not isinstance(value, str) or not os.path.isabs(value):
            return False, f"mpi_jobs beacon needs an absolute path in {key}, got {value!r}"
    try:
        if float(conf["probe_timeout"]) <= 0:
            raise ValueError
    except (TypeError, ValueError):
        return False, "mpi_jobs beacon: probe_timeout must be a positive number"
    if isinstance(conf["failures"], bool) or not isinstance(conf["failures"], int) or \
            conf["failures"] < 1:
        return False, "mpi_jobs beacon: failures must be a positive integer"
    return True, "valid beacon configuration"


def beacon(config):
    """
    Return one event: ``{"tag": "report", **mpi_job.report(...)}`` with
    ``unreachable_peers`` added to every job.
    """
    conf = _config(config)
    try:
        report = __salt__["mpi_job.report"](
            conf["storage_path"], job_root=conf["job_root"], probe_timeout=conf["probe_timeout"]
        )
    except Exception as exc:  # pylint: disable=broad-except
        # The heartbeat must go on whatever went wrong; the error travels with it.
        log.exception("mpi_jobs: the report failed")
        return [{"tag": "report", "engine": "ok", "jobs": {}, "time": time.time(),
                 "error": f"{type(exc).__name__}: {str(exc)[:500]}"}]
    previous = __context__.get(_CONTEXT_KEY, {})
    failures = {}
    for job_id, job in report["jobs"].items():
        for address, reachable in job.get("peers", {}).items():
            if not reachable:
                failures[(job_id, address)] = previous.get((job_id, address), 0) + 1
        job["unreachable_peers"] = sorted(
            address
            for address in job.get("peers", {})
            if failures.get((job_id, address), 0) >= conf["failures"]
        )
    # Only failures of this call survive: a success, or a job or peer gone, resets.
    __context__[_CONTEXT_KEY] = failures
    return [{"tag": "report", **report}]
