"""
What a DockerMPI user may ask of the master: submit, wait, status, list, cancel, logs,
history, usage, whoami, images. This module is the whole of it: the ``mpi_api`` engine
serves :data:`CALLS` to JupyterHub users and nothing else; admin commands live in
:mod:`dmpi.master.admin_calls`, which the API does not import.

Every function takes the :class:`~dmpi.master.site.Site` and the :class:`Caller`. A hub
user acts as themselves only: they cannot name another user, and another user's job is
"no such job" to them, as a job that does not exist. An admin (``salt-run``) names
whom a job is for and sees every job.

Refusals raise :class:`~dmpi.errors.RequestError` (:class:`~dmpi.errors.NoSuchJob` for
a job the caller cannot see) and :class:`~dmpi.errors.ClusterError`.
"""

import dataclasses
import datetime
import posixpath
import re
import secrets
import time

import dmpi.settings
from dmpi.contract import (ACTIVE, DATA_MOUNT, FINAL, JOB_ID_RE, JOB_TAG_PREFIX, STATES,
                           UNENDED)
from dmpi.errors import ClusterError, NoSuchJob, RequestError
from dmpi.jobs import accounting, fairshare, sched
from dmpi.jobs import mpijob as mpi_operator
from dmpi.jobs import record as job_record
from dmpi.jobs import request as job_request
from dmpi.launch import probe as image_probe

CONTROLLER_SILENCE = 30  # seconds without a sign of the job controller before submit refuses
CANCEL_WAIT = 15  # seconds cancel waits for the job controller to end the job
MAX_TAIL = 16 << 20  # bytes of output one logs call returns at most
_JOB_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}\Z")
ORIGIN_PATH_CHARS = 512


@dataclasses.dataclass(frozen=True)
class Caller:
    """Who calls: a JupyterHub user (``identity``, their hub name, as the hub said
    through the API) or an admin (``identity`` None; ``name``, their login, is
    recorded where an admin's act is)."""

    identity: str = None
    name: str = None

    @property
    def is_admin(self):
        return self.identity is None

    def acting_user(self, user):
        """Whose job it is: an admin names the user; a hub user is themselves, whatever
        ``user`` says (and may not name anyone else)."""
        if self.is_admin:
            return user
        own = dmpi.settings.user_for_identity(self.identity)
        if user is not None and user not in (self.identity, own):
            raise RequestError(
                "user cannot be chosen: a hub user's jobs always run as themselves")
        return own


def hub_user(identity):
    """The caller for JupyterHub user ``identity``; RequestError when the hub name
    cannot be a DockerMPI user."""
    if not isinstance(identity, str) or not identity:
        raise RequestError("a hub user name is required")
    dmpi.settings.user_for_identity(identity)
    return Caller(identity=identity)


#: An admin on the master (``salt-run``, the job controller).
ADMIN = Caller()


# --------------------------------------------------------------------------- jobs


def submit(site, caller, user=None, image=None, np=None, cmd=None, nodes=None,
           slots_per_node=None, walltime=None, env=None, workdir=None, name=None,
           origin=None):
    """Validate a job and queue it; the job's public record (``state: queued``).
    Nothing is queued when it raises. Arguments as the ``mpi.launch`` runner's, and
    ``origin``: where the job came from, kept in its record (see :func:`job_origin`)."""
    user = caller.acting_user(user)
    job_name = _job_name(name)
    origin = job_origin(origin)
    all_nodes = site.mpi_nodes_required()
    store = site.store()
    _check_controller(store)
    config = site.node_settings(all_nodes[0])
    limits = config["limits"]
    request = job_request.validate_request(user, image, np, cmd, nodes, slots_per_node,
                                           walltime, env, workdir, limits)
    images = config.get("images") or {}
    if request["image"] not in images:
        raise RequestError(
            f"image {request['image']!r} is not approved; approved images: {sorted(images)}")
    found = image_facts(config, store.nodes(), request["image"])
    if found and found["why_no_jobs"]:
        raise RequestError(f"image {request['image']!r} cannot run jobs: "
                           f"{found['why_no_jobs']}")
    candidates, count = site.candidates(request["nodes"], all_nodes)
    one_node_only = (found or {}).get("why_one_node_only")
    if one_node_only:
        if count not in (None, 1):
            raise RequestError(f"image {request['image']!r} runs jobs on one node only: "
                               f"{one_node_only}; ask for nodes=1")
        count = 1
    node_slots = int(config["slots_per_node"])
    try:
        sched.place(request["np"], {n: node_slots for n in candidates},
                    count, request["slots_per_node"], node_slots)
    except ValueError as exc:
        why = (f"; image {request['image']!r} runs jobs on one node only: {one_node_only}"
               if one_node_only else "")
        raise RequestError(f"this job can never run: {exc} (each node has {node_slots} "
                           f"slots){why}") from None
    queued_limit = int(limits["max_queued_jobs_per_user"])
    queue_full = RequestError(
        f"user {request['user']} already has {queued_limit} jobs queued, the site's "
        "limit (mpi:limits:max_queued_jobs_per_user); wait for some to start")
    if queued_limit and len(store.jobs(["queued"], user=request["user"])) >= queued_limit:
        raise queue_full  # before a uid is given out; the insert checks again
    uid = site.user_uid(config, request["user"], identity=caller.identity)
    job_id = time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)
    record = job_record.new(
        job_id, request, name=job_name, uid=uid, image_ref=images[request["image"]],
        # None: any MPI node, as the queue finds them (not a copy of today's list).
        candidates=None if request["nodes"] is None or "count" in request["nodes"]
        else candidates,
        count=count, workdir=workdir, config=config, now=time.time(),
        launch=image_probe.launch_of(found), origin=origin)
    if not store.add(record, queued_limit=queued_limit):
        raise queue_full
    site.fire_job(job_id, "queued", {"user": request["user"]})
    return job_record.public(record)


def submit_mpijob(site, caller, mpijob=None, image=None, user=None):
    """Queue a Kubeflow MPI Operator job (``mpijob``: its YAML text or mapping) as a
    DockerMPI job (:mod:`dmpi.jobs.mpijob`), in ``image`` (an approved short name) when
    given, else in the approved image its manifest names by reference or digest, whose
    probed MPI must be its ``spec.mpiImplementation``; the job's public record. Nothing is queued when it raises."""
    config = site.node_settings(site.mpi_nodes_required()[0])
    seen = site.store().nodes()

    def flavour_of(name):
        return (((image_facts(config, seen, name) or {}).get("mpi")) or {}).get("flavour")

    request = mpi_operator.to_request(mpijob, config.get("images") or {}, config["limits"],
                                      image=image, flavour_of=flavour_of)
    return submit(site, caller, user=user, **request)


def wait(site, caller, job_id, timeout=None):
    """The job's public record once its state is final (``closed`` becomes true a moment
    later, once its containers are gone and status.json is written), or as it is when
    ``timeout`` seconds passed."""
    store = site.store()
    known_job(store, caller, job_id)
    deadline = None if timeout is None else time.monotonic() + float(timeout)
    with site.job_events() as bus:
        bus.subscribe(f"{JOB_TAG_PREFIX}{job_id}/")
        while True:
            record = store.get(job_id)
            if record["state"] in FINAL or (deadline and time.monotonic() > deadline):
                return public(store, record)
            # Events make this prompt; reading the store each second makes it certain.
            bus.get_event(wait=1, tag=f"{JOB_TAG_PREFIX}{job_id}/", match_type="startswith")


def status(site, caller, job_id):
    """The job's public record, with the history of its states."""
    store = site.store()
    return public(store, known_job(store, caller, job_id))


def list_jobs(site, caller, user=None, state=None, limit=None, after=None):
    """The caller's jobs (an admin's: every user's, or ``user``'s), oldest first: id,
    name, user, state, np, placement, times, reason, and why a queued job waits, its
    priority and its place in the queue. ``limit`` and ``after`` (a job id) page through
    them: at most ``limit`` jobs submitted after that one."""
    user = caller.acting_user(user)
    states = job_states(state)
    keys = ("job_id", "name", "user", "state", "np", "placement", "submitted", "started",
            "ended", "reason")
    store = site.store()
    found = store.jobs(states, user=user, keys=keys, after=_after(store, caller, after),
                       limit=_limit(limit))
    # Why queued jobs wait and their priority, as the controller last planned: read only
    # when one is listed.
    queued = any(r["state"] == "queued" for r in found)
    waiting = store.get_meta("waiting", {}) if queued else {}
    priorities = store.get_meta("priorities", {}) if queued else {}
    places = store.get_meta("queue_places", {}) if queued else {}
    return [dict(r, waiting_for=waiting.get(r["job_id"]) if r["state"] == "queued" else None,
                 priority=priorities.get(r["job_id"]) if r["state"] == "queued" else None,
                 queue_place=places.get(r["job_id"]) if r["state"] == "queued" else None)
            for r in found]


def cancel(site, caller, job_id, reason="cancelled by request"):
    """Ask the job controller to end a job and wait (a while) for it to; the record."""
    store = site.store()
    record = known_job(store, caller, job_id)
    if record["state"] in FINAL:
        return dict(public(store, record), note=f"job had already ended ({record['state']})")
    store.update(job_id, cancel_requested=str(reason)[:200])
    site.fire_job(job_id, "cancel")
    ended = wait(site, caller, job_id, timeout=CANCEL_WAIT)
    if ended.get("state") not in FINAL:
        ended["note"] = "cancel requested; the job controller has not ended the job yet"
    return ended


def logs(site, caller, job_id, stream="stdout", tail=65536, offset=None):
    """The end of a job's output (at most ``tail`` bytes), read on one of the nodes; with
    ``offset``, ``{"data": text, "offset": n}`` from byte ``offset`` on."""
    if stream not in ("stdout", "stderr"):
        raise RequestError("stream must be stdout or stderr")
    store = site.store()
    record = known_job(store, caller, job_id)
    alive = site.alive()
    readers = [n for n in record.get("placement") or {} if n in alive] or sorted(alive)
    if not readers:
        raise ClusterError("no MPI node is reporting; cannot read shared storage")
    config = record["spec"]["config"]
    sealed = site.call(readers[:1], "mpi_job.read_output", timeout=15,
                       job_id=job_id, storage_path=config["storage"]["path"],
                       user=record["user"], uid=record["uid"], gid=record["uid"],
                       stream=stream, tail_bytes=_tail_bytes(tail), offset=_offset(offset),
                       seal=True)[readers[0]]
    return site.opened(sealed, readers[0])


def history(site, caller, user=None, since=None, until=None, state=None, format=None,  # pylint: disable=redefined-builtin
            limit=None, after=None):
    """Ended jobs with what they used (``dmpi.jobs.accounting``), oldest first (in
    submission order): rows, or with ``format=csv`` one CSV text. ``limit`` and
    ``after`` (a job id) page through them as :func:`list_jobs`'s do."""
    if format not in (None, "json", "csv"):
        raise RequestError("format must be json or csv")
    _, _, rows = _ended_rows(site, caller, user, since, until, state, limit, after)
    return accounting.to_csv(rows) if format == "csv" else rows


def usage(site, caller, user=None, since=None, until=None):
    """Usage per user and in total over the jobs that ended in the window; without
    ``until``, jobs queued or running now are counted too, and ``fair_share`` gives
    each user's decayed usage and fair-share factor now."""
    user, end, rows = _ended_rows(site, caller, user, since, until, None)
    if end is not None:
        return accounting.usage(rows)
    store = site.store()
    active = store.jobs(UNENDED, user=user)
    found = accounting.usage(rows, active)
    found["fair_share"] = fair_share_now(store, time.time(), user)
    storage = storage_now(site, user)
    if storage is not None:
        found["storage"] = storage
    return found


def storage_now(site, user=None):
    """Each user's directory against its quota now (``bytes_used``, ``bytes_limit``,
    ``files_used``, ``files_limit``; a limit of 0: none), or only ``user``'s; None when
    the storage type has no quotas, ``{"error": why}`` when the storage does not
    answer (the rest of the usage is still shown)."""
    try:
        found = site.storage_usage(site.settings())
    except ClusterError as exc:
        return {"error": f"the storage's quota figures are not available: {exc}"}
    if found is None:
        return None
    return found if user is None else {u: v for u, v in found.items() if u == user}


def fair_share_now(store, now, user=None):
    """Each user's decayed usage and fair-share factor at ``now``
    (:func:`dmpi.jobs.fairshare.report`), or only ``user``'s. Every user's usage counts
    in each factor, so all of them are read."""
    config = (store.get_meta("site") or {}).get("config") or {}
    settings = fairshare.settings(config.get("fair_share"))
    running = store.jobs(list(ACTIVE), keys=("user", "np", "started"))
    waiting = {record["user"] for record in store.jobs(["queued"], keys=("user",))}
    used = fairshare.usage(store.get_meta("fair_usage", {}), running, now,
                           settings["half_life"])
    found = fairshare.report(used, waiting)
    return found if user is None else {u: v for u, v in found.items() if u == user}


def whoami(site, caller):
    """For a hub user: their hub name, DockerMPI user, uid and directory, made on first
    use. For an admin: ``{"admin": true, "caller": name}``."""
    if caller.is_admin:
        return {"admin": True, "caller": caller.name}
    user = caller.acting_user(None)
    config = site.settings()
    uid = site.user_uid(config, user, identity=caller.identity)
    return {"user": caller.identity, "account": user, "uid": uid, "gid": uid,
            "dir": posixpath.join(config["storage"]["path"], "users", user),
            "dir_in_job": DATA_MOUNT}


def images(site, caller):  # pylint: disable=unused-argument
    """The approved images (pillar ``mpi:images``) by short name: the reference each is
    pinned to and what the nodes' probe found in it (MPI flavour, version and launcher,
    python3, mpi4py, ssh server, OS and C library), whether jobs can run on it and why
    not, and why its jobs keep to one node when they must. ``probed_on`` is empty until a
    node has probed the image."""
    config = site.settings()
    approved = config.get("images") or {}
    seen = site.store().nodes()
    listed = []
    for name in sorted(approved):
        found = image_facts(config, seen, name) or {}
        mpi = found.get("mpi") or {}
        listed.append({
            "name": name, "reference": approved[name],
            "runs_jobs": None if not found else not found["why_no_jobs"],
            "why_no_jobs": found.get("why_no_jobs"),
            "why_one_node_only": found.get("why_one_node_only"),
            "mpi": image_probe.describe(found) if found else None,
            "flavour": mpi.get("flavour"), "mpi_version": mpi.get("version"),
            "launcher": mpi.get("launcher"), "python3": found.get("python3"),
            "python_version": found.get("python_version"), "mpi4py": found.get("mpi4py"),
            "sshd": (found.get("commands") or {}).get("sshd"), "os": found.get("os"),
            "glibc": found.get("glibc"), "probed_on": found.get("probed_on", []),
            "mpi_from_pillar": found.get("mpi_from_pillar", False)})
    return {"images": listed}


def image_facts(config, seen, name):
    """What the nodes' probe found in the approved image ``name`` (``seen``: the job
    store's node records, whose health reports carry the facts), with pillar
    ``mpi:image_facts:<name>`` in place of the probe's MPI, ``why_no_jobs`` worked out
    again and ``probed_on`` the nodes that probed it; None when none has."""
    reference = (config.get("images") or {}).get(name)
    probed_on, found = [], None
    for node in sorted(seen):
        health = ((seen[node] or {}).get("report") or {}).get("health") or {}
        facts = (health.get("image_facts") or {}).get(reference)
        if isinstance(facts, dict):
            probed_on.append(node)
            found = found or facts
    if found is None:
        return None
    found = dict(found, probed_on=probed_on, mpi_from_pillar=False)
    override = (config.get("image_facts") or {}).get(name)
    if override:
        found["mpi"] = dict(found.get("mpi") or {}, **override)
        found["mpi_from_pillar"] = True
    found["why_no_jobs"] = image_probe.why_no_jobs(found)
    found["why_one_node_only"] = image_probe.why_one_node_only(found)
    return found


#: The calls the user API serves, by the name it serves them under.
CALLS = {"submit": submit, "submit_mpijob": submit_mpijob, "wait": wait, "status": status,
         "list": list_jobs, "cancel": cancel, "logs": logs, "history": history, "usage": usage,
         "whoami": whoami, "images": images}


# ------------------------------------------------------------------------ helpers


def known_job(store, caller, job_id):
    """The record of an existing job the caller may see (a hub user sees only their
    own); NoSuchJob for any other, as for a job that does not exist."""
    if not isinstance(job_id, str) or not JOB_ID_RE.match(job_id):
        raise RequestError(f"{str(job_id)[:40]!r} is not a job id (YYYYMMDD-HHMMSS-xxxxxx)")
    record = store.get(job_id)
    if record is not None and not caller.is_admin \
            and record["user"] != caller.acting_user(None):
        record = None
    if record is None:
        raise NoSuchJob(f"no such job: {job_id}")
    return record


def public(store, record):
    """What callers see of a job (``dmpi.jobs.record.public``), with why it waits when
    it is queued."""
    if record["state"] != "queued":
        return job_record.public(record)
    return job_record.public(record, store.get_meta("waiting", {}),
                             store.get_meta("priorities", {}),
                             store.get_meta("queue_places", {}))


def job_states(state):
    """The job states a ``state`` argument names (None: all)."""
    if not state:
        return None
    states = [s.strip() for s in (state if isinstance(state, list) else str(state).split(","))]
    unknown = sorted(set(states) - set(STATES))
    if unknown:
        raise RequestError(f"unknown job states: {str(unknown)[:200]}")
    return states


def _check_controller(store):
    """Submitting needs the job controller running on the master."""
    seen = (store.get_meta("engine") or {}).get("pid_alive", 0)
    if time.time() - seen > CONTROLLER_SILENCE:
        raise ClusterError(
            "the DockerMPI job controller is not running on the master (master config: "
            "engines: [mpi_master: {}], then restart salt-master); nothing was queued")


def _job_name(name):
    if name is None:
        return None
    if not isinstance(name, str) or not _JOB_NAME_RE.match(name):
        raise RequestError(
            f"name {str(name)[:60]!r} is not a job name: letters, digits, '.', '_', '+' "
            "and '-', starting with a letter or digit, at most 64 characters")
    return name


def job_origin(origin):
    """``origin`` checked: None, or ``{"notebook": path, "cell": number}`` (either may be
    left out) naming the notebook and the cell a job came from. The path is printable
    text of at most ORIGIN_PATH_CHARS characters: records reach admins' terminals."""
    if origin is None:
        return None
    if not isinstance(origin, dict) or not origin or set(origin) - {"notebook", "cell"}:
        raise RequestError(f"origin {str(origin)[:80]!r} must map notebook (a path) and "
                           "cell (a number) to their values")
    notebook, cell = origin.get("notebook"), origin.get("cell")
    if notebook is not None and not (
            isinstance(notebook, str) and 0 < len(notebook) <= ORIGIN_PATH_CHARS
            and notebook.isprintable()):
        raise RequestError(f"origin's notebook {str(notebook)[:80]!r} is not a path of at "
                           f"most {ORIGIN_PATH_CHARS} printable characters")
    if cell is not None and (isinstance(cell, bool) or not isinstance(cell, int)
                             or not 0 <= cell < 10**9):
        raise RequestError(f"origin's cell {str(cell)[:20]!r} is not a cell number")
    return {key: value for key, value in (("notebook", notebook), ("cell", cell))
            if value is not None}


def _offset(offset):
    if offset is None:
        return None
    try:
        offset = int(offset)
    except (TypeError, ValueError, OverflowError):
        raise RequestError(f"offset must be a byte offset, got {str(offset)[:40]!r}") from None
    if not 0 <= offset < 1 << 62:
        raise RequestError("offset must be a byte offset, 0 or more")
    return offset


def _tail_bytes(tail):
    try:
        tail = int(tail)
    except (TypeError, ValueError, OverflowError):
        raise RequestError(f"tail must be a number of bytes, got {str(tail)[:40]!r}") from None
    if not 1 <= tail <= MAX_TAIL:
        raise RequestError("tail must be between 1 byte and 16 MiB")
    return tail


def _ended_rows(site, caller, user, since, until, state, limit=None, after=None):
    """(user, end of the window, history rows) of the caller's ended jobs in the
    window (``dmpi.jobs.accounting``), paged as :func:`list_jobs` says."""
    user = caller.acting_user(user)
    start, end = moment(since, "since"), moment(until, "until")
    states = job_states(state) or list(FINAL)
    if set(states) - set(FINAL):
        raise RequestError(f"history holds ended jobs only: {', '.join(FINAL)}")
    store = site.store()
    # Only the fields a row needs, of the jobs that ended in the window.
    records = store.jobs(states, user=user, keys=accounting.RECORD_FIELDS,
                         ended_in=(start, end), after=_after(store, caller, after),
                         limit=_limit(limit))
    return user, end, [accounting.history_row(record) for record in records]


def _limit(limit):
    """A page's ``limit`` as a whole number of jobs (None: no limit)."""
    if limit is None:
        return None
    try:
        number = int(limit) if not isinstance(limit, (bool, float)) else None
    except (TypeError, ValueError):
        number = None
    if number is None or number < 1:
        raise RequestError(f"limit must be a whole number of jobs, at least 1; got "
                           f"{str(limit)[:40]!r}")
    return number


def _after(store, caller, after):
    """The place in submission order of the job a page starts after (None: the
    first page); a job the caller cannot see is no such job."""
    if after is None:
        return None
    return store.seq_of(known_job(store, caller, after)["job_id"])


def moment(value, what):
    """Epoch seconds from ``value``: a number, or an ISO date/time (UTC unless it says)."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    try:
        when = datetime.datetime.fromisoformat(str(value)[:40])
    except ValueError:
        raise RequestError(
            f"{what} must be a date like 2026-12-01 or 2026-12-01T14:30, got "
            f"{str(value)[:40]!r}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return when.timestamp()
