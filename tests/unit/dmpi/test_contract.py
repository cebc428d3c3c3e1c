"""The master/node contract (``dmpi.contract``): one definition every side imports."""

import pathlib

import pytest
import yaml

from dmpi import contract

REPO = pathlib.Path(__file__).resolve().parents[3]
DEFAULTS = yaml.safe_load((REPO / "salt/dockermpi/defaults.yaml").read_text())["mpi"]
JOB = "20261130-132321-b26398"


def test_paths_states_and_tags():
    assert contract.DATA_MOUNT == "/data"
    assert contract.JOBS_SUBDIR == "mpi-jobs"
    assert contract.STATES == (
        "queued", "starting", "running", "succeeded", "failed", "cancelled", "timed_out")
    assert contract.DEFAULT_JOB_ROOT == DEFAULTS["job_root"]
    assert contract.job_tag("J", "queued") == "mpi/job/J/queued"
    assert contract.job_tag(JOB, "running").startswith(contract.JOB_TAG_PREFIX)
    assert contract.JOB_TAG_RE.match(contract.job_tag(JOB, "timed_out")).groups() == (
        JOB, "timed_out")
    assert contract.NODE_TAG_RE.match(contract.NODE_TAG_PREFIX.format(node="n1") + "report")
    assert not contract.JOB_TAG_RE.match(f"mpi/job/{JOB}/running/x")
    assert contract.NETNS_RE.match(contract.NETNS_NAME.format(job_id=JOB)).group(1) == JOB


@pytest.mark.parametrize("value,ok", [
    (JOB, True), ("20261130-132321-B26398", False), (JOB + "\n", False),
    ("2026113-132321-b26398", False), ("../" + JOB, False), (20261130, False), (None, False),
])
def test_is_job_id(value, ok):
    assert contract.is_job_id(value) is ok


@pytest.mark.parametrize("value,ok", [
    ("alice", True), ("Bob_2-x", True), ("a" * 64, True), ("a" * 65, False),
    ("-alice", False), ("al ice", False), ("alice\n", False), ("../x", False), ("", False),
    (7, False),
])
def test_is_user(value, ok):
    assert contract.is_user(value) is ok


def test_container_name():
    assert contract.container_name(JOB, "worker") == f"dmpi-{JOB}-worker"
    assert contract.container_name(JOB, "launcher") == f"dmpi-{JOB}-launcher"
    with pytest.raises(ValueError, match="is not a job id"):
        contract.container_name("x; rm -rf /", "worker")
    with pytest.raises(ValueError, match="role must be one of worker, launcher"):
        contract.container_name(JOB, "sidecar")


def test_image_references_are_pinned_by_digest_only():
    digest = "sha256:" + "a" * 64
    assert contract.IMAGE_REFERENCE_RE.match(f"registry.example:5000/dockermpi/mpi@{digest}")
    for bad in (f"mpi:latest@{digest}", "mpi:latest", f"mpi@{digest}\n", f"MPI@{digest}"):
        assert not contract.IMAGE_REFERENCE_RE.match(bad), bad


CONTRACT_FILE = "_utils/dmpi/contract.py"
USERFS_FILE = "_utils/dmpi/node/userfs.py"


def test_no_module_outside_the_package_writes_the_contract_out_again():
    """What the contract names is spelled once: no module but the contract spells a
    literal of it (but dmpi.node.userfs, whose source is the confined child's whole program: it may import
    nothing of the package, and its one copy is held equal below)."""
    literals = ['"io.dockermpi.job"', '"io.dockermpi.role"', '"io.dockermpi.user"',
                '"mpi-jobs"', '"/run/dockermpi"', r'[0-9]{8}-[0-9]{6}-[0-9a-f]{6}',
                '("succeeded", "failed", "cancelled", "timed_out")', '"mpi/nodes/changed"']
    found = []
    for folder in ("_modules", "_states", "_runners", "_engines", "_utils"):
        for path in sorted((REPO / folder).rglob("*.py")):
            if path.relative_to(REPO).as_posix() in (CONTRACT_FILE, USERFS_FILE):
                continue
            text = path.read_text()
            found += [f"{path.relative_to(REPO)}: {literal}" for literal in literals
                      if literal in text]
    assert found == []


def test_the_confined_childs_job_id_pattern_is_the_contracts():
    from dmpi.node import userfs  # pylint: disable=import-outside-toplevel

    assert userfs._JOB_DIR_RE.pattern == contract.JOB_ID_RE.pattern
