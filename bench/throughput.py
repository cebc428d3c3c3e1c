#!/usr/bin/env python3
"""How many short 2-node jobs per minute does the DockerMPI queue run, and does it ever
double-book a slot?

Submits M jobs (default 20; np=4, nodes=2, ``hostname``; ``--ranks-per-node 1``: np=2)
with ``mpi.submit`` as fast as ``--parallel`` submitters can (each a user of its own, as
the per-user running-job limit is meant for people), each through a long-lived
RunnerClient in the master as an API server calls it (``--via salt-run``: a salt-run
process per call), then polls ``mpi.list`` until every one has ended, and reports:

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

``--short`` (what CI runs): 4 jobs from 2 submitters.
"""

import argparse
import pathlib
import sys
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import figures  # noqa: E402
from dmpi_bench import (  # noqa: E402
    FINAL, NODES, SLOTS_PER_NODE, BenchError, Jobs, RunnerSession, Terminated, log, median,
    salt_run, table, trap_sigterm, verdict, check_common_args, parse_args,
)

T_ALL = 180     # wait at most this long for all jobs to end
SHORT = {"jobs": 4, "parallel": 2}  # what --short (CI) sets


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
    parser.add_argument("--ranks-per-node", type=int, default=SLOTS_PER_NODE,
                        help=f"ranks on each of a job's 2 nodes (default {SLOTS_PER_NODE}: one "
                             "job fills 2 nodes; 1 lets 3 jobs share the 3 nodes)")
    parser.add_argument("--via", choices=("api", "salt-run"), default="api",
                        help="submit (and poll) through one long-lived RunnerClient per "
                             "submitter in the master, as an API server does (default), or "
                             "through a salt-run process per call")
    parser.add_argument("--user", default="bench-tput",
                        help="job user (starts with bench); submitter k submits as <user>-k, "
                             "so the per-user running-job limit applies to each as to a person")
    parser.add_argument("--short", action="store_true",
                        help="what CI runs: 4 jobs from 2 submitters")
    args = parse_args(parser, argv, SHORT)
    if not 1 <= args.jobs <= 200 or not 1 <= args.parallel <= 8 \
            or not 1 <= args.ranks_per_node <= SLOTS_PER_NODE:
        parser.error(f"--jobs 1..200, --parallel 1..8, --ranks-per-node 1..{SLOTS_PER_NODE}")
    np = 2 * args.ranks_per_node
    check_common_args(parser, args)
    trap_sigterm()

    jobs = Jobs(args.user)

    def submitter_user(number):
        return f"{args.user}-{number % args.parallel}"

    failure, records = None, {}
    submit_seconds = None
    sessions = []
    try:
        if args.via == "api":
            sessions = [RunnerSession() for _ in range(args.parallel)]

        def submit(number):
            session = sessions[number % len(sessions)] if sessions else None
            return jobs.submit(np, args.cmd, nodes=2, slots_per_node=args.ranks_per_node,
                               walltime="2m", session=session, user=submitter_user(number))

        t0 = time.monotonic()
        with ThreadPoolExecutor(max_workers=args.parallel) as pool:
            # submitter k makes calls k, k + parallel, ...: one session never serves two
            # threads at once
            futures = [pool.submit(lambda k=k: [submit(n) for n in
                                                range(k, args.jobs, args.parallel)])
                       for k in range(args.parallel)]
            for future in futures:
                future.result()
        submit_seconds = time.monotonic() - t0
        log(f"submitted {args.jobs} jobs in {submit_seconds:.1f} s")
        mine = set(jobs.ids)
        deadline = time.monotonic() + T_ALL
        while True:
            if sessions:
                _, listing = sessions[0].call("mpi.list")
                code = 0
            else:
                code, listing = salt_run("mpi.list")
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
        for session in sessions:
            session.close()
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
        print(f"{len(recs)} jobs (np={np}, nodes=2, {args.cmd!r}), submitted in "
              f"{submit_seconds:.1f} s by {args.parallel} submitter(s) through {args.via}")
        print(table(["jobs", "span s", "jobs/min", "wait mean", "wait median", "wait max",
                     "run median", "states"],
                    [[len(recs), span, 60 * len(recs) / span if span > 0 else None,
                      sum(waits) / len(waits) if waits else None, median(waits),
                      max(waits) if waits else None,
                      median([r["ended"] - r["started"] for r in recs
                              if r.get("started") and r.get("ended")]),
                      ", ".join(f"{k}={len(v)}" for k, v in sorted(by_state.items()))]]))
        if span > 0:
            print()
            figures.record(f"throughput_np{np}_jobs_per_min", 60 * len(recs) / span, 1,
                           aim="60")
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
    figures.save(__file__, sys.argv[1:] if argv is None else argv, args.short)
    return verdict("throughput", failure, problems)


if __name__ == "__main__":
    sys.exit(main())
