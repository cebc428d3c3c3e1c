"""
What a highstate leaves on every node of the real test cluster, and what it refuses.

- Infra (testinfra, one parametrised check per fact and node): the Docker engine, the
  guest account, the firewall chain in iptables and ip6tables, the approved image
  pinned by digest, no Docker TCP socket, daemon.json.
- Reachability: a throwaway host on the site LAN only (``dmpi-site``) is dropped on
  the MPI port ranges but reaches a control port outside them; a peer node reaches
  the ranges over the cluster network.
- Idempotence, refusal of unpinned or unknown images, and truthful ``test=True``.

Expected values (guest uid/gid, port ranges, cluster network, image references,
daemon settings) are read from what Salt renders for each node (pillar merged over
the formula defaults), not hard-coded.
"""

import json
import os
import time

import docker.errors
import pytest
import testinfra

from tests.cluster.testcluster import SITE_NET, node_address, node_name

pytestmark = pytest.mark.cluster

NODES = [node_name(i) for i in range(1, int(os.environ.get("DMPI_NODES", "3")) + 1)]
KNOWN_RANGES = ("sshd", "oob", "btl")
FAMILIES = [4, 6]
PREFIX = "h3-"
#: A control port outside every MPI range: it must stay reachable from the site LAN.
CONTROL_PORTS = list(range(18080, 18090))
PROBE_TIMEOUT = 3.0

# Connect once and print open / refused / timeout / error.
PROBE = """
import socket, sys
s = socket.socket()
s.settimeout(float(sys.argv[3]))
try:
    s.connect((sys.argv[1], int(sys.argv[2])))
    print("open")
except socket.timeout:
    print("timeout")
except ConnectionRefusedError:
    print("refused")
except OSError as exc:
    print("error", exc)
"""

# Listen on the first free candidate port; write "<pid> <port>" to a file; accept forever.
LISTENER = """
import os, socket, sys
pidfile, candidates = sys.argv[1], [int(p) for p in sys.argv[2:]]
srv = socket.socket()
for port in candidates:
    try:
        srv.bind(("0.0.0.0", port))
        break
    except OSError:
        continue
else:
    sys.exit(f"no free port among {candidates}")
srv.listen(64)
with open(pidfile + ".tmp", "w") as out:
    out.write(f"{os.getpid()} {port}")
os.rename(pidfile + ".tmp", pidfile)
while True:
    conn, _ = srv.accept()
    conn.close()
"""


# --- what Salt renders for each node ------------------------------------------------


def _args(high, state_id):
    """The arguments of state ``state_id`` in a rendered highstate, as a dict."""
    assert state_id in high, f"{state_id} not rendered; have {sorted(high)}"
    args = {}
    for key, body in high[state_id].items():
        if key.startswith("__"):
            continue
        for item in body:
            if isinstance(item, dict):
                args.update(item)
    return args


@pytest.fixture(scope="module")
def formula(cluster):
    """{node: settings} read from each node's rendered highstate."""
    _, rendered = cluster.salt_json(
        ["salt", "-L", ",".join(cluster.nodes), "state.show_highstate", "--timeout=120"]
    )
    settings = {}
    for node in cluster.nodes:
        high = rendered.get(node)
        assert isinstance(high, dict), f"{node}: highstate does not render: {high}"
        group = _args(high, "mpi-guest-user-group-present")
        user = _args(high, "mpi-guest-user-user-present")
        chain = _args(high, "mpi-firewall-rules-chain-present")
        images = {
            args["name"]: args["reference"]
            for args in (
                _args(high, sid) for sid in high if sid.startswith("mpi-images-present-")
            )
        }
        settings[node] = {
            "user": user["name"],
            "uid": user["uid"],
            "gid": user["gid"],
            "group": group["name"],
            "chain": chain["name"],
            "cluster_network": chain["cluster_network"],
            "ports": chain["ports"],
            "images": images,
            "daemon": _args(high, "mpi-docker-config-daemon-json")["dataset"],
        }
    return settings


def _ranges(ports):
    names = list(KNOWN_RANGES) + sorted(n for n in ports if n not in KNOWN_RANGES)
    return [(name, *ports[name]) for name in names]


def _dport(first, last):
    return str(first) if first == last else f"{first}:{last}"


def _expected_chain(settings, family):
    chain = settings["chain"]
    rules = [
        f"-N {chain}",
        f"-A {chain} -m conntrack --ctstate RELATED,ESTABLISHED -j RETURN",
        f"-A {chain} -i lo -j RETURN",
    ]
    for _name, first, last in _ranges(settings["ports"]):
        if family == 4:
            rules.append(
                f"-A {chain} -s {settings['cluster_network']} -p tcp -m tcp "
                f"--dport {_dport(first, last)} -j ACCEPT"
            )
        rules.append(f"-A {chain} -p tcp -m tcp --dport {_dport(first, last)} -j DROP")
    return rules


# --- infra: testinfra on every node ---------------------------------------------------


@pytest.fixture(scope="module")
def hosts(cluster):
    return {node: testinfra.get_host(f"docker://dmpi-{node}") for node in cluster.nodes}


@pytest.mark.parametrize("node", NODES)
def test_docker_service_running(hosts, node):
    assert hosts[node].service("docker").is_running


@pytest.mark.parametrize("node", NODES)
def test_docker_service_enabled(hosts, node):
    assert hosts[node].service("docker").is_enabled


@pytest.mark.parametrize("node", NODES)
def test_docker_info_answers(hosts, node):
    result = hosts[node].run("docker info --format %s", "{{json .}}")
    assert result.rc == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["ServerVersion"]
    assert not info.get("ServerErrors"), info.get("ServerErrors")


@pytest.mark.parametrize("node", NODES)
def test_guest_user_has_pillar_uid_and_gid(hosts, formula, node):
    expected = formula[node]
    user = hosts[node].user(expected["user"])
    assert user.exists
    assert (user.uid, user.gid) == (expected["uid"], expected["gid"])


@pytest.mark.parametrize("node", NODES)
def test_guest_group_has_pillar_gid(hosts, formula, node):
    expected = formula[node]
    group = hosts[node].group(expected["group"])
    assert group.exists
    assert group.gid == expected["gid"]


@pytest.mark.parametrize("family", FAMILIES, ids=["ipv4", "ipv6"])
@pytest.mark.parametrize("node", NODES)
def test_firewall_chain_holds_the_pillar_rules(hosts, formula, node, family):
    expected = _expected_chain(formula[node], family)
    rules = hosts[node].iptables.rules("filter", formula[node]["chain"], version=family)
    assert rules == expected


@pytest.mark.parametrize("family", FAMILIES, ids=["ipv4", "ipv6"])
@pytest.mark.parametrize("node", NODES)
def test_firewall_jump_is_input_rule_1(hosts, formula, node, family):
    chain = formula[node]["chain"]
    rules = [
        r for r in hosts[node].iptables.rules("filter", "INPUT", version=family)
        if r.startswith("-A INPUT ")
    ]
    assert rules, "INPUT has no rules at all"
    assert rules[0] == f"-A INPUT -j {chain}"
    assert [r for r in rules if r.endswith(f"-j {chain}")] == [rules[0]]


@pytest.mark.parametrize("node", NODES)
def test_firewall_restored_at_boot(hosts, node):
    unit = hosts[node].service("dockermpi-firewall")
    assert unit.is_enabled


@pytest.mark.parametrize("node", NODES)
def test_approved_image_present_with_pinned_digest(hosts, formula, node):
    images = formula[node]["images"]
    assert "mpi" in images, f"no approved image mpi in the pillar: {images}"
    for name, reference in sorted(images.items()):
        result = hosts[node].run(
            "docker image inspect --format %s %s", "{{json .RepoDigests}}", reference
        )
        assert result.rc == 0, f"{name}: {result.stderr}"
        assert reference in json.loads(result.stdout), (name, result.stdout)


@pytest.mark.parametrize("node", NODES)
def test_no_docker_tcp_port_listening(hosts, node):
    listening = hosts[node].socket.get_listening_sockets()
    assert listening, "ss listed no listening sockets at all"
    assert [s for s in listening if s.rsplit(":", 1)[-1] in ("2375", "2376")] == []


@pytest.mark.parametrize("node", NODES)
def test_dockerd_listens_on_no_tcp_socket(hosts, node):
    host = hosts[node]
    # ss can name dockerd (on its unix socket), so its absence below means something.
    unix = host.run("ss -lxp")
    assert unix.rc == 0, unix.stderr
    assert any('"dockerd"' in line for line in unix.stdout.splitlines()), unix.stdout
    tcp = host.run("ss -ltnp")
    assert tcp.rc == 0, tcp.stderr
    assert [line for line in tcp.stdout.splitlines() if '"dockerd"' in line] == []
    for process in host.process.filter(comm="dockerd"):
        assert "tcp://" not in process.args, process.args


@pytest.mark.parametrize("node", NODES)
def test_daemon_json_rotates_logs(hosts, formula, node):
    config = json.loads(hosts[node].file("/etc/docker/daemon.json").content_string)
    daemon = formula[node]["daemon"]
    assert config["log-driver"] == "json-file"
    assert config["log-opts"] == daemon["log-opts"]
    assert set(config["log-opts"]) == {"max-size", "max-file"}
    assert "hosts" not in config


@pytest.mark.parametrize("node", NODES)
def test_daemon_json_trusts_the_image_registry(hosts, formula, node):
    config = json.loads(hosts[node].file("/etc/docker/daemon.json").content_string)
    registry = formula[node]["images"]["mpi"].split("/", 1)[0]
    assert config["insecure-registries"] == formula[node]["daemon"]["insecure-registries"]
    assert registry in config["insecure-registries"]
    # and the running engine has loaded it
    result = hosts[node].run("docker info --format %s", "{{json .RegistryConfig.IndexConfigs}}")
    assert result.rc == 0, result.stderr
    assert json.loads(result.stdout)[registry]["Secure"] is False


# --- reachability ----------------------------------------------------------------------


def _probe_argv(address, port):
    return ["python3", "-c", PROBE, address, str(port), str(PROBE_TIMEOUT)]


def _port_candidates(first, last, count=10):
    """Ports from the top of a range down: jobs take theirs from the bottom."""
    return list(range(last, max(first, last - count + 1) - 1, -1))


@pytest.fixture(scope="module")
def listeners(cluster, formula, request):
    """{node: {kind: port}}: a TCP listener per MPI range and a control port, per node."""
    started = []  # (node, pidfile)

    def stop():
        for node, pidfile in started:
            code, out = cluster.exec(node, ["cat", pidfile], check=False)
            if code == 0 and out.split():
                cluster.exec(node, ["kill", out.split()[0]], check=False)
            cluster.exec(node, ["rm", "-f", pidfile], check=False)

    request.addfinalizer(stop)
    ports = {}
    for node in cluster.nodes:
        wanted = {
            name: _port_candidates(first, last)
            for name, first, last in _ranges(formula[node]["ports"])
        }
        wanted["control"] = CONTROL_PORTS
        ports[node] = {}
        for kind, candidates in wanted.items():
            pidfile = f"/tmp/{PREFIX}listener-{kind}.pid"
            cluster.exec(node, ["rm", "-f", pidfile])
            cluster.container(node).exec_run(
                ["python3", "-c", LISTENER, pidfile, *map(str, candidates)], detach=True
            )
            started.append((node, pidfile))
            deadline = time.monotonic() + 15
            while True:
                code, out = cluster.exec(node, ["cat", pidfile], check=False)
                if code == 0 and len(out.split()) == 2:
                    ports[node][kind] = int(out.split()[1])
                    break
                assert time.monotonic() < deadline, f"{node}: {kind} listener did not start"
                time.sleep(0.2)
    for node in cluster.nodes:
        control = ports[node]["control"]
        assert not any(
            first <= control <= last for _n, first, last in _ranges(formula[node]["ports"])
        ), f"control port {control} lies inside an MPI range"
    return ports


@pytest.fixture(scope="module")
def site_host(cluster):
    """A throwaway host attached ONLY to the site LAN; removed afterwards."""
    name = f"{PREFIX}site-probe"
    try:
        cluster.docker.containers.get(name).remove(force=True)
    except docker.errors.NotFound:
        pass
    image = cluster.container(cluster.nodes[0]).image  # the node image has python3
    container = cluster.docker.containers.run(
        image.id,
        entrypoint=["sleep"],
        command=["infinity"],
        name=name,
        network=SITE_NET[0],
        labels={"io.dockermpi.h3": "1"},
        detach=True,
    )
    try:
        container.reload()
        networks = container.attrs["NetworkSettings"]["Networks"]
        assert set(networks) == {SITE_NET[0]}, f"{name} is on {sorted(networks)}"
        yield container
    finally:
        container.remove(force=True)


def _probe_from_site(site_host, address, port):
    result = site_host.exec_run(_probe_argv(address, port))
    assert result.exit_code == 0, result.output
    return result.output.decode().strip()


def _node_index(node):
    return NODES.index(node) + 1


@pytest.mark.parametrize("kind", KNOWN_RANGES)
@pytest.mark.parametrize("node", NODES)
def test_site_lan_host_is_dropped_on_mpi_port(site_host, listeners, node, kind):
    address = node_address(_node_index(node), SITE_NET)
    assert _probe_from_site(site_host, address, listeners[node][kind]) == "timeout"


@pytest.mark.parametrize("node", NODES)
def test_site_lan_host_reaches_port_outside_ranges(site_host, listeners, node):
    address = node_address(_node_index(node), SITE_NET)
    assert _probe_from_site(site_host, address, listeners[node]["control"]) == "open"


@pytest.mark.parametrize("kind", KNOWN_RANGES)
@pytest.mark.parametrize("node", NODES)
def test_cluster_peer_reaches_mpi_port(cluster, listeners, node, kind):
    if len(cluster.nodes) < 2:
        pytest.skip("needs a second node")
    peer = cluster.nodes[_node_index(node) % len(cluster.nodes)]
    address = node_address(_node_index(node))
    _, out = cluster.exec(peer, _probe_argv(address, listeners[node][kind]))
    assert out.strip() == "open", f"{peer} -> {address}:{listeners[node][kind]}"


# --- idempotence, refusals, test=True ----------------------------------------------------


@pytest.fixture(scope="module")
def second_highstate(cluster):
    """The cluster fixture applied highstate once; this is the second run."""
    return cluster.highstate()


@pytest.mark.parametrize("node", NODES)
def test_second_highstate_changes_nothing(second_highstate, node):
    states = second_highstate[node]
    assert states, f"{node} ran no states"
    changed = {v["__id__"]: v["changes"] for v in states.values() if v["changes"]}
    assert changed == {}


def _broken_reference(kind, approved):
    repository = approved.split("@", 1)[0]
    if kind == "wrong-digest":
        return f"{repository}@sha256:{'0' * 64}"
    return f"{repository}:latest"


def _local_images(cluster, node):
    """The node's images: id, repository, tag and digest of each (not their age, which
    `docker images` words in minutes: a minute passing is no change)."""
    _, out = cluster.exec(
        node, ["docker", "images", "--digests", "--no-trunc", "--format",
               "{{.ID}} {{.Repository}} {{.Tag}} {{.Digest}}"]
    )
    return sorted(out.splitlines())


@pytest.mark.parametrize(
    "kind,phrase,failing_state",
    [
        # a well-formed reference to a digest the registry does not have: only pulling can tell
        ("wrong-digest", "does not have this digest", "mpi-images-present-broken"),
        # a tag is refused by the settings check before any image state runs
        ("tag-only", "not pinned by digest", "mpi-config-settings-valid"),
    ],
)
def test_unapproved_reference_fails_clearly_and_changes_nothing(
    cluster, formula, kind, phrase, failing_state
):
    node = cluster.nodes[0]
    reference = _broken_reference(kind, formula[node]["images"]["mpi"])
    images_before = _local_images(cluster, node)
    pillar = {"mpi": {"images": {"broken": reference}}}
    # (the salt CLI exits 0 here even though a state failed: judge the states)
    _, results = cluster.salt_json(
        ["salt", node, "state.apply", "dockermpi.images", f"pillar={json.dumps(pillar)}",
         "--timeout=300"]
    )
    states = results.get(node)
    assert isinstance(states, dict), f"state.apply did not run states: {states}"
    by_id = {v["__id__"]: v for v in states.values()}
    broken = by_id[failing_state]
    assert broken["result"] is False
    assert broken["changes"] == {}
    comment = broken["comment"]
    assert "broken" in comment and reference in comment, comment
    assert phrase in comment, comment
    assert "mpi-images-present-mpi" in by_id
    if failing_state == "mpi-images-present-broken":
        others = {sid: (v["result"], v["changes"]) for sid, v in by_id.items()
                  if sid != failing_state}
        assert all(v == (True, {}) for v in others.values()), others
    else:
        # every image state was held back by the failed check, none ran
        images = {sid: v["comment"] for sid, v in by_id.items() if sid.startswith("mpi-images-")}
        assert all("requisite failed" in c for c in images.values()), images
    assert all(v["changes"] == {} for v in by_id.values())
    assert _local_images(cluster, node) == images_before


@pytest.fixture(scope="module")
def dry_run(cluster):
    return cluster.highstate(test=True)


@pytest.mark.parametrize("node", NODES)
def test_dry_run_on_provisioned_node_reports_no_changes(dry_run, node):
    states = dry_run[node]
    assert states, f"{node} ran no states"
    not_true = {v["__id__"]: (v["result"], v["comment"]) for v in states.values()
                if v["result"] is not True}
    assert not_true == {}
    assert {v["__id__"]: v["changes"] for v in states.values() if v["changes"]} == {}


def test_the_master_starts_without_a_traceback_before_its_first_sync(cluster):
    """A new master has no mpi runner until the first sync: nothing of DockerMPI's may
    run before it (the hourly prune waits its first hour)."""
    _, journal = cluster.exec("master", ["journalctl", "-u", "salt-master", "--no-pager",
                                         "-o", "cat"], stdout_only=True)
    first_run = journal.split("Stopping salt-master.service", 1)[0]
    assert "Started salt-master.service" in first_run
    assert "Traceback" not in first_run, first_run
