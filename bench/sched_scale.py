#!/usr/bin/env python3
"""How long does one scheduling pass (``dmpi.jobs.sched.plan``) take on a large queue?

No cluster and no containers: builds synthetic queues and times ``plan`` alone, the pure
function ``mpi.schedule`` calls once per pass. For each node count (default 100, 1000 and
5000 nodes of 8 slots), seeded so every run sees the same data:

- running: up to 500 jobs of 1-8 ranks, each on one random node with room, holding at
  most half the slots, ending within a day;
- queued: 10 000 jobs of 1-256 ranks, mostly small (1 rank is the most common size, the
  median about 5); 80 % spread freely, 10 % with ``nodes=<count>``, 10 % with
  ``slots_per_node``; 90 % may use every node, 10 % one of four partitions (a grain
  match); 50 users, limits of 200 running jobs and 4096 slots per user; walltimes from a
  minute to a day.

Candidate lists come in two kinds (``--candidates``):

store
    The queue goes through a JSON round trip, as ``mpi.schedule`` reads jobs from the job
    store: every job has its own candidates list and its own node-name strings (about
    4 GB of memory at 5000 nodes). Figure ``sched_pass_<n>_nodes_ms``.
shared
    Jobs that may use the same nodes hold the same list object. Figure
    ``sched_pass_<n>_nodes_shared_lists_ms``.

Prints the median wall time of one pass per node count and kind, how many jobs start and
why the others wait, and a digest of the decisions, so runs of two versions of
the scheduler (``--module``) can be checked to decide the same. Run from the
repository root::

    .venv/bin/python bench/sched_scale.py [--repeat 5] [--nodes 100,1000,5000]
    .venv/bin/python bench/sched_scale.py --module /tmp/sched_old.py --repeat 1

``--short`` (what CI runs): 100 nodes, 1000 queued jobs, one pass of each kind.

No assertions on time; exits non-zero only on bad arguments.
"""

import argparse
import collections
import hashlib
import importlib.util
import json
import math
import pathlib
import random
import sys
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
import figures  # noqa: E402
from dmpi_bench import log, median, parse_args, table  # noqa: E402
from dmpi.jobs import fairshare  # noqa: E402

NODE_SLOTS = 8
NOW = 1_700_000_000.0
USERS = [f"user{i:02d}" for i in range(50)]
LIMITS = {"max_running_jobs": 200, "max_slots": 4096}
WALLTIMES = [60, 600, 3600, 4 * 3600, 86400]
SHORT = {"nodes": "100", "queued": 1000, "repeat": 1}  # what --short (CI) sets


def load_sched(path):
    """The scheduler module: this checkout's ``dmpi.jobs.sched``, or the file ``path``
    (another version of it, to compare decisions)."""
    if path is None:
        from dmpi.jobs import sched  # pylint: disable=import-outside-toplevel
        return sched
    spec = importlib.util.spec_from_file_location("mpi_sched", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_case(node_count, queued_count, running_count, seed, shared):
    """(queued, free, running, usage) of one synthetic cluster, the same for a seed;
    ``shared``: jobs on the same nodes hold one list object, else one list each."""
    rng = random.Random(seed)
    nodes = [f"node{i:05d}" for i in range(node_count)]
    free = {n: NODE_SLOTS for n in nodes}
    running, usage = [], {}
    held, cap = 0, node_count * NODE_SLOTS // 2
    for _ in range(running_count * 4):
        if len(running) == running_count:
            break
        node, ranks = rng.choice(nodes), rng.randint(1, NODE_SLOTS)
        if free[node] < ranks or held + ranks > cap:
            continue
        free[node] -= ranks
        held += ranks
        running.append({"placement": {node: ranks}, "end": NOW + rng.uniform(1, 86400),
                        "user": rng.choice(USERS), "np": ranks,
                        "started": NOW - rng.uniform(1, 86400)})
        mine = usage.setdefault(rng.choice(USERS), {"jobs": 0, "slots": 0})
        mine["jobs"] += 1
        mine["slots"] += ranks
    quarter = max(1, node_count // 4)
    partitions = [nodes[i:i + quarter] for i in range(0, node_count, quarter)]
    queued = []
    for i in range(queued_count):
        # Skewed to small jobs: 1 rank is the most likely size, 256 the largest.
        np = round(2 ** rng.triangular(0, 8, 0))
        count = per_node = None
        shape = rng.random()
        if shape < 0.1:
            least = math.ceil(np / NODE_SLOTS)
            count = rng.randint(least, min(np, 2 * least))
        elif shape < 0.2:
            per_node = rng.randint(1, NODE_SLOTS)
        candidates = nodes if rng.random() < 0.9 else rng.choice(partitions)
        queued.append({
            "id": f"job{i:05d}", "job_id": f"job{i:05d}", "user": rng.choice(USERS), "np": np,
            "candidates": candidates, "count": count, "per_node": per_node,
            "walltime": rng.choice(WALLTIMES), "submitted": NOW - rng.uniform(0, 7 * 86400),
        })
    if not shared:
        # As the runner reads them from the job store: separate lists and strings per job.
        queued = json.loads(json.dumps(queued))
    return queued, free, running, usage


def digest(starts, blocked):
    """Short fingerprint of a pass's decisions, to compare two versions of the module."""
    text = json.dumps([starts, sorted(blocked.items())])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def time_passes(sched, case, repeat, placement, fair):
    """(seconds of each pass, (starts, blocked) of the last). With ``fair``, a pass
    includes what the controller adds before ``plan``: every user's decayed usage (ended
    jobs' kept figure and running jobs' so far), the queued jobs' priorities and the
    queue in their order (``dmpi.jobs.fairshare``, the controller's default settings)."""
    queued, free, running, usage = case
    # A module from before placement policies knows only packing.
    policy = {} if placement == "pack" else {"placement": placement}
    kept = {user: [float(i * 1000), NOW - 3600] for i, user in enumerate(USERS)}
    settings = fairshare.settings(None)  # the defaults: half-lives and max age of 7 days
    seconds = []
    for _ in range(repeat):
        begin = time.perf_counter()
        ordered = queued
        if fair:
            used = fairshare.usage(kept, running, NOW, settings["half_life"])
            ordered = fairshare.order(queued, fairshare.priorities(queued, used, NOW, settings))
        decisions = sched.plan(ordered, free, running, NOW, NODE_SLOTS, LIMITS, usage, **policy)
        seconds.append(time.perf_counter() - begin)
    return seconds, decisions


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", default="100,1000,5000", help="node counts (default 100,1000,5000)")
    parser.add_argument("--queued", type=int, default=10_000, help="queued jobs (default 10000)")
    parser.add_argument("--running", type=int, default=500, help="running jobs (default 500)")
    parser.add_argument("--repeat", type=int, default=5, help="timed passes per node count (default 5)")
    parser.add_argument("--candidates", default="store,shared",
                        help="kinds of candidate lists, store and/or shared (default both)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the synthetic data (default 1)")
    parser.add_argument("--placement", choices=("pack", "spread"), default="pack",
                        help="placement policy, mpi:placement (default pack)")
    parser.add_argument("--queue-order", choices=("fair", "fifo"), default="fair",
                        help="mpi:queue_order: fair times the fair-share priorities and "
                             "ordering with each pass (default fair)")
    parser.add_argument("--module", default=None,
                        help="a scheduler file to time instead of this checkout's "
                             "dmpi/jobs/sched.py")
    parser.add_argument("--short", action="store_true",
                        help="what CI runs: 100 nodes, 1000 queued, one pass of each kind")
    args = parse_args(parser, argv, SHORT)
    counts = [int(c) for c in args.nodes.split(",")]
    kinds = args.candidates.split(",")
    if args.repeat < 1 or args.queued < 1 or args.running < 0 or min(counts) < 1:
        parser.error("--repeat and --queued must be >= 1, --running >= 0, node counts >= 1")
    if not set(kinds) <= {"store", "shared"}:
        parser.error("--candidates takes store and/or shared")
    sched = load_sched(args.module)

    rows = []
    for count in counts:
        for kind in kinds:
            case = build_case(count, args.queued, args.running, args.seed + count,
                              shared=kind == "shared")
            seconds, (starts, blocked) = time_passes(sched, case, args.repeat, args.placement,
                                                     args.queue_order == "fair")
            log(f"{count} nodes, {kind} lists: passes "
                f"{', '.join(f'{s * 1000:.1f}' for s in seconds)} ms")
            why = collections.Counter(
                "reserved" if reason.startswith("reserved for") else reason
                for reason in blocked.values()
            )
            label = (f"sched_pass_{count}_nodes{'_shared_lists' if kind == 'shared' else ''}"
                     f"{'_spread' if args.placement == 'spread' else ''}"
                     f"{'_fifo' if args.queue_order == 'fifo' else ''}_ms")
            rows.append([label, count, kind, len(case[2]), len(case[0]),
                         median(seconds) * 1000, min(seconds) * 1000, len(starts),
                         why["resources"], why["reserved"], why["user limit"],
                         digest(starts, blocked)])
            del case
    print(f"one pass of sched.plan ({sched.__file__}, {args.placement}, queue order "
          f"{args.queue_order}): {args.queued} queued "
          f"jobs, nodes of {NODE_SLOTS} slots, seed {args.seed}, {args.repeat} passes each (ms)")
    print(table(["figure", "nodes", "candidates", "running", "queued", "median ms", "min ms", "start",
                 "resources", "reserved", "user limit", "decisions"], rows))
    for row in rows:
        figures.record(row[0], row[5], 0,
                       aim="under 200" if row[1] == 1000 and row[2] != "shared" else "")
    figures.save(__file__, sys.argv[1:] if argv is None else argv, args.short)
    return 0


if __name__ == "__main__":
    sys.exit(main())
