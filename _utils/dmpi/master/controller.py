"""
DockerMPI's job controller: one long-lived object on the master that owns every job's life.

It takes evidence in (node reports and heartbeats, queued and cancel requests, the
clock), and for each job one reconcile step decides from the rules (``dmpi.jobs.rules``)
whether it ends; every end of a job goes through that step. Ending records the final
state and announces it at once; the clean-up of containers and keys follows in the
background, off the path of whoever waits for the result. Planning starts what the
queue allows (``dmpi.jobs.sched``); a start runs in a worker thread
(:mod:`dmpi.master.starter` brings the job up), and a start that fails is recorded on the
job and reconciled like any other evidence, never retried or recursed into.

The ``mpi_master`` Salt engine (``_engines/mpi_master.py``) feeds it from Salt's event
bus and gives it the master's :class:`~dmpi.master.site.Site` as its transport to the
nodes; benchmarks and tests feed it directly. What it knows of each node is kept in
memory (:mod:`dmpi.master.nodes`: heartbeats cost a dict update) and written to the
store every few seconds.

The object is not a Salt function: nothing here is callable by users.
"""

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from dmpi.contract import job_tag
from dmpi.errors import StartFailure
from dmpi.jobs import addresses, fairshare, rules, sched
from dmpi.jobs import record as job_record
from dmpi.master import planner, selftest, starter
from dmpi.master.nodes import NodeBook, probe_host

log = logging.getLogger(__name__)

CLEANUP_TIMEOUT = 5  # seconds a node has to clean up before its reports take over
CLEANUP_RETRY = 10  # seconds between clean-up requests for leftovers on one node
FLUSH_SECONDS = 2  # how often heartbeats and reports are written to the store
RELOAD_SECONDS = 30  # how often the controller's view of jobs is read again from the store
PLAN_SECONDS = 5  # the queue is planned at least this often
STALL_SECONDS = 3  # a pass this late means the controller stalled: give nodes a grace
# pillar mpi:engine when a site's settings (read by mpi.submit) predate it
ENGINE_DEFAULTS = {"probe_port": 22, "silent_grace": 90}
PULL_RETRY = 60  # seconds before a node is asked again to pull an image a job waits for
# How stale the priorities mpi.list shows may grow while the same jobs wait: the age
# factor moves every pass, and rewriting every job's priority each pass costs a big write.
PRIORITIES_WRITE_SECONDS = 30


def controller_settings(site_config):
    """The job controller's settings (pillar ``mpi:engine``) from the site's settings."""
    found = dict(ENGINE_DEFAULTS)
    found.update((site_config or {}).get("engine") or {})
    return found


class JobController:
    """
    Jobs' lives, from evidence to decisions.

    ``transport`` reaches the nodes and the event bus:

    - ``call(minions, fun, timeout, **kwargs)``: ``{minion: return}``; raises
      ``StartError``-like exceptions (any Exception) naming what failed, with
      ``.answered`` (minions that did answer) when it knows;
    - ``call_async(minions, fun, **kwargs)``: fire and forget;
    - ``fire(tag, data)``: an event on the master's bus;
    - ``host_addresses(minions, network)``: each minion's address in ``network``.
    """

    def __init__(self, store, transport, clock=time.time):
        self.store = store
        self.transport = transport
        self.clock = clock
        self.lock = threading.RLock()
        self.pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="mpi-controller")
        now = clock()
        self.node_book = NodeBook(store.nodes(), now)
        self.grace_until = now  # moved on when the controller itself stalls
        # The controller's view of unfinished jobs (the store stays the record): queued in
        # submission order, active ones, and which active jobs each node runs.
        self.queue, self.active, self.on_node = {}, {}, {}
        self.last_seq = 0
        self._reload(now)
        # Each user's decayed usage of ended jobs (dmpi.jobs.fairshare), kept in the store.
        self.fair_usage = store.get_meta("fair_usage", {})
        self.fair_share = fairshare.settings(
            ((store.get_meta("site") or {}).get("config") or {}).get("fair_share"))
        self.priorities = store.get_meta("priorities", {})  # as last written
        self.priorities_written = 0.0
        self.plan_due = True
        self.last_plan = 0.0
        self.last_pass = now
        self.last_flush = now
        self.cleanup_asked = {}
        self.starting = set()
        # Jobs that ended otherwise than by success keep their slots while their
        # containers are removed: a rank may still run until its container is gone.
        self.closing = {}
        # Jobs whose clean-up (``_cleanup``) is under way: their containers on a node's
        # report are not leftovers to remove a second time.
        self.cleaning = set()
        self.plan_queued = False
        # Addresses of containers on nodes not yet cleaned (only the controller writes them;
        # the store keeps them across restarts).
        self.address_holds = store.get_meta("address_holds", {})
        self.waiting = store.get_meta("waiting", {})  # as last written
        self.queue_places = store.get_meta("queue_places", {})  # as last written
        self._read_maintenance()
        self.settings = controller_settings((store.get_meta("site") or {}).get("config"))
        # Host probes of silent nodes run in threads of their own, never in the loop and
        # never behind a job's start.
        self.probe_host = probe_host
        self.probe_pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="mpi-probe")
        self.pulls = {}  # (node, image_ref) -> when the node was asked to pull it
        self.silent_view = store.get_meta("silent_nodes", {})  # as last written

    # ------------------------------------------------------------------ evidence in

    def node_report(self, node, report):
        """A node's full report: record it and reconcile the node's jobs."""
        if not isinstance(report, dict):
            return
        now = self.clock()
        with self.lock:
            was_alive, health_changed = self.node_book.report(node, report, now)
            if health_changed:
                self.plan_due = True  # the node may take jobs it could not, or not
            if report.get("error"):
                # Alive, but it could not build its report: a heartbeat, no evidence.
                log.warning("%s could not report its jobs: %s", node, report["error"])
                return
            jobs = report.get("jobs") if isinstance(report.get("jobs"), dict) else {}
            self._release_addresses(node, jobs)
            for job_id in list(self.on_node.get(node, ())):
                if job_id in self.active:
                    self._reconcile(self.active[job_id], now)
            self._remove_leftovers(node, jobs, now)
            if not was_alive:
                self.plan_due = True

    def heartbeat(self, node, evidence_digest):
        """A node says it is alive and its evidence is still the report with this
        fingerprint (``digest``)."""
        now = self.clock()
        with self.lock:
            if self.node_book.heartbeat(node, evidence_digest, now):
                self.plan_due = True

    def job_requested(self, job_id):
        """Something asked about a job (queued, cancel): reconcile it and plan."""
        with self.lock:
            self._new_jobs()
            record = self.store.get(job_id)
            if record is not None:
                self._track(record)
                self._reconcile(record, self.clock())
            self.plan_due = True
        self.plan()

    def nodes_changed(self):
        """An admin drained or resumed a node (``mpi.drain``/``mpi.resume``), or a
        self-test judged nodes (``mpi.selftest``): read the drains and verdicts again from
        the store, and plan."""
        with self.lock:
            self._read_maintenance()
            self.plan_due = True
        self.plan()

    def _read_maintenance(self):
        """Nodes an admin drained (``{node: {reason, since, by}}``) and each node's last
        self-test verdict, as the store holds them."""
        self.drains = self.store.drains()
        self.selftest_verdicts = selftest.kept_verdicts(self.store)

    def tick(self):
        """The clock's pass (about every second): every active job is reconciled
        (walltimes, silent nodes, starts that take too long), then the queue."""
        now = self.clock()
        with self.lock:
            if now - self.last_pass > STALL_SECONDS:
                # The controller stalled, so heartbeats may not have been read: grace.
                self.grace_until = max(self.grace_until,
                                       now + rules.timeouts()["node"])
            self.last_pass = now
            if now - self.last_reload >= RELOAD_SECONDS:
                self._reload(now)  # catches a cancel whose event was missed
                self._read_maintenance()  # and a drain or verdict whose event was missed
            if self._new_jobs():
                self.plan_due = True  # a job whose queued event was missed
            self._probe_silent(now)
            for record in list(self.active.values()):
                self._reconcile(record, now)
            for record in [r for r in self.queue.values() if r.get("cancel_requested")]:
                self._reconcile(record, now)
            if now - self.last_flush >= FLUSH_SECONDS:
                self._flush(now)
        if self.plan_due or now - self.last_plan >= PLAN_SECONDS:
            self.plan()

    def alive(self, now=None):
        return self.node_book.alive(self.clock() if now is None else now)

    # ---------------------------------------------------------------- host probes

    def _probe_silent(self, now):
        """Probe the hosts of silent nodes that run jobs, in the probe threads: the
        answer is in before the node's silence is judged (``rules.silence``)."""
        due = self.node_book.probes_due(self.on_node, now)
        if not due:
            return
        site = self.store.get_meta("site") or {}
        network = (site.get("config") or {}).get("cluster_network")
        for node in due:
            try:
                self.probe_pool.submit(self._probe, node, now, network,
                                       int(self.settings["probe_port"]))
            except RuntimeError:  # the controller is stopping
                return

    def _probe(self, node, started, network, port):
        """One TCP connect to a node's host (a probe thread); the answer goes on the
        node's evidence, unless the node spoke meanwhile."""
        known = self.node_book.host_addresses
        try:
            address = known.get(node)
            if address is None:
                address = known[node] = self.transport.host_addresses([node], network)[node]
            answered, detail = self.probe_host(address, port)
        except Exception as exc:  # pylint: disable=broad-except
            answered, detail = False, f"its host cannot be probed: {str(exc)[:200]}"
        with self.lock:
            self.node_book.probed(node, started, answered, detail)
        log.info("%s is silent; probe of its host: %s", node, detail)

    # ------------------------------------------------------------------ job view

    def _reload(self, now):
        """Read every unfinished job from the store again."""
        self.queue, self.active, self.on_node = {}, {}, {}
        self.last_seq = self.store.last_seq()
        for _, record in self.store.jobs_after(
                0, ("queued",) + rules.active_states()):
            self._track(record)
        self.last_reload = now

    def _new_jobs(self):
        """Take in the jobs submitted since the last look; returns how many."""
        found = self.store.jobs_after(self.last_seq)
        for seq, record in found:
            self.last_seq = max(self.last_seq, seq)
            self._track(record)
        return len(found)

    def _track(self, record):
        """Keep the controller's view of one job in step with its record."""
        job_id = record["job_id"]
        old = self.active.pop(job_id, None)
        for node in (old or {}).get("placement") or {}:
            self.on_node.get(node, set()).discard(job_id)
        if record["state"] == "queued":
            self.queue[job_id] = record  # an update keeps its place in the queue
            return
        self.queue.pop(job_id, None)
        if record["state"] in rules.active_states():
            self.active[job_id] = record
            for node in record.get("placement") or {}:
                self.on_node.setdefault(node, set()).add(job_id)

    # ------------------------------------------------------------------- decisions

    def _reconcile(self, record, now):
        """The one step that ends jobs: apply the rules to the job's evidence."""
        if rules.is_final(record["state"]):
            return None
        evidence = self.node_book.evidence(record.get("placement") or (), now)
        grace = int(self.settings["silent_grace"])
        judge_silence = now >= self.grace_until
        verdict = rules.verdict(record, evidence, now, judge_silence=judge_silence,
                                silent_grace=grace)
        if verdict is None:
            if record["state"] == "running" and judge_silence:
                self._note_silence(record, evidence, now, grace)
            return None
        state, reason, fields = verdict
        return self._finish(record, state, reason, fields, now)

    def _note_silence(self, record, evidence, now, grace):
        """Say on a job's record which of its silent nodes it is kept for, and why
        (``silent_nodes`` while it lasts; ``silences`` keeps each one for the record)."""
        kept = {node: {k: v for k, v in judged.items() if k != "lost"}
                for node, judged in rules.silence(record, evidence, now, grace).items()
                if not judged["lost"]}
        if kept == (record.get("silent_nodes") or {}):
            return
        fields = {"silent_nodes": kept}
        new = [n for n in kept if n not in (record.get("silent_nodes") or {})]
        if new:
            fields["silences"] = list(record.get("silences") or []) + [
                {"node": n, "since": kept[n]["since"], "kept_until": kept[n]["kept_until"],
                 "host": kept[n]["host"]} for n in new]
            log.info("job %s: kept while %s %s silent (the host answers)", record["job_id"],
                     ", ".join(new), "is" if len(new) == 1 else "are")
        updated = self.store.update(record["job_id"], **fields)
        if updated is not None:
            self._track(updated)

    def _finish(self, record, state, reason, fields, now):
        """Record the final state and announce it; the clean-up follows in the background."""
        if record.get("silent_nodes"):
            # A job that is over is kept for no node; ``silences`` keeps what happened.
            fields = dict(fields, silent_nodes={})
        # One transaction: whoever reads the final state (mpi.wait) reads its timings.
        with self.store.transaction() as conn:
            ended = self.store.transition(
                record["job_id"], state, reason, conn=conn,
                expect=("queued",) + rules.active_states(), ended=now, **fields)
            if ended is not None:
                if ended.get("started"):
                    self.fair_usage = fairshare.add_job(
                        self.fair_usage, ended["user"], ended["np"], ended["started"], now,
                        self.fair_share["half_life"])
                    self.store.set_meta("fair_usage", self.fair_usage, conn=conn)
                timings = ended["timings"]
                if ended.get("started"):
                    timings.setdefault("mpirun", round(now - ended["started"], 3))
                timings["total"] = round(now - ended["submitted"], 3)
                closed = not ended.get("placement")
                ended = self.store.update(ended["job_id"], conn=conn, timings=timings,
                                          closed=closed)
        if ended is None:
            self._track(self.store.get(record["job_id"]))  # someone else moved it
            return None
        self._track(ended)
        self.transport.fire(job_tag(ended['job_id'], state),
                            {"job_id": ended["job_id"], "state": state, "reason": reason,
                             "exit_code": ended.get("exit_code")})
        self._plan_soon()  # the queue changed, and a succeeded job's slots are free
        if not closed and state != "succeeded":
            # mpirun returned 0 only after every rank and daemon ended: nothing of a
            # succeeded job still runs, its slots are free at once.
            self.closing[ended["job_id"]] = dict(ended["placement"])
        if not closed and ended["job_id"] not in self.starting:
            # A job still starting is cleaned up by its start thread when it returns.
            self._clean_up_soon(ended)
        return ended

    def _clean_up_soon(self, record):
        with self.lock:
            self.cleaning.add(record["job_id"])
        self.pool.submit(self._cleanup, record)

    def _cleanup(self, record):
        """Remove the job's containers and keys from its nodes that are alive, write
        status.json; nodes that do not answer are cleaned when they report leftovers."""
        try:
            placement = record.get("placement") or {}
            alive = self.alive()
            reachable = [n for n in placement if n in alive]
            config = record["spec"]["config"]
            mark = time.monotonic()
            answered, error = [], None
            if reachable:
                try:
                    answered = list(self.transport.call(
                        reachable, "mpi_job.cleanup", timeout=CLEANUP_TIMEOUT,
                        job_id=record["job_id"], job_root=config["job_root"],
                        status=job_record.public(dict(record, closed=True)),
                        status_node=reachable[0],
                        storage_path=config["storage"]["path"], user=record["user"],
                        uid=record.get("uid"), gid=record.get("uid"),
                        standby=config["job_network"].get("standby", 0),
                    ))
                except Exception as exc:  # pylint: disable=broad-except
                    answered = list(getattr(exc, "answered", []))
                    error = str(exc)
                    log.warning("job %s: cleanup incomplete: %s", record["job_id"], exc)
            pending = [n for n in placement if n not in answered]
            with self.lock:
                self._hold_addresses(record, pending)
                current = self.store.get(record["job_id"]) or record
                timings = dict(current["timings"], cleanup=round(time.monotonic() - mark, 3))
                self.store.update(record["job_id"], timings=timings, closed=True,
                                  cleanup={"cleaned": answered, "pending": pending,
                                           "error": error})
            self.transport.fire(job_tag(record["job_id"], "closed"),
                                {"job_id": record["job_id"], "pending": pending})
        except Exception:  # pylint: disable=broad-except
            log.exception("job %s: cleanup failed", record["job_id"])
        finally:
            with self.lock:
                freed = self.closing.pop(record["job_id"], None)
                self.cleaning.discard(record["job_id"])
        if freed:
            self._plan_soon()  # its slots are free now

    def _plan_soon(self):
        """Plan in a worker thread, once for any number of requests made meanwhile."""
        with self.lock:
            if self.plan_queued:
                return
            self.plan_queued = True

        def planned():
            with self.lock:
                self.plan_queued = False
            self.plan()

        try:
            self.pool.submit(planned)
        except RuntimeError:  # the controller is stopping: the next start plans
            self.plan_queued = False
            self.plan_due = True

    def _remove_leftovers(self, node, jobs, now):
        """Containers or keys of jobs that are over (e.g. on a node that was cut off)."""
        records = {job_id: self.active.get(job_id) or self.queue.get(job_id)
                   or self.store.get(job_id) for job_id in jobs}
        for job_id in rules.leftovers({"jobs": jobs}, records):
            if job_id in self.cleaning:
                continue  # its own clean-up is under way
            if now - self.cleanup_asked.get((node, job_id), 0) < CLEANUP_RETRY:
                continue
            self.cleanup_asked[(node, job_id)] = now
            record = records.get(job_id)
            site = self.store.get_meta("site") or {}
            config = record["spec"]["config"] if record else site.get("config")
            if config:
                self.transport.call_async([node], "mpi_job.cleanup", job_id=job_id,
                                          job_root=config["job_root"])
        for key in [k for k, t in self.cleanup_asked.items() if now - t > 10 * CLEANUP_RETRY]:
            del self.cleanup_asked[key]

    def _flush(self, now):
        """Write heartbeats and reports to the store (``mpi.nodes`` reads them there)."""
        rows = self.node_book.take_unflushed()
        if rows:
            self.store.nodes_seen(rows)
        silent = self.node_book.silent(self.on_node, now)
        if silent != self.silent_view:
            self.store.set_meta("silent_nodes", silent)
            self.silent_view = silent
        self.last_flush = now
        self.store.set_meta("engine", {"pid_alive": now})

    # ---------------------------------------------------------------------- queue

    def plan(self):
        """Start every queued job that can start now."""
        with self.lock:
            self.plan_due = False
            now = self.clock()
            self.last_plan = now
            site = self.store.get_meta("site")
            if not site:
                return []
            self.settings = controller_settings(site["config"])
            self.fair_share = fairshare.settings(site["config"].get("fair_share"))
            started = self._plan(site["config"], now)
        for record in started:
            self.transport.fire(job_tag(record["job_id"], "starting"),
                                {"job_id": record["job_id"], "state": "starting",
                                 "placement": record["placement"]})
            self.pool.submit(self._start, record)
        return [r["job_id"] for r in started]

    def _plan(self, site_config, now):
        node_slots = int(site_config["slots_per_node"])
        limits = site_config.get("limits") or {}
        self._new_jobs()
        queued = [j for j in self.queue.values() if not j.get("cancel_requested")]
        if not queued:
            return []
        active = list(self.active.values())
        # A node not heard since this controller started (its minion still reconnecting
        # after a master restart) takes no new job: a publish to it would be lost.
        free, running, usage, problems, returning = planner.capacity(
            active, self.closing, self.node_book.seen, self.drains,
            sorted(self.alive(now) & self.node_book.heard), node_slots, now, CLEANUP_TIMEOUT)
        seen = self.node_book.seen
        any_node = sorted(seen)  # one list shared by every job that takes any node
        selftest_settings = site_config.get("selftest") or {}
        withheld = {n: why for n, why in rules.selftest_withheld(
            self.selftest_verdicts, selftest_settings).items() if n in free}
        exempt = selftest_settings.get("user")
        waiting, fits, images = planner.waiting_jobs(queued, any_node, free, seen,
                                                     withheld, exempt)
        self._ask_pulls(images, now)
        priorities = {}
        if site_config.get("queue_order", "fair") == "fair":
            priorities = self._priorities(queued, active, now)
            waiting = fairshare.order(waiting, priorities)
        starts, blocked = sched.plan(
            waiting, free, running, now, node_slots,
            {"max_running_jobs": limits.get("max_running_jobs_per_user"),
             "max_slots": limits.get("max_slots_per_user")},
            # (a site record stored before placement policies existed packs, as it did)
            usage, placement=site_config.get("placement", "pack"), returning=returning,
        )
        started = []
        store = self.store
        with store.transaction() as conn:
            taken = {a for j in active for a in (j.get("job_addresses") or {}).values()}
            taken |= set(self.address_holds)
            next_address = store.get_meta("next_job_address", 0, conn=conn)
            for job_id, placement in starts:
                cidr = self.queue[job_id]["spec"]["config"]["job_network"]["addresses"]
                free_addresses, next_address = addresses.pick(cidr, next_address,
                                                          len(placement), taken)
                if free_addresses is None:
                    blocked[job_id] = "job addresses"
                    continue
                store.set_meta("next_job_address", next_address, conn=conn)
                taken.update(free_addresses)
                record = store.transition(
                    job_id, "starting", expect=("queued",), conn=conn, placement=placement,
                    job_addresses=dict(zip(placement, free_addresses)),
                )
                if record is None:
                    continue
                self._track(record)
                self.starting.add(job_id)
                started.append(record)
            if problems or withheld or any(fit["missing"] for fit in images.values()):
                blocked = planner.explain(blocked, queued, fits, problems, withheld, exempt)
            # Why each job waits, in one row (mpi.list and mpi.status show it).
            if blocked != self.waiting:
                store.set_meta("waiting", blocked, conn=conn)
                self.waiting = blocked
            # Each waiting job's place in the scheduler's order, 1 for the next to start.
            places = {job["id"]: place for place, job in
                      enumerate((j for j in waiting if j["id"] in blocked), 1)}
            if places != self.queue_places:
                store.set_meta("queue_places", places, conn=conn)
                self.queue_places = places
            # Each queued job's priority and its parts (mpi.list and mpi.status show them):
            # at once for jobs not shown yet, else at most every PRIORITIES_WRITE_SECONDS.
            shown = fairshare.shown({job_id: parts for job_id, parts in priorities.items()
                                     if job_id in blocked})
            if shown != self.priorities and (
                    shown.keys() != self.priorities.keys()
                    or now - self.priorities_written >= PRIORITIES_WRITE_SECONDS):
                store.set_meta("priorities", shown, conn=conn)
                self.priorities = shown
                self.priorities_written = now
        return started

    def _priorities(self, queued, active, now):
        """The queued jobs' fair-share priorities (:func:`dmpi.jobs.fairshare.priorities`)
        from the users' decayed usage: ended jobs' and running ones' so far."""
        used = fairshare.usage(self.fair_usage, active, now, self.fair_share["half_life"])
        return fairshare.priorities(queued, used, now, self.fair_share)

    def _ask_pulls(self, images, now):
        """Ask usable nodes that lack a queued job's image to pull it (in the background:
        ``mpi_image.pull`` by digest), so no job waits on a pull once started. Asked
        again after PULL_RETRY while the node still lacks it."""
        asked = {}
        for fit in images.values():
            for node in fit["missing"]:
                key = (node, fit["image_ref"])
                if now - self.pulls.get(key, 0) >= PULL_RETRY:
                    self.pulls[key] = now
                    asked.setdefault(fit["image_ref"], []).append(node)
        for key in [k for k, t in self.pulls.items() if now - t > 10 * PULL_RETRY]:
            del self.pulls[key]
        for image_ref, nodes in asked.items():
            log.info("asking %s to pull %s for queued jobs", ", ".join(nodes), image_ref)
            try:
                self.pool.submit(self.transport.call_async, nodes, "mpi_image.pull",
                                 reference=image_ref)
            except RuntimeError:  # the controller is stopping
                return

    # ---------------------------------------------------------------------- start

    def _start(self, record):
        """Bring up a job's workers and launcher (a worker thread). The outcome is
        recorded on the job and reconciled; nothing here ends a job directly."""
        job_id = record["job_id"]
        timings = dict(record["timings"], queued=round(self.clock() - record["submitted"], 3))
        try:
            started, timings = starter.bring_up(
                self.transport, record, timings, self._job_cas(list(record["placement"])),
                self.clock)
            error = None
        except Exception as exc:  # pylint: disable=broad-except
            failure = StartFailure.from_wire(str(getattr(exc, "error", None) or exc))
            error = failure.message[:2000]
            log.warning("job %s could not start (%s): %s", job_id, failure.kind, error)
        with self.lock:
            self.starting.discard(job_id)
            if error is None:
                running = self.store.transition(
                    job_id, "running", expect=("starting",), started=started,
                    deadline=started + record["walltime"], timings=timings)
                if running is not None:
                    self._track(running)
                    self.transport.fire(job_tag(job_id, "running"),
                                        {"job_id": job_id, "state": "running",
                                         "placement": record["placement"]})
            else:
                if failure.kind == "user_dir":
                    self.store.set_user_dir_ready(record["user"], False)
                self.store.update(job_id, start_error=error, timings=timings)
            current = self.store.get(job_id)
            self._track(current)
            self._reconcile(current, self.clock())
            current = self.store.get(job_id)
            if rules.is_final(current["state"]) and not current.get("closed"):
                self._clean_up_soon(current)
            self.plan_due = True

    def _job_cas(self, nodes):
        """The job CA public key each node last reported (its keys are made there)."""
        with self.lock:
            cas = {n: self.node_book.job_ca(n) for n in nodes}
        missing = sorted(n for n, ca in cas.items() if not ca)
        if missing:
            raise starter.StartError(f"{', '.join(missing)} reported no job CA")
        return cas

    # ------------------------------------------------------------------ addresses

    def _hold_addresses(self, record, pending):
        """Keep the addresses of a job's containers on nodes not yet cleaned out of the
        pool: a cut-off node may still run them, and an address must never be on two
        containers."""
        if not pending:
            return
        with self.lock:
            for node in pending:
                address = (record.get("job_addresses") or {}).get(node)
                if address:
                    self.address_holds[address] = {"job_id": record["job_id"], "node": node}
            self.store.set_meta("address_holds", self.address_holds)

    def _release_addresses(self, node, jobs):
        """A node that reports neither a worker nor a namespace holder of a job any more
        frees that job's addresses."""
        def holds(job_id):
            containers = (jobs.get(job_id) or {}).get("containers") or {}
            return containers.get("worker") or containers.get("netns")

        gone = [a for a, h in self.address_holds.items()
                if h["node"] == node and not holds(h["job_id"])]
        if gone:
            for address in gone:
                self.address_holds.pop(address, None)
            self.store.set_meta("address_holds", self.address_holds)
