"""A Kubeflow MPI Operator job runs on DockerMPI: the operator's own
examples/v2beta1/pi/pi.yaml, unchanged, in its example's image built offline
(tests/cluster/images/mpi-pi), approved like any image. (The mapping, field by field:
tests/unit/dmpi/jobs/test_mpijob.py.)

Run on the real cluster only: ``tests/run tests/integration/test_mpijob.py``.
"""

import pathlib
import time

import yaml

import pytest

from tests.integration.test_lifecycle import nothing_left_behind, run  # noqa: F401

pytestmark = pytest.mark.cluster

PI_YAML = (pathlib.Path(__file__).resolve().parents[1] / "unit" / "dmpi" / "jobs" / "data"
           / "mpi-operator-pi.yaml").read_text()
IMAGES_PILLAR = "/srv/pillar-local/testcluster_images.sls"
MANIFEST = "/root/pi.yaml"  # on the master


def test_the_operators_pi_example_runs_across_two_nodes(cluster):
    from tests.cluster.testcluster import REGISTRY, REGISTRY_HOST_PORT

    reference = cluster.push_image(cluster.mpi_pi_image(), f"127.0.0.1:{REGISTRY_HOST_PORT}",
                                   REGISTRY)
    _, original = cluster.exec("master", ["cat", IMAGES_PILLAR], stdout_only=True)
    approved = yaml.safe_load(original) or {}
    approved["mpi"]["images"]["mpi-pi"] = reference
    try:
        cluster.put_file("master", IMAGES_PILLAR, yaml.safe_dump(approved).encode())
        cluster.salt(["salt", "*", "saltutil.refresh_pillar", "--timeout=30"])
        cluster.put_file("master", MANIFEST, PI_YAML.encode())
        # Named by its approved name: the manifest's image is a tag of Docker Hub's.
        code, refused = run(cluster, "mpi.submit_mpijob", path=MANIFEST, user="mpijob")
        assert code == 1 and "is no approved image" in refused["error"], refused
        # Its pods ask 1 GiB each: more than a slot gets here, until the site gives it.
        code, refused = run(cluster, "mpi.submit_mpijob", path=MANIFEST, user="mpijob",
                            image="mpi-pi")
        assert code == 1 and refused["error"] == (
            "mpijob Worker.template.spec.containers[0].resources.limits.memory 1Gi is more "
            "than its 1 slot(s) get (512 MiB: mpi:limits:memory_per_slot_mb)"), refused
        approved["mpi"].setdefault("limits", {})["memory_per_slot_mb"] = 1024
        cluster.put_file("master", IMAGES_PILLAR, yaml.safe_dump(approved).encode())
        cluster.salt(["salt", "*", "saltutil.refresh_pillar", "--timeout=30"])
        deadline = time.monotonic() + 60  # until the master reads the nodes' new pillar
        while True:
            code, job = run(cluster, "mpi.submit_mpijob", path=MANIFEST, user="mpijob",
                            image="mpi-pi")
            if code == 0 or "memory_per_slot_mb" not in job.get("error", "") \
                    or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert code == 0 and job["state"] == "queued", job
        assert (job["name"], job["np"], job["cmd"]) == ("pi", 2, ["/home/mpiuser/pi"]), job
        code, done = run(cluster, "mpi.wait", job_id=job["job_id"], timeout=300)
        assert code == 0 and done["state"] == "succeeded", done
        assert len(done["placement"]) == 2, done  # Worker replicas 2, slotsPerWorker 1
        _, out = run(cluster, "mpi.logs", job_id=job["job_id"])
        lines = out.splitlines()
        assert "pi is approximately 3.141592653590" in lines, out
        assert sorted(line.split(" on ")[0] for line in lines if line.startswith("rank ")) == \
            ["rank 0 of 2", "rank 1 of 2"], out
    finally:
        cluster.put_file("master", IMAGES_PILLAR, original.encode())
        cluster.salt(["salt", "*", "saltutil.refresh_pillar", "--timeout=30"])
        # The nodes that pulled the test's images for its jobs remove them again (and
        # their ready namespaces running them, made anew from an approved image).
        cluster._highstate(cluster.nodes)
