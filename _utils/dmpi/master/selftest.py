"""The network self-test for admins (``salt-run mpi.selftest``): for every pair of
nodes, and within each node, a ping-pong through job namespaces beside the same
ping-pong between the nodes' hosts.

For each pair (``a``, ``b``), one at a time so no two share the wire:

job
    a real job of the self-test's user (pillar ``mpi:selftest:user``) on the approved
    image ``mpi:selftest:image``: rank 0 on ``a``, rank 1 on ``b`` (both on ``a`` within
    a node), each in the job's own network namespace behind the job's firewall. Its
    program times an MPI ping-pong (mpi4py, blocking ``Send``/``Recv``) and the TCP
    ping-pong of :mod:`dmpi.pingpong` between the two ranks' job addresses (on the top
    port of the job's BTL range).
host
    the TCP ping-pong of :mod:`dmpi.pingpong` between the hosts' cluster addresses
    (``mpi_network.pingpong_echo`` on ``b``, ``mpi_network.pingpong`` on ``a``), on the
    same port of the hosts, which the node firewall accepts from the cluster network.

Latency is half the round trip of 1 byte, bandwidth the bytes one way per second of
half a round trip of ``size`` bytes (MB/s, 10^6 bytes). The TCP figures compare like
with like (``ratio``: job TCP over host TCP bandwidth); the MPI ones are what programs
get. A pair is flagged when its job ran wrong, its job TCP bandwidth is below
``mpi:selftest:min_bandwidth_mb_per_s`` or below ``mpi:selftest:far_below`` times the
median of the pairs of its kind (between nodes or within one), or its ratio is below
``mpi:selftest:min_ratio`` (pillar, defaults in defaults.yaml). A pair whose job never
left the queue (a busy cluster) is not measured: it flags no node.

The last report is kept in the job store, and each tested node's verdict (:func:`verdicts`)
until a later self-test of that node: ``mpi.nodes`` shows it and, with
``mpi:selftest:exclude_failed_nodes``, the job controller gives a node at fault no job
but the self-test's own until a self-test finds it no longer at fault.
"""

import base64
import inspect
import itertools
import json
import statistics
import time

import dmpi.pingpong
from dmpi.errors import ClusterError, RequestError, StoreError
from dmpi.master import user_calls
from dmpi.settings import SELFTEST_COUNTS

JOB_WALLTIME = "2m"
#: How a pair's problem starts when its job never ran: no figure, no fault.
NOT_MEASURED = "not measured"
T_JOB = 180        # seconds from submit to the job's end
T_HOST = 60        # the hosts' ping-pong
T_CLOSE = 60       # a job's clean-up after its end
META_KEY = "selftest"
VERDICTS_KEY = "selftest_nodes"
#: What the self-test's user name is bound to in the job store, as a hub user's name is
#: bound to their hub identity: a hub user of that name is then refused it, and a name
#: a hub user already holds is refused to the self-test. (A hub identity spelled like
#: this maps to another user name, never to the self-test's.)
IDENTITY = "(dockermpi self-test)"

# Rank 0 and rank 1: the MPI ping-pong, then the TCP one between their job addresses;
# rank 0 prints one JSON line. argv: size, latency and bandwidth round trips, TCP port.
_JOB_MAIN = r'''
import json, os, socket, sys
from mpi4py import MPI
size, lat_iters, bw_iters, port = (int(a) for a in sys.argv[1:5])
comm = MPI.COMM_WORLD
rank = comm.Get_rank()
if comm.Get_size() != 2:
    comm.Abort(2)
figures = mpi_pingpong(comm, MPI, size, lat_iters, bw_iters)
nodes = os.environ["DMPI_NODELIST"].split(",")
addresses = os.environ["DMPI_ADDRESSES"].split(",")
here = addresses[nodes.index(socket.gethostname())]
tcp = None
if rank == 1:
    listener = listen(here, port, 60)
    comm.send(here, dest=0)
    echo(listener, size, 60)
    listener.close()
else:
    peer = comm.recv(source=1)
    sock = connect(peer, port, 30)
    tcp = measure(sock, size, lat_iters, bw_iters)
    sock.close()
hosts = comm.gather(MPI.Get_processor_name(), root=0)
if rank == 0:
    print("SELFTEST " + json.dumps({"mpi": figures, "tcp": tcp, "hosts": hosts}), flush=True)
'''


def job_program():
    """The job's program as argv words (with its four arguments to add): the
    ping-pong's source and the MPI part, travelling base64-encoded as one word."""
    source = inspect.getsource(dmpi.pingpong) + _JOB_MAIN
    encoded = base64.b64encode(source.encode()).decode()
    return ["python3", "-c", f"import base64; exec(base64.b64decode('{encoded}'))"]


def options(config, **given):
    """The self-test's settings: pillar ``mpi:selftest`` (checked with the rest of the
    settings), with the counts the admin gave in their place; RequestError naming a bad
    one."""
    found = dict(config["selftest"])
    for name, value in given.items():
        if value is None:
            continue
        low, high = SELFTEST_COUNTS[name]
        if isinstance(value, bool):
            value = str(value)
        try:
            value = int(str(value), 10)
        except ValueError:
            raise RequestError(f"selftest {name} must be a whole number from {low} to "
                               f"{high}, not {value!r}") from None
        if not low <= value <= high:
            raise RequestError(f"selftest {name} must be from {low} to {high}, not {value}")
        found[name] = value
    return found


def own_user(site, config, user):
    """Bind ``user`` to the self-test (:data:`IDENTITY`); RequestError when a hub user
    holds that name: the self-test's jobs never run as, or write into, a user's own."""
    users = config["users"]
    try:
        site.store().user_uid(user, int(users["uid_min"]), int(users["uid_max"]),
                              identity=IDENTITY)
    except StoreError as exc:
        raise RequestError(f"the self-test's user {user!r} (mpi:selftest:user) cannot be "
                           f"used: {exc}; choose another name") from None


def pairs(nodes):
    """Within each node first, then every pair of nodes, in name order."""
    ordered = sorted(nodes)
    return [(a, a) for a in ordered] + list(itertools.combinations(ordered, 2))


def parse_output(text):
    """The job's SELFTEST line: ``{"mpi": ..., "tcp": ..., "hosts": [...]}``."""
    for line in reversed((text or "").splitlines()):
        if line.startswith("SELFTEST "):
            return json.loads(line[len("SELFTEST "):])
    raise ValueError("the job printed no result")


def flag(results, opts):
    """Add to each pair's ``problems`` (a list, made when missing) what flags it."""
    medians = {}
    for within in (True, False):
        found = [r["job"]["tcp"]["bandwidth_mb_per_s"] for r in results
                 if r.get("job") and (r["pair"][0] == r["pair"][1]) == within]
        medians[within] = statistics.median(found) if found else None
    for result in results:
        problems = result.setdefault("problems", [])
        if not result.get("job"):
            continue
        within = result["pair"][0] == result["pair"][1]
        bandwidth = result["job"]["tcp"]["bandwidth_mb_per_s"]
        if opts["min_bandwidth_mb_per_s"] and bandwidth < opts["min_bandwidth_mb_per_s"]:
            problems.append(f"job TCP bandwidth {bandwidth:.0f} MB/s is below "
                            f"mpi:selftest:min_bandwidth_mb_per_s "
                            f"({opts['min_bandwidth_mb_per_s']:g})")
        median = medians[within]
        if median and opts["far_below"] and bandwidth < opts["far_below"] * median:
            problems.append(f"job TCP bandwidth {bandwidth:.0f} MB/s is below "
                            f"{opts['far_below']:g} times the median of the pairs "
                            f"{'within a node' if within else 'between nodes'} ({median:.0f})")
        ratio = result.get("ratio")
        if opts["min_ratio"] and ratio is not None and ratio < opts["min_ratio"]:
            problems.append(f"job TCP bandwidth is {ratio:.2f} times the hosts', below "
                            f"mpi:selftest:min_ratio ({opts['min_ratio']:g})")


def _job_pair(site, caller, opts, port, a, b):
    """The job's figures for the pair, or the reason it did not give any."""
    argv = job_program() + [str(opts["size"]), str(opts["lat_iters"]),
                            str(opts["bw_iters"]), str(port)]
    queued = user_calls.submit(site, caller, user=opts["user"], image=opts["image"], np=2,
                               cmd=argv, nodes=a if a == b else f"{a},{b}",
                               slots_per_node=2 if a == b else 1, walltime=JOB_WALLTIME,
                               name="selftest")
    job_id = queued["job_id"]
    ended = user_calls.wait(site, caller, job_id, timeout=T_JOB)
    if ended["state"] not in user_calls.FINAL:
        user_calls.cancel(site, caller, job_id, reason="the self-test gave up on it")
    _wait_closed(site, caller, job_id)
    if ended["state"] == "queued":
        return job_id, None, f"{NOT_MEASURED}: job {job_id} was still queued after {T_JOB} s"
    if ended["state"] != "succeeded":
        return job_id, None, f"job {job_id} {ended['state']}: {ended.get('reason')}"
    output = user_calls.logs(site, caller, job_id)
    text = output.get("data", "") if isinstance(output, dict) else str(output)
    try:
        found = parse_output(text)
    except ValueError as exc:
        return job_id, None, f"job {job_id}: {exc}"
    expected = [a, b]
    if found.get("hosts") != expected:
        return job_id, None, f"job {job_id}: ranks ran on {found.get('hosts')}, not {expected}"
    return job_id, {"mpi": found["mpi"], "tcp": found["tcp"]}, None


def _wait_closed(site, caller, job_id):
    """Until the job's clean-up is done on its nodes (at most ``T_CLOSE`` seconds): the
    next measurement must not share the nodes' CPUs with it."""
    deadline = time.monotonic() + T_CLOSE
    while not user_calls.status(site, caller, job_id).get("closed"):
        if time.monotonic() > deadline:
            return
        time.sleep(0.2)


def _host_pair(site, opts, port, addresses, a, b):
    """The hosts' TCP figures for the pair, or the reason there are none."""
    try:
        site.call_async([b], "mpi_network.pingpong_echo", address=addresses[b], port=port,
                        max_bytes=opts["size"], timeout=T_HOST)
        found = site.call([a], "mpi_network.pingpong", timeout=T_HOST + 15,
                          address=addresses[b], port=port, size=opts["size"],
                          lat_iters=opts["lat_iters"], bw_iters=opts["bw_iters"],
                          connect_timeout=T_HOST)[a]
    except ClusterError as exc:
        return None, str(exc)
    if not isinstance(found, dict) or "bandwidth_mb_per_s" not in found:
        return None, f"{a}: mpi_network.pingpong returned {str(found)[:300]}"
    return found, None


def run(site, caller, nodes=None, size=None, lat_iters=None, bw_iters=None):
    """Test every pair of ``nodes`` (default: every MPI node reporting now); the result,
    also kept for :func:`last`."""
    all_nodes = site.mpi_nodes_required()
    config = site.node_settings(all_nodes[0])
    opts = options(config, size=size, lat_iters=lat_iters, bw_iters=bw_iters)
    if nodes is None:
        alive = site.alive()
        chosen = [n for n in all_nodes if n in alive]
    else:
        chosen = nodes.split(",") if isinstance(nodes, str) else list(nodes)
        chosen = [str(n).strip() for n in chosen if str(n).strip()]
        unknown = sorted(set(chosen) - set(all_nodes))
        if unknown:
            raise RequestError(f"not MPI nodes: {unknown}; MPI nodes: {sorted(all_nodes)}")
    if not chosen:
        raise RequestError("no MPI node to test (none is reporting)")
    own_user(site, config, opts["user"])
    port = int(config["ports"]["btl"][1])
    addresses = site.host_addresses(chosen, config["cluster_network"])
    started = time.time()
    results = []
    for a, b in pairs(chosen):
        result = {"pair": [a, b]}
        result["job_id"], result["job"], job_error = _job_pair(site, caller, opts, port, a, b)
        result["host"], host_error = _host_pair(site, opts, port, addresses, a, b)
        result["problems"] = [e for e in (job_error, host_error) if e]
        if result["job"] and result["host"]:
            result["ratio"] = round(result["job"]["tcp"]["bandwidth_mb_per_s"]
                                    / result["host"]["bandwidth_mb_per_s"], 3)
        results.append(result)
    flag(results, opts)
    for result in results:
        result["passed"] = not result["problems"]
    report = {
        "started": started, "seconds": round(time.time() - started, 1),
        "nodes": sorted(chosen), "passed": all(r["passed"] for r in results),
        "settings": {k: opts[k] for k in ("size", "lat_iters", "bw_iters", "image",
                                           "min_bandwidth_mb_per_s", "far_below",
                                           "min_ratio")},
        "pairs": results,
    }
    record(site.store(), report)
    site.nodes_changed()
    return report


def record(store, report):
    """Keep ``report`` as the last one and its nodes' verdicts over their earlier ones,
    in one transaction."""
    with store.transaction() as conn:
        kept = store.get_meta(VERDICTS_KEY, {}, conn=conn)
        kept.update(verdicts(report))
        store.set_meta(VERDICTS_KEY, kept, conn=conn)
        store.set_meta(META_KEY, report, conn=conn)


def last(store):
    """The last self-test's report, or None."""
    return store.get_meta(META_KEY)


def kept_verdicts(store):
    """Every node's verdict from the last self-test that tested it: ``{node: verdict}``."""
    return store.get_meta(VERDICTS_KEY, {})


def verdicts(report):
    """
    Each tested node's verdict: ``{node: {"at", "passed", "problems", "at_fault"}}``.
    ``passed``: every pair it was in passed; ``problems``: those pairs' problems;
    ``at_fault``: why the node itself is taken to be at fault, or None. It is when its
    own pair (within the node) was flagged, or when every measured pair it was in with
    another node was flagged: one bad link flags two nodes' pairs, a bad node flags all
    of its own. With two nodes tested, a flagged pair puts both at fault (nothing tells
    which), so test a node again beside at least two others. Pairs not measured (their
    job never left the queue) count for nothing.
    """
    found = {}
    for node in report.get("nodes", []):
        mine = [r for r in report["pairs"] if node in r["pair"]]
        measured = [r for r in mine if not r["problems"] or
                    not r["problems"][0].startswith(NOT_MEASURED)]
        own = [r for r in measured if r["pair"] == [node, node]]
        between = [r for r in measured if r["pair"] != [node, node]]
        at_fault = None
        if own and not own[0]["passed"]:
            at_fault = f"its own pair was flagged: {own[0]['problems'][0]}"
        elif between and not any(r["passed"] for r in between):
            others = ", ".join(n for r in between for n in r["pair"] if n != node)
            at_fault = (f"every pair with another node was flagged ({others}): "
                        f"{between[0]['problems'][0]}")
        found[node] = {"at": report["started"], "passed": all(r["passed"] for r in mine),
                       "problems": [f"{'-'.join(dict.fromkeys(r['pair']))}: {p}"
                                    for r in mine for p in r["problems"]],
                       "at_fault": at_fault}
    return found


def matrix(report):
    """The report as text: one line per pair, job and host figures side by side."""
    header = (f"{'pair':<24} {'job MPI us':>10} {'job MPI MB/s':>12} {'job TCP us':>10} "
              f"{'job TCP MB/s':>12} {'host TCP us':>11} {'host TCP MB/s':>13} "
              f"{'ratio':>6}  result")
    lines = [header]
    for r in report["pairs"]:
        job, host = r.get("job") or {}, r.get("host") or {}

        def cell(part, key, width, digits):
            value = (part or {}).get(key)
            return f"{value:>{width}.{digits}f}" if isinstance(value, (int, float)) \
                else f"{'-':>{width}}"
        name = r["pair"][0] if r["pair"][0] == r["pair"][1] else " <-> ".join(r["pair"])
        lines.append(
            f"{name:<24} {cell(job.get('mpi'), 'latency_us', 10, 1)} "
            f"{cell(job.get('mpi'), 'bandwidth_mb_per_s', 12, 0)} "
            f"{cell(job.get('tcp'), 'latency_us', 10, 1)} "
            f"{cell(job.get('tcp'), 'bandwidth_mb_per_s', 12, 0)} "
            f"{cell(host, 'latency_us', 11, 1)} {cell(host, 'bandwidth_mb_per_s', 13, 0)} "
            f"{cell(r, 'ratio', 6, 2)}  "
            + ("ok" if r["passed"] else "FLAGGED: " + "; ".join(r["problems"])))
    return "\n".join(lines)
