"""
Fair share, as Slurm's multifactor priority computes it with classic fair share: pure
functions of usage, queued jobs and times; no Salt, no I/O.

Usage is core-seconds (a rank is one slot: ranks x seconds running) decayed with a
half-life H: a core-second spent ``a`` seconds ago counts ``2 ** (-a / H)``. A job that
ran ``[s, e]`` at ``np`` ranks counts, seen at ``t``,
``np * H / ln 2 * (2 ** (-(t - e) / H) - 2 ** (-(t - s) / H))``.

Where ended jobs' usage lives: one decayed accumulator per user, ``{user: [value, as
of]}`` (:func:`add_job`, once per job when it ends), kept in the job store's meta in the
transaction that records the job's final state. An accumulator seen later only decays
(by ``2 ** (-(t - as of) / H)``), so it needs nothing else to survive a restart, and it
stays right when old job records are purged (``mpi:retention``), which rebuilding it
from ended records on each start would not; it costs one small write per ended job and
no scan of the job history. Running jobs are added as their usage accrues
(:func:`usage`), so a user whose first job just started already ranks below a user with
none. A user without running jobs whose decayed usage fell below :data:`NEGLIGIBLE`
counts as having none, so users long gone do not shrink everyone's share.

A queued job's priority is ``weight_fairshare * F + weight_age * A``:

- ``F = 2 ** (-U / S)``, the fair-share factor: ``U`` the user's share of all users'
  decayed usage (0 when nobody has any), ``S`` the user's normalized share, equal for
  every user with usage or queued jobs (``1 / their number``). A user with no usage
  has ``F = 1``; one who used exactly their share ``0.5``.
- ``A = min(wait / max_age, 1)``, the age factor: how long the job has waited.

Jobs are considered by priority, highest first (its exact value: the integer shown is
rounded), ties in submission order; EASY backfill (:func:`dmpi.jobs.sched.plan`) works
on that order.
"""

import math

from dmpi.jobs.request import parse_duration

#: The parts of a priority as ``mpi list`` and the API show them.
PARTS = ("priority", "fairshare", "age")
#: ``mpi:fair_share`` as ``salt/dockermpi/defaults.yaml`` has it (also for a site whose
#: settings in the store predate fair share).
DEFAULTS = {"half_life": "7d", "max_age": "7d", "weight_fairshare": 10000,
            "weight_age": 1000}
#: Decayed core-seconds below which a user counts as having no usage (about 12
#: half-lives after one core-hour): they leave the accumulator and the share count.
NEGLIGIBLE = 1.0


def settings(fair_share):
    """The pillar's ``mpi:fair_share`` (validated, or None) with the defaults, durations
    in seconds: ``{"half_life", "max_age", "weight_fairshare", "weight_age"}``."""
    given = dict(DEFAULTS, **(fair_share or {}))
    return {"half_life": parse_duration(given["half_life"], "mpi:fair_share:half_life"),
            "max_age": parse_duration(given["max_age"], "mpi:fair_share:max_age"),
            "weight_fairshare": given["weight_fairshare"], "weight_age": given["weight_age"]}


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
    """
    ``accumulated`` (``{user: [value, as of]}``) with an ended job's usage added: the
    user's entry is brought to ``ended`` (or stays at a later ``as of``, the job's usage
    decayed to it), and other users' entries that decayed below :data:`NEGLIGIBLE` by
    then are dropped. Returns a new mapping.
    """
    result = {}
    for name, (value, as_of) in accumulated.items():
        if name == user or value * _decay(ended - as_of, half_life) >= NEGLIGIBLE:
            result[name] = [value, as_of]
    value, as_of = result.get(user) or (0.0, ended)
    # Both parts seen at the later of the two times (a clock that stepped back can make
    # the kept figure newer than this job's end).
    seen = max(as_of, ended)
    result[user] = [value * _decay(seen - as_of, half_life)
                    + job_usage(np, started, ended, seen, half_life), seen]
    return result


def usage(accumulated, running, now, half_life):
    """``{user: decayed core-seconds at now}``: the ended jobs' (``accumulated``) and the
    running jobs' so far (``running``: records with ``user``, ``np`` and ``started``).
    Ended jobs' usage that decayed below :data:`NEGLIGIBLE` is left out; a running
    job's always counts, however little it has used yet."""
    found = {}
    for user, (value, as_of) in accumulated.items():
        value *= _decay(now - as_of, half_life)
        if value >= NEGLIGIBLE:
            found[user] = value
    for record in running:
        if record.get("started") is not None:
            found[record["user"]] = found.get(record["user"], 0.0) + job_usage(
                record["np"], record["started"], now, now, half_life)
    return found


def factors(used, users=()):
    """``{user: F}``, the fair-share factor ``2 ** (-U / S)`` of every user with usage
    (``used``: :func:`usage`) or in ``users`` (those with queued jobs)."""
    everyone = set(used) | set(users)
    total = sum(used.values())
    count = len(everyone) or 1
    return {user: 2.0 ** (-(used.get(user, 0.0) / total if total > 0 else 0.0) * count)
            for user in everyone}


def report(used, users=()):
    """``{user: {"decayed_core_hours", "fairshare"}}`` for ``mpi.usage`` (like Slurm's
    ``sshare``): each user's decayed usage (``used``: :func:`usage`) in core-hours and
    fair-share factor, for every user with usage or in ``users`` (queued jobs)."""
    return {user: {"decayed_core_hours": round(used.get(user, 0.0) / 3600, 6),
                   "fairshare": round(factor, 3)}
            for user, factor in sorted(factors(used, users).items())}


def priorities(queued, used, now, config):
    """
    ``{job id: {"priority": int, "fairshare": float, "age": float, "exact": float}}`` of
    the ``queued`` records (``job_id``, ``user``, ``submitted``), given each user's
    decayed usage ``used`` (:func:`usage`) and ``config`` (:func:`settings`:
    ``weight_fairshare``, ``weight_age``, ``max_age`` in seconds). ``priority`` is
    rounded, the factors to 3 decimals, as shown; ``exact`` orders the queue.
    """
    fair = factors(used, {record["user"] for record in queued})
    weight_fairshare, weight_age = config["weight_fairshare"], config["weight_age"]
    max_age = config["max_age"]
    found = {}
    for record in queued:
        fairshare = fair[record["user"]]
        age = min(max(now - record["submitted"], 0.0) / max_age, 1.0)
        exact = weight_fairshare * fairshare + weight_age * age
        found[record["job_id"]] = {"priority": int(round(exact)),
                                   "fairshare": round(fairshare, 3), "age": round(age, 3),
                                   "exact": exact}
    return found


def shown(found):
    """:func:`priorities` as ``mpi list`` and the API show them (without ``exact``)."""
    return {job_id: {part: parts[part] for part in PARTS} for job_id, parts in found.items()}


def order(queued, found):
    """``queued`` (in submission order) by priority, highest first; ties keep their
    order. ``found``: :func:`priorities` of them (keyed by ``job_id`` or ``id``)."""
    def key(item):
        index, job = item
        parts = found[job.get("job_id", job.get("id"))]
        return (-parts.get("exact", parts["priority"]), index)
    return [job for _, job in sorted(enumerate(queued), key=key)]
