"""Shared helpers of the DockerMPI benchmarks (bench/*.py): run commands against the
running test cluster with timeouts, drive ``salt-run mpi.*`` and track jobs so every
benchmark can cancel and clean up what it started (also on Ctrl-C and SIGTERM).

Not a benchmark itself; the scripts import it from the same directory.
"""

import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import time

# The benchmarks run from the repository (``python3 bench/<name>.py``) against its test
# cluster, and share its runner session.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.cluster import runner_session  # noqa: E402  pylint: disable=wrong-import-position

MASTER = "dmpi-master"
MASTER_PYTHON = runner_session.MASTER_PYTHON
NODES = ["node1", "node2", "node3"]
SLOTS_PER_NODE = 2
FINAL = ("succeeded", "failed", "cancelled", "timed_out")
T_SALT = 60     # one salt / salt-run call through docker exec
T_SHORT = 30    # docker exec of a small command


class BenchError(Exception):
    """A run did not behave; the script exits non-zero."""


class Terminated(BaseException):
    """SIGTERM, turned into an exception so ``finally`` blocks run."""


def trap_sigterm():
    def handler(signum, frame):
        raise Terminated()

    signal.signal(signal.SIGTERM, handler)


def log(message):
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run(argv, timeout, check=True):
    """Run argv on this host with a timeout; returns CompletedProcess (text)."""
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise BenchError(f"timed out after {timeout}s: {shlex.join(argv)[:300]}") from exc
    if check and result.returncode != 0:
        raise BenchError(f"exit {result.returncode}: {shlex.join(argv)[:300]}\n"
                         f"{result.stdout[-2000:]}{result.stderr[-2000:]}")
    return result


def node_exec(node, argv, timeout=T_SHORT, check=True):
    return run(["docker", "exec", f"dmpi-{node}", *argv], timeout, check=check)


def _arg(key, value):
    return f"{key}={value if isinstance(value, str) else json.dumps(value)}"


def salt_run(fun, *args, timeout=T_SALT, **kwargs):
    """``salt-run fun ... --out=json`` on the master; (exit code, parsed output)."""
    argv = ["docker", "exec", MASTER, "salt-run", fun, *args,
            *(_arg(k, v) for k, v in kwargs.items()), "--out=json"]
    result = run(argv, timeout, check=False)
    try:
        return result.returncode, json.loads(result.stdout)
    except json.JSONDecodeError:
        raise BenchError(f"salt-run {fun} exited {result.returncode} without JSON:\n"
                         f"{result.stdout[-2000:]}{result.stderr[-2000:]}") from None


def salt(target_nodes, fun, *args, timeout=T_SALT):
    """``salt -L nodes fun ... --out=json --static``; (exit code, {node: ret})."""
    argv = ["docker", "exec", MASTER, "salt", "-L", ",".join(target_nodes), fun, *args,
            f"--timeout={max(5, timeout - 15)}", "--out=json", "--static"]
    result = run(argv, timeout, check=False)
    try:
        return result.returncode, json.loads(result.stdout) if result.stdout.strip() else {}
    except json.JSONDecodeError:
        raise BenchError(f"salt {fun} exited {result.returncode} without JSON:\n"
                         f"{result.stdout[-2000:]}{result.stderr[-2000:]}") from None


def node_jobs(nodes=NODES, timeout=T_SALT):
    """{node: {job_id: {...}}} from ``mpi_job.jobs`` (only nodes that answered)."""
    _, found = salt(nodes, "mpi_job.jobs", timeout=timeout)
    return {n: j for n, j in found.items() if isinstance(j, dict)}


def engine_jobs(node, timeout=T_SHORT):
    """Job ids with a DockerMPI container on ``node``, asked from its engine directly
    (works when the node's minion cannot reach the master)."""
    result = node_exec(node, ["docker", "ps", "-a", "--filter", "label=io.dockermpi.job",
                              "--format", '{{.Label "io.dockermpi.job"}}'], timeout)
    return sorted(set(result.stdout.split()))


def secret_dirs(node, job_root="/var/lib/dockermpi/jobs", timeout=T_SHORT):
    result = node_exec(node, ["sh", "-c", f"ls -1 {shlex.quote(job_root)} 2>/dev/null || true"],
                       timeout)
    return sorted(result.stdout.split())


def host_cpu_files(hosts):
    """``({host: its cgroup's CPU usage file}, {container id: host})`` for those of the
    cluster's host containers ``hosts`` that exist (what a host's systemd services, Salt,
    Docker engine and commands use; the jobs' containers are in cgroups of their own)."""
    found, ids = {}, {}
    for host in hosts:
        result = run(["docker", "inspect", "-f", "{{.Id}}", f"dmpi-{host}"], 30, check=False)
        cid = result.stdout.strip()
        if result.returncode != 0 or not cid:
            continue
        ids[cid] = host
        for path in (f"/sys/fs/cgroup/cpuacct/docker/{cid}/cpuacct.usage",
                     f"/sys/fs/cgroup/system.slice/docker-{cid}.scope/cpu.stat"):
            if os.path.exists(path):
                found[host] = path
                break
        else:
            raise BenchError(f"no CPU accounting found for dmpi-{host} ({cid[:12]})")
    return found, ids


def cgroup_seconds(path):
    """CPU seconds a cgroup has used (``cpuacct.usage`` or cgroup v2's ``cpu.stat``)."""
    with open(path, encoding="ascii") as usage:
        if path.endswith("cpuacct.usage"):
            return int(usage.read()) / 1e9
        return int(dict(line.split() for line in usage)["usage_usec"]) / 1e6


def median(values):
    return statistics.median(values) if values else float("nan")


def fmt(value, digits=2):
    if value is None:
        return "-"
    if isinstance(value, float):
        return "nan" if value != value else f"{value:.{digits}f}"
    return str(value)


def table(header, rows):
    """A plain text table; rows are lists of cells (already formatted or numbers)."""
    cells = [[fmt(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(header)]
    lines = [" | ".join(h.rjust(w) for h, w in zip(header, widths)),
             "-+-".join("-" * w for w in widths)]
    lines += [" | ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells]
    return "\n".join(lines)


def parse_args(parser, argv, short):
    """``parser``'s arguments from ``argv``; with ``--short`` (what CI runs), the
    defaults in ``short`` take the full run's place, and flags given with it still win."""
    args = parser.parse_args(argv)
    if args.short:
        parser.set_defaults(**short)
        args = parser.parse_args(argv)
    return args


def check_common_args(parser, args):
    """What every benchmark requires: a job user of its own (bench*) and root."""
    if not args.user.startswith("bench"):
        parser.error("--user must start with 'bench'")
    if os.geteuid() != 0:
        parser.error("run as root (it drives docker)")


def verdict(name, failure, problems):
    """Print what went wrong, if anything; the script's exit code."""
    if problems:
        print("problems:\n  " + "\n  ".join(problems), file=sys.stderr)
    if failure:
        print(f"{name}: FAILED: {failure.strip()}", file=sys.stderr)
    return 1 if failure or problems else 0


class RunnerSession:
    """A runner session in the master (:mod:`tests.cluster.runner_session`): the way a
    long-lived API server calls the runner, no process start, no config or module loading
    per call. One call at a time; open several sessions for parallel callers."""

    def __init__(self, timeout=T_SALT):
        self.timeout = timeout
        try:
            self.session = runner_session.RunnerSession(MASTER)
        except runner_session.SessionError as exc:
            raise BenchError(str(exc)) from exc

    def call(self, fun, **kwarg):
        """``(seconds in the master, return)`` of one runner call; raises BenchError if
        it raised or gave no answer within the session's timeout."""
        self.send(fun, **kwarg)
        return self.answer(fun)

    def send(self, fun, **kwarg):
        """Ask for one runner call and return at once; :meth:`answer` waits for it."""
        try:
            self.session.send({"fun": fun, "kwarg": kwarg})
        except runner_session.SessionError as exc:
            raise BenchError(str(exc)) from exc

    def answer(self, fun):
        """``(seconds, return)`` of the call :meth:`send` asked for."""
        try:
            reply = self.session.answer(fun, self.timeout)
        except runner_session.SessionError as exc:
            raise BenchError(str(exc)) from exc
        return reply["seconds"], reply["ret"]

    def closed(self, job_id, timeout):
        """``mpi.status`` of the job once its clean-up is done, woken by its event (as it
        is after ``timeout`` seconds)."""
        try:
            return self.session.closed(job_id, timeout)
        except runner_session.SessionError as exc:
            raise BenchError(str(exc)) from exc

    def close(self):
        self.session.close()


class Jobs:
    """Jobs this script submitted; ``close`` cancels the unfinished ones and waits until
    none of their containers or keys is left on a node that answers."""

    def __init__(self, user):
        self.user = user
        self.ids = []

    def submit(self, np, cmd, nodes=None, slots_per_node=None, walltime="2m", timeout=T_SALT,
               session=None, user=None):
        """Submit through ``salt-run``, or through ``session`` (a RunnerSession), as
        ``user`` (default: this object's user)."""
        kwargs = {"user": user or self.user, "image": "mpi", "np": np, "cmd": cmd,
                  "walltime": walltime}
        if nodes is not None:
            kwargs["nodes"] = nodes
        if slots_per_node is not None:
            kwargs["slots_per_node"] = slots_per_node
        if session is None:
            code, job = salt_run("mpi.submit", timeout=timeout, **kwargs)
        else:
            _, job = session.call("mpi.submit", **kwargs)
            code = 0 if isinstance(job, dict) and job.get("state") == "queued" else 1
            job = job if isinstance(job, dict) else {"returned": job}
        if job.get("job_id"):
            self.ids.append(job["job_id"])
        if code != 0 or job.get("state") != "queued":
            raise BenchError(f"mpi.submit was refused (exit {code}): {json.dumps(job)[:1500]}")
        return job["job_id"]

    @staticmethod
    def status(job_id, timeout=T_SALT):
        code, job = salt_run("mpi.status", job_id, timeout=timeout)
        if not isinstance(job, dict) or "state" not in job:
            raise BenchError(f"mpi.status {job_id} (exit {code}): {json.dumps(job)[:1500]}")
        return job

    def wait_state(self, job_id, states, timeout, poll=0.3):
        """Poll mpi.status until the job is in one of ``states``; returns the record."""
        deadline = time.monotonic() + timeout
        while True:
            job = self.status(job_id)
            if job["state"] in states:
                return job
            if job["state"] in FINAL:
                raise BenchError(f"job {job_id} ended {job['state']} ({job.get('reason')}) "
                                 f"while waiting for {states}")
            if time.monotonic() > deadline:
                raise BenchError(f"job {job_id} still {job['state']} after {timeout}s "
                                 f"(waiting_for {job.get('waiting_for')})")
            time.sleep(poll)

    @staticmethod
    def wait_end(job_id, timeout):
        """The job's record once its state is final, or as it is after ``timeout``
        seconds: one ``mpi.wait`` blocking in the master. Polling ``mpi.status`` instead
        would start a salt-run every moment, CPU taken from the job being timed."""
        code, job = salt_run("mpi.wait", job_id, f"timeout={timeout}", timeout=timeout + T_SALT)
        if not isinstance(job, dict) or "state" not in job:
            raise BenchError(f"mpi.wait {job_id} (exit {code}): {json.dumps(job)[:1500]}")
        return job

    def wait_closed(self, job_id, timeout):
        """The job's record once it has ended and its clean-up is done (``closed``), so
        that the clean-up takes nothing from the next measurement."""
        deadline = time.monotonic() + timeout
        job = self.wait_end(job_id, timeout)
        while job["state"] in FINAL and not job.get("closed") and time.monotonic() < deadline:
            time.sleep(0.5)
            job = self.status(job_id)
        if not job.get("closed"):
            raise BenchError(f"job {job_id} is {job['state']}, not closed, after {timeout}s "
                             f"(waiting_for {job.get('waiting_for')})")
        return job

    @staticmethod
    def cancel(job_id):
        code, job = salt_run("mpi.cancel", job_id)
        return job

    def close(self, timeout=60):
        """Cancel what is unfinished; raise BenchError listing whatever is left behind."""
        problems = []
        for job_id in self.ids:
            try:
                job = self.status(job_id)
                if job["state"] not in FINAL:
                    log(f"cancelling {job_id} ({job['state']})")
                    self.cancel(job_id)
            except BenchError as exc:
                problems.append(f"cancel {job_id}: {exc}")
        if not self.ids:
            return
        mine = set(self.ids)
        deadline = time.monotonic() + timeout
        left, missing = {}, []
        while time.monotonic() < deadline:
            try:
                found = node_jobs()
            except BenchError as exc:
                problems.append(str(exc))
                break
            left = {n: sorted(set(j) & mine) for n, j in found.items() if set(j) & mine}
            missing = sorted(set(NODES) - set(found))
            if not left and not missing:
                break
            time.sleep(1)
        if left:
            problems.append(f"left behind on nodes: {left}")
        if missing:
            problems.append(f"cannot check for leftovers, no answer from {missing}")
        if problems:
            raise BenchError("; ".join(problems))
