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


#: Connections a job may have tracked at once (those beyond the cluster network, and
#: its DNS queries to Docker's resolver): each namespace's connection tracking table
#: holds no more of them than this, however fast the job opens flows.
TRACKED_FLOWS = 512

#: Docker's resolver in every container on a user-defined network: its NAT needs
#: connection tracking.
DOCKER_RESOLVER = "127.0.0.11"


def job_firewall_rules(allowed_sources, sshd_port):
    """
    The iptables rules of a job's network namespace: only the job's own containers may
    reach it, and its nodes' hosts only its sshd (the node reports probe it); nothing
    else on the cluster network reaches a job's sshd or Open MPI ports. Out of it, the
    job opens connections to its own containers only among the networks in
    ``allowed_sources["unreachable"]`` (the cluster network and what the site adds):
    never to the master's Salt ports or user API, the registry, the hub or a node's host.
    Those are refused at once (a reset or port-unreachable), not left to time out.

    The traffic of the job's ranks and of its sshd is matched without state and never
    tracked (``raw`` table ``NOTRACK``), as is loopback but Docker's resolver: whatever
    the job opens there costs no connection-tracking entry, and its data path skips the
    tracking work. What is tracked (connections beyond the cluster network, which need
    their replies let in, and DNS) is held to :data:`TRACKED_FLOWS` at once.
    """
    peers = [checks.check_ipv4(source, "peer address") for source in allowed_sources["peers"]]
    hosts = [checks.check_ipv4(source, "host address") for source in allowed_sources["hosts"]]
    unreachable = [checks.check_ipv4_network(network, "unreachable network")
                   for network in allowed_sources.get("unreachable", ())]
    sshd = f"-p tcp --dport {int(sshd_port)}"
    # sshd's side of a host's connection, never the start of one: a job that took its
    # sshd's port could otherwise open connections to the hosts from it.
    sshd_replies = f"-p tcp --sport {int(sshd_port)} ! --syn"
    lines = ["*raw", ":PREROUTING ACCEPT [0:0]", ":OUTPUT ACCEPT [0:0]"]
    lines += [f"-A PREROUTING -s {peer}/32 -j CT --notrack" for peer in peers]
    lines += [f"-A PREROUTING -s {host}/32 {sshd} -j CT --notrack" for host in hosts]
    lines += [f"-A OUTPUT -o lo -s {DOCKER_RESOLVER}/32 -j ACCEPT",
              f"-A OUTPUT -o lo -d {DOCKER_RESOLVER}/32 -j ACCEPT",
              "-A OUTPUT -o lo -j CT --notrack"]
    lines += [f"-A OUTPUT -d {peer}/32 -j CT --notrack" for peer in peers]
    lines += [f"-A OUTPUT -d {host}/32 {sshd_replies} -j CT --notrack" for host in hosts]
    lines += ["COMMIT",
              "*filter",
              ":INPUT DROP [0:0]",
              ":FORWARD DROP [0:0]",
              ":OUTPUT ACCEPT [0:0]",
              "-A INPUT -i lo -j ACCEPT"]
    lines += [f"-A INPUT -s {peer}/32 -j ACCEPT" for peer in peers]
    lines += [f"-A INPUT -s {host}/32 {sshd} -j ACCEPT" for host in hosts]
    lines += ["-A INPUT -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT",
              "-A OUTPUT -m conntrack --ctstate NEW -m connlimit --connlimit-above "
              f"{TRACKED_FLOWS} --connlimit-mask 0 -j REJECT --reject-with icmp-port-unreachable",
              "-A OUTPUT -o lo -j ACCEPT"]
    lines += [f"-A OUTPUT -d {peer}/32 -j ACCEPT" for peer in peers]
    lines += [f"-A OUTPUT -d {host}/32 {sshd_replies} -j ACCEPT" for host in hosts]
    for network in unreachable:
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
