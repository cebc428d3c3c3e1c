#!/usr/bin/env python3
"""How does DockerMPI's user API hold up under a class of users?

For each user count (``--users 20,50,100``), that many hub users, each with a real token
of their own from the test cluster's hub, call the API the way notebooks do (on the
master, directly over TLS, each user on a connection kept between calls as
``dockermpi.Client`` keeps it, a submit on a new one; ``--new-connections``: a new
connection per call, as a one-shot ``mpi`` command makes; ``--through-proxy``: the way
browsers do, through the hub's proxy on the API's own origin
dockermpi--service.hub.dmpi.test): most poll their jobs (``GET
/jobs``, ``GET /jobs/<id>`` of a job of their own, alternately, ``--rate`` calls a second
each, spread evenly over the period; ``--in-step``: all at the same instants),
``--followers`` of them
follow a running job of their own that prints a line a second (``GET /events?job=``),
and one more user launches 2-node jobs one after the other (``POST /jobs``, then ``GET
/jobs/<id>/wait``) for the whole run; the launches that ended within it are timed. Before
the load, ``--launches`` of the launching user's jobs are timed on the idle cluster.

Prints, per user count: calls a second, p50/p95/p99 of status and list calls, errors
(any answer but 200, 429 included), the API process's CPU (cores, from /proc on the
master), the node hosts' CPU (cores, their cgroups: Salt, Docker and systemd there, where
following jobs costs the reads of their output; not the jobs' own), and the launch time
(submit to the end, median) under load against idle, with their ratio. The load
generator runs on this machine too, sharing its cores.

Before the rounds, ``--follow-cost`` users follow a job each with nothing else running, and
it prints what that costs the nodes and the master (their hosts' CPU while the jobs are
followed less while they run unfollowed), per follower.

``--short`` (what CI runs): 4 users, 5 seconds, one follower, one launch on the idle
cluster; the follow cost of one follower over 5 s.
Exits non-zero when a call failed or a launched job did not succeed.
"""

import argparse
import asyncio
import json
import os
import pathlib
import ssl
import statistics
import sys
import tempfile
import time
import urllib.parse

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import tornado.httpclient  # noqa: E402  (a dependency of Salt, in .venv)

from bench import figures  # noqa: E402
from bench.dmpi_bench import (MASTER, NODES, cgroup_seconds, fmt, host_cpu_files,  # noqa: E402
                              log, run, table)
from tests.cluster.testcluster import (API_NOTEBOOK_URL, API_PUBLIC_URL,  # noqa: E402
                                       HUB_ADDR, HUB_API_URL, TestCluster, api_process,
                                       hub_admin_token)

#: The API as notebooks call it (this machine is among the test API's allowed clients),
#: and on its own origin as browsers call it: the proxy on the hub host (the test cluster
#: has no DNS: the client maps the name). Certificates checked either way.
API_DIRECT = f"{API_NOTEBOOK_URL}/api/v1"
API_PROXIED = f"{API_PUBLIC_URL}/api/v1"
API = API_DIRECT
FINAL = ("succeeded", "failed", "cancelled", "timed_out")
USER_PREFIX = "apiload-"


class Hub:
    """The test hub's admin API, as the admin service calls it."""

    def __init__(self, http):
        self.http = http
        self.admin = hub_admin_token()

    async def call(self, method, path, body=None):
        answer = await self.http.fetch(
            HUB_API_URL + path, method=method, raise_error=False,
            headers={"Authorization": f"token {self.admin}"},
            body=None if body is None else json.dumps(body),
            allow_nonstandard_methods=True)
        if answer.code >= 400 and answer.code != 409:
            raise RuntimeError(f"hub {method} {path}: {answer.code} {answer.body[:200]!r}")
        return json.loads(answer.body) if answer.body else None

    async def token(self, name):
        quoted = urllib.parse.quote(name, safe="")
        await self.call("POST", f"/users/{quoted}")  # 409 when it exists
        found = await self.call("POST", f"/users/{quoted}/tokens", {"note": "api_load"})
        return found["token"]

    async def remove(self, name):
        await self.call("DELETE", f"/users/{urllib.parse.quote(name, safe='')}")


class User:
    """One hub user calling the API with their own token."""

    def __init__(self, http, name, token):
        self.http = http
        self.name = name
        self.token = token
        self.connection = None  # (reader, writer) kept between calls, as the client keeps it

    async def call(self, method, path, body=None, timeout=90):
        """(status, answer, seconds)."""
        started = time.perf_counter()
        # As dockermpi.Client: a submit always starts on a new connection.
        keeper = self if KEEP_CONNECTIONS["on"] and (method, path) != ("POST", "/jobs") else None
        code, text = await asyncio.wait_for(
            one_call(method, API + path, self.token, None if body is None else json.dumps(body),
                     keeper),
            timeout)
        seconds = time.perf_counter() - started
        try:
            found = json.loads(text) if text else None
        except ValueError:
            found = text[:200]
        return code, found, seconds

    async def submit(self, cmd, np=1, nodes=None):
        status, job, _ = await self.call("POST", "/jobs", {
            "image": "mpi", "np": np, "cmd": cmd, "nodes": nodes, "walltime": "10m"})
        if status != 201:
            raise RuntimeError(f"{self.name}: submit answered {status}: {job}")
        return job["job_id"]

    async def wait(self, job_id):
        while True:
            status, job, _ = await self.call("GET", f"/jobs/{job_id}/wait?timeout=60")
            if status != 200:
                raise RuntimeError(f"{self.name}: wait answered {status}: {job}")
            if job["state"] in FINAL:
                return job


TLS = {}  # the one client context of the run (the test cluster's CA)
KEEP_CONNECTIONS = {"on": True}  # --new-connections turns it off for the run


async def one_call(method, url, token, body, keeper=None):
    """``(status, body)`` of one HTTP/1.1 request: on ``keeper``'s kept connection (opened
    when it has none), or on a connection of its own closed after it. Asyncio's streams
    rather than a full HTTP client, so one process can stand for many users' notebooks
    without its own overhead in the figures. A name the test cluster has no DNS for goes to the hub host,
    as the client's hostname mapping says (the certificate is checked against the name)."""
    parts = urllib.parse.urlsplit(url)
    address = HUB_ADDR if parts.hostname == urllib.parse.urlsplit(API_PUBLIC_URL).hostname \
        else parts.hostname
    if keeper is not None and keeper.connection is not None:
        reader, writer = keeper.connection
    else:
        reader, writer = await asyncio.open_connection(address, parts.port or 443,
                                                       ssl=TLS["context"],
                                                       server_hostname=parts.hostname)
    kept = False
    try:
        data = (body or "").encode()
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        writer.write(f"{method} {target} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
                     f"Authorization: token {token}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(data)}\r\n"
                     f"Connection: {'keep-alive' if keeper else 'close'}\r\n\r\n".encode()
                     + data)
        status = int((await reader.readline()).split()[1])
        length = None
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        text = await (reader.readexactly(length) if length is not None else reader.read())
        kept = keeper is not None and length is not None
        return status, text
    finally:
        if kept:
            keeper.connection = (reader, writer)
        else:
            writer.close()
            if keeper is not None:
                keeper.connection = None


def api_cpu_seconds():
    """CPU seconds the API's process has used."""
    return api_process(lambda argv: run(["docker", "exec", MASTER, *argv], timeout=30).stdout)[
        "cpu_seconds"]


def hosts_cpu(hosts):
    """A function giving the CPU seconds the cluster hosts ``hosts`` have used (Salt,
    Docker, systemd and the API there: not the jobs'); their cgroups are found once."""
    files = list(host_cpu_files(hosts)[0].values())
    return lambda: sum(cgroup_seconds(path) for path in files)


async def launch_time(user):
    """Seconds from submit to the end of one 2-node job."""
    started = time.perf_counter()
    job = await user.wait(await user.submit(["hostname"], np=2, nodes=2))
    if job["state"] != "succeeded":
        raise RuntimeError(f"a launched job ended {job['state']}: {job.get('reason')}")
    return time.perf_counter() - started


async def launch_times(user, count):
    """Seconds from submit to the end of ``count`` 2-node jobs, one after the other."""
    return [await launch_time(user) for _ in range(count)]


async def launches_until(user, until):
    """Seconds from submit to the end of 2-node jobs launched one after the other until
    ``until``: those that ended by then (the whole launch under load), or the first when
    none did (a slow machine: it started under load all the same)."""
    times = []
    while time.monotonic() < until:
        seconds = await launch_time(user)
        if time.monotonic() <= until or not times:
            times.append(seconds)
    return times


async def poll(user, paths, until, rate, latencies, errors, offset=0.0):
    """Call ``paths`` in turn (list and status: a notebook panel or an open ``mpi list``
    loop), ``rate`` calls a second, the first ``offset`` seconds from now, until
    ``until``."""
    turn, next_call = 0, time.monotonic() + offset
    await asyncio.sleep(offset)
    # (a user whose calls take longer than the period falls behind, and stops at until)
    while next_call < until and time.monotonic() < until:
        path = paths[turn % len(paths)]
        status, found, seconds = await user.call("GET", path)
        turn += 1
        if status == 200:
            latencies.append(seconds)
        else:
            errors.append(f"{user.name} {path}: {status} {str(found)[:120]}")
        next_call += 1 / rate
        await asyncio.sleep(max(0.0, next_call - time.monotonic()))


async def follow(user, job_id, until, errors):
    """Follow a job's event stream until ``until``; how many output events came."""
    seen = {"output": 0}

    def on_chunk(chunk):
        seen["output"] += chunk.count(b"event: output")

    try:
        answer = await user.http.fetch(
            f"{API}/events?job={job_id}", raise_error=False, streaming_callback=on_chunk,
            headers={"Authorization": f"token {user.token}"},
            request_timeout=max(1, until - time.monotonic()))
        if answer.code not in (200, 599):
            errors.append(f"{user.name} events: {answer.code}")
    except tornado.httpclient.HTTPClientError as exc:
        if exc.code != 599:  # 599: the timeout that ends the follow
            errors.append(f"{user.name} events: {exc}")
    return seen["output"]


def ticker(seconds):
    """A job that prints a line a second for ``seconds``."""
    return ["/bin/sh", "-c", f"for i in $(seq {int(seconds)}); do echo $i; sleep 1; done"]


async def follow_cost(users, seconds, errors):
    """What following jobs costs the nodes and the master: their hosts' CPU while each
    of ``users`` follows a job of their own that prints a line a second, less their CPU
    while the same jobs run unfollowed, over ``seconds`` each; nothing else runs
    meanwhile. ([nodes' cores, master's cores], output events)."""
    nodes_cpu, master_cpu = hosts_cpu(NODES), hosts_cpu([MASTER.removeprefix("dmpi-")])
    ticking = {u.name: await u.submit(ticker(2 * seconds + 60)) for u in users}
    while True:
        states = [(await u.call("GET", f"/jobs/{ticking[u.name]}"))[1]["state"] for u in users]
        if all(state == "running" for state in states):
            break
        if any(state in FINAL for state in states):
            raise RuntimeError(f"a followed job ended before it was followed: {states}")
        await asyncio.sleep(0.5)

    def used():
        return time.monotonic(), nodes_cpu(), master_cpu()

    def cores(before):
        after = used()
        return [(a - b) / (after[0] - before[0]) for a, b in zip(after[1:], before[1:])]

    before = used()
    await asyncio.sleep(seconds)
    unfollowed = cores(before)
    before = used()
    outputs = await asyncio.gather(*(follow(u, ticking[u.name], before[0] + seconds, errors)
                                     for u in users))
    followed = cores(before)
    for user in users:
        await user.call("POST", f"/jobs/{ticking[user.name]}/cancel")
    for user in users:
        await user.wait(ticking[user.name])
    return [f - u for f, u in zip(followed, unfollowed)], sum(outputs)


async def one_round(users, launcher, own, seconds, followers, launches, rate, in_step=False):
    """One measured run with ``users`` calling; its figures. The pollers' calls are spread
    evenly over each period (users' notebooks do not poll in step), or, ``in_step``,
    all made at the same instants (the worst case: every period starts with a burst)."""
    # The followers follow a job of their own that prints a line a second.
    ticking = {u.name: await u.submit(ticker(seconds + 60)) for u in users[:followers]}
    idle = await launch_times(launcher, launches)
    latencies, errors = [], []
    nodes_cpu = hosts_cpu(NODES)
    cpu_before, nodes_before, started = api_cpu_seconds(), nodes_cpu(), time.monotonic()
    own_before = time.process_time()
    until = started + seconds
    loaded = asyncio.ensure_future(launches_until(launcher, until))
    outputs = await asyncio.gather(
        *(follow(u, ticking[u.name], until, errors) for u in users[:followers]),
        *(poll(u, ["/jobs", f"/jobs/{own[u.name]}"], until, rate, latencies, errors,
               0.0 if in_step else i / (len(users) * rate))
          for i, u in enumerate(users[followers:])))
    wall = time.monotonic() - started
    cpu = (api_cpu_seconds() - cpu_before) / wall
    nodes = (nodes_cpu() - nodes_before) / wall
    own = (time.process_time() - own_before) / wall
    under_load = await loaded  # the launch under way at the end finishes after the load
    for user in users[:followers]:
        await user.call("POST", f"/jobs/{ticking[user.name]}/cancel")
    ms = sorted(x * 1000 for x in latencies) or [float("nan")]

    def pct(p):
        return ms[min(len(ms) - 1, int(p / 100 * len(ms)))]

    return {"users": len(users), "calls_per_s": len(latencies) / wall, "p50": pct(50),
            "p95": pct(95), "p99": pct(99), "errors": errors, "cpu": cpu, "nodes": nodes,
            "own": own,
            "idle": statistics.median(idle), "loaded": statistics.median(under_load),
            "launches": f"{len(idle)}/{len(under_load)}",
            "outputs": sum(outputs[:followers])}


def http_client():
    """The HTTP client of a run (inside its event loop) that trusts the test cluster's CA,
    and the CA's file, to keep open while the client is used."""
    ca_file = tempfile.NamedTemporaryFile("w", suffix=".pem")  # noqa: SIM115 (kept open)
    ca_file.write(TestCluster().tls["ca"])
    ca_file.flush()
    TLS["context"] = ssl.create_default_context(cafile=ca_file.name)
    tornado.httpclient.AsyncHTTPClient.configure(
        None, max_clients=400,
        hostname_mapping={urllib.parse.urlsplit(API_PUBLIC_URL).hostname: HUB_ADDR},
        defaults={"ca_certs": ca_file.name})
    return tornado.httpclient.AsyncHTTPClient(), ca_file


async def main(args):
    global API  # noqa: PLW0603 (one switch for every call of the run)
    API = API_PROXIED if args.through_proxy else API_DIRECT
    KEEP_CONNECTIONS["on"] = not args.new_connections
    http, _ca_file = http_client()
    hub = Hub(http)
    # Users new to DockerMPI each run: a user's calls cost more the more jobs they have
    # had (``GET /jobs`` lists them), so runs that reused names would not be comparable.
    run_id = format(int(time.time()) % 36 ** 5, "x")
    names = [f"{USER_PREFIX}{run_id}-{i:03d}" for i in range(max(args.users) + 1)]
    tokens = await asyncio.gather(*(hub.token(n) for n in names))
    launcher, *users = [User(http, n, t) for n, t in zip(names, tokens)]
    rows, failed = [], []
    try:
        # Every polling user has an ended job of their own whose status they poll.
        log(f"{len(users)} users each run one short job to poll")
        own = {u.name: await u.submit(["true"]) for u in users}
        for user in users:
            await user.wait(own[user.name])
        if args.follow_cost:
            log(f"{args.follow_cost} users following a job each, for {args.seconds:g} s, "
                f"after as long unfollowed")
            (nodes, master), outputs = await follow_cost(users[:args.follow_cost],
                                                         args.seconds, failed)
            print(f"following {args.follow_cost} jobs costs the nodes {fmt(nodes)} cores and "
                  f"the master {fmt(master)} ({outputs} output events)")
            figures.record("api_load_follow_nodes_ms_per_follower_s",
                           nodes * 1000 / args.follow_cost, 0)
            figures.record("api_load_follow_master_ms_per_follower_s",
                           master * 1000 / args.follow_cost, 0)
        for count in args.users:
            log(f"{count} users for {args.seconds:g} s ({args.followers} following a job), "
                f"{'through the proxy' if args.through_proxy else 'directly'}, "
                f"{'a new connection per call' if args.new_connections else 'kept connections'}")
            found = await one_round(users[:count], launcher, own, args.seconds,
                                    args.followers, args.launches, args.rate, args.in_step)
            failed += found["errors"]
            rows.append([count, fmt(found["calls_per_s"], 1), fmt(found["p50"], 1),
                         fmt(found["p95"], 1), fmt(found["p99"], 1), len(found["errors"]),
                         fmt(found["cpu"]), fmt(found["nodes"]), fmt(found["own"]),
                         found["launches"], fmt(found["idle"]),
                         fmt(found["loaded"]), fmt(found["loaded"] / found["idle"]),
                         found["outputs"]])
            fifty = count == 50
            figures.record(f"api_load_{count}_users_calls_per_s", found["calls_per_s"], 1,
                           aim="at least 200" if fifty else "")
            figures.record(f"api_load_{count}_users_p95_ms", found["p95"], 1,
                           aim="under 100" if fifty else "")
            figures.record(f"api_load_{count}_users_launch_ratio",
                           found["loaded"] / found["idle"], 2, aim="at most 1.25" if fifty else "")
    finally:
        for name in names:
            await hub.remove(name)
    print(table(["users", "calls/s", "p50 ms", "p95 ms", "p99 ms", "errors", "API cores",
                 "nodes' cores", "load generator cores", "launches idle/loaded",
                 "launch idle s", "launch loaded s", "ratio", "output events"], rows))
    for problem in failed[:20]:
        print("error:", problem)
    figures.save(__file__, sys.argv[1:], args.short)
    return 1 if failed else 0


def parse():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", default="20,50,100",
                        type=lambda t: [int(x) for x in t.split(",")])
    parser.add_argument("--seconds", type=float, default=30)
    # Each follower's job holds a slot: the test cluster's 6 leave the launcher's 2-node
    # job two nodes with a slot free only with at most 3 of them running (pack placement).
    parser.add_argument("--followers", type=int, default=2)
    parser.add_argument("--follow-cost", type=int, default=4,
                        help="users who follow a job each, alone on the cluster, to measure "
                             "what following costs the nodes (0: not measured; at most the "
                             "cluster's 6 slots)")
    parser.add_argument("--launches", type=int, default=5,
                        help="2-node jobs timed on the idle cluster before each load (under "
                             "load, the launching user launches for the whole run)")
    parser.add_argument("--rate", type=float, default=5,
                        help="calls a second of each polling user (the site's limit is 20)")
    parser.add_argument("--through-proxy", action="store_true",
                        help="call through the hub's proxy, as browsers do, not directly")
    parser.add_argument("--new-connections", action="store_true",
                        help="a new TLS connection per call (a one-shot mpi command), not "
                             "one kept per user (dockermpi.Client)")
    parser.add_argument("--in-step", action="store_true",
                        help="every poller calls at the same instants (bursts), not spread "
                             "over the period")
    parser.add_argument("--short", action="store_true",
                        help="what CI runs: 4 users, 5 s, 1 follower, 1 launch idle")
    args = parser.parse_args()
    if args.short:
        args.users, args.seconds, args.followers, args.launches = [4], 5, 1, 1
        args.follow_cost = 1
    if os.geteuid() != 0:
        parser.error("run as root (it drives the test cluster's containers)")
    return args


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse())))
