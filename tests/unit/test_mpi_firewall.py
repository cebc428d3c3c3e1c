"""
Unit tests of the mpi_firewall execution and state modules.

iptables is replaced by a small in-memory fake of the filter table that
understands exactly the commands the module issues (`-S`, `-D`, `-I`,
`iptables-restore --noflush`), so whole apply/compare cycles run without root.
"""

from unittest.mock import patch

import pytest
from salt.exceptions import CommandExecutionError, SaltInvocationError
from tests.extension import load_extension




mpi_firewall = load_extension("_modules/mpi_firewall.py", "mpi_firewall_module")
mpi_firewall_state = load_extension("_states/mpi_firewall.py", "mpi_firewall_state")

CHAIN = "DOCKERMPI-INPUT"
NET = "10.0.0.0/8"
PORTS = {"sshd": [20000, 20099], "oob": [20100, 20199], "btl": [20200, 20999]}


class FakeIptables:
    """In-memory filter tables, IPv4 (``chains``) and IPv6 (``chains6``):
    {chain: [rule lines without '-A CHAIN ']}."""

    BUILTIN = ("INPUT", "FORWARD", "OUTPUT")

    def __init__(self):
        self.chains = {chain: [] for chain in self.BUILTIN}
        self.chains6 = {chain: [] for chain in self.BUILTIN}
        self.calls = []
        self.fail_restore = None

    def _dump(self, chains, only=None):
        lines = []
        for chain in self.BUILTIN:
            if only in (None, chain):
                lines.append(f"-P {chain} ACCEPT")
        for chain in chains:
            if chain not in self.BUILTIN and only in (None, chain):
                lines.append(f"-N {chain}")
        for chain, rules in chains.items():
            if only in (None, chain):
                lines.extend(f"-A {chain} {rule}" for rule in rules)
        return "\n".join(lines)

    def __call__(self, cmd, python_shell=None, ignore_retcode=None, stdin=None):
        assert isinstance(cmd, list), "commands must be argv lists"
        assert python_shell is False, "python_shell must be False"
        self.calls.append(cmd)
        ok = {"retcode": 0, "stdout": "", "stderr": ""}
        chains = self.chains6 if cmd[0].startswith("ip6tables") else self.chains
        if cmd[0] in ("iptables-restore", "ip6tables-restore"):
            assert "--noflush" in cmd
            if self.fail_restore:
                return {"retcode": 2, "stdout": "", "stderr": self.fail_restore}
            for line in stdin.splitlines():
                if line.startswith(":"):
                    chains[line[1:].split()[0]] = []  # declare = create or flush
                elif line.startswith("-A "):
                    _, chain, rule = line.split(" ", 2)
                    chains[chain].append(rule)
            return ok
        assert cmd[0] in ("iptables", "ip6tables"), f"unexpected command {cmd}"
        assert cmd[1] == "-w" and cmd[2:4] == ["-t", "filter"]
        args = cmd[4:]
        if args[0] == "-S":
            return {"retcode": 0, "stdout": self._dump(chains, *args[1:]), "stderr": ""}
        if args[0] == "-D":
            del chains[args[1]][int(args[2]) - 1]
            return ok
        if args[0] == "-I":
            chains[args[1]].insert(int(args[2]) - 1, " ".join(args[3:]))
            return ok
        raise AssertionError(f"unexpected command {cmd}")


@pytest.fixture
def iptables():
    fake = FakeIptables()
    with patch("salt.utils.path.which", lambda name: f"/usr/sbin/{name}"):
        yield fake


@pytest.fixture
def configure_loader_modules(iptables):
    return {
        mpi_firewall: {"__salt__": {"cmd.run_all": iptables}},
        mpi_firewall_state: {
            "__salt__": {
                "mpi_firewall.diff": mpi_firewall.diff,
                "mpi_firewall.apply": mpi_firewall.apply,
            },
            "__opts__": {"test": False},
        },
    }


def test_desired_rules_for_default_ranges():
    assert mpi_firewall.desired_rules(NET, PORTS) == [
        f"-A {CHAIN} -m conntrack --ctstate RELATED,ESTABLISHED -j RETURN",
        f"-A {CHAIN} -i lo -j RETURN",
        f"-A {CHAIN} -s 10.0.0.0/8 -p tcp -m tcp --dport 20000:20099 -j ACCEPT",
        f"-A {CHAIN} -p tcp -m tcp --dport 20000:20099 -j DROP",
        f"-A {CHAIN} -s 10.0.0.0/8 -p tcp -m tcp --dport 20100:20199 -j ACCEPT",
        f"-A {CHAIN} -p tcp -m tcp --dport 20100:20199 -j DROP",
        f"-A {CHAIN} -s 10.0.0.0/8 -p tcp -m tcp --dport 20200:20999 -j ACCEPT",
        f"-A {CHAIN} -p tcp -m tcp --dport 20200:20999 -j DROP",
    ]


def test_single_port_range_is_printed_like_iptables_does():
    rules = mpi_firewall.desired_rules(
        "192.168.1.0/24", {"sshd": [2222, 2222], "oob": [1, 2], "btl": [3, 4]}
    )
    assert f"-A {CHAIN} -s 192.168.1.0/24 -p tcp -m tcp --dport 2222 -j ACCEPT" in rules


def test_restore_payload_declares_chain_and_commits():
    payload = mpi_firewall.restore_payload(NET, PORTS).splitlines()
    assert payload[1:3] == ["*filter", f":{CHAIN} - [0:0]"]
    assert payload[-1] == "COMMIT"
    assert payload[3:-1] == mpi_firewall.desired_rules(NET, PORTS)


@pytest.mark.parametrize(
    "network", ["10.1.2.3/8", "not-a-net", "fd00::/8", "", None, "10.0.0.0/33"]
)
def test_bad_cluster_network_is_rejected(network):
    with pytest.raises(SaltInvocationError, match="cluster_network"):
        mpi_firewall.desired_rules(network, PORTS)


@pytest.mark.parametrize(
    "ports,match",
    [
        ({"sshd": [1, 2], "oob": [3, 4]}, "missing the range"),
        ({**PORTS, "btl": [20999, 20200]}, "first <= last"),
        ({**PORTS, "btl": [20200, 70000]}, "1-65535"),
        ({**PORTS, "btl": [0, 10]}, "1-65535"),
        ({**PORTS, "btl": ["20200", "20999"]}, "two integers"),
        ({**PORTS, "btl": [True, 5]}, "two integers"),
        ({**PORTS, "btl": 20200}, "two integers"),
        ([20000, 20099], "mapping"),
    ],
)
def test_bad_ports_are_rejected(ports, match):
    with pytest.raises(SaltInvocationError, match=match):
        mpi_firewall.desired_rules(NET, ports)


@pytest.mark.parametrize("chain", ["", "A" * 29, "bad chain", "x;rm"])
def test_bad_chain_name_is_rejected(chain):
    with pytest.raises(SaltInvocationError, match="chain name"):
        mpi_firewall.desired_rules(NET, PORTS, chain=chain)


def test_current_rules_is_none_without_chain(iptables):
    assert mpi_firewall.current_rules() is None


def test_apply_creates_chain_and_jump_at_top(iptables):
    iptables.chains["INPUT"] = ["-p tcp -m tcp --dport 22 -j ACCEPT"]
    after = mpi_firewall.apply(NET, PORTS)
    assert after["in_sync"] is True
    assert iptables.chains["INPUT"] == [
        f"-j {CHAIN}",
        "-p tcp -m tcp --dport 22 -j ACCEPT",
    ]
    assert [f"-A {CHAIN} {r}" for r in iptables.chains[CHAIN]] == (
        mpi_firewall.desired_rules(NET, PORTS)
    )


def test_apply_keeps_exactly_one_jump(iptables):
    iptables.chains[CHAIN] = []
    iptables.chains["INPUT"] = ["-i lo -j ACCEPT", f"-j {CHAIN}", f"-j {CHAIN}"]
    mpi_firewall.apply(NET, PORTS)
    assert iptables.chains["INPUT"] == [f"-j {CHAIN}", "-i lo -j ACCEPT"]


def test_diff_sees_a_stray_rule(iptables):
    mpi_firewall.apply(NET, PORTS)
    assert mpi_firewall.diff(NET, PORTS)["in_sync"] is True
    iptables.chains[CHAIN].append("-s 1.2.3.4/32 -j ACCEPT")
    diff = mpi_firewall.diff(NET, PORTS)
    assert diff["in_sync"] is False
    assert f"-A {CHAIN} -s 1.2.3.4/32 -j ACCEPT" in diff["old"]


def test_failed_restore_raises_with_iptables_message(iptables):
    iptables.fail_restore = "iptables-restore: line 4 failed"
    with pytest.raises(CommandExecutionError, match="line 4 failed"):
        mpi_firewall.apply(NET, PORTS)


def test_missing_iptables_binary_is_reported():
    with patch("salt.utils.path.which", lambda name: None):
        with pytest.raises(CommandExecutionError, match="iptables is not installed"):
            mpi_firewall.current_rules()


def test_state_applies_then_reports_no_changes(iptables):
    first = mpi_firewall_state.chain_present(CHAIN, NET, PORTS)
    assert first["result"] is True
    assert first["changes"]["chain"] == {"old": None, "new": "created"}
    assert len(first["changes"]["rules"]["added"]) == 8
    second = mpi_firewall_state.chain_present(CHAIN, NET, PORTS)
    assert second["result"] is True
    assert second["changes"] == {}


def test_state_test_mode_reports_diff_and_changes_nothing(iptables):
    mpi_firewall_state.chain_present(CHAIN, NET, PORTS)
    narrower = {**PORTS, "btl": [20200, 20499]}
    before = {k: list(v) for k, v in iptables.chains.items()}
    with patch.dict(mpi_firewall_state.__opts__, {"test": True}):
        ret = mpi_firewall_state.chain_present(CHAIN, NET, narrower)
    assert ret["result"] is None
    assert ret["changes"]["rules"]["added"] == [
        f"-A {CHAIN} -s 10.0.0.0/8 -p tcp -m tcp --dport 20200:20499 -j ACCEPT",
        f"-A {CHAIN} -p tcp -m tcp --dport 20200:20499 -j DROP",
    ]
    assert len(ret["changes"]["rules"]["removed"]) == 2
    assert iptables.chains == before


def test_state_test_mode_in_sync_is_true(iptables):
    mpi_firewall_state.chain_present(CHAIN, NET, PORTS)
    with patch.dict(mpi_firewall_state.__opts__, {"test": True}):
        ret = mpi_firewall_state.chain_present(CHAIN, NET, PORTS)
    assert (ret["result"], ret["changes"]) == (True, {})


def test_state_reports_misplaced_jump(iptables):
    mpi_firewall_state.chain_present(CHAIN, NET, PORTS)
    iptables.chains["INPUT"].append(iptables.chains["INPUT"].pop(0))
    iptables.chains["INPUT"].insert(0, "-i lo -j ACCEPT")
    ret = mpi_firewall_state.chain_present(CHAIN, NET, PORTS)
    assert ret["changes"] == {
        "jump": {"old": "INPUT positions [2]", "new": "INPUT position 1"}
    }
    assert iptables.chains["INPUT"][0] == f"-j {CHAIN}"


def test_state_failure_has_no_changes(iptables):
    iptables.fail_restore = "boom"
    ret = mpi_firewall_state.chain_present(CHAIN, NET, PORTS)
    assert ret["result"] is False
    assert ret["changes"] == {}
    assert "boom" in ret["comment"]


def test_state_bad_pillar_fails_cleanly(iptables):
    ret = mpi_firewall_state.chain_present(CHAIN, "10.1.2.3/8", PORTS)
    assert ret["result"] is False
    assert ret["changes"] == {}
    assert "cluster_network" in ret["comment"]


# --- IPv6: the same chain in ip6tables; the ranges open to loopback only ---------------


def test_ipv6_desired_rules_drop_ranges_for_all_but_loopback():
    assert mpi_firewall.desired_rules(None, PORTS, family="ipv6") == [
        f"-A {CHAIN} -m conntrack --ctstate RELATED,ESTABLISHED -j RETURN",
        f"-A {CHAIN} -i lo -j RETURN",
        f"-A {CHAIN} -p tcp -m tcp --dport 20000:20099 -j DROP",
        f"-A {CHAIN} -p tcp -m tcp --dport 20100:20199 -j DROP",
        f"-A {CHAIN} -p tcp -m tcp --dport 20200:20999 -j DROP",
    ]


def test_ipv6_ignores_the_ipv4_cluster_network():
    rules = mpi_firewall.desired_rules(NET, PORTS, family="ipv6")
    assert rules == mpi_firewall.desired_rules(None, PORTS, family="ipv6")
    assert not [r for r in rules if "ACCEPT" in r or " -s " in r]


def test_ipv6_restore_payload_names_ip6tables_restore():
    payload = mpi_firewall.restore_payload(None, PORTS, family="ipv6").splitlines()
    assert "ip6tables-restore --noflush" in payload[0]
    assert payload[1:3] == ["*filter", f":{CHAIN} - [0:0]"]
    assert payload[3:-1] == mpi_firewall.desired_rules(None, PORTS, family="ipv6")
    assert payload[-1] == "COMMIT"


@pytest.mark.parametrize("family", ["ipv5", "inet6", "", None, "IPv6"])
def test_bad_family_is_rejected(family):
    with pytest.raises(SaltInvocationError, match="family"):
        mpi_firewall.desired_rules(NET, PORTS, family=family)


def test_ipv6_still_checks_ports():
    with pytest.raises(SaltInvocationError, match="missing the range"):
        mpi_firewall.desired_rules(None, {"sshd": [1, 2]}, family="ipv6")


def test_ipv4_needs_a_cluster_network():
    with pytest.raises(SaltInvocationError, match="cluster_network"):
        mpi_firewall.desired_rules(None, PORTS)


def test_ipv6_apply_uses_ip6tables_and_leaves_ipv4_alone(iptables):
    iptables.chains6["INPUT"] = ["-p tcp -m tcp --dport 22 -j ACCEPT"]
    after = mpi_firewall.apply(None, PORTS, family="ipv6")
    assert after["in_sync"] is True
    assert iptables.chains6["INPUT"] == [
        f"-j {CHAIN}",
        "-p tcp -m tcp --dport 22 -j ACCEPT",
    ]
    assert [f"-A {CHAIN} {r}" for r in iptables.chains6[CHAIN]] == (
        mpi_firewall.desired_rules(None, PORTS, family="ipv6")
    )
    assert CHAIN not in iptables.chains
    assert iptables.chains["INPUT"] == []
    assert {cmd[0] for cmd in iptables.calls} == {"ip6tables", "ip6tables-restore"}


def test_families_are_compared_separately(iptables):
    mpi_firewall.apply(NET, PORTS)
    assert mpi_firewall.diff(NET, PORTS)["in_sync"] is True
    v6 = mpi_firewall.diff(None, PORTS, family="ipv6")
    assert (v6["in_sync"], v6["chain_exists"]) == (False, False)
    mpi_firewall.apply(None, PORTS, family="ipv6")
    assert mpi_firewall.diff(None, PORTS, family="ipv6")["in_sync"] is True
    # an IPv4 rule in the IPv6 chain is a difference
    iptables.chains6[CHAIN].insert(2, "-s 10.0.0.0/8 -p tcp -m tcp --dport 20000:20099 -j ACCEPT")
    assert mpi_firewall.diff(None, PORTS, family="ipv6")["in_sync"] is False
    assert mpi_firewall.diff(NET, PORTS)["in_sync"] is True


def test_missing_ip6tables_binary_is_reported():
    with patch("salt.utils.path.which", lambda name: None):
        with pytest.raises(CommandExecutionError, match="ip6tables is not installed"):
            mpi_firewall.current_rules(family="ipv6")


def test_ipv6_failed_restore_names_ip6tables_restore(iptables):
    iptables.fail_restore = "line 3 failed"
    with pytest.raises(CommandExecutionError, match="ip6tables-restore of chain"):
        mpi_firewall.apply(None, PORTS, family="ipv6")


def test_state_ipv6_applies_then_reports_no_changes(iptables):
    first = mpi_firewall_state.chain_present(CHAIN, ports=PORTS, family="ipv6")
    assert first["result"] is True, first["comment"]
    assert first["changes"]["chain"] == {"old": None, "new": "created"}
    assert len(first["changes"]["rules"]["added"]) == 5
    assert "ipv6" in first["comment"]
    second = mpi_firewall_state.chain_present(CHAIN, ports=PORTS, family="ipv6")
    assert (second["result"], second["changes"]) == (True, {})
    assert CHAIN not in iptables.chains


def test_state_ipv6_test_mode_changes_nothing(iptables):
    with patch.dict(mpi_firewall_state.__opts__, {"test": True}):
        ret = mpi_firewall_state.chain_present(CHAIN, ports=PORTS, family="ipv6")
    assert ret["result"] is None
    assert ret["changes"]["chain"] == {"old": None, "new": "created"}
    assert CHAIN not in iptables.chains6


def test_state_bad_family_fails_cleanly(iptables):
    ret = mpi_firewall_state.chain_present(CHAIN, NET, PORTS, family="ipx")
    assert ret["result"] is False
    assert ret["changes"] == {}
    assert "family" in ret["comment"]
    assert iptables.calls == []
