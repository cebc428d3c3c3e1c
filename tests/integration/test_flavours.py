"""Every MPI flavour DockerMPI launches, on the real cluster, in a site's own image with
no ssh server: an older Debian's Open MPI 4, Open MPI 5 (PRRTE) from PyPI, Debian's
MPICH, MPICH from PyPI (the second notebook image) and Intel MPI from PyPI. For each: mpi4py's allreduce over
three nodes, a failing rank named from that MPI's own messages, a partition that ends
the job, and another user's job of the same flavour that reaches nothing of it (with
test_tenants' check after each test that the victim's files are untouched and nothing
of any job is left on any node). Debian's MPICH keeps its jobs to one node (its
MPI_Finalize can hang between nodes): there, a 2-node job is refused with the reason,
and the allreduce and the failing ranks run on one node.

The job image of the other tests (Debian 12's Open MPI 4) is covered there.
"""

import json
import time

import pytest
import yaml

from tests.integration.test_lifecycle import run, submit, wait_clean, wait_for
from tests.integration.test_operations import IMAGES_PILLAR, _images
from tests.integration.test_tenants import (ATTACKER, VICTIM, victim,  # noqa: F401
                                            victim_unharmed_and_nothing_left)

pytestmark = pytest.mark.cluster

#: Approved image name: what the probe must find (flavour, version, launcher, glibc).
#: notebook-mpich is approved when the cluster is built; the others by this module.
FLAVOURS = {
    "bullseye": ("openmpi4", "4.1.0", "/usr/bin/mpirun", "2.31"),
    "openmpi5": ("openmpi5", "5.0.11", "/opt/venv/bin/mpirun", "2.36"),
    "mpich": ("mpich", "4.0.2", "/usr/bin/mpirun", "2.36"),
    "notebook-mpich": ("mpich", "5.0.2", "/opt/venv/bin/mpirun", "2.36"),
    "intelmpi": ("intelmpi", "2021.18.1", "/opt/venv/bin/mpirun", "2.36"),
}

#: Images whose jobs keep to one node, and the start of the probe's reason: Debian 12's
#: MPICH (4.0.2, ch4:ucx) hangs in MPI_Finalize between nodes in a good share of runs.
ONE_NODE = {"mpich": "its MPICH 4.0.2 (ch4:ucx) can hang in MPI_Finalize"}
#: Images whose jobs span nodes.
SPANNING = [image for image in FLAVOURS if image not in ONE_NODE]

ALLREDUCE = ("import platform; from mpi4py import MPI; c = MPI.COMM_WORLD; "
             "print(f'rank {c.Get_rank()} of {c.Get_size()}: "
             "{c.allreduce(c.Get_rank() + 1)} glibc {platform.libc_ver()[1]}')")

# The other ranks wait outside MPI, so the MPI itself ends them. (Ranks waiting in a
# collective see the dead rank's connections close and abort in turn: Open MPI 5 then
# names the rank that aborted second, and MPICH's proxies fail before Hydra prints the
# ranks' exit statuses, so the job fails as "mpiexec exited with code 255".)
RANK_1_EXITS_3 = ("import os, time; from mpi4py import MPI; c = MPI.COMM_WORLD; "
                  "os._exit(3) if c.Get_rank() == 1 else time.sleep(60)")
# Hydra (MPICH) ends a job when a rank is killed by a signal, or calls MPI_Abort; a rank
# that exits non-zero is turned into a signal by DockerMPI's script of each rank.
RANK_1_ABORTS_3 = ("import time; from mpi4py import MPI; c = MPI.COMM_WORLD; "
                   "c.Abort(3) if c.Get_rank() == 1 else time.sleep(60)")
RANK_1_SEGFAULTS = ("import os, signal, time; from mpi4py import MPI; c = MPI.COMM_WORLD; "
                    "os.kill(os.getpid(), signal.SIGSEGV) if c.Get_rank() == 1 "
                    "else time.sleep(60)")


def _ranks_output(cluster, job_id):
    """The lines the job's ranks printed: its standard output but for the wait statuses
    of the ranks that MPICH's mpiexec adds at its end (lines "[mpiexec@<host>] Exit
    codes: [<node>] 0,0" and "[<node>] 0,0")."""
    _, out = run(cluster, "mpi.logs", job_id=job_id)
    return [line for line in out.splitlines() if not line.startswith("[")]


@pytest.fixture(scope="module")
def flavour_images(cluster):
    """The flavours' test images pushed to the cluster's registry, approved, and probed by
    one node's highstate (the others pull them when a job needs them); on the way out
    the approval is withdrawn and highstate removes them from every node."""
    from tests.cluster import testimages
    from tests.cluster.testcluster import REGISTRY, REGISTRY_HOST_PORT

    built = testimages.flavours(cluster)
    pushed = {name: cluster.push_image(tag, f"127.0.0.1:{REGISTRY_HOST_PORT}", REGISTRY)
              for name, tag in built.items()}
    original = cluster.read("master", ["cat", IMAGES_PILLAR])
    approved = yaml.safe_load(original) or {}
    approved["mpi"]["images"].update(pushed)
    try:
        cluster.put_file("master", IMAGES_PILLAR, yaml.safe_dump(approved).encode())
        cluster.salt(["salt", "*", "saltutil.refresh_pillar", "--timeout=30"])
        cluster._highstate(["node1"])
        deadline = time.monotonic() + 60
        while not all(_images(cluster)[name]["probed_on"] for name in FLAVOURS):
            assert time.monotonic() < deadline, "the master never learnt the probe's facts"
            time.sleep(1)
        yield _images(cluster)
    finally:
        cluster.put_file("master", IMAGES_PILLAR, original.encode())
        cluster.salt(["salt", "*", "saltutil.refresh_pillar", "--timeout=30"])
        cluster._highstate(cluster.nodes)


def _shape(image):
    """(ranks, nodes, slots per node) of the jobs of ``image`` here: a rank on each of 3
    nodes, or 2 ranks on one node for an image whose jobs keep to one node."""
    return (2, 1, 2) if image in ONE_NODE else (3, 3, 1)


def _submit_all(cluster, programs):
    """Submit a job (:func:`_shape`) of each image and each of ``programs(flavour)``; the
    queue runs them as slots free up. Returns {(image, program): job id}."""
    jobs = {}
    for image, facts in FLAVOURS.items():
        ranks, nodes, per_node = _shape(image)
        for program in programs(facts[0]):
            jobs[image, program] = submit(cluster, user="flavours", image=image, np=ranks,
                                          nodes=nodes, slots_per_node=per_node,
                                          cmd=["python3", "-c", program])
    return jobs


def test_the_probe_finds_each_images_mpi_and_allreduce_runs_over_its_nodes(
        cluster, flavour_images):
    for image, (flavour, version, launcher, glibc) in FLAVOURS.items():
        found = flavour_images[image]
        assert found["runs_jobs"] is True and found["sshd"] is None, found
        assert (found["flavour"], found["mpi_version"], found["launcher"],
                found["glibc"]) == (flavour, version, launcher, glibc), found
        assert (found["why_one_node_only"] or "").startswith(ONE_NODE.get(image, "")), found
        assert (found["why_one_node_only"] is None) is (image not in ONE_NODE), found
    for image, reason in ONE_NODE.items():
        code, refused = run(cluster, "mpi.submit", user="flavours", image=image, np=2,
                            nodes=2, cmd=["true"])
        assert code != 0 and refused["error"].startswith(
            f"image {image!r} runs jobs on one node only: {reason}"), refused
    for (image, _), job_id in _submit_all(cluster, lambda flavour: [ALLREDUCE]).items():
        glibc, (ranks, nodes, _) = FLAVOURS[image][3], _shape(image)
        job = wait_for(cluster, job_id, ("succeeded", "failed"), 240)
        assert job["state"] == "succeeded", (image, job)
        assert len(job["placement"]) == nodes, job
        printed = _ranks_output(cluster, job_id)
        total = sum(range(1, ranks + 1))
        assert sorted(printed) == [f"rank {r} of {ranks}: {total} glibc {glibc}"
                                   for r in range(ranks)], (image, printed)


#: A failing rank's program: what the job's record must say of it.
FAILURES = {
    RANK_1_EXITS_3: ({"rank": 1, "exit_code": 3}, "rank 1 exited with code 3"),
    RANK_1_ABORTS_3: ({"rank": 1, "exit_code": 3}, "rank 1 exited with code 3"),
    RANK_1_SEGFAULTS: ({"rank": 1, "signal": 11, "signal_name": "SIGSEGV"},
                       "rank 1 died of SIGSEGV"),
}


def test_a_failing_rank_is_named_from_each_flavours_own_messages(cluster, flavour_images):
    def programs(flavour):
        return [RANK_1_EXITS_3, RANK_1_SEGFAULTS] + (
            [RANK_1_ABORTS_3] if flavour in ("mpich", "intelmpi") else [])

    for (image, program), job_id in _submit_all(cluster, programs).items():
        job = wait_for(cluster, job_id, ("succeeded", "failed"), 240)
        assert job["state"] == "failed", (image, job)
        if program == RANK_1_ABORTS_3 and job["failure"] is None:
            # Hydra may end the job before the aborting rank's message reaches it: the
            # code is still MPI_Abort's, the rank unnamed.
            assert job["reason"] == "mpirun exited with code 3", (image, job)
        else:
            assert (job["failure"], job["reason"]) == FAILURES[program], (image, job)
        # Ended by the MPI when the rank died, not by the walltime.
        assert job["timings"]["mpirun"] < 30, (image, job["timings"])


@pytest.mark.parametrize("image", SPANNING)
def test_a_partition_ends_the_job_within_15s_and_nothing_is_orphaned(
        cluster, flavour_images, image):
    job_id = submit(cluster, user="flavours", image=image, np=2, slots_per_node=1,
                    nodes="node1,node2", cmd=["sleep", "300"])
    job = wait_for(cluster, job_id, ("running",), 180)
    heal = cluster.cut([cluster.host_address("node2"), job["job_addresses"]["node2"]],
                       [cluster.host_address("node1"), job["job_addresses"]["node1"]])
    try:
        cut = time.time()
        job = wait_for(cluster, job_id, ("failed",), 30)
        assert job["ended"] - cut < 15, f"failed {job['ended'] - cut:.1f}s after the cut"
        assert "cannot reach" in job["reason"], job["reason"]
        assert wait_clean(cluster, job_id, ["node1"], 10) < 10
    finally:
        heal()
    wait_clean(cluster, job_id, ["node2"], 30)


#: A's program: reach A's own sshds (so a silent scan proves something), then every
#: port of B's job addresses (argv[1]) a job of any flavour listens on, and port 22.
SCAN = """
import json, os, selectors, socket, sys, time
def reachable(targets):
    found = []
    for batch in range(0, len(targets), 250):
        sel = selectors.DefaultSelector()
        for target in targets[batch:batch + 250]:
            c = socket.socket(); c.setblocking(False); c.connect_ex(target)
            sel.register(c, selectors.EVENT_WRITE, target)
        deadline = time.monotonic() + 1
        while sel.get_map() and (left := deadline - time.monotonic()) > 0:
            for key, _ in sel.select(left):
                if key.fileobj.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                    found.append(list(key.data))
                sel.unregister(key.fileobj); key.fileobj.close()
        for key in list(sel.get_map().values()): key.fileobj.close()
    return found
own = reachable([(a, 20000) for a in os.environ['DMPI_ADDRESSES'].split(',')])
theirs = sys.argv[1].split(',')
found = reachable([(a, p) for a in theirs for p in [22, *range(20000, 21000)]])
print(json.dumps({'own': own, 'found': found}), flush=True)
"""

#: B's program: MPI up in every rank (its launcher's and ranks' ports open) until the
#: test lets it go on, then an allreduce.
HELD_ALLREDUCE = (
    "import os, sys, time; from mpi4py import MPI; c = MPI.COMM_WORLD\n"
    "while not os.path.exists(sys.argv[1]): time.sleep(0.2)\n"
    "print(f'rank {c.Get_rank()}: {c.allreduce(c.Get_rank() + 1)}', flush=True)\n"
)


@pytest.mark.parametrize("image", SPANNING)
def test_another_users_job_of_the_same_flavour_reaches_nothing_of_a_job(
        cluster, flavour_images, victim, image):
    # Under mpi-jobs/, where B's jobs write: the rest of B's directory must not change.
    tag = f"mpi-jobs/go-{image}-{int(time.time() * 1000)}"
    b_job = submit(cluster, user=VICTIM, image=image, np=2, nodes="node1,node2",
                   slots_per_node=1, cmd=["python3", "-c", HELD_ALLREDUCE, f"/data/{tag}"])
    b = wait_for(cluster, b_job, ("running",), 180)
    a_job = submit(cluster, user=ATTACKER, image=image, np=2, nodes="node1,node2",
                   slots_per_node=1,
                   cmd=["python3", "-c", SCAN, ",".join(b["job_addresses"].values())])
    a = wait_for(cluster, a_job, ("succeeded", "failed"), 180)
    assert a["state"] == "succeeded", a
    results = [json.loads(line) for line in _ranks_output(cluster, a_job)]
    assert len(results) == 2 and all(len(r["own"]) == 2 for r in results), \
        f"the scan reaches nothing: {results}"
    assert all(r["found"] == [] for r in results), f"A reached B's job: {results}"
    cluster.as_user(VICTIM, ["touch", f"/srv/dockermpi/users/{VICTIM}/{tag}"])
    b = wait_for(cluster, b_job, ("succeeded", "failed"), 60)
    assert b["state"] == "succeeded", b
    assert sorted(_ranks_output(cluster, b_job)) == ["rank 0: 3", "rank 1: 3"]
