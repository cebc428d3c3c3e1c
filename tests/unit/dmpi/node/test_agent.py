"""Unit tests of dmpi.node.agent: the remote-start agent built for real from this
machine's Debian packages (apt fetches them; nothing is installed), run from where it
was built. That it runs in images without ssh, or of another glibc, is tested on the
cluster (tests/integration/test_agent.py)."""

import json
import os
import subprocess

import pytest
from dmpi.contract import AGENT_SSH, AGENT_SSHD, AGENT_DIR
from dmpi.errors import NodeError
from dmpi.node import agent


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """One agent built at a path of its own (its programs load from there)."""
    top = tmp_path_factory.mktemp("agent")
    agent_dir = str(top / "agent")
    return agent_dir, agent.build(agent_dir=agent_dir)


def _in(agent_dir, program):
    return os.path.join(agent_dir, os.path.relpath(program, AGENT_DIR))


def test_the_agent_holds_openssh_with_its_own_loader_and_libraries(built):
    agent_dir, manifest = built
    assert manifest["agent_version"] == agent.AGENT_VERSION
    assert set(manifest["packages"]) == {"openssh-server", "openssh-client"}
    assert os.path.islink(agent_dir)
    assert os.path.basename(os.path.realpath(agent_dir)) == manifest["build"]
    libraries = [name for name in manifest["files"] if name.startswith("lib/")]
    assert any(name.startswith("lib/libc.so") for name in libraries), libraries
    assert any(name.startswith("lib/ld-linux") for name in libraries), libraries
    for program in (AGENT_SSHD, AGENT_SSH):
        path = _in(agent_dir, program)
        assert os.access(path, os.X_OK)
        interpreter = subprocess.run(
            ["readelf", "--program-headers", path], capture_output=True, text=True,
            check=True).stdout
        assert f"[Requesting program interpreter: {agent_dir}/lib/ld-linux" in interpreter
        # Runs with no library path set: everything comes from the agent.
        shown = subprocess.run([path, "-V"], capture_output=True, text=True, env={},
                               check=False)
        assert shown.stderr.startswith("OpenSSH_9"), shown
    for folder, _dirs, names in os.walk(os.path.realpath(agent_dir)):
        assert os.stat(folder).st_mode & 0o022 == 0, folder
        for name in names:
            assert os.stat(os.path.join(folder, name)).st_mode & 0o022 == 0, name


def test_a_current_agent_has_no_problems_and_a_changed_one_names_them(built):
    agent_dir, manifest = built
    assert agent.problems(agent_dir, manifest["packages"]) == []
    assert agent.problems(agent_dir, dict(manifest["packages"], **{
        "openssh-server": "1:99"})) == [
        f"it holds openssh-server {manifest['packages']['openssh-server']}, not 1:99"]
    library = next(n for n in manifest["files"] if n.startswith("lib/libcrypto"))
    path = os.path.join(agent_dir, library)
    original = open(path, "rb").read()
    try:
        with open(path, "ab") as handle:
            handle.write(b"\0")
        assert agent.problems(agent_dir) == [f"{library} changed"]
        os.unlink(path)
        assert agent.problems(agent_dir) == [f"{library} is missing"]
    finally:
        with open(path, "wb") as handle:
            handle.write(original)
        os.chmod(path, 0o644)
    assert agent.problems(agent_dir) == []


def test_no_agent_and_an_agent_of_another_version_are_problems(tmp_path):
    assert agent.problems(str(tmp_path / "none")) == ["there is no agent"]
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / agent.MANIFEST).write_text(json.dumps({
        "agent_version": 0, "files": {}}))
    assert agent.problems(str(tmp_path / "old")) == [
        f"it is of agent version 0, not {agent.AGENT_VERSION}",
        "its manifest lists no files"]


def test_a_new_build_replaces_the_link_and_keeps_the_build_before(tmp_path):
    agent_dir = str(tmp_path / "agent")
    first = agent.build(agent_dir=agent_dir)["build"]
    builds = tmp_path / "agent.d"
    # A build of other files (another OpenSSH): the link moves, the first stays for
    # the jobs that have it mounted, and one older than both goes.
    (builds / "0000000000000000").mkdir()
    agent._remember(str(builds), "0000000000000000")
    os.rename(builds / first, builds / "1111111111111111")
    agent._link(agent_dir, str(builds / "1111111111111111"))
    second = agent.build(agent_dir=agent_dir)["build"]
    assert second == first
    assert os.path.realpath(agent_dir) == str(builds / first)
    assert sorted(p.name for p in builds.iterdir() if not p.name.startswith(".")) == \
        sorted([first, "1111111111111111"])


def test_the_link_is_never_made_over_a_directory(tmp_path):
    (tmp_path / "agent").mkdir()
    with pytest.raises(NodeError, match="is a directory, not DockerMPI's link"):
        agent.build(agent_dir=str(tmp_path / "agent"))


def test_host_path_says_when_the_node_has_no_agent(tmp_path, monkeypatch, built):
    monkeypatch.setattr(agent, "AGENT_DIR", str(tmp_path / "agent"))
    with pytest.raises(NodeError, match="has no remote-start agent"):
        agent.host_path()
    assert "has no remote-start agent" in agent.state()
    monkeypatch.setattr(agent, "AGENT_DIR", built[0])
    assert agent.host_path() == os.path.realpath(built[0])
    assert agent.state() == "ok"


def test_apt_without_openssh_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(agent, "PACKAGES", ("openssh-server", "no-such-package-dmpi"))
    with pytest.raises(NodeError, match="apt has no candidate of no-such-package-dmpi"):
        agent.candidate_versions()
