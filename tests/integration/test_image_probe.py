"""The image probe (:mod:`dmpi.node.imagefacts`) on a real Docker engine (this machine's,
which builds the test cluster's images): what it finds in DockerMPI's job image and in
images that hold no MPI, no shell, a launcher that hangs or floods; that it runs with no
network, as nobody, and leaves no container behind. (On the cluster's nodes, through
highstate and ``mpi.images``: test_operations.py.)

Run on the real cluster only: ``tests/run tests/integration/test_image_probe.py``.
"""

import base64
import io
import tarfile
import uuid

import pytest

from dmpi.contract import LABEL_ROLE, PROBE_ROLE
from dmpi.errors import NodeError
from dmpi.launch import probe
from dmpi.node import imagefacts

pytestmark = pytest.mark.cluster


@pytest.fixture
def engine(cluster):
    return cluster.docker


@pytest.fixture
def built(engine):
    """Build a small image from a Dockerfile text; every one is removed after the test."""
    tags = []

    def build(dockerfile):
        tag = f"dmpi-probe-test:{uuid.uuid4().hex[:12]}"
        engine.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True,
                            network_mode="none")
        tags.append(tag)
        return tag

    yield build
    for tag in tags:
        engine.images.remove(tag, force=True)


def _with_mpirun(script):
    """A Dockerfile: the base image with ``script`` as /usr/local/bin/mpirun."""
    encoded = base64.b64encode(script.encode()).decode()
    return ("FROM dockermpi/debian:bookworm\n"
            f"RUN echo {encoded} | base64 -d > /usr/local/bin/mpirun "
            "&& chmod 755 /usr/local/bin/mpirun\n")


def _no_probe_left(engine):
    return engine.containers.list(all=True, filters={"label": f"{LABEL_ROLE}={PROBE_ROLE}"})


def test_the_job_image_holds_open_mpi_4_with_mpi4py_and_no_sshd(cluster, engine):
    facts = imagefacts.run_probe(cluster.mpi_image(), engine)
    assert facts["problem"] is None and facts["complete"] is True
    assert facts["mpi"]["flavour"] == "openmpi4" and facts["mpi"]["launcher"] == "/usr/bin/mpirun"
    assert "sshd" not in facts["commands"]  # the node brings its own
    assert facts["mpi4py"] and facts["mpi4py_library"].startswith("Open MPI v4")
    assert facts["workdir"] == "/data"
    assert probe.why_no_jobs(facts) is None
    assert _no_probe_left(engine) == []


def test_the_probe_runs_as_nobody_without_network_on_a_read_only_root(built, engine):
    # An image whose "mpirun" reports what it can do in the probe's container.
    tag = built(_with_mpirun(
        "#!/bin/sh\n"
        "echo \"mpirun (Open MPI) 4.1.9 uid=$(id -u) net=$(ls /sys/class/net | tr '\\n' ,)"
        " write=$(touch /probe-was-here 2>/dev/null && echo yes || echo no)\"\n"))
    facts = imagefacts.run_probe(tag, engine)
    assert facts["mpi"] == {"flavour": "openmpi4", "version": "4.1.9",
                            "launcher": "/usr/local/bin/mpirun", "device": None}
    answer = _raw_answer(engine, tag)
    assert "uid=65534 net=lo, write=no" in answer
    assert _no_probe_left(engine) == []


def _raw_answer(engine, tag):
    """The launcher_version section the probe gets from ``tag`` (run as the probe runs)."""
    options = imagefacts._options(tag)  # pylint: disable=protected-access
    container = engine.containers.create(**options)
    try:
        container.start()
        container.wait(timeout=60)
        return container.logs(stdout=True, stderr=False).decode()
    finally:
        container.remove(force=True)


def test_an_image_without_mpi(engine):
    facts = imagefacts.run_probe("dockermpi/debian:bookworm", engine)
    assert facts["problem"] is None and facts["mpi"] is None
    assert facts["glibc"] == "2.36"
    assert probe.why_no_jobs(facts) == "it has no MPI launcher (mpirun or mpiexec) on its PATH"


def test_an_image_without_a_shell_is_said_so(engine):
    # One file, no /bin/sh: neither the probe nor a job's commands can run.
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        info = tarfile.TarInfo("hello.txt")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    tag = f"dmpi-probe-test:{uuid.uuid4().hex[:12]}"
    engine.api.import_image_from_data(data.getvalue(), repository=tag.split(":")[0],
                                      tag=tag.split(":")[1])
    try:
        facts = imagefacts.run_probe(tag, engine)
        assert facts["problem"].startswith("the probe could not run in the image (is there a "
                                           "/bin/sh?)"), facts
        assert probe.why_no_jobs(facts) == facts["problem"]
        assert _no_probe_left(engine) == []
    finally:
        engine.images.remove(tag, force=True)


def test_a_launcher_that_hangs_ends_the_probe(built, engine, monkeypatch):
    tag = built(_with_mpirun("#!/bin/sh\nexec sleep 3600\n"))
    monkeypatch.setattr(imagefacts, "PROBE_SECONDS", 3)
    facts = imagefacts.run_probe(tag, engine)
    assert facts["problem"] == "the probe did not finish within 3 s"
    assert facts["mpi"]["launcher"] == "/usr/local/bin/mpirun" and facts["mpi"]["flavour"] is None
    assert _no_probe_left(engine) == []


def test_a_launcher_that_floods_is_read_bounded(built, engine):
    tag = built(_with_mpirun("#!/bin/sh\necho 'mpirun (Open MPI) 4.1.4'\n"
                             "head -c 5000000 /dev/zero | tr '\\0' x\n"))
    facts = imagefacts.run_probe(tag, engine)
    assert facts["mpi"]["flavour"] == "openmpi4"
    assert facts["complete"] is False  # the end marker was beyond what is read
    assert facts["problem"] == "the probe (a /bin/sh script) did not run to its end"
    assert _no_probe_left(engine) == []


def test_an_image_not_here_is_a_node_error(engine):
    with pytest.raises(NodeError, match="is not on this node"):
        imagefacts.run_probe("10.251.1.2:5000/dockermpi/none@sha256:" + "0" * 64, engine)
    with pytest.raises(NodeError, match="cannot inspect image"):
        imagefacts.run_probe("mpi; rm -rf /", engine)
