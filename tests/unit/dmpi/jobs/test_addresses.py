"""Unit tests of ``dmpi.jobs.addresses``: the job address pool."""

import ipaddress

import pytest

from dmpi.jobs import addresses


@pytest.mark.parametrize("cidr", ["10.0.1.128/29", "10.0.1.5/32", "10.0.1.4/31", "10.0.0.0/30",
                                  "10.128.0.0/12"])
def test_the_address_pool_is_the_networks_hosts(cidr):
    hosts = [str(a) for a in ipaddress.ip_network(cidr).hosts()]
    picked, _ = addresses.pick(cidr, 0, min(len(hosts), 300), set())
    assert picked == hosts[:300]


def test_addresses_go_round_skip_taken_ones_and_run_out():
    pick = addresses.pick
    cidr = "10.0.1.128/29"  # .129 - .134
    assert pick(cidr, 5, 3, {"10.0.1.134", "10.0.1.129"}) == (
        ["10.0.1.130", "10.0.1.131", "10.0.1.132"], 4)
    assert pick(cidr, 4, 2, set()) == (["10.0.1.133", "10.0.1.134"], 0)
    assert pick(cidr, 0, 6, {"10.0.1.134"}) == (None, 0)
    assert pick("10.0.1.5/32", 0, 1, set()) == (["10.0.1.5"], 0)
