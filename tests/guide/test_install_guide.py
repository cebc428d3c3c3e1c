"""The install guide (docs/install.md), followed as written on bare Debian hosts that
have nothing else (tests/guide/guide.py): it must end with a job over several nodes and
a notebook user's job, and the registry it sets up must keep users out.

Needs the Docker engine and the wheelhouse (tests/run prepares both); with CI=true it is
never skipped. Set DMPI_GUIDE_KEEP=1 to leave the hosts up after a failure
(`python -m tests.guide down` removes them).
"""

import json
import os
import re
import shlex

import pytest

from tests.guide.guide import (ADDRESSES, FOLLOWER, GUIDE_LOG, blocks, site_value_names,
                               site_values)

IN_CI = os.environ.get("CI") == "true"
HELLO_RE = re.compile(r"Hello, World! I am process (\d) of 4 on (node\d)\.")

pytestmark = pytest.mark.guide


def test_every_command_block_is_marked_with_where_it_runs_and_the_site_values_are_set():
    found = blocks()
    values = [b for b in found if b.where == "site values"]
    assert len(values) == 1
    assert sorted(site_value_names(values[0])) == sorted(site_values("commit"))
    assert {b.where for b in found} == {"site values", "every host", "master", "each node",
                                        "hub", "notebook"}


def test_a_command_block_without_a_mark_is_refused():
    text = "# guide\n\nSome text.\n\n```sh\nrm -rf /\n```\n"
    with pytest.raises(Exception, match=r"install.md:5: a command block without a"):
        blocks(text)


@pytest.fixture(scope="module")
def followed():
    """The guide's hosts after every block ran: (hosts, {line: (block, {host: output})}).
    Followed in the background while the integration tests run when tests/conftest.py
    started it, else here."""
    try:
        hosts, ran = FOLLOWER.result()
        yield hosts, {block.line: (block, outputs) for block, outputs in ran}
    finally:
        if GUIDE_LOG.exists():
            print(GUIDE_LOG.read_text(encoding="utf-8", errors="replace"))
        if FOLLOWER.hosts is not None and os.environ.get("DMPI_GUIDE_KEEP") != "1":
            FOLLOWER.hosts.down()


def _outputs(ran, where, containing):
    """The outputs of the one block run at ``where`` whose text holds ``containing``."""
    matching = [outputs for block, outputs in ran.values()
                if block.where == where and containing in block.text]
    assert len(matching) == 1, f"the guide has {len(matching)} {where} blocks with {containing!r}"
    return matching[0]


def test_the_guide_ends_with_a_job_over_two_nodes_and_a_notebook_users_job(followed):
    _, ran = followed
    for where, containing, host in (("master", "mpi.launch", "master"),
                                    ("notebook", "mpi run", "notebook")):
        output = _outputs(ran, where, containing)[host]
        ranks = dict(HELLO_RE.findall(output))
        assert sorted(ranks) == ["0", "1", "2", "3"], output
        assert set(ranks.values()) == {"node1", "node2"}, output
    assert "succeeded, exit code 0" in _outputs(ran, "notebook", "mpi run")["notebook"]


#: What the registry answers a caller without its login, reading the catalog and
#: starting an upload (the first step of a push), and whether
#: anything in the caller's environment holds a password. argv: the registry's address.
_REGISTRY_PROBE = """
import json, os, sys, urllib.error, urllib.request
base = "http://%s:5000/v2/" % sys.argv[1]
found = {}
for name, method, path in (("catalog", "GET", "_catalog"),
                           ("upload", "POST", "dockermpi/mpi/blobs/uploads/")):
    try:
        with urllib.request.urlopen(urllib.request.Request(base + path, method=method),
                                    timeout=10) as answer:
            found[name] = answer.status
    except urllib.error.HTTPError as exc:
        found[name] = exc.code
    except OSError as exc:
        found[name] = "unreachable: " + str(exc)
found["environment"] = dict(os.environ)
print("PROBE " + json.dumps(found))
"""


def _probe(output):
    return json.loads(output.split("PROBE ", 1)[1].splitlines()[0])


def test_a_notebook_user_can_neither_read_nor_replace_the_sites_images(followed):
    hosts, _ = followed
    master = ADDRESSES["master"]
    password = hosts.exec_on("master", ["cat", "/root/registry-password"]).strip()
    images = hosts.exec_on("master", ["cat", "/srv/pillar/dockermpi_images.sls"])
    approved = dict(re.findall(r"^\s+(\w+): \S+@(sha256:[0-9a-f]{64})$", images, re.M))
    assert set(approved) == {"mpi", "notebook"}, images

    # Anyone on the cluster network without the login (here a node host's own
    # python, not Docker with the pillar's login) is refused reading and pushing.
    anonymous = _probe(hosts.exec_on("node1", ["python3", "-c", _REGISTRY_PROBE, master]))
    assert (anonymous["catalog"], anonymous["upload"]) == (401, 401), anonymous
    notebook = hosts.notebook_container("alice")
    # Alice's notebook and her job do not even reach it: the hub's firewall closes the
    # cluster network to notebooks, the job's own firewall keeps it to its peers.
    direct = _probe(hosts.exec_on("hub", ["docker", "exec", notebook, "python3", "-c",
                                          _REGISTRY_PROBE, master]))
    run = hosts.exec_on("hub", ["docker", "exec", notebook, "bash", "-c",
                                f"mpi run -n 1 python3 -c {shlex.quote(_REGISTRY_PROBE)} "
                                f"{master}"], timeout=180)
    in_job = _probe(run)
    for probe in (direct, in_job):
        assert all(str(probe[call]).startswith("unreachable") for call in ("catalog", "upload")), \
            probe
    assert password not in json.dumps(in_job["environment"]), "the registry login reached a job"
    assert password not in run

    # The site's images are what was approved, and another user's job runs on them.
    for name, digest in approved.items():
        head = hosts.exec_on("master", [
            "curl", "-sfI", "-u", f"dockermpi:{password}", "-H",
            "Accept: application/vnd.docker.distribution.manifest.v2+json",
            f"http://127.0.0.1:5000/v2/dockermpi/{name}/manifests/1"])
        assert f"docker-content-digest: {digest}" in head.lower(), head
    job = json.loads(hosts.exec_on("master", [
        "salt-run", "mpi.launch", "user=site-check", "image=mpi", "np=2",
        "cmd=python3 -m mpi4py.bench helloworld", "--out=json"], timeout=180))
    assert job["state"] == "succeeded", job
