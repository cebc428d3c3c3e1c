#!/bin/sh
# Capture real Intel MPI (Intel's Hydra) output for tests/unit/dmpi/launch/test_intelmpi.py.
#
# Usage: capture.sh [WHEEL_DIR]
#   WHEEL_DIR (default /var/cache/dockermpi/wheelhouse, DockerMPI's wheelhouse) holds the
#   PyPI wheels impi-rt 2021.18.1 (manylinux_2_28_x86_64) and mpi4py 4.1.2 (cp311).
#
# Builds a throw-away image FROM dockermpi/debian:bookworm with the two wheels installed
# offline into a venv first on PATH (openssh-client/-server only for this capture: the
# product mounts its own ssh), then runs ONE container as uid 1000 (HOME=/tmp, no
# capabilities, /etc/passwd naming the user, like a job container) with the environment
# of dmpi.launch.intelmpi.launcher_environment, in which every case runs the argv of
# dmpi.launch.flavours.launcher_argv (the module is bind-mounted read-only from this
# checkout) with a hostfile of the container's own address, 4 slots: Hydra forks the
# proxy of its own address (no sshd runs there), but every option and setting is parsed
# and applied. Each case writes CASE.stdout and CASE.stderr here and a line
# "CASE<TAB>exit code<TAB>seconds" to results.tsv.
#
# Then the ssh_* cases: two containers on a throw-away network impicap-net
# (10.231.9.0/24): a launcher (10.231.9.11, 1 slot, runs mpirun, with the environment of
# launcher_environment) and a worker (10.231.9.12, 3 slots, runs sshd as uid 1000 with
# the configuration and per-job keys of dmpi.launch.ssh), both with the same host name
# (as a job's containers have), so Hydra starts its proxy on the worker over ssh with
# AGENT_SSH and I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS; 1 + 3 slots for 4 ranks shows
# -machinefile's host:N placement (an even spread would put 2 on each). ssh_noiface: as
# ssh_hello, but the launcher's script without intelmpi.LAUNCHER_PRELUDE (no
# I_MPI_HYDRA_IFACE), killed if it has not ended 60 s later. ssh_lostnode: the worker is
# docker-killed while ranks sleep; ssh_partition: the worker is disconnected from the
# network while ranks sleep, and the launcher is killed if it has not ended 60 s later
# (exit code "timeout"). Both act once every rank said it passed a barrier.
# The image, containers and network are removed at the end (KEEP_IMAGE=1 keeps the image).
set -eu

wheels=$(cd "${1:-/var/cache/dockermpi/wheelhouse}" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../../../../.." && pwd)
image=impicap-capture:throwaway
ctx=$(mktemp -d)
out=$(mktemp -d)
jobs=$(mktemp -d)
net=impicap-net
cleanup() {
  docker rm -f impicap-local impicap-launcher impicap-worker >/dev/null 2>&1 || true
  docker network rm "$net" >/dev/null 2>&1 || true
  [ -n "${KEEP_IMAGE:-}" ] || docker rmi -f "$image" >/dev/null 2>&1 || true
  rm -rf "$ctx" "$out" "$jobs"
}
trap cleanup EXIT

mkdir "$ctx/wheelhouse"
cp "$wheels"/impi_rt-2021.18.1-*.whl "$wheels"/mpi4py-4.1.2-*.whl "$ctx/wheelhouse/"
cat >"$ctx/Dockerfile" <<'EOF'
FROM dockermpi/debian:bookworm
RUN apt-get update && apt-get install -y --no-install-recommends \
      python3 python3-venv openssh-client openssh-server iproute2 \
 && apt-get clean && rm -rf /var/lib/apt/lists/*
COPY wheelhouse /tmp/wheelhouse
RUN python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir --no-index --find-links /tmp/wheelhouse \
      impi-rt==2021.18.1 mpi4py==4.1.2 \
 && rm -rf /tmp/wheelhouse
# DockerMPI mounts its ssh client here (dmpi.contract.AGENT_SSH).
RUN mkdir -p /usr/lib/dockermpi/agent/bin /run/sshd \
 && ln -s /usr/bin/ssh /usr/lib/dockermpi/agent/bin/ssh
ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
EOF
docker build -q -t "$image" "$ctx" >/dev/null

# ----------------------------------------------------------- per-job files (host side)
chmod 0755 "$jobs"
PYTHONPATH="$repo/_utils" "$repo/.venv/bin/python" - "$jobs" <<'EOF'
import os, sys, time
from dmpi.launch import files, intelmpi, ssh

jobs = sys.argv[1]
launcher, worker = "10.231.9.11", "10.231.9.12"
addresses = {"L": launcher, "W": worker}
cas = {node: ssh.generate_ed25519_keypair("ca") for node in addresses}
now = int(time.time())
for node in ("local", *addresses):
    run = os.path.join(jobs, node)
    os.makedirs(run)
    content = {"passwd": files.passwd_text("mpiuser", 1000, 1000, home="/tmp"),
               "group": files.group_text("mpiuser", 1000)}
    if node != "local":
        content.update(ssh.job_keys(cas[node][0], "impicap", node, addresses,
                                    {n: cas[n][1] for n in addresses}, "L", 20022,
                                    now - 60, now + 3600))
        content["sshd_config"] = ssh.sshd_config_text(20022, "mpiuser")
        # 1 + 3 slots: Intel's -f would spread 4 ranks 2 + 2, -machinefile fills 1 + 3.
        content["hostfile"] = intelmpi.hostfile_text([(launcher, 1), (worker, 3)])
    for name, text in content.items():
        path = os.path.join(run, name)
        with open(path, "w") as f:
            f.write(text)
        os.chown(path, 1000, 1000)
        os.chmod(path, 0o600 if name in (ssh.USER_KEY, ssh.HOST_KEY) else 0o644)
EOF

# ------------------------------------------------------------------ one container, local
chmod 0777 "$out"
docker run --rm -i --name impicap-local --user 1000:1000 -e HOME=/tmp --cap-drop ALL \
  --security-opt no-new-privileges --init --shm-size 256m \
  -v "$jobs/local/passwd:/etc/passwd:ro" -v "$jobs/local/group:/etc/group:ro" \
  -v "$repo/_utils:/src:ro" -v "$out:/out" -e PYTHONPATH=/src \
  "$image" /usr/bin/python3 - <<'EOF'
import ipaddress, os, shlex, subprocess, time
from dmpi.launch import flavours, intelmpi

address = subprocess.run(["hostname", "-i"], capture_output=True, text=True).stdout.split()[0]
cidr = next(line.split()[3] for line in subprocess.run(
    ["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True).stdout.splitlines()
    if line.split()[3].startswith(address + "/"))
cidr = str(ipaddress.ip_network(cidr, strict=False))
MPIRUN = "/opt/venv/bin/mpirun"
env = dict(os.environ, DMPI_CAPTURE="forwarded",
           **intelmpi.launcher_environment("20100-20199", 20022))

def py(code):
    return ["/opt/venv/bin/python3", "-c", "from mpi4py import MPI\n"
            "import os, signal, subprocess, sys, time\n"
            "rank = MPI.COMM_WORLD.Get_rank()\n" + code]

HELLO = py(
    "total = MPI.COMM_WORLD.allreduce(rank)\n"
    "buf = MPI.COMM_WORLD.bcast(b'x' * 4000000 if rank == 0 else None)\n"
    "assert len(buf) == 4000000\n"
    "print('rank', rank, 'of', MPI.COMM_WORLD.Get_size(), 'sum', total,"
    " 'PMI_RANK', os.environ.get('PMI_RANK'),"
    " 'MPI_LOCALNRANKS', os.environ.get('MPI_LOCALNRANKS'),"
    " 'var', os.environ.get('DMPI_CAPTURE'),"
    " 'extra_args', 'inherited' if os.environ.get('I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS')"
    " else '-', flush=True)\n"
    "MPI.COMM_WORLD.Barrier()\n"
    # Which TCP ports the job listens on while every rank is inside MPI.
    "if rank == 0:\n"
    "    for line in subprocess.run(['ss', '-ltnH'], capture_output=True, text=True)"
    ".stdout.splitlines(): print('listen', line, flush=True)\n"
    "MPI.COMM_WORLD.Barrier()\n")

CASES = [
    # name, np, rank program argv (the program script execs it), launcher
    ("hello", 4, HELLO, MPIRUN),
    ("hello_path", 4, py("print('rank', rank, flush=True)\n"), "mpirun"),
    ("exit3", 4, py("if rank == 1: os._exit(3)\ntime.sleep(30)\n"), MPIRUN),
    ("sigkill", 4, py("if rank == 2: os.kill(os.getpid(), signal.SIGKILL)\ntime.sleep(30)\n"), MPIRUN),
    ("segv", 4, py("if rank == 1: os.kill(os.getpid(), signal.SIGSEGV)\ntime.sleep(30)\n"), MPIRUN),
    ("abort", 4, py("if rank == 3: MPI.COMM_WORLD.Abort(7)\ntime.sleep(30)\n"), MPIRUN),
    # The program script runs, the program it execs does not exist: sh exits 127.
    ("notfound", 4, ["/no/such/program"], MPIRUN),
    # The program script itself is missing: /bin/sh exits 2 in every rank.
    ("noscript", 4, None, MPIRUN),
]

with open("/out/results.tsv", "w") as results:
    for name, np, program, launcher in CASES:
        run_dir = f"/tmp/cases/{name}"
        os.makedirs(run_dir)
        with open(f"{run_dir}/hostfile", "w") as f:
            f.write(intelmpi.hostfile_text([(address, 4)]))
        if program is not None:
            with open(f"{run_dir}/program", "w") as f:
                f.write("exec " + " ".join(shlex.quote(a) for a in program) + "\n")
        argv = flavours.launcher_argv(
            intelmpi, f"/out/{name}.stdout", f"/out/{name}.stderr", np, cidr, "20100-20199",
            (20200, 20999), 20022, "/tmp", env_names=["DMPI_CAPTURE"], run_dir=run_dir,
            launcher=launcher)
        started = time.monotonic()
        try:
            rc = subprocess.run(argv, env=env, timeout=120).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
            subprocess.run(["pkill", "-KILL", "-u", "1000", "-x", "mpiexec.hydra"])
        results.write(f"{name}\t{rc}\t{time.monotonic() - started:.0f}\n")
        print(name, rc, flush=True)
EOF

# ------------------------------------------------------------------ two containers, ssh
docker network create --subnet 10.231.9.0/24 "$net" >/dev/null
common="--user 1000:1000 -e HOME=/tmp --cap-drop ALL --security-opt no-new-privileges --init
  --shm-size 256m --network $net -v $out:/out"
PYTHONPATH="$repo/_utils" "$repo/.venv/bin/python" -c '
from dmpi.launch import flavours, intelmpi
for name, value in flavours.launcher_environment(intelmpi, "20100-20199", 20022).items():
    print(f"{name}={value}")' >"$jobs/launcher.env"
start_worker() {
  docker rm -f impicap-worker >/dev/null 2>&1 || true
  docker run -d --name impicap-worker --hostname impicap-node --ip 10.231.9.12 $common \
    -v "$jobs/W:/run/dockermpi:ro" -v "$jobs/W/passwd:/etc/passwd:ro" \
    -v "$jobs/W/group:/etc/group:ro" \
    "$image" /usr/sbin/sshd -D -e -f /run/dockermpi/sshd_config >/dev/null
}
# Wait (up to 60 s) until all four ranks printed "ready" in CASE.stdout.
wait_ready() {
  i=0
  while [ $i -lt 120 ]; do
    n=$(grep -c ' ready$' "$out/$1.stdout" 2>/dev/null) || n=0
    [ "$n" -lt 4 ] || break
    sleep 0.5; i=$((i + 1))
  done
}
# ssh_case NAME PYTHON-CODE [ACTION]: the launcher runs the job; ACTION runs on the host
# once every rank said "ready" (to kill or cut off the worker); then the launcher is
# given 60 s to end.
ssh_case() {
  start_worker
  # The rank's code arrives in DMPI_CAPTURE_CODE, forwarded to every rank with -genvlist.
  # The venv's python by path: ranks started over ssh do not get the image's ENV PATH
  # (each rank's PATH goes to stdout, to show it).
  printf '%s\n' 'echo "rank $PMI_RANK PATH=$PATH"' \
    'exec /opt/venv/bin/python3 -c "$DMPI_CAPTURE_CODE"' >"$jobs/L/program"
  cp "$jobs/L/program" "$jobs/W/program"
  chown 1000:1000 "$jobs/L/program" "$jobs/W/program"
  sleep 1
  argv=$(PYTHONPATH="$repo/_utils" "$repo/.venv/bin/python" -c '
import json, sys
from dmpi.launch import flavours, intelmpi
argv = flavours.launcher_argv(
    intelmpi, "/out/%s.stdout" % sys.argv[1], "/out/%s.stderr" % sys.argv[1], 4,
    "10.231.9.0/24", "20100-20199", (20200, 20999), 20022, "/tmp",
    env_names=["DMPI_CAPTURE_CODE"], launcher="/opt/venv/bin/mpirun")
if sys.argv[1] == "ssh_noiface":
    assert argv[2] == intelmpi.LAUNCHER_PRELUDE + flavours.LAUNCHER_SCRIPT
    argv[2] = flavours.LAUNCHER_SCRIPT
print(json.dumps(argv))' "$1")
  started=$(date +%s)
  docker run -d --name impicap-launcher --hostname impicap-node --ip 10.231.9.11 $common \
    -v "$jobs/L:/run/dockermpi:ro" -v "$jobs/L/passwd:/etc/passwd:ro" \
    -v "$jobs/L/group:/etc/group:ro" --env-file "$jobs/launcher.env" \
    -e DMPI_CAPTURE_CODE="from mpi4py import MPI
import os, signal, socket, subprocess, sys, time
rank = MPI.COMM_WORLD.Get_rank()
$2" --entrypoint /usr/bin/python3 "$image" -c \
    'import json, os, sys; argv = json.loads(sys.argv[1]); os.execv(argv[0], argv)' \
    "$argv" >/dev/null
  if [ -n "${3:-}" ]; then
    wait_ready "$1"
    acted=$(date +%s)
    eval "$3"
  fi
  if rc=$(timeout 60 docker wait impicap-launcher); then :; else
    rc=timeout
    docker kill impicap-launcher >/dev/null 2>&1 || true
  fi
  ended=$(date +%s)
  printf '%s\t%s\t%s\n' "$1" "$rc" "$((ended - started))" >>"$out/results.tsv"
  if [ -n "${3:-}" ]; then
    printf '%s\t%s\n' "$1" "$((ended - acted))" >>"$out/after_action.tsv"
  fi
  echo "$1 $rc"
  docker rm -f impicap-launcher >/dev/null
}
HELLO="buf = MPI.COMM_WORLD.allgather(bytes(4000000))
assert len(buf) == 4 and all(len(b) == 4000000 for b in buf)
here = socket.gethostbyname(socket.gethostname())
print('rank', rank, 'on', here, 'PMI_RANK', os.environ.get('PMI_RANK'),
      'MPI_LOCALNRANKS', os.environ.get('MPI_LOCALNRANKS'),
      'var', bool(os.environ.get('DMPI_CAPTURE_CODE')), flush=True)
MPI.COMM_WORLD.Barrier()
if os.environ.get('MPI_LOCALRANKID') == '0':
    for line in subprocess.run(['ss', '-ltnH'], capture_output=True, text=True).stdout.splitlines():
        print('rank', rank, 'on', here, 'listen', line, flush=True)
MPI.COMM_WORLD.Barrier()"
ssh_case ssh_hello "$HELLO"
ssh_case ssh_noiface "$HELLO"
ssh_case ssh_exit3 "if rank == 3: os._exit(3)
time.sleep(30)"
ssh_case ssh_segv "if rank == 2: os.kill(os.getpid(), signal.SIGSEGV)
time.sleep(30)"
ssh_case ssh_abort "if rank == 3: MPI.COMM_WORLD.Abort(7)
time.sleep(30)"
ssh_case ssh_lostnode "MPI.COMM_WORLD.Barrier()
print('rank', rank, 'ready', flush=True)
time.sleep(60)" "docker kill impicap-worker >/dev/null"
ssh_case ssh_partition "MPI.COMM_WORLD.Barrier()
print('rank', rank, 'ready', flush=True)
time.sleep(120)" "docker network disconnect -f $net impicap-worker"

for f in "$out"/*; do cp "$f" "$here/"; done
