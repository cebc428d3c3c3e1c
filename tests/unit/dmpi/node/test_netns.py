"""Unit tests of dmpi.node.netns: running a tool (as in a job's namespace) and the job
firewall's rules. The rules' effect on real traffic is tested on the cluster."""

import pytest
from dmpi.errors import RequestError
from dmpi.node import netns


def test_a_tool_gets_its_input_and_gives_back_its_code_and_output():
    assert netns.run(["sh", "-c", "cat; echo oops >&2; exit 3"], stdin="in\n") == \
        (3, "in\n", "oops\n")


def test_a_tool_that_takes_too_long_or_is_missing_is_a_failed_run_not_an_exception():
    code, _, err = netns.run(["sleep", "30"], timeout=0.2)
    assert code == 124 and "sleep took over 0.2 s" in err
    code, _, err = netns.run(["/nonexistent/iptables-restore"])
    assert code == 127 and "cannot run /nonexistent/iptables-restore" in err


def test_the_namespace_prefix_names_the_process():
    assert netns.netns("4242") == ["nsenter", "--net=/proc/4242/ns/net", "--"]


SOURCES = {"peers": ["10.0.1.130", "10.0.1.131"], "hosts": ["10.0.0.11"],
           "unreachable": ["10.0.0.0/16"]}


def _filter(rules):
    return rules[rules.index("*filter"):]


def test_the_job_firewall_admits_peers_hosts_on_sshd_only_and_refuses_the_cluster():
    rules = _filter(netns.job_firewall_rules(SOURCES, 20000).splitlines())
    assert rules[:4] == ["*filter", ":INPUT DROP [0:0]", ":FORWARD DROP [0:0]",
                         ":OUTPUT ACCEPT [0:0]"]
    assert "-A INPUT -s 10.0.1.131/32 -j ACCEPT" in rules
    assert "-A INPUT -s 10.0.0.11/32 -p tcp --dport 20000 -j ACCEPT" in rules
    assert not [r for r in rules if r.startswith("-A INPUT -s 10.0.0.11/32") and "dport" not in r]
    # out of the job: its peers and sshd's replies to hosts, then the rest of the cluster
    # network refused at once
    peer = rules.index("-A OUTPUT -d 10.0.1.131/32 -j ACCEPT")
    sshd_reply = rules.index("-A OUTPUT -d 10.0.0.11/32 -p tcp --sport 20000 ! --syn -j ACCEPT")
    refused = rules.index("-A OUTPUT -d 10.0.0.0/16 -p tcp -j REJECT --reject-with tcp-reset")
    assert peer < refused and sshd_reply < refused and rules[-1] == "COMMIT"
    assert not [r for r in rules if r.startswith("-A OUTPUT -d 10.0.0.11/32") and "sport" not in r]


def test_ranks_and_sshd_are_never_tracked_and_tracked_flows_are_capped_per_job():
    rules = netns.job_firewall_rules(SOURCES, 20000).splitlines()
    raw = rules[:rules.index("*filter")]
    untracked = {r for r in raw if r.endswith("-j CT --notrack")}
    assert {"-A PREROUTING -s 10.0.1.130/32 -j CT --notrack",
            "-A PREROUTING -s 10.0.0.11/32 -p tcp --dport 20000 -j CT --notrack",
            "-A OUTPUT -d 10.0.1.131/32 -j CT --notrack",
            "-A OUTPUT -d 10.0.0.11/32 -p tcp --sport 20000 ! --syn -j CT --notrack",
            "-A OUTPUT -o lo -j CT --notrack"} <= untracked
    # Docker's resolver NATs, so its queries stay tracked (and counted)
    assert raw.index("-A OUTPUT -o lo -d 127.0.0.11/32 -j ACCEPT") < \
        raw.index("-A OUTPUT -o lo -j CT --notrack")
    cap = ("-A OUTPUT -m conntrack --ctstate NEW -m connlimit --connlimit-above "
           f"{netns.TRACKED_FLOWS} --connlimit-mask 0 -j REJECT --reject-with "
           "icmp-port-unreachable")
    output = [r for r in _filter(rules) if r.startswith("-A OUTPUT")]
    assert output[0] == cap


@pytest.mark.parametrize("sources, problem", [
    (dict(SOURCES, peers=["10.0.1.130 -j ACCEPT"]), "peer address must be an IPv4 address"),
    (dict(SOURCES, hosts=["0/0"]), "host address must be an IPv4 address"),
    (dict(SOURCES, unreachable=["10.0.0.1/16"]), "unreachable network must be an IPv4 network"),
])
def test_a_rule_is_never_made_of_anything_but_an_address(sources, problem):
    with pytest.raises(RequestError, match=problem):
        netns.job_firewall_rules(sources, 20000)
