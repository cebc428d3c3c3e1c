"""
Unit tests of ``mpi_job.report`` and ``mpi_job.read_output``: the node's evidence about
its jobs. Peers are probed through real sockets on loopback addresses (a listener, a
closed port, and a listener whose accept queue is full, which drops SYNs like a
firewall DROP). The Docker SDK is faked only for what a unit test cannot make: an
engine that is down and job containers with given labels, states and exit codes; the
real engine is exercised on the cluster.
"""

import json
import os
import stat
import subprocess
import sys
import pathlib
import shutil
import socket
import tempfile
import threading
import time
from unittest.mock import MagicMock, patch

import docker
import docker.errors
import dmpi.seal
import dmpi.node.userfs
import pytest
import salt.crypt
from dmpi.contract import LABEL_JOB, LABEL_ROLE, LABEL_USER
from dmpi.launch import files, openmpi5
from dmpi.node import agent, evidence, health, imagefacts, jobca
from salt.exceptions import CommandExecutionError, SaltInvocationError
from tests.extension import REPO, load_extension

STDERR_DATA = REPO / "tests" / "unit" / "dmpi" / "launch" / "data" / "mpirun"



mpi_job = load_extension("_modules/mpi_job.py", "mpi_job_module")
mpi_config = load_extension("_modules/mpi_config.py", "mpi_config_module")

JOB = "20261130-120000-abcdef"
OTHER_JOB = "20261130-120001-012345"
USER = "alice"
UID = 23456  # the user's own uid: files in their directory are read as it
OWN = "127.0.0.9"


@pytest.fixture
def configure_loader_modules():
    return {mpi_job: {"__opts__": {"id": "node1"}}, mpi_config: {"__opts__": {"id": "node1"}}}


@pytest.fixture(autouse=True)
def child_python(monkeypatch):
    """The confined child runs as the user's uid: it needs an interpreter that uid can
    run (the test venv's lives under root's home; on nodes, Salt's is /usr/bin/python3)."""
    monkeypatch.setattr(dmpi.node.userfs, "CHILD_PYTHON", "/usr/bin/python3")


@pytest.fixture(autouse=True)
def daemon_json(tmp_path, monkeypatch):
    """The node's daemon.json (without live-restore unless a test writes it), and no
    engine outage remembered from another test."""
    path = tmp_path / "daemon.json"
    path.write_text("{}")
    monkeypatch.setattr(evidence, "DAEMON_JSON", str(path))
    monkeypatch.setitem(evidence._ENGINE_OUTAGE, "since", None)
    return path


@pytest.fixture
def storage():
    # Outside pytest's own temporary tree, which only root may enter: the user's uid
    # must reach its directory, as on a node.
    base = pathlib.Path(tempfile.mkdtemp(prefix="mpi-job-report-"))
    base.chmod(0o755)
    path = base / "storage"
    (path / "users" / USER / "mpi-jobs" / JOB).mkdir(parents=True)
    for root, dirs, files in os.walk(path / "users" / USER):
        for name in dirs + files:
            os.chown(os.path.join(root, name), UID, UID)
    os.chown(path / "users" / USER, UID, UID)
    os.chmod(path / "users" / USER, 0o700)
    yield path
    shutil.rmtree(base)


def _write(path, text):
    path.write_text(text)
    os.chown(path, UID, UID)


@pytest.fixture
def job_root(tmp_path):
    path = tmp_path / "jobs"
    path.mkdir()
    return path


def _secrets(job_root, job_id, addresses, port):
    directory = job_root / job_id
    directory.mkdir(mode=0o700)
    (directory / "sshd_config").write_text(f"# generated\nPort {port}\nHostKey /run/x\n")
    (directory / "hostfile").write_text(
        "".join(f"{address} slots=2 max_slots=2\n" for address in addresses)
    )


def _container(job_id, role, status, exit_code=0, user=USER, address=OWN):
    container = MagicMock()
    container.name = f"dmpi-{job_id}-{role}"
    container.labels = {LABEL_JOB: job_id, LABEL_ROLE: role,
                        LABEL_USER: user}
    container.status = status
    container.attrs = {
        "State": {"Status": status, "ExitCode": exit_code, "Pid": 0},
        "Config": {"User": f"{UID}:{UID}"},
        "NetworkSettings": {"Networks": {"dmpi-jobs": {"IPAddress": address}}
                            if role == "worker" else {}},
    }
    return container


def _holder(name, address=None):
    """A standby namespace's holder: a spare, or one a job start took (renamed)."""
    container = MagicMock()
    container.name = name
    container.labels = {LABEL_ROLE: "standby"}
    container.status = "running"
    container.attrs = {"State": {"Status": "running", "ExitCode": 0, "Pid": 0},
                       "Config": {"User": "65534:65534"},
                       "NetworkSettings": {"Networks": {"dmpi-jobs": {"IPAddress": address}}
                                           if address else {}}}
    return container


def _engine(*containers):
    client = MagicMock()
    client.containers.list.return_value = list(containers)
    return patch.object(docker, "from_env", return_value=client)


class Listeners:
    """Sockets on loopback addresses sharing one port."""

    def __init__(self):
        self.sockets = []
        self.port = None

    def listen(self, address, backlog=16):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, self.port or 0))
        sock.listen(backlog)
        self.port = sock.getsockname()[1]
        self.sockets.append(sock)
        return sock

    def dropping(self, address):
        """A listener that never accepts and whose queue is full: SYNs are dropped."""
        self.listen(address, backlog=0)
        held = socket.create_connection((address, self.port), timeout=1)
        self.sockets.append(held)
        try:
            socket.create_connection((address, self.port), timeout=0.2).close()
        except OSError:
            return
        pytest.fail("a full accept queue should drop further connections")

    def close(self):
        for sock in self.sockets:
            sock.close()


@pytest.fixture
def listeners():
    found = Listeners()
    yield found
    found.close()


# ------------------------------------------------------------------------ report


def test_running_job_probes_each_other_node_once_in_parallel(storage, job_root, listeners):
    listeners.listen("127.0.0.2")
    listeners.dropping("127.0.0.4")
    listeners.dropping("127.0.0.5")
    # 127.0.0.3 has nothing on the port: refused. OWN is this node: never probed.
    _secrets(job_root, JOB, [OWN, "127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"],
             listeners.port)
    # Both dropped peers must be in flight at once: each probe of one waits (bounded) for
    # the other's to begin. One after the other, the first would wait in vain.
    dropped = {"127.0.0.4", "127.0.0.5"}
    together = threading.Barrier(len(dropped), timeout=30)
    overlapped, connects = [], evidence._tcp_connects

    def probe(address, port, timeout):
        if address in dropped:
            try:
                together.wait()
                overlapped.append(address)
            except threading.BrokenBarrierError:
                pass
        return connects(address, port, timeout)

    with _engine(_container(JOB, "worker", "running"), _container(JOB, "launcher", "running")), \
            patch.object(evidence, "_tcp_connects", probe):
        ret = mpi_job.report(str(storage), str(job_root), probe_timeout=1.0)
    assert ret["engine"] == "ok"
    assert ret["jobs"][JOB] == {
        "user": USER,
        "uid": str(UID),
        "gid": str(UID),
        "address": OWN,
        "containers": {"worker": "running", "launcher": "running", "netns": None},
        "launcher_exit_code": None,
        "failure": None,
        "limits_hit": [],
        "secrets": True,
        "peers": {"127.0.0.2": True, "127.0.0.3": False, "127.0.0.4": False,
                  "127.0.0.5": False},
    }
    deadline = time.monotonic() + 60
    while len(overlapped) < len(dropped) and not together.broken:
        assert time.monotonic() < deadline, "the dropped peers' probes never both began"
        time.sleep(0.01)
    assert sorted(overlapped) == sorted(dropped), "the dropped peers were probed one by one"
    assert abs(ret["time"] - time.time()) < 5


def test_peers_are_not_probed_once_no_container_runs(storage, job_root, listeners):
    listeners.listen("127.0.0.2")
    _secrets(job_root, JOB, [OWN, "127.0.0.2"], listeners.port)
    with _engine(_container(JOB, "worker", "exited", 137)):
        ret = mpi_job.report(str(storage), str(job_root))
    assert ret["jobs"][JOB]["containers"] == {"worker": "exited", "launcher": None, "netns": None}
    assert ret["jobs"][JOB]["peers"] == {}


def test_a_job_in_a_standby_namespace_has_the_holders_address_and_spares_are_no_jobs(
        storage, job_root, listeners, caplog):
    listeners.listen("127.0.0.2")
    _secrets(job_root, JOB, [OWN, "127.0.0.2"], listeners.port)
    # A worker in another container's namespace has no network settings of its own.
    worker = _container(JOB, "worker", "running", address=None)
    worker.attrs["NetworkSettings"] = {"Networks": {}}
    with _engine(worker, _holder(f"dmpi-{JOB}-netns", OWN), _holder("dmpi-standby-0a1b2c3d"),
                 _holder("dmpi-standby-junk-netns")):
        ret = mpi_job.report(str(storage), str(job_root))
    assert set(ret["jobs"]) == {JOB}
    job = ret["jobs"][JOB]
    assert job["containers"] == {"worker": "running", "launcher": None, "netns": "running"}
    assert job["address"] == OWN and job["uid"] == str(UID)
    assert job["peers"] == {"127.0.0.2": True}
    assert "ignoring container" not in caplog.text


def test_a_taken_namespace_outliving_its_job_is_reported_for_the_clean_up(storage, job_root):
    with _engine(_holder(f"dmpi-{JOB}-netns", OWN)):
        ret = mpi_job.report(str(storage), str(job_root))
    assert ret["jobs"][JOB]["containers"] == {"worker": None, "launcher": None,
                                              "netns": "running"}


def test_exited_launcher_reports_exit_code_and_failed_rank(storage, job_root):
    stderr = (STDERR_DATA / "exit3.stderr").read_text()
    _write(storage / "users" / USER / "mpi-jobs" / JOB / "stderr", stderr)
    with _engine(_container(JOB, "worker", "running"),
                 _container(JOB, "launcher", "exited", 3)):
        ret = mpi_job.report(str(storage), str(job_root))
    job = ret["jobs"][JOB]
    assert job["launcher_exit_code"] == 3
    assert job["failure"] == {"rank": 1, "exit_code": 3}
    assert job["secrets"] is False


@pytest.fixture(autouse=True)
def no_failures_known(monkeypatch):
    """Each test's job stderr is read afresh (the node reads a job's once)."""
    monkeypatch.setattr(evidence, "_FAILURES", {})


def test_a_failing_ranks_word_in_the_job_directory_names_it_when_hydra_lost_its_stderr(
        storage, job_root):
    # Hydra ended the job before it forwarded the failing rank's standard error.
    job_dir = storage / "users" / USER / "mpi-jobs" / JOB
    _write(job_dir / "stderr", "")
    mark = files.RANK_FAILED_MARK
    _write(job_dir / files.RANK_FAILED_FILE, f"{mark} rank 1 status 3\n{mark} rank 0 status 143\n")
    with _engine(_container(JOB, "worker", "running"),
                 _container(JOB, "launcher", "exited", 15)):
        ret = mpi_job.report(str(storage), str(job_root))
    assert ret["jobs"][JOB]["failure"] == {"rank": 1, "exit_code": 3}


def test_a_rank_that_ran_out_of_room_is_reported_with_its_error(storage, job_root):
    job_dir = storage / "users" / USER / "mpi-jobs" / JOB
    mark = files.RANK_FAILED_MARK
    _write(job_dir / "stderr", "Traceback (most recent call last):\n"
           "OSError: [Errno 28] No space left on device\n"
           f"{mark} rank 1 status 1\n")
    with _engine(_container(JOB, "worker", "running"),
                 _container(JOB, "launcher", "exited", 1)):
        ret = mpi_job.report(str(storage), str(job_root))
    assert ret["jobs"][JOB]["failure"] == {"rank": 1, "exit_code": 1,
                                           "space": "No space left on device"}


def test_a_lost_daemon_fails_a_launcher_that_exited_0(storage, job_root):
    # Open MPI 5's mpirun says it lost a node's daemon, and exits 0.
    stderr = (STDERR_DATA.parent / "openmpi5" / "ssh_partition.stderr").read_text()
    path = storage / "users" / USER / "mpi-jobs" / JOB / "stderr"
    _write(path, stderr)
    with _engine(_container(JOB, "worker", "running"), _container(JOB, "launcher", "exited", 0)):
        ret = mpi_job.report(str(storage), str(job_root))
    assert ret["jobs"][JOB]["failure"] == {"lost_daemon": openmpi5.LOST_DAEMON_REASON}
    # Read once: what the job writes after its end changes nothing.
    path.write_text("")
    with _engine(_container(JOB, "worker", "running"), _container(JOB, "launcher", "exited", 0)):
        ret = mpi_job.report(str(storage), str(job_root))
    assert ret["jobs"][JOB]["failure"] == {"lost_daemon": openmpi5.LOST_DAEMON_REASON}


def test_successful_launcher_has_no_failure(storage, job_root):
    # Even with a failure message in stderr, exit code 0 means nothing failed.
    stderr = (STDERR_DATA / "segv.stderr").read_text()
    _write(storage / "users" / USER / "mpi-jobs" / JOB / "stderr", stderr)
    with _engine(_container(JOB, "launcher", "exited", 0)):
        ret = mpi_job.report(str(storage), str(job_root))
    assert ret["jobs"][JOB]["launcher_exit_code"] == 0
    assert ret["jobs"][JOB]["failure"] is None


def test_only_the_last_64_kib_of_stderr_are_read(storage, job_root):
    stderr = (STDERR_DATA / "segv.stderr").read_text() + "x" * 70000
    _write(storage / "users" / USER / "mpi-jobs" / JOB / "stderr", stderr)
    with _engine(_container(JOB, "launcher", "exited", 139)):
        ret = mpi_job.report(str(storage), str(job_root))
    assert ret["jobs"][JOB]["launcher_exit_code"] == 139
    assert ret["jobs"][JOB]["failure"] is None


def test_missing_stderr_leaves_failure_unknown(storage, job_root):
    with _engine(_container(JOB, "launcher", "exited", 1)):
        ret = mpi_job.report(str(storage), str(job_root))
    assert ret["jobs"][JOB]["launcher_exit_code"] == 1
    assert ret["jobs"][JOB]["failure"] is None


def test_engine_down_reports_the_error_and_jobs_from_secrets_only(storage, job_root,
                                                                  listeners):
    listeners.listen("127.0.0.2")
    _secrets(job_root, JOB, [OWN, "127.0.0.2"], listeners.port)
    down = docker.errors.DockerException("Error while fetching server API version")
    with patch.object(docker, "from_env", side_effect=down):
        ret = mpi_job.report(str(storage), str(job_root))
    assert "fetching server API version" in ret["engine"]
    assert ret["jobs"] == {
        JOB: {
            "user": None,
            "uid": None,
            "gid": None,
            "address": None,
            "containers": {"worker": None, "launcher": None, "netns": None},
            "launcher_exit_code": None,
            "failure": None,
            "limits_hit": [],
            "secrets": True,
            "peers": {},
        }
    }


def test_engine_down_without_live_restore_is_a_fault_at_once(storage, job_root):
    down = docker.errors.DockerException("Error while fetching server API version")
    with patch.object(docker, "from_env", side_effect=down):
        ret = mpi_job.report(str(storage), str(job_root))
    assert "fetching server API version" in ret["engine"]
    assert "error" not in ret  # the master judges the node's jobs on it


def test_a_restarting_live_restore_engine_is_not_a_fault_until_the_grace_ends(
        storage, job_root, daemon_json):
    daemon_json.write_text('{"live-restore": true, "log-driver": "json-file"}')
    _secrets(job_root, JOB, [OWN], 2222)
    down = docker.errors.DockerException("Error while fetching server API version")
    clock = [1000.0]
    with patch.object(docker, "from_env", side_effect=down), \
            patch.object(time, "time", lambda: clock[0]):
        first = mpi_job.report(str(storage), str(job_root))
        clock[0] += evidence.ENGINE_RESTART_GRACE - 1
        later = mpi_job.report(str(storage), str(job_root))
        clock[0] += 1
        over = mpi_job.report(str(storage), str(job_root))
    # The truth about the engine is kept; "error" tells the master not to judge on it.
    assert "fetching server API version" in first["engine"]
    assert "live-restore" in first["error"] and "restarting" in first["error"]
    assert first["jobs"][JOB]["secrets"] is True
    # The same words all through the outage: the node's fingerprint does not change,
    # so it sends heartbeats, not a report a second.
    assert later["error"] == first["error"]
    assert "error" not in over and "fetching server API version" in over["engine"]


def test_an_engine_that_answers_again_starts_a_new_grace(storage, job_root, daemon_json):
    daemon_json.write_text('{"live-restore": true}')
    down = docker.errors.DockerException("connection refused")
    clock = [1000.0]
    with patch.object(time, "time", lambda: clock[0]):
        with patch.object(docker, "from_env", side_effect=down):
            mpi_job.report(str(storage), str(job_root))
        clock[0] += 20
        with _engine():
            assert mpi_job.report(str(storage), str(job_root))["engine"] == "ok"
        clock[0] += 20
        with patch.object(docker, "from_env", side_effect=down):
            again = mpi_job.report(str(storage), str(job_root))
    assert "error" in again  # 40 s after the first outage began, but 0 s into this one


def test_an_unreadable_daemon_json_means_no_grace(storage, job_root, daemon_json):
    daemon_json.write_text("not json")
    down = docker.errors.DockerException("connection refused")
    with patch.object(docker, "from_env", side_effect=down):
        assert "error" not in mpi_job.report(str(storage), str(job_root))


def test_jobs_are_merged_from_containers_and_secret_dirs_and_junk_is_ignored(storage,
                                                                              job_root):
    (job_root / OTHER_JOB).mkdir()
    (job_root / "not-a-job").mkdir()
    stray = _container("../../etc", "worker", "running")
    with _engine(_container(JOB, "worker", "running"), stray):
        ret = mpi_job.report(str(storage), str(job_root))
    assert set(ret["jobs"]) == {JOB, OTHER_JOB}
    assert ret["jobs"][JOB]["secrets"] is False
    assert ret["jobs"][OTHER_JOB]["secrets"] is True
    assert ret["jobs"][OTHER_JOB]["containers"] == {"worker": None, "launcher": None, "netns": None}


def test_a_report_never_raises_on_what_the_job_wrote(storage, job_root, tmp_path):
    job_dir = storage / "users" / USER / "mpi-jobs" / JOB
    huge_rank = ("mpirun noticed that process rank " + "9" * 5000 + " with PID 1 on node n "
                 "exited on signal 11 (Segmentation fault).\n")
    _write(job_dir / "stderr", huge_rank)
    with _engine(_container(JOB, "launcher", "exited", 1)):
        assert mpi_job.report(str(storage), str(job_root))["jobs"][JOB]["failure"] is None
    # The job's directory swapped for a chain of 1100 symlinks, and a FIFO as stderr.
    users = storage / "users" / USER
    os.rename(users / "mpi-jobs", users / "real")
    for i in range(1100):
        os.symlink(f"l{i + 1}", users / f"l{i}")
    os.symlink("real", users / "l1100")
    os.symlink("l0", users / "mpi-jobs")
    with _engine(_container(JOB, "launcher", "exited", 1)):
        started = time.monotonic()
        ret = mpi_job.report(str(storage), str(job_root))
    assert ret["jobs"][JOB]["failure"] is None and time.monotonic() - started < 5
    os.unlink(users / "mpi-jobs")
    os.rename(users / "real", users / "mpi-jobs")
    os.unlink(job_dir / "stderr")
    os.mkfifo(job_dir / "stderr")
    with _engine(_container(JOB, "launcher", "exited", 1)):
        started = time.monotonic()
        ret = mpi_job.report(str(storage), str(job_root))
    assert ret["jobs"][JOB]["failure"] is None and time.monotonic() - started < 5


def test_stderr_is_read_as_the_users_uid(storage, job_root):
    # A file in the user's directory that the user's uid cannot read stays unread.
    path = storage / "users" / USER / "mpi-jobs" / JOB / "stderr"
    path.write_text((STDERR_DATA / "exit3.stderr").read_text())
    os.chmod(path, 0o600)  # owned by root, not the user
    with _engine(_container(JOB, "launcher", "exited", 3)):
        ret = mpi_job.report(str(storage), str(job_root))
    assert ret["jobs"][JOB]["failure"] is None


@pytest.mark.parametrize(
    "kwargs",
    [
        {"storage_path": "relative"},
        {"job_root": "jobs"},
        {"probe_timeout": 0},
        {"probe_timeout": "soon"},
    ],
)
def test_report_rejects_bad_arguments(storage, job_root, kwargs):
    args = {"storage_path": str(storage), "job_root": str(job_root), **kwargs}
    with _engine(), pytest.raises(SaltInvocationError):
        mpi_job.report(**args)


# ------------------------------------------------------------------- read_output


def test_read_output_returns_the_tail(storage):
    path = storage / "users" / USER / "mpi-jobs" / JOB / "stdout"
    _write(path, "head\n" + "y" * 100 + "\nlast line\n")
    assert mpi_job.read_output(JOB, str(storage), USER, UID, UID, tail_bytes=10) == "last line\n"
    assert mpi_job.read_output(JOB, str(storage), USER, UID, UID).startswith("head\n")


def test_read_output_sealed_is_for_the_masters_key_alone(storage, tmp_path, monkeypatch):
    """The runner asks for output sealed: what Salt keeps of the return (the master's
    job cache, the event bus) is then ciphertext."""
    _write(storage / "users" / USER / "mpi-jobs" / JOB / "stdout", "SECRET_TOKEN=s3cr3t\n")
    pki = tmp_path / "pki"
    pki.mkdir()
    salt.crypt.write_keys(str(pki), "minion_master", 2048)  # the master's key pair
    monkeypatch.setitem(mpi_job.__opts__, "pki_dir", str(pki))
    sealed = mpi_job.read_output(JOB, str(storage), USER, UID, UID, seal=True)
    assert "s3cr3t" not in json.dumps(sealed)
    opened = dmpi.seal.unseal(str(pki / "minion_master.pem"), sealed)
    assert json.loads(opened) == "SECRET_TOKEN=s3cr3t\n"
    followed = mpi_job.read_output(JOB, str(storage), USER, UID, UID, offset=0, seal=True)
    assert json.loads(dmpi.seal.unseal(str(pki / "minion_master.pem"), followed)) == \
        {"data": "SECRET_TOKEN=s3cr3t\n", "offset": 20}


def test_read_output_reads_stderr(storage):
    _write(storage / "users" / USER / "mpi-jobs" / JOB / "stderr", "oops\n")
    assert mpi_job.read_output(JOB, str(storage), USER, UID, UID, stream="stderr") == "oops\n"


@pytest.mark.parametrize(
    "args, kwargs",
    [
        ((JOB, "USER_DIR", USER, UID, UID), {"stream": "status.json"}),
        ((JOB, "USER_DIR", USER, UID, UID), {"tail_bytes": 0}),
        (("../x", "USER_DIR", USER, UID, UID), {}),
        ((JOB, "USER_DIR", "../root", UID, UID), {}),
        ((JOB, "USER_DIR", USER, 0, 0), {}),
    ],
)
def test_read_output_rejects_bad_arguments(storage, args, kwargs):
    args = tuple(str(storage) if a == "USER_DIR" else a for a in args)
    with pytest.raises(SaltInvocationError):
        mpi_job.read_output(*args, **kwargs)


def test_read_output_missing_file_is_an_execution_error(storage):
    with pytest.raises(CommandExecutionError, match="cannot read the stdout"):
        mpi_job.read_output(JOB, str(storage), USER, UID, UID)


def test_read_output_refuses_a_symlink_planted_by_the_job(storage, tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("private key\n")
    os.symlink(secret, storage / "users" / USER / "mpi-jobs" / JOB / "stdout")
    with pytest.raises(CommandExecutionError):
        mpi_job.read_output(JOB, str(storage), USER, UID, UID)


def test_read_output_refuses_a_job_dir_leading_outside_the_user_dir(storage, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "stdout").write_text("not the user's\n")
    job_dir = storage / "users" / USER / "mpi-jobs" / OTHER_JOB
    os.symlink(outside, job_dir)
    with pytest.raises(CommandExecutionError, match="cannot read the stdout"):
        mpi_job.read_output(OTHER_JOB, str(storage), USER, UID, UID)


def test_read_output_does_not_block_on_a_fifo(storage):
    os.mkfifo(storage / "users" / USER / "mpi-jobs" / JOB / "stdout")
    started = time.monotonic()
    with pytest.raises(CommandExecutionError, match="cannot read the stdout"):
        mpi_job.read_output(JOB, str(storage), USER, UID, UID)
    assert time.monotonic() - started < 5  # a blocked open would hang until the timeout


# --------------------------------------------------------------------------- health

REF = "10.251.1.2:5000/dockermpi/mpi@sha256:" + "a" * 64


def _images_engine(*digests):
    image = MagicMock()
    image.attrs = {"RepoDigests": list(digests), "RepoTags": ["mpi:local"]}
    untagged = MagicMock()
    untagged.attrs = {"RepoDigests": None}
    client = MagicMock()
    client.images.list.return_value = [image, untagged]
    return patch.object(docker, "from_env", return_value=client)


@pytest.fixture(autouse=True)
def job_ca_path(tmp_path, monkeypatch):
    path = tmp_path / "job-ca" / "ca"
    monkeypatch.setattr(jobca, "JOB_CA_KEY", str(path))
    return path


@pytest.fixture(autouse=True)
def facts_file(tmp_path, monkeypatch):
    path = tmp_path / "image-facts.json"
    monkeypatch.setattr(imagefacts, "FACTS_FILE", str(path))
    return path


@pytest.fixture(autouse=True)
def agent_dir(tmp_path, monkeypatch):
    """A node's agent as dmpi.node.agent.build leaves it: a link to a build holding its
    manifest and programs."""
    build = tmp_path / "agent.d" / "0123456789abcdef"
    for name in agent.PROGRAMS:
        (build / name).parent.mkdir(parents=True, exist_ok=True)
        (build / name).write_text("#!/bin/sh\n")
        (build / name).chmod(0o755)
    (build / agent.MANIFEST).write_text(json.dumps({"agent_version": agent.AGENT_VERSION}))
    link = tmp_path / "agent"
    link.symlink_to(build)
    monkeypatch.setattr(agent, "AGENT_DIR", str(link))
    return link


def test_a_healthy_node_reports_docker_storage_and_image_digests(storage, job_ca_path):
    with _images_engine(REF, "mpi:local"):
        found = mpi_job.health(str(storage))
    public = found.pop("job_ca_public")
    assert found == {"docker": "ok", "storage": "ok", "images": [REF], "image_facts": {},
                     "job_ca": "ok", "agent": "ok"}
    assert sorted(os.listdir(storage)) == ["users"]  # the probe file is gone again
    # The job CA is made once, root's alone, and the same key is reported after.
    assert public.startswith("ssh-ed25519 ")
    assert stat.S_IMODE(job_ca_path.stat().st_mode) == 0o600
    assert stat.S_IMODE(job_ca_path.parent.stat().st_mode) == 0o700
    with _images_engine(REF):
        assert mpi_job.health(str(storage))["job_ca_public"] == public


def test_health_carries_what_the_probe_found_in_the_images_present(storage):
    other = REF.replace("a" * 64, "b" * 64)
    imagefacts.keep(REF, {"mpi": {"flavour": "openmpi4"}})
    imagefacts.keep(other, {"mpi": None})  # probed once, no longer here
    with _images_engine(REF):
        found = mpi_job.health(str(storage))
    assert found["image_facts"] == {REF: {"mpi": {"flavour": "openmpi4"}}}


def test_health_says_when_no_job_ca_can_be_made(storage, job_ca_path):
    job_ca_path.parent.mkdir(mode=0o500)  # read-only even for its owner (tests may be root)
    with patch.object(os, "replace", side_effect=PermissionError(13, "Permission denied")):
        with _images_engine(REF):
            found = mpi_job.health(str(storage))
    assert found["job_ca"].startswith(f"cannot make the job CA {job_ca_path}")
    assert "job_ca_public" not in found


def test_health_says_when_the_node_has_no_agent(storage, agent_dir):
    agent_dir.unlink()
    with _images_engine(REF):
        assert "has no remote-start agent" in mpi_job.health(str(storage))["agent"]
    agent_dir.symlink_to(agent_dir.parent / "agent.d" / "0123456789abcdef")
    (agent_dir / "sbin" / "sshd").chmod(0o644)
    with _images_engine(REF):
        assert mpi_job.health(str(storage))["agent"].endswith(
            "lacks sbin/sshd (highstate builds it again)")


def test_health_says_when_docker_does_not_answer(storage):
    down = docker.errors.DockerException("Error while fetching server API version")
    with patch.object(docker, "from_env", side_effect=down):
        found = mpi_job.health(str(storage))
    assert found["docker"].startswith("Error while fetching") and found["images"] == []
    assert found["storage"] == "ok"


def test_storage_that_is_no_mount_and_has_no_users_directory_is_not_mounted(tmp_path):
    with _images_engine():
        found = mpi_job.health(str(tmp_path))
    assert found["storage"].startswith("not mounted:") and "no mount point" in found["storage"]
    with _images_engine():
        assert mpi_job.health(str(tmp_path / "gone"))["storage"].startswith("not mounted:")


def test_storage_root_cannot_write_is_not_writable(storage):
    # root writes anywhere a mode allows; a read-only file system stops it. A probe file
    # name taken by a directory stands in for that here.
    (storage / ".dockermpi-health-node1").mkdir()
    with _images_engine():
        found = mpi_job.health(str(storage))
    assert found["storage"].startswith("not writable:"), found


def test_a_hanging_storage_check_is_reported_and_not_waited_for_again(storage, monkeypatch):
    release, checks = threading.Event(), []

    def hanging_check(*args):
        checks.append(args)
        return release.wait(60) and "ok"

    monkeypatch.setattr(health, "_storage_state", hanging_check)
    monkeypatch.setattr(health, "STORAGE_CHECK_TIMEOUT", 0.2)
    with _images_engine():
        assert mpi_job.health(str(storage))["storage"].startswith("not responding (the check")
        assert mpi_job.health(str(storage))["storage"].startswith("not responding (a check")
    # The second report neither waited for the hanging check nor started another.
    assert len(checks) == 1 and not release.is_set()
    release.set()


def test_a_minion_whose_engine_predates_health_reports_is_not_running_the_wanted_engine():
    old = {"storage_path": "/srv/dockermpi", "job_root": "/var/lib/dockermpi/jobs"}
    with patch.dict(mpi_config.__opts__, {"engines": [{"mpi_node": old}]}):
        assert mpi_config.node_engine_running("/srv/dockermpi")
        assert not mpi_config.node_engine_running("/srv/dockermpi", health=10)
    with patch.dict(mpi_config.__opts__, {"engines": [{"mpi_node": dict(old, health=10)}]}):
        assert mpi_config.node_engine_running("/srv/dockermpi", health=10)


def test_a_minion_running_its_calls_in_processes_is_not_the_wanted_one_until_it_restarts():
    engines = [{"mpi_node": {"storage_path": "/srv/dockermpi",
                             "job_root": "/var/lib/dockermpi/jobs"}}]
    with patch.dict(mpi_config.__opts__, {"engines": engines}):
        # Salt's default, read at the minion's start: processes.
        mpi_config.__opts__.pop("multiprocessing", None)
        assert mpi_config.node_engine_running("/srv/dockermpi")
        assert not mpi_config.node_engine_running("/srv/dockermpi", multiprocessing=False)
        mpi_config.__opts__["multiprocessing"] = False
        assert mpi_config.node_engine_running("/srv/dockermpi", multiprocessing=False)
        assert not mpi_config.node_engine_running("/srv/dockermpi", multiprocessing=True)
        assert not mpi_config.node_engine_running("/srv/other", multiprocessing=False)


def test_a_minion_started_before_the_engines_code_changed_is_not_running_the_wanted_engine(
        tmp_path):
    from dmpi.node.revision import engine_revision

    for path in ("engines/mpi_node.py", "modules/mpi_job.py", "modules/mpi_network.py",
                 "utils/dmpi/node/evidence.py", "utils/other.py", "states/mpi_image.py"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(f"# {path}\n")
    revisions = [engine_revision(str(tmp_path))]
    # Code the engine process does not load changes nothing; its own code does.
    for path in ("modules/mpi_network.py", "utils/other.py", "states/mpi_image.py"):
        (tmp_path / path).write_text("changed\n")
    assert engine_revision(str(tmp_path)) == revisions[0]
    for path in ("engines/mpi_node.py", "modules/mpi_job.py", "utils/dmpi/node/evidence.py"):
        (tmp_path / path).write_text("changed\n")
        revisions.append(engine_revision(str(tmp_path)))
    (tmp_path / "utils/dmpi/new.py").write_text("")
    revisions.append(engine_revision(str(tmp_path)))
    assert len(set(revisions)) == 5 and all(len(r) == 16 for r in revisions)
    running = {"storage_path": "/srv/dockermpi", "job_root": "/var/lib/dockermpi/jobs",
               "health": 10, "revision": revisions[0]}
    with patch.dict(mpi_config.__opts__, {"engines": [{"mpi_node": running}],
                                          "extension_modules": str(tmp_path)}):
        assert mpi_config.node_engine_running("/srv/dockermpi", health=10, revision=revisions[0])
        assert not mpi_config.node_engine_running("/srv/dockermpi", health=10,
                                                  revision=revisions[-1])


def test_the_engine_revision_is_rendered_on_a_host_without_the_docker_sdk(tmp_path):
    # A fresh node's first highstate renders it before it installs the Docker SDK.
    (tmp_path / "engines").mkdir()
    (tmp_path / "engines" / "mpi_node.py").write_text("# engine\n")
    probe = (
        "import sys; sys.modules['docker'] = None\n"
        "from tests.extension import load_extension\n"
        "config = load_extension('_modules/mpi_config.py', 'mpi_config_without_docker')\n"
        f"config.__opts__ = {{'extension_modules': {str(tmp_path)!r}}}\n"
        "print(config.engine_revision())\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "_utils")]))
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env=env, cwd=REPO, check=False)
    assert done.returncode == 0, done.stderr
    from dmpi.node.revision import engine_revision
    assert done.stdout.strip() == engine_revision(str(tmp_path))


def test_the_probe_file_goes_to_the_health_directory_when_there_is_one(storage, monkeypatch):
    (storage / ".dockermpi-health").mkdir(mode=0o700)
    written = []
    plain_open = os.open

    def recording_open(path, *args, **kwargs):
        written.append(str(path))
        return plain_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", recording_open)
    with _images_engine():
        assert mpi_job.health(str(storage))["storage"] == "ok"
    assert [w for w in written if w.startswith(str(storage))] == \
        [str(storage / ".dockermpi-health" / ".dockermpi-health-node1")]
    assert os.listdir(storage / ".dockermpi-health") == []
