"""
Unit tests for :mod:`dmpi.launch.probe`: reading what the image probe answered, and
whether jobs can run on the image.

The answers under ``data/probe/`` are real: the probe script run as nobody with no
network in ``openmpi4-debian12`` DockerMPI's job image (images/mpi: Debian bookworm's
openmpi-bin 4.1.4, python3-mpi4py), ``mpich-debian12`` bookworm with Debian's mpich
4.0.2 and python3 (no mpi4py), ``plain-debian12`` DockerMPI's bookworm base image.
"""

import pathlib
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dmpi.launch import probe

DATA = pathlib.Path(__file__).resolve().parent / "data" / "probe"


def _answer(name):
    return (DATA / f"{name}.txt").read_bytes()


def test_open_mpi_4_image():
    facts = probe.parse(_answer("openmpi4-debian12"))
    assert facts["mpi"] == {"flavour": "openmpi4", "version": "4.1.4",
                            "launcher": "/usr/bin/mpirun", "device": None}
    assert facts["os"] == "Debian GNU/Linux 12 (bookworm)"
    assert facts["glibc"] == "2.36"
    assert facts["commands"] == {"mpirun": "/usr/bin/mpirun", "mpiexec": "/usr/bin/mpiexec",
                                 "sshd": "/usr/sbin/sshd"}
    assert facts["python3"] == "/usr/bin/python3"
    assert facts["python_version"] == "3.11.2"
    assert facts["mpi4py"] == "3.1.4"
    assert facts["mpi4py_library"].startswith("Open MPI v4.1.4, package: Debian OpenMPI")
    assert facts["mpi4py_library"].endswith("2022")  # the C string's NUL is not kept
    assert facts["complete"] is True
    assert probe.why_no_jobs(facts) is None
    assert probe.describe(facts) == "Open MPI 4.1.4 (/usr/bin/mpirun), mpi4py 3.1.4"


def test_mpich_image_is_known_and_runs_jobs():
    facts = probe.parse(_answer("mpich-debian12"))
    assert facts["mpi"] == {"flavour": "mpich", "version": "4.0.2",
                            "launcher": "/usr/bin/mpirun", "device": "ch4:ucx"}
    assert facts["commands"]["mpiexec.hydra"] == "/usr/bin/mpiexec.hydra"
    assert facts["mpi4py"] is None
    assert facts["mpi4py_error"] == "ModuleNotFoundError No module named 'mpi4py'"
    assert probe.why_no_jobs(facts) is None
    assert probe.launch_of(facts)["flavour"] == "mpich"
    assert probe.why_one_node_only(facts).startswith("its MPICH 4.0.2 (ch4:ucx) can hang")


@pytest.mark.parametrize("version, device, one_node", [
    ("4.0.2", "ch4:ucx", True), ("4.1.3", "ch4:ucx,ofi", True), ("4.2.0", "ch4:ucx", False),
    ("5.0.2", "ch4:ucx,ofi", False), ("4.0.2", "ch4:ofi", False), ("3.3a2", "ch3:nemesis", False),
    ("4.0.2", None, False), (None, "ch4:ucx", False)])
def test_only_an_mpich_before_4_2_on_ucx_keeps_its_jobs_to_one_node(version, device, one_node):
    facts = {"mpi": {"flavour": "mpich", "version": version, "device": device,
                     "launcher": "/usr/bin/mpirun"}}
    assert (probe.why_one_node_only(facts) is not None) is one_node
    assert probe.why_one_node_only(dict(facts, mpi=dict(facts["mpi"], flavour="openmpi4"))) \
        is None


def test_hydra_names_the_devices_mpich_was_built_with():
    assert probe.hydra_device(["    Configure options:   '--prefix=/usr' "
                               "'--with-device=ch4:ucx,ofi' 'CFLAGS=-O2'"]) == "ch4:ucx,ofi"
    assert probe.hydra_device(["    Version:      4.0.2"]) is None


def test_an_mpi_it_cannot_launch_is_refused_with_the_reason():
    facts = dict(probe.parse(_answer("mpich-debian12")),
                 mpi={"flavour": "openmpi", "version": "3.1.6",
                      "launcher": "/opt/ompi3/bin/mpirun"})
    assert probe.why_no_jobs(facts) == (
        "it holds Open MPI 3.1.6 (/opt/ompi3/bin/mpirun); DockerMPI launches jobs "
        "of Open MPI 4, Open MPI 5, MPICH (Hydra), Intel MPI images")


def test_image_without_mpi():
    facts = probe.parse(_answer("plain-debian12"))
    assert facts["mpi"] is None
    assert facts["python3"] is None
    assert facts["glibc"] == "2.36"
    assert facts["complete"] is True
    assert probe.why_no_jobs(facts) == "it has no MPI launcher (mpirun or mpiexec) on its PATH"


def test_open_mpi_without_sshd_runs_jobs():
    # The node brings its own sshd and ssh (dmpi.node.agent).
    text = _answer("openmpi4-debian12").replace(b"@@ command sshd\n/usr/sbin/sshd\n", b"")
    facts = probe.parse(text)
    assert "sshd" not in facts["commands"]
    assert probe.why_no_jobs(facts) is None


def test_a_probe_that_did_not_finish_is_incomplete():
    text = _answer("openmpi4-debian12").split(b"@@ python3")[0]
    facts = probe.parse(text)
    assert facts["complete"] is False
    assert facts["mpi"]["flavour"] == "openmpi4"


def test_open_mpi_5_and_intel_version_lines():
    # The first lines of `mpirun --version` as Open MPI 5.0 and Intel MPI 2021 print them.
    assert probe.mpi_of(["mpirun (Open MPI) 5.0.3", "", "Report bugs to ..."]) == \
        ("openmpi5", "5.0.3")
    assert probe.mpi_of(["Intel(R) MPI Library for Linux* OS, Version 2021.13 Build "
                         "20240701 (id: 8f9b9a5)"]) == ("intelmpi", "2021.13")
    assert probe.mpi_of(["something else 1.0"]) == (None, None)


def test_hostile_answers_are_bounded_and_printable():
    hostile = (b"junk before\n@@ launcher\n/usr/bin/mpirun; rm -rf /\n@@ os\nPRETTY_NAME=\"\x1b[31m"
               + b"A" * 5000 + b"\"\n@@ command sshd\n../../etc/passwd\n@@ unknown\nx\n"
               + b"@@ python\nmpi4py " + b"\xff" * 300 + b"\n" + b"x\n" * 200000)
    facts = probe.parse(hostile)
    assert facts["mpi"] is None  # not a path
    assert "sshd" not in facts["commands"]
    assert len(facts["os"]) == probe.MAX_FACT_CHARS and "\x1b" not in facts["os"]
    assert facts["mpi4py"] and len(facts["mpi4py"]) <= probe.MAX_FACT_CHARS


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=4000))
def test_any_answer_parses(answer):
    facts = probe.parse(b"@@ launcher_version\n" + answer)
    for value in (facts["os"], facts["glibc"], facts["path"], facts["mpi4py"]):
        assert value is None or (isinstance(value, str) and len(value) <= probe.MAX_FACT_CHARS)
    assert isinstance(probe.describe(facts), str)


def test_the_probe_script_is_posix_sh():
    # dash is Debian's /bin/sh: no bash-only syntax may slip in.
    result = subprocess.run(["dash", "-n", "-c", probe.PROBE_SCRIPT], capture_output=True,
                            text=True, check=False)
    assert result.returncode == 0, result.stderr


def test_a_launch_takes_the_probed_launcher_and_the_images_environment():
    facts = dict(probe.parse(_answer("openmpi4-debian12")),
                 env_names=["PATH", "LD_LIBRARY_PATH", "VIRTUAL_ENV", "HOME", "USER",
                            "OMPI_MCA_plm_rsh_agent", "PRTE_MCA_x", "DMPI_JOB_ID", "LANG"])
    assert probe.launch_of(facts) == {
        "flavour": "openmpi4", "launcher": "/usr/bin/mpirun",
        "image_env": ["LANG", "LD_LIBRARY_PATH", "PATH", "VIRTUAL_ENV"]}
    # Not probed (yet): Open MPI 4's mpirun on the launcher's PATH, and that PATH for
    # every rank.
    assert probe.launch_of(None) == {"flavour": "openmpi4", "launcher": "mpirun",
                                     "image_env": ["PATH"]}
