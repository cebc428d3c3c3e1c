"""Operations an admin does while users run jobs (issue 10): a highstate that restarts
the nodes' Docker engines (live-restore), an upgrade's sync into running minions, usage
accounting, backups of the job store.

Run on the real cluster only: ``tests/run tests/integration/test_operations.py``.
"""

import json
import time

import pytest
import yaml

from tests.cluster.testcluster import JOB_STORE
from tests.integration.test_lifecycle import (nothing_left_behind, run, status,  # noqa: F401
                                              submit, wait_for)

pytestmark = pytest.mark.cluster

IMAGES_PILLAR = "/srv/pillar-local/testcluster_images.sls"


def _dockerd_pid(cluster, node):
    return cluster.unit_property(node, "docker", "MainPID")


def test_a_highstate_that_restarts_dockerd_leaves_a_running_job_running(cluster):
    original = cluster.read("master", ["cat", IMAGES_PILLAR])
    pillar = yaml.safe_load(original) or {}
    changed = json.loads(json.dumps(pillar))
    changed.setdefault("mpi", {}).setdefault("docker", {})["log_max_file"] = 4
    # The ranks run until the test lets them end (a file in the user's directory), then
    # meet in a barrier: every rank's process and the job's network outlived dockerd.
    tag = f"go-{int(time.time())}"
    job_id = submit(cluster, user="operations", np=4, slots_per_node=2, nodes="node1,node2",
                    walltime="5m", cmd=["python3", "-c",
                                        "import os, time; from mpi4py import MPI\n"
                                        f"while not os.path.exists('/data/{tag}'): time.sleep(0.3)\n"
                                        "MPI.COMM_WORLD.Barrier(); print('done')"])
    job = wait_for(cluster, job_id, ("running",), 60)
    before = {node: _dockerd_pid(cluster, node) for node in job["placement"]}
    try:
        cluster.put_file("master", IMAGES_PILLAR, yaml.safe_dump(changed).encode())
        cluster.salt(["salt", "*", "saltutil.refresh_pillar", "--timeout=30"])
        cluster._highstate(list(job["placement"]))
        for node in job["placement"]:
            _, text = cluster.exec(node, ["cat", "/etc/docker/daemon.json"], stdout_only=True)
            daemon = json.loads(text)
            assert daemon["log-opts"]["max-file"] == "4" and daemon["live-restore"] is True
            assert _dockerd_pid(cluster, node) != before[node], f"dockerd on {node} did not restart"
        assert status(cluster, job_id)["state"] == "running"
        cluster.as_user("operations", ["touch", f"/srv/dockermpi/users/operations/{tag}"])
        code, done = run(cluster, "mpi.wait", job_id=job_id, timeout=120)
        assert code == 0 and done["state"] == "succeeded", done
        _, out = run(cluster, "mpi.logs", job_id=job_id)
        assert out.split().count("done") == 4
    finally:
        cluster.put_file("master", IMAGES_PILLAR, original.encode())
        cluster.salt(["salt", "*", "saltutil.refresh_pillar", "--timeout=30"])
        cluster._highstate(cluster.nodes)


def test_an_admins_dry_run_with_a_pillar_override_blocks_no_job(cluster):
    """``state.apply test=True pillar=...`` puts its override into the master's cached
    minion data (until a later refresh replaces it); jobs take the site's settings from
    the pillar the master renders, so they run whatever that cache holds."""
    override = json.dumps({"mpi": {"slots_per_node": 0}})
    code, out = cluster.salt(["salt", "-G", "roles:mpi-node", "state.apply", "dockermpi",
                              "test=True", f"pillar={override}", "--out=json"],
                             check=False, stdout_only=True)
    assert "slots_per_node must be a whole number of at least 1" in out, out
    try:
        # the cache as the dry run leaves it, for as long as Salt keeps it there
        for node in cluster.nodes:
            cluster.salt(["salt-run", "cache.store", "pillar", node, override])
        _, out = cluster.salt(["salt-run", "cache.pillar", "node1", "--out=json"],
                              stdout_only=True)
        assert json.loads(out)["node1"] == {"mpi": {"slots_per_node": 0}}
        job_id = submit(cluster, user="dryrun", np=2, cmd=["true"])
        assert run(cluster, "mpi.wait", job_id=job_id, timeout=120)[1]["state"] == "succeeded"
    finally:
        cluster.salt(["salt", "-G", "roles:mpi-node", "saltutil.refresh_pillar", "wait=True"])


def test_usage_counts_each_users_jobs_and_core_hours(cluster):
    user = f"usage{int(time.time())}"
    since = time.time() - 1
    ok = submit(cluster, user=user, np=2, cmd=["sleep", "2"])
    bad = submit(cluster, user=user, np=1, cmd=["sh", "-c", "exit 3"])
    records = [run(cluster, "mpi.wait", job_id=j, timeout=120)[1] for j in (ok, bad)]
    assert [r["state"] for r in records] == ["succeeded", "failed"], records
    code, usage = run(cluster, "mpi.usage", user=user, since=since)
    assert code == 0, usage
    mine = usage["users"][user]
    assert mine["jobs"]["succeeded"] == 1 and mine["jobs"]["failed"] == 1
    assert mine["jobs"]["total"] == 2 and list(usage["users"]) == [user]
    # core-hours: np x (ended - started) of each job, as recorded
    expected = sum(r["np"] * (r["ended"] - r["started"]) for r in records) / 3600
    assert mine["core_hours"] == pytest.approx(expected, abs=1e-5)
    assert 2 * 2 / 3600 <= mine["core_hours"] < 2 * 30 / 3600  # the sleep took 2 s on 2 ranks
    assert mine["queue_wait_max"] >= mine["queue_wait_mean"] >= 0
    _, csv_text = run(cluster, "mpi.history", user=user, since=since, format="csv")
    lines = csv_text.strip().splitlines()
    assert lines[0].startswith("job_id,") and len(lines) == 3


def test_backup_is_written_and_restore_refuses_while_a_job_runs(cluster):
    code, made = run(cluster, "mpi.backup")
    assert code == 0 and made["path"].endswith(".sqlite") and made["bytes"] > 0, made
    job_id = submit(cluster, user="operations", np=1, cmd=["sleep", "30"])
    wait_for(cluster, job_id, ("running",), 60)
    code, refused = run(cluster, "mpi.restore", path=made["path"])
    assert code == 1 and "queued or running" in refused["error"], refused
    assert status(cluster, job_id)["state"] == "running"
    run(cluster, "mpi.cancel", job_id=job_id)
    cluster.exec("master", ["rm", "-f", made["path"]])


def _ledger(cluster, node):
    code, text = cluster.exec(node, ["cat", "/var/lib/dockermpi/images.json"], check=False)
    return json.loads(text) if code == 0 else []


def _has_image(cluster, node, reference):
    code, _ = cluster.exec(node, ["docker", "image", "inspect", reference], check=False)
    return code == 0


def _absent_state(returns):
    """The return of the retired-images state among a state.apply's returns."""
    return next(r for key, r in returns.items() if "-mpi-images-unapproved-absent_|" in key)


def test_an_image_no_longer_approved_is_removed_by_highstate_once_unused(cluster):
    from tests.cluster.testcluster import BASE_IMAGE, REGISTRY, REGISTRY_HOST_PORT

    # A small image of our own, pushed to the cluster's registry and approved.
    tag = f"dockermpi/retired:{int(time.time())}"
    cluster.docker.images.get(BASE_IMAGE).tag(*tag.split(":"))
    reference = cluster.push_image(tag, f"127.0.0.1:{REGISTRY_HOST_PORT}", REGISTRY)
    original = cluster.read("master", ["cat", IMAGES_PILLAR])
    pillar = yaml.safe_load(original) or {}
    approved = json.loads(json.dumps(pillar))
    approved["mpi"]["images"]["retired"] = reference
    node = "node1"
    try:
        cluster.put_file("master", IMAGES_PILLAR, yaml.safe_dump(approved).encode())
        cluster.salt(["salt", node, "saltutil.refresh_pillar", "--timeout=30"])
        cluster._highstate([node])
        assert _has_image(cluster, node, reference) and reference in _ledger(cluster, node)
        # Retired while a container uses it: kept; an image someone else has: untouched.
        cluster.exec(node, ["docker", "create", "--name", "retired-user", reference, "true"])
        cluster.put_file("master", IMAGES_PILLAR, original.encode())
        cluster.salt(["salt", node, "saltutil.refresh_pillar", "--timeout=30"])
        _, dry = cluster.salt_json(["salt", node, "state.apply", "dockermpi.images.absent",
                                    "test=True"])
        kept = _absent_state(dry[node])
        assert kept["result"] is True and "kept: used by retired-user" in kept["comment"]
        cluster._highstate([node])
        assert _has_image(cluster, node, reference)
        cluster.exec(node, ["docker", "rm", "retired-user"])
        # The node's ready network namespaces run the image of the last job: they are no
        # user of it and go with it.
        for count in ("0", "2"):
            cluster.salt(["salt", node, "mpi_job.standby", reference, count])
        _, dry = cluster.salt_json(["salt", node, "state.apply", "dockermpi.images.absent",
                                    "test=True"])
        planned = _absent_state(dry[node])
        assert planned["result"] is None and planned["changes"] == {"removed": [reference]}
        assert _has_image(cluster, node, reference)  # test=True changed nothing
        cluster._highstate([node])
        assert not _has_image(cluster, node, reference)
        assert reference not in _ledger(cluster, node)
        # (the highstate made new ones, from an approved image)
        _, spares = cluster.exec(node, ["docker", "ps", "-aq", "--filter",
                                        "label=io.dockermpi.role=standby", "--filter",
                                        f"ancestor={reference}"])
        assert spares.split() == []
        for approved_ref in pillar["mpi"]["images"].values():  # the approved ones stay
            assert _has_image(cluster, node, approved_ref)
    finally:
        cluster.exec(node, ["docker", "rm", "-f", "retired-user"], check=False)
        cluster.put_file("master", IMAGES_PILLAR, original.encode())
        cluster.salt(["salt", node, "saltutil.refresh_pillar", "--timeout=30"])


def _images(cluster):
    code, found = run(cluster, "mpi.images")
    assert code == 0, found
    return {image["name"]: image for image in found["images"]}


#: An image of a site's own: the job image with a tool of its own first on PATH by ENV,
#: an Open MPI that maps ranks round-robin by node, not by slot as DockerMPI places them,
#: no ssh at all but an ssh configuration that would break one, and an ENTRYPOINT, USER
#: and WORKDIR of its own.
TOOLED_DOCKERFILE = """FROM {base}
RUN printf '\\nrmaps_base_mapping_policy = node\\n' >> /etc/openmpi/openmpi-mca-params.conf
RUN dpkg --purge --force-depends openssh-client \\
 && mkdir -p /etc/ssh \\
 && printf 'Host *\\n  ProxyCommand /bin/false\\n' > /etc/ssh/ssh_config \\
 && printf 'ForceCommand /bin/false\\nPort 1\\n' > /etc/ssh/sshd_config
RUN mkdir -p /opt/tools/bin \\
 && printf '#!/bin/sh\\necho "tool of rank $OMPI_COMM_WORLD_RANK home=$TOOLS_HOME"\\n' \\
      > /opt/tools/bin/dmpi-tool && chmod 755 /opt/tools/bin/dmpi-tool
ENV PATH=/opt/tools/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \\
    TOOLS_HOME=/opt/tools
USER 4242:4242
WORKDIR /opt/tools
ENTRYPOINT ["/bin/false"]
"""


def test_approved_images_are_probed_and_launched_as_the_probe_found_them(cluster):
    """...and each rank checks it runs where DockerMPI placed it."""
    import io

    from tests.cluster.testcluster import BASE_IMAGE, REGISTRY, REGISTRY_HOST_PORT

    # What every node's highstate probed in the job image.
    job_image = _images(cluster)["mpi"]
    assert job_image["runs_jobs"] is True, job_image
    assert (job_image["flavour"], job_image["launcher"], job_image["sshd"]) == \
        ("openmpi4", "/usr/bin/mpirun", None), job_image
    assert job_image["mpi4py"] and job_image["glibc"] == "2.36", job_image
    assert set(job_image["probed_on"]) == set(cluster.nodes), job_image
    # DockerMPI's base image holds no MPI; "tooled" is the job image with ENV of its own.
    stamp = int(time.time())
    plain_tag = f"dockermpi/plain:{stamp}"
    cluster.docker.images.get(BASE_IMAGE).tag(*plain_tag.split(":"))
    tooled_tag = f"dockermpi/tooled:{stamp}"
    cluster.docker.images.build(
        fileobj=io.BytesIO(TOOLED_DOCKERFILE.format(base=cluster.mpi_image()).encode()),
        tag=tooled_tag, rm=True, network_mode="none")
    pushed = {name: cluster.push_image(tag, f"127.0.0.1:{REGISTRY_HOST_PORT}", REGISTRY)
              for name, tag in (("plain", plain_tag), ("tooled", tooled_tag))}
    original = cluster.read("master", ["cat", IMAGES_PILLAR])
    approved = yaml.safe_load(original) or {}
    approved["mpi"]["images"].update(pushed)
    node = "node1"
    try:
        cluster.put_file("master", IMAGES_PILLAR, yaml.safe_dump(approved).encode())
        cluster.salt(["salt", "*", "saltutil.refresh_pillar", "--timeout=30"])
        cluster._highstate([node])  # the other nodes pull them when a job needs them
        _, facts = cluster.salt_json(["salt", node, "mpi_image.facts", pushed["plain"]])
        assert facts[node]["mpi"] is None and facts[node]["problem"] is None, facts
        assert "no MPI launcher" in facts[node]["why_no_jobs"], facts
        _, probes = cluster.exec(node, ["docker", "ps", "-aq", "--filter",
                                        "label=io.dockermpi.role=image-probe"])
        assert probes.split() == []  # the probe's containers are gone
        # The master learns it from the node's next health report.
        deadline = time.monotonic() + 60
        while not all(_images(cluster)[name]["probed_on"] for name in pushed):
            assert time.monotonic() < deadline, "the master never learnt the probe's facts"
            time.sleep(1)
        images = _images(cluster)
        assert images["plain"]["runs_jobs"] is False, images["plain"]
        assert images["plain"]["probed_on"] == [node], images["plain"]
        code, refused = run(cluster, "mpi.submit", user="operations", image="plain", np=1,
                            cmd=["hostname"])
        assert code == 1 and refused["error"] == (
            "image 'plain' cannot run jobs: it has no MPI launcher (mpirun or mpiexec) on "
            "its PATH"), refused
        code, queued = run(cluster, "mpi.list", user="operations", state="queued")
        assert code == 0 and queued == [], queued
        # Ranks on both nodes (one started over the node's ssh: the image has none) find
        # the image's own tool on its PATH and get its ENV.
        assert images["tooled"]["runs_jobs"] is True, images["tooled"]
        job_id = submit(cluster, user="operations", image="tooled", np=2, nodes=2,
                        slots_per_node=1, cmd=["dmpi-tool"])
        code, done = run(cluster, "mpi.wait", job_id=job_id, timeout=120)
        assert code == 0 and done["state"] == "succeeded", done
        assert len(done["placement"]) == 2, done
        _, out = run(cluster, "mpi.logs", job_id=job_id)
        assert sorted(out.splitlines()) == ["tool of rank 0 home=/opt/tools",
                                            "tool of rank 1 home=/opt/tools"], out
        # Three ranks on two nodes, placed 2 + 1: the image's MPI puts rank 1 on the
        # second node (round-robin), so the ranks are not where they were placed.
        job_id = submit(cluster, user="operations", image="tooled", np=3,
                        nodes="node1,node2", cmd=["dmpi-tool"])
        code, done = run(cluster, "mpi.wait", job_id=job_id, timeout=120)
        assert code == 1 and done["state"] == "failed", done
        assert sorted(done["placement"].values()) == [1, 2], done
        assert done["reason"].startswith("ranks did not run where they were placed: rank "), \
            done
        assert "were placed (nodes node1,node2: 2,1 ranks)" in done["reason"] or \
            "were placed (nodes node2,node1: 2,1 ranks)" in done["reason"], done
    finally:
        cluster.put_file("master", IMAGES_PILLAR, original.encode())
        cluster.salt(["salt", "*", "saltutil.refresh_pillar", "--timeout=30"])
        # The nodes that pulled the test's images for its jobs remove them again (and
        # their ready namespaces running them, made anew from an approved image).
        cluster._highstate(cluster.nodes)


_AGE_RECORD = """
import json, sqlite3, sys
conn = sqlite3.connect(sys.argv[1])
job_id, days = sys.argv[2], float(sys.argv[3])
record = json.loads(conn.execute("SELECT record FROM jobs WHERE id = ?", (job_id,)).fetchone()[0])
for key in ("submitted", "started", "ended"):
    record[key] -= days * 86400
conn.execute("UPDATE jobs SET record = ? WHERE id = ?", (json.dumps(record), job_id))
conn.commit()
"""


def test_retention_removes_old_records_and_job_dirs_and_nothing_else(cluster):
    owner, victim = "retention-a", "retention-b"
    users = "/srv/dockermpi/users"
    old, recent = (submit(cluster, user=owner, np=1, cmd=["true"]) for _ in range(2))
    for job_id in (old, recent):
        assert run(cluster, "mpi.wait", job_id=job_id, timeout=120)[1]["state"] == "succeeded"
    running = submit(cluster, user=owner, np=1, cmd=["sleep", "120"])
    wait_for(cluster, running, ("running",), 60)
    cluster.exec("master", ["python3", "-c", _AGE_RECORD, JOB_STORE, old, "400"])
    # B's file, and A's old job directories: one plain, one holding a link to B's file,
    # one that is itself a link to B's directory (A's job could have made any of them).
    cluster.as_user(victim, ["sh", "-c", "echo precious > /srv/dockermpi/users/"
                                         f"{victim}/keep.txt"])
    jobs = f"{users}/{owner}/mpi-jobs"
    cluster.as_user(owner, ["sh", "-c",
                            f"mkdir -p {jobs}/20200101-000000-aaaaaa {jobs}/20200101-000000-cccccc"
                            f" && echo x > {jobs}/20200101-000000-aaaaaa/stdout"
                            f" && ln -sfn {users}/{victim}/keep.txt {jobs}/20200101-000000-cccccc/l"
                            # -n: an earlier run on this cluster left this link in place
                            f" && ln -sfn {users}/{victim} {jobs}/20200101-000000-bbbbbb"
                            f" && touch -h -d 2020-01-02 {jobs}/20200101-000000-*"
                            f" {jobs}/20200101-000000-*/*"])
    try:
        code, done = run(cluster, "mpi.prune", job_records_days=365, job_dirs_days=30)
        assert code == 0, done
        assert done["job_records_removed"] >= 1
        assert done["job_dirs_removed"] == {owner: ["20200101-000000-aaaaaa",
                                                    "20200101-000000-cccccc"]}
        assert "no such job" in run(cluster, "mpi.status", job_id=old)[1]["error"]
        for job_id in (recent, running):
            assert run(cluster, "mpi.status", job_id=job_id)[1]["job_id"] == job_id
        _, listing = cluster.exec("node1", ["ls", jobs], stdout_only=True)
        assert set(listing.split()) >= {recent, running, "20200101-000000-bbbbbb"}
        assert "20200101-000000-aaaaaa" not in listing.split()
        assert cluster.read_shared(f"{users}/{victim}/keep.txt") == "precious\n"
    finally:
        run(cluster, "mpi.cancel", job_id=running)


#: From a node host: what the registry answers to a push, a delete and a pull, and
#: whether its writable port takes a connection. argv: the registry host, the MPI
#: image's repository and digest.
_REGISTRY_WRITES = r"""
import json, socket, sys, urllib.error, urllib.request
host, repository, digest = sys.argv[1:4]

def status(method, path):
    request = urllib.request.Request(f"http://{host}:5000/v2/{path}", method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status
    except urllib.error.HTTPError as exc:
        return exc.code

try:
    socket.create_connection((host, 5001), timeout=5).close()
    push_port = "open"
except OSError as exc:
    push_port = type(exc).__name__
print(json.dumps({
    "pull": status("HEAD", f"{repository}/manifests/{digest}"),
    "push": status("POST", f"{repository}/blobs/uploads/"),
    "overwrite": status("PUT", f"{repository}/manifests/latest"),
    "delete": status("DELETE", f"{repository}/manifests/{digest}"),
    "push_port": push_port,
}))
"""


def test_the_registry_is_read_only_for_the_cluster_network(cluster):
    """A node host (root there) pulls approved images, and can neither push, overwrite
    nor delete one; the registry's writable port refuses it. This machine still pushes
    (the retired-image test above does)."""
    from tests.cluster.testcluster import MASTER_ADDR

    pillar = cluster.read("master", ["cat", IMAGES_PILLAR])
    reference = yaml.safe_load(pillar)["mpi"]["images"]["mpi"]
    repository, digest = reference.split("/", 1)[1].split("@")
    code, out = cluster.exec("node1", ["/opt/saltstack/salt/bin/python3", "-c",
                                       _REGISTRY_WRITES, MASTER_ADDR, repository, digest],
                             stdout_only=True)
    assert code == 0, out
    answers = json.loads(out)
    assert answers["pull"] == 200, answers
    # Distribution's read-only mode and its disabled delete answer 405 Method Not Allowed.
    assert answers["push"] == answers["overwrite"] == answers["delete"] == 405, answers
    # Refused by the firewall: the writable side itself runs and answers on the master.
    assert answers["push_port"] == "ConnectionRefusedError", answers
    code, out = cluster.exec("master", ["/opt/saltstack/salt/bin/python3", "-c",
                                        "import socket; socket.create_connection(('127.0.0.1',"
                                        " 5001), timeout=5).close()"])
    assert code == 0, out


#: A Salt module of an upgrade that imports a name its upgrade adds to the library.
UPGRADED_MODULE = b'''
import dmpi_current

dmpi_current.ensure()

from dmpi.contract import UPGRADE_PROBE


def probe():
    return UPGRADE_PROBE
'''


def test_a_minion_that_outlived_an_upgrade_loads_the_modules_that_need_the_new_library(cluster):
    # The nodes' minions run calls in threads of one process, which keeps the dmpi
    # modules it imported; an upgrade's sync writes a changed library module and a Salt
    # module that imports a name new in it. Salt loads the new module at once, so it
    # must find the new library, before the minion's restart.
    node, extmods = "node1", "/var/cache/salt/minion/extmods"
    minion = cluster.unit_property(node, "salt-minion", "MainPID")
    code, found = cluster.salt_json(["salt", node, "mpi_config.engine_revision"])
    assert code == 0 and isinstance(found.get(node), str), found  # the library is loaded
    contract = cluster.read(node, ["cat", f"{extmods}/utils/dmpi/contract.py"])
    try:
        cluster.put_file(node, f"{extmods}/utils/dmpi/contract.py",
                         (contract + '\nUPGRADE_PROBE = "new in this upgrade"\n').encode())
        cluster.put_file(node, f"{extmods}/modules/mpi_upgrade_probe.py", UPGRADED_MODULE)
        cluster.salt(["salt", node, "saltutil.refresh_modules", "wait=True"])
        code, found = cluster.salt_json(["salt", node, "mpi_upgrade_probe.probe"])
        assert code == 0 and found == {node: "new in this upgrade"}, found
        code, found = cluster.salt_json(["salt", node, "sys.list_functions", "mpi_job"])
        assert "mpi_job.start_worker" in found[node], found  # and the rest still loads
        assert cluster.unit_property(node, "salt-minion", "MainPID") == minion
    finally:
        # The master's files come back, and the probe goes (Salt's sync removes modules
        # the master does not have).
        cluster.salt(["salt", node, "saltutil.sync_all"])
    assert "UPGRADE_PROBE" not in cluster.read(node, ["cat", f"{extmods}/utils/dmpi/contract.py"])
    code, found = cluster.salt_json(["salt", node, "sys.list_functions", "mpi_job"])
    assert "mpi_job.start_worker" in found[node], found
