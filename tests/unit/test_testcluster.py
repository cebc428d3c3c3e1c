"""Unit tests of the test cluster tool's own checks (no Docker engine needed)."""

import types

import pytest

from tests.cluster import testcluster
from tests.cluster.testcluster import REPO, ClusterError

# Not imported by name: pytest would take a class called Test... for tests.
_check_same_checkout = testcluster.TestCluster._check_same_checkout


def _host(name, mounts):
    return types.SimpleNamespace(name=name, attrs={"Mounts": [
        {"Destination": dest, "Source": source} for dest, source in mounts.items()]})


def _wanted():
    return {str(REPO / "salt"): {"bind": "/srv/salt", "mode": "ro"},
            "dmpi-master-pki": {"bind": "/etc/salt/pki", "mode": "rw"}}


def test_a_host_of_this_checkout_is_reused():
    _check_same_checkout(
        _host("dmpi-master", {"/srv/salt": str(REPO / "salt"),
                              "/etc/salt/pki": "/var/lib/docker/volumes/dmpi-master-pki/_data"}),
        _wanted())


def test_a_host_built_from_another_checkout_is_refused_with_the_fix():
    with pytest.raises(ClusterError) as raised:
        _check_same_checkout(
            _host("dmpi-master", {"/srv/salt": "/old/checkout/salt"}), _wanted())
    message = str(raised.value)
    assert "dmpi-master" in message and "/old/checkout/salt" in message
    assert "dmpi-cluster down" in message and str(testcluster.REPO) in message
