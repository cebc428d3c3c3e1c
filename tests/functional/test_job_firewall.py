"""The job firewall (dmpi.node.netns.job_firewall_rules) on real traffic: a job's network
namespace and a host's, joined by a veth pair on this machine, the rules loaded with
iptables-restore as a node loads them. Needs root (CI runs as root).

The job's peer is its own second address; the host (10.9.0.1) stands for a node's
host, the cluster network being 10.9.0.0/24.
"""

import os
import shutil
import socket
import subprocess
import sys
import uuid

import pytest
from dmpi.node import netns

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("iptables-restore"),
    reason="needs root, ip and iptables-restore")

HOST, JOB, PEER, OUTSIDE = "10.9.0.1", "10.9.0.2", "10.9.0.3", "192.0.2.1"
SSHD_PORT = 20000


def _ip(*args):
    subprocess.run(["ip", *args], check=True, capture_output=True)


@pytest.fixture
def namespaces():
    """(job namespace, host namespace) names, the job's behind its firewall."""
    tag = uuid.uuid4().hex[:6]
    job, host = f"dmpi-fw-job-{tag}", f"dmpi-fw-host-{tag}"
    _ip("netns", "add", job)
    _ip("netns", "add", host)
    try:
        _ip("link", "add", f"j{tag}", "netns", job, "type", "veth", "peer", "name", f"h{tag}",
            "netns", host)
        for name, link, addresses in ((job, f"j{tag}", (JOB, PEER)), (host, f"h{tag}", (HOST,))):
            for address in addresses:
                _ip("-n", name, "addr", "add", f"{address}/24", "dev", link)
            _ip("-n", name, "link", "set", link, "up")
            _ip("-n", name, "link", "set", "lo", "up")
        # Beyond the cluster network, through the host (which routes nothing on).
        _ip("-n", job, "route", "add", "default", "via", HOST)
        rules = netns.job_firewall_rules(
            {"peers": [JOB, PEER], "hosts": [HOST], "unreachable": ["10.9.0.0/24"]}, SSHD_PORT)
        subprocess.run(["ip", "netns", "exec", job, "iptables-restore"], input=rules,
                       text=True, check=True, capture_output=True)
        yield job, host
    finally:
        _ip("netns", "del", job)
        _ip("netns", "del", host)


def _in(namespace, program, *args, timeout=60):
    """Run a Python program in a namespace; its last stdout line."""
    done = subprocess.run(["ip", "netns", "exec", namespace, sys.executable, "-c", program,
                           *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          check=True)
    return done.stdout.strip().splitlines()[-1]


LISTEN = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen()
print('listening', flush=True)
conn, _ = s.accept(); conn.sendall(b'hello'); conn.close()
"""

CONNECT = """
import errno, socket, sys
address, port, source_port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
if source_port:
    s.bind(('0.0.0.0', source_port))
s.settimeout(2)
try:
    s.connect((address, port)); print(s.recv(5).decode())
except OSError as exc:
    print(errno.errorcode.get(exc.errno, 'timeout' if isinstance(exc, TimeoutError) else str(exc)))
"""


def _serve(namespace, address, port):
    server = subprocess.Popen(["ip", "netns", "exec", namespace, sys.executable, "-c", LISTEN,
                               address, str(port)], stdout=subprocess.PIPE, text=True)
    assert server.stdout.readline().strip() == "listening"
    return server


def _connect(namespace, address, port, source_port=0):
    return _in(namespace, CONNECT, address, port, source_port)


def test_a_host_reaches_the_jobs_sshd_and_nothing_else(namespaces):
    job, host = namespaces
    server = _serve(job, "0.0.0.0", SSHD_PORT)
    try:
        assert _connect(host, JOB, SSHD_PORT) == "hello"
    finally:
        server.kill()
    server = _serve(job, "0.0.0.0", 20100)
    try:
        assert _connect(host, JOB, 20100) == "timeout"  # dropped
    finally:
        server.kill()


def test_the_job_reaches_its_peer_and_is_refused_by_the_host_even_from_its_sshd_port(
        namespaces):
    job, host = namespaces
    server = _serve(job, PEER, 20101)
    try:
        assert _connect(job, PEER, 20101) == "hello"
    finally:
        server.kill()
    server = _serve(host, HOST, 4506)
    try:
        # sshd's replies leave without state; a job that took sshd's port still cannot
        # start a connection from it.
        assert _connect(job, HOST, 4506, source_port=SSHD_PORT) == "ECONNREFUSED"
        assert _connect(job, HOST, 4506) == "ECONNREFUSED"
        assert _connect(host, HOST, 4506) == "hello"  # the listener was there
    finally:
        server.kill()


FLOOD = """
import socket, sys
target, kind, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
refused = 0
held = []
for n in range(count):
    port = 1024 + n % 60000
    if kind == 'tcp':
        s = socket.socket(); s.setblocking(False)
        refused += s.connect_ex((target, port)) not in (0, 115)
        held.append(s)
        if len(held) > 400:
            for s in held: s.close()
            held = []
    else:
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            u.sendto(b'x', (target, port))
        except OSError:
            refused += 1
        u.close()
with open('/proc/sys/net/netfilter/nf_conntrack_count') as f:
    print(refused, int(f.read()))
"""


@pytest.mark.parametrize("target", [PEER, JOB, "127.0.0.1"])
@pytest.mark.parametrize("kind", ["tcp", "udp"])
def test_flows_among_the_jobs_own_addresses_are_never_tracked(namespaces, target, kind):
    job, _ = namespaces
    refused, tracked = map(int, _in(job, FLOOD, target, kind, 5000).split())
    assert (refused, tracked) == (0, 0)


@pytest.mark.parametrize("kind", ["tcp", "udp"])
def test_tracked_flows_beyond_the_cluster_are_capped_per_job(namespaces, kind):
    job, _ = namespaces
    refused, tracked = map(int, _in(job, FLOOD, OUTSIDE, kind, 5000).split())
    assert netns.TRACKED_FLOWS <= tracked <= 2 * netns.TRACKED_FLOWS
    if kind == "udp":  # (a refused TCP connect fails later, not in connect)
        assert refused >= 5000 - 2 * netns.TRACKED_FLOWS
