"""
Fair share, as Slurm's multifactor priority computes it with classic fair share: pure
functions of usage, queued jobs and times; no Salt, no I/O.

Usage is core-seconds (a rank is one slot: ranks x seconds running) decayed with a
half-life H: a core-second spent ``a`` seconds ago counts ``2 ** (-a / H)``. The master
keeps, per user, the decayed usage of their ended jobs as ``[value, as of]``
(:func:`add_job`, once per job when it ends; it survives restarts in the job store), and
adds the usage of running jobs as it accrues (:func:`usage`), so a user whose first job
just started already ranks below a user with none.

A queued job's priority is ``weight_fairshare * F + weight_age * A``:

- ``F = 2 ** (-U / S)``, the fair-share factor: ``U`` the user's share of all users'
  decayed usage (0 when nobody has any), ``S`` the user's normalized share, equal for
  every user with usage or queued jobs (``1 / their number``). A user with no usage
  has ``F = 1``; one who used exactly their share ``0.5``.
- ``A = min(wait / max_age, 1)``, the age factor: how long the job has waited.

Jobs are considered by priority, highest first, ties in submission order; EASY backfill
(:func:`dmpi.jobs.sched.plan`) works on that order.
"""

import math


def _decay(age, half_life):
    return 2.0 ** (-max(age, 0.0) / half_life)


def job_usage(np, started, ended, now, half_life):
    """Decayed core-seconds, seen at ``now``, of ``np`` ranks that ran from ``started``
    to ``ended`` (the integral of ``np * 2 ** (-(now - t) / H)`` over the run)."""
    if started is None or ended <= started:
        return 0.0
    scale = half_life / math.log(2)
    return np * scale * (_decay(now - ended, half_life) - _decay(now - started, half_life))


def add_job(accumulated, user, np, started, ended, half_life):
    """``accumulated`` (``{user: [value, as of]}``) with an ended job's usage added, the
    user's entry brought to ``ended``. Returns a new mapping."""
    result = dict(accumulated)
    value, as_of = result.get(user) or (0.0, ended)
    # Both parts seen at the later of the two times (a clock that stepped back can make
    # the kept figure newer than this job's end).
    seen = max(as_of, ended)
    result[user] = [value * _decay(seen - as_of, half_life)
                    + job_usage(np, started, ended, seen, half_life), seen]
    return result


def usage(accumulated, running, now, half_life):
    """``{user: decayed core-seconds at now}``: the ended jobs' (``accumulated``) and the
    running jobs' so far (``running``: records with ``user``, ``np`` and ``started``)."""
    found = {user: value * _decay(now - as_of, half_life)
             for user, (value, as_of) in accumulated.items()}
    for record in running:
        if record.get("started") is not None:
            found[record["user"]] = found.get(record["user"], 0.0) + job_usage(
                record["np"], record["started"], now, now, half_life)
    return found


def priorities(queued, used, now, settings):
    """``{job id: {"priority": int, "fairshare": float, "age": float}}`` of the
    ``queued`` records (``job_id``, ``user``, ``submitted``), given each user's decayed
    usage ``used`` and ``settings`` (``weight_fairshare``, ``weight_age``, ``max_age``
    in seconds)."""
    users = set(used) | {record["user"] for record in queued}
    total = sum(used.values())
    share = 1.0 / len(users) if users else 1.0
    factors = {user: 2.0 ** (-((used.get(user, 0.0) / total) if total > 0 else 0.0) / share)
               for user in users}
    found = {}
    for record in queued:
        fairshare = factors[record["user"]]
        age = min(max(now - record["submitted"], 0.0) / settings["max_age"], 1.0)
        priority = settings["weight_fairshare"] * fairshare + settings["weight_age"] * age
        found[record["job_id"]] = {"priority": int(round(priority)),
                                   "fairshare": round(fairshare, 3), "age": round(age, 3)}
    return found


def order(queued, found):
    """``queued`` (in submission order) by priority, highest first; ties keep their
    order. ``found``: :func:`priorities` of them (keyed by ``job_id`` or ``id``)."""
    def key(item):
        index, job = item
        job_id = job.get("job_id", job.get("id"))
        return (-found[job_id]["priority"], index)
    return [job for _, job in sorted(enumerate(queued), key=key)]
