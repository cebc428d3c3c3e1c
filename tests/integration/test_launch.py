"""salt-run mpi.launch on the real test cluster: real nodes, engines, sshd and Open MPI."""

import json
import threading
import uuid

import pytest

pytestmark = pytest.mark.cluster

# Rank programs, run with mpi4py inside the approved image.
HOSTNAMES = (
    "import socket; from mpi4py import MPI; r = MPI.COMM_WORLD.Get_rank(); "
    "open(f'rank-{r}.txt', 'w').write(socket.gethostname()); "
    "print(r, socket.gethostname(), flush=True)"
)
RANK1_EXITS_3 = (
    "import os; from mpi4py import MPI; c = MPI.COMM_WORLD; "
    "os._exit(3) if c.Get_rank() == 1 else c.Barrier()"
)
RANK2_SEGFAULTS = (
    "import os, signal, time; from mpi4py import MPI; "
    "os.kill(os.getpid(), signal.SIGSEGV) if MPI.COMM_WORLD.Get_rank() == 2 else time.sleep(120)"
)


@pytest.fixture(autouse=True)
def nothing_left_behind(cluster):
    """After every test, no job container or key may remain on any node."""
    yield
    assert cluster.no_leftovers() == {}


def launch(cluster, **kwargs):
    kwargs.setdefault("image", "mpi")
    return cluster.run_json("mpi.launch", **kwargs)


def test_job_spans_nodes_and_writes_into_the_users_directory(cluster):
    workdir = f"runs/{uuid.uuid4().hex[:8]}"
    code, job = launch(cluster, user="alice", np=4, slots_per_node=2, cmd=["python3", "-c", HOSTNAMES],
                       workdir=workdir)
    # workdir must exist: the first attempt fails cleanly, nothing left behind.
    assert job["state"] == "failed" and code != 0
    cluster.as_user("alice", ["mkdir", "-p", f"/srv/dockermpi/users/alice/{workdir}"])
    code, job = launch(cluster, user="alice", np=4, slots_per_node=2, cmd=["python3", "-c", HOSTNAMES],
                       workdir=workdir)
    assert code == 0, job
    assert job["state"] == "succeeded" and job["exit_code"] == 0
    assert job["placement"] == {cluster.nodes[0]: 2, cluster.nodes[1]: 2}
    lines = sorted(cluster.read_shared(job["output"]["stdout"]).split("\n"))[1:]
    assert [line.split()[0] for line in lines] == ["0", "1", "2", "3"]
    hosts = {line.split()[1] for line in lines}
    assert hosts == {cluster.nodes[0], cluster.nodes[1]}
    for rank in range(4):
        written = cluster.read_shared(f"/srv/dockermpi/users/alice/{workdir}/rank-{rank}.txt")
        assert written == (cluster.nodes[0] if rank < 2 else cluster.nodes[1])
    job = cluster.closed(job["job_id"])
    status = json.loads(cluster.read_shared(job["output"]["status"]))
    assert status["state"] == "succeeded" and status["job_id"] == job["job_id"]
    assert set(job["timings"]) >= {"queued", "containers_up", "sshd_ready", "mpirun", "cleanup", "total"}


def test_a_rank_exiting_non_zero_fails_the_job_naming_the_rank(cluster):
    code, job = launch(cluster, user="alice", np=4, cmd=["python3", "-c", RANK1_EXITS_3])
    assert code == 1
    assert job["state"] == "failed"
    assert job["failure"] == {"rank": 1, "exit_code": 3}
    assert job["reason"] == "rank 1 exited with code 3"
    assert job["timings"]["mpirun"] < 30  # ended by mpirun's abort, not by the walltime
    cluster.closed(job["job_id"])
    status = json.loads(cluster.read_shared(job["output"]["status"]))
    assert status["state"] == "failed" and status["failure"] == job["failure"]


def test_a_rank_dying_of_sigsegv_fails_the_job_naming_rank_and_signal(cluster):
    code, job = launch(cluster, user="alice", np=4, cmd=["python3", "-c", RANK2_SEGFAULTS])
    assert code == 1
    assert job["state"] == "failed"
    assert job["failure"] == {"rank": 2, "signal": 11, "signal_name": "SIGSEGV"}
    assert job["timings"]["mpirun"] < 30


def test_walltime_ends_the_job_as_timed_out(cluster):
    code, job = launch(cluster, user="alice", np=2, cmd="sleep 300", walltime="3s")
    assert code == 1
    assert job["state"] == "timed_out"
    assert "walltime" in job["reason"]
    assert job["timings"]["mpirun"] < 15


def test_two_jobs_at_once_on_the_same_nodes_do_not_collide(cluster):
    program = ["python3", "-c", "import time; from mpi4py import MPI; time.sleep(4); "
               "print(MPI.COMM_WORLD.Get_size())"]
    results = {}

    def run(user):
        results[user] = launch(cluster, user=user, np=3, nodes=3, cmd=program)

    threads = [threading.Thread(target=run, args=(u,)) for u in ("carol", "dave")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    jobs = [results[u][1] for u in ("carol", "dave")]
    assert [j["state"] for j in jobs] == ["succeeded", "succeeded"], jobs
    assert jobs[0]["placement"] == jobs[1]["placement"] == {n: 1 for n in cluster.nodes}
    # They really overlapped in time.
    assert jobs[0]["started"] < jobs[1]["ended"] and jobs[1]["started"] < jobs[0]["ended"]
    for job in jobs:
        assert cluster.read_shared(job["output"]["stdout"]).split() == ["3"] * 3


def test_environment_reaches_every_rank_and_quotes_stay_literal(cluster):
    program = "python3 -c 'import os, sys; print(os.environ[\"GREETING\"], sys.argv[1:])' " \
              "'$(touch /data/pwned)' 'a b'"
    code, job = launch(cluster, user="erin", np=2, cmd=program, env={"GREETING": "hello; world"})
    assert code == 0, job
    out = cluster.read_shared(job["output"]["stdout"]).splitlines()
    assert out == ["hello; world ['$(touch /data/pwned)', 'a b']"] * 2
    code, _ = cluster.exec(cluster.nodes[0], ["test", "-e", "/srv/dockermpi/users/erin/pwned"],
                           check=False)
    assert code != 0


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"user": "../bob"}, "not a valid user name"),
        ({"user": "bob/x"}, "not a valid user name"),
        ({"image": "not-approved"}, "is not approved"),
        ({"image": "10.251.1.2:5000/dockermpi/mpi:latest"}, "is not an image name"),
        ({"np": 0}, "np must be a positive"),
        ({"np": 99}, "can never run"),
        ({"nodes": 5}, "only 3 MPI nodes"),
        ({"nodes": "node1,node9"}, "not known as MPI nodes"),
        ({"slots_per_node": 5}, "exceeds the 2 slots"),
        ({"cmd": ""}, "cmd is empty"),
        ({"cmd": "--help"}, "must start with a program"),
        ({"cmd": "python3 'unterminated"}, "cannot be split"),
        ({"walltime": "soon"}, "is not a time"),
        ({"walltime": "0s"}, "longer than zero"),
        ({"walltime": "90"}, "has no unit"),
        ({"walltime": "400-00:00:00"}, "exceeds the site's limit"),
        ({"env": {"OMPI_MCA_plm": "isolated"}}, "is reserved"),
        ({"env": {"BAD-NAME": "1"}}, "is not valid"),
        ({"workdir": "../../etc"}, "leaves the user's data directory"),
    ],
)
def test_bad_input_is_rejected_with_its_reason_and_starts_nothing(cluster, arguments, message):
    request = {"user": "frank", "image": "mpi", "np": 2, "cmd": "hostname", **arguments}
    code, job = cluster.run_json("mpi.launch", **request)
    assert code == 1
    assert job["state"] == "rejected"
    assert message in job["error"]
    missing, _ = cluster.exec(cluster.nodes[0], ["test", "-e", "/srv/dockermpi/users/frank"],
                              check=False)
    assert missing != 0, "a rejected job must not create the user's directory"
    _, queued = cluster.run_json("mpi.list", user="frank")
    assert queued == [], "a rejected job must not be queued"
