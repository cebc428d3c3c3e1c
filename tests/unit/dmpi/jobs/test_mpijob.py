"""A Kubeflow MPI Operator MPIJob as a DockerMPI job request (:mod:`dmpi.jobs.mpijob`): the
operator's own pi example maps, and every field DockerMPI cannot honour is refused by
name."""

import copy
import pathlib

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from dmpi.errors import RequestError
from dmpi.jobs import mpijob

PI_TEXT = (pathlib.Path(__file__).resolve().parent / "data" / "mpi-operator-pi.yaml").read_text()
PI = yaml.safe_load(PI_TEXT)
DIGEST = "sha256:" + "ab" * 32
APPROVED = {"mpi": f"10.251.1.2:5000/dockermpi/mpi@sha256:{'0' * 64}",
            "pi": f"10.251.1.2:5000/dockermpi/mpi-pi@{DIGEST}"}
LIMITS = {"cpus_per_slot": 1.0, "memory_per_slot_mb": 2048}


def _changed(change):
    job = copy.deepcopy(PI)
    change(job)
    return job


def _launcher(job):
    return job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]


def _worker(job):
    return job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]


def test_the_operators_pi_example_maps_in_the_image_named():
    assert mpijob.to_request(PI_TEXT, APPROVED, LIMITS, image="pi") == {
        "image": "pi", "np": 2, "cmd": ["/home/mpiuser/pi"], "nodes": 2, "slots_per_node": 1,
        "env": None, "walltime": None, "name": "pi"}


DATA = pathlib.Path(__file__).resolve().parent / "data"
PROBED = {"pi": "openmpi4", "mpi": "openmpi5", "impi": "intelmpi", "hydra": "mpich"}


@pytest.mark.parametrize("example, image", [("pi", "pi"), ("pi", "mpi"),
                                            ("pi-intel", "impi"), ("pi-mpich", "hydra")])
def test_each_of_the_operators_pi_examples_maps_to_an_image_of_its_mpi(example, image):
    text = (DATA / f"mpi-operator-{example}.yaml").read_text()
    approved = dict(APPROVED, impi=APPROVED["pi"], hydra=APPROVED["pi"])
    assert mpijob.to_request(text, approved, LIMITS, image=image,
                             flavour_of=PROBED.get) == {
        "image": image, "np": 2, "cmd": ["/home/mpiuser/pi"], "nodes": 2,
        "slots_per_node": 1, "env": None, "walltime": None, "name": "pi"}


@pytest.mark.parametrize("example, image, message", [
    ("pi-intel", "pi", "spec.mpiImplementation Intel does not match image 'pi', whose MPI is "
                       "Open MPI 4"),
    ("pi-mpich", "impi", "spec.mpiImplementation MPICH does not match image 'impi', whose MPI "
                         "is Intel MPI"),
    ("pi", "hydra", "spec.mpiImplementation OpenMPI does not match image 'hydra', whose MPI "
                    r"is MPICH \(Hydra\)"),
    ("pi-intel", "new", r"spec.mpiImplementation Intel: image 'new' has not been probed by a "
                        r"node yet, and an image not probed is launched as Open MPI 4"),
])
def test_an_image_of_another_mpi_than_the_manifests_is_refused(example, image, message):
    text = (DATA / f"mpi-operator-{example}.yaml").read_text()
    approved = dict(APPROVED, impi=APPROVED["pi"], hydra=APPROVED["pi"], new=APPROVED["pi"])
    with pytest.raises(RequestError, match="^mpijob " + message):
        mpijob.to_request(text, approved, LIMITS, image=image, flavour_of=PROBED.get)


def test_an_open_mpi_job_runs_on_an_image_not_probed_yet_as_open_mpi_4():
    # What submit does for any job: an image no node has probed is launched as Open MPI 4.
    assert mpijob.to_request(PI_TEXT, APPROVED, LIMITS, image="pi")["image"] == "pi"


def test_the_image_maps_by_reference_or_digest():
    by_digest = _changed(lambda j: [c.update(image=f"registry.example/mpi-pi@{DIGEST}")
                                    for c in (_launcher(j), _worker(j))])
    assert mpijob.to_request(by_digest, APPROVED, LIMITS)["image"] == "pi"
    by_reference = _changed(lambda j: [c.update(image=APPROVED["mpi"])
                                       for c in (_launcher(j), _worker(j))])
    assert mpijob.to_request(by_reference, APPROVED, LIMITS)["image"] == "mpi"
    with pytest.raises(RequestError, match=r"^mpijob Launcher.template.spec.containers\[0\]"
                                           r"\.image 'mpioperator/mpi-pi:openmpi' is no "
                                           r"approved image .*approved: mpi, pi\)$"):
        mpijob.to_request(PI, APPROVED, LIMITS)
    with pytest.raises(RequestError, match="^image 'other' is not approved"):
        mpijob.to_request(PI, APPROVED, LIMITS, image="other")
    two_images = _changed(lambda j: (_launcher(j).update(image=APPROVED["mpi"]),
                                     _worker(j).update(image=APPROVED["pi"])))
    with pytest.raises(RequestError, match="image differs from the launcher's"):
        mpijob.to_request(two_images, APPROVED, LIMITS)


def test_workers_slots_env_and_deadline_map():
    def change(job):
        job["spec"]["slotsPerWorker"] = 2
        job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] = 3
        job["spec"]["runPolicy"]["activeDeadlineSeconds"] = 600
        _launcher(job)["args"] = ["-np", "6", "--allow-run-as-root", "python3", "-c", "x=1"]
        _launcher(job)["env"] = [{"name": "OMP_NUM_THREADS", "value": "1"}]
        _worker(job)["env"] = [{"name": "OMP_NUM_THREADS", "value": "1"}]
        _worker(job)["resources"]["limits"] = {"cpu": "1500m", "memory": "4Gi"}
        _launcher(job)["workingDir"] = "/data/runs"
    found = mpijob.to_request(_changed(change), APPROVED, LIMITS, image="pi")
    assert found == {"image": "pi", "np": 6, "cmd": ["python3", "-c", "x=1"], "nodes": 3,
                     "slots_per_node": 2, "env": {"OMP_NUM_THREADS": "1"},
                     "walltime": "600s", "name": "pi", "workdir": "runs"}


def test_a_launcher_run_as_worker_holds_slots_too():
    def change(job):
        job["spec"]["runLauncherAsWorker"] = True
        _launcher(job)["args"] = ["-n", "3", "/home/mpiuser/pi"]
    found = mpijob.to_request(_changed(change), APPROVED, LIMITS, image="pi")
    assert (found["np"], found["nodes"]) == (3, 3)


@pytest.mark.parametrize("change, message", [
    (lambda j: _launcher(j).update(args=["-n", "4", "/home/mpiuser/pi"]),
     r"mpirun -n 4 is not Worker replicas x slotsPerWorker \(2\)"),
    (lambda j: _launcher(j).update(args=["--bind-to", "core", "/home/mpiuser/pi"]),
     "mpirun option --bind-to cannot be honoured"),
    (lambda j: _launcher(j).update(command=["sh", "-c"], args=["mpirun -n 2 pi"]),
     "command must start with mpirun"),
    (lambda j: _launcher(j).update(args=["-n", "2"]), "no program after the mpirun options"),
    (lambda j: _launcher(j).update(command="mpirun -n 2 pi", args=None),
     "command and args must give the launcher's mpirun command line, as strings"),
    (lambda j: _launcher(j).update(args=["-n", "two", "pi"]), "is not a number of ranks"),
    (lambda j: _launcher(j)["securityContext"].update(privileged=True),
     r"securityContext.privileged: True cannot be honoured"),
    (lambda j: _launcher(j)["securityContext"].update(capabilities={"add": ["NET_ADMIN"]}),
     "securityContext.capabilities"),
    (lambda j: _worker(j).update(volumeMounts=[{"name": "x", "mountPath": "/x"}]),
     r"Worker.template.spec.containers\[0\].volumeMounts cannot be honoured"),
    (lambda j: j["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"].update(
        hostNetwork=True), r"Worker.template.spec.hostNetwork cannot be honoured"),
    (lambda j: _launcher(j).update(env=[{"name": "T", "valueFrom": {"secretKeyRef": {}}}]),
     r"env\[0\].valueFrom \(secrets, config maps, fields\) cannot be honoured"),
    (lambda j: _worker(j).update(env=[{"name": "ONLY_WORKER", "value": "1"}]),
     "env ONLY_WORKER differs from the launcher's env"),
    (lambda j: _worker(j)["resources"]["limits"].update(memory="8Gi"),
     r"resources.limits.memory 8Gi is more than its 1 slot\(s\) get \(2048 MiB: "
     r"mpi:limits:memory_per_slot_mb\)"),
    (lambda j: _worker(j)["resources"]["limits"].update(cpu=2),
     r"resources.limits.cpu 2 is more than its 1 slot\(s\) get \(1 CPUs"),
    (lambda j: _worker(j)["resources"]["limits"].update(memory="lots"),
     "is not a Kubernetes memory quantity"),
    (lambda j: _worker(j)["resources"].update(claims=[]), "resources.claims cannot be honoured"),
    (lambda j: j["spec"].update(mpiImplementation="MVAPICH"),
     r"spec.mpiImplementation 'MVAPICH' cannot be honoured: DockerMPI launches OpenMPI, "
     r"Intel, MPICH$"),
    (lambda j: j["spec"].update(mpiImplementation=["Intel"]),
     r"spec.mpiImplementation \['Intel'\] cannot be honoured"),
    (lambda j: j["spec"].update(mpiImplementation="MPICH"),
     r"^mpijob spec.mpiImplementation MPICH: image 'pi' has not been probed by a node yet"),
    (lambda j: _launcher(j).update(readinessProbe={"tcpSocket": {"port": 2222}}),
     r"Launcher.template.spec.containers\[0\].readinessProbe cannot be honoured"),
    (lambda j: j["spec"]["runPolicy"].update(backoffLimit=6),
     "backoffLimit 6 cannot be honoured: DockerMPI does not restart a failed job"),
    (lambda j: j["spec"]["runPolicy"].update(suspend=True), "suspend: true cannot be honoured"),
    (lambda j: j["spec"]["runPolicy"].update(schedulingPolicy={"queue": "q"}),
     "spec.runPolicy.schedulingPolicy cannot be honoured"),
    (lambda j: j["spec"].update(slotsPerWorker=0), "spec.slotsPerWorker must be a whole number"),
    (lambda j: j["spec"]["mpiReplicaSpecs"]["Worker"].update(replicas=-1),
     "Worker.replicas must be a whole number"),
    (lambda j: j["spec"]["mpiReplicaSpecs"].pop("Worker"), "needs a Launcher and a Worker"),
    (lambda j: j.update(kind="TFJob"), "mpijob must be a kind: MPIJob"),
    (lambda j: _launcher(j).update(workingDir="/home/mpiuser"),
     "workingDir '/home/mpiuser' cannot be honoured"),
])
def test_what_cannot_be_honoured_is_refused_by_name(change, message):
    with pytest.raises(RequestError, match=message):
        mpijob.to_request(_changed(change), APPROVED, LIMITS, image="pi")


def test_v1_takes_the_main_container():
    def change(job):
        job["apiVersion"] = "kubeflow.org/v1"
        job["spec"]["mainContainer"] = "mpi-launcher"
        pod = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]
        pod["containers"].insert(0, {"name": "sidecar", "image": "busybox"})
    found = mpijob.to_request(_changed(change), APPROVED, LIMITS, image="pi")
    assert found["cmd"] == ["/home/mpiuser/pi"]


@pytest.mark.parametrize("text, message", [
    ("a: &x [1]\nb: *x\n", "YAML aliases"),
    ("[unclosed", "mpijob is not YAML"),
    ("- 1\n- 2\n", "one MPIJob"),
    ("x: " + "y" * (mpijob.MAX_MANIFEST_BYTES + 1), "larger than 256 KiB"),
    ("!!python/object:os.system {}", "mpijob is not YAML"),
])
def test_hostile_manifests_are_refused(text, message):
    with pytest.raises(RequestError, match=message):
        mpijob.to_request(text, APPROVED, LIMITS, image="pi")


_LEAF = st.one_of(st.none(), st.booleans(), st.integers(-3, 10), st.text(max_size=12),
                  st.sampled_from(["mpirun", "-n", "2", "Worker", "Launcher", "1Gi", "500m"]))
_DATA = st.recursive(_LEAF, lambda inner: st.one_of(
    st.lists(inner, max_size=4),
    st.dictionaries(st.sampled_from(["spec", "mpiReplicaSpecs", "Launcher", "Worker",
                                     "template", "containers", "command", "args", "env",
                                     "resources", "limits", "replicas", "slotsPerWorker",
                                     "image", "name", "value", "runPolicy", "x"]),
                    inner, max_size=4)), max_leaves=30)


@settings(max_examples=300, deadline=None)
@given(_DATA)
def test_any_manifest_maps_or_is_refused_with_a_reason(spec):
    job = {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "spec": spec}
    for changed in (job, _changed(lambda j: j["spec"]["mpiReplicaSpecs"].update(Worker=spec))):
        try:
            found = mpijob.to_request(changed, APPROVED, LIMITS, image="pi")
        except RequestError as exc:
            assert str(exc) and "\n" not in str(exc)
        else:
            assert found["image"] == "pi" and found["np"] >= 1
