"""Users are mutually untrusted: on the real cluster, user A ("mallory") runs hostile jobs
against user B ("victim"), and B's files, jobs and nodes come through unharmed.

Each test is one attack from inside A's own job (everything A's program can do: files in
A's directory, processes, the network) or through A's submit arguments. Each checks that
B is untouched, that A's job ends with a clear reason, that the node keeps reporting,
and (fixture) that nothing of any job is left on any node.
"""

import concurrent.futures
import json
import time
import uuid

import pytest
import yaml
from dmpi.contract import AGENT_DIR, AGENT_SSH, AGENT_SSHD
from dmpi.node.netns import TRACKED_FLOWS
from tests.cluster.testcluster import HUB_ADDR, MASTER_ADDR, STORAGE_ADDR, node_address

pytestmark = pytest.mark.cluster

ATTACKER, VICTIM = "mallory", "victim"
QUOTA_USER = "filler"  # pillar/testcluster.sls gives them a small quota
STORAGE = "/srv/dockermpi/users"
SECRET = f"{STORAGE}/{VICTIM}/secret.txt"
SECRET_TEXT = "victim's data, not to be touched\n"
SSHD_PORT = 20000  # the job's sshd port inside its own network namespace (pillar)
FINAL = ("succeeded", "failed", "cancelled", "timed_out")


# --------------------------------------------------------------------------- helpers


def run(cluster, fun, **kwargs):
    return cluster.run_json(fun, **kwargs)


def submit(cluster, user, cmd, **kwargs):
    kwargs.setdefault("image", "mpi")
    kwargs.setdefault("np", 1)
    code, job = run(cluster, "mpi.submit", user=user, cmd=cmd, **kwargs)
    assert code == 0 and job["state"] == "queued", job
    return job["job_id"]


def wait_for(cluster, job_id, states, timeout=60):
    deadline = time.monotonic() + timeout
    while True:
        _, job = run(cluster, "mpi.status", job_id=job_id)
        closed = job["state"] not in FINAL or job.get("closed")
        if job["state"] in states and closed:
            return job
        assert time.monotonic() < deadline, f"{job_id} still {job['state']} after {timeout}s"
        time.sleep(0.5)


def launch(cluster, user, cmd, **kwargs):
    kwargs.setdefault("image", "mpi")
    kwargs.setdefault("np", 1)
    return run(cluster, "mpi.launch", user=user, cmd=cmd, **kwargs)


def shell(script):
    """A job program: /bin/sh running script (the words stay data for mpirun)."""
    return ["/bin/sh", "-c", script]


def victim_files(cluster):
    """What B has on shared storage, as (path, owner, mode, size) rows, and B's secret
    (B's own jobs write only under mpi-jobs/, which is left out)."""
    listing = cluster.read(cluster.nodes[-1], [
        "find", f"{STORAGE}/{VICTIM}", "-maxdepth", "1", "!", "-name", "mpi-jobs",
        "-printf", "%p %u %m %s\n"])
    return sorted(listing.splitlines()), cluster.read_shared(SECRET)


def node_reports(cluster, node, timeout=60):
    """Whether the master hears from ``node`` after this call: waits for that report,
    bounded by ``timeout``, and says whether it came."""
    since = time.time()
    deadline = time.monotonic() + timeout
    while True:
        _, nodes = run(cluster, "mpi.nodes")
        ago = nodes[node]["last_report_seconds_ago"]
        if nodes[node]["reachable"] and ago is not None and time.time() - ago > since:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)


@pytest.fixture(scope="module")
def victim(cluster):
    """B's account, a file of B's, and a check that it never changes."""
    account = cluster.account(VICTIM)
    cluster.as_user(VICTIM, ["sh", "-c", f"printf %s \"$1\" > {SECRET}", "sh", SECRET_TEXT])
    cluster.account(ATTACKER)
    return account


@pytest.fixture(autouse=True)
def victim_unharmed_and_nothing_left(cluster, victim):
    before = victim_files(cluster)
    yield
    active, left = cluster.settle()
    assert left == {}
    assert victim_files(cluster) == before, "the victim's files changed"
    assert cluster.read_shared(SECRET) == SECRET_TEXT
    assert active == [], "the test left jobs queued or running"


# --------------------------------------------------------------------------- identity


def test_each_user_has_their_own_uid_and_a_directory_closed_to_others(cluster, victim):
    attacker = cluster.account(ATTACKER)
    assert attacker["uid"] != victim["uid"]
    assert cluster.account(VICTIM)["uid"] == victim["uid"], "a user's uid must be stable"
    for account in (attacker, victim):
        _, out = cluster.exec(cluster.nodes[0], ["stat", "-c", "%u %g %a", account["dir"]])
        assert out.split() == [str(account["uid"]), str(account["gid"]), "700"]
    # Even on the node, A's uid cannot read B's directory.
    code, _ = cluster.as_user(ATTACKER, ["cat", SECRET], check=False)
    assert code != 0


def test_a_job_runs_as_its_users_uid_and_sees_only_their_directory(cluster, victim):
    code, job = launch(cluster, ATTACKER, shell(
        f"id -u; id -g; ls /data/..; cat {SECRET} 2>&1; ls {STORAGE} 2>&1; true"))
    assert code == 0, job
    out = cluster.read_shared(job["output"]["stdout"]).splitlines()
    attacker = cluster.account(ATTACKER)
    assert out[:2] == [str(attacker["uid"]), str(attacker["gid"])]
    assert VICTIM not in "\n".join(out[2:]).replace(f"{STORAGE}/{VICTIM}", "")
    assert SECRET_TEXT.strip() not in "\n".join(out)


def test_privileges_of_running_job_containers(cluster, victim):
    job_id = submit(cluster, VICTIM, "sleep 300", np=4, nodes="node1,node2")
    job = wait_for(cluster, job_id, ("running",))
    for node in job["placement"]:
        _, names = cluster.exec(node, ["docker", "ps", "--filter", f"label=io.dockermpi.job={job_id}",
                                       "--format", "{{.Names}}"])
        for name in names.split():
            _, raw = cluster.exec(node, ["docker", "inspect", name])
            info = json.loads(raw)[0]
            host = info["HostConfig"]
            assert info["Config"]["User"] == f"{victim['uid']}:{victim['gid']}"
            assert host["CapDrop"] == ["ALL"] and not host["CapAdd"]
            assert "no-new-privileges" in host["SecurityOpt"]
            assert host["Privileged"] is False and host["ReadonlyRootfs"] is True
            assert host["Memory"] > 0 and host["PidsLimit"] > 0 and host["NanoCpus"] > 0
            assert host["Tmpfs"]["/tmp"].startswith("rw,nosuid,nodev,size=")
            sources = sorted(m["Source"] for m in info["Mounts"])
            keys = f"/var/lib/dockermpi/jobs/{job_id}"
            _, agent_build = cluster.exec(node, ["readlink", "-f", AGENT_DIR])
            assert sources == sorted([f"{STORAGE}/{VICTIM}", keys, f"{keys}/group",
                                      f"{keys}/passwd", agent_build.strip()])
            assert all(m["RW"] is False for m in info["Mounts"]
                       if m["Source"].startswith((keys, agent_build.strip())))
            _, status = cluster.exec(node, ["docker", "exec", name, "cat", "/proc/1/status"])
            fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
            assert fields["CapEff"].strip() == "0000000000000000"
            assert fields["NoNewPrivs"].strip() == "1"
            assert fields["Uid"].split()[0] == str(victim["uid"])
    run(cluster, "mpi.cancel", job_id=job_id)
    wait_for(cluster, job_id, ("cancelled",))


# --------------------------------------------------------------------- files the node touches


def test_symlinks_planted_in_a_job_directory_never_lead_the_node_elsewhere(cluster, victim):
    # Every name the node writes or reads in A's job directory points at B's file, and
    # A's own job directory path is replaced by a link into B's directory at the end.
    attack = (
        'd="$DMPI_JOB_DIR"; '
        f'for n in status.json status.json.tmp stdout.tmp; do ln -sf {SECRET} "$d/$n"; done; '
        f'ln -sf ../../../{VICTIM}/secret.txt "$d/stderr.link"; '
        'mkdir -p /data/elsewhere; mv "$d" /data/elsewhere/job; '
        f'ln -s {STORAGE}/{VICTIM} "$d"; exit 1'
    )
    code, job = launch(cluster, ATTACKER, shell(attack))
    assert code == 1
    assert job["state"] == "failed" and job["reason"]
    job = cluster.closed(job["job_id"])
    assert job["closed"] and "total" in job["timings"] and "cleanup" in job["timings"]
    assert all(node_reports(cluster, node) for node in cluster.nodes)


def test_a_link_in_place_of_the_job_directories_fails_the_start_and_leads_nowhere(cluster,
                                                                                  victim):
    # The launcher's node makes mpi-jobs/<job id> as the user's uid while the sshds come
    # up. A's mpi-jobs replaced beforehand by a link to a directory anyone may write on
    # the node (its /tmp) must fail A's start with the reason, and nothing may be made
    # there: the node never follows a link in a user's tree.
    home = f"{STORAGE}/{ATTACKER}"
    escape = "/tmp/dmpi-escape"
    cluster.exec("node1", ["sh", "-c", f"rm -rf {escape} && mkdir -m 1777 {escape}"])
    # Both swaps are made on node1: another host's change to the shared storage reaches
    # node1's FUSE lookup cache only after its timeout (a relaunch failed on the stale link).
    cluster.as_user(ATTACKER, ["sh", "-c", f"mkdir -p {home}/mpi-jobs && "
                               f"mv {home}/mpi-jobs {home}/mpi-jobs.real && "
                               f"ln -s {escape} {home}/mpi-jobs"], node="node1")
    try:
        code, job = launch(cluster, ATTACKER, "hostname", nodes="node1", walltime="60s")
        assert code == 1 and job["state"] == "failed", job
        assert job["reason"].startswith("could not start") and "mpi-jobs" in job["reason"], job
        assert [h["state"] for h in job["history"]] == ["queued", "starting", "failed"]
        _, made = cluster.exec("node1", ["find", escape, "-mindepth", "1"])
        assert made.strip() == ""
    finally:
        cluster.as_user(ATTACKER, ["sh", "-c", f"rm -f {home}/mpi-jobs && "
                                   f"mv {home}/mpi-jobs.real {home}/mpi-jobs"], node="node1")
        cluster.exec("node1", ["rm", "-rf", escape])
    code, job = launch(cluster, ATTACKER, "hostname", nodes="node1")
    assert code == 0 and job["state"] == "succeeded", job


def test_a_fifo_and_a_1100_link_chain_do_not_hang_or_silence_the_node(cluster, victim):
    attack = (
        'd="$DMPI_JOB_DIR"; mkfifo "$d/status.json.tmp" "$d/status.json"; '
        'rm -f "$d/stderr"; mkfifo "$d/stderr"; '
        'mv /data/mpi-jobs /data/mpi-jobs.real; '
        'i=0; while [ $i -lt 1100 ]; do ln -s "l$((i+1))" "/data/l$i"; i=$((i+1)); done; '
        'ln -s mpi-jobs.real /data/l1100; ln -s l0 /data/mpi-jobs; exit 1'
    )
    code, job = launch(cluster, ATTACKER, shell(attack), nodes="node1")
    assert code == 1 and job["state"] == "failed"
    job = cluster.closed(job["job_id"])
    assert job["timings"]["cleanup"] < 15, "the node's status writer hung"
    assert node_reports(cluster, "node1"), "node1 stopped reporting"
    # B's next job on the same node runs as usual.
    code, other = launch(cluster, VICTIM, "hostname", nodes="node1")
    assert code == 0 and other["state"] == "succeeded", other
    cluster.as_user(ATTACKER, ["sh", "-c", "rm -rf /srv/dockermpi/users/mallory/l* "
                               "/srv/dockermpi/users/mallory/mpi-jobs && mv "
                               "/srv/dockermpi/users/mallory/mpi-jobs.real "
                               "/srv/dockermpi/users/mallory/mpi-jobs"])


def test_job_output_cannot_make_the_report_raise(cluster, victim):
    # A rank number of 5000 digits in the place mpirun prints its verdict, then an exit.
    forged = ("mpirun noticed that process rank " + "9" * 5000 + " with PID 1 on node x "
              "exited on signal 11 (Segmentation fault).")
    code, job = launch(cluster, ATTACKER, shell(f'echo "{forged}" >&2; exit 3'), nodes="node1")
    assert code == 1 and job["state"] == "failed"
    assert node_reports(cluster, "node1"), "node1 stopped reporting"


# ------------------------------------------------------------------------------ network


def test_another_users_job_cannot_squat_ports_or_reach_a_jobs_endpoints(cluster, victim):
    # B's job holds a node pair; A's job on the same nodes binds every port DockerMPI
    # uses and scans the job address pool for anything that answers.
    b_job = submit(cluster, VICTIM, "sleep 300", np=1, nodes="node1")
    b = wait_for(cluster, b_job, ("running",))
    squat_and_scan = (
        "import socket, sys, json, os\n"
        "held = []\n"
        "for port in range(20000, 21000):\n"
        "    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        "    try:\n"
        "        s.bind(('0.0.0.0', port)); s.listen(); held.append(s)\n"
        "    except OSError:\n"
        "        pass\n"
        "mine = set(os.environ['DMPI_ADDRESSES'].split(','))\n"
        "import selectors, time\n"
        "found = []\n"
        "# A's own sshds first: they must answer, or the scan proves nothing.\n"
        "targets = [(address, 20000) for address in sorted(mine)] + [\n"
        "    (f'10.251.1.{last}', port) for port in (20000, 20100, 20101, 20300)\n"
        "    for last in range(129, 255) if f'10.251.1.{last}' not in mine]\n"
        "# Up to 125 at once, a second for each batch to answer.\n"
        "for batch in range(0, len(targets), 125):\n"
        "    sel = selectors.DefaultSelector()\n"
        "    for target in targets[batch:batch + 125]:\n"
        "        c = socket.socket(); c.setblocking(False); c.connect_ex(target)\n"
        "        sel.register(c, selectors.EVENT_WRITE, target)\n"
        "    deadline = time.monotonic() + 1\n"
        "    while sel.get_map() and (left := deadline - time.monotonic()) > 0:\n"
        "        for key, _ in sel.select(left):\n"
        "            if key.fileobj.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:\n"
        "                found.append(list(key.data))\n"
        "            sel.unregister(key.fileobj); key.fileobj.close()\n"
        "    for key in list(sel.get_map().values()): key.fileobj.close()\n"
        "own = [f for f in found if f[0] in mine]\n"
        "found = [f for f in found if f[0] not in mine]\n"
        "print(json.dumps({'held': len(held), 'found': found, 'own': own}), flush=True)\n"
        "time.sleep(120)\n"
    )
    a_job = submit(cluster, ATTACKER, ["python3", "-c", squat_and_scan], np=2,
                   nodes="node1,node2", slots_per_node=1)
    a = wait_for(cluster, a_job, ("running",))
    # Both ranks print one line when their scan is done, each in its own time.
    deadline = time.monotonic() + 60
    while len(cluster.read_shared(a["output"]["stdout"]).splitlines()) < 2:
        assert time.monotonic() < deadline, "the scans of both ranks did not finish"
        time.sleep(1)
    results = [json.loads(line) for line in cluster.read_shared(a["output"]["stdout"]).splitlines()]
    # A really holds the ports: all but its own sshd's and, beside the launcher, the
    # 200 out-of-band ports its own mpirun listens on.
    assert len(results) == 2 and all(r["held"] > 750 for r in results), results
    assert all(len(r["own"]) == 2 for r in results), f"the scan reaches nothing: {results}"
    assert all(r["found"] == [] for r in results), f"A reached another job: {results}"
    assert wait_for(cluster, b_job, ("running",))["state"] == "running"
    assert b["job_addresses"]["node1"] != a["job_addresses"]["node1"]
    # While A squats on node1, B starts another job there (in B's slot) and it runs.
    run(cluster, "mpi.cancel", job_id=b_job)
    wait_for(cluster, b_job, ("cancelled",))
    code, again = launch(cluster, VICTIM, "python3 -c 'from mpi4py import MPI; "
                         "print(MPI.COMM_WORLD.Get_size())'", np=1, nodes="node1")
    assert code == 0 and again["state"] == "succeeded", again
    assert wait_for(cluster, a_job, ("running",))["state"] == "running"
    run(cluster, "mpi.cancel", job_id=a_job)


def test_a_job_reaches_no_host_of_the_cluster_and_binds_no_privileged_port(cluster, victim):
    # Every service of the master and the hub a job could attack (Salt's publisher and
    # request server, DockerMPI's API, the registry, the hub's proxy and API), and on each node
    # host a listener standing in for whatever a site runs there (the test nodes listen
    # on no TCP port of their own). Each is shown open from a node host first, so a
    # refusal proves something.
    services = [(MASTER_ADDR, port) for port in (4505, 4506, 8001, 5000)]
    services += [(HUB_ADDR, port) for port in (8000, 8081)]
    listener = "dmpi-test-host-listener"
    pillar = cluster.read("master", ["cat", "/srv/pillar-local/testcluster_images.sls"])
    image = yaml.safe_load(pillar)["mpi"]["images"]["mpi"]
    for index, node in enumerate(cluster.nodes, start=1):
        cluster.exec(node, ["docker", "rm", "-f", listener], check=False)
        cluster.exec(node, ["docker", "run", "-d", "--name", listener, "--net=host",
                            "--user", "65534:65534", image, "python3",
                            "-m", "http.server", "--bind", node_address(index), "18999"])
        services.append((node_address(index), 18999))
    try:
        _job_reaches_no_host(cluster, services)
    finally:
        for node in cluster.nodes:
            cluster.exec(node, ["docker", "rm", "-f", listener], check=False)


def test_a_job_reaches_no_port_of_a_storage_server_over_tcp_or_udp(cluster, victim):
    # With NFS sec=sys the server trusts the uid a client sends: no job may speak to it
    # at all, neither rpcbind, nfsd nor mountd, over TCP or UDP.
    with cluster.storage_stand_in("master") as address:
        code, job = launch(cluster, ATTACKER, ["python3", "-c", cluster.STORAGE_PROBE, address,
                                               *map(str, cluster.STORAGE_PORTS)],
                           np=2, nodes="node1,node2", slots_per_node=1)
    assert code == 0, job
    lines = cluster.read_shared(job["output"]["stdout"]).splitlines()
    # Refused at once by the job's own firewall: a reset, and a datagram never sent.
    assert sorted(lines) == sorted(f"{port} ECONNREFUSED EPERM"
                                   for port in cluster.STORAGE_PORTS for _ in range(2)), lines


def test_a_job_reaches_no_port_of_the_glusterfs_server(cluster, victim):
    # GlusterFS trusts the uid a client sends, as NFS sec=sys does: the storage host's
    # glusterd and brick ports, open to the hosts, are refused to a job.
    ports = cluster.glusterfs_ports()
    code, job = launch(cluster, ATTACKER, ["python3", "-c", cluster.STORAGE_PROBE,
                                           STORAGE_ADDR, *map(str, ports)],
                       np=2, nodes="node1,node2", slots_per_node=1)
    assert code == 0, job
    lines = cluster.read_shared(job["output"]["stdout"]).splitlines()
    assert sorted(lines) == sorted(f"{port} ECONNREFUSED EPERM"
                                   for port in ports for _ in range(2)), lines


VOLUME = "dockermpi"  # pillar/testcluster.sls: mpi:storage:glusterfs:volume
#: What libgfapi logs when a brick refuses it (a client not bound to a privileged port).
BRICK_REFUSED = "client_dump_version_cbk] 0-dockermpi-client-0: received RPC status error"


def _glusterfs_client_on_host(cluster, host, kit, image, target, uid=None):
    """:data:`GLUSTERFS_CLIENT` (``kit``: the user's libraries, in their directory) run on
    ``host``'s own network in ``image``, as root or ``uid``, after ``target`` = (path in
    the volume, uid, gid) to claim: its output once it answers, or once a brick refused
    it (the client then keeps trying, and is stopped)."""
    home = cluster.account(ATTACKER)["dir"]
    name = f"dmpi-test-gfapi-{uuid.uuid4().hex[:8]}"
    user = ["--user", f"{uid}:{uid}"] if uid is not None else []
    cluster.exec(host, [
        "docker", "run", "-d", "--name", name, "--net=host", *user,
        "-e", f"LD_LIBRARY_PATH={kit}", "-v", f"{home}/{kit.rsplit('/', 1)[1]}:{kit}:ro",
        image, "python3", "-c", cluster.GLUSTERFS_CLIENT, STORAGE_ADDR, VOLUME,
        *map(str, target)])
    try:
        deadline = time.monotonic() + 120
        while True:
            _, output = cluster.exec(host, ["docker", "logs", name], check=False)
            if "{" in output or BRICK_REFUSED in output:
                return output
            assert time.monotonic() < deadline, f"the client neither answered nor was " \
                                                f"refused: {output}"
            time.sleep(0.5)
    finally:
        cluster.exec(host, ["docker", "rm", "-f", name], check=False)


def _answer(output):
    """The client's JSON answer in its output (its log lines around it), or None."""
    lines = [line for line in output.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else None


def test_a_userspace_glusterfs_client_reads_as_any_uid_from_a_hosts_root_only(cluster,
                                                                              victim):
    # GlusterFS believes the uid a client claims. A brings a working client (libgfapi,
    # its plugins) in A's directory: from a host's network as root it reads B's file,
    # which shows the client works and what is at stake; from a host as an unprivileged
    # uid (it cannot bind the privileged port the bricks require), from A's job on two
    # nodes and from A's notebook (test_hub), it gets nothing.
    kit = cluster.glusterfs_client_kit(ATTACKER)
    pillar = cluster.read("master", ["cat", "/srv/pillar-local/testcluster_images.sls"])
    image = yaml.safe_load(pillar)["mpi"]["images"]["mpi"]
    target = (f"/users/{VICTIM}/secret.txt", victim["uid"], victim["gid"])
    as_root = _answer(_glusterfs_client_on_host(cluster, "node1", kit, image, target))
    assert as_root["init"] == 0 and as_root.get("read") == SECRET_TEXT, as_root
    # glusterd hands anyone the volume's layout; its brick refuses the client.
    as_nobody = _glusterfs_client_on_host(cluster, "node1", kit, image, target, uid=65534)
    assert BRICK_REFUSED in as_nobody and _answer(as_nobody) is None, as_nobody
    code, job = launch(cluster, ATTACKER, ["env", f"LD_LIBRARY_PATH={kit}", "python3", "-c",
                                           cluster.GLUSTERFS_CLIENT, STORAGE_ADDR, VOLUME,
                                           *map(str, target)],
                       np=2, nodes="node1,node2", slots_per_node=1)
    assert code == 0, job
    results = [json.loads(line) for line in
               cluster.read_shared(job["output"]["stdout"]).splitlines()]
    # Refused at its first connection, to glusterd: nothing of the volume is learnt.
    assert results == [{"init": -1, "error": "Transport endpoint is not connected"}] * 2, \
        results


def _job_reaches_no_host(cluster, services):
    for address, port in services:
        deadline = time.monotonic() + 30  # a listener just started may not be up yet
        while cluster.exec("node1", ["timeout", "5", "bash", "-c",
                                     f"</dev/tcp/{address}/{port}"], check=False)[0] != 0:
            assert time.monotonic() < deadline, \
                f"{address}:{port} is not open from a node host: nothing to prove"
            time.sleep(0.5)
    probe = (
        "import errno, json, os, socket\n"
        "mine = sorted(set(os.environ['DMPI_ADDRESSES'].split(',')))\n"
        f"targets = [(a, {SSHD_PORT}) for a in mine] + {services!r}\n"
        "found = {}\n"
        "for address, port in targets:\n"
        "    try:\n"
        "        socket.create_connection((address, port), timeout=5).close()\n"
        "        found[f'{address}:{port}'] = 'open'\n"
        "    except OSError as exc:\n"
        "        found[f'{address}:{port}'] = errno.errorcode.get(exc.errno, str(exc))\n"
        "s = socket.socket()\n"
        "try:\n"
        "    s.bind(('0.0.0.0', 700)); bound = 'bound'\n"
        "except OSError as exc:\n"
        "    bound = errno.errorcode.get(exc.errno, str(exc))\n"
        "print(json.dumps({'found': found, 'port_700': bound}), flush=True)\n"
    )
    code, job = launch(cluster, ATTACKER, ["python3", "-c", probe], np=2,
                       nodes="node1,node2", slots_per_node=1)
    assert code == 0, job
    output = cluster.read_shared(job["output"]["stdout"])
    results = [json.loads(line) for line in output.splitlines()]
    assert len(results) == 2, results
    for result in results:
        own = {k: v for k, v in result["found"].items()
               if k.split(":")[0] in job["job_addresses"].values()}
        assert set(own.values()) == {"open"} and len(own) == 2, result  # the job's own sshds
        others = {k: v for k, v in result["found"].items() if k not in own}
        # Refused at once by the job's own firewall, not left to time out.
        assert set(others.values()) == {"ECONNREFUSED"}, result
        assert result["port_700"] == "EACCES", result


def test_a_job_opening_flows_as_fast_as_it_can_leaves_anothers_job_running(cluster, victim):
    # A floods from both its nodes: connections and datagrams to its own peer, to
    # Docker's resolver, to an address beyond the cluster and to the cluster's hosts.
    # Nothing of its ranks is tracked and what is tracked is capped, so its namespace's
    # connection-tracking table stays small, and B's job on the same two nodes runs.
    release = f"mpi-jobs/flows-{int(time.time() * 1000)}"
    flood = (
        "import json, os, random, socket, time\n"
        f"release = '/data/{release}'\n"
        "mine = os.environ['DMPI_ADDRESSES'].split(',')\n"
        "def tracked():\n"
        "    with open('/proc/sys/net/netfilter/nf_conntrack_count') as f:\n"
        "        return int(f.read())\n"
        "def port():\n"
        "    return random.randint(1024, 65000)\n"
        "targets = [('tcp', a) for a in mine] + [('udp', a) for a in mine] + [\n"
        f"    ('udp', '127.0.0.11'), ('tcp', '192.0.2.1'), ('udp', '192.0.2.1'),\n"
        f"    ('tcp', {MASTER_ADDR!r}), ('udp', {MASTER_ADDR!r})]\n"
        "attempts = refused = peak = 0\n"
        "held = []\n"
        "while not os.path.exists(release):\n"
        "    for kind, address in targets:\n"
        "        attempts += 1\n"
        "        if kind == 'tcp':\n"
        "            s = socket.socket(); s.setblocking(False)\n"
        "            code = s.connect_ex((address, port()))\n"
        "            refused += code not in (0, 115)\n"
        "            held.append(s)\n"
        "        else:\n"
        "            u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        "            try:\n"
        "                u.sendto(b'x', (address, 53 if address == '127.0.0.11' else port()))\n"
        "            except OSError:\n"
        "                refused += 1\n"
        "            u.close()\n"
        "    if len(held) > 400:\n"
        "        for s in held: s.close()\n"
        "        held = []\n"
        "    if attempts % 900 == 0:\n"
        "        peak = max(peak, tracked())\n"
        "        if attempts == 9000:\n"
        "            print('flooding', flush=True)\n"
        "print(json.dumps({'attempts': attempts, 'refused': refused, 'peak': peak}), flush=True)\n"
    )
    a_job = submit(cluster, ATTACKER, ["python3", "-c", flood], np=2, nodes="node1,node2",
                   slots_per_node=1, walltime="5m")
    a = wait_for(cluster, a_job, ("running",))
    deadline = time.monotonic() + 120
    while cluster.read_shared(a["output"]["stdout"]).count("flooding") < 2:
        assert time.monotonic() < deadline, "A's ranks did not start their flood"
        time.sleep(0.5)
    exchange = (
        "from mpi4py import MPI\n"
        "comm = MPI.COMM_WORLD\n"
        "data, got = bytearray([comm.rank]) * (1 << 20), bytearray(1 << 20)\n"
        "for _ in range(200):\n"
        "    comm.Sendrecv(data, dest=1 - comm.rank, recvbuf=got, source=1 - comm.rank)\n"
        "    assert got[-1] == 1 - comm.rank\n"
        "total = comm.allreduce(1)\n"
        "if comm.rank == 0:\n"
        "    print('exchanged', total, flush=True)\n"
    )
    code, b = launch(cluster, VICTIM, ["python3", "-c", exchange], np=2, nodes="node1,node2",
                     slots_per_node=1)
    assert code == 0 and b["state"] == "succeeded", b
    assert cluster.read_shared(b["output"]["stdout"]).strip() == "exchanged 2"
    assert wait_for(cluster, a_job, ("running",))["state"] == "running"
    cluster.as_user(ATTACKER, ["touch", f"{STORAGE}/{ATTACKER}/{release}"])
    a = wait_for(cluster, a_job, ("succeeded",), 120)
    results = [json.loads(line) for line in cluster.read_shared(a["output"]["stdout"])
               .splitlines() if line.startswith("{")]
    assert len(results) == 2, results
    for result in results:
        # A real flood, capped: beyond the cap A's new tracked flows are refused.
        assert result["attempts"] > 9000 and result["refused"] > 0, result
        assert result["peak"] <= 2 * TRACKED_FLOWS, result


def _spares(cluster, node):
    """The standby namespaces a node keeps ready: {name: its standby-network address}."""
    _, names = cluster.exec(node, ["docker", "ps", "-a", "--filter", "label=io.dockermpi.role=standby",
                                   "--format", "{{.Names}}"])
    found = {}
    for name in names.split():
        _, raw = cluster.exec(node, ["docker", "inspect", name])
        networks = json.loads(raw)[0]["NetworkSettings"]["Networks"]
        found[name] = {net: n["IPAddress"] for net, n in networks.items()}
    return found


def test_a_job_in_a_standby_namespace_has_only_its_own_address_and_leaves_none(cluster, victim):
    # A job's clean-up leaves the node its standby namespaces (2 in the test pillar).
    code, warm = launch(cluster, VICTIM, "hostname", nodes="node1")
    assert code == 0, warm
    wait_for(cluster, warm["job_id"], ("succeeded",))
    spares = _spares(cluster, "node1")
    assert len(spares) == 2 and all(list(n) == ["dmpi-standby"] for n in spares.values()), spares
    # A's job takes one; from inside it looks for any way to the standby network (where
    # the other spare, and B's next namespace, wait): an interface or a route.
    _, subnet = cluster.exec("node1", ["docker", "network", "inspect", "dmpi-standby", "--format",
                                       "{{range .IPAM.Config}}{{.Subnet}}{{end}}"])
    probe = "ip -o -4 addr show | awk '{print $2, $4}'; hostname; ip -4 route; sleep 120"
    a_job = submit(cluster, ATTACKER, shell(probe), nodes="node1")
    a = wait_for(cluster, a_job, ("running",))
    deadline = time.monotonic() + 30
    while "default" not in (out := cluster.read_shared(a["output"]["stdout"])):
        assert time.monotonic() < deadline, out
        time.sleep(0.5)
    lines = out.split("\n")
    addresses = {line.split()[1] for line in lines if line.count(" ") == 1 and "/" in line}
    assert addresses == {"127.0.0.1/8", f"{a['job_addresses']['node1']}/24"}, out
    assert "node1" in lines
    network = subnet.strip().split("/")[0].rsplit(".", 2)[0]  # e.g. 172.20
    assert network and network not in out, out
    taken = f"dmpi-{a_job}-netns"
    _, raw = cluster.exec("node1", ["docker", "inspect", taken])
    holder = json.loads(raw)[0]
    assert list(holder["NetworkSettings"]["Networks"]) == ["dmpi-jobs"]
    assert holder["Config"]["User"] == "65534:65534" and holder["HostConfig"]["CapDrop"] == ["ALL"]
    assert holder["HostConfig"]["ReadonlyRootfs"] is True and holder["Mounts"] == []
    # B's job on the same node meanwhile gets a namespace and an address of its own.
    code, b = launch(cluster, VICTIM, shell("ip -o -4 addr show | awk '{print $4}'"),
                     nodes="node1")
    assert code == 0, b
    b_out = cluster.read_shared(b["output"]["stdout"]).split()
    assert set(b_out) == {"127.0.0.1/8", f"{b['job_addresses']['node1']}/24"}
    assert b["job_addresses"]["node1"] != a["job_addresses"]["node1"]
    run(cluster, "mpi.cancel", job_id=a_job)
    wait_for(cluster, a_job, ("cancelled",))
    # A's namespace went with A's job; the node keeps its spares.
    code, _ = cluster.exec("node1", ["docker", "inspect", taken], check=False)
    assert code != 0
    deadline = time.monotonic() + 20
    while len(_spares(cluster, "node1")) != 2:
        assert time.monotonic() < deadline, _spares(cluster, "node1")
        time.sleep(0.5)


# ----------------------------------------------------------------------------- arguments


def test_mpirun_syntax_in_cmd_stays_arguments_of_the_users_program(cluster, victim):
    code, job = launch(cluster, ATTACKER,
                       "echo : -np 6 --oversubscribe --host node1:6 --mca plm isolated echo",
                       np=1)
    assert code == 0, job
    assert cluster.read_shared(job["output"]["stdout"]).splitlines() == [
        ": -np 6 --oversubscribe --host node1:6 --mca plm isolated echo"]


@pytest.mark.parametrize("nodes", ["I@mpi:slots_per_node:2", "I@mpi:slots_per_node:3",
                                   "G@roles:mpi-node or I@mpi:x:y", "P@os:Debian", "node1 or node2"])
def test_nodes_never_answers_questions_about_pillar_or_other_targets(cluster, victim, nodes):
    code, job = run(cluster, "mpi.submit", user=ATTACKER, image="mpi", np=1, cmd="hostname",
                    nodes=nodes)
    assert code == 1 and job["state"] == "rejected"
    assert "one grain match" in job["error"]


def test_a_grain_match_selects_nodes(cluster, victim):
    code, job = launch(cluster, ATTACKER, "hostname", np=2, nodes="G@roles:mpi-node")
    assert code == 0 and job["state"] == "succeeded", job


def test_queue_and_size_limits_refuse_cleanly(cluster, victim):
    code, job = run(cluster, "mpi.submit", user=ATTACKER, image="mpi", np=1,
                    cmd=["echo", "x" * 70000])
    assert code == 1 and "cmd" in job["error"]
    code, job = run(cluster, "mpi.submit", user=ATTACKER, image="mpi", np=1, cmd="hostname",
                    env={"BIG": "y" * 70000})
    assert code == 1 and "env" in job["error"]
    for walltime in ("\u0663\u0660", "9" * 5000, "1e9"):
        code, job = run(cluster, "mpi.submit", user=ATTACKER, image="mpi", np=1,
                        cmd="hostname", walltime=walltime)
        assert code == 1 and job["state"] == "rejected" and "walltime" in job["error"], job


def test_a_user_who_floods_the_queue_first_holds_another_back_by_no_more_than_a_job(
        cluster, victim):
    # A's jobs each take every slot and hold it until A lets them go; B's job, submitted
    # after all of A's, starts as soon as A's running one ends, before A's queued ones.
    # B is a user new to this run: fair share ranks a user by recent usage, and the
    # victim's from earlier tests (kept for days) could outweigh A's.
    release = f"mpi-jobs/flood-{int(time.time() * 1000)}"
    newcomer = f"fair{int(time.time()) % 10**8}"
    size = 2 * len(cluster.nodes)
    hold = shell(f"while [ ! -e /data/{release} ]; do sleep 0.2; done")
    flood = [submit(cluster, ATTACKER, hold, np=size) for _ in range(3)]
    b_job = submit(cluster, newcomer, ["true"], np=size)
    wait_for(cluster, flood[0], ("running",), 120)
    cluster.as_user(ATTACKER, ["touch", f"{STORAGE}/{ATTACKER}/{release}"])
    a = [wait_for(cluster, job_id, ("succeeded",), 180) for job_id in flood]
    b = wait_for(cluster, b_job, ("succeeded",), 180)
    started = sorted([(job["started"], name) for name, job in
                      (("A1", a[0]), ("A2", a[1]), ("A3", a[2]), ("B1", b))])
    assert [name for _, name in started] == ["A1", "B1", "A2", "A3"], started


# -------------------------------------------------------------------------------- limits


def test_a_fork_bomb_ends_only_its_own_job_with_the_limit_named(cluster, victim):
    b_job = submit(cluster, VICTIM, "sleep 300", np=1, nodes="node1")
    wait_for(cluster, b_job, ("running",))
    bomb = "import os, time\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        time.sleep(0.01)\n"
    code, job = launch(cluster, ATTACKER, ["python3", "-c", bomb], np=1, nodes="node1",
                       walltime="2m")
    assert code == 1 and job["state"] == "failed"
    assert "process limit" in job["reason"], job["reason"]
    assert job["timings"]["mpirun"] < 60
    assert wait_for(cluster, b_job, ("running",))["state"] == "running"
    assert node_reports(cluster, "node1")
    run(cluster, "mpi.cancel", job_id=b_job)


def test_a_memory_hog_ends_only_its_own_job_with_the_limit_named(cluster, victim):
    b_job = submit(cluster, VICTIM, "sleep 300", np=1, nodes="node1")
    wait_for(cluster, b_job, ("running",))
    hog = "chunks = []\nwhile True:\n    chunks.append(bytearray(64 << 20))\n"
    code, job = launch(cluster, ATTACKER, ["python3", "-c", hog], np=1, nodes="node1",
                       walltime="2m")
    assert code == 1 and job["state"] == "failed"
    assert "memory limit" in job["reason"], job["reason"]
    assert wait_for(cluster, b_job, ("running",))["state"] == "running"
    run(cluster, "mpi.cancel", job_id=b_job)


def test_the_root_file_system_is_read_only_and_tmp_is_sized(cluster, victim):
    code, job = launch(cluster, ATTACKER, shell(
        "touch /etc/x 2>/dev/null && echo root-writable; "
        "dd if=/dev/zero of=/tmp/fill bs=1M count=4096 2>/dev/null; "
        "du -m /tmp/fill | cut -f1"))
    assert code == 0, job
    out = cluster.read_shared(job["output"]["stdout"]).split()
    assert "root-writable" not in out
    assert int(out[-1]) < 4096


def test_a_job_that_fills_its_tmp_fails_saying_where_room_ran_out(cluster, victim):
    # B's job on the same node goes on; A's ends with the reason, not a bare exit code.
    b_job = submit(cluster, VICTIM, "sleep 300", np=1, nodes="node1")
    wait_for(cluster, b_job, ("running",))
    fill = ("with open('/tmp/fill', 'wb') as f:\n"
            "    while True:\n"
            "        f.write(b'x' * (1 << 20)); f.flush()\n")
    code, job = launch(cluster, ATTACKER, ["python3", "-c", fill], np=1, nodes="node1")
    assert code == 1 and job["state"] == "failed", job
    assert job["reason"].endswith("; it reported 'No space left on device': the user's "
                                  "directory (/data) is full or over its quota, or /tmp is "
                                  "full (mpi:limits:tmp_size_mb)"), job["reason"]
    assert wait_for(cluster, b_job, ("running",))["state"] == "running"
    run(cluster, "mpi.cancel", job_id=b_job)


def test_a_user_who_fills_their_quota_fails_only_their_own_job(cluster, victim):
    # "filler" (pillar: 48 MB and 2000 files) fills their directory on the shared storage
    # from both nodes while B's job waits on the same nodes; then B's job writes and
    # succeeds, and mpi.usage shows filler at the limit.
    cluster.account(QUOTA_USER)
    go = f"{STORAGE}/{VICTIM}/go"
    cluster.as_user(VICTIM, ["rm", "-f", go])
    b_job = submit(cluster, VICTIM, shell(
        "while [ ! -e /data/go ]; do sleep 0.2; done; "
        "head -c 16777216 /dev/zero > $DMPI_JOB_DIR/written-$OMPI_COMM_WORLD_RANK && "
        "echo wrote"),
        np=2, nodes="node1,node2", slots_per_node=1)
    wait_for(cluster, b_job, ("running",))
    fill_bytes = ("import os\n"
                  "rank = os.environ['OMPI_COMM_WORLD_RANK']\n"
                  "with open(f'/data/fill-{rank}', 'wb') as f:\n"
                  "    while True:\n"
                  "        f.write(b'x' * (1 << 20)); f.flush()\n")
    fill_files = ("import os\n"
                  "rank = os.environ['OMPI_COMM_WORLD_RANK']\n"
                  "os.makedirs(f'/data/files-{rank}', exist_ok=True)\n"
                  "for n in range(100000):\n"
                  "    open(f'/data/files-{rank}/{n}', 'w').close()\n")
    full = ("; the user's directory (/data) has no room left: its quota is used up (mpi "
            "usage shows it) or the shared storage is full",
            "it reported 'Disk quota exceeded': the user's directory (/data) is full or over "
            "its quota, or /tmp is full (mpi:limits:tmp_size_mb)")
    try:
        # Bytes, then (room made again) files, each from both nodes.
        code, job = launch(cluster, QUOTA_USER, ["python3", "-c", fill_bytes], np=2,
                           nodes="node1,node2", slots_per_node=1, walltime="5m")
        assert code == 1 and job["state"] == "failed", job
        # What the ranks printed may not fit in the full directory: the reason says it
        # was full either way.
        assert job["reason"].endswith(full), job["reason"]
        _, usage = run(cluster, "mpi.usage", user=QUOTA_USER)
        assert set(usage["storage"]) == {QUOTA_USER}
        mine = usage["storage"][QUOTA_USER]
        assert mine["bytes_limit"] == 48 << 20 and mine["files_limit"] == 2000, mine
        assert mine["bytes_used"] >= 40 << 20, mine
        cluster.as_user(QUOTA_USER, ["sh", "-c", "rm -f /srv/dockermpi/users/filler/fill-*"])
        code, job = launch(cluster, QUOTA_USER, ["python3", "-c", fill_files], np=2,
                           nodes="node1,node2", slots_per_node=1, walltime="5m")
        assert code == 1 and job["state"] == "failed", job
        assert "Disk quota exceeded" in job["reason"], job["reason"]
        deadline = time.monotonic() + 30  # the figures are read again after 10 s
        while (mine := run(cluster, "mpi.usage", user=QUOTA_USER)[1]["storage"][QUOTA_USER]
               )["files_used"] < 1900:
            assert time.monotonic() < deadline, mine
            time.sleep(1)
        # B, on the same nodes, writes 16 MiB on each and succeeds.
        cluster.as_user(VICTIM, ["touch", go])
        done = wait_for(cluster, b_job, FINAL, timeout=120)
        assert done["state"] == "succeeded", done
        assert cluster.read_shared(done["output"]["stdout"]).split() == ["wrote", "wrote"]
    finally:
        cluster.as_user(VICTIM, ["rm", "-f", go])
        cluster.as_user(QUOTA_USER, ["sh", "-c", "rm -rf /srv/dockermpi/users/filler/fill-* "
                                     "/srv/dockermpi/users/filler/files-*"])
        run(cluster, "mpi.cancel", job_id=b_job)


def test_new_users_submitting_at_once_each_get_their_directory_under_its_quota(cluster,
                                                                               victim):
    # Each first submit makes the user's directory and sets its quota on the storage
    # host; glusterd takes one such command at a time, and none may fail for another.
    users = [f"newcomer-{uuid.uuid4().hex[:8]}" for _ in range(6)]
    with concurrent.futures.ThreadPoolExecutor(len(users)) as pool:
        jobs = list(pool.map(lambda user: submit(cluster, user, ["true"]), users))
    for job_id in jobs:
        assert wait_for(cluster, job_id, FINAL, timeout=300)["state"] == "succeeded"
    _, config = run(cluster, "mpi.settings")
    default = config["storage"]["quota"]
    for user in users:
        _, usage = run(cluster, "mpi.usage", user=user)
        assert usage["storage"][user]["bytes_limit"] == default["size_mb"] << 20, usage
        assert usage["storage"][user]["files_limit"] == default["files"], usage


def test_a_job_cannot_change_the_nodes_remote_start_agent(cluster, victim):
    # A's job tries to replace the sshd and ssh every later job (B's) starts with.
    code, job = launch(cluster, ATTACKER, shell(
        f"for f in {AGENT_SSHD} {AGENT_SSH} {AGENT_DIR}/lib/libc.so.6; do "
        "  cp /bin/true $f 2>/dev/null && echo replaced $f; "
        "  chmod 777 $f 2>/dev/null && echo chmodded $f; done; "
        f"touch {AGENT_DIR}/new 2>/dev/null && echo created; "
        f"ls -ln {AGENT_SSHD}"), np=2, nodes="node1,node2")
    assert code == 0, job
    out = cluster.read_shared(job["output"]["stdout"])
    assert "replaced" not in out and "chmodded" not in out and "created" not in out, out
    assert " 0 0 " in out, out  # root's, as on the node
    for node in ("node1", "node2"):
        _, status = cluster.salt_json(["salt", node, "mpi_agent.status"])
        assert status[node]["problems"] == [], status
    # B's job starts with it as before.
    code, job = launch(cluster, VICTIM, shell("echo fine"), np=2, nodes="node1,node2")
    assert code == 0 and job["state"] == "succeeded", job


# ---------------------------------------------------------------------------- migration


def test_a_guest_owned_tree_is_migrated_to_the_users_own_uid(cluster, victim):
    legacy = f"{STORAGE}/legacy"
    node = cluster.nodes[0]
    guest = ["setpriv", "--reuid=2000", "--regid=2000", "--clear-groups", "--"]
    cluster.exec(node, ["sh", "-c", f"rm -rf {legacy} /srv/dockermpi/outside && "
                        f"mkdir -m 0711 {legacy} && chown 2000:2000 {legacy} && "
                        "install -o 2000 -g 2000 -m 0644 /dev/null /srv/dockermpi/outside"])
    cluster.exec(node, guest + ["sh", "-c", f"mkdir -p {legacy}/data && echo hi > "
                                f"{legacy}/data/x && ln -s /srv/dockermpi/outside {legacy}/link"])
    code, result = run(cluster, "mpi.migrate_users")
    assert code == 0, result
    uid = result["migrated"]["legacy"]["uid"]
    _, out = cluster.exec(node, ["sh", "-c", f"stat -c '%u %a' {legacy}; stat -c %u "
                                 f"{legacy}/data/x; stat -c %u /srv/dockermpi/outside; "
                                 f"stat -c %u {legacy}/link"])
    assert out.split() == [str(uid), "700", str(uid), "2000", str(uid)]
    code, job = launch(cluster, "legacy", "cat /data/data/x")
    assert code == 0 and cluster.read_shared(job["output"]["stdout"]) == "hi\n"
    code, again = run(cluster, "mpi.migrate_users")
    assert code == 0 and "legacy" not in again["migrated"]
    cluster.exec(node, ["rm", "-f", "/srv/dockermpi/outside"])
