"""Shared fixtures: the real test cluster (tests/cluster), brought up once per session.

A session that needs a fresh cluster starts building it as soon as its tests are
collected, in a child process logging to ``CLUSTER_BUILD_LOG``; the unit and functional
tests (before the integration tests in ``testpaths``) run meanwhile and the first
integration test waits for it. Once it is built, the test images of the flavour and MPI
Operator tests (tests/cluster/testimages.py), the Vagrant cycle (tests/vagrant) and then
the install guide (tests/guide), each at a low CPU weight, run in the
background while the integration tests run; the tests that need them wait for them
(tests/background.py), or find the images built.
"""

import os
import subprocess
import tempfile
import threading

import pytest

from tests.cluster.testcluster import TestCluster

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLUSTER_BUILD_LOG = os.path.join(tempfile.gettempdir(), "dmpi-cluster-build.log")
_build = {}


def pytest_addoption(parser):
    parser.addoption(
        "--reuse-cluster",
        action="store_true",
        default=os.environ.get("DMPI_REUSE_CLUSTER") == "1",
        help="use the running test cluster as it is (only resync modules and pillar); "
        "without it the cluster is rebuilt from scratch so provisioning is tested fresh",
    )


def _test_cluster():
    return TestCluster(nodes=int(os.environ.get("DMPI_NODES", "3")))


def _rebuild_cluster(nodes):
    """``dmpi-cluster down`` then ``demo`` (the README's first command: the cluster up
    and an MPI job through ``salt-run mpi.launch``), output to the log. Whatever goes
    wrong is recorded, so no test runs on a cluster this session did not build."""
    tool = os.path.join(REPO, "tests", "cluster", "dmpi-cluster")
    try:
        with open(CLUSTER_BUILD_LOG, "w", encoding="utf-8") as log:
            for command in ("down", "demo"):
                done = subprocess.run([tool, "--nodes", str(nodes), command], cwd=REPO,
                                      stdout=log, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, check=False)
                if done.returncode != 0:
                    _build["error"] = f"dmpi-cluster {command} exited {done.returncode}"
                    return
        _build["built"] = True
    except Exception as exc:  # pylint: disable=broad-except
        _build["error"] = f"the cluster build failed: {type(exc).__name__}: {exc}"
        raise


def _start_cluster_build(config):
    if _build:
        return
    testcluster = _test_cluster()
    if config.getoption("--reuse-cluster") and testcluster.is_up():
        _build["reuse"] = True
        return
    thread = threading.Thread(target=_rebuild_cluster, args=(testcluster.node_count,),
                              name="cluster-build", daemon=True)
    _build["thread"] = thread
    thread.start()


def pytest_collection_finish(session):
    if session.config.option.collectonly:  # listing tests must not rebuild the cluster
        return
    # By the marker every integration module carries: a test's argument that happens to
    # be named "cluster" must not tear the cluster down.
    if any(item.get_closest_marker("cluster") for item in session.items):
        _start_cluster_build(session.config)
        if "thread" in _build:
            _start_beside_integration_tests(session.items)


def _start_beside_integration_tests(items):
    """The flavour and MPI Operator tests' images (tests/cluster/testimages.py), the
    Vagrant cycle, then the install guide, in the background once the cluster is built,
    when this session runs tests that need them (the last two after the integration
    tests in ``testpaths``): one at a time, so the integration tests share the machine
    with one."""
    names = {item.name for item in items}
    wanted = []
    if any({"flavour_images", "pi_images"} & set(getattr(item, "fixturenames", ()))
           for item in items):
        from tests.cluster.testimages import PREBUILD
        wanted.append(PREBUILD)
    if "test_vagrant_up_runs_a_job_over_every_node_and_destroy_leaves_nothing" in names:
        from tests.vagrant.test_vagrant import VAGRANT_CYCLE
        wanted.append(VAGRANT_CYCLE)
    if any("followed" in getattr(item, "fixturenames", ()) for item in items):
        from tests.guide.guide import FOLLOWER
        wanted.append(FOLLOWER)
    after = _build["thread"]
    for part in wanted:
        part.start(after=after)
        after = part.thread


@pytest.fixture(scope="session")
def cluster(request):
    """The running test cluster; integration tests only."""
    testcluster = _test_cluster()
    _start_cluster_build(request.config)
    if _build.get("reuse"):
        testcluster.sync_and_highstate()
        return testcluster
    _build["thread"].join()
    if "built" not in _build:
        _build.setdefault("error", "the cluster build ended without building it")
    if "error" in _build:
        with open(CLUSTER_BUILD_LOG, encoding="utf-8", errors="replace") as log:
            tail = log.read()[-4000:]
        pytest.fail(f"the test cluster was not built ({_build['error']}); the end of "
                    f"{CLUSTER_BUILD_LOG}:\n{tail}", pytrace=False)
    return testcluster


def pytest_sessionfinish(session, exitstatus):
    """Close Salt's deferred console log handler while pytest's capture is still open;
    left to atexit, it flushes into the closed capture and prints a logging error."""
    import salt._logging.impl

    salt._logging.impl.shutdown_temp_handler()
