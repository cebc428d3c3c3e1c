#!/usr/bin/env python3
"""How many short 2-node jobs per minute does the DockerMPI queue run, and does it ever
double-book a slot?

Submits M jobs (default 20; np=4, nodes=2, ``hostname``) with ``salt-run mpi.submit`` as
fast as one submitter can (``--parallel`` submitters at once), then polls ``mpi.list``
until every one has ended, and reports:

- jobs per minute: M / (last end - first submit);
- queue wait (``timings.queued``, from submit until the scheduler started it): mean,
  median, max;
- per job state (every job must succeed);
- slot check: from every job's history (``starting`` at -> end at) and placement, the
  largest number of ranks placed on each node at the same moment; it must not exceed the
  node's slots (2).

Run holding the cluster lock::

    flock /tmp/dmpi-cluster.lock .venv/bin/python bench/throughput.py [--jobs 20]

Exits non-zero when a job does not succeed, a slot is double-booked, or anything of a job
is left behind; unfinished jobs are cancelled in ``finally`` (also on Ctrl-C, SIGTERM).
"""

import argparse
import pathlib
import sys
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from dmpi_bench import (  # noqa: E402
    FINAL, NODES, SLOTS_PER_NODE, BenchError, Jobs, Terminated, log, median, salt_run, table,
    trap_sigterm, verdict, check_common_args,
)

T_ALL = 180     # wait at most this long for all jobs to end


def overlap(jobs):
    """{node: (max ranks at once, [job ids at that moment])} from history + placement."""
    events = {}
    for job in jobs:
        history = job.get("history") or []
        start = next((h["at"] for h in history if h["state"] == "starting"), None)
        end = next((h["at"] for h in history if h["state"] in FINAL), None)
        if start is None:
            continue
        if end is None:
            end = float("inf")
        for node, ranks in (job.get("placement") or {}).items():
            events.setdefault(node, []).append((start, ranks, job["job_id"]))
            events.setdefault(node, []).append((end, -ranks, job["job_id"]))
    result = {}
    for node, items in events.items():
        # Ends sort before starts at the same instant: a slot freed and taken at once is
        # not an overlap.
        items.sort(key=lambda e: (e[0], e[1]))
        current, best, holders, at_best = 0, 0, set(), []
        for _, ranks, job_id in items:
            current += ranks
            (holders.add if ranks > 0 else holders.discard)(job_id)
            if current > best:
                best, at_best = current, sorted(holders)
        result[node] = (best, at_best)
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=20, help="jobs to submit (default 20)")
    parser.add_argument("--cmd", default="hostname", help="program of every job (default hostname)")
    parser.add_argument("--parallel", type=int, default=1,
                        help="concurrent salt-run mpi.submit calls (default 1)")
    parser.add_argument("--user", default="bench-tput", help="job user (starts with bench)")
    args = parser.parse_args(argv)
    if not 1 <= args.jobs <= 200 or not 1 <= args.parallel <= 8:
        parser.error("--jobs 1..200, --parallel 1..8")
    check_common_args(parser, args)
    trap_sigterm()

    jobs = Jobs(args.user)
    failure, records = None, {}
    submit_seconds = None
    try:
        t0 = time.monotonic()
        with ThreadPoolExecutor(max_workers=args.parallel) as pool:
            futures = [pool.submit(jobs.submit, 4, args.cmd, nodes=2, walltime=120)
                       for _ in range(args.jobs)]
            for future in futures:
                future.result()
        submit_seconds = time.monotonic() - t0
        log(f"submitted {args.jobs} jobs in {submit_seconds:.1f} s")
        mine = set(jobs.ids)
        deadline = time.monotonic() + T_ALL
        while True:
            code, listing = salt_run("mpi.list", user=args.user)
            if not isinstance(listing, list):
                raise BenchError(f"mpi.list (exit {code}): {listing!r}"[:1500])
            states = {j["job_id"]: j["state"] for j in listing if j["job_id"] in mine}
            done = sum(1 for s in states.values() if s in FINAL)
            if done == len(mine):
                break
            if time.monotonic() > deadline:
                raise BenchError(f"only {done}/{len(mine)} jobs ended within {T_ALL} s")
            time.sleep(1)
        for job_id in jobs.ids:
            records[job_id] = jobs.status(job_id)
    except (KeyboardInterrupt, Terminated) as exc:
        failure = f"interrupted ({type(exc).__name__})"
    except BenchError as exc:
        failure = str(exc)
    finally:
        try:
            jobs.close()
        except BenchError as exc:
            failure = (failure or "") + f"\ncleanup: {exc}"

    problems = []
    if records:
        recs = list(records.values())
        first = min(r["submitted"] for r in recs)
        last = max(r.get("ended") or 0 for r in recs)
        span = last - first
        waits = [r["timings"]["queued"] for r in recs if "queued" in (r.get("timings") or {})]
        by_state = {}
        for r in recs:
            by_state.setdefault(r["state"], []).append(r)
        print(f"{len(recs)} jobs (np=4, nodes=2, {args.cmd!r}), submitted in "
              f"{submit_seconds:.1f} s with {args.parallel} submitter(s)")
        print(table(["jobs", "span s", "jobs/min", "wait mean", "wait median", "wait max",
                     "run median", "states"],
                    [[len(recs), span, 60 * len(recs) / span if span > 0 else None,
                      sum(waits) / len(waits) if waits else None, median(waits),
                      max(waits) if waits else None,
                      median([r["ended"] - r["started"] for r in recs
                              if r.get("started") and r.get("ended")]),
                      ", ".join(f"{k}={len(v)}" for k, v in sorted(by_state.items()))]]))
        for state, rs in sorted(by_state.items()):
            if state != "succeeded":
                for r in rs:
                    problems.append(f"{r['job_id']} {state}: {r.get('reason')}")
        peaks = overlap(recs)
        print()
        print(table(["node", "slots", "max ranks at once", "jobs then", "verdict"],
                    [[n, SLOTS_PER_NODE, peaks.get(n, (0, []))[0],
                      ",".join(j[-6:] for j in peaks.get(n, (0, []))[1]) or "-",
                      "ok" if peaks.get(n, (0, []))[0] <= SLOTS_PER_NODE else "DOUBLE-BOOKED"]
                     for n in NODES]))
        for node, (peak, holders) in peaks.items():
            if peak > SLOTS_PER_NODE:
                problems.append(f"{node}: {peak} ranks at once ({holders})")
    return verdict("throughput", failure, problems)


if __name__ == "__main__":
    sys.exit(main())
