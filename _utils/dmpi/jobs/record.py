"""
A job's record: the fields a submit writes (:func:`new`), the fields the job controller
adds as the job goes on (:data:`ENGINE_FIELDS`), and what its user sees (:func:`public`).
The store keeps a record as it is, one JSON object per job.
"""

import posixpath

from dmpi.contract import DATA_MOUNT, JOBS_SUBDIR
from dmpi.launch import probe

#: Set by the job controller (and ``cancel_requested`` by ``mpi.cancel``), never by a submit:
#: where the ranks run and their addresses, when the job started, must end and ended,
#: that its clean-up is done, why its start failed, which silent nodes it is kept for.
ENGINE_FIELDS = ("placement", "job_addresses", "started", "deadline", "ended", "closed",
                 "start_error", "cancel_requested", "silent_nodes", "silences")

#: What only the master reads: the scheduling spec, the store's own column, and the
#: engine's notes that reach users as ``reason`` instead.
PRIVATE_FIELDS = ("spec", "cancel_requested", "start_error")

#: The site's settings a job keeps from its submit (``spec.config``).
CONFIG_KEYS = ("cluster_network", "job_network", "ports", "storage", "job_root",
               "slots_per_node", "limits")


def new(job_id, request, *, name, uid, image_ref, candidates, count, workdir, config, now,
        launch=None, origin=None):
    """
    The record of a job just queued: ``request`` as :func:`dmpi.jobs.request.validate_request`
    returns it, ``candidates`` the nodes it may use (None: any MPI node, as the queue finds
    them) and ``count`` how many of them, ``workdir`` as the submit named it (None or
    empty: the job's own directory), ``config`` the site's settings, ``launch`` what the
    image's probe says of its launch (:func:`dmpi.launch.probe.launch_of`), ``origin``
    the notebook and cell it came from (None: not from a notebook's cell).
    """
    job_dir = posixpath.join(config["storage"]["path"], "users", request["user"], JOBS_SUBDIR,
                             job_id)
    return {
        "job_id": job_id,
        "name": name,
        "origin": origin,
        "user": request["user"],
        "uid": uid,
        "image": request["image"],
        "np": request["np"],
        "cmd": request["program"],
        "walltime": request["walltime"],
        "state": "queued",
        "reason": None,
        "submitted": now,
        "history": [{"state": "queued", "at": now, "reason": None}],
        "output": {
            "dir": job_dir,
            "dir_in_job": posixpath.join(DATA_MOUNT, JOBS_SUBDIR, job_id),
            "stdout": posixpath.join(job_dir, "stdout"),
            "stderr": posixpath.join(job_dir, "stderr"),
            "status": posixpath.join(job_dir, "status.json"),
        },
        "timings": {},
        "spec": {
            "image_ref": image_ref,
            "candidates": candidates,
            "count": count,
            "per_node": request["slots_per_node"],
            "env": request["env"],
            # Concurrent jobs never share a default working directory: each gets its own.
            "workdir": request["workdir"] if workdir not in (None, "")
            else posixpath.join(DATA_MOUNT, JOBS_SUBDIR, job_id),
            "config": {k: config[k] for k in CONFIG_KEYS},
            "launch": launch or probe.launch_of(None),
        },
    }


def public(record, waiting=None, priorities=None, places=None):
    """The job record as users see it (no internal scheduling data). ``closed`` is true
    once the job's clean-up is done (containers gone, status.json written);
    ``waiting_for`` says why a queued job waits, from ``waiting`` (the controller's last
    plan: ``{job_id: reason}``), ``priority`` its fair-share priority and parts, from
    ``priorities`` (``{job_id: {"priority", "fairshare", "age"}}``; None under fifo), and
    ``queue_place`` its place in the scheduler's order (1: the next to start), from
    ``places`` (``{job_id: place}``)."""
    view = {k: v for k, v in record.items() if k not in PRIVATE_FIELDS}
    view["retcode"] = 0 if record["state"] == "succeeded" else 1
    view["closed"] = bool(record.get("closed"))
    if record["state"] == "queued":
        view["waiting_for"] = (waiting or {}).get(record["job_id"])
        view["priority"] = (priorities or {}).get(record["job_id"])
        view["queue_place"] = (places or {}).get(record["job_id"])
    return view
