#!/usr/bin/env python3
"""What does DockerMPI's user API cost per call, on its own, with no cluster?

The real API (``_engines/mpi_api.py``'s ``make_app`` serving the real user calls of
``dmpi.master.user_calls``, as the engine's ``start()`` makes it, and a real SQLite job
store) runs in a child process of its own; this process is the load (tornado's HTTP
client, a new connection per call, as the hub's proxy makes them), the hub's ``GET
/user`` (tokens are checked once each, then the API's cache answers) and the job controller
(``--writes`` updates a second to job records, from this process, into the same file).
The store holds ``--jobs`` records of ``--users`` users (queued, running, ended; their
``spec`` as ``mpi.submit`` writes it, with the site config of defaults.yaml); the
event-bus thread of the engine is not started (there is no bus).

Phases, each ``--seconds`` long:

serial status / serial list
    one client calling back to back: the API's CPU per call of each kind, alone.
flat out
    ``--concurrency`` clients calling back to back, status and list alternately.
paced
    ``--users`` users each polling at ``--rate`` calls a second, status and list
    alternately, as bench/api_load.py's polling users do (open loop).

Figures per phase: calls a second, the API process's CPU in ms per call
(``time.process_time`` of the child, so the load and the hub are not counted) and in
cores, the load's own CPU per call (this process: client, hub, writes), and
p50/p95/p99 of the calls' latency as the client sees it (on a shared machine that
includes the client's own waits for a core). The paced users call in step, as
api_load.py's do: a burst of ``--users`` calls every 1/``--rate`` s, so p95 there is
about the burst's size times the CPU per call of the API and the load together.
Then, as a check, records written from this process are read back through the API at
once (readers must see committed writes).

Then the calls alone: ``status`` and ``list`` called ``--direct`` times each in one
thread of the API's process, as a worker thread calls them: the CPU per call that is the
calls' and the store's, not HTTP's.

``--profile FILE``: the flat-out phase once more under cProfile (the event loop thread
and every worker thread), saved to FILE and its top functions printed.
``--source DIR``: take ``_engines`` and ``_utils`` (the ``dmpi`` package) from DIR (a
copy of another version of the same layout) to compare two versions on one machine.

Run from the repository root (no root, no cluster, no lock)::

    .venv/bin/python bench/api_cpu.py [--short] [--profile /tmp/api.prof]

Exits non-zero when any call answered other than 200 or a write was not seen.
"""

import argparse
import asyncio
import cProfile
import json
import logging
import os
import pathlib
import pstats
import random
import subprocess
import sys
import tempfile
import threading
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "bench")]
from dmpi.jobs import store as job_store  # noqa: E402
import figures as figures_kept  # noqa: E402
from dmpi_bench import fmt, log, table  # noqa: E402

SCOPE = "access:services!service=dockermpi"
PREFIX = "/services/dockermpi/api/v1"
STATES = ("queued", "running", "succeeded", "failed")


def _token(name):
    return f"bench-{name}-0123456789abcdef"


# ------------------------------------------------------------------ the API (child)


def _site_config():
    import yaml  # pylint: disable=import-outside-toplevel

    mpi = yaml.safe_load((REPO / "salt/dockermpi/defaults.yaml").read_text())["mpi"]
    return mpi


def _fill(store, users, jobs, seed=1):
    """``jobs`` records of ``users`` users, shaped as mpi.submit and the engine write
    them; their ids, by user."""
    rng = random.Random(seed)
    mpi = _site_config()
    config = {k: mpi.get(k) for k in ("cluster_network", "job_network", "ports", "storage",
                                      "job_root", "slots_per_node", "limits")}
    ids, waiting = {}, {}
    now = time.time() - 3600
    for i in range(jobs):
        user = f"user{i % users:02d}"
        job_id = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now + i)) + f"-{i:06x}"
        job_dir = f"/srv/dockermpi/users/{user}/mpi-jobs/{job_id}"
        store.add({
            "job_id": job_id, "name": f"run-{i}", "user": user, "uid": 100000 + i % users,
            "image": "mpi", "np": 4, "cmd": ["python3", "/data/pi.py", str(i)],
            "walltime": 600, "state": "queued", "reason": None, "submitted": now + i,
            "history": [{"state": "queued", "at": now + i, "reason": None}],
            "output": {"dir": job_dir, "dir_in_job": f"/data/mpi-jobs/{job_id}",
                       "stdout": f"{job_dir}/stdout", "stderr": f"{job_dir}/stderr",
                       "status": f"{job_dir}/status.json"},
            "timings": {},
            "spec": {"image_ref": "10.251.1.2:5000/dockermpi/mpi@sha256:" + "a" * 64,
                     "candidates": None, "count": None, "per_node": None,
                     "env": {"OMP_NUM_THREADS": "1"}, "workdir": f"/data/mpi-jobs/{job_id}",
                     "config": config},
        })
        state = STATES[(i // users) % len(STATES)]
        if state == "queued":
            waiting[job_id] = rng.choice(["free slots", "user limit"])
        else:
            placement = {f"node{n}": 2 for n in (1, 2)}
            store.transition(job_id, "starting", placement=placement,
                             job_addresses={n: f"10.128.0.{i % 250 + 1}" for n in placement})
            store.transition(job_id, "running", started=now + i + 2,
                             deadline=now + i + 602,
                             timings={"queued": 1.5, "containers": 0.8, "ssh": 0.1})
            if state != "running":
                store.transition(job_id, state, ended=now + i + 30, exit_code=0 if
                                 state == "succeeded" else 1, closed=True,
                                 reason=None if state == "succeeded" else "rank 1 exited 1")
        ids.setdefault(user, []).append(job_id)
    store.set_meta("waiting", waiting)
    return ids


def _profiling_pool(profiles):
    """A ThreadPoolExecutor whose workers run each task under a cProfile of their own
    (cProfile sees only the thread that enables it)."""
    import concurrent.futures  # pylint: disable=import-outside-toplevel

    local = threading.local()
    state = {"on": False}

    class Pool(concurrent.futures.ThreadPoolExecutor):
        def submit(self, fn, /, *args, **kwargs):
            def profiled():
                if not state["on"]:
                    return fn(*args, **kwargs)
                if not hasattr(local, "profile"):
                    local.profile = cProfile.Profile(time.thread_time)
                    profiles.append(local.profile)
                return local.profile.runcall(fn, *args, **kwargs)
            return super().submit(profiled)

    return Pool, state


def serve(args):
    """The child: the API on a free port; answers ``cpu`` and ``profile on|off FILE``
    lines on stdin."""
    import functools  # pylint: disable=import-outside-toplevel

    import salt.config  # pylint: disable=import-outside-toplevel
    import tornado.httpserver  # pylint: disable=import-outside-toplevel
    from dmpi.errors import DockerMPIError  # pylint: disable=import-outside-toplevel
    from dmpi.master import user_calls  # pylint: disable=import-outside-toplevel
    from dmpi.master.site import Site  # pylint: disable=import-outside-toplevel

    from tests.extension import load_extension  # pylint: disable=import-outside-toplevel

    # As a master logs by default (log_level warning): tornado's access log stays silent.
    logging.getLogger().setLevel(getattr(logging, args.log_level.upper()))
    source = pathlib.Path(args.source)
    tmp = pathlib.Path(args.serve)
    config = tmp / "master"
    config.write_text(json.dumps({
        "root_dir": str(tmp), "cachedir": str(tmp / "cache"), "sock_dir": str(tmp / "sock"),
        "pki_dir": str(tmp / "pki"), "log_file": str(tmp / "master.log")}))
    opts = salt.config.master_config(str(config))
    opts["__role"] = "master"
    site = Site(opts)
    functions = {name: functools.partial(fun, site) for name, fun in user_calls.CALLS.items()}
    store = site.store()
    ids = _fill(store, args.users, args.jobs)
    mpi_api = load_extension(str(source / "_engines" / "mpi_api.py"), "mpi_api_bench")
    profiles = []
    main_profile = cProfile.Profile(time.thread_time)
    pool, profiling = _profiling_pool(profiles)
    # (concurrent.futures itself: this process only runs the API)
    mpi_api.concurrent.futures.ThreadPoolExecutor = pool
    limits = dict(_site_config()["api"]["limits"])
    # The site's rate per user would refuse the flat-out phases; its cost is the same.
    limits.update(requests_per_second=100000, burst=100000)
    settings = {"hub_api_url": args.hub, "allowed_clients": ["127.0.0.0/8"],
                "token_cache_seconds": 3600, "limits": limits, "workers": args.workers}
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    app, _ = mpi_api.make_app(site, functions, settings)
    server = tornado.httpserver.HTTPServer(app, max_body_size=mpi_api.DISCARD_BYTES,
                                           max_buffer_size=1 << 20,
                                           idle_connection_timeout=3600)
    import socket  # pylint: disable=import-outside-toplevel

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    sock.setblocking(False)
    server.add_sockets([sock])

    def profile(on, path=None):
        profiling["on"] = on
        if on:
            main_profile.enable()
            return
        main_profile.disable()
        stats = pstats.Stats(main_profile)
        for each in profiles:
            stats.add(each)
        stats.dump_stats(path)

    def direct(fun, count):
        """CPU ms per call of the user call alone, as a worker thread calls it (no HTTP,
        no event loop, no thread hop)."""
        user = sorted(ids)[0]
        caller = user_calls.hub_user(user)
        kwargs = {"job_id": ids[user][-1]} if fun == "status" else {}
        started = time.process_time()
        for _ in range(count):
            try:
                functions[fun](caller, **kwargs)
            except DockerMPIError as exc:
                return f"{fun} failed: {exc}"
        return 1000 * (time.process_time() - started) / count

    def commands():
        for line in sys.stdin:
            words = line.split()
            if words[:1] == ["cpu"]:
                answer = time.process_time()
            elif words[:1] == ["direct"]:
                answer = direct(words[1], int(words[2]))
            elif words[:1] == ["profile"]:
                done = threading.Event()

                def toggle(on=words[1] == "on", path=words[2] if len(words) > 2 else None):
                    profile(on, path)
                    done.set()
                loop.call_soon_threadsafe(toggle)
                done.wait()
                answer = "ok"
            else:
                answer = f"unknown command {line.strip()!r}"
            print(json.dumps(answer), flush=True)
        loop.call_soon_threadsafe(loop.stop)

    print(json.dumps({"port": sock.getsockname()[1], "ids": ids,
                      "store": store.path}), flush=True)
    threading.Thread(target=commands, daemon=True).start()
    loop.run_forever()


# ------------------------------------------------------------- the load (parent)


class Api:
    """The child process and a way to call it."""

    def __init__(self, proc, port):
        self.proc = proc
        self.base = f"http://127.0.0.1:{port}{PREFIX}"

    def ask(self, command):
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def cpu(self):
        return float(self.ask("cpu"))


async def _call(http, api, user, path):
    """(status, answer, seconds)."""
    started = time.perf_counter()
    answer = await http.fetch(api.base + path, raise_error=False, request_timeout=60,
                              headers={"Authorization": f"token {_token(user)}"})
    seconds = time.perf_counter() - started
    try:
        found = json.loads(answer.body) if answer.body else None
    except ValueError:
        found = None
    return answer.code, found, seconds


async def _phase(http, api, clients, seconds, rate=None):
    """``clients``: [(user, [paths to call in turn])]; each calls back to back (or at
    ``rate`` a second). Figures of the phase and its errors."""
    latencies, errors, calls = [], [], [0]

    async def client(user, paths):
        turn, next_call = 0, time.monotonic()
        while time.monotonic() < until:
            status, found, took = await _call(http, api, user, paths[turn % len(paths)])
            turn += 1
            calls[0] += 1
            if status == 200:
                latencies.append(took)
            else:
                errors.append(f"{user} {paths[(turn - 1) % len(paths)]}: {status} "
                              f"{str(found)[:120]}")
            if rate:
                next_call += 1 / rate
                await asyncio.sleep(max(0.0, next_call - time.monotonic()))

    cpu_before, started, load_before = api.cpu(), time.monotonic(), time.process_time()
    until = started + seconds
    await asyncio.gather(*(client(user, paths) for user, paths in clients))
    wall = time.monotonic() - started
    cpu, load = api.cpu() - cpu_before, time.process_time() - load_before
    ms = sorted(x * 1000 for x in latencies) or [float("nan")]

    def pct(p):
        return ms[min(len(ms) - 1, int(p / 100 * len(ms)))]

    return {"calls": calls[0], "calls_per_s": calls[0] / wall,
            "cpu_ms": 1000 * cpu / max(1, calls[0]), "cores": cpu / wall,
            "load_ms": 1000 * load / max(1, calls[0]),
            "p50": pct(50), "p95": pct(95), "p99": pct(99), "errors": errors}


async def _writes_seen(http, api, store, ids, count):
    """Records updated from this process, read through the API at once; the problems."""
    problems = []
    users = sorted(ids)
    for n in range(count):
        user = users[n % len(users)]
        job_id = ids[user][n % len(ids[user])]
        mark = f"{time.time():.6f}-{n}"
        store.update(job_id, bench_mark=mark)
        status, found, _ = await _call(http, api, user, f"/jobs/{job_id}")
        if status != 200 or found.get("bench_mark") != mark:
            problems.append(f"{job_id}: wrote bench_mark {mark}, the API answered {status} "
                            f"{str(found and found.get('bench_mark'))[:60]}")
    return problems


def _writer(store, ids, per_second, stop):
    """The job controller's share: records updated ``per_second`` times a second."""
    every = [job for jobs in ids.values() for job in jobs]
    rng = random.Random(2)
    while not stop.wait(1 / per_second):
        store.update(rng.choice(every), timings={"tick": time.time()})


async def _hub(port_holder):
    import tornado.httpserver  # pylint: disable=import-outside-toplevel
    import tornado.web  # pylint: disable=import-outside-toplevel

    class HubUser(tornado.web.RequestHandler):
        def get(self):
            token = self.request.headers.get("Authorization", "").partition(" ")[2]
            name = token.split("-")[1] if token.startswith("bench-") else None
            if name is None:
                self.set_status(403)
                self.finish({"status": 403})
            else:
                self.finish({"kind": "user", "name": name, "scopes": [SCOPE]})

    import socket  # pylint: disable=import-outside-toplevel

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    sock.setblocking(False)
    tornado.httpserver.HTTPServer(tornado.web.Application(
        [("/hub/api/user", HubUser)])).add_sockets([sock])
    port_holder.append(sock.getsockname()[1])


async def main(args):
    import tornado.httpclient  # pylint: disable=import-outside-toplevel

    tornado.httpclient.AsyncHTTPClient.configure(None, max_clients=1000)
    http = tornado.httpclient.AsyncHTTPClient()
    hub_port = []
    await _hub(hub_port)
    tmp = tempfile.TemporaryDirectory(prefix="api_cpu-")
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve", tmp.name, "--hub",
         f"http://127.0.0.1:{hub_port[0]}/hub/api", "--source", args.source,
         "--users", str(args.users), "--jobs", str(args.jobs), "--log-level", args.log_level,
         "--workers", str(args.workers)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO,
        # The dmpi package of --source, before any other on the path.
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(pathlib.Path(args.source) / "_utils")]
            + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])))
    try:
        ready = await asyncio.get_running_loop().run_in_executor(None, proc.stdout.readline)
        if not ready:
            raise RuntimeError("the API process ended before it listened")
        found = json.loads(ready)
        api, ids = Api(proc, found["port"]), found["ids"]
        store = job_store.JobStore(found["store"])
        users = sorted(ids)

        def mixed(user):
            return [(user, ["/jobs", f"/jobs/{ids[user][-1]}"])]

        # Every user's token once, so the phases measure the API with its cache warm.
        warm = await _phase(http, api, [c for u in users for c in mixed(u)], 0.001)
        stop = threading.Event()
        writer = threading.Thread(target=_writer, args=(store, ids, args.writes, stop),
                                  daemon=True)
        if args.writes:
            writer.start()
        rows, failed = [], list(warm["errors"])
        phases = [("serial status", 1, [(users[0], [f"/jobs/{ids[users[0]][-1]}"])], None),
                  ("serial list", 1, [(users[0], ["/jobs"])], None)]
        for concurrency in args.concurrency:
            phases.append((f"flat out x{concurrency}", concurrency,
                           [c for n in range(concurrency)
                            for c in mixed(users[n % len(users)])], None))
        phases.append((f"paced {args.users} users @{args.rate:g}/s", args.users,
                       [c for u in users for c in mixed(u)], args.rate))
        for name, concurrency, clients, rate in phases:
            log(f"{name} for {args.seconds:g} s")
            figures = await _phase(http, api, clients, args.seconds, rate)
            failed += figures["errors"]
            rows.append([name, concurrency, figures["calls"], fmt(figures["calls_per_s"], 1),
                         fmt(figures["cpu_ms"], 3), fmt(figures["cores"]),
                         fmt(figures["load_ms"], 3),
                         fmt(figures["p50"], 1), fmt(figures["p95"], 1),
                         fmt(figures["p99"], 1), len(figures["errors"])])
            key = name.split(" ")[0] + ("_" + name.split(" ")[1] if name.startswith("serial")
                                        else f"_{concurrency}")
            figures_kept.record(f"api_cpu_{key}_cpu_ms_per_call", figures["cpu_ms"], 3)
            figures_kept.record(f"api_cpu_{key}_p95_ms", figures["p95"], 1)
        direct = {}
        for fun in ("status", "list"):
            direct[fun] = api.ask(f"direct {fun} {args.direct}")
            if isinstance(direct[fun], str):
                failed.append(direct[fun])
            else:
                figures_kept.record(f"api_cpu_call_{fun}_cpu_ms_per_call", direct[fun], 3)
        if args.profile:
            concurrency = max(args.concurrency)
            log(f"flat out x{concurrency} under cProfile for {args.seconds:g} s")
            api.ask("profile on")
            await _phase(http, api, [c for n in range(concurrency)
                                     for c in mixed(users[n % len(users)])], args.seconds)
            api.ask(f"profile off {args.profile}")
        stop.set()
        if args.writes:
            writer.join(10)
        failed += await _writes_seen(http, api, store, ids, 20)
    finally:
        proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        tmp.cleanup()
    print(table(["phase", "clients", "calls", "calls/s", "API CPU ms/call", "API cores",
                 "load CPU ms/call", "p50 ms", "p95 ms", "p99 ms", "errors"], rows))
    print(f"\nthe calls alone (status / list called {args.direct} times in one "
          "thread, no HTTP): " + ", ".join(f"{fun} {fmt(ms, 3)} ms" for fun, ms in direct.items()
                                           if not isinstance(ms, str)) + " of CPU per call")
    if args.profile:
        print(f"\ncProfile of the API's threads (saved to {args.profile}), by own time:")
        pstats.Stats(args.profile).sort_stats("tottime").print_stats(args.top)
    for problem in failed[:20]:
        print("error:", problem)
    figures_kept.save(__file__, sys.argv[1:], args.short)
    return 1 if failed else 0


def parse():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=50)
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--concurrency", default="8,50",
                        type=lambda t: [int(x) for x in t.split(",")])
    parser.add_argument("--rate", type=float, default=5,
                        help="calls a second of each user in the paced phase")
    parser.add_argument("--writes", type=float, default=10,
                        help="record updates a second from this process (0: none)")
    parser.add_argument("--direct", type=int, default=2000,
                        help="calls of each runner function alone, without HTTP")
    parser.add_argument("--profile", metavar="FILE")
    parser.add_argument("--top", type=int, default=40, help="functions of the profile shown")
    parser.add_argument("--source", default=str(REPO),
                        help="the tree whose _engines, _runners and _utils are measured")
    parser.add_argument("--workers", type=int, default=16,
                        help="the API's worker threads (the engine's default: 16)")
    parser.add_argument("--log-level", default="warning",
                        help="the API process's root log level (info: every call logged)")
    parser.add_argument("--short", action="store_true",
                        help="1 s a phase and 300 direct calls: a quick look")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--hub", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.short:
        args.seconds, args.direct = 1, 300
    if min(args.concurrency) < 1 or args.users < 1 or args.jobs < args.users:
        parser.error("--concurrency and --users must be at least 1, --jobs at least --users")
    return args


if __name__ == "__main__":
    ARGS = parse()
    if ARGS.serve:
        serve(ARGS)
        sys.exit(0)
    sys.exit(asyncio.run(main(ARGS)))
