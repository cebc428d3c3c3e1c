"""Shared fixtures: the real test cluster (tests/cluster), brought up once per session."""

import os

import pytest

from tests.cluster.testcluster import TestCluster


def pytest_addoption(parser):
    parser.addoption(
        "--reuse-cluster",
        action="store_true",
        default=os.environ.get("DMPI_REUSE_CLUSTER") == "1",
        help="use the running test cluster as it is (only resync modules and pillar); "
        "without it the cluster is rebuilt from scratch so provisioning is tested fresh",
    )


@pytest.fixture(scope="session")
def cluster(request):
    """The running test cluster; integration tests only."""
    testcluster = TestCluster(nodes=int(os.environ.get("DMPI_NODES", "3")))
    if request.config.getoption("--reuse-cluster") and testcluster.is_up():
        testcluster.sync_and_highstate()
    else:
        testcluster.down()
        testcluster.up()
    return testcluster


def pytest_sessionfinish(session, exitstatus):
    """Close Salt's deferred console log handler while pytest's capture is still open;
    left to atexit, it flushes into the closed capture and prints a logging error."""
    import salt._logging.impl

    salt._logging.impl.shutdown_temp_handler()
