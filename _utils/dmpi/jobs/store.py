"""
The master's durable record of DockerMPI jobs and nodes: one SQLite file.

Every job is a row whose ``state`` only moves forward (queued -> starting -> running ->
succeeded / failed / cancelled / timed_out); :meth:`JobStore.transition` makes each move
atomic and exclusive, so when the job controller's threads and a ``salt-run`` race to end
the same job exactly one of them wins and does the clean-up. Several processes and
threads share the file; writers serialise on SQLite's lock (``BEGIN IMMEDIATE``).
"""

import contextlib
import json
import os
import sqlite3
import tempfile
import threading
import time

from dmpi.contract import FINAL, STATES
from dmpi.errors import StoreError

SCHEMA_VERSION = 7

#: When a job ended, for history windows: its end, or its submission for a record without
#: one. The index and the queries spell it the same, so SQLite uses the index.
_ENDED = "COALESCE(json_extract(record, '$.ended'), json_extract(record, '$.submitted'))"

_OPENED = {}  # path -> ((st_dev, st_ino) of the file, JobStore): open_store's
_OPENED_LOCK = threading.Lock()
_OPENED_MAX = 8  # paths kept (a master has one; more only in tests), the oldest let go
_INHERITED = []  # read connections a forked child must never use nor close

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    user TEXT NOT NULL,
    state TEXT NOT NULL,
    record TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs (state);
CREATE INDEX IF NOT EXISTS jobs_user ON jobs (user, seq);
CREATE INDEX IF NOT EXISTS jobs_user_ended ON jobs (user, """ + _ENDED + """);
CREATE TABLE IF NOT EXISTS nodes (
    id TEXT PRIMARY KEY,
    last_seen REAL NOT NULL,
    report TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS users (
    name TEXT PRIMARY KEY,
    uid INTEGER NOT NULL UNIQUE,
    created REAL NOT NULL,
    dir_ready INTEGER NOT NULL DEFAULT 0,
    identity TEXT UNIQUE
);
CREATE TABLE IF NOT EXISTS drains (
    node TEXT PRIMARY KEY,
    reason TEXT NOT NULL,
    since REAL NOT NULL,
    by TEXT
);
"""

# Steps that bring a store of schema N to N + 1, applied in order on open; a schema is
# never changed in place, so records written by an older version are always kept.
_MIGRATIONS = {
    # 2: every user gets a uid of their own, allocated once and never reused.
    1: """
CREATE TABLE IF NOT EXISTS users (
    name TEXT PRIMARY KEY,
    uid INTEGER NOT NULL UNIQUE,
    created REAL NOT NULL,
    dir_ready INTEGER NOT NULL DEFAULT 0
);
""",
    # 3: a user name is bound to the hub identity that first used it (hub logins).
    2: "ALTER TABLE users ADD COLUMN identity TEXT;\n"
       "CREATE UNIQUE INDEX IF NOT EXISTS users_identity ON users (identity);\n",
    # 4: nodes an admin drained for maintenance (mpi.drain), kept across restarts.
    3: """
CREATE TABLE IF NOT EXISTS drains (
    node TEXT PRIMARY KEY,
    reason TEXT NOT NULL,
    since REAL NOT NULL,
    by TEXT
);
""",
    # 5: a user's jobs are found by index: every poll of a user's list reads them.
    4: "CREATE INDEX IF NOT EXISTS jobs_user ON jobs (user, seq);\n",
    # 6: no port slots: each job has a network namespace and addresses of its own.
    5: "ALTER TABLE jobs DROP COLUMN port_slot;\n",
    # 7: a user's history in a window is found by index, however long the history.
    6: f"CREATE INDEX IF NOT EXISTS jobs_user_ended ON jobs (user, {_ENDED});\n",
}


class JobStore:
    """Jobs, node reports and a few settings, in ``path``.

    Writes each take a connection of their own (:meth:`transaction`). Reads share one
    connection per thread, kept open (:meth:`_reader`): in autocommit mode each read is
    a transaction of its own, so it sees every write committed before it, by any thread
    or process, as a fresh connection would, without the cost of opening one."""

    def __init__(self, path):
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        self.path = path
        self._local = threading.local()
        with self._connect() as conn:
            version = found = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise StoreError(f"{path} has schema {version}; this code knows {SCHEMA_VERSION}")
            if version == 0:  # a new store: the current schema, nothing to migrate
                conn.executescript(_SCHEMA)
                version = SCHEMA_VERSION
            for step in range(version, SCHEMA_VERSION):
                conn.executescript(_MIGRATIONS[step])
            if found != SCHEMA_VERSION:
                # A write: opening a current store (every API call does) stays a read,
                # which never waits for the controller's writes.
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    @contextlib.contextmanager
    def _connect(self):
        conn = sqlite3.connect(self.path, timeout=60, isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            yield conn
        finally:
            conn.close()

    def _reader(self):
        """This thread's read connection: opened on its first read, and again when the
        file at ``path`` is another one (removed, replaced) or after a fork. Every read
        through it fetches all its rows, so no statement keeps a snapshot open."""
        try:
            found = os.stat(self.path)
            key = (os.getpid(), found.st_dev, found.st_ino)
        except FileNotFoundError:
            key = None
        held = getattr(self._local, "reader", None)
        if held is not None:
            if held[0] == key:
                return held[1]
            if held[0][0] != os.getpid():
                # SQLite's state is not to be carried across fork: neither used nor
                # closed in the child (closing could release the parent's locks).
                _INHERITED.append(held[1])
            else:
                held[1].close()
            self._local.reader = None
        conn = sqlite3.connect(self.path, timeout=60, isolation_level=None)
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        if key is None:  # connecting made the file: key it as it is now
            found = os.stat(self.path)
            key = (os.getpid(), found.st_dev, found.st_ino)
        self._local.reader = (key, conn)
        return conn

    @contextlib.contextmanager
    def transaction(self):
        """A write transaction: nothing else writes until it ends."""
        with self._connect() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise

    # --- jobs -----------------------------------------------------------------------
    def add(self, record, queued_limit=0):
        """Insert a new job record (state ``queued``); True when it is, False when its
        user already has ``queued_limit`` jobs queued (0: no limit). The count and the
        insert are one transaction, so submits at the same time cannot pass the limit."""
        with self.transaction() as conn:
            if queued_limit:
                (queued,) = conn.execute(
                    "SELECT COUNT(*) FROM jobs WHERE user = ? AND state = 'queued'",
                    (record["user"],)).fetchone()
                if queued >= queued_limit:
                    return False
            conn.execute(
                "INSERT INTO jobs (id, user, state, record) VALUES (?, ?, ?, ?)",
                (record["job_id"], record["user"], record["state"], json.dumps(record)),
            )
        return True

    def get(self, job_id, conn=None):
        """The job's record, or None."""
        rows = (conn or self._reader()).execute(
            "SELECT record FROM jobs WHERE id = ?", (job_id,)).fetchall()
        return json.loads(rows[0][0]) if rows else None

    def jobs(self, states=None, user=None, conn=None, keys=None, ended_in=None,
             after=None, limit=None):
        """Records in submission order, optionally only these states / this user, and
        with ``ended_in`` (``(since, until)``, either None) only those that ended in
        ``[since, until)`` (a record without ``ended`` by its ``submitted``), filtered by
        SQLite; with ``keys`` (names of top-level fields), only those
        fields of each (None where a record has none), picked out by SQLite, so the
        rest of each record is never decoded. ``after`` (a :meth:`seq_of`) and ``limit``
        page through them: at most ``limit`` records submitted after that one."""
        if keys:
            if not all(isinstance(key, str) and key.isidentifier() for key in keys):
                raise ValueError(f"keys must be field names, got {list(keys)!r}"[:200])
            return self._fields(tuple(keys), states, user, conn, ended_in, after, limit)
        return [record for _, record in self._select(states, user, after, conn, ended_in,
                                                     limit)]

    def seq_of(self, job_id, user=None):
        """The job's place in submission order (``after`` of :meth:`jobs`), or None when
        there is no such job (of ``user``)."""
        query, args = "SELECT seq FROM jobs WHERE id = ?", [job_id]
        if user is not None:
            query, args = query + " AND user = ?", args + [user]
        rows = self._reader().execute(query, args).fetchall()
        return rows[0][0] if rows else None

    def _fields(self, keys, states, user, conn, ended_in, after=None, limit=None):
        # json_extract of two paths or more answers a JSON array of their values.
        paths = [f"$.{key}" for key in keys + keys[:1] * (len(keys) == 1)]
        query, args = self._where(states, user, after, ended_in)
        rows = (conn or self._reader()).execute(
            f"SELECT json_extract(record{', ?' * len(paths)}) FROM jobs{query} ORDER BY seq"
            f"{_limit(limit)}", paths + args).fetchall()
        return [dict(zip(keys, json.loads(row[0]))) for row in rows]

    def jobs_after(self, seq, states=None):
        """``[(seq, record)]`` of jobs submitted after ``seq`` (0: all), optionally only
        in these states, in submission order: how the job controller keeps its view current
        without reading every record again."""
        return self._select(states, after=int(seq))

    def _select(self, states=None, user=None, after=None, conn=None, ended_in=None,
                limit=None):
        """``[(seq, record)]`` in submission order, filtered as :meth:`jobs` says."""
        query, args = self._where(states, user, after, ended_in)
        rows = (conn or self._reader()).execute(
            f"SELECT seq, record FROM jobs{query} ORDER BY seq{_limit(limit)}",
            args).fetchall()
        return [(row[0], json.loads(row[1])) for row in rows]

    @staticmethod
    def _where(states, user, after, ended_in=None):
        """(`` WHERE ...`` or "", its arguments) of :meth:`_select`'s filters."""
        query, args, clauses = "", [], []
        if states:
            clauses.append(f"state IN ({','.join('?' * len(states))})")
            args += list(states)
        if user:
            clauses.append("user = ?")
            args.append(user)
        if after is not None:
            clauses.append("seq > ?")
            args.append(after)
        since, until = ended_in or (None, None)
        for bound, operator in ((since, ">="), (until, "<")):
            if bound is not None:
                clauses.append(f"{_ENDED} {operator} ?")
                args.append(float(bound))
        if clauses:
            query = " WHERE " + " AND ".join(clauses)
        return query, args

    def last_seq(self):
        """The sequence number of the newest job (0 when there is none)."""
        return self._reader().execute("SELECT COALESCE(MAX(seq), 0) FROM jobs").fetchall()[0][0]

    def transition(self, job_id, state, reason=None, expect=None, conn=None, **fields):
        """
        Move a job to ``state`` if it is in one of ``expect``; returns the new record or
        None when the job was not in an expected state (someone else moved it).

        ``fields`` are merged into the record; the move is appended to its history.
        """
        if state not in STATES:
            raise StoreError(f"unknown job state {state!r}")
        with contextlib.ExitStack() as stack:
            conn = conn or stack.enter_context(self.transaction())
            record = self.get(job_id, conn)
            if record is None or (expect is not None and record["state"] not in expect):
                return None
            now = time.time()
            record.update(fields)
            record["state"] = state
            if reason is not None or state in FINAL:
                record["reason"] = reason
            record.setdefault("history", []).append({"state": state, "at": now, "reason": reason})
            conn.execute(
                "UPDATE jobs SET state = ?, record = ? WHERE id = ?",
                (state, json.dumps(record), job_id),
            )
            return record

    def update(self, job_id, conn=None, **fields):
        """Merge fields into a job's record without changing its state."""
        with contextlib.ExitStack() as stack:
            conn = conn or stack.enter_context(self.transaction())
            record = self.get(job_id, conn)
            if record is None:
                return None
            record.update(fields)
            conn.execute("UPDATE jobs SET record = ? WHERE id = ?", (json.dumps(record), job_id))
            return record

    # --- nodes ----------------------------------------------------------------------
    def node_seen(self, node, report, when=None):
        with self.transaction() as conn:
            conn.execute(
                "INSERT INTO nodes (id, last_seen, report) VALUES (?, ?, ?) ON CONFLICT(id)"
                " DO UPDATE SET last_seen = excluded.last_seen, report = excluded.report",
                (node, when or time.time(), json.dumps(report)),
            )

    def nodes_seen(self, seen):
        """Record many nodes at once: ``{node: (last_seen, report)}``, one transaction."""
        with self.transaction() as conn:
            conn.executemany(
                "INSERT INTO nodes (id, last_seen, report) VALUES (?, ?, ?) ON CONFLICT(id)"
                " DO UPDATE SET last_seen = excluded.last_seen, report = excluded.report",
                [(node, when, json.dumps(report)) for node, (when, report) in seen.items()],
            )

    def nodes(self, conn=None):
        """``{node: {"last_seen": t, "report": {...}}}``."""
        rows = (conn or self._reader()).execute(
            "SELECT id, last_seen, report FROM nodes").fetchall()
        return {r[0]: {"last_seen": r[1], "report": json.loads(r[2])} for r in rows}

    # --- users ----------------------------------------------------------------------
    def user_uid(self, name, uid_min, uid_max, identity=None):
        """
        ``(uid, new)``: the user's own uid, allocated from ``[uid_min, uid_max]`` on first
        use. A uid is never handed out twice, even after its user's row is gone: the
        next one only ever grows. StoreError when the range is used up.

        ``identity`` (a hub user name) binds the user name to it on first use; a user
        name bound to another identity is refused (StoreError), so no hub user can take
        another's directory by registering a name equal to its mapped name.
        """
        with self.transaction() as conn:
            row = conn.execute("SELECT uid, identity FROM users WHERE name = ?",
                               (name,)).fetchone()
            if row and identity is not None and row[1] not in (None, identity):
                raise StoreError(f"the user name {name!r} belongs to another hub user")
            if row and identity is not None and row[1] is None:
                if conn.execute("SELECT 1 FROM users WHERE identity = ?",
                                (identity,)).fetchone():
                    raise StoreError(f"the hub user {identity!r} already has a user name")
                conn.execute("UPDATE users SET identity = ? WHERE name = ?", (identity, name))
            if row:
                return row[0], False
            highest = conn.execute("SELECT MAX(uid) FROM users").fetchone()[0] or 0
            uid = max(int(uid_min), highest + 1, self.get_meta("next_uid", 0, conn=conn))
            if uid > int(uid_max):
                raise StoreError(
                    f"no uid left for user {name!r}: the range {uid_min}-{uid_max} is used up"
                )
            conn.execute("INSERT INTO users (name, uid, created, identity) VALUES (?, ?, ?, ?)",
                         (name, uid, time.time(), identity))
            self.set_meta("next_uid", uid + 1, conn=conn)
            return uid, True

    def users(self, conn=None):
        """``{name: {"uid": int, "created": t, "dir_ready": bool}}``."""
        rows = (conn or self._reader()).execute(
            "SELECT name, uid, created, dir_ready, identity FROM users").fetchall()
        return {r[0]: {"uid": r[1], "created": r[2], "dir_ready": bool(r[3]),
                       "identity": r[4]} for r in rows}

    def set_user_dir_ready(self, name, ready=True):
        with self.transaction() as conn:
            conn.execute("UPDATE users SET dir_ready = ? WHERE name = ?", (int(ready), name))

    # --- maintenance ----------------------------------------------------------------
    def drain(self, node, reason, by=None):
        """Drain ``node``: no new job starts there. Draining a drained node keeps its
        ``since`` and takes the new reason. Returns the drain."""
        with self.transaction() as conn:
            conn.execute(
                "INSERT INTO drains (node, reason, since, by) VALUES (?, ?, ?, ?)"
                " ON CONFLICT(node) DO UPDATE SET reason = excluded.reason, by = excluded.by",
                (node, str(reason), time.time(), by),
            )
        return self.drains()[node]

    def resume(self, node):
        """Undo a drain; returns the drain that was lifted, or None."""
        with self.transaction() as conn:
            row = conn.execute("SELECT reason, since, by FROM drains WHERE node = ?",
                               (node,)).fetchone()
            conn.execute("DELETE FROM drains WHERE node = ?", (node,))
        return {"reason": row[0], "since": row[1], "by": row[2]} if row else None

    def drains(self, conn=None):
        """``{node: {"reason": str, "since": t, "by": who or None}}``."""
        rows = (conn or self._reader()).execute(
            "SELECT node, reason, since, by FROM drains").fetchall()
        return {r[0]: {"reason": r[1], "since": r[2], "by": r[3]} for r in rows}

    # --- settings -------------------------------------------------------------------
    def get_meta(self, key, default=None, conn=None):
        rows = (conn or self._reader()).execute(
            "SELECT value FROM meta WHERE key = ?", (key,)).fetchall()
        return json.loads(rows[0][0]) if rows else default

    def set_meta(self, key, value, conn=None):
        with contextlib.ExitStack() as stack:
            conn = conn or stack.enter_context(self.transaction())
            conn.execute(
                "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT(key)"
                " DO UPDATE SET value = excluded.value",
                (key, json.dumps(value)),
            )


    # --- retention and backups ------------------------------------------------------
    def prune(self, ended_before):
        """Remove the records of jobs that ended before ``ended_before`` (Unix time);
        queued and active jobs are never removed, whatever their age. Returns the ids
        removed."""
        final = ",".join("?" * len(FINAL))
        with self.transaction() as conn:
            gone = [row[0] for row in conn.execute(
                f"SELECT id FROM jobs WHERE state IN ({final})"
                " AND json_extract(record, '$.ended') < ?", FINAL + (float(ended_before),))]
            conn.executemany("DELETE FROM jobs WHERE id = ?", [(j,) for j in gone])
        return gone

    def backup(self, dest):
        """Copy the whole store to the new file ``dest`` with SQLite's online backup
        API (consistent while the controller writes). Returns ``dest``'s schema version."""
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        os.close(fd)
        target = sqlite3.connect(dest)
        try:
            with self._connect() as conn:
                conn.backup(target)
            target.execute("PRAGMA journal_mode = DELETE")  # one self-contained file
            return target.execute("PRAGMA user_version").fetchone()[0]
        finally:
            target.close()

    def restore(self, source):
        """
        Replace the job records with those of the backup ``source`` (a file
        :meth:`backup` wrote, of this schema or an older one, which is migrated first
        in a copy; ``source`` itself is not changed). Refused while any job is queued
        or active here.

        What is live stays: node reports, the controller's bookkeeping and the site
        settings. Users are merged, never lost: a user this store knows keeps their
        uid, and no uid ever handed out is handed out again. Jobs the backup holds as
        queued or active (it was taken while they ran) are recorded as failed, their
        outcome unknown. Job sequence numbers only grow, so the running engine sees
        jobs submitted after the restore. Returns ``{"jobs", "users_added",
        "unfinished_failed", "schema"}``.
        """
        with tempfile.TemporaryDirectory(dir=os.path.dirname(self.path)) as scratch:
            copy = os.path.join(scratch, "restore.sqlite")
            source_conn = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
            try:
                schema = source_conn.execute("PRAGMA user_version").fetchone()[0]
                if schema == 0:
                    raise StoreError(f"{source} is not a DockerMPI job store")
                target = sqlite3.connect(copy)
                try:
                    source_conn.backup(target)
                finally:
                    target.close()
            except sqlite3.DatabaseError as exc:
                raise StoreError(f"{source} cannot be read as a job store: {exc}") from None
            finally:
                source_conn.close()
            JobStore(copy)  # migrates the copy to this schema, or refuses a newer one
            # ATTACH is not allowed inside a transaction: attach, then take the lock.
            with self._connect() as conn:
                conn.execute("ATTACH DATABASE ? AS backup", (copy,))
                conn.execute("BEGIN IMMEDIATE")
                try:
                    result = self._restore_attached(conn)
                    conn.execute("COMMIT")
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
                finally:
                    conn.execute("DETACH DATABASE backup")
        return dict(result, schema=schema)

    def _restore_attached(self, conn):
        """:meth:`restore`'s changes, in ``conn``'s transaction, the backup attached."""
        final = ",".join("?" * len(FINAL))
        busy = conn.execute(f"SELECT COUNT(*) FROM jobs WHERE state NOT IN ({final})",
                            FINAL).fetchone()[0]
        if busy:
            raise StoreError(f"{busy} jobs are queued or running; restore replaces every job "
                             "record, so wait for them or cancel them first")
        users_before = conn.execute("SELECT COUNT(*) FROM users").fetchone()[0]
        conn.execute("INSERT OR IGNORE INTO users SELECT name, uid, created, dir_ready, identity"
                     " FROM backup.users")
        users_added = conn.execute("SELECT COUNT(*) FROM users").fetchone()[0] - users_before
        backup_next = conn.execute("SELECT value FROM backup.meta WHERE key = 'next_uid'"
                                   ).fetchone()
        highest_uid = conn.execute("SELECT COALESCE(MAX(uid), 0) FROM users").fetchone()[0]
        self.set_meta("next_uid", max(int(self.get_meta("next_uid", 0, conn=conn)),
                                      highest_uid + 1,
                                      int(json.loads(backup_next[0])) if backup_next else 0),
                      conn=conn)
        # Inserted without their sequence numbers: AUTOINCREMENT numbers them above any
        # this store ever gave, and the running engine reads new jobs by that number.
        conn.execute("DELETE FROM jobs")
        conn.execute("INSERT INTO jobs (id, user, state, record) "
                     "SELECT id, user, state, record FROM backup.jobs ORDER BY seq")
        unfinished = [row[0] for row in conn.execute(
            f"SELECT id FROM jobs WHERE state NOT IN ({final}) ORDER BY seq", FINAL)]
        for job_id in unfinished:
            was = self.get(job_id, conn)["state"]
            self.transition(job_id, "failed", conn=conn, ended=time.time(), closed=True,
                            reason=f"restored from a backup taken while it was {was}; its "
                                   "real outcome is unknown")
        jobs = conn.execute("SELECT COUNT(*) FROM jobs").fetchone()[0]
        return {"jobs": jobs, "users_added": users_added, "unfinished_failed": unfinished}


def open_store(path):
    """The job store at ``path`` (created on first use). One per path in a process: its
    schema is checked (and migrated) when it is first opened, not at every call, and
    again only when the file at ``path`` is another one."""
    with _OPENED_LOCK:
        opened = _OPENED.get(path)
        if opened is not None:
            try:
                found = os.stat(path)
            except FileNotFoundError:
                found = None
            if found is not None and opened[0] == (found.st_dev, found.st_ino):
                return opened[1]
        store = JobStore(path)
        found = os.stat(path)
        _OPENED.pop(path, None)
        _OPENED[path] = ((found.st_dev, found.st_ino), store)
        while len(_OPENED) > _OPENED_MAX:  # its readers close once nothing holds it
            del _OPENED[next(iter(_OPENED))]
        return store


def _limit(limit):
    """The `` LIMIT n`` clause of a query (none for None); ``limit`` is written into the
    query, so only a whole number gets there."""
    if limit is None:
        return ""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise ValueError(f"limit must be a whole number of rows, got {limit!r}"[:200])
    return f" LIMIT {limit}"
