"""
Accounting over DockerMPI job records, like Slurm's ``sacct``/``sreport``: one row per
ended job and per-user usage. Pure functions of records and times; no Salt, no I/O.

Definitions (the ``mpi`` runner's ``history`` and ``usage`` use these only):

- ``elapsed``: ended - started, in seconds (0 for a job that never started);
- ``core_hours``: np x elapsed / 3600 (ranks, not CPUs: a rank is one slot);
- ``queue_wait``: started - submitted for a job that started; for one that ended while
  queued, ended - submitted (history shows it; usage's wait figures count started
  jobs only, as a wait that never ended in a start is not a queue wait).

:depends: none
"""

import csv
import io

from dmpi.contract import FINAL

HISTORY_FIELDS = ("job_id", "name", "user", "state", "exit_code", "reason", "np", "nodes",
                  "submitted", "started", "ended", "queue_wait", "elapsed", "core_hours")


#: The fields of a job's record :func:`history_row` reads: the store picks out only these.
RECORD_FIELDS = ("job_id", "name", "user", "state", "exit_code", "reason", "np", "placement",
                 "submitted", "started", "ended")


def history_row(record):
    """The accounting row of an ended job's record (its :data:`RECORD_FIELDS` are enough)."""
    ended = record.get("ended") or record.get("submitted")
    started = record.get("started")
    elapsed = round(ended - started, 3) if started else 0.0
    return {
        "job_id": record["job_id"], "name": record.get("name"), "user": record["user"],
        "state": record["state"], "exit_code": record.get("exit_code"),
        "reason": record.get("reason"), "np": record["np"],
        "nodes": sorted(record.get("placement") or {}),
        "submitted": record["submitted"], "started": started, "ended": ended,
        "queue_wait": round((started or ended) - record["submitted"], 3),
        "elapsed": elapsed, "core_hours": round(record["np"] * elapsed / 3600, 6),
    }


def _empty():
    return {"jobs": {state: 0 for state in FINAL}, "core_hours": 0.0, "elapsed": 0.0,
            "queue_wait_mean": None, "queue_wait_max": None, "_waits": []}


def _close(entry):
    waits = entry.pop("_waits")
    entry["jobs"]["total"] = sum(entry["jobs"].values())
    entry["core_hours"] = round(entry["core_hours"], 6)
    entry["elapsed"] = round(entry["elapsed"], 3)
    if waits:
        entry["queue_wait_mean"] = round(sum(waits) / len(waits), 3)
        entry["queue_wait_max"] = round(max(waits), 3)
    return entry


def usage(rows, active=()):
    """
    Per-user usage from history rows (ended jobs) and the records of jobs not ended yet:
    ``{"users": {user: entry}, "total": entry}``, each entry ``{"jobs": {state: count,
    ..., "total": n}, "core_hours", "elapsed", "queue_wait_mean", "queue_wait_max"}``.

    Ended jobs count by their final state with their core-hours and elapsed time; jobs
    in ``active`` (records queued, starting or running now) are counted as ``queued``
    or ``running`` only, using nothing yet.
    """
    users, total = {}, _empty()
    for row in rows:
        for entry in (users.setdefault(row["user"], _empty()), total):
            entry["jobs"][row["state"]] = entry["jobs"].get(row["state"], 0) + 1
            entry["core_hours"] += row["core_hours"]
            entry["elapsed"] += row["elapsed"]
            if row["started"]:
                entry["_waits"].append(row["queue_wait"])
    for record in active:
        state = "queued" if record["state"] == "queued" else "running"
        for entry in (users.setdefault(record["user"], _empty()), total):
            entry["jobs"][state] = entry["jobs"].get(state, 0) + 1
    return {"users": {user: _close(entry) for user, entry in sorted(users.items())},
            "total": _close(total)}


def to_csv(rows):
    """History rows as CSV text with a header line (nodes joined by ``,``)."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=HISTORY_FIELDS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow(dict(row, nodes=",".join(row["nodes"])))
    return out.getvalue()
