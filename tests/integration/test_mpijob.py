"""Kubeflow MPI Operator jobs run on DockerMPI: the operator's own
examples/v2beta1/pi/pi.yaml, pi-mpich.yaml and pi-intel.yaml, unchanged, in their
examples' images built offline (tests/cluster/images/mpi-pi for Open MPI,
tests/cluster/images/mpi-pi-hydra on the MPICH and Intel MPI test images), approved like
any image. (The mapping, field by field: tests/unit/dmpi/jobs/test_mpijob.py.)

Run on the real cluster only: ``tests/run tests/integration/test_mpijob.py``.
"""

import pathlib
import time

import yaml

import pytest

from tests.integration.test_lifecycle import nothing_left_behind, run  # noqa: F401
from tests.integration.test_operations import _images

pytestmark = pytest.mark.cluster

DATA = pathlib.Path(__file__).resolve().parents[1] / "unit" / "dmpi" / "jobs" / "data"
#: The operator's example -> the approved image it runs in here.
EXAMPLES = {"pi": "mpi-pi", "pi-mpich": "mpi-pi-mpich", "pi-intel": "mpi-pi-intel"}
IMAGES_PILLAR = "/srv/pillar-local/testcluster_images.sls"
MEMORY_PER_SLOT_MB = 1024  # the examples' pods ask 1 GiB each


def _manifest(cluster, example, text=None):
    """The example's manifest (or ``text``) put on the master; its path there."""
    path = f"/root/{example}.yaml"
    cluster.put_file("master", path, (text or (DATA / f"mpi-operator-{example}.yaml")
                                      .read_text()).encode())
    return path


@pytest.fixture(scope="module")
def pi_images(cluster):
    """The examples' images pushed, approved, and probed by one node's highstate, with
    slots of the memory the examples' pods ask; on the way out the approval is withdrawn
    and highstate removes the images from every node."""
    from tests.cluster import testimages
    from tests.cluster.testcluster import REGISTRY, REGISTRY_HOST_PORT

    built = testimages.pi_examples(cluster)
    pushed = {name: cluster.push_image(tag, f"127.0.0.1:{REGISTRY_HOST_PORT}", REGISTRY)
              for name, tag in built.items()}
    original = cluster.read("master", ["cat", IMAGES_PILLAR])
    approved = yaml.safe_load(original) or {}
    approved["mpi"]["images"].update(pushed)
    approved["mpi"].setdefault("limits", {})["memory_per_slot_mb"] = MEMORY_PER_SLOT_MB
    try:
        cluster.put_file("master", IMAGES_PILLAR, yaml.safe_dump(approved).encode())
        cluster.salt(["salt", "*", "saltutil.refresh_pillar", "--timeout=30"])
        cluster._highstate(["node1"])
        deadline = time.monotonic() + 60
        # The approval and the slots' memory are one pillar file: once the master lists
        # the images probed, it has read both.
        while not all(_images(cluster).get(name, {}).get("probed_on") for name in built):
            assert time.monotonic() < deadline, "the master never learnt the probe's facts"
            time.sleep(1)
        yield _images(cluster)
    finally:
        cluster.put_file("master", IMAGES_PILLAR, original.encode())
        cluster.salt(["salt", "*", "saltutil.refresh_pillar", "--timeout=30"])
        cluster._highstate(cluster.nodes)


def test_each_examples_image_holds_its_mpi(pi_images):
    assert {name: pi_images[name]["flavour"] for name in EXAMPLES.values()} == {
        "mpi-pi": "openmpi4", "mpi-pi-mpich": "mpich", "mpi-pi-intel": "intelmpi"}
    assert all(pi_images[name]["runs_jobs"] for name in EXAMPLES.values()), pi_images


@pytest.mark.parametrize("example", list(EXAMPLES))
def test_the_operators_pi_example_runs_across_two_nodes(cluster, pi_images, example):
    path = _manifest(cluster, example)
    # Named by its approved name: the manifest's image is a tag of Docker Hub's.
    code, refused = run(cluster, "mpi.submit_mpijob", path=path, user="mpijob")
    assert code == 1 and "is no approved image" in refused["error"], refused
    code, job = run(cluster, "mpi.submit_mpijob", path=path, user="mpijob",
                    image=EXAMPLES[example])
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


@pytest.mark.parametrize("example, image, message", [
    ("pi-intel", "mpi-pi-mpich", "mpijob spec.mpiImplementation Intel does not match image "
                                 "'mpi-pi-mpich', whose MPI is MPICH (Hydra)"),
    ("pi-mpich", "mpi-pi", "mpijob spec.mpiImplementation MPICH does not match image "
                           "'mpi-pi', whose MPI is Open MPI 4"),
    ("pi", "mpi-pi-intel", "mpijob spec.mpiImplementation OpenMPI does not match image "
                           "'mpi-pi-intel', whose MPI is Intel MPI"),
])
def test_an_example_in_an_image_of_another_mpi_is_refused_and_nothing_queued(
        cluster, pi_images, example, image, message):
    code, before = run(cluster, "mpi.list", user="mpijob")
    assert code == 0, before
    code, refused = run(cluster, "mpi.submit_mpijob", path=_manifest(cluster, example),
                        user="mpijob", image=image)
    assert code == 1 and refused["error"] == message, refused
    assert run(cluster, "mpi.list", user="mpijob") == (0, before)


def test_a_pod_asking_more_than_a_slot_gets_is_refused_by_field(cluster, pi_images):
    manifest = yaml.safe_load((DATA / "mpi-operator-pi.yaml").read_text())
    worker = manifest["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    worker["containers"][0]["resources"]["limits"]["memory"] = "2Gi"
    code, refused = run(cluster, "mpi.submit_mpijob", user="mpijob", image="mpi-pi",
                        path=_manifest(cluster, "pi-2gi", yaml.safe_dump(manifest)))
    assert code == 1 and refused["error"] == (
        "mpijob Worker.template.spec.containers[0].resources.limits.memory 2Gi is more than "
        f"its 1 slot(s) get ({MEMORY_PER_SLOT_MB} MiB: mpi:limits:memory_per_slot_mb)"), refused
