"""Unit tests of the notebook server's DockerMPI extension (images/notebook/dockermpi/server.py):
the side panel's calls reach the user API with the server's token and nothing of the
browser's, only the calls the panel needs get through, and every tab shares one event
stream of the API.

A real jupyter_server (``ServerApp`` in a subprocess, with the Jupyter token ``TOKEN`` and
a JupyterHub user's base URL) loads the extension through the config file the notebook
image ships (images/notebook/jupyter-config), and forwards to a real HTTPS server playing
the API (``FakeAPI``, threads of the test process; its certificate is the server's
``DOCKERMPI_API_CA``), which records every request that reaches it. The extension's
timers are shortened in the server process (``LAUNCHER``): lingering, keepalives, idle
detection and backoff take a second or two, not a minute."""

import http.client
import http.server
import json
import os
import pathlib
import queue
import select
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse

import pytest

from tests.cluster import tls

REPO = pathlib.Path(__file__).resolve().parents[2]
NOTEBOOK = REPO / "images" / "notebook"
TOKEN = "jupyter-token-of-the-browser"  # what the browser authenticates with here
HUB_TOKEN = "0123abcd-the-servers-hub-token"  # JUPYTERHUB_API_TOKEN of the server
PREFIX = "/services/dockermpi"
BASE_URL = "/user/alice/"
API = "dockermpi/api/v1/"
JOB = "20261201-114410-dbd5d6"
ENDING_JOB = "20261201-114411-000001"  # its stream ends, as a finished job's does
UNKNOWN_JOB = "20261201-114412-00000f"
IDENTITY = {"user": "alice", "account": "alice", "uid": 20001, "gid": 20001,
            "dir": "/srv/dockermpi/users/alice", "dir_in_job": "/data"}
CONDITION_TIMEOUT = 60  # seconds a test waits for a condition (CI is loaded)
UPSTREAM_KEEPALIVE = 0.2  # seconds between the fake's keepalives
MAX_BEHIND = 100  # events a tab may be behind, in the server (LAUNCHER)
LAUNCHER = f"""
import sys
from dockermpi import server
server.KEEPALIVE_SECONDS = 1
server.LINGER_SECONDS = 0.5
server.IDLE_SECONDS = 5
server.BACKOFF_FIRST = 0.2
server.MAX_BEHIND = {MAX_BEHIND}
from jupyter_server.serverapp import main
sys.exit(main())
"""


def wait_until(condition, what):
    """Wait (on the condition, not a fixed time) until ``condition()`` is true."""
    deadline = time.monotonic() + CONDITION_TIMEOUT
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.01)


def record(job_id=JOB, state="running"):
    return {"job_id": job_id, "name": "pi", "user": "alice", "state": state, "np": 6}


def sse(kind, data):
    return f"event: {kind}\ndata: {json.dumps(data)}".encode()


# --- the fake API ------------------------------------------------------------------------
class FakeAPI(http.server.ThreadingHTTPServer):
    """The DockerMPI user API v1 behind the hub's /services/dockermpi, over TLS.

    ``requests`` are all requests that reached it; ``answers[(method, path)]`` the next
    answers (status, headers, body) given there; ``stream_refusals`` the answers to the
    next openings of the all-jobs stream. Each open all-jobs stream sends what
    ``publish`` gives it, a keepalive every UPSTREAM_KEEPALIVE seconds otherwise."""

    daemon_threads = True

    def __init__(self, cert_file, key_file):
        super().__init__(("127.0.0.1", 0), FakeAPIHandler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert_file, key_file)
        # Handshakes happen in the handler threads, so a failed one holds up no other.
        self.socket = context.wrap_socket(self.socket, server_side=True,
                                          do_handshake_on_connect=False)
        self.changed = threading.Condition()
        self.requests = []
        self.answers = {}
        self.stream_refusals = []
        self.outboxes = []  # one per open all-jobs stream
        self.job_streams_open = 0
        self.released = threading.Event()

    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], (ssl.SSLError, ConnectionError)):
            super().handle_error(request, client_address)

    @property
    def url(self):
        return f"https://127.0.0.1:{self.server_port}{PREFIX}"

    def reset(self):
        with self.changed:
            self.requests.clear()
            self.answers.clear()
            self.stream_refusals.clear()

    def seen(self, path=None):
        """The requests so far (to ``path`` below /api/v1/, if given), oldest first."""
        with self.changed:
            return [r for r in self.requests if path is None or r["path"] == path]

    def open_streams(self):
        with self.changed:
            return len(self.outboxes)

    def publish(self, data):
        """Send ``data`` (bytes) on every open all-jobs stream."""
        with self.changed:
            for outbox in self.outboxes:
                outbox.put(data)


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
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        path = url.path[len(PREFIX + "/api/v1/"):] if url.path.startswith(
            PREFIX + "/api/v1/") else None
        with api.changed:
            api.requests.append({"method": method, "path": path, "target": self.path,
                                 "query": urllib.parse.parse_qs(url.query),
                                 "headers": dict(self.headers), "body": body,
                                 "at": time.monotonic()})
            api.changed.notify_all()
            answers = api.answers.get((method, path))
            answer = answers.pop(0) if answers else None
        if path is None:
            return self.send(404, b"<html><body><h1>404 : Not Found</h1></body></html>",
                             "text/html")
        if self.headers.get("Authorization") != f"token {HUB_TOKEN}":
            return self.send_json(403, {"error": "the hub does not accept this token",
                                        "status": 403})
        if answer is not None:
            status, headers, content = answer
            return self.send(status, content, headers.pop("Content-Type", "application/json"),
                             headers)
        query = urllib.parse.parse_qs(url.query)
        if (method, path) == ("GET", "events"):
            return self.job_stream(query["job"][0]) if "job" in query else self.all_jobs()
        if (method, path) == ("GET", "whoami"):
            return self.send_json(200, IDENTITY)
        if (method, path) == ("GET", "jobs"):
            return self.send_json(200, {"jobs": [record()]})
        if (method, path) == ("POST", "jobs"):
            return self.send_json(201, dict(record(state="queued"), sent=json.loads(body)))
        return self.send_json(404, {"error": f"no such endpoint: {path}", "status": 404})

    def send(self, status, body, content_type, headers=None):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def send_json(self, status, body):
        self.send(status, json.dumps(body).encode(), "application/json")

    def start_stream(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def chunk(self, data):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def all_jobs(self):
        api = self.server
        with api.changed:
            refusal = api.stream_refusals.pop(0) if api.stream_refusals else None
        if refusal:
            status, headers = refusal
            return self.send(status, json.dumps({"error": "refused as the test asked",
                                                 "status": status}).encode(),
                             "application/json", headers)
        self.start_stream()
        outbox = queue.Queue()
        with api.changed:
            api.outboxes.append(outbox)
            api.changed.notify_all()
        between_events = True  # a keepalive never goes into the middle of an event
        try:
            while not api.released.is_set():
                try:
                    data = outbox.get(timeout=UPSTREAM_KEEPALIVE)
                except queue.Empty:
                    if not between_events:
                        continue
                    data = b": keepalive\n\n"
                if data == "silence":
                    self.wait_for_hang_up()
                    break
                self.chunk(data)
                between_events = data.endswith((b"\n\n", b"\r\n\r\n"))
        except OSError:
            pass  # the extension hung up
        finally:
            with api.changed:
                api.outboxes.remove(outbox)
                api.changed.notify_all()
        self.close_connection = True

    def wait_for_hang_up(self):
        """Send nothing (a broken stream) until the other side closes the connection."""
        while not self.server.released.is_set():
            readable, _, _ = select.select([self.connection], [], [], 0.2)
            if readable:
                try:
                    if not self.connection.recv(1):
                        return
                except (OSError, ValueError):
                    return

    def job_stream(self, job_id):
        api = self.server
        if job_id not in (JOB, ENDING_JOB):
            return self.send_json(404, {"error": f"no such job: {job_id}", "status": 404})
        self.start_stream()
        self.chunk(sse("state", record(job_id)) + b"\n\n")
        if job_id == ENDING_JOB:
            self.chunk(sse("output", {"job_id": job_id, "stream": "stdout", "data": "pi\n",
                                      "offset": 3}) + b"\n\n")
            self.chunk(sse("end", record(job_id, "succeeded")) + b"\n\n")
            self.chunk(b"")
            return
        with api.changed:
            api.job_streams_open += 1
            api.changed.notify_all()
        try:
            while not api.released.wait(UPSTREAM_KEEPALIVE):
                self.chunk(b": keepalive\n\n")
        except OSError:
            pass  # the extension hung up
        finally:
            with api.changed:
                api.job_streams_open -= 1
                api.changed.notify_all()
        self.close_connection = True


# --- the notebook server -----------------------------------------------------------------
def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class NotebookServer:
    """A jupyter_server with the extension, started in a subprocess, as a user's server."""

    def __init__(self, directory, environ):
        self.port = free_port()
        self.log_file = directory / "server.log"
        directory.mkdir(parents=True, exist_ok=True)
        env = {name: value for name, value in os.environ.items()
               if not name.startswith(("JUPYTER", "DOCKERMPI_"))}
        env.update(PYTHONPATH=str(NOTEBOOK), JUPYTER_CONFIG_DIR=str(directory / "config"),
                   JUPYTER_CONFIG_PATH=str(NOTEBOOK / "jupyter-config"),
                   JUPYTER_DATA_DIR=str(directory / "data"),
                   JUPYTER_RUNTIME_DIR=str(directory / "runtime"), JUPYTERHUB_USER="alice",
                   **environ)
        with open(self.log_file, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-c", LAUNCHER, f"--ServerApp.port={self.port}",
                 "--ServerApp.port_retries=0", "--ServerApp.ip=127.0.0.1",
                 "--ServerApp.open_browser=False", "--ServerApp.allow_root=True",
                 f"--ServerApp.base_url={BASE_URL}",
                 f"--IdentityProvider.token={TOKEN}", f"--ServerApp.root_dir={directory}"],
                env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        self._ready = False

    def log(self):
        return self.log_file.read_text(errors="replace")

    def ready(self):
        """Wait until the server answers (at most once)."""
        if self._ready:
            return self

        def answering():
            assert self.process.poll() is None, f"the server exited:\n{self.log()}"
            try:
                return self.request("GET", "dockermpi/settings")[0] == 200
            except OSError:
                return False
        wait_until(answering, "the notebook server answers")
        self._ready = True
        return self

    def stop(self):
        self.process.terminate()
        try:
            self.process.wait(CONDITION_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def request(self, method, path, body=None, headers=None, auth=True):
        """(status, headers, body as JSON where it is JSON) of one request to the server,
        ``path`` below its base URL."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port,
                                                timeout=CONDITION_TIMEOUT)
        headers = dict(headers or {})
        if auth:
            headers.setdefault("Authorization", f"token {TOKEN}")
        try:
            connection.request(method, BASE_URL + path, body=body, headers=headers)
            response = connection.getresponse()
            content = response.read()
        finally:
            connection.close()
        if response.getheader("Content-Type", "").startswith("application/json"):
            content = json.loads(content)
        return response.status, response.headers, content


class Tab:
    """A browser tab following an event stream of the server; unless ``reading`` is
    False, a thread reads it as it comes."""

    def __init__(self, server, query="", reading=True, receive_buffer=None):
        sock = socket.socket()
        if receive_buffer:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        sock.settimeout(CONDITION_TIMEOUT)
        sock.connect(("127.0.0.1", server.port))
        self.connection = http.client.HTTPConnection("127.0.0.1", server.port)
        self.connection.sock = sock
        self.connection.request("GET", f"{BASE_URL}{API}events{query}",
                                headers={"Authorization": f"token {TOKEN}"})
        self.response = self.connection.getresponse()
        self.lock = threading.Lock()
        self.events, self.keepalives, self.ended = [], 0, False
        self.reader = threading.Thread(target=self.read, daemon=True)
        if reading:
            self.reader.start()

    def read(self):
        """Read the stream to its end, cutting it into events and keepalives."""
        partial = b""
        try:
            while True:
                data = self.response.read1(65536)
                if not data:
                    break
                *blocks, partial = (partial + data).split(b"\n\n")
                with self.lock:
                    for block in blocks:
                        if block == b": keepalive":
                            self.keepalives += 1
                        else:
                            self.events.append(block)
        except (OSError, http.client.HTTPException):
            pass
        finally:
            self.ended = True

    def count(self):
        with self.lock:
            return len(self.events)

    def close(self):
        """Leave, as a closed tab does."""
        try:
            self.connection.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.connection.sock.close()
        if self.reader.is_alive():
            self.reader.join(CONDITION_TIMEOUT)


# --- fixtures ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    return tls.self_signed_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def api(certificate):
    server = FakeAPI(*certificate)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server
    server.released.set()
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def servers(api, certificate, tmp_path_factory):
    """The notebook servers, started at once (each takes seconds): one configured to
    reach the fake API, one whose API is down, one not configured at all."""
    root = tmp_path_factory.mktemp("servers")
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        down_port = closed.getsockname()[1]
    started = {
        "configured": NotebookServer(root / "configured", {
            "DOCKERMPI_API_URL": api.url + "/", "DOCKERMPI_API_CA": str(certificate[0]),
            "JUPYTERHUB_API_TOKEN": HUB_TOKEN, "DOCKERMPI_REFRESH_SECONDS": "12"}),
        "down": NotebookServer(root / "down", {
            "DOCKERMPI_API_URL": f"https://127.0.0.1:{down_port}{PREFIX}",
            "JUPYTERHUB_API_TOKEN": HUB_TOKEN}),
        "unconfigured": NotebookServer(root / "unconfigured", {
            "DOCKERMPI_REFRESH_SECONDS": "2"}),
    }
    yield started
    for server in started.values():
        server.stop()
    for name, server in started.items():
        assert "Traceback" not in server.log(), f"the {name} server failed:\n{server.log()}"


@pytest.fixture
def server(servers, api):
    """The configured server, its fake API's records cleared; after the test, its shared
    event stream has closed (no test leaves one for the next)."""
    server = servers["configured"].ready()
    api.reset()
    yield server
    wait_until(lambda: api.open_streams() == 0, "the shared event stream closed")


@pytest.fixture
def open_tab(server):
    """Open tabs on the configured server (``Tab``'s arguments); all closed after the
    test."""
    opened = []

    def open_tab(*args, **kwargs):
        opened.append(Tab(server, *args, **kwargs))
        return opened[-1]
    yield open_tab
    for tab in opened:
        tab.close()


# --- forwarding ----------------------------------------------------------------------------
def test_calls_go_on_with_the_servers_token_and_none_of_the_browsers_headers(server, api):
    status, headers, body = server.request(
        "GET", API + "jobs?state=queued%2Crunning&token=" + TOKEN,
        headers={"Cookie": "username-x=secret-session", "X-Forwarded-For": "10.9.9.9",
                 "X-Forwarded-Host": "evil.example", "X-Custom": "1",
                 "Accept": "application/json"})
    assert (status, body) == (200, {"jobs": [record()]})
    [seen] = api.seen()
    assert (seen["method"], seen["path"]) == ("GET", "jobs")
    assert seen["query"] == {"state": ["queued,running"]}  # the Jupyter token stays here
    assert seen["headers"]["Authorization"] == f"token {HUB_TOKEN}"
    assert seen["headers"]["Host"] == f"127.0.0.1:{api.server_port}"
    assert seen["headers"]["Accept"] == "application/json"
    sent = {name.lower() for name in seen["headers"]}
    assert not sent & {"cookie", "x-forwarded-for", "x-forwarded-host", "x-custom"}
    assert TOKEN not in json.dumps(seen["headers"])


def test_a_submit_goes_on_with_its_json_body(server, api):
    job = {"image": "mpi", "np": 2, "cmd": ["hostname"]}
    status, headers, body = server.request("POST", API + "jobs", body=json.dumps(job),
                                           headers={"Content-Type": "text/plain"})
    assert status == 201 and body["sent"] == job and body["state"] == "queued"
    [seen] = api.seen("jobs")
    assert seen["method"] == "POST" and json.loads(seen["body"]) == job
    assert seen["headers"]["Content-Type"] == "application/json"
    status, headers, body = server.request("POST", f"{API}jobs/{JOB}/cancel")
    assert status == 404 and body["error"] == f"no such endpoint: jobs/{JOB}/cancel"
    assert api.seen()[-1]["method"] == "POST" and api.seen()[-1]["body"] == b""


@pytest.mark.parametrize("path, status", [
    ("jobs/../../hub/api/users", 404),
    ("jobs/%2e%2e/%2e%2e/hub/api/users", 404),
    (f"jobs%2F{JOB}", 404),
    ("jobs/20261201-114410-DBD5D6", 404),
    (f"jobs/{JOB}x", 404),
    (f"jobs/{JOB}/wait", 404),
    ("openapi.json", 404),
    ("", 404),
    ("https://evil.example/services/dockermpi/api/v1/whoami", 404),
    ("//evil.example/api/v1/whoami", 404),
    (f"events?job={JOB}%2F..", 404),
    ("events?job=../whoami", 404),
])
def test_what_the_panel_does_not_need_is_refused_here(server, api, path, status):
    answer_status, headers, body = server.request("GET", API + path)
    assert answer_status == status
    assert body["status"] == status and isinstance(body["error"], str), body
    assert api.seen() == []


@pytest.mark.parametrize("method, path", [
    ("DELETE", f"jobs/{JOB}"), ("PUT", "jobs"), ("PATCH", f"jobs/{JOB}"),
    ("POST", "whoami"), ("POST", f"jobs/{JOB}"), ("GET", f"jobs/{JOB}/cancel"),
])
def test_other_methods_are_refused_here(server, api, method, path):
    status, headers, body = server.request(method, API + path, body=b"{}")
    assert status == 405 and body == {"error": f"{method} is not allowed here", "status": 405}
    assert api.seen() == []


@pytest.mark.parametrize("method, path", [
    ("GET", API + "whoami"), ("GET", API + "events"), ("GET", f"{API}events?job={JOB}"),
    ("POST", API + "jobs"), ("GET", "dockermpi/settings"),
])
def test_a_request_without_the_servers_login_is_refused(server, api, method, path):
    status, headers, body = server.request(method, path, auth=False,
                                           body=b"{}" if method == "POST" else None)
    assert status == 403 and body["status"] == 403, body
    assert api.seen() == []


def login_cookie(server):
    """The cookie jupyter_server gives a browser that logs in with its token."""
    status, headers, _ = server.request("GET", f"api/status?token={TOKEN}", auth=False)
    assert status == 200
    [cookie] = [value.split(";")[0] for value in headers.get_all("Set-Cookie")
                if value.startswith("username-")]
    return cookie


def test_a_logged_in_browsers_post_needs_its_xsrf_token(server, api):
    cookie = login_cookie(server)
    status, _, body = server.request("GET", API + "whoami", headers={"Cookie": cookie},
                                     auth=False)
    assert (status, body) == (200, IDENTITY)
    api.reset()
    job = json.dumps({"image": "mpi", "np": 1, "cmd": ["hostname"]})
    status, _, body = server.request("POST", API + "jobs", body=job, auth=False,
                                     headers={"Cookie": cookie})
    assert status == 403 and "_xsrf" in body["error"], body
    assert api.seen() == []
    xsrf = "0123456789abcdef0123456789abcdef"
    status, _, body = server.request("POST", API + "jobs", body=job, auth=False, headers={
        "Cookie": f"{cookie}; _xsrf={xsrf}", "X-XSRFToken": xsrf})
    assert status == 201
    [seen] = api.seen()
    assert seen["headers"]["Authorization"] == f"token {HUB_TOKEN}"
    assert "Cookie" not in seen["headers"] and "X-XSRFToken" not in seen["headers"]


def test_the_apis_status_body_and_retry_after_come_back_and_its_other_headers_do_not(
        server, api):
    refusal = {"error": "over the request rate", "status": 429}
    api.answers[("GET", "usage")] = [(429, {"Retry-After": "7", "Set-Cookie": "a=b",
                                            "X-Upstream": "1"},
                                      json.dumps(refusal).encode())]
    status, headers, body = server.request("GET", API + "usage?since=0")
    assert (status, body) == (429, refusal)
    assert headers["Retry-After"] == "7" and headers["Content-Type"] == "application/json"
    assert "X-Upstream" not in headers
    # jupyter_server's own login cookie may be set; the API's never is
    assert not [c for c in headers.get_all("Set-Cookie") or [] if c.startswith("a=")]
    missing = {"error": f"no such job: {UNKNOWN_JOB}", "status": 404}
    api.answers[("GET", f"jobs/{UNKNOWN_JOB}/logs")] = [(404, {}, json.dumps(missing).encode())]
    assert server.request("GET", f"{API}jobs/{UNKNOWN_JOB}/logs?tail=10")[::2] == (404, missing)
    assert api.seen()[-1]["query"] == {"tail": ["10"]}


def test_an_answer_without_json_is_named_not_passed_on(server, api):
    api.answers[("GET", "images")] = [(404, {"Content-Type": "text/html"}, b"<html>404</html>")]
    status, headers, body = server.request("GET", API + "images")
    assert status == 404
    assert body == {"error": f"the DockerMPI API at {api.url} answered 404 without a JSON "
                             "body", "status": 404}


def test_a_body_over_1_mib_is_refused_unsent(server, api):
    status, headers, body = server.request("POST", API + "jobs", body=b" " * (1 << 20) + b"1")
    assert status == 413 and body == {"error": "the request body is over 1048576 bytes",
                                      "status": 413}
    assert api.seen() == []


def test_an_api_that_cannot_be_reached_is_a_502_naming_it(servers):
    server = servers["down"].ready()
    for path in ("whoami", f"events?job={JOB}"):
        status, headers, body = server.request("GET", API + path)
        assert status == 502 and body["status"] == 502
        assert body["error"].startswith("cannot reach the DockerMPI API at https://127.0.0.1:")
        assert "refused" in body["error"].lower(), body


def test_an_unconfigured_server_starts_and_says_what_is_missing(servers):
    server = servers["unconfigured"].ready()
    for method, path in (("GET", "whoami"), ("POST", "jobs"), ("GET", "events"),
                         ("GET", f"events?job={JOB}")):
        status, headers, body = server.request(method, API + path, body=b"{}"
                                               if method == "POST" else None)
        assert status == 503, body
        assert body["error"] == ("DockerMPI is not configured in this server: "
                                 "DOCKERMPI_API_URL, JUPYTERHUB_API_TOKEN not set (the hub "
                                 "sets them in the servers it starts)")
    status, headers, settings = server.request("GET", "dockermpi/settings")
    assert settings["refresh_seconds"] == 30  # its DOCKERMPI_REFRESH_SECONDS=2 is too short
    assert "DOCKERMPI_REFRESH_SECONDS='2'" in server.log()


def test_the_panel_gets_its_settings(server):
    status, headers, settings = server.request("GET", "dockermpi/settings")
    assert (status, settings) == (200, {"refresh_seconds": 12, "user": "alice",
                                        "jobs_dir": "mpi-jobs"})


# --- event streams -------------------------------------------------------------------------
def shared_streams(api):
    """How many all-jobs streams the API was asked for since the test began, and how
    many are open."""
    return len(api.seen("events")), api.open_streams()


def test_tabs_share_one_stream_of_the_api_which_closes_when_they_leave(server, api, open_tab):
    first = open_tab()
    assert first.response.status == 200
    assert first.response.getheader("Content-Type") == "text/event-stream"
    wait_until(lambda: shared_streams(api) == (1, 1), "the shared stream is open")
    second = open_tab()
    events = [sse("state", record(state=state)) for state in ("queued", "running")]
    for event in events:
        api.publish(event + b"\n\n")
    wait_until(lambda: first.count() == second.count() == 2, "both tabs have the events")
    assert first.events == second.events == events
    wait_until(lambda: first.keepalives and second.keepalives, "the tabs get keepalives")
    assert [r["target"] for r in api.seen("events")] == [PREFIX + "/api/v1/events"]
    assert api.seen("events")[0]["headers"]["Accept"] == "text/event-stream"
    first.close()
    api.publish(sse("state", record(state="succeeded")) + b"\n\n")
    wait_until(lambda: second.count() == 3, "the tab left has the third event")
    second.close()
    wait_until(lambda: api.open_streams() == 0, "the stream is closed once both left")
    assert len(api.seen("events")) == 1


def test_events_reach_the_tabs_whole(server, api, open_tab):
    tab = open_tab()
    wait_until(lambda: shared_streams(api) == (1, 1), "the shared stream is open")
    event = sse("state", record())
    api.publish(event[:20])
    keepalives = tab.keepalives
    wait_until(lambda: tab.keepalives > keepalives, "a keepalive after half an event")
    api.publish(event[20:] + b"\r\n\r\n")
    wait_until(lambda: tab.count() == 1, "the tab has the event")
    assert tab.events == [event]
    tab.close()


def test_a_slow_tab_is_cut_off_without_holding_up_the_others(server, api, open_tab):
    fast = open_tab()
    wait_until(lambda: shared_streams(api) == (1, 1), "the shared stream is open")
    slow = open_tab(reading=False, receive_buffer=4096)
    event = sse("output", {"data": "x" * 16384})
    sent = 0
    # The server's log is the module's: an earlier test's tab may have been cut off too.
    cut_before = server.log().count("cut off a tab")
    while server.log().count("cut off a tab") == cut_before:
        assert sent < 4000, "the slow tab was never cut off"
        for _ in range(MAX_BEHIND // 2):  # the fast tab is never that far behind
            api.publish(event + b"\n\n")
        sent += MAX_BEHIND // 2
        wait_until(lambda: fast.count() == sent, "the fast tab has every event")
    slow.reader.start()  # what reached it before it was cut off, then the end
    wait_until(lambda: slow.ended, "the slow tab's stream ends")
    assert slow.ended and len(slow.events) < sent
    assert set(slow.events) == {event}
    api.publish(sse("state", record()) + b"\n\n")
    wait_until(lambda: fast.count() == sent + 1, "the fast tab still gets events")
    assert len(api.seen("events")) == 1 and api.open_streams() == 1
    fast.close()


def test_a_refused_shared_stream_is_reopened_after_its_retry_after(server, api, open_tab):
    api.stream_refusals.append((429, {"Retry-After": "2"}))
    tab = open_tab()
    wait_until(lambda: api.open_streams() == 1, "the stream is reopened")
    first, second = api.seen("events")
    assert second["at"] - first["at"] >= 2  # not the 0.2 s of the first backoff
    api.publish(sse("state", record()) + b"\n\n")
    wait_until(lambda: tab.count() == 1, "the tab has the event")
    tab.close()


def test_a_silent_shared_stream_is_given_up_and_reopened(server, api, open_tab):
    tab = open_tab()
    wait_until(lambda: shared_streams(api) == (1, 1), "the shared stream is open")
    api.publish("silence")
    wait_until(lambda: len(api.seen("events")) == 2, "the silent stream is replaced")
    wait_until(lambda: api.open_streams() == 1, "the new stream is open")
    api.publish(sse("state", record()) + b"\n\n")
    wait_until(lambda: tab.count() == 1, "the tab has the event")
    tab.close()


def test_a_jobs_stream_is_passed_through_to_its_end(server, api, open_tab):
    tab = open_tab(f"?job={ENDING_JOB}&token={TOKEN}")
    assert tab.response.getheader("Content-Type") == "text/event-stream"
    wait_until(lambda: tab.ended, "the job's stream ended")
    assert [event.split(b"\n")[0] for event in tab.events] == [
        b"event: state", b"event: output", b"event: end"]
    [seen] = api.seen("events")
    assert seen["query"] == {"job": [ENDING_JOB]}
    assert seen["headers"]["Authorization"] == f"token {HUB_TOKEN}"


def test_a_jobs_stream_is_closed_upstream_when_its_tab_goes_away(server, api, open_tab):
    tab = open_tab(f"?job={JOB}")
    wait_until(lambda: tab.count() == 1, "the tab has the job's state")
    wait_until(lambda: api.job_streams_open == 1, "the job's stream is open")
    tab.close()
    wait_until(lambda: api.job_streams_open == 0, "the job's stream is closed upstream")


def test_an_unknown_jobs_stream_gets_the_apis_answer(server, api):
    status, headers, body = server.request("GET", f"{API}events?job={UNKNOWN_JOB}")
    assert (status, body) == (404, {"error": f"no such job: {UNKNOWN_JOB}", "status": 404})
    assert headers["Content-Type"] == "application/json"
