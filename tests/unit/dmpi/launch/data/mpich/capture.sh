#!/bin/sh
# Capture real MPICH (Hydra) output for tests/unit/dmpi/launch/test_mpich.py.
#
# Usage: capture.sh            (needs docker and the image dockermpi/debian:bookworm)
#
# Builds a throw-away image FROM dockermpi/debian:bookworm with Debian 12's mpich 4.0.2
# (ch4:ucx) and a small C program, mpicase, whose first argument says how rank N fails.
# Then runs ONE container as uid 1000 (HOME=/tmp, no capabilities, like a job
# container) with the environment of dmpi.launch.mpich.launcher_environment, in which
# every case runs the argv of dmpi.launch.flavours.launcher_argv (the module is
# bind-mounted read-only from this checkout) with a hostfile of the container's own
# address, 4 slots: Hydra forks the proxy of its own address, so no ssh is made, but
# every option and setting is parsed and applied. Each case writes CASE.stdout and
# CASE.stderr here and a line "CASE<TAB>exit code<TAB>seconds" to results.tsv.
#
# No ssh case: every rank is on the one container (see test_mpich.py for what that
# leaves unchecked). The image is removed at the end (KEEP_IMAGE=1 keeps it).
set -eu

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../../../../.." && pwd)
image=mpichcap:throwaway
ctx=$(mktemp -d)
out=$(mktemp -d)
cleanup() {
  docker rm -f mpichcap-local >/dev/null 2>&1 || true
  [ -n "${KEEP_IMAGE:-}" ] || docker rmi -f "$image" >/dev/null 2>&1 || true
  rm -rf "$ctx" "$out"
}
trap cleanup EXIT

cat >"$ctx/mpicase.c" <<'C'
/* mpicase CASE [SECONDS]: every rank initialises MPI; rank 1, 2 or 3 then fails as CASE
   says, the others sleep SECONDS (default 30) and finalise. */
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
int main(int argc, char **argv) {
    const char *what = argc > 1 ? argv[1] : "hello";
    int rank, size, total = 0;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (!strcmp(what, "hello")) {
        char host[256] = "";
        gethostname(host, sizeof host);
        MPI_Allreduce(&rank, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        printf("rank %d of %d on %s sum %d var %s extra_args %s\n", rank, size, host,
               total, getenv("DMPI_CAPTURE") ? getenv("DMPI_CAPTURE") : "-",
               getenv("HYDRA_LAUNCHER_EXTRA_ARGS") ? "inherited" : "-");
        fflush(stdout);
        MPI_Barrier(MPI_COMM_WORLD);
        if (rank == 0 && argc > 2) system(argv[2]);
        MPI_Barrier(MPI_COMM_WORLD);
        MPI_Finalize();
        return 0;
    }
    if (!strcmp(what, "exit3") && rank == 1) exit(3);
    if (!strcmp(what, "sigkill") && rank == 2) raise(SIGKILL);
    if (!strcmp(what, "segv") && rank == 1) { volatile int *p = NULL; *p = 1; }
    if (!strcmp(what, "abort") && rank == 3) MPI_Abort(MPI_COMM_WORLD, 7);
    if (!strcmp(what, "barrier")) MPI_Barrier(MPI_COMM_WORLD);
    sleep(argc > 2 ? atoi(argv[2]) : 30);
    MPI_Finalize();
    return 0;
}
C
cat >"$ctx/Dockerfile" <<'D'
FROM dockermpi/debian:bookworm
RUN apt-get update && apt-get install -y --no-install-recommends \
      mpich gcc libc6-dev libmpich-dev python3 openssh-client openssh-server iproute2 ucx-utils \
 && apt-get clean && rm -rf /var/lib/apt/lists/*
COPY mpicase.c /tmp/mpicase.c
RUN mpicc -O0 -o /usr/local/bin/mpicase /tmp/mpicase.c
# DockerMPI mounts its ssh client here (dmpi.contract.AGENT_SSH).
RUN mkdir -p /usr/lib/dockermpi/agent/bin /run/sshd \
 && ln -s /usr/bin/ssh /usr/lib/dockermpi/agent/bin/ssh
D
docker build -q -t "$image" "$ctx" >/dev/null

chmod 0777 "$out"
docker run --rm -i --name mpichcap-local --user 1000:1000 -e HOME=/tmp --cap-drop ALL \
  --security-opt no-new-privileges --init --shm-size 256m \
  -v "$repo/_utils:/src:ro" -v "$out:/out" -e PYTHONPATH=/src \
  "$image" /usr/bin/python3 - <<'PY'
import ipaddress, os, shlex, subprocess, time
from dmpi.launch import flavours, mpich

address = subprocess.run(["hostname", "-i"], capture_output=True, text=True).stdout.split()[0]
cidr = next(line.split()[3] for line in subprocess.run(
    ["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True).stdout.splitlines()
    if line.split()[3].startswith(address + "/"))
cidr = str(ipaddress.ip_network(cidr, strict=False))
env = dict(os.environ, DMPI_CAPTURE="forwarded",
           **mpich.launcher_environment("20100-20199", 20022))
# What the image's own configuration may say must not win over the argv.
with open("/tmp/.mpiexec.hydra.conf", "w") as f:
    f.write("-prepend-rank\n")

CASES = [
    # name, np, program argv (the program script execs it), launcher
    ("hello", 4, ["/usr/local/bin/mpicase", "hello", "ss -ltnH"], "/usr/bin/mpiexec"),
    ("hello_path", 4, ["/usr/local/bin/mpicase", "hello"], "mpiexec"),
    ("exit3", 4, ["/usr/local/bin/mpicase", "exit3"], "/usr/bin/mpiexec"),
    ("sigkill", 4, ["/usr/local/bin/mpicase", "sigkill"], "/usr/bin/mpiexec"),
    ("segv", 4, ["/usr/local/bin/mpicase", "segv"], "/usr/bin/mpiexec"),
    ("abort", 4, ["/usr/local/bin/mpicase", "abort"], "/usr/bin/mpiexec"),
    # The program script runs, the program it execs does not exist: sh exits 127.
    ("notfound", 4, ["/no/such/program"], "/usr/bin/mpiexec"),
    # More ranks than the hostfile's slots: Hydra wraps around.
    ("oversubscribed", 5, ["/usr/local/bin/mpicase", "hello"], "/usr/bin/mpiexec"),
    # The program script itself is missing: /bin/sh exits 127 in every rank.
    ("noscript", 4, None, "/usr/bin/mpiexec"),
]

with open("/out/results.tsv", "w") as results:
    for name, np, program, launcher in CASES:
        run_dir = f"/tmp/cases/{name}"
        os.makedirs(run_dir)
        with open(f"{run_dir}/hostfile", "w") as f:
            f.write(mpich.hostfile_text([(address, 4)]))
        if program is not None:
            with open(f"{run_dir}/program", "w") as f:
                f.write("exec " + " ".join(shlex.quote(a) for a in program) + "\n")
        argv = flavours.launcher_argv(
            mpich, f"/out/{name}.stdout", f"/out/{name}.stderr", np, cidr, "20100-20199",
            (20200, 20999), 20022, "/tmp", env_names=["DMPI_CAPTURE"], run_dir=run_dir,
            launcher=launcher)
        started = time.monotonic()
        try:
            rc = subprocess.run(argv, env=env, timeout=60).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
            subprocess.run(["pkill", "-KILL", "-u", "1000", "-x", "mpiexec"])
        results.write(f"{name}\t{rc}\t{time.monotonic() - started:.0f}\n")
        print(name, rc, flush=True)
    # mpiexec itself cannot find the executable (DockerMPI's argv always names /bin/sh;
    # this is what an image without it would give).
    argv = flavours.launcher_argv(
        mpich, "/out/notexec.stdout", "/out/notexec.stderr", 4, cidr, "20100-20199",
        (20200, 20999), 20022, "/tmp", run_dir="/tmp/cases/hello")[:-2] + ["/no/such/program"]
    results.write(f"notexec\t{subprocess.run(argv, env=env).returncode}\t0\n")
PY
for f in "$out"/*; do cp "$f" "$here/"; done
