"""
A job's network namespace: running tools in it, and its firewall.
"""

import subprocess

from dmpi.errors import NodeError
from dmpi.node import checks


def netns(pid):
    """The argv prefix that runs a command in the network namespace of process ``pid``."""
    return ["nsenter", f"--net=/proc/{int(pid)}/ns/net", "--"]


def run(argv, stdin=None, timeout=10):
    """Run ``argv`` (no shell) with ``stdin`` text; returns (exit code, stdout, stderr),
    a tool that is missing or takes over ``timeout`` seconds as a failed run."""
    try:
        done = subprocess.run(argv, input=stdin, capture_output=True, text=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return 124, "", f"{argv[0]} took over {timeout} s"
    except OSError as exc:
        return 127, "", f"cannot run {argv[0]}: {exc}"
    return done.returncode, done.stdout, done.stderr


def job_firewall_rules(allowed_sources, sshd_port):
    """
    The iptables rules of a job's network namespace: only the job's own containers may
    reach it, and its nodes' hosts only its sshd (the node reports probe it); nothing
    else on the cluster network reaches a job's sshd or Open MPI ports. Out of it, the
    job opens connections to its own containers only among the networks in
    ``allowed_sources["unreachable"]`` (the cluster network and what the site adds):
    never to the master's Salt ports or user API, the registry, the hub or a node's host.
    Those are refused at once (a reset or port-unreachable), not left to time out.
    """
    peers = [checks.check_ipv4(source, "peer address") for source in allowed_sources["peers"]]
    lines = [
        "*filter",
        ":INPUT DROP [0:0]",
        ":FORWARD DROP [0:0]",
        ":OUTPUT ACCEPT [0:0]",
        "-A INPUT -i lo -j ACCEPT",
        "-A INPUT -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT",
    ]
    lines += [f"-A INPUT -s {peer}/32 -j ACCEPT" for peer in peers]
    for source in allowed_sources["hosts"]:
        lines.append(f"-A INPUT -s {checks.check_ipv4(source, 'host address')}/32 -p tcp "
                     f"--dport {int(sshd_port)} -j ACCEPT")
    lines += ["-A OUTPUT -o lo -j ACCEPT",
              "-A OUTPUT -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT"]
    lines += [f"-A OUTPUT -d {peer}/32 -j ACCEPT" for peer in peers]
    for network in allowed_sources.get("unreachable", ()):
        network = checks.check_ipv4_network(network, "unreachable network")
        lines += [f"-A OUTPUT -d {network} -p tcp -j REJECT --reject-with tcp-reset",
                  f"-A OUTPUT -d {network} -j REJECT --reject-with icmp-port-unreachable"]
    return "\n".join(lines + ["COMMIT", ""])


_IPV6_CLOSED = "*filter\n:INPUT DROP [0:0]\n:FORWARD DROP [0:0]\n:OUTPUT DROP [0:0]\n" \
               "-A INPUT -i lo -j ACCEPT\n-A OUTPUT -o lo -j ACCEPT\nCOMMIT\n"


def close_namespace(job_id, pid, allowed_sources, sshd_port):
    """Put the job's firewall (:func:`job_firewall_rules`, and no IPv6 but loopback) in
    the network namespace of process ``pid``."""
    for tool, rules in (("iptables-restore", job_firewall_rules(allowed_sources, sshd_port)),
                        ("ip6tables-restore", _IPV6_CLOSED)):
        code, _, err = run(netns(pid) + [tool], stdin=rules)
        if code != 0:
            raise NodeError(f"cannot set the firewall of job {job_id}: {err.strip()}")
