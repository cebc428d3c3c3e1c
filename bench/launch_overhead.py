#!/usr/bin/env python3
"""How much does ``salt-run mpi.launch`` add on top of a plain ``mpirun``?

Runs the same trivial program (``hostname``, 2 ranks per node) on 1, 2 and 3 nodes of the
running test cluster in two ways, one after the other (never at once: the baseline job
holds the slots the launch would need), and prints both times and the difference:

launch
    ``salt-run mpi.launch ... --out=json`` on the master (submit + queue + start + wait +
    cleanup). Its wall time is measured *inside* the master container by a small Python
    wrapper (so ``docker exec`` from this host is not counted), next to the runner's own
    ``timings`` (queued, containers_up, sshd_ready, mpirun, cleanup, total).
plain
    ``mpirun`` in already-running containers on the same nodes: a real job
    (``sleep 600``, ``salt-run mpi.submit ... nodes=<list> slots_per_node=2``) is queued
    and waited for until ``mpi.status`` says running. Its containers sit in the job's own
    network namespaces (``job_addresses``) and run as the user's own uid. The mpirun of
    its launcher container's command (``docker inspect dmpi-<job>-launcher``; this script
    checks it is ``dmpi.launch.openmpi.mpi_argv`` of the job's settings, that the hostfile in
    ``/run/dockermpi`` lists the job's addresses and that the program file there is the
    job's) is run again with ``/bin/sh /run/dockermpi/program`` replaced by ``hostname``
    (the baseline is not user input, so its argv goes to mpirun directly): as the job's
    uid, with the job's keys and hostfile, timed by Python *inside* the launcher
    container on the first node (in the job's namespace, with the limits the launch's
    mpirun gets; the worker beside it there gets only half a CPU); then the job is
    cancelled. mpirun binds every free port of its OOB range, so the job's own mpirun
    holds the whole OOB range in that namespace: the plain mpirun gets the top 100 ports
    of the job's BTL range for its OOB instead (free: the job's ranks only sleep) and the
    rest of that range for its BTL.

api
    ``mpi.launch`` through one long-lived ``salt.runner.RunnerClient`` in the master
    (the way a long-lived API server calls the runner): the
    client is made once, so a call pays no process start, no config and module loading.

user-api
    a launch the way users make it: from the user's own notebook container on the hub
    host (started by the hub for the hub user ``--user``), ``POST /jobs`` to DockerMPI's
    user API through the hub's proxy with the notebook's hub token, then ``GET
    /jobs/<id>/wait`` until it has ended (what ``mpi run`` does, less its output).
    Timed by Python inside the notebook.

overhead = launch - plain (medians), for salt-run, the in-master API and the user API.
Aims: under 1 s at 3 nodes through the API, and less than 25 % growth from 1 to 3 nodes.

Each timed launch starts once the previous job is ``closed`` (its clean-up done): the
figure is the launch path of a user's job on an idle cluster; a clean-up, which follows
a result, is on no launch path. ``--back-to-back`` starts each launch as soon as the
previous returned, so it shares the machine with that job's clean-up (the figures
before the standby namespaces were taken that way; throughput.py measures the cost of
clean-ups).

Run as root on the machine that runs the test cluster, from the repository root, holding
the cluster lock::

    flock /tmp/dmpi-cluster.lock .venv/bin/python bench/launch_overhead.py [--repeat N]

Exits non-zero if any run fails, an output check fails, or a container or key of a job
this script started is left on a node. Jobs are cancelled in ``finally`` (also on Ctrl-C
and SIGTERM); a launch in flight gets SIGTERM, so the runner cancels and cleans it.

``--short`` (what CI runs): 3 nodes, one timed run of each side, no warm-up.
"""

import argparse
import json
import pathlib
import posixpath
import secrets
import shlex
import sys
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
import dmpi.launch.files  # noqa: E402
import dmpi.launch.flavours  # noqa: E402
import dmpi.launch.openmpi  # noqa: E402
import dmpi.launch.ssh  # noqa: E402  (pure Python, no Salt needed)
import figures  # noqa: E402
from dmpi_bench import (  # noqa: E402
    MASTER, NODES, SLOTS_PER_NODE, BenchError, Jobs, RunnerSession, Terminated, log, median,
    node_exec, run, table, trap_sigterm, verdict, check_common_args, parse_args,
)

PROGRAM = ["hostname"]
BASE_CMD = ["sleep", "600"]
WALLTIME = "2m"         # bounds each launch and the baseline job in the runner
T_LAUNCH = 150          # salt-run mpi.launch inside the master (walltime + slack)
T_MPIRUN = 60           # plain mpirun inside the launcher container
T_RUNNING = 60          # baseline job: queued -> running
RUN_DIR = dmpi.launch.ssh.DEFAULT_RUN_DIR  # the job's keys, hostfile and program file
PLAIN_OOB_PORTS = 100   # OOB ports of the plain mpirun, the top of the job's BTL range
SHORT = {"repeat": 1, "nodes": "3"}  # what --short (CI) sets: every side once, all nodes

# Runs argv, measures its wall time, prints one JSON line. Used inside the master (around
# salt-run) and inside the job's launcher container (around mpirun). On timeout the child
# gets SIGTERM first (salt-run then cancels the job), SIGKILL only if it does not stop.
TIMER = r"""
import json, os, signal, subprocess, sys, time
argv, timeout, pidfile = json.loads(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
start = time.monotonic()
child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
if pidfile:
    with open(pidfile, "w") as f:
        f.write(str(child.pid))
timed_out = False
try:
    out, err = child.communicate(timeout=timeout)
except subprocess.TimeoutExpired:
    timed_out = True
    child.send_signal(signal.SIGTERM)
    try:
        out, err = child.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        child.kill()
        out, err = child.communicate()
seconds = time.monotonic() - start
if pidfile:
    os.unlink(pidfile)
print(json.dumps({"seconds": seconds, "rc": child.returncode, "timed_out": timed_out,
                  "stdout": out, "stderr": err[-4000:]}))
"""


def check_hostnames(text, nodes):
    """`hostname` printed by 2 ranks per node: exactly those node names, twice each."""
    names = sorted(line.strip() for line in text.splitlines() if line.strip())
    expected = sorted(n for n in nodes for _ in range(SLOTS_PER_NODE))
    if names != expected:
        raise BenchError(f"ranks printed {names}, expected {expected}")


def nodes_arg(nodes):
    # One node as a list: a bare "node1" would be read as a compound target (same result).
    return nodes if len(nodes) == 1 else ",".join(nodes)


# ------------------------------------------------------------------------------ launch


class Launcher:
    """Times ``salt-run mpi.launch`` inside the master."""

    def __init__(self, user):
        self.user = user
        self.job_ids = []
        self.pidfile = None

    def once(self, nodes):
        np = SLOTS_PER_NODE * len(nodes)
        argv = ["salt-run", "mpi.launch", f"user={self.user}", "image=mpi", f"np={np}",
                f"nodes={json.dumps(nodes_arg(nodes))}", f"slots_per_node={SLOTS_PER_NODE}",
                f"walltime={WALLTIME}", f"cmd={json.dumps(PROGRAM)}", "--out=json"]
        self.pidfile = f"/tmp/dmpi-bench-{secrets.token_hex(4)}.pid"
        # The pid file stays known if this raises (Ctrl-C, timeout): interrupt() uses it.
        result = run(["docker", "exec", MASTER, "python3", "-c", TIMER, json.dumps(argv),
                      str(T_LAUNCH), self.pidfile], T_LAUNCH + 90)
        self.pidfile = None
        timed = json.loads(result.stdout)
        try:
            job = json.loads(timed["stdout"])
        except json.JSONDecodeError:
            raise BenchError(f"salt-run exited {timed['rc']} without JSON:\n"
                             f"{timed['stdout'][-2000:]}{timed['stderr'][-2000:]}") from None
        if job.get("job_id"):
            self.job_ids.append(job["job_id"])
        if timed["timed_out"] or timed["rc"] != 0 or job.get("state") != "succeeded":
            raise BenchError(f"launch on {nodes} did not succeed (salt-run exit {timed['rc']}"
                             f"{', timed out' if timed['timed_out'] else ''}):\n"
                             f"{json.dumps(job, indent=2)[:3000]}")
        expected = {n: SLOTS_PER_NODE for n in nodes}
        if job.get("placement") != expected:
            raise BenchError(f"launch placed {job.get('placement')}, expected {expected}")
        stdout = node_exec(nodes[0], ["cat", job["output"]["stdout"]]).stdout
        check_hostnames(stdout, nodes)
        return timed["seconds"], job["timings"], job["job_id"]

    def interrupt(self):
        """SIGTERM the salt-run in flight (by its pid), so the runner cancels the job."""
        if not self.pidfile:
            return
        result = run(["docker", "exec", MASTER, "cat", self.pidfile], 30, check=False)
        pid = result.stdout.strip()
        self.pidfile = None
        if pid.isdigit():
            log(f"sending SIGTERM to salt-run (pid {pid} on the master)")
            run(["docker", "exec", MASTER, "kill", "-TERM", pid], 30, check=False)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                alive = run(["docker", "exec", MASTER, "kill", "-0", pid], 30, check=False)
                if alive.returncode != 0:
                    break
                time.sleep(1)


class ApiLauncher:
    """Times ``mpi.launch`` through one long-lived RunnerClient inside the master."""

    def __init__(self, user):
        self.user = user
        self.job_ids = []
        self.session = RunnerSession(T_LAUNCH)

    def once(self, nodes):
        seconds, job = self.session.call(
            "mpi.launch", user=self.user, image="mpi", np=SLOTS_PER_NODE * len(nodes),
            nodes=nodes_arg(nodes), slots_per_node=SLOTS_PER_NODE, walltime=WALLTIME,
            cmd=PROGRAM)
        job = job if isinstance(job, dict) else {}
        if job.get("job_id"):
            self.job_ids.append(job["job_id"])
        if job.get("state") != "succeeded":
            raise BenchError(f"API launch on {nodes} did not succeed: {json.dumps(job)[:3000]}")
        check_hostnames(node_exec(nodes[0], ["cat", job["output"]["stdout"]]).stdout, nodes)
        return seconds, job["timings"], job["job_id"]

    def close(self):
        self.session.close()


# ---------------------------------------------------------------------------- baseline


def mca(argv, name):
    for i in range(len(argv) - 2):
        if argv[i] == "--mca" and argv[i + 1] == name:
            return argv[i + 2]
    raise BenchError(f"launcher mpirun has no --mca {name}: {shlex.join(argv)[:500]}")


def forwarded(argv):
    """The variable names mpirun forwards to the ranks (``-x NAME``), in order."""
    return [argv[i + 1] for i in range(len(argv) - 1) if argv[i] == "-x"]


class Baseline:
    """A real ``sleep`` job on ``nodes``; mpirun of ``hostname`` timed in its launcher."""

    def __init__(self, jobs, nodes):
        self.jobs = jobs
        self.nodes = nodes
        self.job_id = None

    def start(self):
        np = SLOTS_PER_NODE * len(self.nodes)
        self.job_id = self.jobs.submit(np, BASE_CMD, nodes=nodes_arg(self.nodes),
                                       slots_per_node=SLOTS_PER_NODE, walltime=WALLTIME)
        job = self.jobs.wait_state(self.job_id, ("running",), T_RUNNING)
        expected = {n: SLOTS_PER_NODE for n in self.nodes}
        if job.get("placement") != expected:
            raise BenchError(f"baseline job placed {job.get('placement')}, expected {expected}")
        addresses = job.get("job_addresses") or {}
        if sorted(addresses) != sorted(self.nodes):
            raise BenchError(f"baseline job has addresses {addresses}, expected one on each "
                             f"of {self.nodes}")
        uid = job.get("uid")
        if isinstance(uid, bool) or not isinstance(uid, int) or uid <= 0:
            raise BenchError(f"baseline job record has no user uid: uid={uid!r}")
        # The launcher container runs the job's mpirun (and this node's ranks) in the
        # job's namespace, with the job's keys in RUN_DIR and the launch's limits (the
        # worker beside it on this node gets small ones, half a CPU).
        self.node = next(iter(job["placement"]))
        self.container = f"dmpi-{self.job_id}-launcher"
        inspect = node_exec(self.node, ["docker", "inspect", self.container])
        config = json.loads(inspect.stdout)[0]["Config"]
        self.user = f"{uid}:{uid}"
        if config.get("User") != self.user:
            raise BenchError(f"launcher runs as {config.get('User')!r}, not the job's user "
                             f"{self.user}")
        command = (config.get("Entrypoint") or []) + (config.get("Cmd") or [])
        script = ["/bin/sh", "-c", dmpi.launch.flavours.LAUNCHER_SCRIPT, "sh"]
        # The script, the output paths, then mpirun (by the path the image's probe found).
        real = command[len(script) + 2:]
        if command[:len(script)] != script or not real \
                or posixpath.basename(real[0]) != "mpirun":
            raise BenchError(f"unexpected launcher command: {command!r}")
        rsh = mca(real, "plm_rsh_args").split()
        ssh_port = int(rsh[rsh.index("-p") + 1])
        oob = tuple(int(p) for p in mca(real, "oob_tcp_dynamic_ipv4_ports").split("-"))
        btl_low = int(mca(real, "btl_tcp_port_min_v4"))
        btl = (btl_low, btl_low + int(mca(real, "btl_tcp_port_range_v4")) - 1)
        cidr, wdir = mca(real, "oob_tcp_if_include"), real[real.index("--wdir") + 1]
        # The launcher's mpirun must be dmpi.launch.openmpi.mpi_argv of the job's settings,
        # running the job's program file.
        built = dmpi.launch.openmpi.mpi_argv(np, cidr, oob, btl, ssh_port, wdir, forwarded(real),
                                                run_dir=RUN_DIR, launcher=real[0])
        if built != real:
            raise BenchError("launcher mpirun is not dmpi.launch.openmpi.mpi_argv of the job's "
                             f"settings:\n{shlex.join(real)}\n{shlex.join(built)}")
        if built[-2:] != ["/bin/sh", f"{RUN_DIR}/program"]:
            raise BenchError(f"launcher mpirun does not run {RUN_DIR}/program: {built[-2:]}")
        # What the plain mpirun reuses: the job's hostfile (its addresses) and program file.
        hostfile = self.read(f"{RUN_DIR}/hostfile")
        want = dmpi.launch.openmpi.hostfile_text([(addresses[n], SLOTS_PER_NODE) for n in self.nodes])
        if sorted(hostfile.splitlines()) != sorted(want.splitlines()):
            raise BenchError(f"job hostfile {hostfile!r} does not list the job's addresses "
                             f"{addresses}")
        program = self.read(f"{RUN_DIR}/program")
        if program != dmpi.launch.files.program_script_text(BASE_CMD):
            raise BenchError(f"job program file is {program!r}, not {shlex.join(BASE_CMD)}")
        # The same mpirun with the program file replaced by the baseline's own argv (not
        # user input, so it goes to mpirun directly), on other OOB ports: mpirun (Open MPI's
        # HNP) binds *every* free port of its OOB range, so the job's mpirun holds all of
        # them in this namespace ("No sockets were able to be opened"). The job's ranks
        # (sleep) never open BTL ports, so the top of the job's BTL range is free; the
        # job's namespace firewall takes any port from the job's own addresses.
        if btl[1] - btl[0] + 1 < 2 * PLAIN_OOB_PORTS:
            raise BenchError(f"job BTL range {btl[0]}-{btl[1]} is too small to lend the plain "
                             f"mpirun {PLAIN_OOB_PORTS} OOB ports")
        plain_oob = (btl[1] - PLAIN_OOB_PORTS + 1, btl[1])
        plain_btl = (btl[0], btl[1] - PLAIN_OOB_PORTS)
        self.argv = dmpi.launch.openmpi.mpi_argv(
            np, cidr, plain_oob, plain_btl, ssh_port, wdir, forwarded(real), run_dir=RUN_DIR,
            launcher=real[0])[:-2] + PROGRAM
        log(f"baseline job {self.job_id} running on {job['placement']} at {addresses} as uid "
            f"{uid} (ssh port {ssh_port}, OOB {oob[0]}-{oob[1]}, BTL {btl[0]}-{btl[1]}); plain "
            f"mpirun in {self.container} on {self.node}, OOB {plain_oob[0]}-{plain_oob[1]}, "
            f"BTL {plain_btl[0]}-{plain_btl[1]}")

    def read(self, path):
        """A file as the job's user sees it in the launcher container."""
        return node_exec(self.node, ["docker", "exec", "--user", self.user, self.container,
                                     "cat", path]).stdout

    def once(self):
        result = node_exec(self.node, ["docker", "exec", "--user", self.user, self.container,
                                       "python3", "-c", TIMER, json.dumps(self.argv),
                                       str(T_MPIRUN), ""],
                           timeout=T_MPIRUN + 90)
        timed = json.loads(result.stdout)
        if timed["timed_out"] or timed["rc"] != 0:
            raise BenchError(f"plain mpirun on {self.nodes} exited {timed['rc']}"
                             f"{' (timed out)' if timed['timed_out'] else ''}:\n"
                             f"{timed['stdout'][-2000:]}{timed['stderr'][-2000:]}")
        check_hostnames(timed["stdout"], self.nodes)
        return timed["seconds"]

    def stop(self):
        if self.job_id is None:
            return
        job = self.jobs.status(self.job_id)
        if job["state"] == "running":
            self.jobs.cancel(self.job_id)
        elif job["state"] != "cancelled":
            raise BenchError(f"baseline job {self.job_id} ended {job['state']} by itself: "
                             f"{job.get('reason')}")
        self.jobs.wait_state(self.job_id, ("cancelled",), 30)


# -------------------------------------------------------------------------------- main


PHASES = ("queued", "containers_up", "sshd_ready", "mpirun")


#: One launch through DockerMPI's user API from the notebook, timed there: argv[1] is the
#: job (JSON); submitted, then waited for (as ``mpi run`` does).
USER_API_CALL = r"""
import json, os, ssl, sys, time, urllib.error, urllib.request
CA = ssl.create_default_context(cafile=os.environ.get("DOCKERMPI_API_CA"))
base = os.environ["DOCKERMPI_API_URL"] + "/api/v1"
headers = {"Authorization": "token " + os.environ["JUPYTERHUB_API_TOKEN"],
           "Content-Type": "application/json"}
def call(method, path, body=None):
    request = urllib.request.Request(base + path, method=method, headers=headers,
                                     data=None if body is None else body.encode())
    try:
        with urllib.request.urlopen(request, timeout=300, context=CA) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
started = time.monotonic()
status, job = call("POST", "/jobs", sys.argv[1])
while status == 201 or status == 200 and job.get("state") not in (
        "succeeded", "failed", "cancelled", "timed_out"):
    status, job = call("GET", f"/jobs/{job['job_id']}/wait?timeout=60")
print(json.dumps({"seconds": time.monotonic() - started, "status": status, "job": job}))
"""


class UserApiLauncher:
    """Times a launch through DockerMPI's user API from the hub user's own notebook."""

    def __init__(self, user):
        sys.path.insert(0, str(REPO))
        from tests.cluster.testcluster import TestCluster  # pylint: disable=import-outside-toplevel

        self.cluster = TestCluster(nodes=len(NODES))
        self.user = user
        self.job_ids = []
        self.cluster.start_notebook(user)

    def once(self, nodes):
        body = {"image": "mpi", "np": SLOTS_PER_NODE * len(nodes), "nodes": nodes_arg(nodes),
                "slots_per_node": SLOTS_PER_NODE, "walltime": WALLTIME, "cmd": PROGRAM}
        code, output = self.cluster.notebook_exec(
            self.user, ["python3", "-c", USER_API_CALL, json.dumps(body)])
        try:
            timed = json.loads(output.strip().splitlines()[-1])
            job = timed["job"]
        except (ValueError, IndexError, KeyError, TypeError):
            raise BenchError(f"user API launch on {nodes} gave no record (exit {code}): "
                             f"{output[-2000:]}") from None
        job = job if isinstance(job, dict) else {}
        if job.get("job_id"):
            self.job_ids.append(job["job_id"])
        if timed["status"] != 200 or job.get("state") != "succeeded":
            raise BenchError(f"user API launch on {nodes} did not succeed ({timed['status']}): "
                             f"{json.dumps(job)[:3000]}")
        check_hostnames(node_exec(nodes[0], ["cat", job["output"]["stdout"]]).stdout, nodes)
        return timed["seconds"], job["timings"], job["job_id"]

    def close(self):
        self.cluster.stop_notebook(self.user)


def wait_closed(session, job_id, timeout=60):
    """Until the job's clean-up is done (``closed`` in ``mpi.status``), woken by the job's
    event: polling would put the waiting's own CPU on the job's account."""
    job = session.closed(job_id, timeout)
    if not (isinstance(job, dict) and job.get("closed")):
        raise BenchError(f"job {job_id} was not closed {timeout}s after its result: {job}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per side and node count")
    parser.add_argument("--nodes", default="1,2,3", help="node counts (default 1,2,3)")
    parser.add_argument("--user", default="bench-launch", help="job user (must start with bench)")
    parser.add_argument("--json", action="store_true", help="also print every sample as JSON")
    parser.add_argument("--back-to-back", action="store_true",
                        help="start each launch as soon as the previous returned, not once "
                             "its clean-up is done")
    parser.add_argument("--short", action="store_true",
                        help="what CI runs: 1 and 3 nodes, one timed run per side")
    args = parse_args(parser, argv, SHORT)
    counts = [int(c) for c in args.nodes.split(",")]
    if args.repeat < 1 or not all(1 <= c <= len(NODES) for c in counts):
        parser.error(f"--repeat must be >= 1 and node counts between 1 and {len(NODES)}")
    check_common_args(parser, args)
    trap_sigterm()

    jobs = Jobs(args.user)
    launcher = Launcher(args.user)
    api = user_api = None
    rows, failure, incomplete = [], None, []

    def idle(last):
        """Let the job before the next timed launch close, unless --back-to-back."""
        if not args.back_to_back:
            wait_closed(api.session, last)

    try:
        api = ApiLauncher(args.user)
        user_api = UserApiLauncher(args.user)
        for count in counts:
            nodes = NODES[:count]
            launch_s, timings, api_s, user_api_s, plain_s = [], [], [], [], []
            # Launch sides first (no baseline job holds the slots), one warm-up not counted
            # (--short: none, its figures are not kept).
            if not args.short:
                launcher.once(nodes)
                api.once(nodes)
                user_api.once(nodes)
            for i in range(args.repeat):
                if user_api.job_ids:
                    idle(user_api.job_ids[-1])
                seconds, t, job_id = launcher.once(nodes)
                launch_s.append(seconds)
                timings.append(t)
                log(f"{count} node(s) launch {i + 1}/{args.repeat}: {seconds:.2f}s {job_id} {t}")
                if "mpirun" not in t:
                    incomplete.append(job_id)
                idle(job_id)
                seconds, t, job_id = api.once(nodes)
                api_s.append(seconds)
                log(f"{count} node(s) api {i + 1}/{args.repeat}: {seconds:.2f}s {job_id} {t}")
                idle(job_id)
                seconds, t, job_id = user_api.once(nodes)
                user_api_s.append(seconds)
                log(f"{count} node(s) user-api {i + 1}/{args.repeat}: {seconds:.2f}s {job_id}")
            baseline = Baseline(jobs, nodes)
            try:
                baseline.start()
                if not args.short:
                    baseline.once()  # warm-up
                for i in range(args.repeat):
                    plain_s.append(baseline.once())
                    log(f"{count} node(s) plain {i + 1}/{args.repeat}: {plain_s[-1]:.2f}s")
            finally:
                baseline.stop()
            rows.append({"nodes": count, "np": SLOTS_PER_NODE * count, "launch": launch_s,
                         "api": api_s, "user_api": user_api_s, "timings": timings,
                         "plain": plain_s})
    except (KeyboardInterrupt, Terminated) as exc:
        failure = f"interrupted ({type(exc).__name__})"
    except BenchError as exc:
        failure = str(exc)
    finally:
        try:
            launcher.interrupt()
        except BenchError as exc:
            failure = (failure or "") + f"\nstopping salt-run: {exc}"
        if api is not None:
            api.close()
            jobs.ids += api.job_ids
        if user_api is not None:
            jobs.ids += user_api.job_ids
            try:
                user_api.close()
            except Exception as exc:  # pylint: disable=broad-except
                failure = (failure or "") + f"\nstopping the notebook: {exc}"
        jobs.ids += launcher.job_ids
        try:
            jobs.close()
        except BenchError as exc:
            failure = (failure or "") + f"\ncleanup: {exc}"

    if rows:
        print(f"salt-run: wall time of `salt-run mpi.launch` inside {MASTER}; api: mpi.launch "
              f"through one long-lived RunnerClient in {MASTER}; user-api: from the user's "
              f"notebook through the hub's proxy with the hub token; plain: mpirun in a running "
              f"job's launcher container; program {shlex.join(PROGRAM)}, {SLOTS_PER_NODE} "
              f"ranks/node, {args.repeat} runs each after {0 if args.short else 1} warm-up "
              f"(seconds, medians)")
        header = ["nodes", "np", "salt-run", "api", "user-api", "plain", "overhead salt-run",
                  "overhead api", "overhead user-api"]
        body = []
        for r in rows:
            r["over_med"] = median(r["launch"]) - median(r["plain"])
            r["over_api"] = median(r["api"]) - median(r["plain"])
            r["over_user_api"] = median(r["user_api"]) - median(r["plain"])
            body.append([r["nodes"], r["np"], median(r["launch"]), median(r["api"]),
                         median(r["user_api"]), median(r["plain"]), r["over_med"],
                         r["over_api"], r["over_user_api"]])
        print(table(header, body))
        print()
        print("the job's own timings in the salt-run launches, medians (s; the clean-up "
              "follows the result and is not on the launch path)")
        header = ["nodes"] + list(PHASES)
        body = []
        for r in rows:
            body.append([r["nodes"]]
                        + [median([t[k] for t in r["timings"] if k in t] or [float("nan")])
                           for k in PHASES])
        print(table(header, body))
        if incomplete:
            print(f"note: {len(incomplete)} launch(es) returned without an mpirun timing: "
                  f"{incomplete}")
        if args.json:
            print(json.dumps(rows, indent=2))
        by_nodes = {r["nodes"]: r for r in rows}
        print()
        if 3 in by_nodes:
            for key, label in (("over_med", "salt-run"), ("over_api", "api"),
                               ("over_user_api", "user-api")):
                figures.record(f"launch_overhead_{label.replace('-', '_')}_3_nodes_s",
                               by_nodes[3][key], 2, aim="under 1" if label == "api" else "")
            aim = "MEETS" if by_nodes[3]["over_api"] < 1 else "MISSES"
            print(f"overhead at 3 nodes through the API {by_nodes[3]['over_api']:.2f} s: "
                  f"{aim} the < 1 s aim")
        if 1 in by_nodes and 3 in by_nodes and by_nodes[1]["over_api"] > 0:
            growth = by_nodes[3]["over_api"] / by_nodes[1]["over_api"] - 1
            aim = "MEETS" if growth < 0.25 else "MISSES"
            figures.record("launch_overhead_growth_1_to_3_nodes_pct", 100 * growth, 0,
                           aim="under 25")
            print(f"growth from 1 to 3 nodes: {aim} the < 25 % aim")
    figures.save(__file__, sys.argv[1:] if argv is None else argv, args.short)
    return verdict("launch_overhead", failure, [])


if __name__ == "__main__":
    sys.exit(main())
