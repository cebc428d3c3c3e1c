"""The hub host of the real test cluster (role mpi-hub, dockermpi.hub): JupyterHub
answers, users get tokens, and each user's notebook runs on the hub's own engine as the
uid the master gave, from the approved image by digest, with only that user's directory
mounted, and no other user's data in reach."""

import json
import re
import urllib.error
import urllib.parse
import urllib.request

import pytest
import yaml

from tests.cluster.testcluster import (API_NOTEBOOK_URL, API_PUBLIC_URL, HUB_DOMAIN,
                                       HUB_HOST_PORT, HUB_PUBLIC_PORT, NOTEBOOK_PREFIX)

pytestmark = pytest.mark.cluster

ALICE = "hub-alice"
#: A hub name that is no safe Docker or directory name: the master maps it.
BOB = "Bob.Smith@example.org"


@pytest.fixture(scope="module")
def hub(cluster):
    cluster.wait_for_hub()
    return cluster


def _inspect(cluster, container):
    return json.loads(cluster.read("hub", ["docker", "inspect", container]))[0]


def _env(found):
    return dict(line.split("=", 1) for line in found["Config"]["Env"])


@pytest.fixture(scope="module")
def notebooks(hub):
    """{hub name: (container name, docker inspect)} of running notebooks; stopped after."""
    started = {}
    try:
        for name in (ALICE, BOB):
            container = hub.start_notebook(name)
            started[name] = (container, _inspect(hub, container))
        yield started
    finally:
        for name in (ALICE, BOB):
            hub.delete_hub_user(name)


def _data_dir(found):
    (mount,) = [m for m in found["Mounts"] if m["Destination"] == "/data"]
    return mount["Source"]


def test_the_hub_answers_with_the_pinned_version(hub):
    status, answer = hub.hub_api("GET", "/")
    assert status == 200 and answer["version"] == "5.5.4"


def test_the_proxy_is_published_on_localhost_only(hub):
    context = hub.public_context()
    context.check_hostname = False  # 127.0.0.1 is not a name the certificate has
    with urllib.request.urlopen(f"https://127.0.0.1:{HUB_HOST_PORT}/hub/api/", timeout=30,
                                context=context) as r:
        assert json.loads(r.read())["version"] == "5.5.4"
    ports = hub.container("hub").attrs["HostConfig"]["PortBindings"]
    assert ports == {"8000/tcp": [{"HostIp": "127.0.0.1", "HostPort": str(HUB_HOST_PORT)}]}


def _proxy_status(hub, host, path, token):
    """What the hub's proxy answers for ``path`` on ``host`` (its status, and where it
    redirects to), without following redirects."""
    request = urllib.request.Request(f"https://{host}:{HUB_PUBLIC_PORT}{path}", headers={
        "Authorization": f"token {token}"})
    try:
        with hub.public_open(request, timeout=30, follow_redirects=False) as answer:
            return answer.status, None
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Location")


def test_each_server_and_the_api_answer_on_their_own_origin_only(hub, notebooks):
    token = hub.hub_token(ALICE)
    status, _ = _proxy_status(hub, f"{ALICE}.{HUB_DOMAIN}", f"/user/{ALICE}/api/status", token)
    assert status == 200
    # on the hub's origin the hub answers (it sends the browser on), never her server
    status, location = _proxy_status(hub, HUB_DOMAIN, f"/user/{ALICE}/api/status", token)
    assert status == 302 and location.endswith(f"/hub/user/{ALICE}/api/status"), location
    # and on another user's origin the hub does not reach her server either
    status, _ = _proxy_status(hub, f"hub-bob.{HUB_DOMAIN}", f"/user/{ALICE}/api/status", token)
    assert status != 200
    api = urllib.parse.urlsplit(API_PUBLIC_URL)
    status, _ = _proxy_status(hub, api.netloc.rsplit(":", 1)[0], api.path + "/api/v1/whoami", token)
    assert status == 200
    status, _ = _proxy_status(hub, HUB_DOMAIN, api.path + "/api/v1/whoami", token)
    assert status != 200


def test_a_new_user_gets_a_token_that_names_them(hub):
    hub.hub_user("hub-carol")
    try:
        token = hub.hub_token("hub-carol", expires_in=600)
        status, me = hub.hub_api("GET", "/user", token=token)
        assert status == 200 and me["name"] == "hub-carol"
        status, _ = hub.hub_api("GET", "/users", token=token, check=False)
        assert status == 403  # a user's token is no admin's
    finally:
        hub.delete_hub_user("hub-carol")


def test_no_tcp_docker_socket_on_the_hub_host(hub):
    listening = hub.read("hub", ["ss", "-ltnpH"])
    assert "dockerd" not in listening, listening
    ports = {line.split()[3].rsplit(":", 1)[1] for line in listening.splitlines()}
    assert ports and not ports & {"2375", "2376"}, listening  # (the hub's own listen)
    daemon = hub.read("hub", ["docker", "info", "--format", "{{json .}}"])
    assert "tcp://" not in daemon


@pytest.mark.parametrize("name", [ALICE, BOB])
def test_notebook_runs_as_the_uid_the_master_gave(hub, notebooks, name):
    _, found = notebooks[name]
    owner = hub.read("hub", ["stat", "-c", "%u:%g", _data_dir(found)])
    uid, gid = owner.strip().split(":")
    assert int(uid) >= 100000  # the master's uid range, never root or a system account
    assert found["Config"]["User"] == f"{uid}:{gid}"
    assert hub.notebook_read(name, ["id", "-u"]).strip() == uid
    assert hub.notebook_read(name, ["id", "-g"]).strip() == gid


def test_alice_uid_is_the_one_the_master_records(hub, notebooks):
    _, found = notebooks[ALICE]
    account = hub.account(ALICE)  # salt-run mpi.add_user: the master's record
    assert found["Config"]["User"] == f"{account['uid']}:{account['gid']}"
    assert _data_dir(found) == account["dir"]


@pytest.mark.parametrize("name", [ALICE, BOB])
def test_notebook_mounts_only_the_users_directory(hub, notebooks, name):
    container, found = notebooks[name]
    account = _env(found)["DOCKERMPI_ACCOUNT"]
    assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]*", account)
    assert container == f"{NOTEBOOK_PREFIX}-{account}"
    mounts = sorted((m["Type"], m["Source"], m["Destination"], m["RW"]) for m in found["Mounts"])
    assert mounts == [("bind", "/etc/dockermpi/hub/api-ca.pem", "/etc/dockermpi/api-ca.pem",
                       False),
                      ("bind", f"/srv/dockermpi/users/{account}", "/data", True)]
    assert found["Config"]["WorkingDir"] == "/data"
    env = _env(found)
    assert env["HOME"] == "/data"
    assert env["DOCKERMPI_API_URL"] == API_NOTEBOOK_URL
    # The site's CA of the API's certificate, read-only beside the user's directory.
    assert env["DOCKERMPI_API_CA"] == "/etc/dockermpi/api-ca.pem"
    code, out = hub.notebook_exec(name, ["cat", env["DOCKERMPI_API_CA"]])
    assert code == 0 and out == hub.tls["ca"]
    assert env["DOCKERMPI_IMAGE"] == "notebook"
    assert env["DOCKERMPI_REFRESH_SECONDS"] == "30"  # mpi:hub:panel_refresh_seconds


@pytest.mark.parametrize("name", [ALICE, BOB])
def test_notebook_is_the_approved_image_by_digest_and_confined(hub, notebooks, name):
    _, found = notebooks[name]
    pillar = hub.read("master", ["cat", "/srv/pillar-local/testcluster_images.sls"])
    reference = yaml.safe_load(pillar)["mpi"]["images"]["notebook"]
    assert "@sha256:" in reference
    assert found["Config"]["Image"] == reference
    image_id = hub.read("hub", ["docker", "image", "inspect", "--format", "{{.Id}}",
                                reference])
    assert found["Image"] == image_id.strip()
    host = found["HostConfig"]
    assert host["CapDrop"] == ["ALL"] and not host["CapAdd"]
    assert host["SecurityOpt"] == ["no-new-privileges"]
    assert host["Privileged"] is False
    assert host["PidsLimit"] == 256
    assert host["Memory"] == host["MemorySwap"] == 1024 * 1024 * 1024
    assert host["AutoRemove"] is True
    assert host["NetworkMode"] == "bridge"
    assert host["ReadonlyRootfs"] is True
    assert host["Tmpfs"] == {"/tmp": "size=1024m,mode=1777,nosuid,nodev"}


def test_a_notebook_writes_to_its_users_directory_and_a_sized_tmp_alone(hub, notebooks):
    write = ("import errno, os\n"
             "for path in ('/usr/local/x', '/var/tmp/x', '/etc/x', '/tmp/x', '/data/x'):\n"
             "    try:\n"
             "        open(path, 'w').close(); os.unlink(path); print(path, 'written')\n"
             "    except OSError as exc:\n"
             "        print(path, errno.errorcode[exc.errno])\n"
             "tmp = os.statvfs('/tmp')\n"
             "print('tmp', tmp.f_blocks * tmp.f_frsize // 2**20)\n")
    code, out = hub.notebook_exec(ALICE, ["python3", "-c", write])
    assert code == 0 and out.splitlines() == [
        "/usr/local/x EROFS", "/var/tmp/x EROFS", "/etc/x EROFS", "/tmp/x written",
        "/data/x written", "tmp 1024"], out


def test_a_notebook_binds_no_privileged_port(hub, notebooks):
    bind = ("import errno, socket\n"
            "for port in (700, 1024):\n"
            "    s = socket.socket()\n"
            "    try:\n"
            "        s.bind(('0.0.0.0', port)); print(port, 'bound')\n"
            "    except OSError as exc:\n"
            "        print(port, errno.errorcode[exc.errno])\n")
    code, out = hub.notebook_exec(ALICE, ["python3", "-c", bind])
    assert code == 0 and out.split() == ["700", "EACCES", "1024", "bound"], out


def test_a_notebook_reaches_no_port_of_the_hub_host_but_the_hubs_api(hub, notebooks):
    """A service of the hub host itself (INPUT, not DOCKER-USER: on its cluster address or
    its docker0 address, over TCP or UDP) does not answer a notebook; the hub's API does."""
    gateway = ("import socket\n"
               "route = [line.split() for line in open('/proc/net/route')][1:]\n"
               "(found,) = [r[2] for r in route if r[1] == '00000000']\n"
               "print(socket.inet_ntoa(bytes.fromhex(found)[::-1]))\n")
    code, docker0 = hub.notebook_exec(ALICE, ["python3", "-c", gateway])
    assert code == 0, docker0
    ports = [str(port) for port in hub.STORAGE_PORTS]
    with hub.storage_stand_in("hub") as address:
        for target in (address, docker0.strip()):
            code, out = hub.notebook_exec(ALICE, ["python3", "-c", hub.STORAGE_PROBE, target,
                                                  *ports])
            assert code == 0, out
            assert hub.storage_unanswered(out) == list(hub.STORAGE_PORTS), (target, out)
            code, out = hub.notebook_exec(ALICE, ["python3", "-c", (
                "import socket, sys\n"
                "socket.create_connection((sys.argv[1], 8081), timeout=5).close()\n"), target])
            assert code == 0, (target, out)


def test_bob_cannot_read_alices_data(hub, notebooks):
    code, _ = hub.notebook_exec(ALICE, ["sh", "-c", "echo alice-only > /data/secret.txt"])
    assert code == 0
    alice_dir = _data_dir(notebooks[ALICE][1])
    mode = hub.read("hub", ["stat", "-c", "%a", alice_dir])
    assert mode.strip() == "700"
    code, out = hub.notebook_exec(BOB, ["cat", "/data/secret.txt"])
    assert code != 0 and "alice-only" not in out
    for path in (alice_dir, f"{alice_dir}/secret.txt", "/srv/dockermpi/users"):
        code, out = hub.notebook_exec(BOB, ["cat", path])
        assert code != 0 and "alice-only" not in out, (path, out)
    code, out = hub.notebook_exec(ALICE, ["cat", "/data/secret.txt"])
    assert (code, out.strip()) == (0, "alice-only")


#: What a hostile user puts in her own directory to change what her server serves others:
#: a Jupyter server config (a response header would show it loaded) and a
#: usercustomize module in her user site, which logs every Python process that runs it.
_USER_CONFIG = {
    "/data/.jupyter/jupyter_server_config.py":
        "c.ServerApp.tornado_settings = {'headers': {'X-User-Config': 'loaded'}}\n",
    "/data/.local/lib/python3.11/site-packages/usercustomize.py":
        "import sys\nwith open('/data/usercustomize.log', 'a') as log:\n"
        "    log.write(' '.join(sys.argv) + '\\n')\n",
}


def test_a_users_server_loads_no_config_or_code_she_wrote(hub):
    name = "hub-carol"
    hub.start_notebook(name)
    try:
        for path, text in _USER_CONFIG.items():
            code, out = hub.notebook_exec(name, ["python3", "-c",
                                                 "import os, sys; os.makedirs(os.path.dirname("
                                                 "sys.argv[1]), exist_ok=True); "
                                                 "open(sys.argv[1], 'w').write(sys.argv[2])",
                                                 path, text])
            assert code == 0, out
        hub.notebook_exec(name, ["rm", "-f", "/data/usercustomize.log"])
        hub.stop_notebook(name)
        hub.start_notebook(name)  # a fresh server process, with her files in place
        request = urllib.request.Request(
            f"https://{name}.{HUB_DOMAIN}:{HUB_PUBLIC_PORT}/user/{name}/api/status",
            headers={"Authorization": f"token {hub.hub_token(name)}"})
        with hub.public_open(request, timeout=30) as answer:
            assert answer.status == 200
            assert answer.headers.get("X-User-Config") is None
        code, log = hub.notebook_exec(name, ["cat", "/data/usercustomize.log"])
        assert code != 0 or "singleuser" not in log, log  # the server never ran her code
        # Her own Python (a terminal's, a kernel's) still has her packages.
        code, out = hub.notebook_exec(name, ["python3", "-c", "import usercustomize"])
        assert code == 0, out
        code, log = hub.notebook_exec(name, ["cat", "/data/usercustomize.log"])
        assert code == 0 and "-c" in log and "singleuser" not in log, log
    finally:
        hub.delete_hub_user(name)


def test_a_stopped_notebook_leaves_no_container(hub, notebooks):
    name = "hub-dave"
    container = hub.start_notebook(name)
    hub.stop_notebook(name)
    code, _ = hub.exec("hub", ["docker", "inspect", container], check=False)
    assert code != 0
    hub.delete_hub_user(name)
