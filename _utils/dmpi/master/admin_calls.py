"""
What only a DockerMPI admin may do, from the master (``salt-run mpi.<name>``): see and
drain nodes, read the settings again, prune, back up and restore the job store, give
users their uids. Nothing here is reachable by users: the user API serves
:mod:`dmpi.master.user_calls` only.

Every function takes the :class:`~dmpi.master.site.Site`; refusals raise
:class:`~dmpi.errors.RequestError` and :class:`~dmpi.errors.ClusterError`.
"""

import copy
import datetime
import logging
import os
import posixpath
import time

from dmpi.contract import ACTIVE, UNENDED
from dmpi.errors import ClusterError, RequestError, StoreError
from dmpi.jobs import request as job_request
from dmpi.jobs import rules
from dmpi.master import selftest

log = logging.getLogger(__name__)


# -------------------------------------------------------------------------- nodes


def nodes(site):
    """Every MPI node: slots, used slots, running jobs, whether it reports, its health,
    its drain, whether it may take new jobs and why not, for a silent node whether
    its host still answers the job controller's probe, and its last self-test's verdict."""
    store = site.store()
    now = time.time()
    seen = store.nodes()
    alive = rules.alive(seen, now)
    config = (store.get_meta("site") or {}).get("config") or {}
    slots = int(config.get("slots_per_node", 0))
    approved = {ref: name for name, ref in (config.get("images") or {}).items()}
    drains = store.drains()
    silent = store.get_meta("silent_nodes", {})
    jobs = store.jobs(ACTIVE)
    tested = selftest.kept_verdicts(store)
    withheld = rules.selftest_withheld(tested, config.get("selftest"))
    result = {}
    for node in sorted(set(site.mpi_nodes()) | set(seen)):
        info = seen.get(node)
        mine = [j for j in jobs if node in (j.get("placement") or {})]
        health = (info or {}).get("report", {}).get("health")
        drain = drains.get(node)
        problem = rules.node_problem({"health": health}, drain) \
            if info and node in alive else "not reporting"
        problem = problem or withheld.get(node)
        result[node] = {
            "slots": slots,
            "used": sum(j["placement"][node] for j in mine),
            "jobs": [j["job_id"] for j in mine],
            "reachable": bool(info) and node in alive,
            "last_report_seconds_ago": round(now - info["last_seen"], 1) if info else None,
            "engine": info["report"].get("engine") if info else None,
            "health": None if not isinstance(health, dict) else {
                "docker": health.get("docker"), "storage": health.get("storage"),
                "job_ca": health.get("job_ca"), "agent": health.get("agent"),
                "images": sorted(approved[r] for r in health.get("images") or []
                                 if r in approved)},
            "drained": None if drain is None else dict(drain, since_utc=utc(drain["since"])),
            "eligible": problem is None,
            "not_eligible_because": problem,
            "silent": silent.get(node),
            "selftest": tested.get(node),
        }
    return result


def drain(site, node, reason=None, by=None):
    """Drain ``node``: jobs running there finish, no new job starts there. ``by`` is
    the admin's name, recorded with the reason."""
    _known_node(site, node)
    if not isinstance(reason, str) or not reason.strip() or len(reason) > 200:
        raise RequestError(
            "reason is required: why the node is drained, in at most 200 characters")
    store = site.store()
    drained = _stored(store.drain, node, reason.strip(), by=by or "root")
    site.nodes_changed()
    running = [j["job_id"] for j in store.jobs(ACTIVE) if node in (j.get("placement") or {})]
    return {"node": node, "drained": dict(drained, since_utc=utc(drained["since"])),
            "running_jobs": running}


def resume(site, node):
    """Undo :func:`drain`."""
    _known_node(site, node)
    lifted = _stored(site.store().resume, node)
    site.nodes_changed()
    return {"node": node, "drained": None, "was": lifted}


def _known_node(site, node):
    """A node id the master knows as an MPI node (grain roles:mpi-node) or has heard."""
    if not isinstance(node, str) or node not in set(site.mpi_nodes()) | set(site.store().nodes()):
        raise RequestError(f"{str(node)[:100]!r} is not an MPI node")
    return node


# ---------------------------------------------------------------------- settings


def settings(site):
    """The site's settings read again now and handed to the job controller, with the
    registry passwords hidden."""
    return without_secrets(site.settings(fresh=True))


def without_secrets(config):
    """A copy of the settings to show: registry passwords replaced, so that no terminal
    or log of an admin's command holds them."""
    shown = copy.deepcopy(config)
    logins = (shown.get("docker") or {}).get("registry_credentials") or {}
    for login in logins.values():
        if isinstance(login, dict) and "password" in login:
            login["password"] = "(hidden)"
    return shown


# ------------------------------------------------------------------- retention


def prune(site, job_records_days=None, job_dirs_days=None):
    """Apply the retention settings (pillar ``mpi:retention``, or the days given):
    remove old records of ended jobs and old job directories."""
    retention = site.settings()["retention"] if None in (job_records_days,
                                                         job_dirs_days) else {}
    records_days = _days(job_records_days, retention.get("job_records_days"),
                         "job_records_days")
    dirs_days = _days(job_dirs_days, retention.get("job_dirs_days"), "job_dirs_days")
    store = site.store()
    now = time.time()
    pruned = store.prune(now - records_days * 86400) if records_days else []
    dirs = _prune_job_dirs(site, dirs_days, now) if dirs_days else {}
    if pruned:
        log.info("mpi.prune removed %d job records", len(pruned))
    return {"job_records_removed": len(pruned), "job_records_days": records_days,
            "job_dirs_removed": dirs, "job_dirs_days": dirs_days}


def _days(value, default, what):
    value = default if value is None else value
    try:
        days = float(value)
    except (TypeError, ValueError):
        raise RequestError(f"{what} must be a number of days, got {str(value)[:40]!r}"
                           ) from None
    if not 0 <= days < 100000:
        raise RequestError(f"{what} must be 0 (keep forever) or more days")
    return days


def _prune_job_dirs(site, days, now):
    """``{user: [job ids removed]}``: old job directories, removed on the host that owns
    the shared storage as each user's uid."""
    store = site.store()
    config = (store.get_meta("site") or {}).get("config") or site.settings()
    minion, path = site.storage_owner(config)
    keep = {}
    for record in store.jobs(UNENDED):
        keep.setdefault(record["user"], []).append(record["job_id"])
    removed = {}
    for user, info in sorted(store.users().items()):
        if not info["dir_ready"]:
            continue
        gone = site.call([minion], "mpi_job.prune_job_dirs", timeout=120,
                         storage_path=path, user=user, uid=info["uid"], gid=info["uid"],
                         older_than=now - days * 86400, keep=keep.get(user, []))[minion]
        if gone:
            removed[user] = gone
    return removed


# ------------------------------------------------------------------- the store


def backup(site, path=None):
    """Copy the job store to a new file (mode 0600, never over an existing one)."""
    if path is None:
        folder = os.path.join(site.opts["cachedir"], "dockermpi", "backups")
        os.makedirs(folder, mode=0o700, exist_ok=True)
        path = os.path.join(folder, time.strftime("jobs-%Y%m%d-%H%M%S.sqlite", time.gmtime()))
    if not isinstance(path, str) or not os.path.isabs(path):
        raise RequestError("path must be an absolute path on the master")
    try:
        schema = site.store().backup(path)
    except FileExistsError:
        raise ClusterError(f"{path} exists; a backup never overwrites") from None
    except (OSError, RuntimeError) as exc:
        raise ClusterError(f"cannot back up the job store to {path}: {exc}") from None
    return {"path": path, "bytes": os.path.getsize(path), "schema": schema}


def restore(site, path):
    """Replace the job records with those of a backup (refused while jobs are queued or
    running)."""
    if not isinstance(path, str) or not os.path.isabs(path) or not os.path.isfile(path):
        raise RequestError("path must be the absolute path of a backup file on the master")
    try:
        return site.store().restore(path)
    except StoreError as exc:
        raise ClusterError(f"not restored: {exc}") from None


# ------------------------------------------------------------------------ users


def add_user(site, user):
    """Give ``user`` their uid and their directory, owned by it."""
    if not job_request.valid_user(user):
        raise RequestError(
            "user is not a valid user name: letters, digits, '-' and '_' only, starting "
            "with a letter or digit, at most 64 characters")
    config = site.settings()
    uid = site.user_uid(config, user, check_dir=True)
    return {"user": user, "uid": uid, "gid": uid,
            "dir": posixpath.join(config["storage"]["path"], "users", user)}


def users(site):
    """Every user the master has given a uid: ``{name: {uid, created, dir_ready}}``."""
    return site.store().users()


def migrate_users(site, from_uid=None):
    """Give every directory of ``<storage>/users`` owned by ``from_uid`` (default:
    pillar ``mpi:guest:uid``) its user's own uid, and what the guest owned inside it;
    ``{"migrated": {user: ...}, "left": [users not owned by from_uid]}``."""
    store = site.store()
    config = site.settings()
    try:
        from_uid = int(config["guest"]["uid"] if from_uid is None else from_uid)
    except (TypeError, ValueError):
        raise RequestError(f"from_uid must be a uid, got {str(from_uid)[:40]!r}") from None
    minion, path = site.storage_owner(config)
    found = site.call([minion], "mpi_job.user_dirs", timeout=30, storage_path=path)[minion]
    migrated = {}
    for name, info in sorted(found.items()):
        if info["uid"] != from_uid:
            continue
        uid, _ = _stored(store.user_uid, name, int(config["users"]["uid_min"]),
                         int(config["users"]["uid_max"]))
        migrated[name] = site.call([minion], "mpi_job.migrate_user_dir", timeout=600,
                                   storage_path=path, user=name, from_uid=from_uid,
                                   uid=uid, gid=uid)[minion]
        migrated[name]["uid"] = uid
        store.set_user_dir_ready(name)
    return {"migrated": migrated,
            "left": sorted(n for n, i in found.items() if i["uid"] != from_uid)}


# ----------------------------------------------------------------------- helpers


def utc(moment):
    return datetime.datetime.fromtimestamp(moment, datetime.timezone.utc).strftime(
        "%Y-%m-%dT%H:%M:%SZ")


def _stored(write, *args, **kwargs):
    """A write to the job store; its refusal (StoreError) as the cluster's."""
    try:
        return write(*args, **kwargs)
    except StoreError as exc:
        raise ClusterError(str(exc)) from None
