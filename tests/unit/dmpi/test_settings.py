"""
Unit tests for the DockerMPI settings: :mod:`dmpi.settings` (the merge of the ``mpi``
pillar over defaults.yaml and the check of the result), and the
``mpi_config`` execution and state modules that bring it to the formula.

Every check is held to its exact message: a site admin reads it in the highstate output
and must know which pillar key to fix and why. The shipped settings (defaults.yaml, the
test cluster's pillar, pillar.example) must pass.
"""

import copy
import math
import pathlib

import pytest
import salt.utils.dictupdate
import yaml
from salt.exceptions import SaltInvocationError

from dmpi import settings
from tests.extension import load_extension

REPO = pathlib.Path(__file__).resolve().parents[3]

mpi_config_module = load_extension("_modules/mpi_config.py", "mpi_config_module")
mpi_config_state = load_extension("_states/mpi_config.py", "mpi_config_state")
ConfigError = settings.ConfigError

DEFAULTS = yaml.safe_load((REPO / "salt/dockermpi/defaults.yaml").read_text())["mpi"]
TESTCLUSTER = yaml.safe_load((REPO / "pillar/testcluster.sls").read_text())["mpi"]
EXAMPLE = yaml.safe_load((REPO / "pillar/pillar.example").read_text())["mpi"]
DIGEST = "sha256:" + "0123456789abcdef" * 4
IMAGE = f"10.251.1.2:5000/dockermpi/mpi@{DIGEST}"
#: A site as the test cluster's, on NFS, with an approved image: valid.
SITE = {
    "cluster_network": "10.251.1.0/24",
    "job_network": {"addresses": "10.251.1.128/25"},
    "storage": {"type": "nfs", "nfs": {"server": "10.251.1.10"}},
    "images": {"mpi": IMAGE},
}
#: The two settings defaults.yaml leaves for every site to make (both required).
REQUIRED_BY_SITE = [
    "mpi:storage:nfs:server must name the NFS server when mpi:storage:type is nfs",
    "mpi:job_network:addresses is required: it must name the job address pool, an IPv4 "
    "network (CIDR) inside mpi:cluster_network holding no node's address, e.g. "
    "10.0.200.0/24",
]


def _site(**overrides):
    """Merged settings of SITE with ``overrides`` laid over it (as pillar would be)."""
    return settings.merge(DEFAULTS, settings.merge(SITE, overrides))


def _problems(**overrides):
    return settings.problems(_site(**overrides))


def _leaves(mapping, prefix=()):
    for key, value in mapping.items():
        if isinstance(value, dict) and value:
            yield from _leaves(value, prefix + (key,))
        else:
            yield prefix + (key,)


# ---------------------------------------------------------------------------- merge


def test_merge_is_salts_recursive_merge_without_list_merging():
    for pillar in (TESTCLUSTER, EXAMPLE, SITE, {}):
        assert settings.merge(DEFAULTS, pillar) == salt.utils.dictupdate.merge(
            copy.deepcopy(DEFAULTS), copy.deepcopy(pillar), strategy="recurse",
            merge_lists=False)


def test_merge_mappings_key_by_key_lists_and_scalars_replace():
    merged = settings.merge(
        {"a": {"x": 1, "y": [1, 2]}, "b": [1], "c": {"d": 1}},
        {"a": {"y": [3]}, "b": [2], "c": None, "e": 5},
    )
    assert merged == {"a": {"x": 1, "y": [3]}, "b": [2], "c": None, "e": 5}


def test_merge_changes_neither_input_and_shares_nothing():
    defaults = copy.deepcopy(DEFAULTS)
    pillar = copy.deepcopy(TESTCLUSTER)
    merged = settings.merge(defaults, pillar)
    assert defaults == DEFAULTS and pillar == TESTCLUSTER
    merged["storage"]["nfs"]["mount_options"].append("x")
    merged["docker"]["insecure_registries"].append("y")
    assert defaults == DEFAULTS and pillar == TESTCLUSTER


def test_merge_without_pillar_gives_the_defaults():
    assert settings.merge(DEFAULTS, None) == DEFAULTS
    assert settings.merge(DEFAULTS, {}) == DEFAULTS


@pytest.mark.parametrize("pillar", ["ports: 1", ["a"], 3])
def test_merge_refuses_a_pillar_that_is_not_a_mapping(pillar):
    with pytest.raises(ConfigError, match=r"^mpi must be a mapping of settings, got "):
        settings.merge(DEFAULTS, pillar)


# ------------------------------------------------------------- shipped settings pass


def test_test_cluster_pillar_is_valid():
    config = settings.validate(settings.merge(DEFAULTS, TESTCLUSTER))
    assert config["job_network"]["addresses"] == "10.251.1.128/25"


def test_defaults_and_example_leave_exactly_the_required_settings_to_the_site():
    assert settings.problems(DEFAULTS) == REQUIRED_BY_SITE
    assert settings.problems(settings.merge(DEFAULTS, EXAMPLE)) == REQUIRED_BY_SITE


def test_pillar_example_is_valid_with_its_documented_examples():
    example = copy.deepcopy(EXAMPLE)
    # the values pillar.example gives as "e.g." for its two required settings
    example["storage"]["nfs"]["server"] = "10.0.0.10"
    example["job_network"]["addresses"] = "10.0.200.0/24"
    example["job_network"]["parent"] = "eth1"
    example["docker"]["insecure_registries"] = ["10.0.0.10:5000"]
    example["docker"]["registry_credentials"] = {
        "10.0.0.10:5000": {"username": "dockermpi", "password": "..."}}
    example["images"] = {"openmpi": f"10.0.0.10:5000/dockermpi/openmpi@{DIGEST}"}
    settings.validate(settings.merge(DEFAULTS, example))


def test_pillar_example_documents_every_default():
    assert sorted(_leaves(EXAMPLE)) == sorted(_leaves(DEFAULTS))


def test_every_setting_of_the_defaults_is_checked():
    """A key missing from the settings is reported by name: the check knows every key."""
    for path in _leaves(DEFAULTS):
        config = _site()
        parent = config
        for key in path[:-1]:
            parent = parent[key]
        del parent[path[-1]]
        assert settings.problems(config) == [f"mpi:{':'.join(path)} is required"], path


# ------------------------------------------------------------------ every check


CASES = [
    # structure
    ({"slot_per_node": 4},
     "mpi:slot_per_node is not a DockerMPI setting (the keys of mpi are: users, guest, "
     "cluster_network, ports, slots_per_node, placement, queue_order, fair_share, selftest, limits, retention, storage, "
     "docker, job_network, images, image_facts, job_root, firewall, hub, api, engine)"),
    ({"placement": "random"}, "mpi:placement must be one of pack, spread, got 'random'"),
    ({"placement": ["spread"]}, "mpi:placement must be one of pack, spread, got ['spread']"),
    ({"queue_order": "turns"}, "mpi:queue_order must be one of fair, fifo, got 'turns'"),
    ({"fair_share": {"half_life": "2w"}},
     "mpi:fair_share:half_life '2w' is not a time: use 90s, 30m, 2h, 1d, MM:SS, HH:MM:SS, "
     "D-HH or D-HH:MM:SS"),
    ({"fair_share": {"half_life": 168}},
     "mpi:fair_share:half_life 168 has no unit (seconds or minutes?): use 90s, 30m, 2h, 1d, "
     "MM:SS, HH:MM:SS, D-HH or D-HH:MM:SS"),
    ({"fair_share": {"max_age": "0s"}}, "mpi:fair_share:max_age '0s' must be longer than zero"),
    ({"fair_share": {"max_age": "4000d"}},
     "mpi:fair_share:max_age '4000d' is longer than ten years"),
    ({"fair_share": {"weight_age": -1}},
     "mpi:fair_share:weight_age must be a whole number from 0 to 1000000, got -1"),
    ({"fair_share": {"weight_fairshare": 2.5}},
     "mpi:fair_share:weight_fairshare must be a whole number from 0 to 1000000, got 2.5"),
    ({"fair_share": {"half_life_hours": 168}},
     "mpi:fair_share:half_life_hours is not a DockerMPI setting (the keys of mpi:fair_share "
     "are: half_life, max_age, weight_fairshare, weight_age)"),
    ({"fair_share": "7d"}, "mpi:fair_share must be a mapping, got '7d'"),
    ({"retention": {"job_records_days": -1}},
     "mpi:retention:job_records_days must be a whole number from 0 to 36500 (days; 0: keep "
     "forever), got -1"),
    ({"retention": {"job_dirs_days": "30d"}},
     "mpi:retention:job_dirs_days must be a whole number from 0 to 36500 (days; 0: keep "
     "forever), got '30d'"),
    ({"retention": {"keep_days": 3}},
     "mpi:retention:keep_days is not a DockerMPI setting (the keys of mpi:retention are: "
     "job_records_days, job_dirs_days)"),
    # the job controller
    ({"engine": {"probe_port": 0}},
     "mpi:engine:probe_port must be a whole number from 1 to 65535 (a TCP port every "
     "node's host answers or refuses on), got 0"),
    ({"engine": {"probe_port": "ssh"}},
     "mpi:engine:probe_port must be a whole number from 1 to 65535 (a TCP port every "
     "node's host answers or refuses on), got 'ssh'"),
    ({"engine": {"silent_grace": -1}},
     "mpi:engine:silent_grace must be a whole number from 0 to 86400 (seconds; 0: a silent "
     "node's jobs fail after 5 s, whatever its host answers), got -1"),
    ({"engine": {"silent_grace": 90.5}},
     "mpi:engine:silent_grace must be a whole number from 0 to 86400 (seconds; 0: a silent "
     "node's jobs fail after 5 s, whatever its host answers), got 90.5"),
    ({"engine": {"grace": 30}},
     "mpi:engine:grace is not a DockerMPI setting (the keys of mpi:engine are: probe_port, "
     "silent_grace)"),
    ({"engine": []}, "mpi:engine must be a mapping, got []"),
    ({"storage": {"nfs": {"servr": "x"}}},
     "mpi:storage:nfs:servr is not a DockerMPI setting (the keys of mpi:storage:nfs are: "
     "server, export, mount_options, security)"),
    ({"ports": {"ssh": [30000, 30001]}},
     "mpi:ports:ssh is not a DockerMPI setting (the keys of mpi:ports are: sshd, oob, btl)"),
    ({"limits": None}, "mpi:limits must be a mapping, got None"),
    ({"storage": {"nfs": "10.0.0.1:/export"}},
     "mpi:storage:nfs must be a mapping, got '10.0.0.1:/export'"),
    # users and the guest account
    ({"users": {"uid_min": 500}},
     "mpi:users:uid_min must be a whole number from 1000 to 2147483646 (below it are the "
     "hosts' system accounts), got 500"),
    ({"users": {"uid_max": "199999"}},
     "mpi:users:uid_max must be a whole number from 1000 to 2147483646, got '199999'"),
    ({"users": {"uid_max": 2**31}},
     "mpi:users:uid_max must be a whole number from 1000 to 2147483646, got 2147483648"),
    ({"users": {"uid_min": 200000, "uid_max": 100000}},
     "mpi:users:uid_min 200000 must be below mpi:users:uid_max 100000"),
    ({"users": {"uid_min": 100000, "uid_max": 100000}},
     "mpi:users:uid_min 100000 must be below mpi:users:uid_max 100000"),
    ({"users": {"uid_min": 60000, "uid_max": 70000}},
     "mpi:users 60000-70000 includes 65534 (nobody, which NFS maps root to): move the range"),
    ({"guest": {"uid": 150000}},
     "mpi:guest:uid 150000 lies inside mpi:users 100000-199999: a user's uid must differ "
     "from the guest account's"),
    ({"guest": {"gid": 100000}},
     "mpi:guest:gid 100000 lies inside mpi:users 100000-199999: a user's private group "
     "(gid = uid) must differ from the guest group"),
    ({"guest": {"uid": 0}},
     "mpi:guest:uid must be a whole number from 1 to 2147483646 (not root), got 0"),
    ({"guest": {"gid": True}},
     "mpi:guest:gid must be a whole number from 1 to 2147483646 (not root), got True"),
    ({"guest": {"user": "Mpi Guest"}},
     "mpi:guest:user 'Mpi Guest' is not a POSIX account name (a-z, 0-9, '_', '-', at "
     "most 32)"),
    ({"guest": {"group": ""}},
     "mpi:guest:group '' is not a POSIX group name (a-z, 0-9, '_', '-', at most 32)"),
    # the cluster network
    ({"cluster_network": "10.251.1.1/24"},
     "mpi:cluster_network '10.251.1.1/24' is not an IPv4 network in CIDR form with no host "
     "bits set (10.251.1.1/24 has host bits set)"),
    ({"cluster_network": "fd00::/64"},
     "mpi:cluster_network 'fd00::/64' is not an IPv4 network in CIDR form with no host bits "
     "set (Expected 4 octets in 'fd00::')"),
    ({"cluster_network": 167772160},
     "mpi:cluster_network 167772160 is not an IPv4 network in CIDR form with no host bits "
     "set (not text)"),
    ({"cluster_network": "10.251.1.0/31"},
     "mpi:cluster_network 10.251.1.0/31 is too small: it must hold the nodes, a gateway "
     "and the job address pool"),
    # ports
    ({"ports": {"oob": [20100, 20299], "btl": [20250, 20999]}},
     "mpi:ports:oob 20100-20299 overlaps mpi:ports:btl 20250-20999"),
    ({"ports": {"sshd": [20000, 20100]}},
     "mpi:ports:sshd 20000-20100 overlaps mpi:ports:oob 20100-20299"),
    ({"ports": {"sshd": [20500, 20500]}},
     "mpi:ports:sshd 20500-20500 overlaps mpi:ports:btl 20300-20999"),
    ({"ports": {"sshd": [22, 99]}},
     "mpi:ports:sshd 22-99 must lie within 1024-65535 (jobs listen on them as their "
     "user's uid)"),
    ({"ports": {"btl": [60000, 65536]}},
     "mpi:ports:btl 60000-65536 must lie within 1024-65535 (jobs listen on them as their "
     "user's uid)"),
    ({"ports": {"btl": [20999, 20300]}},
     "mpi:ports:btl 20999-20300 is empty: the first port is above the last"),
    ({"ports": {"sshd": "20000-20099"}},
     "mpi:ports:sshd must be a list of two whole numbers [first, last], got '20000-20099'"),
    ({"ports": {"sshd": [20000]}},
     "mpi:ports:sshd must be a list of two whole numbers [first, last], got [20000]"),
    ({"ports": {"oob": [True, 20299]}},
     "mpi:ports:oob must be a list of two whole numbers [first, last], got [True, 20299]"),
    ({"ports": {"oob": [20100, 20102]}},
     "mpi:ports:oob 20100-20102 has 3 port(s); a job needs at least 4 (mpirun and an "
     "orted, each on IPv4 and IPv6)"),
    ({"slots_per_node": 8, "ports": {"btl": [20300, 20310]}},
     "mpi:ports:btl 20300-20310 has 11 port(s); mpi:slots_per_node 8 needs at least 16 "
     "(each rank listens on IPv4 and IPv6)"),
    # slots
    ({"slots_per_node": 0}, "mpi:slots_per_node must be a whole number of at least 1, got 0"),
    ({"slots_per_node": "2"},
     "mpi:slots_per_node must be a whole number of at least 1, got '2'"),
    ({"slots_per_node": 1.5},
     "mpi:slots_per_node must be a whole number of at least 1, got 1.5"),
    # limits
    ({"limits": {"max_np": 0}}, "mpi:limits:max_np must be a whole number of at least 1, got 0"),
    ({"limits": {"max_walltime": "1h"}},
     "mpi:limits:max_walltime must be a whole number of at least 1, got '1h'"),
    ({"limits": {"max_cmd_bytes": -1}},
     "mpi:limits:max_cmd_bytes must be a whole number of at least 1, got -1"),
    ({"limits": {"max_env_bytes": None}},
     "mpi:limits:max_env_bytes must be a whole number of at least 1, got None"),
    ({"limits": {"max_cmd_words": 0}},
     "mpi:limits:max_cmd_words must be a whole number of at least 1, got 0"),
    ({"limits": {"max_env_vars": 2.0}},
     "mpi:limits:max_env_vars must be a whole number of at least 1, got 2.0"),
    ({"limits": {"max_running_jobs_per_user": -1}},
     "mpi:limits:max_running_jobs_per_user must be a whole number of at least 0 (0: no "
     "limit), got -1"),
    ({"limits": {"max_slots_per_user": "none"}},
     "mpi:limits:max_slots_per_user must be a whole number of at least 0 (0: no limit), "
     "got 'none'"),
    ({"limits": {"max_queued_jobs_per_user": False}},
     "mpi:limits:max_queued_jobs_per_user must be a whole number of at least 0 (0: no "
     "limit), got False"),
    ({"limits": {"memory_per_slot_mb": 0}},
     "mpi:limits:memory_per_slot_mb must be a whole number of at least 1, got 0"),
    ({"limits": {"pids_per_slot": 0.5}},
     "mpi:limits:pids_per_slot must be a whole number of at least 1, got 0.5"),
    ({"limits": {"tmp_size_mb": "1G"}},
     "mpi:limits:tmp_size_mb must be a whole number of at least 1, got '1G'"),
    ({"limits": {"cpus_per_slot": 0}},
     "mpi:limits:cpus_per_slot must be a number above 0 (CPUs per rank), got 0"),
    ({"limits": {"cpus_per_slot": "1"}},
     "mpi:limits:cpus_per_slot must be a number above 0 (CPUs per rank), got '1'"),
    ({"limits": {"cpus_per_slot": math.inf}},
     "mpi:limits:cpus_per_slot must be a number above 0 (CPUs per rank), got inf"),
    # storage and job_root
    ({"storage": {"type": "ceph"}}, "mpi:storage:type must be one of nfs, glusterfs, preshared, got 'ceph'"),
    ({"storage": {"path": "srv/dockermpi"}},
     "mpi:storage:path must be an absolute path, got 'srv/dockermpi'"),
    ({"storage": {"path": "/srv/../etc"}}, "mpi:storage:path '/srv/../etc' must not contain '..'"),
    ({"storage": {"path": "/srv/my data"}},
     "mpi:storage:path '/srv/my data' must not contain white space or control characters"),
    ({"storage": {"path": "//"}}, "mpi:storage:path must not be the root directory /"),
    ({"storage": {"nfs": {"server": ""}}},
     "mpi:storage:nfs:server must name the NFS server when mpi:storage:type is nfs"),
    ({"storage": {"nfs": {"server": None}}},
     "mpi:storage:nfs:server must name the NFS server when mpi:storage:type is nfs"),
    ({"storage": {"nfs": {"server": "nfs server"}}},
     "mpi:storage:nfs:server 'nfs server' is not a host name or IPv4 address"),
    ({"storage": {"nfs": {"server": "10.0.0.300"}}},
     "mpi:storage:nfs:server '10.0.0.300' is not a host name or IPv4 address"),
    ({"storage": {"nfs": {"server": "nfs:/export"}}},
     "mpi:storage:nfs:server 'nfs:/export' is not a host name or IPv4 address"),
    ({"storage": {"nfs": {"export": "export/mpi"}}},
     "mpi:storage:nfs:export must be an absolute path, got 'export/mpi'"),
    ({"storage": {"nfs": {"mount_options": "rw,hard"}}},
     "mpi:storage:nfs:mount_options must be a list of mount options (one per item, no "
     "commas), got 'rw,hard'"),
    ({"storage": {"nfs": {"mount_options": ["rw,hard"]}}},
     "mpi:storage:nfs:mount_options must be a list of mount options (one per item, no "
     "commas), got ['rw,hard']"),
    ({"storage": {"nfs": {"security": "krb5p2"}}},
     "mpi:storage:nfs:security must be one of sys, krb5, krb5i, krb5p, got 'krb5p2'"),
    ({"storage": {"nfs": {"mount_options": ["rw", "sec=none"]}}},
     "mpi:storage:nfs:mount_options must not hold sec=: mpi:storage:nfs:security sets it "
     "for the export and the mounts alike"),
    ({"job_root": "var/lib/dockermpi/jobs"},
     "mpi:job_root must be an absolute path, got 'var/lib/dockermpi/jobs'"),
    ({"job_root": "/"}, "mpi:job_root must not be the root directory /"),
    ({"job_root": "/srv/dockermpi/keys"},
     "mpi:job_root /srv/dockermpi/keys lies inside mpi:storage:path /srv/dockermpi: "
     "per-job secrets must stay on node-local disk"),
    ({"job_root": "/srv/dockermpi"},
     "mpi:job_root /srv/dockermpi lies inside mpi:storage:path /srv/dockermpi: per-job "
     "secrets must stay on node-local disk"),
    ({"job_root": "/export/dockermpi/jobs"},
     "mpi:job_root /export/dockermpi/jobs lies inside mpi:storage:nfs:export "
     "/export/dockermpi: per-job secrets must stay on node-local disk"),
    # docker
    ({"docker": {"package": "Docker IO"}},
     "mpi:docker:package 'Docker IO' is not a Debian package name"),
    ({"docker": {"log_max_size": "10 MB"}},
     "mpi:docker:log_max_size must be a size such as 10m (a whole number, optionally with "
     "k, m or g), got '10 MB'"),
    ({"docker": {"log_max_size": 0}},
     "mpi:docker:log_max_size must be a size such as 10m (a whole number, optionally with "
     "k, m or g), got 0"),
    ({"docker": {"log_max_file": 0}},
     "mpi:docker:log_max_file must be a whole number of at least 1, got 0"),
    ({"docker": {"insecure_registries": "10.251.1.2:5000"}},
     "mpi:docker:insecure_registries must be a list of host:port entries, got "
     "'10.251.1.2:5000'"),
    ({"docker": {"insecure_registries": ["http://10.251.1.2:5000"]}},
     "mpi:docker:insecure_registries entry 'http://10.251.1.2:5000' must be host:port (or a "
     "CIDR), without a scheme or path"),
    ({"docker": {"registry_credentials": ["10.251.1.2:5000"]}},
     "mpi:docker:registry_credentials must be a mapping of registry (host:port) to username "
     "and password, got a list"),
    ({"docker": {"registry_credentials": {"https://10.251.1.2:5000": {
        "username": "u", "password": "p"}}}},
     "mpi:docker:registry_credentials key 'https://10.251.1.2:5000' must be a registry as "
     "image references name it (host or host:port, without a scheme or path)"),
    ({"docker": {"registry_credentials": {"10.251.1.2:5000": {"username": "u",
                                                               "password": "p", "x": 1}}}},
     "mpi:docker:registry_credentials:10.251.1.2:5000 must be a mapping of exactly username "
     "and password, both non-empty text"),
    ({"docker": {"registry_credentials": {"10.251.1.2:5000": {"username": "u",
                                                               "password": 1234}}}},
     "mpi:docker:registry_credentials:10.251.1.2:5000 must be a mapping of exactly username "
     "and password, both non-empty text"),
    # the job network
    ({"job_network": {"addresses": ""}}, REQUIRED_BY_SITE[1]),
    ({"job_network": {"addresses": None}}, REQUIRED_BY_SITE[1]),
    ({"job_network": {"addresses": "10.251.1.129/25"}},
     "mpi:job_network:addresses '10.251.1.129/25' is not an IPv4 network in CIDR form with "
     "no host bits set (10.251.1.129/25 has host bits set)"),
    ({"job_network": {"addresses": "10.251.2.0/25"}},
     "mpi:job_network:addresses 10.251.2.0/25 is not inside mpi:cluster_network "
     "10.251.1.0/24"),
    ({"job_network": {"addresses": "10.251.0.0/16"}},
     "mpi:job_network:addresses 10.251.0.0/16 is not inside mpi:cluster_network "
     "10.251.1.0/24"),
    ({"job_network": {"addresses": "10.251.1.0/24"}},
     "mpi:job_network:addresses 10.251.1.0/24 is the whole of mpi:cluster_network: the "
     "pool must leave room for the nodes and the gateway"),
    ({"job_network": {"addresses": "10.251.1.200/32"}},
     "mpi:job_network:addresses 10.251.1.200/32 has 1 host address; a job on two nodes "
     "needs at least 2"),
    ({"job_network": {"name": "dmpi jobs"}},
     "mpi:job_network:name 'dmpi jobs' is not a Docker network name (letters, digits, '_', "
     "'.', '-', starting with a letter or digit, at most 64)"),
    ({"job_network": {"name": "-jobs"}},
     "mpi:job_network:name '-jobs' is not a Docker network name (letters, digits, '_', "
     "'.', '-', starting with a letter or digit, at most 64)"),
    ({"job_network": {"standby": 17}},
     "mpi:job_network:standby must be a whole number from 0 to 16 (network namespaces a "
     "node keeps made ahead of jobs), got 17"),
    ({"job_network": {"standby": "2"}},
     "mpi:job_network:standby must be a whole number from 0 to 16 (network namespaces a "
     "node keeps made ahead of jobs), got '2'"),
    ({"job_network": {"standby": True}},
     "mpi:job_network:standby must be a whole number from 0 to 16 (network namespaces a "
     "node keeps made ahead of jobs), got True"),
    ({"job_network": {"parent": "eth0/1"}},
     "mpi:job_network:parent 'eth0/1' is not an interface name (at most 15 letters, "
     "digits, '_', '.', '-'; '' for the one holding the node's cluster address)"),
    ({"job_network": {"parent": "enp0s31f6-longer"}},
     "mpi:job_network:parent 'enp0s31f6-longer' is not an interface name (at most 15 "
     "letters, digits, '_', '.', '-'; '' for the one holding the node's cluster address)"),
    ({"job_network": {"unreachable": "192.168.10.0/24"}},
     "mpi:job_network:unreachable must be a list of IPv4 networks (CIDR), got "
     "'192.168.10.0/24'"),
    ({"job_network": {"unreachable": ["192.168.10.1/24"]}},
     "mpi:job_network:unreachable entry '192.168.10.1/24' is not an IPv4 network in CIDR "
     "form with no host bits set (192.168.10.1/24 has host bits set)"),
    ({"job_network": {"unreachable": [24]}},
     "mpi:job_network:unreachable entry 24 is not an IPv4 network in CIDR form with no "
     "host bits set (not text)"),
    # images
    ({"images": ["mpi"]},
     "mpi:images must be a mapping of short names to image references pinned by digest, "
     "got ['mpi']"),
    ({"images": {"mpi": "10.251.1.2:5000/dockermpi/mpi:latest"}},
     "mpi:images:mpi '10.251.1.2:5000/dockermpi/mpi:latest' is not pinned by digest: "
     "expected registry/repo@sha256:<64 lower-case hex digits>, with no tag"),
    ({"images": {"mpi": f"registry/mpi:1.0@{DIGEST}"}},
     "mpi:images:mpi 'registry/mpi:1.0@sha256:0123456789abcdef0123456789abcdef... is not "
     "pinned by digest: "
     "expected registry/repo@sha256:<64 lower-case hex digits>, with no tag"),
    ({"images": {"mpi": f"registry/mpi@{DIGEST.upper()}"}},
     "mpi:images:mpi 'registry/mpi@SHA256:0123456789ABCDEF0123456789ABCDEF0123... is not "
     "pinned by digest: expected registry/repo@sha256:<64 lower-case hex digits>, with no tag"),
    ({"images": {"my image": IMAGE}},
     "mpi:images: 'my image' is not an image short name (letters, digits, '.', '_', '-', "
     "at most 128)"),
    # image_facts
    ({"image_facts": {"other": {"flavour": "mpich"}}},
     "mpi:image_facts: 'other' is not an approved image (mpi:images has: mpi)"),
    ({"image_facts": {"mpi": {"flavor": "mpich"}}},
     "mpi:image_facts:mpi must be a mapping of some of flavour, version, launcher; got "
     "{'flavor': 'mpich'}"),
    ({"image_facts": {"mpi": {"flavour": "lam"}}},
     "mpi:image_facts:mpi:flavour must be one of openmpi4, openmpi5, openmpi, mpich, "
     "intelmpi, got 'lam'"),
    ({"image_facts": {"mpi": {"version": "4.1 beta"}}},
     "mpi:image_facts:mpi:version '4.1 beta' is not a version (digits, letters, '.', '-', "
     "at most 32)"),
    ({"image_facts": {"mpi": {"launcher": "bin/mpirun"}}},
     "mpi:image_facts:mpi:launcher must be an absolute path, got 'bin/mpirun'"),
    ({"image_facts": ["mpi"]},
     "mpi:image_facts must be a mapping of approved image names to {flavour, version, "
     "launcher}, got ['mpi']"),
    # firewall
    ({"firewall": {"chain": "INPUT"}},
     "mpi:firewall:chain INPUT belongs to iptables or Docker: DockerMPI needs a chain of "
     "its own"),
    ({"firewall": {"chain": "DOCKER-USER"}},
     "mpi:firewall:chain DOCKER-USER belongs to iptables or Docker: DockerMPI needs a chain "
     "of its own"),
    ({"firewall": {"chain": "MPI INPUT"}},
     "mpi:firewall:chain 'MPI INPUT' is not an iptables chain name (1-28 letters, digits, "
     "'-', '_')"),
    ({"firewall": {"chain": "X" * 29}},
     f"mpi:firewall:chain '{'X' * 29}' is not an iptables chain name (1-28 letters, "
     "digits, '-', '_')"),
    ({"firewall": {"rules_file": "firewall.rules"}},
     "mpi:firewall:rules_file must be an absolute path, got 'firewall.rules'"),
    ({"firewall": {"rules_file_ipv6": "/etc/dockermpi//firewall.rules"}},
     "mpi:firewall:rules_file_ipv6 /etc/dockermpi/firewall.rules is the same file as "
     "mpi:firewall:rules_file"),
]


@pytest.mark.parametrize("overrides,message", CASES, ids=[m[:60] for _, m in CASES])
def test_each_check_names_the_key_and_the_problem(overrides, message):
    found = _problems(**overrides)
    assert found == [message]
    with pytest.raises(ConfigError) as caught:
        settings.validate(_site(**overrides))
    assert str(caught.value) == message
    assert caught.value.problems == [message]
    assert isinstance(caught.value, ValueError)


def test_the_site_settings_are_valid():
    assert _problems() == []


def test_every_problem_is_reported_at_once_one_per_line():
    overrides = {
        "slots_per_node": 0,
        "ports": {"oob": [20100, 20299], "btl": [20250, 20999]},
        "job_network": {"addresses": "10.9.0.0/24"},
        "images": {"mpi": "mpi:latest"},
    }
    with pytest.raises(ConfigError) as caught:
        settings.validate(_site(**overrides))
    assert str(caught.value).splitlines() == [
        "mpi:slots_per_node must be a whole number of at least 1, got 0",
        "mpi:ports:oob 20100-20299 overlaps mpi:ports:btl 20250-20999",
        "mpi:job_network:addresses 10.9.0.0/24 is not inside mpi:cluster_network "
        "10.251.1.0/24",
        "mpi:images:mpi 'mpi:latest' is not pinned by digest: expected "
        "registry/repo@sha256:<64 lower-case hex digits>, with no tag",
    ]


def test_settings_that_are_not_a_mapping():
    assert settings.problems(["mpi"]) == ["mpi must be a mapping of settings, got ['mpi']"]


def test_long_values_are_shortened_in_messages():
    (message,) = _problems(job_network={"name": "x y" * 1000})
    assert len(message) < 250
    assert "..." in message


# -------------------------------------------------------------------- normalisation


def test_validate_normalises_a_copy():
    pillar = {
        "cluster_network": "10.251.1.0/255.255.255.0",
        "ports": {"sshd": (20000, 20099)},
        "limits": {"cpus_per_slot": 2},
        "storage": {"path": "/srv//dockermpi/", "nfs": {"export": "/export/./mpi/"}},
        "job_root": "/var/lib/dockermpi/jobs/",
        "job_network": {"parent": None, "unreachable": ["192.168.10.0/255.255.255.0"]},
        "images": None,
        "docker": {"insecure_registries": None},
        "firewall": {"rules_file": "/etc/dockermpi/firewall.rules/"},
    }
    given = _site(**pillar)
    before = copy.deepcopy(given)
    config = settings.validate(given)
    assert given == before
    assert config["cluster_network"] == "10.251.1.0/24"
    assert config["job_network"]["addresses"] == "10.251.1.128/25"
    assert config["ports"]["sshd"] == [20000, 20099]
    assert config["limits"]["cpus_per_slot"] == 2.0
    assert isinstance(config["limits"]["cpus_per_slot"], float)
    assert config["storage"]["path"] == "/srv/dockermpi"
    assert config["storage"]["nfs"]["export"] == "/export/mpi"
    assert config["job_root"] == "/var/lib/dockermpi/jobs"
    assert config["images"] == {}
    assert config["job_network"]["unreachable"] == ["192.168.10.0/24"]
    assert config["docker"]["insecure_registries"] == []
    assert config["firewall"]["rules_file"] == "/etc/dockermpi/firewall.rules"
    assert settings.validate(config) == config


def test_preshared_storage_needs_no_nfs_server():
    config = settings.validate(_site(storage={"type": "preshared", "nfs": {"server": ""},
                                                 "path": "/srv/cluster"}))
    assert config["storage"]["type"] == "preshared"
    # job_root under the NFS export is fine when nothing is exported
    assert _problems(storage={"type": "preshared"}, job_root="/export/dockermpi/jobs") == []


def test_glusterfs_storage_needs_its_server_and_takes_quotas():
    gluster = {"type": "glusterfs", "glusterfs": {"server": "10.251.1.6"},
               "quota": {"size_mb": 2048, "users": {"filler": {"size_mb": 48}}}}
    config = settings.validate(_site(storage=gluster))
    assert config["storage"]["glusterfs"]["volume"] == "dockermpi"
    assert config["storage"]["quota"] == {"size_mb": 2048, "files": 1000000,
                                          "users": {"filler": {"size_mb": 48}},
                                          "reserve_percent": 5}
    assert _problems(storage={"type": "glusterfs"}) == [
        "mpi:storage:glusterfs:server must name the GlusterFS server when "
        "mpi:storage:type is glusterfs"]


@pytest.mark.parametrize("storage, problem", [
    ({"glusterfs": {"server": "bad host!"}},
     "mpi:storage:glusterfs:server 'bad host!' is not a host name or IPv4 address"),
    ({"glusterfs": {"volume": "../x"}},
     "mpi:storage:glusterfs:volume '../x' is not a GlusterFS volume name"),
    ({"glusterfs": {"brick": "/srv/dockermpi/brick"}},
     "mpi:storage:glusterfs:brick /srv/dockermpi/brick lies inside mpi:storage:path"),
    ({"glusterfs": {"clients": ["10.0.0.1, 10.0.0.2"]}},
     "mpi:storage:glusterfs:clients must list addresses, host names or GlusterFS patterns"),
    ({"glusterfs": {"options": {"auth.allow": True}}},
     "mpi:storage:glusterfs:options must map GlusterFS volume options to values"),
    ({"glusterfs": {"options": {"performance.flush-behind": "on", "auth.allow": "*"}}},
     "mpi:storage:glusterfs:options cannot set DockerMPI's own volume options: auth.allow, "
     "performance.flush-behind"),
    ({"glusterfs": {"mount_options": "defaults"}},
     "mpi:storage:glusterfs:mount_options must be a list of mount options"),
    ({"glusterfs": {"port": 1}}, "mpi:storage:glusterfs:port"),
    ({"glusterfs": {"clients": []}},
     "mpi:storage:glusterfs:clients must be given: the hosts' part of the cluster network "
     "(10.251.0.0/17, "),
    ({"glusterfs": {"clients": [f"10.9.{n // 256}.{n % 256}" for n in range(300)]}},
     "mpi:storage:glusterfs:clients takes 3135 characters in auth.allow, more than the "
     "3000"),
    ({"quota": {"size_mb": -1}},
     "mpi:storage:quota:size_mb must be a whole number of at least 0 (0: no limit), got -1"),
    ({"quota": {"files": "many"}}, "mpi:storage:quota:files must be a whole number"),
    ({"quota": {"users": ["alice"]}}, "mpi:storage:quota:users must map user names"),
    ({"quota": {"reserve_percent": 100}},
     "mpi:storage:quota:reserve_percent must be a whole number from 0 to 99"),
    ({"quota": {"users": {"../root": {"size_mb": 1}}}},
     "mpi:storage:quota:users has '../root', not a user name"),
    ({"quota": {"users": {"alice": {"bytes": 1}}}},
     "mpi:storage:quota:users:alice must set size_mb, files or both"),
    ({"quota": {"users": {"alice": {"files": -5}}}},
     "mpi:storage:quota:users:alice:files must be a whole number of at least 0"),
])
def test_glusterfs_and_quota_settings_name_the_bad_key(storage, problem):
    storage = dict(storage, type="glusterfs")
    storage.setdefault("glusterfs", {}).setdefault("server", "10.251.1.6")
    wide = {"cluster_network": "10.251.0.0/16",
            "job_network": {"addresses": "10.251.255.128/25"}} if "clients" in problem else {}
    found = _problems(storage=storage, **wide)
    assert len(found) == 1 and found[0].startswith(problem), found


# ------------------------------------------------- the execution and state modules


@pytest.fixture
def configure_loader_modules():
    salt_functions = {
        "mpi_config.problems": mpi_config_module.problems,
    }
    return {
        mpi_config_state: {"__salt__": salt_functions, "__opts__": {"test": False}},
    }


def test_module_merges_and_validates():
    config = mpi_config_module.merge(DEFAULTS, SITE)
    assert mpi_config_module.problems(config) == []
    assert mpi_config_module.validate(config)["cluster_network"] == "10.251.1.0/24"
    assert mpi_config_module.merge(DEFAULTS) == DEFAULTS


def test_module_raises_salt_errors():
    with pytest.raises(SaltInvocationError, match="^mpi must be a mapping of settings"):
        mpi_config_module.merge(DEFAULTS, "oops")
    with pytest.raises(SaltInvocationError) as caught:
        mpi_config_module.validate(DEFAULTS)
    assert str(caught.value).splitlines() == REQUIRED_BY_SITE


@pytest.mark.parametrize("test", [False, True])
def test_state_passes_valid_settings_and_changes_nothing(test):
    mpi_config_state.__opts__["test"] = test
    ret = mpi_config_state.valid("mpi", _site())
    assert ret == {"name": "mpi", "result": True, "changes": {},
                   "comment": "The mpi pillar is valid"}


@pytest.mark.parametrize("test", [False, True])
def test_state_fails_with_every_problem_one_per_line(test):
    mpi_config_state.__opts__["test"] = test
    ret = mpi_config_state.valid(
        "mpi", _site(ports={"oob": [20100, 20299], "btl": [20250, 20999]}, slots_per_node=0))
    assert ret["result"] is False
    assert ret["changes"] == {}
    assert ret["comment"].splitlines() == [
        "The mpi pillar is invalid; no DockerMPI state is applied until it is fixed:",
        "mpi:slots_per_node must be a whole number of at least 1, got 0",
        "mpi:ports:oob 20100-20299 overlaps mpi:ports:btl 20250-20999",
    ]


# --------------------------------------------------------------------------- mpi:hub


def test_hub_defaults_and_shipped_hub_pillars_are_valid():
    assert DEFAULTS["hub"]["image"] == "notebook"
    assert _problems(hub=TESTCLUSTER["hub"]) == []
    hub_secrets = yaml.safe_load((REPO / "pillar/testcluster_hub.sls").read_text())["mpi"]
    assert _problems(hub=settings.merge(TESTCLUSTER["hub"], hub_secrets["hub"])) == []
    assert _problems(hub=EXAMPLE["hub"]) == []


@pytest.mark.parametrize(
    "hub,expected",
    [
        ({"imagee": "notebook"},
         "mpi:hub:imagee is not a DockerMPI setting (the keys of mpi:hub are: image, "
         "images, bind_url, hub_bind_url, hub_api_url, api_url, api_service_url, subdomain_host, "
         "notebook_hosts, tls, authenticator, admin_users, admin_token, dummy, github, pip, "
         "limits, panel_refresh_seconds, venv, state_dir)"),
        # salt-api's certificate is gone with salt-api
        ({"api_ca": "/etc/dockermpi/api-ca.pem"},
         "mpi:hub:api_ca is not a DockerMPI setting (the keys of mpi:hub are: image, "
         "images, bind_url, hub_bind_url, hub_api_url, api_url, api_service_url, subdomain_host, "
         "notebook_hosts, tls, authenticator, admin_users, admin_token, dummy, github, pip, "
         "limits, panel_refresh_seconds, venv, state_dir)"),
        ({"image": "note book"},
         "mpi:hub:image 'note book' is not an approved image's short name (a key of "
         "mpi:images)"),
        ({"api_url": "ftp://10.0.0.5:8000/services/dockermpi"},
         "mpi:hub:api_url must be a URL http://host[:port][/path] or "
         "https://host[:port][/path], got 'ftp://10.0.0.5:8000/services/dockermpi'"),
        ({"api_url": "10.0.0.5:8000/services/dockermpi"},
         "mpi:hub:api_url must be a URL http://host[:port][/path] or "
         "https://host[:port][/path], got '10.0.0.5:8000/services/dockermpi'"),
        # the hub's proxy sends users' tokens to the API: never in the clear on a network
        ({"api_service_url": "http://10.0.0.2:8001"},
         "mpi:hub:api_service_url must be https (or http to a loopback address): the "
         "hub's proxy and spawner send users' tokens there, so a host on the network "
         "could read them; got 'http://10.0.0.2:8001' (give the endpoint a certificate: "
         "mpi:api:tls)"),
        ({"api_service_url": "10.0.0.2:8001"},
         "mpi:hub:api_service_url must be a URL http://host[:port][/path] or "
         "https://host[:port][/path], got '10.0.0.2:8001'"),
        # the proxy has one port, so one scheme, for users' servers, the hub and the API
        ({"bind_url": "https://0.0.0.0:443",
          "api_url": "http://dockermpi--service.hub.example.org/api"},
         "mpi:hub:api_url must be https:// as the proxy listens (mpi:hub:bind_url "
         "https://0.0.0.0:443), got 'http://dockermpi--service.hub.example.org/api'"),
        ({"tls": {"cert": "not a certificate"}},
         "mpi:hub:tls:cert must be PEM text beginning -----BEGIN CERTIFICATE----- (or ''), "
         "got 'not a certificate'"),
        ({"tls": {"key": "-----BEGIN CERTIFICATE-----\n"}},
         "mpi:hub:tls:key must be PEM text beginning -----BEGIN PRIVATE KEY----- (or ''), "
         "got '-----BEGIN CERTIFICATE-----\\n'"),
        ({"tls": {"chain": ""}},
         "mpi:hub:tls:chain is not a DockerMPI setting (the keys of mpi:hub:tls are: cert, "
         "key, ca)"),
        ({"panel_refresh_seconds": 1},
         "mpi:hub:panel_refresh_seconds must be a whole number from 5 to 3600, got 1"),
        ({"hub_api_url": "10.0.0.5:8081"},
         "mpi:hub:hub_api_url must be a URL http://host[:port][/path] or "
         "https://host[:port][/path], got '10.0.0.5:8081'"),
        ({"subdomain_host": "hub.example.org"},
         "mpi:hub:subdomain_host must be a URL https://host[:port][/path] or "
         "http://host[:port][/path], got 'hub.example.org'"),
        ({"bind_url": "https://0.0.0.0:443", "subdomain_host": "https://hub.example.org/jupyter"},
         "mpi:hub:subdomain_host must be scheme://host[:port] without a path (users' "
         "servers are <name>.host), got 'https://hub.example.org/jupyter'"),
        # subdomains of an address resolve nowhere
        ({"bind_url": "https://0.0.0.0:443", "subdomain_host": "https://10.0.0.5:8000"},
         "mpi:hub:subdomain_host needs a DNS name whose subdomains resolve to the hub "
         "(wildcard DNS), got 'https://10.0.0.5:8000'"),
        # the API on the hub's origin would be open to every user's page there
        ({"bind_url": "https://0.0.0.0:443", "subdomain_host": "https://hub.example.org",
          "api_url": "https://hub.example.org/services/dockermpi"},
         "mpi:hub:api_url must be on the API's own origin, host "
         "dockermpi--service.hub.example.org, when mpi:hub:subdomain_host is set (the "
         "proxy serves the dockermpi service there and nowhere else), got "
         "'https://hub.example.org/services/dockermpi'"),
        ({"notebook_hosts": ["dockermpi--service.hub.example.org"]},
         "mpi:hub:notebook_hosts must be a mapping of host name to IPv4 address, got "
         "['dockermpi--service.hub.example.org']"),
        ({"notebook_hosts": {"dockermpi--service.hub.example.org": "hub.example.org"}},
         "mpi:hub:notebook_hosts:dockermpi--service.hub.example.org must be an IPv4 "
         "address, got 'hub.example.org'"),
        ({"notebook_hosts": {"bad name": "10.0.0.5"}},
         "mpi:hub:notebook_hosts: 'bad name' is not a host name"),
        ({"authenticator": "pam"},
         "mpi:hub:authenticator must be one of dummy, github, got 'pam'"),
        ({"admin_token": "short"},
         "mpi:hub:admin_token must be at least 16 characters (it is an admin API token "
         "of the hub), or '' for no admin service"),
        ({"admin_users": "alice"},
         "mpi:hub:admin_users must be a list of names, got 'alice'"),
        ({"github": {"package": "oauthenticator"}},
         "mpi:hub:github:package must be a pinned requirement name==version, got "
         "'oauthenticator'"),
        ({"pip": {"no_index": True}},
         "mpi:hub:pip:no_index needs mpi:hub:pip:find_links (where else would pip find "
         "the hub's packages?)"),
        ({"limits": {"pids": 0}},
         "mpi:hub:limits:pids must be a whole number of at least 16, got 0"),
        ({"limits": {"tmp_size_mb": "1G"}},
         "mpi:hub:limits:tmp_size_mb must be a whole number of at least 16, got '1G'"),
        ({"state_dir": "var/lib/hub"},
         "mpi:hub:state_dir must be an absolute path, got 'var/lib/hub'"),
        ({"images": "notebook"},
         "mpi:hub:images must be a list of approved images' short names (keys of "
         "mpi:images), got 'notebook'"),
        ({"images": ["notebook", "../x"]},
         "mpi:hub:images must be a list of approved images' short names (keys of "
         "mpi:images), got ['notebook', '../x']"),
        ({"images": ["notebook-mpich"]},
         "mpi:hub:images must hold mpi:hub:image (notebook), the image the spawn form "
         "offers first, got ['notebook-mpich']"),
    ],
)
def test_hub_checks_name_the_key_and_the_problem(hub, expected):
    assert _problems(hub=hub) == [expected]


@pytest.mark.parametrize("hub", [
    # notebooks reach the API through the hub's proxy, served over http or https
    {"api_url": "http://10.0.0.5:8000/services/dockermpi"},
    {"bind_url": "https://0.0.0.0:443", "api_url": "https://hub.example.org/services/dockermpi"},
    {"bind_url": "https://0.0.0.0:443", "api_url": "https://[fd00::5]:8443/services/dockermpi"},
    # the proxy and notebooks reach the API over TLS, or the proxy on the same host
    {"api_service_url": "https://10.0.0.2:8001"},
    {"api_service_url": "https://10.0.0.2"},
    {"api_service_url": "http://127.0.0.1:8001"},
    {"api_url": "", "api_service_url": ""},  # hosts other than the hub need neither
    {"images": ["notebook", "notebook-mpich"]},
    {"images": []},
])
def test_hub_api_urls_accepted(hub):
    assert _problems(hub=hub) == []
    config = settings.validate(_site(hub=hub))
    assert {key: config["hub"][key] for key in hub} == hub


@pytest.mark.parametrize("url", ["https://master.example.org:8001", "https://[fd00::2]:8001"])
def test_the_api_service_url_names_the_api_by_its_address(url):
    """Notebooks call the API there, and the hub host's firewall opens that address alone
    to them: a name would be resolved once, when the rule is made."""
    assert _problems(hub={"api_service_url": url}) == [
        "mpi:hub:api_service_url must name the API's host by its IPv4 address (notebooks "
        "call the API there, and the hub host's firewall lets them reach that address "
        f"alone), got {url!r}"]


@pytest.mark.parametrize("url, found", [
    ("https://10.0.0.2:8001", ("10.0.0.2", 8001)), ("https://10.0.0.2", ("10.0.0.2", 443)),
    ("http://127.0.0.1/x", ("127.0.0.1", 80)), ("ftp://10.0.0.2", None), ("", None),
    ("https://10.0.0.2:99999", None), (None, None)])
def test_endpoint(url, found):
    assert settings.endpoint(url) == found


def test_hub_github_needs_its_oauth_client():
    assert _problems(hub={"authenticator": "github"}) == [
        "mpi:hub:github:client_id is required when mpi:hub:authenticator is github",
        "mpi:hub:github:client_secret is required when mpi:hub:authenticator is github",
        "mpi:hub:github:callback_url is required when mpi:hub:authenticator is github",
    ]
    assert _problems(hub={"authenticator": "github", "github": {
        "client_id": "id", "client_secret": "secret",
        "callback_url": "https://hub.example.org/hub/oauth_callback",
        "allowed_organizations": ["lab"]}}) == []


def test_hub_settings_normalised():
    config = settings.validate(_site(hub={"limits": {"cpus": 2}, "admin_users": None,
                                            "venv": "/opt//hub/"}))
    assert config["hub"]["limits"]["cpus"] == 2.0
    assert config["hub"]["admin_users"] == []
    assert config["hub"]["venv"] == "/opt/hub"


# --------------------------------------------------------------------------- mpi:api


API_KEYS = "host, port, allowed_clients, hub_api_url, tls, token_cache_seconds, limits"
API_LIMIT_KEYS = ("requests_per_second, burst, streams, body_bytes, log_bytes, wait_seconds, "
                  "page_jobs")


def test_api_defaults_and_shipped_api_pillars_are_valid():
    assert DEFAULTS["api"]["port"] == 8001
    assert DEFAULTS["api"]["allowed_clients"] == []  # the hub host, found by the state
    assert set(DEFAULTS["api"]["limits"]) == set(settings.API_LIMITS)
    assert _problems(api=TESTCLUSTER["api"]) == []
    assert _problems(api=EXAMPLE["api"]) == []


@pytest.mark.parametrize("api", [
    {"host": "127.0.0.1"},
    {"host": "::"},
    {"port": 1},
    {"port": 65535},
    {"allowed_clients": ["10.0.0.5"]},
    {"allowed_clients": ["10.0.0.0/24", "fd00::5", "fd00:1::/64"]},
    {"token_cache_seconds": 0},  # ask the hub on every call
    {"token_cache_seconds": 3600},
    {"limits": {"requests_per_second": 1, "burst": 1, "streams": 1, "body_bytes": 1,
                "log_bytes": 1, "wait_seconds": 1, "page_jobs": 1}},
    {"limits": {"body_bytes": 64 << 20, "wait_seconds": 3600}},
])
def test_api_settings_accepted(api):
    assert _problems(api=api) == []
    config = settings.validate(_site(api=api))
    for key, value in api.items():
        if isinstance(value, dict):
            assert config["api"][key] == dict(DEFAULTS["api"][key], **value)
        else:
            assert config["api"][key] == value


def test_api_allowed_clients_left_empty_is_an_empty_list():
    # `allowed_clients:` with every entry commented out
    assert settings.validate(_site(api={"allowed_clients": None}))["api"][
        "allowed_clients"] == []


API_CASES = [
    # structure
    ({"tls_dir": "/etc/dockermpi/api"},
     f"mpi:api:tls_dir is not a DockerMPI setting (the keys of mpi:api are: {API_KEYS})"),
    ({"cherrypy": "cherrypy==18.10.0"},
     f"mpi:api:cherrypy is not a DockerMPI setting (the keys of mpi:api are: {API_KEYS})"),
    ({"limits": {"bursts": 80}},
     "mpi:api:limits:bursts is not a DockerMPI setting (the keys of mpi:api:limits are: "
     f"{API_LIMIT_KEYS})"),
    ({"limits": "fast"}, "mpi:api:limits must be a mapping, got 'fast'"),
    # where it listens
    ({"host": "master.example.org"},
     "mpi:api:host must be an IP address to listen on, got 'master.example.org'"),
    ({"host": "10.0.0.0/24"},
     "mpi:api:host must be an IP address to listen on, got '10.0.0.0/24'"),
    ({"port": 0}, "mpi:api:port must be a whole number from 1 to 65535, got 0"),
    ({"port": 65536}, "mpi:api:port must be a whole number from 1 to 65535, got 65536"),
    ({"port": "8001"}, "mpi:api:port must be a whole number from 1 to 65535, got '8001'"),
    # who may connect
    ({"allowed_clients": "10.0.0.5"},
     "mpi:api:allowed_clients must be a list of IP addresses or networks, got '10.0.0.5'"),
    ({"allowed_clients": ["hub.example.org"]},
     "mpi:api:allowed_clients must list IP addresses or networks, got 'hub.example.org'"),
    ({"allowed_clients": ["10.0.0.5", "10.0.0.0/33"]},
     "mpi:api:allowed_clients must list IP addresses or networks, got '10.0.0.0/33'"),
    ({"allowed_clients": [167772165]},
     "mpi:api:allowed_clients must list IP addresses or networks, got 167772165"),
    # where the API sends users' tokens to ask the hub: encrypted, or on this host
    ({"hub_api_url": "http://10.0.0.5:8081/hub/api"},
     "mpi:api:hub_api_url must be https (or http to a loopback address): the API sends "
     "each caller's token there to ask the hub whose it is, so a host on the network could "
     "read them; got 'http://10.0.0.5:8081/hub/api' (give the endpoint a certificate: "
     "mpi:hub:tls, and this URL on the hub's proxy)"),
    ({"hub_api_url": "hub.example.org/hub/api"},
     "mpi:api:hub_api_url must be a URL http://host[:port][/path] or "
     "https://host[:port][/path], got 'hub.example.org/hub/api'"),
    ({"tls": {"key": "secret"}},
     "mpi:api:tls:key must be PEM text beginning -----BEGIN PRIVATE KEY----- (or ''), got "
     "'secret'"),
    ({"tls": {"certificate": ""}},
     "mpi:api:tls:certificate is not a DockerMPI setting (the keys of mpi:api:tls are: "
     "cert, key, ca)"),
    # how long the hub's word about a token holds
    ({"token_cache_seconds": -1},
     "mpi:api:token_cache_seconds must be a whole number from 0 to 3600, got -1"),
    ({"token_cache_seconds": 3601},
     "mpi:api:token_cache_seconds must be a whole number from 0 to 3600, got 3601"),
    ({"token_cache_seconds": 0.5},
     "mpi:api:token_cache_seconds must be a whole number from 0 to 3600, got 0.5"),
] + [
    # every per-user limit: 0 would stop every call, a fraction or text is no count
    ({"limits": {key: bad}},
     f"mpi:api:limits:{key} must be a whole number of at least 1, got {shown}")
    for key in settings.API_LIMITS
    for bad, shown in ((0, "0"), (-1, "-1"), (1.5, "1.5"), ("1M", "'1M'"))
]


@pytest.mark.parametrize("api,message", API_CASES, ids=[m[:70] for _, m in API_CASES])
def test_api_checks_name_the_key_and_the_problem(api, message):
    assert _problems(api=api) == [message]
    with pytest.raises(ConfigError) as caught:
        settings.validate(_site(api=api))
    assert caught.value.problems == [message]


def test_api_settings_that_are_not_a_mapping():
    assert _problems(api="salt-api") == ["mpi:api must be a mapping, got 'salt-api'"]


PEM_CERT = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
PEM_KEY = "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n"


@pytest.mark.parametrize("api", [
    {"hub_api_url": "https://hub.example.org/hub/api"},
    {"hub_api_url": "http://127.0.0.1:8081/hub/api"},  # the hub on the master itself
    {"hub_api_url": "http://localhost:8081/hub/api"},
    {"hub_api_url": ""},
    {"tls": {"cert": PEM_CERT, "key": PEM_KEY, "ca": PEM_CERT}},
    {"tls": {"cert": PEM_CERT, "key": "", "ca": ""}},  # the key in the master's pillar only
])
def test_api_token_hops_accepted(api):
    assert _problems(api=api) == []


def test_hub_tls_accepted_and_none_becomes_empty():
    hub = {"bind_url": "https://0.0.0.0:443", "subdomain_host": "https://hub.example.org",
           "api_url": "https://dockermpi--service.hub.example.org/services/dockermpi",
           "tls": {"cert": PEM_CERT, "key": PEM_KEY, "ca": None}}
    assert _problems(hub=hub) == []
    assert settings.validate(_site(hub=hub))["hub"]["tls"] == {
        "cert": PEM_CERT, "key": PEM_KEY, "ca": ""}


@pytest.mark.parametrize("url, expected", [
    ("https://hub.example.org/hub/api", True),
    ("http://127.0.0.1:8081/hub/api", True),
    ("http://127.0.0.5:8081/hub/api", True),
    ("http://localhost/hub/api", True),
    ("http://[::1]:8081/hub/api", True),
    ("http://10.0.0.5:8081/hub/api", False),
    ("http://hub.example.org/hub/api", False),
    ("ftp://127.0.0.1/x", False),
    ("", False),
    (None, False),
])
def test_a_token_url_is_encrypted_or_stays_on_its_host(url, expected):
    assert settings.is_encrypted_or_local(url) is expected


def test_image_facts_of_an_approved_image_are_valid():
    config = _site(image_facts={"mpi": {"flavour": "openmpi4", "version": "4.1.6",
                                        "launcher": "/opt/ompi//bin/mpirun"}})
    assert settings.problems(config) == []
    assert settings.validate(config)["image_facts"]["mpi"]["launcher"] == "/opt/ompi/bin/mpirun"


@pytest.mark.parametrize("network, pool, expected", [
    ("10.251.1.0/24", "10.251.1.128/25", ["10.251.1.0/25"]),
    ("10.0.0.0/24", "10.0.0.64/26", ["10.0.0.0/26", "10.0.0.128/25"]),
    ("10.0.0.0/24", "10.9.0.0/24", ["10.0.0.0/24"]),
])
def test_the_hosts_networks_are_the_cluster_network_without_the_job_pool(network, pool,
                                                                          expected):
    assert settings.host_networks(network, pool) == expected


@pytest.mark.parametrize("half_life", ["12h", "90m", "1-00:00", "7D"])
def test_fair_share_durations_are_written_as_walltimes_are(half_life):
    config = settings.merge(DEFAULTS, dict(SITE, fair_share={"half_life": half_life}))
    assert settings.problems(config) == []
