"""
Unit tests of the mpi_network execution and state modules.

The Docker engine is replaced by a small in-memory fake of its networks API
(``networks.get/create``, ``Network.remove``) that stores what the module asks
for in the shape ``docker network inspect`` reports, and that, like the real
engine, takes the gateway from the IP range when none is given. So whole
create / compare / replace cycles run without an engine; real macvlan networks
are tested on the cluster.
"""

import ipaddress
from unittest.mock import MagicMock, patch

import docker.errors
import pytest
import requests.exceptions
from salt.exceptions import CommandExecutionError, SaltInvocationError
from tests.extension import load_extension

mpi_network = load_extension("_modules/mpi_network.py", "mpi_network_module")
mpi_network_state = load_extension("_states/mpi_network.py", "mpi_network_state")

NAME = "dmpi-jobs"
SUBNET = "10.251.1.0/24"
POOL = "10.251.1.128/25"
GRAINS = {
    "ip4_interfaces": {
        "lo": ["127.0.0.1"],
        "docker0": ["172.17.0.1"],
        "eth0": ["10.251.1.3"],
    },
    "ip4_gw": "10.251.1.1",
}


def _api_error(msg, status=500, cls=docker.errors.APIError):
    return cls(msg, response=MagicMock(status_code=status), explanation=msg)


class FakeNetwork:
    def __init__(self, engine, attrs):
        self.engine = engine
        self.attrs = attrs

    @property
    def name(self):
        return self.attrs["Name"]

    def remove(self):
        self.engine.calls.append(("remove", self.name))
        if self.engine.fail_remove:
            raise self.engine.fail_remove
        if self.attrs.get("Containers"):
            raise _api_error(f"network {self.name} has active endpoints", 403)
        del self.engine.by_name[self.name]


class FakeNetworks:
    def __init__(self, engine):
        self.engine = engine

    def get(self, name):
        if self.engine.fail_get:
            raise self.engine.fail_get
        for net_name, attrs in self.engine.by_name.items():
            # like the engine: full name, or a prefix of the ID
            if name == net_name or attrs["Id"].startswith(name):
                return FakeNetwork(self.engine, attrs)
        raise _api_error(f"network {name} not found", 404, docker.errors.NotFound)

    def create(self, name, driver=None, options=None, ipam=None, **kwargs):
        self.engine.calls.append(("create", name, driver, options, ipam))
        if self.engine.fail_create:
            raise self.engine.fail_create
        if name in self.engine.by_name:
            raise _api_error(f"network with name {name} already exists", 409)
        pool = dict(ipam["Config"][0])
        if not pool.get("Gateway"):
            # the real engine takes it from the IP range when there is one
            pool["Gateway"] = str(next(ipaddress.ip_network(pool["IPRange"]).hosts()))
        self.engine.add(name, driver, options, pool)
        return FakeNetwork(self.engine, self.engine.by_name[name])


class FakeEngine:
    def __init__(self):
        self.by_name = {}
        self.calls = []
        self.networks = FakeNetworks(self)
        self.fail_get = self.fail_create = self.fail_remove = None

    def ping(self):
        return True

    def add(self, name, driver="macvlan", options=None, pool=None, containers=()):
        self.by_name[name] = {
            "Name": name,
            "Id": "f00d" + format(len(self.by_name), "060x"),
            "Driver": driver,
            "Scope": "local",
            "IPAM": {"Driver": "default", "Options": None, "Config": [pool or {}]},
            "Options": dict(options or {}),
            "Containers": {
                f"{i:064x}": {"Name": cname, "IPv4Address": f"10.251.1.{130 + i}/24"}
                for i, cname in enumerate(containers)
            },
        }

    def created(self):
        return [call for call in self.calls if call[0] == "create"]


def _existing(
    engine,
    name=NAME,
    parent="eth0",
    subnet=SUBNET,
    ip_range=POOL,
    gateway="10.251.1.1",
    driver="macvlan",
    containers=(),
):
    engine.add(
        name,
        driver,
        {"parent": parent},
        {"Subnet": subnet, "IPRange": ip_range, "Gateway": gateway},
        containers,
    )


@pytest.fixture
def engine():
    fake = FakeEngine()
    with patch.object(mpi_network.docker, "from_env", return_value=fake):
        yield fake


@pytest.fixture
def configure_loader_modules():
    state_salt = {
        f"mpi_network.{fun}": getattr(mpi_network, fun)
        for fun in ("inspect", "diff", "present", "absent")
    }
    return {
        mpi_network: {"__grains__": dict(GRAINS)},
        mpi_network_state: {"__salt__": state_salt, "__opts__": {"test": False}},
    }


def test_virtual_says_why_without_docker_sdk():
    with patch.object(mpi_network, "HAS_DOCKER", False):
        ret = mpi_network.__virtual__()
    assert ret[0] is False
    assert "docker Python package" in ret[1]


# parent interface from grains


def test_parent_is_interface_holding_cluster_address():
    assert mpi_network.parent_interface(SUBNET) == "eth0"


def test_no_address_in_cluster_network_names_the_network():
    with patch.dict(mpi_network.__grains__, {"ip4_interfaces": {"eth0": ["192.168.5.3"]}}):
        with pytest.raises(CommandExecutionError, match=r"cluster network 10\.251\.1\.0/24"):
            mpi_network.parent_interface(SUBNET)


def test_two_interfaces_in_cluster_network_is_ambiguous():
    grains = {"ip4_interfaces": {"eth0": ["10.251.1.3"], "eth1": ["10.251.1.4"]}}
    with patch.dict(mpi_network.__grains__, grains):
        with pytest.raises(CommandExecutionError, match="eth0, eth1"):
            mpi_network.parent_interface(SUBNET)


def test_parent_detection_failure_fails_present_before_docker_changes(engine):
    with patch.dict(mpi_network.__grains__, {"ip4_interfaces": {"eth0": ["192.168.5.3"]}}):
        with pytest.raises(CommandExecutionError, match="no interface"):
            mpi_network.present(NAME, SUBNET, POOL)
    assert engine.calls == []


# create / unchanged / replace


def test_present_creates_macvlan_network_with_pool_and_gateway_outside_it(engine):
    ret = mpi_network.present(NAME, SUBNET, POOL)
    assert ret == {
        "created": {
            "driver": "macvlan",
            "parent": "eth0",
            "subnet": SUBNET,
            "ip_range": POOL,
            "gateway": "10.251.1.1",
            "containers": [],
        }
    }
    [(_, name, driver, options, ipam)] = engine.created()
    assert (name, driver, options) == (NAME, "macvlan", {"parent": "eth0"})
    assert ipam["Config"] == [
        {"Subnet": SUBNET, "IPRange": POOL, "Gateway": "10.251.1.1", "AuxiliaryAddresses": None}
    ]


def test_second_present_is_unchanged_and_creates_nothing(engine):
    mpi_network.present(NAME, SUBNET, POOL)
    ret = mpi_network.present(NAME, SUBNET, POOL)
    assert list(ret) == ["unchanged"]
    assert len(engine.created()) == 1
    assert mpi_network.diff(NAME, SUBNET, POOL) == {}


@pytest.mark.parametrize(
    "default_gw,ip_range,gateway",
    [
        ("192.168.0.1", POOL, "10.251.1.1"),  # default route off the cluster network
        (True, POOL, "10.251.1.1"),  # grain without an address
        ("10.251.1.200", POOL, "10.251.1.1"),  # default gateway inside the pool
        ("10.251.1.100", "10.251.1.0/25", "10.251.1.128"),  # pool at the start
        ("10.251.1.200", "10.251.1.0/25", "10.251.1.200"),  # real router, outside pool
    ],
)
def test_gateway_is_never_inside_the_pool(engine, default_gw, ip_range, gateway):
    # the node's own address outside the pool
    node = "10.251.1.3" if ip_range == POOL else "10.251.1.250"
    grains = {"ip4_gw": default_gw, "ip4_interfaces": {"eth0": [node]}}
    with patch.dict(mpi_network.__grains__, grains):
        ret = mpi_network.present(NAME, SUBNET, ip_range)
    assert ret["created"]["gateway"] == gateway


def test_explicit_parent_wins_over_grains(engine):
    ret = mpi_network.present(NAME, SUBNET, POOL, parent="eth1.20")
    assert ret["created"]["parent"] == "eth1.20"
    assert engine.created()[0][3] == {"parent": "eth1.20"}


@pytest.mark.parametrize(
    "existing,changed",
    [
        ({"ip_range": "10.251.1.192/26"}, "ip_range"),
        ({"parent": "eth1"}, "parent"),
        ({"subnet": "10.251.0.0/16"}, "subnet"),
        ({"driver": "bridge"}, "driver"),
        ({"gateway": "10.251.1.128"}, "gateway"),  # docker's own pick, inside the pool
    ],
)
def test_differing_network_without_containers_is_replaced(engine, existing, changed):
    _existing(engine, **existing)
    assert list(mpi_network.diff(NAME, SUBNET, POOL)) == [changed]
    ret = mpi_network.present(NAME, SUBNET, POOL)
    assert ret["replaced"]["old"][changed] != ret["replaced"]["new"][changed]
    assert [call[0] for call in engine.calls] == ["remove", "create"]
    assert mpi_network.diff(NAME, SUBNET, POOL) == {}


def test_other_gateway_outside_pool_is_accepted(engine):
    _existing(engine, gateway="10.251.1.100")
    assert mpi_network.present(NAME, SUBNET, POOL)["unchanged"]["gateway"] == "10.251.1.100"
    assert engine.calls == []


def test_differing_network_held_by_jobs_is_not_replaced(engine):
    _existing(
        engine,
        ip_range="10.251.1.192/26",
        containers=["dmpi-job-7-node1", "dmpi-job-9-node1"],
    )
    with pytest.raises(CommandExecutionError) as exc:
        mpi_network.present(NAME, SUBNET, POOL)
    assert "dmpi-job-7-node1, dmpi-job-9-node1" in str(exc.value)
    assert "ip_range" in str(exc.value)
    assert engine.calls == []
    assert mpi_network.inspect(NAME)["ip_range"] == "10.251.1.192/26"


def test_matching_network_held_by_jobs_is_unchanged(engine):
    _existing(engine, containers=["dmpi-job-7-node1"])
    ret = mpi_network.present(NAME, SUBNET, POOL)
    assert ret["unchanged"]["containers"] == ["dmpi-job-7-node1"]


def test_diff_of_missing_network_shows_what_would_be_created(engine):
    assert mpi_network.diff(NAME, SUBNET, POOL) == {
        "network": {
            "old": None,
            "new": {
                "driver": "macvlan",
                "parent": "eth0",
                "subnet": SUBNET,
                "ip_range": POOL,
                "gateway": "10.251.1.1",
            },
        }
    }
    assert engine.calls == []


# validation


@pytest.mark.parametrize(
    "subnet,ip_range,message",
    [
        ("10.251.1.0/33", POOL, "not an IPv4 network"),
        ("10.251.1.5/24", POOL, "no host bits"),
        ("fd00::/64", "fd00::/80", "not an IPv4 network"),
        ("", POOL, "CIDR"),
        (None, POOL, "CIDR"),
        (SUBNET, "10.251.2.0/25", "not inside"),
        (SUBNET, "10.251.0.0/23", "not inside"),
        (SUBNET, SUBNET, "whole subnet"),
        (SUBNET, "10.251.1.129/25", "no host bits"),
        (SUBNET, 42, "CIDR"),
        ("10.251.1.0/31", "10.251.1.0/32", "too small"),
    ],
)
def test_bad_subnet_or_ip_range_is_rejected_before_docker(engine, subnet, ip_range, message):
    with pytest.raises(SaltInvocationError, match=message):
        mpi_network.present(NAME, subnet, ip_range)
    assert engine.calls == []


def test_single_address_pool_is_accepted(engine):
    assert mpi_network.present(NAME, SUBNET, "10.251.1.130")["created"]["ip_range"] == (
        "10.251.1.130/32"
    )


def test_pool_holding_the_node_address_is_refused(engine):
    with pytest.raises(CommandExecutionError, match=r"10\.251\.1\.3 \(eth0\)"):
        mpi_network.present(NAME, SUBNET, "10.251.1.0/25")
    assert engine.calls == []


@pytest.mark.parametrize("name", ["", "-jobs", "dmpi jobs", "a/b", None])
def test_bad_network_name_is_rejected(engine, name):
    with pytest.raises(SaltInvocationError, match="network name"):
        mpi_network.present(name, SUBNET, POOL)


# inspect / absent


def test_inspect_absent_network_is_none(engine):
    assert mpi_network.inspect(NAME) is None


def test_inspect_ignores_network_matched_only_by_id_prefix(engine):
    _existing(engine, name="other")
    assert mpi_network.inspect("f00d") is None
    assert mpi_network.inspect("other")["parent"] == "eth0"


def test_inspect_reports_attached_container_names(engine):
    _existing(engine, containers=["dmpi-job-9-node1", "dmpi-job-7-node1"])
    assert mpi_network.inspect(NAME) == {
        "driver": "macvlan",
        "parent": "eth0",
        "subnet": SUBNET,
        "ip_range": POOL,
        "gateway": "10.251.1.1",
        "containers": ["dmpi-job-7-node1", "dmpi-job-9-node1"],
    }


def test_absent_removes_and_is_then_unchanged(engine):
    _existing(engine)
    assert mpi_network.absent(NAME)["removed"]["ip_range"] == POOL
    assert mpi_network.absent(NAME) == {"unchanged": None}
    assert mpi_network.inspect(NAME) is None


def test_absent_refuses_while_jobs_hold_the_network(engine):
    _existing(engine, containers=["dmpi-job-7-node1"])
    with pytest.raises(CommandExecutionError, match="dmpi-job-7-node1"):
        mpi_network.absent(NAME)
    assert engine.calls == []


# docker errors


def test_unreachable_engine_is_a_command_error():
    with patch.object(
        mpi_network.docker, "from_env", side_effect=docker.errors.DockerException("no socket")
    ):
        with pytest.raises(
            CommandExecutionError, match="cannot reach the Docker engine: no socket"
        ):
            mpi_network.inspect(NAME)


def test_engine_dying_mid_call_is_a_command_error(engine):
    engine.fail_get = requests.exceptions.ConnectionError("connection aborted")
    with pytest.raises(
        CommandExecutionError,
        match=f"cannot inspect Docker network {NAME}: connection aborted",
    ):
        mpi_network.present(NAME, SUBNET, POOL)


def test_create_refused_by_engine_names_network_and_cause(engine):
    engine.fail_create = _api_error("-o parent interface was not found on the host: eth9", 400)
    with pytest.raises(CommandExecutionError) as exc:
        mpi_network.present(NAME, SUBNET, POOL, parent="eth9")
    assert f"cannot create Docker network {NAME}" in str(exc.value)
    assert "parent interface was not found on the host: eth9" in str(exc.value)


def test_failed_create_after_removal_says_the_old_network_is_gone(engine):
    _existing(engine, ip_range="10.251.1.192/26")
    engine.fail_create = _api_error("network dm-x is already using parent interface eth0", 403)
    with pytest.raises(
        CommandExecutionError, match="removed Docker network dmpi-jobs to replace it, but"
    ):
        mpi_network.present(NAME, SUBNET, POOL)


def test_remove_refused_by_engine_is_a_command_error(engine):
    _existing(engine)
    engine.fail_remove = _api_error("network has active endpoints", 403)
    with pytest.raises(
        CommandExecutionError,
        match="cannot remove Docker network dmpi-jobs: network has active endpoints",
    ):
        mpi_network.absent(NAME)


# states


def test_state_test_mode_would_create_and_does_not(engine):
    with patch.dict(mpi_network_state.__opts__, {"test": True}):
        ret = mpi_network_state.present(NAME, SUBNET, POOL)
    assert ret["result"] is None
    assert ret["changes"]["network"]["new"]["ip_range"] == POOL
    assert "would be created" in ret["comment"]
    assert engine.calls == []


def test_state_creates_then_reports_no_change_in_both_modes(engine):
    first = mpi_network_state.present(NAME, SUBNET, POOL, parent="")
    assert first["result"] is True
    assert first["changes"]["network"]["old"] is None
    again = mpi_network_state.present(NAME, SUBNET, POOL, parent="")
    with patch.dict(mpi_network_state.__opts__, {"test": True}):
        dry = mpi_network_state.present(NAME, SUBNET, POOL, parent="")
    for ret in (again, dry):
        assert (ret["result"], ret["changes"]) == (True, {})
    assert len(engine.created()) == 1


def test_state_test_mode_would_replace_free_network(engine):
    _existing(engine, ip_range="10.251.1.192/26")
    with patch.dict(mpi_network_state.__opts__, {"test": True}):
        ret = mpi_network_state.present(NAME, SUBNET, POOL)
    assert ret["result"] is None
    assert ret["changes"] == {"ip_range": {"old": "10.251.1.192/26", "new": POOL}}
    assert "would be replaced" in ret["comment"]
    assert engine.calls == []
    ret = mpi_network_state.present(NAME, SUBNET, POOL)
    assert ret["result"] is True
    assert ret["changes"] == {"ip_range": {"old": "10.251.1.192/26", "new": POOL}}


@pytest.mark.parametrize("test", [True, False])
def test_state_fails_on_held_network_in_both_modes(engine, test):
    _existing(engine, parent="eth1", containers=["dmpi-job-7-node1"])
    with patch.dict(mpi_network_state.__opts__, {"test": test}):
        ret = mpi_network_state.present(NAME, SUBNET, POOL)
    assert ret["result"] is False
    assert ret["changes"] == {}
    assert "dmpi-job-7-node1" in ret["comment"] and "parent" in ret["comment"]
    assert engine.calls == []


@pytest.mark.parametrize("test", [True, False])
def test_state_bad_pool_fails_with_empty_changes(engine, test):
    with patch.dict(mpi_network_state.__opts__, {"test": test}):
        ret = mpi_network_state.present(NAME, SUBNET, SUBNET)
    assert (ret["result"], ret["changes"]) == (False, {})
    assert NAME in ret["comment"] and "whole subnet" in ret["comment"]


def test_state_docker_failure_fails_with_empty_changes(engine):
    engine.fail_create = _api_error("-o parent interface was not found on the host: eth9", 400)
    ret = mpi_network_state.present(NAME, SUBNET, POOL, parent="eth9")
    assert (ret["result"], ret["changes"]) == (False, {})
    assert "parent interface was not found" in ret["comment"]


def test_state_absent_truthful_in_test_mode_then_removes(engine):
    _existing(engine)
    with patch.dict(mpi_network_state.__opts__, {"test": True}):
        dry = mpi_network_state.absent(NAME)
    assert dry["result"] is None
    assert dry["changes"]["network"]["new"] is None
    assert engine.calls == []
    ret = mpi_network_state.absent(NAME)
    assert ret["result"] is True and ret["changes"] == dry["changes"]
    again = mpi_network_state.absent(NAME)
    assert (again["result"], again["changes"]) == (True, {})


@pytest.mark.parametrize("test", [True, False])
def test_state_absent_fails_while_jobs_hold_it(engine, test):
    _existing(engine, containers=["dmpi-job-7-node1"])
    with patch.dict(mpi_network_state.__opts__, {"test": test}):
        ret = mpi_network_state.absent(NAME)
    assert (ret["result"], ret["changes"]) == (False, {})
    assert "dmpi-job-7-node1" in ret["comment"]
    assert engine.calls == []
