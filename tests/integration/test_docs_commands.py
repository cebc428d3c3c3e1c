"""Every command block of README.md and docs/ runs, as written, where its mark says
(tests/docblocks.py): on the test cluster's master as an admin, in a hub user's notebook
on the test cluster, or on this machine. Blocks marked ``run by`` name the tests or CI
step that run them; docs/install.md is followed on bare hosts by tests/guide.
"""

import pathlib
import subprocess
import tempfile

import pytest

from tests import docblocks
from tests.cluster.testcluster import FILES, REPO

pytestmark = pytest.mark.cluster

PLACES = {"cluster master", "cluster notebook", "this machine"}
DOCUMENTS = [REPO / "README.md",
             *sorted(p for p in (REPO / "docs").glob("*.md") if p.name != "install.md")]
NOTEBOOK_USER = "docs-reader"  # the hub user whose notebook runs the users' blocks
PI = (FILES / "pi.py").read_text()


def _blocks():
    found = []
    for document in DOCUMENTS:
        found += docblocks.blocks(document.read_text(encoding="utf-8"),
                                  str(document.relative_to(REPO)), PLACES)
    return found


BLOCKS = _blocks()
RUN_HERE = [b for b in BLOCKS if b.kind == "on"]


def test_every_block_says_where_it_runs_and_the_tests_it_names_exist():
    assert {b.where for b in RUN_HERE} == PLACES
    for block in BLOCKS:
        assert block.kind != "site values", f"{block.path}:{block.line}"
        if block.kind == "by":
            for path in block.where.split(","):
                assert (REPO / path.strip()).is_file(), f"{block.path}:{block.line}: {path}"
    # The README's first commands: CI's is the test command, and the cluster the tests
    # use is built by the demo command.
    assert "exec tests/run" in (REPO / ".ci" / "run").read_text()
    assert '("down", "demo")' in (REPO / "tests" / "conftest.py").read_text()


@pytest.fixture(scope="module")
def notebook(cluster):
    """The hub user's notebook server, with the program the blocks name in /data."""
    cluster.start_notebook(NOTEBOOK_USER)
    code, output = cluster.notebook_exec(
        NOTEBOOK_USER, ["python3", "-c", f"open('/data/pi.py', 'w').write({PI!r})"])
    assert code == 0, output
    yield NOTEBOOK_USER
    cluster.stop_notebook(NOTEBOOK_USER)


@pytest.fixture(scope="module")
def admins_user(cluster):
    """The user the admins' blocks name, with ``/data/pi.py`` written as their uid."""
    path = cluster.account("alice")["dir"] + "/pi.py"
    cluster.as_user("alice", ["python3", "-c", f"open({path!r}, 'w').write({PI!r})"])
    return "alice"


@pytest.mark.parametrize("block", RUN_HERE, ids=[f"{b.path}:{b.line}" for b in RUN_HERE])
def test_a_documented_command_block_runs_as_written(block, cluster, request):
    script = "set -euo pipefail\n" + block.text
    if block.where == "this machine":
        with tempfile.TemporaryDirectory() as scratch:
            done = subprocess.run(["bash", "-c", script], cwd=scratch, capture_output=True,
                                  text=True, timeout=120, check=False)
            code, output = done.returncode, done.stdout + done.stderr
            made = sorted(p.name for p in pathlib.Path(scratch).iterdir())
        assert code == 0, output
        assert made, f"{block.path}:{block.line} made nothing"
        return
    if block.where == "cluster notebook":
        user = request.getfixturevalue("notebook")
        code, output = cluster.notebook_exec(user, ["bash", "-c", script])
    else:
        request.getfixturevalue("admins_user")
        try:
            code, output = cluster.exec("master", ["bash", "-c", script], check=False)
        finally:
            # A block that drains a node leaves it to the admin; the cluster's next
            # tests need every node.
            for node in cluster.nodes:
                cluster.salt(["salt-run", "mpi.resume", node], check=False)
    assert code == 0, f"{block.path}:{block.line} exited {code}:\n{output[-4000:]}"
    if "mpi.launch" in block.text:
        assert '"state": "succeeded"' in output, output[-4000:]
    if block.where == "cluster notebook" and "pi.py" in block.text:
        assert "pi ~= 3.14159" in output, output[-4000:]
