"""Unit tests of the notebook's DockerMPI client (images/notebook/dockermpi): how ``mpi``
arguments become job fields, how records and tables read, and how the client uses the
DockerMPI user API v1: requests, error answers, rate limits and the event stream.

The HTTP tests talk to a real local HTTP server (``FakeAPI``) that answers as the API's
contract says (the API that _engines/mpi_api.py serves): JSON error bodies with their
status codes, Retry-After on 429, and server-sent events sent chunked, as tornado does,
behind the hub's /services/dockermpi prefix. Event streams are either scripted (to cut
them, silence them, resend output from offset 0) or made from the fake's own jobs."""

import collections
import http.server
import io
import json
import pathlib
import re
import signal
import socket
import ssl
import struct
import sys
import threading
import time
import types
import urllib.parse

import pytest

from tests.cluster import tls

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "images" / "notebook"))

import dockermpi  # noqa: E402
from dockermpi import cli, client as client_module, render  # noqa: E402
from dockermpi.client import TOKEN_REFUSED, Client  # noqa: E402

JOB = "20261201-114410-dbd5d6"
OTHER_JOB = "20261201-114411-000001"
TOKEN = "0123abcd"
PREFIX = "/services/dockermpi"
ENV = {
    "DOCKERMPI_API_URL": "http://127.0.0.1:1",
    "DOCKERMPI_IMAGE": "notebook",
    "JUPYTERHUB_USER": "alice",
    "JUPYTERHUB_API_TOKEN": TOKEN,
}
CONDITION_TIMEOUT = 60  # seconds a test or the fake waits for a condition (CI is loaded)


@pytest.fixture(autouse=True)
def hub_environment(monkeypatch):
    for name in ("DOCKERMPI_API_URL", "DOCKERMPI_API_CA", "DOCKERMPI_IMAGE", "JUPYTERHUB_USER",
                 "JUPYTERHUB_API_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)


def record(state="succeeded", **fields):
    return {"job_id": JOB, "name": "pi", "user": "alice", "state": state, "np": 6,
            "exit_code": 0 if state == "succeeded" else None,
            "placement": {"node1": 2, "node2": 2, "node3": 2},
            "submitted": 1_764_589_450.0, "started": 1_764_589_451.0,
            "ended": 1_764_589_454.5 if state == "succeeded" else None,
            "explanation": "all 6 ranks exited 0" if state == "succeeded" else None,
            "reason": None, "waiting_for": None,
            "history": [{"state": "queued", "at": 1_764_589_450.0, "reason": None}],
            "output": {"dir_in_job": f"/data/mpi-jobs/{JOB}"},
            "retcode": 0 if state == "succeeded" else 1, **fields}


def parse(argv):
    return cli.build_parser().parse_args(argv)


@pytest.fixture
def ctrl_c():
    """Ctrl-C as it reaches the single-threaded ``mpi`` command in a terminal: SIGINT to
    the main thread, raising KeyboardInterrupt. (A process-wide kill may land on one of
    the fake server's threads, leaving the main thread's read blocked until the stream
    times out; and a test run started in the background of a script inherits SIGINT
    ignored, so the handler is set here.)"""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield lambda: signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, previous)


def wait_until(condition, what):
    """Wait (on the condition, not a fixed time) until ``condition()`` is true."""
    deadline = time.monotonic() + CONDITION_TIMEOUT
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.01)


# --- mpi submit/run arguments -> job fields ----------------------------------------------
def test_submit_options_map_to_job_fields(monkeypatch):
    monkeypatch.chdir("/tmp")  # -D is relative to where mpi runs, like Slurm's
    args = parse(["submit", "-n", "6", "-N", "3", "--ntasks-per-node", "2", "-t", "30",
                  "-J", "pi", "-D", "work", "--image", "mpi", "--export", "OMP_NUM_THREADS=1",
                  "--export", "GREETING=a=b", "python3", "pi.py"])
    assert cli.submit_args(args) == {
        "cmd": ["python3", "pi.py"], "np": 6, "image": "mpi", "name": "pi", "nodes": 3,
        "slots_per_node": 2, "walltime": "30m", "env": {"OMP_NUM_THREADS": "1",
                                                        "GREETING": "a=b"},
        "workdir": "/tmp/work",
    }


@pytest.mark.parametrize("argv, program", [
    (["-n", "2", "python3", "x.py", "-n", "5", "--json", "-t", "1"],
     ["python3", "x.py", "-n", "5", "--json", "-t", "1"]),
    (["-n", "2", "--", "-weird-program", "--image", "x"], ["-weird-program", "--image", "x"]),
    (["./a.out", "--", "x"], ["./a.out", "--", "x"]),
])
def test_program_options_are_the_programs(argv, program):
    args = parse(["run"] + argv)
    assert cli.submit_args(args)["cmd"] == program
    assert cli.submit_args(args)["image"] is None
    assert args.json is False


@pytest.mark.parametrize("given, sent", [("30", "30m"), ("90s", "90s"), ("2h", "2h"),
                                         ("10:00", "10:00"), ("1-02:00:00", "1-02:00:00")])
def test_a_bare_walltime_is_minutes_like_slurm_others_go_as_written(given, sent):
    assert cli.submit_args(parse(["submit", "-t", given, "hostname"]))["walltime"] == sent


def test_nodes_are_a_count_or_passed_as_written():
    assert cli.submit_args(parse(["submit", "-N", "G@rack:a", "hostname"]))["nodes"] == "G@rack:a"
    assert cli.submit_args(parse(["submit", "-N", "node1,node2", "hostname"]))["nodes"] == \
        "node1,node2"


def test_ranks_default_to_one_or_nodes_times_ranks_per_node():
    assert cli.submit_args(parse(["submit", "hostname"]))["np"] == 1
    assert cli.submit_args(parse(["submit", "-N", "3", "--ntasks-per-node", "4",
                                  "hostname"]))["np"] == 12


def test_submit_without_program_is_refused():
    with pytest.raises(dockermpi.DockerMPIError, match="no program"):
        cli.submit_args(parse(["submit", "-n", "2"]))


def test_export_needs_name_and_value(capsys):
    with pytest.raises(SystemExit):
        parse(["submit", "--export", "NOVALUE", "hostname"])
    assert "expected NAME=VALUE" in capsys.readouterr().err


def test_history_dates_become_epoch_seconds():
    args = parse(["history", "--since", "2026-12-01", "--until", "1764600000"])
    assert isinstance(args.since, float) and args.until == 1_764_600_000.0


def test_the_help_names_what_configures_mpi_and_no_longer_the_user():
    epilog = cli.build_parser().epilog
    assert "DOCKERMPI_API_URL" in epilog and "JUPYTERHUB_API_TOKEN" in epilog
    assert "JUPYTERHUB_USER" not in epilog and "salt" not in epilog.lower()


# --- rendering ---------------------------------------------------------------------------
@pytest.mark.parametrize("seconds, text", [(0, "0:00"), (59.6, "1:00"), (3_725, "1:02:05"),
                                           (90_061, "1-01:01:01"), (None, "-")])
def test_durations_read_like_slurm(seconds, text):
    assert render.duration(seconds) == text


def test_outcome_line_says_state_exit_code_placement_and_explanation():
    assert render.outcome_line(record()) == (
        f"mpi: job {JOB} succeeded, exit code 0, on node1:2,node2:2,node3:2: "
        "all 6 ranks exited 0")
    failed = record("failed", exit_code=139, reason="rank 2 was killed by SIGSEGV")
    assert render.outcome_line(failed).endswith("exit code 139, on node1:2,node2:2,node3:2: "
                                                "rank 2 was killed by SIGSEGV")


def test_record_text_lists_the_fields_people_ask_about():
    text = render.record_text(record(closed=True))
    assert text.splitlines()[0] == f"job {JOB} (pi)"
    for expected in ("state        succeeded (cleaned up)", "exit code    0",
                     "placement    node1:2,node2:2,node3:2", "elapsed      0:04",
                     f"output       /data/mpi-jobs/{JOB}", "history"):
        assert expected in text
    assert "waiting for" not in text and "from" not in text


def test_a_queued_jobs_record_text_says_why_it_waits_and_its_place_in_the_queue():
    text = render.record_text(record("queued", waiting_for="user limit", queue_place=2,
                                     ended=None, exit_code=None))
    assert "waiting for  user limit" in text and "queue place  2" in text, text


def test_record_text_names_the_notebook_and_cell_a_job_came_from():
    text = render.record_text(record(origin={"notebook": "/data/work/a.ipynb", "cell": 4}))
    assert "from         /data/work/a.ipynb cell [4]" in text
    assert "from         cell [0]" in render.record_text(record(origin={"cell": 0}))


def test_queue_shows_why_queued_jobs_wait_and_where_running_ones_run():
    rows = [record("running", started=1000.0, ended=None),
            record("queued", job_id=OTHER_JOB, name=None, started=None,
                   placement=None, waiting_for="resources",
                   priority={"priority": 5012, "fairshare": 0.5, "age": 0.012})]
    lines = render.queue_text(rows, now=1125.0).splitlines()
    assert lines[0].split() == ["JOBID", "NAME", "USER", "STATE", "NP", "PRIORITY", "TIME",
                                "NODELIST(REASON)"]
    assert lines[1].split() == [JOB, "pi", "alice", "running", "6", "-", "2:05",
                                "node1:2,node2:2,node3:2"]
    assert lines[2].split() == [OTHER_JOB, "-", "alice", "queued", "6", "5012", "0:00",
                                "(resources)"]


def test_a_queued_jobs_status_shows_its_priority_and_its_parts():
    text = render.record_text(record("queued", started=None, placement=None,
                                     priority={"priority": 5012, "fairshare": 0.5,
                                               "age": 0.012}))
    assert "priority     5012 (fairshare 0.5, age 0.012)" in text


def test_history_table_has_one_row_per_ended_job():
    rows = [dict(record(), elapsed=3.5, core_hours=0.0058)]
    lines = render.history_text(rows).splitlines()
    assert lines[0].split()[:8] == ["JOBID", "NAME", "STATE", "EXIT", "NP", "ELAPSED",
                                    "CORE-H", "ENDED"]
    assert lines[1].split()[:7] == [JOB, "pi", "succeeded", "0", "6", "0:04", "0.01"]
    assert lines[1].endswith("all 6 ranks exited 0")


def test_usage_shows_jobs_standing_and_the_directory_against_its_quota():
    usage = {"users": {"alice": {"jobs": {"total": 3, "succeeded": 2, "running": 1},
                                 "core_hours": 1.5}},
             "fair_share": {"alice": {"decayed_core_hours": 1.2, "fairshare": 0.7}},
             "storage": {"alice": {"bytes_used": 50 << 20, "bytes_limit": 48 << 20,
                                   "files_used": 2001, "files_limit": 2000}}}
    lines = render.usage_text(usage).splitlines()
    assert lines[1].split() == ["alice", "3", "1", "0", "1.50", "1.2", "0.7"]
    assert lines[3].split() == ["USER", "USED", "LIMIT", "FILES", "FILE", "LIMIT"]
    assert lines[4].split() == ["alice", "50M", "48M", "2001", "2000"]
    usage["storage"] = {"alice": {"bytes_used": 1536, "bytes_limit": 0, "files_used": None,
                                  "files_limit": 0}}
    assert render.usage_text(usage).splitlines()[4].split() == ["alice", "1.5K", "none",
                                                                "-", "none"]
    usage["storage"] = {"error": "the storage's quota figures are not available: x"}
    assert render.usage_text(usage).endswith(
        "storage: the storage's quota figures are not available: x")
    del usage["storage"]
    assert len(render.usage_text(usage).splitlines()) == 2


def test_empty_tables_are_just_headers():
    assert render.queue_text([]).split() == ["JOBID", "NAME", "USER", "STATE", "NP",
                                             "PRIORITY", "TIME", "NODELIST(REASON)"]


@pytest.mark.parametrize("job, status", [
    (record("succeeded"), 0), (record("failed", exit_code=3), 3),
    (record("timed_out", exit_code=None), 1), (record("failed", exit_code=300), 1),
])
def test_mpi_run_exits_with_the_jobs_exit_code(job, status):
    assert cli.job_exit_status(job) == status


# --- the fake API --------------------------------------------------------------------------
FINAL = ("succeeded", "failed", "cancelled", "timed_out")
APPROVED_IMAGES = ["mpi", "notebook"]
#: GET /images as the API answers it (dmpi.master.user_calls.images).
IMAGE_LIST = [
    {"name": "mpi", "reference": "reg:5000/dockermpi/mpi@sha256:" + "0" * 64,
     "runs_jobs": True, "why_no_jobs": None,
     "mpi": "Open MPI 4.1.4 (/usr/bin/mpirun), mpi4py 3.1.4", "flavour": "openmpi4",
     "mpi_version": "4.1.4", "launcher": "/usr/bin/mpirun", "python3": "/usr/bin/python3",
     "python_version": "3.11.2", "mpi4py": "3.1.4", "sshd": "/usr/sbin/sshd",
     "os": "Debian GNU/Linux 12 (bookworm)", "glibc": "2.36", "probed_on": ["node1"],
     "mpi_from_pillar": False},
    {"name": "notebook", "reference": "reg:5000/dockermpi/notebook@sha256:" + "1" * 64,
     "runs_jobs": False, "why_no_jobs": "it has no MPI launcher (mpirun or mpiexec) on its PATH",
     "mpi": "no MPI launcher (mpirun, mpiexec) on PATH", "flavour": None, "mpi_version": None,
     "launcher": None, "python3": "/usr/bin/python3", "python_version": "3.11.2",
     "mpi4py": None, "sshd": None, "os": "Debian GNU/Linux 12 (bookworm)", "glibc": "2.36",
     "probed_on": ["node1"], "mpi_from_pillar": False},
    {"name": "mpich", "reference": "reg:5000/dockermpi/mpich@sha256:" + "2" * 64,
     "runs_jobs": True, "why_no_jobs": None, "why_one_node_only": "its MPICH 4.0.2 (ch4:ucx) "
     "can hang in MPI_Finalize when ranks span nodes", "mpi": "MPICH 4.0.2 (/usr/bin/mpirun)",
     "flavour": "mpich", "mpi_version": "4.0.2", "launcher": "/usr/bin/mpirun",
     "python3": "/usr/bin/python3", "python_version": "3.11.2", "mpi4py": None, "sshd": None,
     "os": "Debian GNU/Linux 12 (bookworm)", "glibc": "2.36", "probed_on": ["node1"],
     "mpi_from_pillar": False},
]
LOG_BYTES = 1 << 20  # the API's default per-call log byte limit
JOB_FIELDS = {"image", "np", "cmd", "name", "nodes", "slots_per_node", "walltime", "env",
              "workdir", "origin"}
IDENTITY = {"user": "alice", "account": "alice", "uid": 20001, "gid": 20001,
            "dir": "/srv/dockermpi/users/alice", "dir_in_job": "/data"}

Seen = collections.namedtuple("Seen", "method path query headers body at peer")


class Refused(Exception):
    """An error answer of the fake: status, one-line error, extra body fields, headers."""

    def __init__(self, status, error, headers=None, **fields):
        super().__init__(error)
        self.status, self.headers = status, headers or {}
        self.body = {"error": error, "status": status, **fields}


def output_events(stream, *pieces, job_id=JOB):
    """``output`` events of ``pieces`` of one stream sent from offset 0, as a stream sends
    them: each event's offset is the byte offset after its data."""
    events, offset = [], 0
    for piece in pieces:
        offset += len(piece.encode())
        events.append(("output", {"job_id": job_id, "stream": stream, "data": piece,
                                  "offset": offset}))
    return events


def state_event(state, **fields):
    return ("state", record(state, **fields))


def end_event(state="succeeded", **fields):
    return ("end", record(state, **fields))


class FakeAPI(http.server.ThreadingHTTPServer):
    """The DockerMPI user API v1 in memory, behind the hub's /services/dockermpi.

    ``jobs``/``output`` are its jobs and their output bytes; ``refusals`` are error
    answers (status, headers) given, in order, to the next requests whatever they ask;
    ``streams[job_id]`` scripts the next event streams of a job, one list of steps per
    connection (see ``FakeAPIHandler.scripted_stream``); a job without one gets a stream
    made from its record and output as they change."""

    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), FakeAPIHandler)
        self.changed = threading.Condition()
        self.requests = []
        self.jobs = {}
        self.mpijobs = []  # the bodies of MPIJob submits
        self.output = collections.defaultdict(bytes)
        self.new_job_ids = [JOB, OTHER_JOB]
        self.refusals = []
        self.streams = {}
        self.instant_waits = 0  # waits answered at once, as when their time ran out
        self.released = threading.Event()  # ends the streams that hang
        self.expired_hangs = 0  # hanging streams that no reconnection ended
        self.drop_unanswered = None  # (method, path): its connection closes, unanswered
        self.hang_up_after_next = False  # the next answer's connection closes after it
        self.page_jobs = 1000  # rows of a list or history page, as mpi:api:limits:page_jobs

    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], ssl.SSLError):  # expected: an unknown CA
            super().handle_error(request, client_address)

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server_port}{PREFIX}"

    def seen(self, method=None, path=None):
        """The requests so far (``path`` below /api/v1), oldest first."""
        with self.changed:
            return [r for r in self.requests
                    if (method is None or r.method == method)
                    and (path is None or r.path == PREFIX + "/api/v1" + path)]

    def update(self, job_id, output=None, stream="stdout", **fields):
        """Change a job's record and add to its output, as the master would."""
        with self.changed:
            self.jobs[job_id] = dict(self.jobs[job_id], **fields)
            if output:
                self.output[(job_id, stream)] += output.encode()
            self.changed.notify_all()

    def wait_for(self, condition, timeout=CONDITION_TIMEOUT):
        with self.changed:
            return self.changed.wait_for(lambda: condition() or self.released.is_set(),
                                         timeout)

    # --- endpoints: (status, body) or Refused --------------------------------------
    def job(self, job_id):
        if job_id not in self.jobs:
            raise Refused(404, f"no such job: {job_id}")
        return dict(self.jobs[job_id])

    @staticmethod
    def number(query, name, default=None, kind=float):
        text = query.get(name)
        if text in (None, ""):
            return default
        try:
            return kind(text)
        except ValueError:
            raise Refused(400, f"{name} must be a number, got {text!r}") from None

    def answer(self, method, path, query, body):
        found = re.fullmatch(r"/jobs/([\w-]+)(?:/(logs|cancel|wait))?", path)
        job_id, action = found.groups() if found else (None, None)
        routes = {
            ("GET", "/whoami"): lambda: (200, IDENTITY),
            ("GET", "/images"): lambda: (200, {"images": IMAGE_LIST}),
            ("POST", "/jobs"): lambda: self.submit(body),
            ("GET", "/jobs"): lambda: self.job_list(query),
            ("GET", "/history"): lambda: self.history(query),
            ("GET", "/usage"): lambda: (200, {"since": self.number(query, "since"),
                                              "until": self.number(query, "until"),
                                              "slot_hours": 1.5}),
        }
        if job_id:
            routes = {("GET", None): lambda: (200, self.job(job_id)),
                      ("GET", "logs"): lambda: self.logs(job_id, query),
                      ("POST", "cancel"): lambda: self.cancel(job_id),
                      ("GET", "wait"): lambda: self.wait(job_id, query)}
            path = action
        if (method, path) in routes:
            return routes[(method, path)]()
        if any(known == path for _, known in routes):
            raise Refused(405, f"{method} is not allowed here")
        raise Refused(404, f"no such endpoint: {path}")

    def submit(self, raw):
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            raise Refused(400, "the request body is not JSON") from None
        if not isinstance(body, dict):
            raise Refused(400, "the request body must be a JSON object")
        if "mpijob" in body:  # mapped on the master (dmpi.jobs.mpijob); here kept as sent
            self.mpijobs.append(body)
            body = {"image": body.get("image", "mpi"), "np": 2, "cmd": ["/home/mpiuser/pi"]}
        unknown = sorted(set(body) - JOB_FIELDS)
        if unknown:
            raise Refused(400, f"unknown job fields: {', '.join(unknown)}")
        if body.get("image") not in APPROVED_IMAGES:
            raise Refused(400, f"image {body.get('image')!r} is not approved",
                          state="rejected")
        if not isinstance(body.get("np", 1), int) or body.get("np", 1) < 1:
            raise Refused(400, "np must be at least 1", state="rejected")
        if not (isinstance(body.get("cmd"), list) and body["cmd"]
                and all(isinstance(word, str) for word in body["cmd"])):
            raise Refused(400, "cmd must be a list of words", state="rejected")
        with self.changed:
            job_id = self.new_job_ids.pop(0)
            self.jobs[job_id] = record("queued", job_id=job_id, np=body.get("np", 1),
                                       name=body.get("name"), waiting_for="resources",
                                       started=None, placement=None)
            return 201, dict(self.jobs[job_id])

    def job_list(self, query):
        states = (query.get("state") or "queued,running").split(",")
        with self.changed:
            return self.page(query, [dict(r) for r in self.jobs.values()
                                     if r["state"] in states])

    def history(self, query):
        since = self.number(query, "since", float("-inf"))
        until = self.number(query, "until", float("inf"))
        states = query["state"].split(",") if query.get("state") else FINAL
        with self.changed:
            return self.page(query, [dict(r) for r in self.jobs.values()
                                     if r["state"] in states and r.get("ended") is not None
                                     and since <= r["ended"] <= until])

    def page(self, query, rows):
        """The page of ``rows`` that ``limit`` and ``after`` ask for, as the API pages."""
        limit = self.number(query, "limit", self.page_jobs, int)
        if not 1 <= limit <= self.page_jobs:
            raise Refused(400, f"limit must be between 1 and {self.page_jobs} jobs")
        if query.get("after"):
            ids = [row["job_id"] for row in rows]
            rows = rows[ids.index(query["after"]) + 1:]
        return 200, {"jobs": rows[:limit],
                     "next": rows[limit - 1]["job_id"] if len(rows) > limit else None}

    def logs(self, job_id, query):
        self.job(job_id)
        stream = query.get("stream", "stdout")
        if stream not in ("stdout", "stderr"):
            raise Refused(400, f"stream must be stdout or stderr, got {stream!r}")
        tail = self.number(query, "tail", 65536, int)
        if not 1 <= tail <= LOG_BYTES:
            raise Refused(400, f"tail must be between 1 and {LOG_BYTES} bytes "
                               "(mpi:api:limits:log_bytes)")
        data = self.output[(job_id, stream)]
        offset = self.number(query, "offset", None, int)
        if offset is None:
            return 200, {"data": data[-tail:].decode("utf-8", "replace")}
        chunk = data[offset:offset + tail]
        return 200, {"data": chunk.decode(), "offset": offset + len(chunk)}

    def cancel(self, job_id):
        job = self.job(job_id)
        if job["state"] in FINAL:
            return 200, dict(job, note=f"job {job_id} had already ended")
        self.update(job_id, state="cancelled", ended=time.time(), exit_code=None,
                    reason="cancelled by alice")
        return 200, self.job(job_id)

    def wait(self, job_id, query):
        seconds = self.number(query, "timeout", 60)
        if not 0 <= seconds <= 60:
            raise Refused(400, "timeout must be between 0 and 60 seconds "
                               "(mpi:api:limits:wait_seconds); wait again for longer")
        self.job(job_id)
        with self.changed:
            if self.instant_waits:
                self.instant_waits -= 1
                return 200, self.job(job_id)
        self.wait_for(lambda: self.jobs[job_id]["state"] in FINAL, timeout=seconds)
        return 200, self.job(job_id)


class FakeAPIHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # the event stream is sent chunked, as tornado does

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.dispatch("GET")

    def do_POST(self):
        self.dispatch("POST")

    def dispatch(self, method):
        api = self.server
        url = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(url.query, keep_blank_values=True))
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        with api.changed:
            api.requests.append(Seen(method, url.path, query, dict(self.headers), body,
                                     time.monotonic(), self.client_address))
            api.changed.notify_all()
            drop = api.drop_unanswered and (method, url.path) == api.drop_unanswered
            hang_up = api.hang_up_after_next
            api.hang_up_after_next = False
        if drop:
            # The connection breaks before any answer: the client cannot know whether
            # the request was carried out.
            self.close_connection = True
            return
        if not url.path.startswith(PREFIX + "/api/v1/"):
            # What the hub answers for a path that is no service of its: an HTML page.
            return self.send(404, b"<html><body><h1>404 : Not Found</h1></body></html>",
                             "text/html")
        path = url.path[len(PREFIX + "/api/v1"):]
        try:
            self.check_token()
            with api.changed:
                refusal = api.refusals.pop(0) if api.refusals else None
            if refusal:
                status, headers = refusal
                raise Refused(status, f"refused with {status} as the test asked",
                              headers=headers)
            if (method, path) == ("GET", "/events"):
                return self.events(query)
            status, answer = api.answer(method, path, query, body)
        except Refused as refused:
            return self.send(refused.status, json.dumps(refused.body).encode(),
                             headers=refused.headers)
        self.send(status, json.dumps(answer).encode())
        if hang_up:
            # Closed after the answer without saying so, as a server closes a connection
            # that was idle too long: the client learns it on its next request.
            self.close_connection = True

    def check_token(self):
        kind, _, token = self.headers.get("Authorization", "").partition(" ")
        if kind.lower() not in ("token", "bearer") or not token:
            raise Refused(401, "no JupyterHub token: send Authorization: token <token>")
        if token != TOKEN:
            raise Refused(403, "the hub does not accept this token for the dockermpi service")

    def send(self, status, body, content_type="application/json", headers=None):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    # --- the event stream ---------------------------------------------------------
    def events(self, query):
        api = self.server
        job_id = query.get("job")
        if job_id:
            api.job(job_id)
        with api.changed:
            scripted = job_id in api.streams
            script = api.streams[job_id].pop(0) if api.streams.get(job_id) else None
        if scripted and script is None:
            # A client that opens more streams than the test scripted fails fast.
            raise Refused(500, f"the test scripted no more event streams of job {job_id}")
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-store")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            if script is not None:
                self.scripted_stream(script)
            else:
                self.job_stream(job_id)
        except OSError:
            self.close_connection = True  # the client went away

    def chunk(self, data):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def event(self, kind, data):
        self.chunk(f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode())

    def scripted_stream(self, steps):
        """Steps: (kind, data) an event; bytes written as they are; a callable called;
        and last, optionally, how the stream ends: "cut" (no end of the chunked body),
        "reset" (a TCP reset) or "hang" (silent until the next stream or the test's
        end). Without one it ends cleanly, as after an end event."""
        api = self.server
        for step in steps:
            if isinstance(step, tuple):
                self.event(*step)
            elif isinstance(step, bytes):
                self.chunk(step)
            elif callable(step):
                step()
            elif step == "hang":
                streams_before = len(api.seen("GET", "/events"))
                if not api.wait_for(lambda: len(api.seen("GET", "/events")) > streams_before):
                    with api.changed:
                        api.expired_hangs += 1
                self.close_connection = True
                return
            elif step == "cut":
                self.close_connection = True
                return
            elif step == "reset":
                # SO_LINGER 0: closing sends RST, not FIN (the files hold the socket open
                # until they too are closed).
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                           struct.pack("ii", 1, 0))
                self.wfile.close()
                self.rfile.close()
                self.connection.close()
                self.wfile = io.BytesIO()  # what http.server flushes and closes after us
                self.close_connection = True
                return
        self.chunk(b"")

    def job_stream(self, job_id):
        """The stream the contract describes, made from the job as it changes: its state
        when it changes, its output as it grows (from offset 0), its end."""
        api = self.server
        sent = {"stdout": 0, "stderr": 0}
        shown = None
        while True:
            with api.changed:
                job = dict(api.jobs[job_id])
                new = {stream: api.output[(job_id, stream)][sent[stream]:] for stream in sent}
            if job["state"] != shown:
                shown = job["state"]
                self.event("state", job)
            for stream, data in new.items():
                if data:
                    sent[stream] += len(data)
                    self.event("output", {"job_id": job_id, "stream": stream,
                                          "data": data.decode(), "offset": sent[stream]})
            if job["state"] in FINAL:
                self.event("end", job)
                self.chunk(b"")
                return

            def moved():
                return (api.jobs[job_id]["state"] != shown or any(
                    len(api.output[(job_id, stream)]) > sent[stream] for stream in sent))
            if not api.wait_for(moved, timeout=0.2):
                self.chunk(b": keepalive\n\n")
            if api.released.is_set():
                self.close_connection = True
                return


@pytest.fixture
def api(monkeypatch):
    server = FakeAPI()
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    monkeypatch.setenv("DOCKERMPI_API_URL", server.url + "/")
    yield server
    server.released.set()
    with server.changed:
        server.changed.notify_all()
    server.shutdown()
    server.server_close()
    assert server.expired_hangs == 0, "a stream hung until the test gave up on it"


@pytest.fixture
def pauses(monkeypatch):
    """The client's pauses, recorded instead of slept."""
    slept = []
    monkeypatch.setattr(client_module, "pause", slept.append)
    return slept


class Sink(io.StringIO):
    """An output that tests can wait on."""

    def has(self, text):
        return text in self.getvalue()


def running_job(api, job_id=JOB):
    """A job the fake knows (its event stream answers 404 for others), running."""
    api.jobs[job_id] = record("running", job_id=job_id, ended=None, exit_code=None)


def follow(client, job_id=JOB, **kwargs):
    """``client.follow`` writing to sinks: (final record, out, err)."""
    out, err = Sink(), Sink()
    final = client.follow(job_id, poll=0, out=out, err=err, **kwargs)
    return final, out.getvalue(), err.getvalue()


# --- requests ------------------------------------------------------------------------------
def test_calls_share_one_kept_connection(api):
    api.jobs[JOB] = record()
    client = Client()
    client.whoami()
    client.list()
    client.status(JOB)
    assert len({seen.peer for seen in api.seen()}) == 1


def test_a_read_on_a_connection_the_api_closed_is_sent_again_on_a_new_one(api):
    api.jobs[JOB] = record()
    client = Client()
    api.hang_up_after_next = True
    client.whoami()
    assert client.status(JOB)["state"] == "succeeded"
    first, *again = api.seen()
    assert len(again) == 1 and again[0].peer != first.peer


def test_a_submit_starts_on_a_new_connection_and_is_never_sent_twice(api):
    client = Client()
    client.whoami()
    api.drop_unanswered = ("POST", PREFIX + "/api/v1/jobs")
    with pytest.raises(dockermpi.APIUnreachableError, match="cannot reach the DockerMPI API"):
        client.submit(["hostname"], np=2)
    (submitted,) = api.seen("POST", "/jobs")
    assert submitted.peer != api.seen("GET", "/whoami")[0].peer
    api.drop_unanswered = None
    assert client.submit(["hostname"], np=2)["state"] == "queued"
    assert len(api.seen("POST", "/jobs")) == 2


def test_every_call_sends_the_hub_token_and_never_a_user(api):
    api.jobs[JOB] = record()
    client = Client()
    client.whoami()
    client.status(JOB)
    client.submit(["hostname"])
    client.history()
    for seen in api.requests:
        assert seen.headers["Authorization"] == f"token {TOKEN}"
        assert seen.path.startswith(PREFIX + "/api/v1/")
        # The hub says who the caller is: no user in the URL, the query or the body.
        assert "alice" not in (seen.path + json.dumps(seen.query) + seen.body.decode()
                               + json.dumps(seen.headers))
        assert "user" not in seen.query
    assert "user" not in json.loads(api.seen("POST", "/jobs")[0].body)


def test_jupyterhub_user_is_not_needed(api, monkeypatch):
    monkeypatch.delenv("JUPYTERHUB_USER")
    assert Client().whoami() == IDENTITY


def test_submit_posts_the_job_and_leaves_out_unset_fields(api):
    answer = Client().submit("python3 'my script.py' --n 3", np=4, walltime="10m")
    assert answer["job_id"] == JOB and answer["state"] == "queued"
    [seen] = api.seen("POST", "/jobs")
    assert seen.headers["Content-Type"] == "application/json"
    assert json.loads(seen.body) == {"image": "notebook", "np": 4, "walltime": "10m",
                                     "cmd": ["python3", "my script.py", "--n", "3"]}


def test_submit_without_an_image_is_refused_before_any_request(api, monkeypatch):
    monkeypatch.delenv("DOCKERMPI_IMAGE")
    with pytest.raises(dockermpi.DockerMPIError, match="DOCKERMPI_IMAGE is not set"):
        Client().submit("hostname")
    assert api.requests == []


def test_a_list_or_a_history_longer_than_a_page_comes_whole_page_by_page(api):
    api.page_jobs = 1
    for n, job_id in enumerate((JOB, OTHER_JOB, "20261201-114412-000002")):
        api.jobs[job_id] = record("failed", job_id=job_id, ended=2000.0 + n)
    every = [JOB, OTHER_JOB, "20261201-114412-000002"]
    assert [r["job_id"] for r in Client().history()] == every
    assert [r["job_id"] for r in Client().list(state="failed")] == every
    queries = [(r.path[len(PREFIX + "/api/v1"):], r.query) for r in api.requests]
    assert queries == [("/history", {}), ("/history", {"after": JOB}),
                       ("/history", {"after": OTHER_JOB}),
                       ("/jobs", {"state": "failed"}),
                       ("/jobs", {"state": "failed", "after": JOB}),
                       ("/jobs", {"state": "failed", "after": OTHER_JOB})]


def test_calls_map_to_their_endpoints(api):
    api.jobs[JOB] = record("running", ended=None, exit_code=None)
    api.jobs[OTHER_JOB] = record("failed", job_id=OTHER_JOB, exit_code=3, ended=2000.0)
    first_line = "π ≈ 3.14159\n"
    size = len(first_line.encode())  # bytes, not characters: 15, not 12
    api.output[(JOB, "stdout")] = (first_line + "line 2\n").encode()
    api.output[(JOB, "stderr")] = b"warning\n"
    client = Client()
    assert client.images() == IMAGE_LIST
    assert client.status(JOB) == api.jobs[JOB]
    assert [r["job_id"] for r in client.list()] == [JOB]
    assert [r["job_id"] for r in client.list(state="failed")] == [OTHER_JOB]
    assert [r["job_id"] for r in client.list(state=["running", "failed"])] == [JOB, OTHER_JOB]
    assert [r["job_id"] for r in client.history(since=1000, until=3000)] == [OTHER_JOB]
    assert client.history(since=2500, state="failed") == []
    assert client.usage(since=1000.5, until=2000) == {"since": 1000.5, "until": 2000.0,
                                                       "slot_hours": 1.5}
    assert client.logs(JOB) == "π ≈ 3.14159\nline 2\n"
    assert client.logs(JOB, tail=7) == "line 2\n"
    assert client.logs(JOB, stream="stderr") == "warning\n"
    assert client.logs(JOB, offset=0, tail=size) == {"data": first_line, "offset": size}
    assert client.logs(JOB, offset=size) == {"data": "line 2\n", "offset": size + 7}
    queries = [(r.method, r.path[len(PREFIX + "/api/v1"):], r.query) for r in api.requests]
    assert queries == [
        ("GET", "/images", {}),
        ("GET", f"/jobs/{JOB}", {}),
        ("GET", "/jobs", {}),
        ("GET", "/jobs", {"state": "failed"}),
        ("GET", "/jobs", {"state": "running,failed"}),
        ("GET", "/history", {"since": "1000", "until": "3000"}),
        ("GET", "/history", {"since": "2500", "state": "failed"}),
        ("GET", "/usage", {"since": "1000.5", "until": "2000"}),
        ("GET", f"/jobs/{JOB}/logs", {"stream": "stdout"}),
        ("GET", f"/jobs/{JOB}/logs", {"stream": "stdout", "tail": "7"}),
        ("GET", f"/jobs/{JOB}/logs", {"stream": "stderr"}),
        ("GET", f"/jobs/{JOB}/logs", {"stream": "stdout", "tail": str(size), "offset": "0"}),
        ("GET", f"/jobs/{JOB}/logs", {"stream": "stdout", "offset": str(size)}),
    ]


def test_cancel_posts_and_returns_the_record_after_cancel(api):
    api.jobs[JOB] = record("running", ended=None, exit_code=None)
    answer = Client().cancel(JOB)
    assert answer["state"] == "cancelled" and api.jobs[JOB]["state"] == "cancelled"
    [seen] = api.seen("POST", f"/jobs/{JOB}/cancel")
    assert seen.body == b""
    assert "note" in Client().cancel(JOB)


# --- error answers ---------------------------------------------------------------------------
def test_a_rejected_submit_is_a_job_error_carrying_the_answer(api):
    with pytest.raises(dockermpi.JobError) as caught:
        Client().submit("hostname", np=0)
    assert str(caught.value) == "np must be at least 1"
    assert caught.value.result == {"error": "np must be at least 1", "status": 400,
                                   "state": "rejected"}


def test_an_unknown_job_is_a_job_error(api):
    with pytest.raises(dockermpi.JobError) as caught:
        Client().status(JOB)
    assert str(caught.value) == f"no such job: {JOB}"
    assert caught.value.result["status"] == 404


def test_a_bad_argument_is_a_job_error(api):
    api.jobs[JOB] = record()
    with pytest.raises(dockermpi.JobError, match=r"^tail must be between 1 and 1048576 bytes"):
        Client().logs(JOB, tail=LOG_BYTES + 1)


def test_a_token_the_hub_refuses_says_to_restart_the_server(api):
    with pytest.raises(dockermpi.TokenRefusedError) as caught:
        Client(token="forged").whoami()
    assert str(caught.value) == (f"{TOKEN_REFUSED} (the API said: the hub does not accept "
                                 "this token for the dockermpi service)")
    assert api.requests[0].headers["Authorization"] == "token forged"


def test_a_missing_token_answer_is_a_token_refusal_too(api):
    api.refusals = [(401, {})]
    with pytest.raises(dockermpi.TokenRefusedError, match=re.escape(TOKEN_REFUSED)):
        Client().whoami()


@pytest.mark.parametrize("status, reason", [(503, "Service Unavailable"),
                                            (405, "Method Not Allowed"),
                                            (413, "Request Entity Too Large"),
                                            (500, "Internal Server Error")])
def test_other_http_errors_say_the_status_and_the_apis_error(api, status, reason):
    api.refusals = [(status, {})]
    with pytest.raises(dockermpi.APIError) as caught:
        Client().status(JOB)
    assert not isinstance(caught.value, dockermpi.JobError)
    assert str(caught.value) == (f"GET /api/v1/jobs/{JOB}: the DockerMPI API answered HTTP "
                                 f"{status} {reason}: refused with {status} as the test asked")


def test_a_url_that_names_no_service_is_an_api_error_not_a_job_error(api, monkeypatch):
    monkeypatch.setenv("DOCKERMPI_API_URL", f"http://127.0.0.1:{api.server_port}/services/x")
    with pytest.raises(dockermpi.APIError) as caught:
        Client().status(JOB)
    assert not isinstance(caught.value, dockermpi.JobError)
    assert str(caught.value) == (f"GET /api/v1/jobs/{JOB}: the DockerMPI API answered HTTP "
                                 "404 Not Found")


def test_a_closed_port_is_unreachable(monkeypatch):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}/services/dockermpi"
    monkeypatch.setenv("DOCKERMPI_API_URL", url)
    with pytest.raises(dockermpi.APIUnreachableError,
                       match=f"cannot reach the DockerMPI API at {url}: .*refused"):
        Client().whoami()


def test_tls_to_a_plain_http_server_is_unreachable(api, monkeypatch):
    url = f"https://127.0.0.1:{api.server_port}{PREFIX}"
    monkeypatch.setenv("DOCKERMPI_API_URL", url)
    with pytest.raises(dockermpi.APIUnreachableError, match=f"cannot reach .* at {url}: "):
        Client().whoami()


def test_a_missing_ca_file_is_named(api, monkeypatch, tmp_path):
    monkeypatch.setenv("DOCKERMPI_API_URL", f"https://127.0.0.1:{api.server_port}{PREFIX}")
    monkeypatch.setenv("DOCKERMPI_API_CA", str(tmp_path / "nosuch.pem"))
    with pytest.raises(dockermpi.APIUnreachableError,
                       match=f"cannot use DOCKERMPI_API_CA {tmp_path}/nosuch.pem: "):
        Client().whoami()


@pytest.fixture
def https_api(api, tmp_path):
    """The fake API over TLS, with a self-signed certificate for 127.0.0.1; its file."""
    cert_file, key_file = tls.self_signed_files(tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file, key_file)
    # Handshakes happen in the handler threads, so a failed one holds up no other.
    api.socket = context.wrap_socket(api.socket, server_side=True,
                                     do_handshake_on_connect=False)
    return cert_file


def test_https_uses_the_ca_file_and_refuses_an_unknown_certificate(api, https_api,
                                                                   monkeypatch):
    url = f"https://127.0.0.1:{api.server_port}{PREFIX}"
    monkeypatch.setenv("DOCKERMPI_API_URL", url)
    with pytest.raises(dockermpi.APIUnreachableError,
                       match=f"cannot reach the DockerMPI API at {url}: .*CERTIFICATE_VERIFY"):
        Client().whoami()  # the system CAs do not know the test's certificate
    monkeypatch.setenv("DOCKERMPI_API_CA", str(https_api))
    assert Client().whoami() == IDENTITY


def test_missing_configuration_is_named(monkeypatch):
    monkeypatch.delenv("JUPYTERHUB_USER")
    monkeypatch.delenv("JUPYTERHUB_API_TOKEN")
    monkeypatch.delenv("DOCKERMPI_API_URL")
    with pytest.raises(dockermpi.DockerMPIError,
                       match="DOCKERMPI_API_URL, JUPYTERHUB_API_TOKEN not set"):
        Client()


# --- rate limits ---------------------------------------------------------------------------
def test_a_rate_limit_is_waited_out_then_the_call_is_retried(api):
    api.refusals = [(429, {"Retry-After": "1"})]
    assert Client().whoami() == IDENTITY
    first, second = api.seen("GET", "/whoami")
    assert second.at - first.at >= 1.0


def test_retry_after_is_capped_and_five_retries_in_a_row_succeed(api, pauses):
    api.refusals = [(429, {"Retry-After": "3600"})] + [(429, {"Retry-After": "2"})] * 3 + \
        [(429, {})]
    assert Client().whoami() == IDENTITY
    assert pauses == [30, 2, 2, 2, 1]
    assert len(api.seen("GET", "/whoami")) == 6


def test_a_sixth_rate_limit_in_a_row_is_an_api_error_naming_it(api, pauses):
    api.refusals = [(429, {"Retry-After": "2"})] * 6 + [(200, {})]
    with pytest.raises(dockermpi.APIError) as caught:
        Client().whoami()
    assert isinstance(caught.value, client_module.RateLimitedError)
    assert str(caught.value) == (
        "GET /api/v1/whoami: the DockerMPI API's rate limit refused 6 requests in a row "
        "(HTTP 429); try again later, or make fewer calls")
    assert pauses == [2] * 5
    assert len(api.requests) == 6


# --- wait --------------------------------------------------------------------------------
def test_wait_asks_a_minute_at_a_time_until_the_job_has_ended(api):
    api.jobs[JOB] = record("running", ended=None, exit_code=None)
    api.instant_waits = 2  # two minutes go by with the job still running

    def end_on_the_third_wait():
        wait_until(lambda: len(api.seen("GET", f"/jobs/{JOB}/wait")) == 3, "the third wait")
        api.update(JOB, state="succeeded", exit_code=0)
    ender = threading.Thread(target=end_on_the_third_wait, daemon=True)
    ender.start()
    assert Client().wait(JOB)["state"] == "succeeded"
    ender.join()
    assert [r.query for r in api.seen("GET", f"/jobs/{JOB}/wait")] == [{"timeout": "60"}] * 3


def test_wait_returns_the_record_when_its_time_is_up(api):
    api.jobs[JOB] = record("running", ended=None, exit_code=None)
    started = time.monotonic()
    assert Client().wait(JOB, timeout=0.3)["state"] == "running"
    assert time.monotonic() - started >= 0.3
    asked = [float(r.query["timeout"]) for r in api.seen("GET", f"/jobs/{JOB}/wait")]
    assert asked and all(0 <= seconds <= 0.3 for seconds in asked)
    assert Client().wait(JOB, timeout=0)["state"] == "running"
    assert api.seen("GET", f"/jobs/{JOB}/wait")[-1].query == {"timeout": "0"}


# --- the event stream --------------------------------------------------------------------
def test_run_shows_states_and_output_as_they_come_and_returns_the_end_record(api):
    final = record("succeeded")
    api.streams[JOB] = [[
        state_event("queued", waiting_for="resources", queue_place=3),
        b": keepalive\n\n",
        state_event("running"),
        *output_events("stdout", "rank 0: π ≈ 3.14\n", "rank 1\n"),
        *output_events("stderr", "warning ✓\n"),
        state_event("succeeded"),
        ("end", final),
    ]]
    out, err = Sink(), Sink()
    answer = Client().run(["python3", "pi.py"], np=6, poll=0, out=out, err=err)
    assert answer == final
    assert out.getvalue() == "rank 0: π ≈ 3.14\nrank 1\n"
    assert err.getvalue().splitlines() == [
        f"mpi: job {JOB} queued (resources)",  # as submit answered
        f"mpi: job {JOB} queued (resources; place 3 in the queue)",
        f"mpi: job {JOB} running",
        "warning ✓",
        f"mpi: job {JOB} succeeded",
        render.outcome_line(final),
    ]
    [stream] = api.seen("GET", "/events")
    assert stream.query == {"job": JOB}
    assert stream.headers["Accept"] == "text/event-stream"
    assert stream.headers["Authorization"] == f"token {TOKEN}"


def test_follow_reads_the_contracts_stream_as_the_job_changes(api):
    """The fake's own stream (no script), driven as the master would drive a job, one
    change at a time once the client has shown the one before."""
    api.jobs[JOB] = record("queued", waiting_for="resources", ended=None, exit_code=None)
    out, err = Sink(), Sink()

    def drive():
        wait_until(lambda: err.has("queued"), "the client shows the job queued")
        for change, shown in (({"state": "running", "waiting_for": None}, "running"),
                              ({"output": "step 1\n"}, "step 1\n"),
                              ({"output": "oops\n", "stream": "stderr"}, "oops\n"),
                              ({"output": "step 2 ✓\n"}, "step 2 ✓\n")):
            api.update(JOB, **change)
            wait_until(lambda: out.has(shown) or err.has(shown), f"the client shows {shown}")
        api.update(JOB, state="failed", exit_code=3, reason="rank 0 exited 3")
    driver = threading.Thread(target=drive, daemon=True)
    driver.start()
    final = Client().follow(JOB, poll=0, out=out, err=err)
    driver.join()
    assert final["state"] == "failed" and final["exit_code"] == 3
    assert out.getvalue() == "step 1\nstep 2 ✓\n"
    assert err.getvalue().splitlines() == [f"mpi: job {JOB} queued (resources)",
                                           f"mpi: job {JOB} running", "oops",
                                           f"mpi: job {JOB} failed (rank 0 exited 3)"]


@pytest.mark.parametrize("ending", ["cut", "reset"])
def test_a_broken_stream_is_reopened_without_repeating_or_losing_output(api, ending):
    running_job(api)
    client = Client()
    out, err = Sink(), Sink()
    api.streams[JOB] = [
        [state_event("running"),
         *output_events("stdout", "π = 3.14\n", "rank 1\n"),
         *output_events("stderr", "warn 1\n"),
         # Break only once the client has written it all, so resuming is what's tested.
         lambda: wait_until(lambda: out.has("rank 1\n") and err.has("warn 1\n"),
                            "the client wrote the first stream's output"),
         b'event: output\ndata: {"job_id": "' + JOB.encode() + b'", "stream": "std',
         ending],
        # Output from offset 0 again, cut differently: one event all old, one half old.
        [state_event("running"),
         *output_events("stdout", "π = 3.14\nra", "nk 1\nrank 2\n"),
         *output_events("stderr", "warn 1\nwarn 2\n"),
         state_event("succeeded"),
         end_event()],
    ]
    final = client.follow(JOB, poll=0, out=out, err=err)
    assert final == record("succeeded")
    assert out.getvalue() == "π = 3.14\nrank 1\nrank 2\n"
    assert err.getvalue() == (f"mpi: job {JOB} running\nwarn 1\nwarn 2\n"
                              f"mpi: job {JOB} succeeded\n")
    assert len(api.seen("GET", "/events")) == 2


def test_a_stream_closed_before_the_jobs_end_is_reopened(api):
    running_job(api)
    api.streams[JOB] = [
        # The stream ends cleanly in the middle of an event: an event is only whole at
        # its blank line, so this one is dropped (its data would show if it were not).
        [state_event("running"), *output_events("stdout", "one\n"),
         b'event: output\ndata: {"job_id": "' + JOB.encode() +
         b'", "stream": "stdout", "data": "cut off\\n", "offset": 12}\n'],
        [state_event("running"), *output_events("stdout", "one\n", "two\n"), end_event()],
    ]
    final, out, _ = follow(Client())
    assert final == record("succeeded") and out == "one\ntwo\n"
    assert len(api.seen("GET", "/events")) == 2


def test_a_silent_stream_is_reopened_after_the_idle_timeout(api):
    running_job(api)
    client = Client()
    client.stream_idle_timeout = 0.5
    api.streams[JOB] = [
        [state_event("running"), *output_events("stdout", "rank 0\n"), "hang"],
        [state_event("running"), *output_events("stdout", "rank 0\n", "rank 1\n"),
         end_event()],
    ]
    started = time.monotonic()
    final, out, _ = follow(client)
    assert time.monotonic() - started >= 0.5
    assert final == record("succeeded") and out == "rank 0\nrank 1\n"
    assert len(api.seen("GET", "/events")) == 2


def test_keepalives_keep_a_quiet_stream_open_and_are_no_events(api):
    running_job(api)
    client = Client()
    client.stream_idle_timeout = 0.6
    # The stream stays quiet but for keepalives, in all longer than the idle timeout:
    # the silence between them is the point of the test.
    quiet = [lambda: api.released.wait(0.2), b": keepalive\n\n"] * 6
    api.streams[JOB] = [[
        state_event("running"),
        *quiet,
        # A comment may come between an event's lines; it neither ends nor spoils it.
        b'event: output\n: keepalive\ndata: {"job_id": "' + JOB.encode() +
        b'", "stream": "stdout", "data": "late\\n", "offset": 5}\n\n',
        end_event(),
    ]]
    final, out, err = follow(client)
    assert final == record("succeeded") and out == "late\n"
    assert err == f"mpi: job {JOB} running\nmpi: job {JOB} succeeded\n"
    assert len(api.seen("GET", "/events")) == 1


def test_a_stream_that_cannot_be_reopened_gives_up_after_five_tries(api, pauses):
    api.refusals = [(503, {})] * 6
    with pytest.raises(dockermpi.APIError) as caught:
        follow(Client())
    assert str(caught.value) == (
        f"cannot follow job {JOB}: its event stream failed 6 times in a row: GET "
        "/api/v1/events: the DockerMPI API answered HTTP 503 Service Unavailable: refused "
        "with 503 as the test asked")
    assert len(api.seen("GET", "/events")) == 6 and pauses == [0] * 5


def test_a_stream_rate_limit_is_waited_out(api, pauses):
    running_job(api)
    api.refusals = [(429, {"Retry-After": "5"})]
    api.streams[JOB] = [[state_event("running"), end_event()]]
    assert follow(Client())[0] == record("succeeded")
    assert pauses == [5]


def test_a_stream_refused_by_the_rate_limit_for_too_long_is_not_reopened(api, pauses):
    running_job(api)
    api.refusals = [(429, {"Retry-After": "5"})] * 6
    api.streams[JOB] = [[state_event("running"), end_event()]]
    with pytest.raises(client_module.RateLimitedError, match="rate limit refused 6 requests"):
        follow(Client())
    assert pauses == [5] * 5 and len(api.seen("GET", "/events")) == 6


@pytest.mark.parametrize("token, error", [
    (TOKEN, dockermpi.JobError), ("forged", dockermpi.TokenRefusedError)],
    ids=["unknown job", "refused token"])
def test_following_is_not_retried_when_the_api_refuses(api, token, error):
    with pytest.raises(error):
        follow(Client(token=token))
    assert len(api.seen("GET", "/events")) == 1


def test_interrupting_run_cancels_the_job(api, ctrl_c):
    err = Sink()

    def interrupt():
        wait_until(lambda: err.has(f"mpi: job {JOB} running"), "the client shows running")
        ctrl_c()  # while the client reads the stream
    api.streams[JOB] = [[state_event("running"), interrupt, "hang"]]
    with pytest.raises(KeyboardInterrupt):
        Client().run("sleep 100", poll=0, out=Sink(), err=err)
    assert len(api.seen("POST", f"/jobs/{JOB}/cancel")) == 1
    assert api.jobs[JOB]["state"] == "cancelled"
    assert err.getvalue().splitlines()[-2:] == [f"mpi: interrupted: cancelling job {JOB}",
                                                f"mpi: job {JOB} cancelled"]


class CellDisplays:
    """IPython's display() in a kernel's cell, recorded: each display's bundles in order."""

    def __init__(self):
        self.shown = []

    def display(self, bundle, raw=False, display_id=False):
        history = [bundle]
        self.shown.append(history)
        return types.SimpleNamespace(update=lambda new, raw=False: history.append(new))


@pytest.fixture
def in_a_cell(monkeypatch):
    """``Client.run`` as cell 3 of /data/work/a.ipynb runs it in a Jupyter kernel."""
    import IPython.display
    shown = CellDisplays()
    monkeypatch.setattr(IPython.display, "display", shown.display)
    monkeypatch.setattr(client_module, "jupyter_shell",
                        lambda: types.SimpleNamespace(execution_count=4))
    monkeypatch.setattr(client_module, "kernel_id", lambda: "0b5f3a52-8f3e-4f4a-9b1e-2f6d7c8a9e10")
    monkeypatch.setenv("JPY_SESSION_NAME", "/data/work/a.ipynb")
    return shown


def test_run_in_a_cell_shows_the_job_there_and_notes_the_cell(api, in_a_cell, capsys):
    final = record("failed", exit_code=3, explanation="rank 1 exited with code 3",
                   failure={"rank": 1, "exit_code": 3})
    api.streams[JOB] = [[
        state_event("queued", waiting_for="resources", queue_place=2),
        state_event("running", ended=None),
        *output_events("stdout", "rank 0 here\n"),
        *output_events("stderr", "Traceback ...\n"),
        ("end", final),
    ]]
    assert Client().run(["python3", "pi.py"], np=6, poll=0) == final
    sent = json.loads(api.seen("POST", "/jobs")[0].body)
    assert sent["origin"] == {"notebook": "/data/work/a.ipynb", "cell": 3}
    head, body = in_a_cell.shown
    said = [bundle["text/plain"] for bundle in head]
    assert any("queued (resources; place 2 in the queue)" in line for line in said), said
    running = [b for b in head if "running on node1:2,node2:2,node3:2" in b["text/plain"]]
    assert running and "Cancel job" in running[-1]["text/html"], said
    assert head[-1]["text/plain"] == render.progress_line(final, None)
    assert "Cancel job" not in head[-1]["text/html"]
    assert body[-1]["text/plain"] == "rank 0 here\nTraceback ..."
    assert capsys.readouterr() == ("", "")  # the cell shows the view alone


def test_interrupting_run_in_a_cell_cancels_the_job_and_says_so(api, in_a_cell, ctrl_c):
    def interrupt():
        wait_until(lambda: len(in_a_cell.shown) == 2 and "running" in
                   in_a_cell.shown[0][-1]["text/plain"], "the cell shows running")
        ctrl_c()
    api.streams[JOB] = [[state_event("running", ended=None), interrupt, "hang"]]
    with pytest.raises(KeyboardInterrupt):
        Client().run("sleep 100", poll=0)
    assert api.jobs[JOB]["state"] == "cancelled"
    said = [bundle["text/plain"] for bundle in in_a_cell.shown[0]]
    assert f"mpi: interrupted: cancelling job {JOB}" in said
    assert said[-1].startswith(f"mpi: job {JOB} cancelled")


def test_mpi_run_on_a_cells_line_fails_the_cell_as_the_job_failed(api, capsys):
    from IPython.core.interactiveshell import InteractiveShell

    from dockermpi import magic
    shell = InteractiveShell.instance()
    try:
        shell.run_line_magic("load_ext", "dockermpi")
        api.streams[JOB] = [[state_event("running"), *output_events("stdout", "hello\n"),
                             end_event("failed", exit_code=7)]]
        with pytest.raises(magic.CellJobFailed, match="mpi run: exit status 7"):
            shell.run_line_magic("mpi", "run -n 2 ./a.out")
        assert capsys.readouterr().out == "hello\n"
        assert json.loads(api.seen("POST", "/jobs")[0].body)["cmd"] == ["./a.out"]
    finally:
        InteractiveShell.clear_instance()


# --- the mpi command -----------------------------------------------------------------------
def test_mpi_without_configuration_prints_one_clear_line(monkeypatch, capsys):
    monkeypatch.delenv("DOCKERMPI_API_URL")
    assert cli.main(["whoami"]) == 1
    assert capsys.readouterr().err == (
        "mpi: DockerMPI is not configured here: DOCKERMPI_API_URL not set (the hub sets them "
        "in the servers it starts; outside one, set them yourself)\n")


def test_a_rejected_submit_prints_the_error_and_fails(api, capsys):
    assert cli.main(["submit", "--image", "x", "hostname"]) == 1
    assert capsys.readouterr().err == "mpi: image 'x' is not approved\n"
    assert cli.main(["submit", "--json", "-n", "0", "hostname"]) == 1
    assert json.loads(capsys.readouterr().out) == {"error": "np must be at least 1",
                                                   "status": 400, "state": "rejected"}


def test_mpi_submit_prints_the_job_id(api, capsys):
    assert cli.main(["submit", "-n", "2", "hostname"]) == 0
    assert capsys.readouterr().out == f"submitted job {JOB} (queued)\n"
    assert cli.main(["submit", "--parsable", "-n", "2", "hostname"]) == 0
    printed = capsys.readouterr().out
    assert printed.endswith("\n") and printed[:-1] in api.jobs and printed[:-1] != JOB


def test_mpi_run_follows_the_job_and_exits_with_its_code(api, capsys):
    api.streams[JOB] = [[state_event("running"), *output_events("stdout", "hello\n"),
                         end_event("failed", exit_code=7)]]
    assert cli.main(["run", "-n", "2", "./a.out"]) == 7
    captured = capsys.readouterr()
    assert captured.out == "hello\n"
    assert captured.err.splitlines()[-1] == render.outcome_line(record("failed", exit_code=7))


def test_mpi_run_interrupted_cancels_the_job_and_exits_130(api, capsys, ctrl_c):
    def interrupt():
        wait_until(lambda: api.seen("GET", "/events"), "the client opens the stream")
        ctrl_c()
    api.streams[JOB] = [[state_event("running"), interrupt, "hang"]]
    assert cli.main(["run", "sleep", "100"]) == cli.INTERRUPTED
    assert api.jobs[JOB]["state"] == "cancelled"
    assert capsys.readouterr().err.splitlines()[-1] == f"mpi: job {JOB} cancelled"


def test_mpi_logs_follow_prints_one_stream_and_the_states_apart(api, capsys):
    api.jobs[JOB] = record("running", ended=None, exit_code=None)
    api.streams[JOB] = [[state_event("running"),
                         *output_events("stdout", "out\n"),
                         *output_events("stderr", "err 1\n", "err 2\n"),
                         end_event()]]
    assert cli.main(["logs", "-f", "--stderr", JOB]) == 0
    captured = capsys.readouterr()
    assert captured.out == "err 1\nerr 2\n"
    assert captured.err == f"mpi: job {JOB} running\nmpi: job {JOB} succeeded\n"


def test_mpi_logs_prints_the_end_of_the_output(api, capsys):
    api.jobs[JOB] = record()
    api.output[(JOB, "stdout")] = b"hello\nworld\n"
    assert cli.main(["logs", JOB]) == 0
    assert capsys.readouterr().out == "hello\nworld\n"
    assert api.seen("GET", f"/jobs/{JOB}/logs")[0].query == {"stream": "stdout"}


def test_mpi_wait_prints_the_outcome_and_exits_with_the_jobs_code(api, capsys):
    api.jobs[JOB] = record("failed", exit_code=3, reason="rank 0 exited 3")
    assert cli.main(["wait", JOB]) == 3
    assert capsys.readouterr().out == render.outcome_line(api.jobs[JOB]) + "\n"


def test_mpi_submit_mpijob_sends_the_manifest_as_written(api, capsys, tmp_path):
    manifest = tmp_path / "pi.yaml"
    manifest.write_text("apiVersion: kubeflow.org/v2beta1\nkind: MPIJob\n")
    assert cli.main(["submit", "--mpijob", str(manifest), "--image", "mpi"]) == 0
    assert capsys.readouterr().out == f"submitted job {JOB} (queued)\n"
    assert api.mpijobs == [{"mpijob": manifest.read_text(), "image": "mpi"}]
    assert cli.main(["submit", "--mpijob", str(manifest), "-n", "4", "hostname"]) == 1
    assert capsys.readouterr().err == ("mpi: --mpijob takes its job from the manifest: "
                                       "leave out -n, a program\n")
    assert cli.main(["submit", "--mpijob", str(tmp_path / "none.yaml")]) == 1
    assert capsys.readouterr().err.startswith("mpi: cannot read ")
    assert len(api.mpijobs) == 1


def test_mpi_images_says_which_images_run_jobs_and_why_not(api, capsys):
    assert cli.main(["images"]) == 0
    assert [line.rstrip() for line in capsys.readouterr().out.splitlines()] == [
        "IMAGE     JOBS      MPI (OR WHY NOT)" + " " * 89 + "PYTHON                OS",
        "mpi       yes       Open MPI 4.1.4 (/usr/bin/mpirun), mpi4py 3.1.4" + " " * 59
        + "3.11.2, mpi4py 3.1.4  Debian GNU/Linux 12 (bookworm)",
        "notebook  no        it has no MPI launcher (mpirun or mpiexec) on its PATH" + " " * 51
        + "3.11.2                Debian GNU/Linux 12 (bookworm)",
        "mpich     one node  MPICH 4.0.2 (/usr/bin/mpirun); its MPICH 4.0.2 (ch4:ucx) can hang "
        "in MPI_Finalize when ranks span nodes  3.11.2                Debian GNU/Linux 12 "
        "(bookworm)"]
    assert cli.main(["images", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == IMAGE_LIST


def test_mpi_status_of_an_unknown_job_says_so(api, capsys):
    assert cli.main(["status", JOB]) == 1
    assert capsys.readouterr().err == f"mpi: no such job: {JOB}\n"
