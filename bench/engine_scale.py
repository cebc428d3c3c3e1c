#!/usr/bin/env python3
"""What does the master's job controller cost at scale, with no containers?

The real job controller (:mod:`dmpi.master.controller` with the real rules, scheduler and SQLite job
store of ``dmpi.jobs`` and the real launch builders) is fed synthetic node evidence as
the ``mpi_node`` engines send it, for 100, 1000 and 5000 nodes of 8 slots. Nodes are
reached through a transport that answers at once (no Salt, no Docker): what is measured
is the engine's own work.

idle
    Every node sends a heartbeat every 2 s and its full report every 10 s (the
    ``mpi_node`` defaults when nothing changes); the engine's clock passes once a second.
    Each event is packed and unpacked with msgpack on the way in, as Salt's event bus
    does. Figure ``engine_idle_cpu_<n>_nodes``: this process's CPU seconds per wall
    second over ``--seconds`` (default 20), in % of one core. Salt's own cost of carrying
    those events (the master's request server decrypting each one) is not included.
busy
    500 jobs running (each with evidence in its nodes' reports; on 100 nodes five or so
    per node, on more nodes each spanning its share of them, a slot left free on every
    20th node) and 10 000 queued jobs of 1-256 ranks, mostly small: the cluster nearly
    full. Figures
    ``engine_pass_<n>_nodes_ms``: one scheduling pass of the engine (store reads,
    ``sched.plan``, the store writes of the jobs that start), median of ``--repeat``;
    and ``engine_busy_cpu_<n>_nodes``: CPU per wall second as in idle, with the running
    jobs reconciled on every report and every pass.

Run from the repository root (no root, no cluster)::

    .venv/bin/python bench/engine_scale.py [--nodes 100,1000,5000] [--seconds 20]

``--short`` (what CI runs): 20 and 100 nodes (fewer and more nodes than its 50 running
jobs, so both ways of placing them), 1000 queued, 1 second of events, one pass.

No assertions on time; exits non-zero only on bad arguments.
"""

import argparse
import json
import pathlib
import random
import sys
import tempfile
import threading
import time

import msgpack

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from dmpi.jobs import store as job_store  # noqa: E402
from dmpi.master import controller  # noqa: E402
import figures  # noqa: E402
from dmpi_bench import log, median, parse_args, table  # noqa: E402

NODE_SLOTS = 8
HEARTBEAT = 2.0
REFRESH = 10.0
#: What ``--short`` (CI) sets: 20 nodes carry several running jobs each, 100 nodes one
#: job spanning several.
SHORT = {"nodes": "20,100", "running": 50, "queued": 1000, "seconds": 1, "repeat": 1}


CONFIG = {
    "cluster_network": "10.0.0.0/8", "job_root": "/var/lib/dockermpi/jobs",
    "job_network": {"name": "dmpi-jobs", "addresses": "10.128.0.0/12"},
    "ports": {"sshd": [20000, 20000], "oob": [20100, 20299], "btl": [20300, 20999]},
    "storage": {"path": "/srv/dockermpi"}, "slots_per_node": NODE_SLOTS,
    "limits": {"memory_per_slot_mb": 512, "pids_per_slot": 128, "cpus_per_slot": 1,
               "tmp_size_mb": 64},
}


class InstantTransport:
    """Nodes that answer at once and always succeed; what a node starts shows in its
    next full report (``reports``), what it cleans up leaves it."""

    def __init__(self, reports):
        self.reports = reports
        self.lock = threading.Lock()

    def call(self, minions, fun, timeout, **kwargs):
        with self.lock:
            for m in minions:
                jobs = self.reports[m]["jobs"]
                if fun == "mpi_job.start_worker":
                    jobs[kwargs["job_id"]] = _job_report(kwargs["launcher"]["node"] == m)
                elif fun == "mpi_job.cleanup":
                    jobs.pop(kwargs["job_id"], None)
                self.reports[m]["digest"] = str(hash(str(sorted(jobs))))
        if fun == "mpi_job.start_worker":
            return {m: {"sshd_ready_seconds": 0.0,
                        "launcher": "l" if kwargs["launcher"]["node"] == m else None}
                    for m in minions}
        return {m: True for m in minions}

    def call_async(self, minions, fun, **kwargs):
        pass

    def seal_for(self, minion, value):
        return value

    def fire(self, tag, data):
        msgpack.packb(data, use_bin_type=True)  # what putting it on the bus costs at least

    def host_addresses(self, minions, network):
        return {m: "10.0.0.1" for m in minions}


def _record(job_id, state, np, user, now, rng, placement=None, addresses=None):
    record = {
        "job_id": job_id, "user": user, "uid": 100000, "image": "mpi", "np": np,
        "cmd": ["python3", "sim.py"], "walltime": rng.choice([600, 3600, 86400]),
        "state": state, "reason": None, "submitted": now, "timings": {},
        "history": [{"state": state, "at": now, "reason": None}],
        "output": {"dir_in_job": f"/data/mpi-jobs/{job_id}"},
        "spec": {"image_ref": "r@sha256:" + "0" * 64, "candidates": None, "count": None,
                 "per_node": None, "env": {}, "workdir": "/data", "config": CONFIG},
    }
    if placement:
        record.update(placement=placement, job_addresses=addresses, started=now,
                      deadline=now + 86400)
    return record


def _job_report(launcher):
    return {"containers": {"worker": "running", "launcher": "running" if launcher else None},
            "launcher_exit_code": None,
            "failure": None, "limits_hit": [], "secrets": True, "peers": {},
            "unreachable_peers": []}


def build(nodes, running, queued, seed=1):
    """A store and engine with ``nodes`` reporting, ``running`` jobs on them and
    ``queued`` jobs waiting; returns (engine, {node: report}, tmpdir)."""
    rng = random.Random(seed)
    tmp = tempfile.TemporaryDirectory()
    store = job_store.open_store(f"{tmp.name}/jobs.sqlite")
    now = time.time()
    store.set_meta("site", {"config": CONFIG, "read": now})
    names = [f"node{i:05d}" for i in range(nodes)]
    # Every node healthy and holding the jobs' image (what mpi_job.health sends).
    health = {"docker": "ok", "storage": "ok", "images": ["r@sha256:" + "0" * 64],
              "job_ca": "ok", "job_ca_public": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeJobCaPublicKeyForTestsOnly0000000000000"}
    reports = {n: {"engine": "ok", "jobs": {}, "time": now, "digest": "0", "health": health}
               for n in names}
    records = []
    free = {n: NODE_SLOTS for n in names}
    address = iter(f"10.128.{k // 250}.{k % 250 + 1}" for k in range(1 << 16))
    for index in range(running):
        job_id = f"20261201-000000-{index:06x}"
        if nodes <= running:
            # several one-node jobs per node, of random sizes, until the node is full
            node = names[index % nodes]
            ranks = min(free[node], rng.randint(1, NODE_SLOTS))
            if ranks <= 0:
                continue
            placement = {node: ranks}
        else:
            # each job spans its own share of the nodes, leaving a slot free on every
            # 20th node: the cluster is nearly full, as the scheduler meets it when busy
            share = names[index * nodes // running:(index + 1) * nodes // running]
            placement = {n: NODE_SLOTS - (1 if int(n[4:]) % 20 == 0 else 0) for n in share}
        for node, ranks in placement.items():
            free[node] -= ranks
            reports[node]["jobs"][job_id] = _job_report(launcher=node == next(iter(placement)))
        records.append(_record(job_id, "running", sum(placement.values()),
                               f"user{index % 50}", now, rng, placement,
                               {node: next(address) for node in placement}))
    # Fill the rest so that most of the queue waits, as on a busy cluster.
    for index in range(queued):
        np = min(256, max(1, int(rng.expovariate(1 / 6))))
        records.append(_record(f"20261201-100000-{index:06x}", "queued", np,
                               f"user{index % 50}", now, rng))
    with store.transaction() as conn:
        conn.executemany("INSERT INTO jobs (id, user, state, record) VALUES (?, ?, ?, ?)",
                         [(r["job_id"], r["user"], r["state"], json.dumps(r))
                          for r in records])
    for report in reports.values():
        report["digest"] = str(hash(str(sorted(report["jobs"]))))
    engine = controller.JobController(store, InstantTransport(reports))
    for node, report in reports.items():
        engine.node_book.seen[node] = {"last_seen": now, "report": report, "digest": report["digest"],
                              "usable": True, "health": health}
    return engine, reports, tmp


def feed(engine, reports, seconds):
    """Heartbeats every 2 s and full reports every 10 s from every node, the clock once a
    second, for ``seconds``; returns CPU seconds per wall second."""
    names = sorted(reports)
    cpu0, wall0 = time.process_time(), time.monotonic()
    for second in range(seconds):
        tick_at = wall0 + second + 1
        for index, node in enumerate(names):
            if (index + second) % int(REFRESH) == 0:
                with engine.transport.lock:  # (worker threads change reports)
                    reports[node]["time"] = time.time()
                    event = msgpack.packb({"id": node, "data": {"report": reports[node]}},
                                          use_bin_type=True)
                data = msgpack.unpackb(event, raw=False)
                engine.node_report(data["id"], data["data"]["report"])
            elif (index + second) % int(HEARTBEAT) == 0:
                event = msgpack.packb({"id": node, "data": {"digest": reports[node]["digest"],
                                                            "time": time.time()}},
                                      use_bin_type=True)
                data = msgpack.unpackb(event, raw=False)
                engine.heartbeat(data["id"], data["data"]["digest"])
        engine.tick()
        time.sleep(max(0.0, tick_at - time.monotonic()))
    return (time.process_time() - cpu0) / (time.monotonic() - wall0)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", default="100,1000,5000")
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--queued", type=int, default=10_000)
    parser.add_argument("--running", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--short", action="store_true",
                        help="what CI runs: 20 and 100 nodes, 50 running, 1000 queued, 1 s, "
                             "one pass")
    args = parse_args(parser, None, SHORT)
    try:
        counts = [int(n) for n in args.nodes.split(",")]
    except ValueError:
        parser.error("--nodes takes comma-separated counts")
    if args.seconds < 1 or args.repeat < 1 or min(counts) < 1:
        parser.error("--seconds, --repeat and --nodes must be positive")
    rows = []
    for count in counts:
        log(f"{count} nodes: idle")
        engine, reports, tmp = build(count, 0, 0)
        engine.grace_until = 0
        idle = feed(engine, reports, args.seconds)
        engine.pool.shutdown(wait=True)
        tmp.cleanup()
        log(f"{count} nodes: {args.running} running, {args.queued} queued")
        engine, reports, tmp = build(count, args.running, args.queued)
        engine.grace_until = 0
        passes = []
        for _ in range(args.repeat):
            started = time.perf_counter()
            engine.plan()
            passes.append(time.perf_counter() - started)
            engine.pool.shutdown(wait=True)
            engine.pool = controller.ThreadPoolExecutor(max_workers=8)
        busy = feed(engine, reports, args.seconds)
        queued_left = len(engine.store.jobs(["queued"]))
        engine.pool.shutdown(wait=True)
        tmp.cleanup()
        rows.append([count, f"{100 * idle:.1f} %", f"{1000 * median(passes):.0f}",
                     f"{100 * busy:.1f} %", queued_left])
        thousand = count == 1000
        figures.record(f"engine_idle_cpu_{count}_nodes", 100 * idle, 2, "%",
                       aim="under 5 %" if thousand else "")
        figures.record(f"engine_pass_{count}_nodes_ms", 1000 * median(passes), 0,
                       aim="under 200" if thousand else "")
        figures.record(f"engine_busy_cpu_{count}_nodes", 100 * busy, 2, "%")
    print()
    print(table(["nodes", "idle CPU", "pass ms", "busy CPU", "still queued"], rows))
    figures.save(__file__, sys.argv[1:], args.short)


if __name__ == "__main__":
    main()
