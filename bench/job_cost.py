#!/usr/bin/env python3
"""What does DockerMPI itself cost per job, next to a minimal hand-written launch?

Runs the same short 2-node job (an mpi4py ping-pong, rank 0 on node1 and rank 1 on
node2, ``--lat-iters`` and ``--bw-iters`` round trips) in two ways, alternately, and
counts the CPU the machine spent on each, in core-seconds:

dockermpi
    ``mpi.launch`` through one long-lived ``salt.runner.RunnerClient`` in the master
    (the way the user API calls it), counted from the call until the job is ``closed``
    (its clean-up done on every node): queue, containers and namespaces, keys, sshd,
    mpirun, output, clean-up, the master's and the nodes' bookkeeping.
minimal
    what a careful admin's script would do by hand, as ``bench/datapath.py``'s host side
    does it: the keys and files written on each node, ``docker run`` of one container of
    the same approved image on each node (host networking, an unprivileged sshd),
    plain ``mpirun`` from node1's container, then both containers and the files removed.

What is counted: the machine's busy time (``/proc/stat``: user, nice, system, irq and
softirq of every core) during the job, less the idle cluster's own use over as long (the
rate measured for ``--idle`` seconds before and after the runs: the master's engine,
Salt, GlusterFS, the hub keep running either way), less what this script and this
host's Docker engine spend driving the cluster (``docker exec`` into the hosts stands
for the ssh an admin would use; it is shown apart, not counted). Where it goes: each
cluster host's cgroup (``cpuacct``; its systemd services, Salt, its Docker engine and
the commands run in it), and the rest, which is mostly the jobs' own containers (the
nested engines put them in cgroups of their own, gone with the container).

Prints per side the median core-seconds per job, and their ratio (aim: DockerMPI at most
1.3 times the minimal launch), and a table of where each side's core-seconds went.
Exits non-zero when a run fails, a rank is not where it should be, or anything it
started is left. Run alone on the machine (every process counts), holding the cluster
lock::

    flock /tmp/dmpi-cluster.lock .venv/bin/python bench/job_cost.py --repeat 5

``--short`` (what CI runs): one job each way, no warm-up, 3 s of idle on each side of them.
"""

import argparse
import os
import pathlib
import sys
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
import datapath  # noqa: E402
import figures  # noqa: E402
from dmpi_bench import (  # noqa: E402
    MASTER, BenchError, Jobs, RunnerSession, Terminated, cgroup_seconds, host_cpu_files, log,
    median, node_exec, table, trap_sigterm, verdict, check_common_args, parse_args,
)
from launch_overhead import wait_closed  # noqa: E402

HOSTS = ["master", "node1", "node2", "node3", "hub", "storage"]
PAIR = datapath.PAIRS["between"]
OUTER_DOCKER = ("dockerd", "containerd", "containerd-shim", "containerd-shim-runc-v2",
                "docker-proxy", "runc")
T_LAUNCH = 180
SHORT = {"repeat": 1, "idle": 3.0, "warmup": 0}  # what --short (CI) sets
TICK = os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------------------- counting


def machine_busy():
    """Core-seconds every core of this machine has been busy since boot."""
    with open("/proc/stat", encoding="ascii") as stat:
        fields = [int(v) for v in stat.readline().split()[1:8]]
    user, nice, system, _idle, _iowait, irq, softirq = fields
    return (user + nice + system + irq + softirq) / TICK


def host_cgroups():
    """``({host: its cgroup's CPU usage file}, {container id: host})`` for the cluster's
    host containers."""
    found, ids = host_cpu_files(HOSTS)
    if MASTER.removeprefix("dmpi-") not in found or not set(PAIR) <= set(found):
        raise BenchError(f"the test cluster is not up (hosts found: {sorted(found)})")
    return found, ids


def process_name(comm, argv):
    """A process's name for the table: its command's, or for a Python program the
    program's with the last word of its title (Salt names its processes:
    ``salt-master MWorker-default``, ``salt-minion Engine(mpi_node)``)."""
    words = [w for w in argv if w]
    if len(words) == 1:  # a title set over the whole command line (setproctitle)
        words = words[0].split()
    if not words or not pathlib.PurePath(words[0]).name.startswith("python"):
        return comm
    if len(words) < 2:
        return "python"
    if words[1] in ("-c", "-m"):
        return f"python {' '.join(words[1:3])}"[:40] if words[1] == "-m" else "python -c"
    title = words[-1].replace("salt.loaded.ext.engines.", "") if len(words) > 2 else ""
    if not title.startswith("Engine("):
        title = title.split("(")[0].rstrip("-0123456789")
    return f"{pathlib.PurePath(words[1]).name} {title}".strip()


def process_table():
    """``{pid: (name, ppid, start, core-seconds, cgroup)}`` of every process of this
    machine, read from this host's /proc: nothing runs in the cluster's hosts to read it.
    A process's core-seconds include those of its children it has reaped (``cutime``,
    ``cstime``): the short commands a Salt minion or a Docker engine runs count as theirs."""
    found = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
                text = stat.read()
            with open(f"/proc/{pid}/cgroup", encoding="ascii", errors="replace") as cgroup:
                lines = cgroup.read().splitlines()
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                argv = cmdline.read().decode(errors="replace").split("\0")
        except OSError:
            continue  # gone meanwhile
        fields = text[text.rindex(")") + 2:].split()
        path = next((line.split(":", 2)[2] for line in lines
                     if "cpuacct" in line.split(":")[1].split(",")), "")
        comm = text[text.index("(") + 1:text.rindex(")")]
        found[int(pid)] = (process_name(comm, argv), int(fields[1]),
                           int(fields[19]), sum(int(v) for v in fields[11:15]) / TICK, path)
    return found


def by_process(table, ids):
    """``{(pid, start): (key, core-seconds)}``: each process under a cluster host, keyed
    ``proc:<host>:<name>``; every process in a container a host's Docker engine runs (a
    job's, or the minimal launch's) is ``proc:<host>:(containers)``: they cost the same
    both ways."""
    hosts = {}

    def host_of(pid, depth=0):
        if pid not in hosts:
            entry = table.get(pid)
            own = ids.get(entry[4].rstrip("/").rsplit("/", 1)[-1]) if entry else None
            if own or not entry or depth > 64:
                hosts[pid] = (own, False)
            else:
                parent, _ = host_of(entry[1], depth + 1)
                hosts[pid] = (parent, parent is not None)
        return hosts[pid]

    found = {}
    for pid, (name, _, start, seconds, _) in table.items():
        host, contained = host_of(pid)
        if host is not None:
            part = "(containers)" if contained else name
            found[(pid, start)] = (f"proc:{host}:{part}", seconds)
    return found


def outer_docker_seconds():
    """CPU of this host's own Docker engine processes (not inside any container)."""
    own_ns = os.readlink("/proc/self/ns/pid")
    total = 0.0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{pid}/ns/pid") != own_ns:
                continue
            with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
                text = stat.read()
        except OSError:
            continue  # gone meanwhile
        comm = text[text.index("(") + 1:text.rindex(")")]
        if comm in OUTER_DOCKER:
            fields = text[text.rindex(")") + 2:].split()
            total += (int(fields[11]) + int(fields[12])) / TICK  # utime, stime
    return total


def own_seconds():
    """This script's CPU and its children's (the docker CLI calls)."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


class Meter:
    """Snapshots of where the machine's CPU went: ``machine``, each host, ``driving``
    (this script and this host's Docker engine) and ``rest`` (the jobs' containers)."""

    def __init__(self):
        self.cgroups, self.ids = host_cgroups()

    def snapshot(self):
        found = {host: cgroup_seconds(path) for host, path in self.cgroups.items()}
        found["machine"] = machine_busy()
        found["wall"] = time.monotonic()
        found["processes"] = by_process(process_table(), self.ids)
        found["driving"] = outer_docker_seconds() + own_seconds()  # reading /proc too
        return found

    @staticmethod
    def spent(before, after):
        """Core-seconds per part between two snapshots, ``wall`` in seconds; per process
        (``proc:<host>:<name>``), those of processes alive at the second, from their start
        when they started in between."""
        used = {key: after[key] - before[key] for key in before if key != "processes"}
        used["rest"] = used["machine"] - used["driving"] - sum(
            used[host] for host in HOSTS if host in used)
        for identity, (key, seconds) in after["processes"].items():
            earlier = before["processes"].get(identity, (key, 0.0))[1]
            used[key] = used.get(key, 0.0) + seconds - earlier
        return used


def idle_rates(meter, seconds):
    """Core-seconds per second of each part while nothing runs."""
    before = meter.snapshot()
    time.sleep(seconds)
    used = meter.spent(before, meter.snapshot())
    return {key: value / used["wall"] for key, value in used.items() if key != "wall"}


def net_of_idle(used, rates):
    """The job's own core-seconds: what it used less the idle cluster's use over as long."""
    net = {key: value - rates.get(key, 0.0) * used["wall"]
           for key, value in used.items() if key != "wall"}
    net["cluster"] = net["machine"] - net["driving"]
    net["wall"] = used["wall"]
    return net


# ------------------------------------------------------------------------------- sides


def dockermpi_once(session, jobs, meter, args):
    before = meter.snapshot()
    _, job = session.call("mpi.launch", user=args.user, image="mpi", np=2,
                          nodes=",".join(PAIR), slots_per_node=1, walltime=f"{T_LAUNCH}s",
                          cmd=datapath.program(args))
    job = job if isinstance(job, dict) else {}
    if job.get("job_id"):
        jobs.ids.append(job["job_id"])
    if job.get("state") != "succeeded":
        raise BenchError(f"mpi.launch did not succeed: {str(job)[:2000]}")
    wait_closed(session, job["job_id"], timeout=T_LAUNCH)
    used = meter.spent(before, meter.snapshot())
    stdout = node_exec(PAIR[0], ["cat", job["output"]["stdout"]]).stdout
    datapath.parse(stdout, f"job {job['job_id']}", PAIR)
    return used


def minimal_once(image, cidr, meter, args):
    before = meter.snapshot()
    host = datapath.HostNetwork(args, image, cidr)
    try:
        host.start()
        host.once()
    finally:
        datapath.remove_host_side()
    return meter.spent(before, meter.snapshot())


def processes_table(net, shown=15):
    """The processes where DockerMPI's extra goes: medians per side of each host's
    processes by name, the ``shown`` largest differences first."""
    keys = {key for side in net.values() for n in side for key in n if key.startswith("proc:")}
    rows = []
    for key in keys:
        ours, theirs = (median([n.get(key, 0.0) for n in net[side]])
                        for side in ("dockermpi", "minimal"))
        rows.append([key.removeprefix("proc:"), ours, theirs, ours - theirs])
    rows.sort(key=lambda row: -abs(row[3]))
    return ("by process (each host's processes by name, with the commands they ran; "
            "idle use taken out)\n"
            + table(["host:process (core-s)", "dockermpi", "minimal", "extra"], rows[:shown]))


# -------------------------------------------------------------------------------- main


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="jobs per side (default 5)")
    parser.add_argument("--warmup", type=int, default=1,
                        help="jobs per side first, not counted (default 1)")
    parser.add_argument("--idle", type=float, default=20.0,
                        help="seconds of idle measured before and after the jobs (default 20)")
    parser.add_argument("--lat-iters", type=int, default=200,
                        help="1-byte round trips of the job (default 200)")
    parser.add_argument("--bw-iters", type=int, default=10,
                        help="round trips of --size bytes of the job (default 10)")
    parser.add_argument("--size", type=int, default=1 << 20,
                        help="message bytes (default 1 MiB)")
    parser.add_argument("--user", default="bench-cost", help="job user (starts with bench)")
    parser.add_argument("--short", action="store_true",
                        help="what CI runs: one job per side, 3 s of idle each side")
    args = parse_args(parser, argv, SHORT)
    if args.repeat < 1 or args.warmup < 0 or args.idle <= 0 or min(args.lat_iters, args.bw_iters, args.size) < 1:
        parser.error("--repeat, --idle, --lat-iters, --bw-iters and --size must be positive")
    check_common_args(parser, args)
    # datapath.HostNetwork's options: the pair between nodes, no CPU limit beyond the image's
    args.pair, args.cpus = "between", 0
    trap_sigterm()

    jobs = Jobs(args.user)
    session = None
    samples = {"dockermpi": [], "minimal": []}
    failure, problems, notes = None, [], []
    try:
        stale = datapath.remove_host_side()
        if stale:
            log(f"removed what an interrupted run left: {stale}")
        image, cidr, _ = datapath.site()
        meter = Meter()
        session = RunnerSession(T_LAUNCH + 60)
        # Not counted: images in the nodes' page cache, modules loaded.
        for _ in range(args.warmup):
            dockermpi_once(session, jobs, meter, args)
            minimal_once(image, cidr, meter, args)
        rates = idle_rates(meter, args.idle)
        log(f"idle cluster: {rates['machine'] - rates['driving']:.3f} cores")
        for i in range(args.repeat):
            samples["dockermpi"].append(dockermpi_once(session, jobs, meter, args))
            samples["minimal"].append(minimal_once(image, cidr, meter, args))
            log(f"run {i + 1}: dockermpi {samples['dockermpi'][-1]['machine']:.2f}, minimal "
                f"{samples['minimal'][-1]['machine']:.2f} core-s (machine, idle included)")
        after = idle_rates(meter, args.idle)
        rates = {key: (rates.get(key, 0.0) + after.get(key, 0.0)) / 2
                 for key in rates.keys() | after.keys()}
    except (KeyboardInterrupt, Terminated) as exc:
        failure = f"interrupted ({type(exc).__name__})"
    except BenchError as exc:
        failure = str(exc)
    finally:
        if session is not None:
            session.close()
        try:
            datapath.remove_host_side()
        except BenchError as exc:
            problems.append(f"removing the minimal launch's containers: {exc}")
        try:
            jobs.close()
        except BenchError as exc:
            problems.append(f"cleanup: {exc}")

    if samples["dockermpi"] and samples["minimal"] and failure is None:
        net = {side: [net_of_idle(used, rates) for used in found]
               for side, found in samples.items()}
        parts = ["cluster", *[h for h in HOSTS if h in rates], "rest", "driving", "wall"]
        print(f"core-seconds per 2-node job (mpi4py ping-pong, {PAIR[0]} <-> {PAIR[1]}), idle "
              f"cluster's use taken out ({rates['machine'] - rates['driving']:.3f} cores); "
              f"medians of {args.repeat} jobs per side")
        rows = [[part] + [median([n[part] for n in net[side]]) for side in net]
                for part in parts]
        for row in rows:
            row.append(row[1] - row[2])
        print(table(["part (core-s; wall in s)", "dockermpi", "minimal", "extra"], rows))
        print(processes_table(net))
        cost = {side: median([n["cluster"] for n in net[side]]) for side in net}
        figures.record("job_cost_dockermpi_core_s", cost["dockermpi"], 2, "core-s")
        figures.record("job_cost_minimal_core_s", cost["minimal"], 2, "core-s")
        if min(cost.values()) > 0:
            figures.record("job_cost_ratio", cost["dockermpi"] / cost["minimal"], 2,
                           aim="at most 1.3")
        else:
            # Something beside the benchmark used the machine unevenly (CI runs other
            # tests beside the short mode): no ratio is measured.
            print("job_cost_ratio nan", flush=True)
            busy = (f"once the idle use was taken out, a side measured {min(cost.values()):.2f} "
                    "core-s: the machine was busy beside the benchmark; run it alone")
            (notes if args.short else problems).append(busy)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    # A run that went wrong keeps no figure.
    figures.save(__file__, sys.argv[1:] if argv is None else argv,
                 args.short or failure is not None or bool(problems))
    return verdict("job_cost", failure, problems)


if __name__ == "__main__":
    sys.exit(main())
