"""
Render the real state tree (salt/ plus the repo's _modules, _states and _utils) with
``salt-call --local`` and check what a node would be given.

Nothing is applied: ``state.show_highstate`` renders the top file and every SLS,
with the custom modules synced the way a highstate syncs them. Bad pillars go through
``state.highstate test=True``: the settings check fails, and every other state reports
its failed requisite without running (a real run would install Docker on this host if
that went wrong, so none is made).
"""

import copy
import json
import pathlib
import subprocess
import sys

import pytest
import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]
SALT_CALL = pathlib.Path(sys.executable).with_name("salt-call")

CLUSTER_NETWORK = "172.30.0.0/16"
JOB_ADDRESSES = "172.30.200.0/24"
#: The default port ranges [first, last] the pillars below leave unchanged.
DEFAULT_PORTS = yaml.safe_load((REPO / "salt/dockermpi/defaults.yaml").read_text())["mpi"][
    "ports"
]


def _run(config_dir, *args, check=True):
    proc = subprocess.run(
        [str(SALT_CALL), "--local", "-c", str(config_dir), "--out", "json", *args],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"salt-call {' '.join(args)} failed ({proc.returncode}):\n"
            f"{proc.stdout}\n{proc.stderr}"
        )
    return proc


def _minion(tmp_path, roles, mpi_pillar, init="systemd"):
    """A salt-call --local config whose file_roots never include the repo root, on a
    host booted with ``init`` (the grain; this machine itself boots no systemd)."""
    root = tmp_path / "root"
    extra = tmp_path / "extra_roots"
    pillar_roots = tmp_path / "pillar"
    for path in (root, extra, pillar_roots):
        path.mkdir()
    for extensions in ("_engines", "_modules", "_states", "_utils"):
        (extra / extensions).symlink_to(REPO / extensions)
    (pillar_roots / "top.sls").write_text("base:\n  '*':\n    - mpi\n")
    (pillar_roots / "mpi.sls").write_text(yaml.safe_dump({"mpi": mpi_pillar}))
    config = {
        "id": "render-node",
        "root_dir": str(root),
        "pki_dir": str(root / "pki"),
        "cachedir": str(root / "cache"),
        "sock_dir": str(root / "sock"),
        "log_file": str(root / "minion.log"),
        "file_client": "local",
        "file_roots": {"base": [str(REPO / "salt"), str(extra)]},
        "pillar_roots": {"base": [str(pillar_roots)]},
        "grains": {"roles": roles, "init": init},
        "log_level": "error",
    }
    (tmp_path / "minion").write_text(yaml.safe_dump(config))
    return tmp_path


def _dry_run(config_dir):
    """``state.highstate test=True``: (salt-call's exit code, {state tag: return})."""
    _run(config_dir, "saltutil.sync_all")
    proc = _run(config_dir, "state.highstate", "test=True", "--retcode-passthrough",
                check=False)
    ret = json.loads(proc.stdout)["local"]
    assert isinstance(ret, dict), f"rendering failed: {ret}"
    return proc.returncode, ret


def _highstate(config_dir):
    # a highstate syncs _modules/_states itself; show_highstate does not
    _run(config_dir, "saltutil.sync_all")
    ret = json.loads(_run(config_dir, "state.show_highstate").stdout)["local"]
    assert isinstance(ret, dict), f"rendering failed: {ret}"
    return ret


def _args(high, state_id, function):
    """Arguments of `function` (e.g. 'file.managed') under `state_id`, as a dict."""
    assert state_id in high, f"{state_id} not rendered; have {sorted(high)}"
    mod, fun = function.split(".")
    body = high[state_id][mod]
    assert fun in body, f"{state_id} is not {function}: {body}"
    args = {}
    for item in body:
        if isinstance(item, dict):
            args.update(item)
    args.setdefault("name", state_id)
    return args


NFS_PILLAR = {
    "cluster_network": CLUSTER_NETWORK,
    "job_network": {"addresses": JOB_ADDRESSES},
    "storage": {
        "type": "nfs",
        "path": "/srv/shared",
        "nfs": {"server": "172.30.0.10", "export": "/export/mpi"},
    },
    "images": {
        "openmpi": "registry.test:5000/mpi/openmpi@sha256:" + "ab" * 32,
    },
}

PRESHARED_PILLAR = {
    "cluster_network": CLUSTER_NETWORK,
    "job_network": {
        "name": "mpi-jobs-net",
        "addresses": JOB_ADDRESSES,
        "parent": "eth1",
    },
    "storage": {"type": "preshared", "path": "/data/cluster"},
    "job_root": "/var/local/mpi-jobs",
}


@pytest.fixture(scope="module")
def nfs_high(tmp_path_factory):
    cfg = _minion(
        tmp_path_factory.mktemp("nfs"), ["mpi-node", "mpi-nfs-server"], NFS_PILLAR
    )
    return _highstate(cfg)


@pytest.fixture(scope="module")
def preshared_high(tmp_path_factory):
    cfg = _minion(tmp_path_factory.mktemp("preshared"), ["mpi-node"], PRESHARED_PILLAR)
    return _highstate(cfg)


def test_a_sync_delivers_the_cluster_library_with_the_modules(tmp_path):
    """The Salt modules import dmpi: a node gets it from the master's _utils by the same
    sync that brings them (on the test cluster's hosts nothing else puts it there)."""
    cfg = _minion(tmp_path, ["mpi-node"], PRESHARED_PILLAR)
    synced = json.loads(_run(cfg, "saltutil.sync_all").stdout)["local"]
    assert "utils.dmpi.contract" in synced["utils"]
    extmods = tmp_path / "root" / "var/cache/salt/minion/extmods/utils/dmpi"
    # every module of the package, in its subpackages too
    assert sorted(str(path.relative_to(extmods)) for path in extmods.rglob("*.py")) == sorted(
        str(path.relative_to(REPO / "_utils" / "dmpi"))
        for path in (REPO / "_utils" / "dmpi").rglob("*.py"))


def test_nfs_export_is_the_cluster_networks_hosts_only_and_root_squashed(nfs_high):
    exports = _args(nfs_high, "mpi-storage-nfs-server-exports-file", "file.managed")
    assert exports["name"] == "/etc/exports.d/dockermpi.exports"
    lines = [l for l in exports["contents"] if not l.startswith("#")]
    # 172.30.0.0/16 without the job address pool 172.30.200.0/24: no job can mount it.
    clients = ["172.30.0.0/17", "172.30.128.0/18", "172.30.192.0/21", "172.30.201.0/24",
               "172.30.202.0/23", "172.30.204.0/22", "172.30.208.0/20", "172.30.224.0/19"]
    assert lines == ["/export/mpi " + " ".join(
        f"{net}(rw,sync,root_squash,no_subtree_check,sec=sys)" for net in clients)]
    assert (CLUSTER_NETWORK, JOB_ADDRESSES) == ("172.30.0.0/16", "172.30.200.0/24")
    assert "no_root_squash" not in lines[0]
    assert "*" not in lines[0]


def test_nfs_security_flavour_is_the_exports_and_the_mounts(tmp_path):
    pillar = copy.deepcopy(NFS_PILLAR)
    pillar["storage"]["nfs"]["security"] = "krb5p"
    high = _highstate(_minion(tmp_path, ["mpi-node", "mpi-nfs-server"], pillar))
    exports = _args(high, "mpi-storage-nfs-server-exports-file", "file.managed")["contents"]
    line = [l for l in exports if not l.startswith("#")][0]
    assert line.count("(rw,sync,root_squash,no_subtree_check,sec=krb5p)") == 8
    assert "sec=sys" not in line
    mount = _args(high, "mpi-storage-nfs-client-mount-mounted", "mount.mounted")
    assert mount["opts"][-1] == "sec=krb5p"


def test_nfs_export_reload_only_on_change(nfs_high):
    reload_ = _args(nfs_high, "mpi-storage-nfs-server-exportfs-reload", "module.run")
    assert reload_["onchanges"] == [{"file": "mpi-storage-nfs-server-exports-file"}]
    # An argv list, no shell (the cmd.run state always runs a shell).
    assert reload_["cmd.run_all"] == [{"cmd": ["exportfs", "-ra"]}, {"python_shell": False}]


def test_nfs_users_directory_owned_by_guest(nfs_high):
    users = _args(nfs_high, "mpi-storage-nfs-server-users-directory", "file.directory")
    assert users["name"] == "/export/mpi/users"
    assert (users["user"], users["group"], users["mode"]) == (
        "mpiguest",
        "mpiguest",
        "0711",
    )


def test_nfs_client_mounts_server_export_at_path(nfs_high):
    mount = _args(nfs_high, "mpi-storage-nfs-client-mount-mounted", "mount.mounted")
    assert mount["name"] == "/srv/shared"
    assert mount["device"] == "172.30.0.10:/export/mpi"
    assert mount["fstype"] == "nfs"
    assert mount["opts"] == ["rw", "hard", "noatime", "vers=4.2", "sec=sys"]
    assert "mpi-storage-preshared-path-exists" not in nfs_high


def test_nfs_server_states_come_before_client_mount(nfs_high):
    order = {sid: body["__sls__"] for sid, body in nfs_high.items()}
    assert order["mpi-storage-nfs-server-exports-file"] == "dockermpi.storage.nfs-server"
    assert order["mpi-storage-nfs-client-mount-mounted"] == "dockermpi.storage.nfs-client"


GLUSTERFS_PILLAR = {
    "cluster_network": CLUSTER_NETWORK,
    "job_network": {"addresses": JOB_ADDRESSES},
    "storage": {"type": "glusterfs", "path": "/srv/shared",
                "glusterfs": {"server": "172.30.0.6",
                              "clients": ["172.30.0.5", "172.30.0.11", "node-*.site"]},
                "quota": {"size_mb": 2048, "users": {"filler": {"files": 10}}}},
}


@pytest.fixture(scope="module")
def glusterfs_high(tmp_path_factory):
    cfg = _minion(tmp_path_factory.mktemp("glusterfs"), ["mpi-node", "mpi-glusterfs-server"],
                  GLUSTERFS_PILLAR)
    return _highstate(cfg)


def test_glusterfs_volume_is_served_to_the_hosts_only_and_quotas_come_from_pillar(
        glusterfs_high):
    volume = _args(glusterfs_high, "mpi-storage-glusterfs-server-volume-present",
                   "mpi_storage.volume_present")
    assert volume["name"] == "dockermpi"
    assert volume["bricks"] == ["172.30.0.6:/export/dockermpi-brick"]
    assert volume["clients"] == ["172.30.0.5", "172.30.0.11", "node-*.site"]
    quotas = _args(glusterfs_high, "mpi-storage-glusterfs-server-user-quotas",
                   "mpi_storage.user_quotas")
    assert (quotas["name"], quotas["mount"]) == ("dockermpi", "/srv/shared")
    assert quotas["limits"] == {"size_mb": 2048, "files": 1000000,
                                "users": {"filler": {"files": 10}}, "reserve_percent": 5}


def test_glusterfs_server_mounts_its_volume_before_the_node_and_lays_out_users(
        glusterfs_high):
    for state in ("mpi-storage-glusterfs-server-volume-mounted",
                  "mpi-storage-glusterfs-client-mount-mounted"):
        mount = _args(glusterfs_high, state, "mount.mounted")
        assert (mount["name"], mount["device"], mount["fstype"]) == (
            "/srv/shared", "172.30.0.6:/dockermpi", "glusterfs")
        assert mount["opts"] == ["defaults", "_netdev"]
    users = _args(glusterfs_high, "mpi-storage-glusterfs-server-users-directory",
                  "file.directory")
    assert (users["name"], users["user"], users["mode"]) == ("/srv/shared/users", "mpiguest",
                                                              "0711")
    health = _args(glusterfs_high, "mpi-storage-glusterfs-server-health-directory",
                   "file.directory")
    assert (health["name"], health["user"], health["mode"]) == (
        "/srv/shared/.dockermpi-health", "root", "0700")
    order = {sid: body["__sls__"] for sid, body in glusterfs_high.items()}
    assert order["mpi-storage-glusterfs-server-volume-present"] == \
        "dockermpi.storage.glusterfs-server"


@pytest.mark.parametrize("high", ["nfs_high", "glusterfs_high", "preshared_high"])
def test_every_storage_host_checks_that_only_root_binds_a_privileged_port(request, high):
    found = request.getfixturevalue(high)
    check = _args(found, "mpi-storage-privileged-ports-root-only",
                  "mpi_storage.privileged_ports_root_only")
    assert check["name"] == "net.ipv4.ip_unprivileged_port_start"
    assert found["mpi-storage-privileged-ports-root-only"]["__sls__"] == \
        "dockermpi.storage.hosts"


def test_preshared_checks_path_without_creating_it(preshared_high):
    exists = _args(preshared_high, "mpi-storage-preshared-path-exists", "file.exists")
    assert exists["name"] == "/data/cluster"
    # Every node makes these at once on one file system: a state that lets the first win.
    users = _args(preshared_high, "mpi-storage-preshared-users-directory",
                  "mpi_storage.shared_directory")
    assert users["name"] == "/data/cluster/users"
    assert (users["user"], users["mode"]) == ("mpiguest", "0711")
    assert not [sid for sid in preshared_high if "nfs" in sid]


@pytest.mark.parametrize("high, name, owner", [
    ("nfs_high", "/export/mpi/.dockermpi-health", ("nobody", "nogroup")),
    ("preshared_high", "/data/cluster/.dockermpi-health", ("root", "root")),
])
def test_a_health_directory_for_the_nodes_storage_probe(request, high, name, owner):
    # Written by root on the nodes: under NFS root_squash that root is nobody.
    state, function = ("mpi-storage-nfs-server-health-directory", "file.directory") \
        if high == "nfs_high" else ("mpi-storage-preshared-health-directory",
                                    "mpi_storage.shared_directory")
    found = _args(request.getfixturevalue(high), state, function)
    assert found["name"] == name and (found["user"], found["group"]) == owner
    assert found["mode"] == "0700"


def test_preshared_node_without_nfs_role_gets_no_server(preshared_high):
    assert not [
        sid for sid, body in preshared_high.items() if "nfs" in body["__sls__"]
    ]


@pytest.mark.parametrize("high", ["nfs_high", "preshared_high"])
def test_ids_unique_and_named_by_component(request, high):
    high = request.getfixturevalue(high)
    for sid, body in high.items():
        component = body["__sls__"].split(".")[1]
        assert sid.startswith(f"mpi-{component}-"), (sid, body["__sls__"])
    # salt reports conflicting IDs across SLS files as errors (a list, not a dict);
    # also check every ID comes from exactly one SLS file
    per_sls = {}
    for sid, body in high.items():
        per_sls.setdefault(sid, set()).add(body["__sls__"])
    assert all(len(v) == 1 for v in per_sls.values())


def test_docker_daemon_json(nfs_high):
    cfg = _args(nfs_high, "mpi-docker-config-daemon-json", "file.serialize")
    assert cfg["name"] == "/etc/docker/daemon.json"
    assert cfg["dataset"] == {
        "log-driver": "json-file",
        "log-opts": {"max-size": "10m", "max-file": "3"},
        "insecure-registries": [],
        "live-restore": True,
    }
    assert "hosts" not in cfg["dataset"]
    svc = _args(nfs_high, "mpi-docker-service-running", "service.running")
    assert svc["enable"] is True
    assert {"file": "mpi-docker-config-daemon-json"} in svc["watch"]


def test_firewall_rules_file_matches_live_rules(nfs_high):
    chain = _args(nfs_high, "mpi-firewall-rules-chain-present", "mpi_firewall.chain_present")
    assert chain["name"] == "DOCKERMPI-INPUT"
    assert chain["cluster_network"] == CLUSTER_NETWORK
    rules = _args(nfs_high, "mpi-firewall-persist-rules-file", "file.managed")
    contents = rules["contents"]
    assert ":DOCKERMPI-INPUT - [0:0]" in contents
    for first, last in DEFAULT_PORTS.values():
        assert (
            f"-A DOCKERMPI-INPUT -s {CLUSTER_NETWORK} -p tcp -m tcp "
            f"--dport {first}:{last} -j ACCEPT" in contents
        )
        assert f"-A DOCKERMPI-INPUT -p tcp -m tcp --dport {first}:{last} -j DROP" in contents


def test_firewall_ipv6_chain_drops_ranges_for_all_but_loopback(nfs_high):
    chain = _args(
        nfs_high, "mpi-firewall-rules-ipv6-chain-present", "mpi_firewall.chain_present"
    )
    assert chain["name"] == "DOCKERMPI-INPUT"
    assert chain["family"] == "ipv6"
    assert "cluster_network" not in chain
    v4 = _args(nfs_high, "mpi-firewall-rules-chain-present", "mpi_firewall.chain_present")
    assert v4["family"] == "ipv4"
    assert chain["ports"] == v4["ports"]
    rules = _args(nfs_high, "mpi-firewall-persist-ipv6-rules-file", "file.managed")
    assert rules["name"] == "/etc/dockermpi/firewall6.rules"
    contents = rules["contents"]
    assert ":DOCKERMPI-INPUT - [0:0]" in contents
    assert "-A DOCKERMPI-INPUT -i lo -j RETURN" in contents
    assert "ACCEPT" not in contents and CLUSTER_NETWORK not in contents
    for first, last in DEFAULT_PORTS.values():
        assert f"-A DOCKERMPI-INPUT -p tcp -m tcp --dport {first}:{last} -j DROP" in contents
    unit = _args(nfs_high, "mpi-firewall-persist-unit-file", "file.managed")["contents"]
    assert "ExecStart=/usr/sbin/ip6tables-restore -w --noflush /etc/dockermpi/firewall6.rules" in unit
    assert "ExecStart=/usr/sbin/ip6tables -w -I INPUT 1 -j DOCKERMPI-INPUT" in unit
    svc = _args(nfs_high, "mpi-firewall-persist-service-running", "service.running")
    assert {"file": "mpi-firewall-persist-ipv6-rules-file"} in svc["watch"]


@pytest.mark.parametrize(
    "high,job_root",
    [("nfs_high", "/var/lib/dockermpi/jobs"), ("preshared_high", "/var/local/mpi-jobs")],
)
def test_node_job_root_root_owned_0711_with_namespace_tools(request, high, job_root):
    high = request.getfixturevalue(high)
    root = _args(high, "mpi-node-jobs-root-directory", "file.directory")
    assert root["name"] == job_root
    assert (root["user"], root["group"], root["mode"]) == ("root", "root", "0711")
    assert high["mpi-node-jobs-root-directory"]["__sls__"] == "dockermpi.node.jobs"
    pkg = _args(high, "mpi-node-jobs-tools-installed", "pkg.installed")
    assert pkg["pkgs"] == ["util-linux", "iptables", "openssh-client"]


def _engine_revision_of_this_tree(tmp_path):
    """The engine revision of this tree's code, laid out as a minion's sync lays it out."""
    sys.path.insert(0, str(REPO / "_utils"))
    try:
        from dmpi.node.revision import engine_revision
    finally:
        sys.path.remove(str(REPO / "_utils"))
    for synced, source in (("engines/mpi_node.py", "_engines/mpi_node.py"),
                           ("modules/mpi_job.py", "_modules/mpi_job.py"),
                           ("utils/dmpi", "_utils/dmpi")):
        (tmp_path / synced).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / synced).symlink_to(REPO / source)
    return engine_revision(str(tmp_path))


def test_the_node_engine_runs_with_health_reports_and_restarts_the_minion_until_it_does(
        preshared_high, tmp_path):
    # The master schedules nothing on a node without health evidence: a minion whose
    # engine was configured before health reports must restart into one that sends them;
    # and one started before the engine's code was upgraded restarts into the new code.
    config = _args(preshared_high, "mpi-node-engine-config", "file.serialize")
    wanted = {"storage_path": "/data/cluster", "job_root": "/var/local/mpi-jobs",
              "health": 10, "revision": _engine_revision_of_this_tree(tmp_path)}
    # The minion runs DockerMPI's calls in threads, where its library stays loaded.
    assert config["dataset"] == {"multiprocessing": False, "engines": [{"mpi_node": wanted}]}
    restart = _args(preshared_high, "mpi-node-engine-minion-restart", "module.run")
    unless = restart["unless"][0]
    assert unless.pop("fun") == "mpi_config.node_engine_running"
    assert unless == dict(wanted, multiprocessing=False)
    # Nothing of the highstate may still run when the minion restarts.
    assert restart["order"] == "last"
    # saltutil.kill_job of a call in a thread signals the minion itself: it comes back.
    policy = _args(preshared_high, "mpi-node-minion-restarts-always", "file.managed")
    assert policy["name"] == "/etc/systemd/system/salt-minion.service.d/dockermpi.conf"
    assert "Restart=always" in policy["contents"].splitlines()
    reload = _args(preshared_high, "mpi-node-minion-restarts-always-loaded", "module.run")
    assert reload["cmd.run_all"][0]["cmd"] == ["systemctl", "daemon-reload"]
    assert reload["onchanges"] == [{"file": "mpi-node-minion-restarts-always"}]


def test_job_network_on_cluster_network_after_docker_service(nfs_high):
    net = _args(nfs_high, "mpi-docker-network-present", "mpi_network.present")
    assert net["name"] == "dmpi-jobs"
    assert (net["subnet"], net["ip_range"]) == (CLUSTER_NETWORK, JOB_ADDRESSES)
    # empty parent: the module picks the interface holding the cluster address
    assert net["parent"] is None
    assert net["require"] == [
        {"sls": "dockermpi.config"},
        {"service": "mpi-docker-service-running"},
    ]
    assert nfs_high["mpi-docker-network-present"]["__sls__"] == "dockermpi.docker.network"


def test_job_network_name_and_parent_from_pillar(preshared_high):
    net = _args(preshared_high, "mpi-docker-network-present", "mpi_network.present")
    assert (net["name"], net["parent"]) == ("mpi-jobs-net", "eth1")
    assert net["ip_range"] == JOB_ADDRESSES


def test_images_rendered_with_digest_reference(nfs_high):
    img = _args(nfs_high, "mpi-images-present-openmpi", "mpi_image.present")
    assert img["name"] == "openmpi"
    assert img["reference"] == NFS_PILLAR["images"]["openmpi"]


def test_standby_namespaces_from_the_first_approved_image_after_images(nfs_high):
    standby = _args(nfs_high, "mpi-node-standby-namespaces", "mpi_standby.present")
    assert (standby["name"], standby["count"]) == ("openmpi", 2)
    assert standby["image"] == NFS_PILLAR["images"]["openmpi"]
    assert {"sls": "dockermpi.images"} in standby["require"]


def test_no_standby_namespaces_without_an_approved_image(preshared_high):
    assert "mpi-node-standby-namespaces" not in preshared_high


def test_guest_user(preshared_high):
    user = _args(preshared_high, "mpi-guest-user-user-present", "user.present")
    assert (user["name"], user["uid"], user["gid"]) == ("mpiguest", 2000, 2000)
    assert user["createhome"] is False


# ---------------------------------------------------------------- the settings check

CONFIG_ID = "mpi-config-settings-valid"


@pytest.mark.parametrize("high", ["nfs_high", "preshared_high"])
def test_settings_check_gets_the_merged_settings(request, high):
    high = request.getfixturevalue(high)
    check = _args(high, CONFIG_ID, "mpi_config.valid")
    assert high[CONFIG_ID]["__sls__"] == "dockermpi.config"
    assert check["name"] == "mpi"
    config = check["config"]
    assert config["cluster_network"] == CLUSTER_NETWORK
    assert config["job_network"]["addresses"] == JOB_ADDRESSES
    assert config["ports"] == DEFAULT_PORTS  # defaults under the pillar
    assert config["guest"]["user"] == "mpiguest"


@pytest.mark.parametrize("high", ["nfs_high", "preshared_high"])
def test_every_state_requires_the_settings_check(request, high):
    high = request.getfixturevalue(high)
    assert len(high) > 10
    for sid, body in high.items():
        if body["__sls__"] == "dockermpi.config":  # the checks themselves
            continue
        for module, args in body.items():
            if module.startswith("__"):
                continue
            requires = [r for a in args if isinstance(a, dict) for r in a.get("require", [])]
            assert {"sls": "dockermpi.config"} in requires, sid


def _assert_only_the_check_failed(ret, *fragments):
    """The settings check failed naming every fragment; no other state ran."""
    (check,) = [r for tag, r in ret.items() if tag.startswith("mpi_config_|-")]
    assert check["result"] is False
    assert check["changes"] == {}
    for fragment in fragments:
        assert fragment in check["comment"].splitlines(), check["comment"]
    others = {tag: r for tag, r in ret.items() if not tag.startswith("mpi_config_|-")
              and r["__id__"] != "mpi-config-host-boots-systemd"}
    assert others
    for tag, other in others.items():
        assert other["result"] is False, (tag, other)
        assert other["changes"] == {}, (tag, other)
        assert other["comment"].startswith("One or more requisite failed"), (tag, other)


OVERLAPPING_PORTS = {"oob": [20100, 20299], "btl": [20250, 20999]}


@pytest.mark.parametrize(
    "roles,pillar",
    [
        (["mpi-node", "mpi-nfs-server"], dict(NFS_PILLAR, ports=OVERLAPPING_PORTS)),
        (["mpi-node"], dict(PRESHARED_PILLAR, ports=OVERLAPPING_PORTS)),
        (["mpi-nfs-server"], dict(NFS_PILLAR, ports=OVERLAPPING_PORTS)),
    ],
    ids=["nfs-node-and-server", "preshared-node", "nfs-server-only"],
)
def test_overlapping_ports_fail_the_check_and_nothing_else_runs(tmp_path, roles, pillar):
    code, ret = _dry_run(_minion(tmp_path, roles, pillar))
    assert code != 0
    _assert_only_the_check_failed(
        ret, "mpi:ports:oob 20100-20299 overlaps mpi:ports:btl 20250-20999"
    )
    states = {r["__id__"] for r in ret.values()}
    if "mpi-nfs-server" in roles:
        assert "mpi-storage-nfs-server-exports-file" in states
    if "mpi-node" in roles:
        assert {"mpi-docker-service-running", "mpi-firewall-rules-chain-present"} <= states


@pytest.mark.parametrize("roles", [["mpi-node"], ["mpi-hub"], ["mpi-master"]])
def test_a_host_without_systemd_is_told_so_and_nothing_runs(tmp_path, roles):
    code, ret = _dry_run(_minion(tmp_path, roles, PRESHARED_PILLAR, init="sysvinit"))
    assert code != 0
    by_id = {r["__id__"]: r for r in ret.values()}
    check = by_id.pop("mpi-config-host-boots-systemd")
    assert (check["result"], check["changes"]) == (False, {})
    assert check["comment"] == (
        "DockerMPI needs a host booted with systemd as PID 1 (grain init is sysvinit): its "
        "states manage Docker, the firewall and Salt's own restarts as systemd units; "
        "install systemd-sysv and reboot, or use a host that boots systemd")
    assert by_id.pop("mpi-config-settings-valid")["result"] is True
    assert by_id
    for sid, other in by_id.items():
        assert other["result"] is False and other["changes"] == {}, (sid, other)
        assert other["comment"].startswith("One or more requisite failed"), (sid, other)


def test_every_problem_reported_at_once(tmp_path):
    pillar = {
        "job_network": {"addresses": ""},
        "storage": {"type": "nfs", "nfs": {"server": ""}},
        "slots_per_node": 0,
    }
    code, ret = _dry_run(_minion(tmp_path, ["mpi-node"], pillar))
    assert code != 0
    _assert_only_the_check_failed(
        ret,
        "mpi:job_network:addresses is required: it must name the job address pool, an "
        "IPv4 network (CIDR) inside mpi:cluster_network holding no node's address, "
        "e.g. 10.0.200.0/24",
        "mpi:storage:nfs:server must name the NFS server when mpi:storage:type is nfs",
        "mpi:slots_per_node must be a whole number of at least 1, got 0",
    )


def test_unknown_storage_type_fails_the_check(tmp_path):
    pillar = dict(PRESHARED_PILLAR, storage={"type": "ceph"})
    code, ret = _dry_run(_minion(tmp_path, ["mpi-node"], pillar))
    assert code != 0
    _assert_only_the_check_failed(
        ret, "mpi:storage:type must be one of nfs, glusterfs, preshared, got 'ceph'"
    )


def test_bad_firewall_values_still_render_the_check(tmp_path):
    # restore_payload would refuse these while rendering; persist.sls skips it
    pillar = dict(PRESHARED_PILLAR, cluster_network="10.0.0.1/8",
                  ports={"sshd": [20000, 70000]})
    code, ret = _dry_run(_minion(tmp_path, ["mpi-node"], pillar))
    assert code != 0
    _assert_only_the_check_failed(
        ret,
        "mpi:cluster_network '10.0.0.1/8' is not an IPv4 network in CIDR form with no "
        "host bits set (10.0.0.1/8 has host bits set)",
        "mpi:ports:sshd 20000-70000 must lie within 1024-65535 (jobs listen on them as "
        "their user's uid)",
    )


def test_pillar_not_a_mapping_fails_rendering_clearly(tmp_path):
    cfg = _minion(tmp_path, ["mpi-node"], "ports: overlapping")
    _run(cfg, "saltutil.sync_all")
    proc = _run(cfg, "state.show_highstate", check=False)
    assert proc.returncode != 0
    assert "mpi must be a mapping of settings, got 'ports: overlapping'" in (
        proc.stdout + proc.stderr
    )


def test_states_get_normalised_settings(tmp_path):
    pillar = dict(PRESHARED_PILLAR, storage={"type": "preshared", "path": "/data//cluster/"},
                  job_root="/var/local/mpi-jobs/")
    high = _highstate(_minion(tmp_path, ["mpi-node"], pillar))
    exists = _args(high, "mpi-storage-preshared-path-exists", "file.exists")
    assert exists["name"] == "/data/cluster"
    users = _args(high, "mpi-storage-preshared-users-directory", "mpi_storage.shared_directory")
    assert users["name"] == "/data/cluster/users"
    root = _args(high, "mpi-node-jobs-root-directory", "file.directory")
    assert root["name"] == "/var/local/mpi-jobs"
