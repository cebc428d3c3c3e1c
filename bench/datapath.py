#!/usr/bin/env python3
"""What does a job's own network namespace on macvlan cost the MPI data path?

Runs the same mpi4py ping-pong between rank 0 on node1 and rank 1 on node2 in two ways
and prints both side by side (medians of ``--repeat`` runs):

dockermpi
    a real job, ``salt-run mpi.submit ... np=2 nodes=node1,node2 slots_per_node=1``:
    rank 0 in the job's launcher container on node1, rank 1 in its worker on node2, each
    in the job's own network namespace with an address on the Docker macvlan network
    (``job_addresses``), behind the job's own iptables. Figures come from the job's
    stdout. Each repeat is a new job, waited for with one ``mpi.wait`` that blocks in
    the master, then until its clean-up is done: nothing of this script runs beside the
    ping-pong (a salt-run polling ``mpi.status`` twice a second took enough of this
    2-core machine to halve the job's bandwidth).
host
    host networking as DockerMPI used before: one container of the same approved image
    (pillar ``mpi:images:mpi``) on each of node1 and node2, started by this script with
    ``--net=host --user 65000:65000`` (no capabilities, no-new-privileges), running the
    node's own sshd (its remote-start agent, mounted as in job containers) unprivileged
    on port 20099 of the node with a throwaway key pair and host key
    (the files are built by :mod:`dmpi.launch` as for a job), and plain ``mpirun``
    from node1's container over the nodes' host addresses with
    ``dmpi.launch.openmpi.mpi_argv``: TCP BTL, the same MCA settings (``mca_params``) for the
    cluster network, OOB ports 20298-20299 and BTL ports 20900-20999 (inside the MPI
    port ranges the node firewall accepts from the cluster network). Each repeat is one
    mpirun in the same two containers. They have no CPU limit unless ``--cpus`` gives
    one (a job's containers get ``cpus_per_slot`` per rank, 1 CPU here, and the
    launcher's runs mpirun beside rank 0 within it).

The ping-pong (rank 0 sends, rank 1 sends back, blocking ``Send``/``Recv``) measures

latency
    half the round trip of a 1-byte message, in microseconds (``--lat-iters`` round
    trips after a tenth as many for warm-up);
bandwidth
    4 MiB messages (``--size``): bytes moved one way per second of half a round trip, in
    MB/s (10^6 bytes), over ``--bw-iters`` round trips after warm-up.

``--pair within`` puts both ranks on node1 instead (``np=2 nodes=node1
slots_per_node=2``: both in the job's launcher container; on the host side both in
node1's container, mpirun starting them locally): the figures are then shared memory's,
named ``datapath_within_*``. Both sides use Open MPI's ``vader`` BTL there, with
``btl_vader_single_copy_mechanism none`` (``mca_params``): messages go through a shared
memory segment in copies. CMA (``process_vm_readv``) would need ptrace rights, which a
job's container, with no capabilities under Docker's seccomp profile, does not have.

The two sides run alternately, one repeat of each at a time. Exits non-zero when a run
fails, a rank is not on the node it should be, or anything it started is left: the job
(cancelled if unfinished and waited for until no node holds it), the two containers and
their key directories on the nodes (removed in ``finally``, also on Ctrl-C and SIGTERM,
and at the start when an interrupted run left them). Run holding the cluster lock::

    flock /tmp/dmpi-cluster.lock .venv/bin/python bench/datapath.py --repeat 3

``--short`` (what CI runs): one run of each side, 100 latency and 2 bandwidth round trips.
"""

import argparse
import base64
import inspect
import json
import pathlib
import io
import secrets
import subprocess
import sys
import tarfile
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
import dmpi.launch.files  # noqa: E402
import dmpi.launch.openmpi  # noqa: E402
import dmpi.launch.ssh  # noqa: E402  (pure Python; key generation needs cryptography)
import dmpi.pingpong  # noqa: E402
from dmpi.contract import (  # noqa: E402
    AGENT_DIR, AGENT_SSH, AGENT_SSHD, DATA_MOUNT, NETNS_NAME, USERS_SUBDIR,
)
import figures  # noqa: E402
from dmpi_bench import (  # noqa: E402
    BenchError, Jobs, RunnerSession, Terminated, log, median, node_exec, salt_run, table,
    trap_sigterm, verdict, check_common_args, parse_args,
)

#: ``--pair``: rank 0's and rank 1's nodes.
PAIRS = {"between": ("node1", "node2"), "within": ("node1", "node1")}
FIRST = "node1"                # rank 0's node, where mpirun runs
ADDRESSES = {"node1": "10.251.1.11", "node2": "10.251.1.12", "node3": "10.251.1.13"}
HOST_UID = 65000
HOST_ACCOUNT = "benchdp"
SSH_PORT = 20099               # the last port of mpi:ports:sshd
OOB_PORTS = (20298, 20299)     # the last two of mpi:ports:oob
BTL_PORTS = (20900, 20999)     # part of mpi:ports:btl
LABEL = "io.dockermpi.bench=datapath"
PREFIX = "dmpi-bench-datapath"
BASE = "/var/lib/dmpi-bench-datapath"  # on the nodes; /tmp there is a tmpfs of its own
T_JOB = 180                    # one DockerMPI job from submit to its end
T_MPIRUN = 180                 # one plain mpirun
T_SSHD = 30                    # the host-network sshd answering
SHORT = {"repeat": 1, "lat_iters": 100, "bw_iters": 2}  # what --short (CI) sets

#: ``--candidate``: what is changed in the job's namespace on each node of the pair,
#: after its ranks' containers are up and before the ping-pong, to measure what each part
#: of the job's data path costs (bench/README.md). ``chosen`` changes nothing: the
#: namespace as DockerMPI makes it, measured the same way.
CANDIDATES = {
    "chosen": [],
    # The raw table's NOTRACK rules gone: every packet of the ranks goes through
    # connection tracking (the filter rules still accept the peers by address).
    "tracked": [["iptables", "-t", "raw", "-F"]],
}

# Rank 0 <-> rank 1 (dmpi.pingpong.mpi_pingpong, whose module travels with it, as in
# the self-test); rank 0 prints one JSON line. Arguments: latency round trips, bandwidth
# round trips, bandwidth message bytes, and optionally a file to wait for before MPI
# starts (a --candidate's change is made meanwhile).
PINGPONG = inspect.getsource(dmpi.pingpong) + r'''
import json, os, sys, time
lat_iters, bw_iters, size = (int(a) for a in sys.argv[1:4])
go = sys.argv[4] if len(sys.argv) > 4 else ""
deadline = time.monotonic() + 120
while go and not os.path.exists(go):
    if time.monotonic() > deadline:
        sys.exit(f"{go} did not appear within 120 s")
    time.sleep(0.05)
from mpi4py import MPI
comm = MPI.COMM_WORLD
if comm.Get_size() != 2:
    comm.Abort(2)
figures = mpi_pingpong(comm, MPI, size, lat_iters, bw_iters)
hosts = comm.gather(MPI.Get_processor_name(), root=0)
if comm.Get_rank() == 0:
    print(json.dumps(dict(figures, hosts=hosts)), flush=True)
'''


def program(args, go=None):
    """The ping-pong as a program argv: the script travels base64-encoded, as one word;
    with ``go``, it waits for that file before MPI starts."""
    encoded = base64.b64encode(PINGPONG.encode()).decode()
    return ["python3", "-c", f"import base64; exec(base64.b64decode('{encoded}'))",
            str(args.lat_iters), str(args.bw_iters), str(args.size)] + ([go] if go else [])


def parse(stdout, where, pair):
    for line in reversed(stdout.splitlines()):
        if line.startswith("{"):
            try:
                result = json.loads(line)
            except json.JSONDecodeError:
                break
            if result.get("hosts") != list(pair):
                raise BenchError(f"{where}: ranks ran on {result.get('hosts')}, not {list(pair)}")
            return result
    raise BenchError(f"{where}: no result line in the ping-pong's output:\n{stdout[-2000:]}")


# ------------------------------------------------------------------------ dockermpi


def ranks_by_node(pair):
    """{node: ranks} of the pair, rank 0's node first."""
    return {node: pair.count(node) for node in dict.fromkeys(pair)}


def dockermpi_once(jobs, args, storage, session=None, candidate=None):
    """One job's figures. With a ``candidate``, its ranks wait for a go file; meanwhile
    the candidate's change is made and ``mpi.wait`` is asked of ``session`` (a
    RunnerSession: no salt-run process starts beside the ping-pong), then the file is
    made."""
    pair = PAIRS[args.pair]
    placement = ranks_by_node(pair)
    go = f".datapath-go-{secrets.token_hex(4)}" if candidate else None
    job_id = jobs.submit(2, program(args, go and f"{DATA_MOUNT}/{go}"),
                         nodes=",".join(placement),
                         slots_per_node=max(placement.values()), walltime=f"{T_JOB}s")
    if go:
        go_file = f"{storage}/{USERS_SUBDIR}/{jobs.user}/{go}"
        jobs.wait_state(job_id, ("running",), T_JOB)
        for node in placement:
            change_namespace(node, job_id, CANDIDATES[candidate])
        session.send("mpi.wait", job_id=job_id, timeout=T_JOB)
        node_exec(FIRST, ["touch", go_file])
        session.answer("mpi.wait")
        node_exec(FIRST, ["rm", "-f", go_file])
    job = jobs.wait_closed(job_id, T_JOB + 60)
    if job["state"] != "succeeded":
        raise BenchError(f"job {job_id} ended {job['state']}: {job.get('reason')}")
    if job.get("placement") != placement:
        raise BenchError(f"job {job_id} placed {job.get('placement')}, expected {placement}")
    stdout = node_exec(pair[0], ["cat", job["output"]["stdout"]]).stdout
    result = parse(stdout, f"job {job_id}", pair)
    log(f"dockermpi {job_id} ({job.get('job_addresses')}): {result['latency_us']:.1f} us, "
        f"{result['bandwidth_mb_per_s']:.0f} MB/s")
    return result


def change_namespace(node, job_id, changes):
    """Run each argv of ``changes`` in the job's network namespace on ``node`` (that of
    its namespace holder container, through nsenter on the node's host)."""
    pid = node_exec(node, ["docker", "inspect", "-f", "{{.State.Pid}}",
                           NETNS_NAME.format(job_id=job_id)]).stdout.strip()
    for argv in changes:
        said = node_exec(node, ["nsenter", "-t", pid, "-n", *argv]).stdout.strip()
        log(f"{node}: {argv[0]} {argv[-1] if len(argv) > 1 else ''} in job {job_id}'s "
            f"namespace{': ' + said if said else ''}")


# ----------------------------------------------------------------------------- host


def site():
    """(image reference, cluster network, shared storage path) from the nodes' pillar."""
    code, pillar = salt_run("pillar.show_pillar", FIRST)
    mpi = (pillar or {}).get("mpi") if isinstance(pillar, dict) else None
    try:
        return mpi["images"]["mpi"], mpi["cluster_network"], mpi["storage"]["path"]
    except (KeyError, TypeError):
        raise BenchError(f"no mpi:images:mpi, mpi:cluster_network or mpi:storage:path in "
                         f"{FIRST}'s pillar (exit {code})") from None


def remove_host_side():
    """Every container and key directory of this script on the nodes of either pair (also
    an earlier run's); returns what was removed."""
    removed = []
    for node in sorted({node for pair in PAIRS.values() for node in pair}):
        found = node_exec(node, ["docker", "ps", "-aq", "--filter",
                                 f"label={LABEL}"]).stdout.split()
        if found:
            node_exec(node, ["docker", "rm", "-f", *found], timeout=60)
            removed += [f"{node}:container {c}" for c in found]
        dirs = node_exec(node, ["sh", "-c", f"ls -d {BASE}/* 2>/dev/null || true"]).stdout.split()
        node_exec(node, ["rm", "-rf", "--", BASE])
        removed += [f"{node}:{d}" for d in dirs]
    return removed


def put_files(node, directory, files):
    """``directory`` on the node (0700) holding ``files`` (0600), all owned by HOST_UID;
    through ``tar`` on stdin (``docker cp`` would miss a tmpfs mounted in the node)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.uid, info.gid = len(data), 0o600, HOST_UID, HOST_UID
            archive.addfile(info, io.BytesIO(data))
    node_exec(node, ["install", "-d", "-m", "0700", "-o", str(HOST_UID), "-g", str(HOST_UID),
                     directory])
    argv = ["docker", "exec", "-i", f"dmpi-{node}", "tar", "-x", "--same-owner",
            "--same-permissions", "-C", directory]
    try:
        result = subprocess.run(argv, input=buffer.getvalue(), capture_output=True, timeout=60)
    except subprocess.TimeoutExpired:
        raise BenchError(f"timed out writing {directory} on {node}") from None
    if result.returncode != 0:
        raise BenchError(f"writing {directory} on {node}: {result.stderr.decode()[-500:]}")


class HostNetwork:
    """A host-networked container on each node of the pair with an unprivileged sshd,
    and plain mpirun."""

    def __init__(self, args, image, cidr):
        self.args = args
        self.pair = PAIRS[args.pair]
        self.nodes = ranks_by_node(self.pair)
        self.image = image
        self.cidr = cidr
        self.directory = f"{BASE}/{secrets.token_hex(4)}"
        self.run_dir = dmpi.launch.ssh.DEFAULT_RUN_DIR
        self.argv = dmpi.launch.openmpi.mpi_argv(2, cidr, OOB_PORTS, BTL_PORTS, SSH_PORT, "/data",
                                           run_dir=self.run_dir)

    def files(self, node):
        """The job's files and keys as the nodes make them (one throwaway CA here)."""
        ca_private, ca_public = self.ca
        addresses = {n: ADDRESSES[n] for n in self.nodes}
        now = int(time.time())
        keys = dmpi.launch.ssh.job_keys(ca_private, "bench-datapath", node, addresses,
                                   {n: ca_public for n in self.nodes}, FIRST, SSH_PORT,
                                   now - 300, now + 3600)
        return dict(keys, **{
            "sshd_config": dmpi.launch.ssh.sshd_config_text(SSH_PORT, HOST_ACCOUNT, self.run_dir,
                                                       listen_address=ADDRESSES[node]),
            "passwd": dmpi.launch.files.passwd_text(HOST_ACCOUNT, HOST_UID, HOST_UID),
            "group": dmpi.launch.files.group_text(HOST_ACCOUNT, HOST_UID),
            "program": dmpi.launch.files.program_script_text(program(self.args)),
            "hostfile": dmpi.launch.openmpi.hostfile_text(
                [(ADDRESSES[n], ranks) for n, ranks in self.nodes.items()]),
        })

    def start(self):
        self.ca = dmpi.launch.ssh.generate_ed25519_keypair("dmpi-bench-ca")
        for node in self.nodes:
            put_files(node, self.directory, self.files(node))
            # The node's own sshd and ssh, as job containers have them.
            agent = node_exec(node, ["readlink", "-f", AGENT_DIR]).stdout.strip()
            mounts = [f"type=bind,src={self.directory},dst={self.run_dir},readonly",
                      f"type=bind,src={agent},dst={AGENT_DIR},readonly",
                      f"type=bind,src={self.directory}/passwd,dst=/etc/passwd,readonly",
                      f"type=bind,src={self.directory}/group,dst=/etc/group,readonly",
                      "type=tmpfs,dst=/data,tmpfs-mode=1777"]
            argv = ["docker", "run", "-d", "--name", f"{PREFIX}-{node}", "--label", LABEL,
                    "--net=host", "--user", f"{HOST_UID}:{HOST_UID}", "--init",
                    "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
                    "-e", "HOME=/data", "-e", "TMPDIR=/tmp", "-w", "/data"]
            if self.args.cpus:
                argv += ["--cpus", str(self.args.cpus)]
            for mount in mounts:
                argv += ["--mount", mount]
            argv += ["--entrypoint", AGENT_SSHD, self.image,
                     "-D", "-e", "-f", f"{self.run_dir}/sshd_config"]
            node_exec(node, argv, timeout=60)
        # Ready when node1's container logs in to node2's sshd with the throwaway keys.
        ssh = [AGENT_SSH, *dmpi.launch.ssh.ssh_args(SSH_PORT, self.run_dir),
               ADDRESSES[self.pair[1]], "true"]
        deadline = time.monotonic() + T_SSHD
        while True:
            result = node_exec(FIRST, ["docker", "exec", f"{PREFIX}-{FIRST}", *ssh],
                               check=False)
            if result.returncode == 0:
                break
            if time.monotonic() > deadline or not all(self.running(n) for n in self.nodes):
                raise BenchError(f"host-network sshd on {self.pair[1]}:{SSH_PORT} does not let "
                                 f"{FIRST} in: {result.stderr.strip()[-500:]}\n"
                                 + "\n".join(self.diagnose(n) for n in self.nodes))
            time.sleep(1)
        log(f"host-network containers up on {list(self.nodes)} (sshd port {SSH_PORT}, image {self.image})")

    @staticmethod
    def running(node):
        result = node_exec(node, ["docker", "inspect", "-f", "{{.State.Running}}",
                                  f"{PREFIX}-{node}"], check=False)
        return result.stdout.strip() == "true"

    @staticmethod
    def diagnose(node):
        """The container's state and log and who listens on the sshd port of the node."""
        name = f"{PREFIX}-{node}"
        state = node_exec(node, ["docker", "inspect", "-f", "{{.State.Status}}", name],
                          check=False)
        logs = node_exec(node, ["docker", "logs", "--tail", "20", name], check=False)
        listening = node_exec(node, ["ss", "-ltnp", f"sport = :{SSH_PORT}"], check=False)
        return (f"{node}: container {state.stdout.strip()}, log: "
                f"{(logs.stdout + logs.stderr).strip()[-800:]}\n"
                f"{node}: listening on {SSH_PORT}: {listening.stdout.strip()[-800:]}")

    def once(self):
        result = node_exec(FIRST, ["docker", "exec", f"{PREFIX}-{FIRST}", *self.argv],
                           timeout=T_MPIRUN, check=False)
        if result.returncode != 0:
            raise BenchError(f"plain mpirun exited {result.returncode}:\n"
                             f"{result.stdout[-2000:]}{result.stderr[-2000:]}")
        found = parse(result.stdout, "plain mpirun", self.pair)
        log(f"host: {found['latency_us']:.1f} us, {found['bandwidth_mb_per_s']:.0f} MB/s")
        return found


# ----------------------------------------------------------------------------- main


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per side (default 3)")
    parser.add_argument("--lat-iters", type=int, default=10000,
                        help="1-byte round trips per run (default 10000)")
    parser.add_argument("--bw-iters", type=int, default=100,
                        help="round trips of --size bytes per run (default 100)")
    parser.add_argument("--size", type=int, default=4 << 20,
                        help="bandwidth message bytes (default 4 MiB)")
    parser.add_argument("--cpus", type=float, default=0,
                        help="CPU limit of each host-network container (default none; 1 is "
                             "what a one-rank job container gets, cpus_per_slot)")
    parser.add_argument("--pair", choices=sorted(PAIRS), default="between",
                        help="between: rank 0 on node1, rank 1 on node2 (default); within: "
                             "both on node1 (shared memory)")
    parser.add_argument("--candidate", choices=list(CANDIDATES),
                        help="a change made in the job's namespaces while its ranks wait, "
                             "before the ping-pong: chosen (none), tracked (no NOTRACK: "
                             "connection tracking); any but chosen also runs chosen, "
                             "interleaved, and gives their ratio")
    parser.add_argument("--user", default="bench-datapath", help="job user (starts with bench)")
    parser.add_argument("--json", action="store_true", help="also print every sample as JSON")
    parser.add_argument("--short", action="store_true",
                        help="what CI runs: one run per side, 100 latency and 2 bandwidth "
                             "round trips")
    args = parse_args(parser, argv, SHORT)
    if min(args.repeat, args.lat_iters, args.bw_iters, args.size) < 1:
        parser.error("--repeat, --lat-iters, --bw-iters and --size must be positive")
    check_common_args(parser, args)
    trap_sigterm()

    jobs = Jobs(args.user)
    session = None
    samples = {"dockermpi": [], "host": []}
    if args.candidate not in (None, "chosen"):
        samples["chosen"] = []  # the same procedure with no change, interleaved
    failure = None
    problems = []
    try:
        stale = remove_host_side()
        if stale:
            log(f"removed what an interrupted run left: {stale}")
        image, cidr, storage = site()
        host = HostNetwork(args, image, cidr)
        host.start()
        if args.candidate:
            session = RunnerSession(T_JOB + 60)
        for i in range(args.repeat):
            samples["dockermpi"].append(dockermpi_once(jobs, args, storage, session,
                                                       args.candidate))
            if "chosen" in samples:
                samples["chosen"].append(dockermpi_once(jobs, args, storage, session, "chosen"))
            samples["host"].append(host.once())
    except (KeyboardInterrupt, Terminated) as exc:
        failure = f"interrupted ({type(exc).__name__})"
    except BenchError as exc:
        failure = str(exc)
    finally:
        if session is not None:
            session.close()
        try:
            remove_host_side()
        except BenchError as exc:
            problems.append(f"removing the host-network containers: {exc}")
        try:
            jobs.close()
        except BenchError as exc:
            problems.append(f"cleanup: {exc}")

    if args.json:
        for side, found in samples.items():
            for sample in found:
                print(json.dumps(dict(sample, side=side)))
    if any(samples.values()):
        pair = PAIRS[args.pair]
        print(f"mpi4py ping-pong rank 0 on {pair[0]} <-> rank 1 on {pair[1]}: latency of 1-byte "
              f"messages ({args.lat_iters} round trips), bandwidth of {args.size} B messages "
              f"({args.bw_iters} round trips); medians of {args.repeat} runs")
        rows = []
        host_what = "host networking (--net=host" + (f", --cpus {args.cpus:g})" if args.cpus
                                                      else ")")
        ours = "DockerMPI: job namespaces on macvlan" if args.pair == "between" else \
            "DockerMPI: the job's container"
        what = {"dockermpi": f"{ours}, {args.candidate}" if args.candidate else ours,
                "chosen": f"{ours}, chosen", "host": host_what}
        for side in samples:
            found = samples[side]
            rows.append([what[side], len(found), median([s["latency_us"] for s in found]),
                         median([s["bandwidth_mb_per_s"] for s in found]),
                         " ".join(f"{s['latency_us']:.1f}" for s in found),
                         " ".join(f"{s['bandwidth_mb_per_s']:.0f}" for s in found)])
        print(table(["data path", "runs", "latency us", "bandwidth MB/s", "latency runs",
                     "bandwidth runs"], rows))
        name = "datapath_" + ("" if args.pair == "between" else "within_") + (
            args.candidate.replace("-", "_") + "_" if args.candidate else "")
        if samples["dockermpi"] and samples["host"]:
            lat = [median([s["latency_us"] for s in samples[k]]) for k in ("dockermpi", "host")]
            bw = [median([s["bandwidth_mb_per_s"] for s in samples[k]]) for k in ("dockermpi", "host")]
            print(f"dockermpi / host: latency x{lat[0] / lat[1]:.2f}, "
                  f"bandwidth x{bw[0] / bw[1]:.2f}")
            figures.record(f"{name}dockermpi_latency_us", lat[0], 1)
            figures.record(f"{name}host_latency_us", lat[1], 1)
            figures.record(f"{name}dockermpi_bandwidth_mb_per_s", bw[0], 0)
            figures.record(f"{name}host_bandwidth_mb_per_s", bw[1], 0)
            # A candidate's figures are what it would cost, not the product's: no aim.
            figures.record(f"{name}latency_ratio", lat[0] / lat[1], 2,
                           aim="" if args.candidate else "at most 1.15")
            figures.record(f"{name}bandwidth_ratio", bw[0] / bw[1], 2,
                           aim="" if args.candidate else "at least 0.9")
        if samples.get("chosen") and samples["dockermpi"]:
            lat = [median([s["latency_us"] for s in samples[k]]) for k in ("dockermpi", "chosen")]
            bw = [median([s["bandwidth_mb_per_s"] for s in samples[k]])
                  for k in ("dockermpi", "chosen")]
            print(f"{args.candidate} / chosen: latency x{lat[0] / lat[1]:.2f}, "
                  f"bandwidth x{bw[0] / bw[1]:.2f}")
            figures.record(f"{name}vs_chosen_latency_ratio", lat[0] / lat[1], 2)
            figures.record(f"{name}vs_chosen_bandwidth_ratio", bw[0] / bw[1], 2)
    figures.save(__file__, sys.argv[1:] if argv is None else argv, args.short)
    return verdict("datapath", failure, problems)


if __name__ == "__main__":
    sys.exit(main())
