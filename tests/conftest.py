"""Shared fixtures: the real test cluster (tests/cluster), brought up once per session,
and the install guide followed on its own bare hosts (tests/guide).

A session that needs a fresh cluster starts building it as soon as its tests are
collected, in a child process logging to ``CLUSTER_BUILD_LOG``; the unit, functional and
Vagrant tests (before the integration tests in ``testpaths``) run meanwhile and the
first integration test waits for it. A session with the guide's tests starts following
the guide at the same moment (log: ``GUIDE_LOG``): most of its six minutes are waits on
package downloads and highstates, which overlap the rest of the session, and its tests
(last in ``testpaths``) check what it left.
"""

import os
import subprocess
import tempfile
import threading
import time

import pytest

from tests.cluster.testcluster import TestCluster

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLUSTER_BUILD_LOG = os.path.join(tempfile.gettempdir(), "dmpi-cluster-build.log")
GUIDE_LOG = os.path.join(tempfile.gettempdir(), "dmpi-guide.log")
_build = {}
_guide = {}


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
    # Only when the guide's hosts are used: its two checks of the text alone need none.
    if any("followed" in getattr(item, "fixturenames", ()) for item in session.items):
        start_following_guide()


def _follow_guide():
    """The guide's hosts up from nothing and every block of the guide run on them;
    records the hosts, then ``ran`` ({line: (block, {host: output})}) or ``error``."""
    from tests.guide.guide import GuideHosts  # pylint: disable=import-outside-toplevel

    with open(GUIDE_LOG, "w", encoding="utf-8") as log:
        def say(message):
            log.write(f"[guide {time.strftime('%H:%M:%S')}] {message}\n")
            log.flush()

        hosts = GuideHosts(log=say)
        _guide["hosts"] = hosts
        try:
            hosts.down()  # what a failed earlier run left (labelled: the guide's own hosts)
            hosts.up()
            _guide["ran"] = {block.line: (block, outputs) for block, outputs in hosts.run()}
        except Exception as exc:  # pylint: disable=broad-except
            _guide["error"] = f"{type(exc).__name__}: {exc}"


def start_following_guide():
    """Start :func:`_follow_guide` in a thread, once per session."""
    if not _guide:
        _guide["thread"] = threading.Thread(target=_follow_guide, name="guide", daemon=True)
        _guide["thread"].start()


def followed_guide():
    """(hosts, {line: (block, {host: output})}) once the guide has been followed; fails
    the test with the log's end when it could not be."""
    start_following_guide()
    _guide["thread"].join()
    if "error" in _guide:
        with open(GUIDE_LOG, encoding="utf-8", errors="replace") as log:
            tail = log.read()[-3000:]
        pytest.fail(f"following the guide failed: {_guide['error'][-6000:]}\nthe end of "
                    f"{GUIDE_LOG}:\n{tail}", pytrace=False)
    return _guide["hosts"], _guide["ran"]


def guide_hosts():
    """The guide's hosts, when this session brought them up (to remove them)."""
    return _guide.get("hosts")


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
