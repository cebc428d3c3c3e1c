"""The user API's HTTP layer (``_engines/mpi_api.py``) on a real tornado server: who may
call, per-user limits, bodies, errors. The user calls are stand-ins that record who
called them (but for status and list over a real store); a small tornado app answers for
the hub's ``GET /user``. The real hub, calls and proxy are in tests/integration/test_hub.py."""

import asyncio
import contextlib
import functools
import http.client
import json
import ssl
import threading
import time
import urllib.error
import urllib.request

import pytest
import tornado.httpserver
import tornado.web

from dmpi.errors import NoSuchJob
from dmpi.master import user_calls
from dmpi.master.site import Site
from tests.cluster import tls
from tests.extension import load_extension

mpi_api = load_extension("_engines/mpi_api.py", "mpi_api")

SCOPE = "access:services!service=dockermpi"
#: token -> the hub's model of its owner (None: the hub refuses it)
HUB_TOKENS = {
    "ann-token-0123456789": {"kind": "user", "name": "ann", "scopes": [SCOPE, "self"]},
    "bob-token-0123456789": {"kind": "user", "name": "bob", "scopes": ["access:services"]},
    "narrow-token-0123456": {"kind": "user", "name": "ann", "scopes": ["read:users!user"]},
    "service-token-012345": {"kind": "service", "name": "dockermpi", "scopes": [SCOPE]},
}


class HubUser(tornado.web.RequestHandler):
    asked = []

    def get(self):
        token = self.request.headers.get("Authorization", "").partition(" ")[2]
        HubUser.asked.append(token)
        model = HUB_TOKENS.get(token)
        if model is None:
            self.set_status(403)
            self.finish({"status": 403, "message": "no such token"})
        else:
            self.finish(model)


class Runner:
    """The user calls as the API makes them: each records the hub user it acts for."""

    def __init__(self):
        self.calls = []

    def __getitem__(self, fun):
        def call(caller, **kwargs):
            self.calls.append((fun, caller.identity, kwargs))
            if fun == "status" and kwargs["job_id"] != "20261202-120000-aaaaaa":
                raise NoSuchJob(f"no such job: {kwargs['job_id']}")
            if fun in ("submit", "submit_mpijob"):
                return {"job_id": "20261202-120000-aaaaaa", "state": "queued"}
            if fun == "list":
                return []
            return {"fun": fun}
        return call


@pytest.fixture
def server(request):
    """(base URL of the API, the stand-in runner); the hub stand-in on another port."""
    runner = Runner()
    with _serving(runner, getattr(request, "param", ["127.0.0.0/8"])) as url:
        yield url, runner


@contextlib.contextmanager
def _serving(runner, allowed_clients, tls_files=None, hub_ca=True):
    """The API's base URL, serving ``runner``'s functions until the block ends; with
    ``tls_files`` (of :func:`_tls_files`) the API and the hub stand-in serve TLS, and the
    API checks the hub's certificate with the CA unless ``hub_ca`` is false."""
    ready = threading.Event()
    found = {}

    def serve():
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        hub_ssl = api_ssl = None
        if tls_files:
            hub_ssl = mpi_api.tls_context(tls_files["hub_cert"], tls_files["hub_key"], "0.0.0.0")
            api_ssl = mpi_api.tls_context(tls_files["api_cert"], tls_files["api_key"], "0.0.0.0")
        hub = tornado.httpserver.HTTPServer(tornado.web.Application([("/hub/api/user", HubUser)]),
                                            ssl_options=hub_ssl)
        hub_port = _listen(hub)
        hub_url = (f"https://localhost:{hub_port}/hub/api" if tls_files
                   else f"http://127.0.0.1:{hub_port}/hub/api")
        settings = {"hub_api_url": hub_url,
                    "hub_ca": tls_files["ca"] if tls_files and hub_ca else None,
                    "allowed_clients": allowed_clients,
                    "token_cache_seconds": 60,
                    "limits": {"requests_per_second": 2, "burst": 5, "streams": 1,
                               "body_bytes": 1024, "log_bytes": 4096, "wait_seconds": 5,
                               "page_jobs": 3}}
        app, _ = mpi_api.make_app(Site({}), runner, settings)
        api = tornado.httpserver.HTTPServer(app, max_body_size=mpi_api.DISCARD_BYTES,
                                            ssl_options=api_ssl)
        scheme = "https" if tls_files else "http"
        found["url"] = f"{scheme}://127.0.0.1:{_listen(api)}{mpi_api.PREFIX}/api/v1"
        found["loop"] = loop
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(30)
    HubUser.asked.clear()
    try:
        yield found["url"]
    finally:
        found["loop"].call_soon_threadsafe(found["loop"].stop)
        thread.join(30)


def _listen(http_server):
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    sock.setblocking(False)
    http_server.add_sockets([sock])
    return sock.getsockname()[1]


def call(url, path, token="ann-token-0123456789", method="GET", body=None, headers=None,
         context=None):
    """(status, headers, JSON answer)."""
    headers = dict(headers or {})
    if token:
        headers["Authorization"] = f"token {token}"
    request = urllib.request.Request(url + path, method=method, data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30, context=context) as answer:
            return answer.status, answer.headers, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, json.loads(exc.read())


def test_each_call_runs_as_the_hub_user_whose_token_it_is(server):
    url, runner = server
    assert call(url, "/whoami")[0] == 200
    assert call(url, "/whoami", token="bob-token-0123456789")[0] == 200
    assert [(fun, who) for fun, who, _ in runner.calls] == [("whoami", "ann"),
                                                            ("whoami", "bob")]


@pytest.mark.parametrize("token, status", [
    (None, 401), ("forged-token-000000", 403), ("narrow-token-0123456", 403),
    ("service-token-012345", 403), ("bad token with spaces", 403),
])
def test_a_token_the_hub_refuses_or_without_the_scope_is_refused(server, token, status):
    url, runner = server
    answer = call(url, "/jobs", token=token)
    assert answer[0] == status and answer[2]["status"] == status, answer
    assert runner.calls == []


def test_the_hubs_answer_is_kept_so_a_polling_user_costs_it_one_check(server):
    url, _ = server
    for _ in range(4):
        assert call(url, "/jobs")[0] == 200
    for _ in range(3):
        assert call(url, "/jobs", token="forged-token-000000")[0] == 403
    assert HubUser.asked == ["ann-token-0123456789", "forged-token-000000"]


def test_a_user_over_the_rate_gets_429_with_retry_after_and_another_is_served(server):
    url, _ = server
    codes = [call(url, "/jobs")[0] for _ in range(12)]
    assert codes[:5] == [200] * 5 and 429 in codes, codes
    status, headers, answer = call(url, "/jobs")
    assert status == 429 and int(headers["Retry-After"]) >= 1
    assert "requests_per_second" in answer["error"]
    assert call(url, "/jobs", token="bob-token-0123456789")[0] == 200


def test_a_body_over_the_limit_gets_413_and_reaches_no_function(server):
    url, runner = server
    big = json.dumps({"image": "mpi", "cmd": ["x" * 100000]}).encode()
    status, _, answer = call(url, "/jobs", method="POST", body=big,
                             headers={"Content-Type": "application/json"})
    assert status == 413 and "body_bytes" in answer["error"], answer
    assert runner.calls == []
    ok = json.dumps({"image": "mpi", "np": 1, "cmd": ["hostname"]}).encode()
    status, _, answer = call(url, "/jobs", method="POST", body=ok)
    assert status == 201 and answer["state"] == "queued"
    assert runner.calls[-1][:2] == ("submit", "ann")


def test_an_mpijob_is_submitted_as_the_caller_and_alone(server):
    url, runner = server
    manifest = "apiVersion: kubeflow.org/v2beta1\nkind: MPIJob\n"
    status, _, answer = call(url, "/jobs", method="POST",
                             body=json.dumps({"mpijob": manifest, "image": "mpi"}).encode())
    assert status == 201 and answer["state"] == "queued"
    assert runner.calls[-1] == ("submit_mpijob", "ann", {"mpijob": manifest, "image": "mpi"})
    # Nothing of a plain submit rides along (another user's name above all).
    status, _, answer = call(url, "/jobs", method="POST",
                             body=json.dumps({"mpijob": manifest, "user": "bob"}).encode())
    assert status == 400 and answer["error"] == "unknown job fields: user (known: image, mpijob)"
    assert len(runner.calls) == 1


def test_refusals_are_json_with_the_reason(server):
    url, _ = server
    status, _, answer = call(url, "/jobs/20991231-000000-bbbbbb")
    assert status == 404 and answer == {"error": "no such job: 20991231-000000-bbbbbb",
                                        "status": 404}
    status, _, answer = call(url, "/jobs", method="POST", body=b"[1]")
    assert status == 400 and "JSON object" in answer["error"]
    status, _, answer = call(url, "/jobs", method="POST", body=b'{"user": "bob"}')
    assert status == 400 and "unknown job fields: user" in answer["error"]
    status, _, answer = call(url, "/jobs/20261202-120000-aaaaaa/logs?tail=99999")
    assert status == 400 and "log_bytes" in answer["error"]
    status, _, answer = call(url, "/jobs/20261202-120000-aaaaaa/wait?timeout=-1")
    assert status == 400 and "0 or more" in answer["error"]
    status, _, answer = call(url, "/nothing-here")
    assert status == 404 and "no such endpoint" in answer["error"]
    status, _, spec = call(url, "/openapi.json", token=None)
    assert status == 200 and "/jobs/{job_id}/logs" in spec["paths"]


@pytest.mark.parametrize("server", [["10.99.0.0/16"]], indirect=True)
def test_a_client_outside_the_allowed_networks_is_refused(server):
    url, runner = server
    status, _, answer = call(url, "/whoami")
    assert status == 403 and "through the hub's proxy only" in answer["error"]
    assert runner.calls == [] and HubUser.asked == []


def test_a_wait_longer_than_the_sites_longest_is_cut_to_it(server):
    url, runner = server
    started = time.monotonic()
    status, _, answer = call(url, "/jobs/20261202-120000-aaaaaa/wait?timeout=600")
    # The stand-in job never ends: the answer comes after wait_seconds (5), not 600.
    assert status == 200 and time.monotonic() - started < 60
    assert [fun for fun, _, _ in runner.calls].count("status") >= 2


def test_rates_and_stream_slots_are_per_user():
    refused = mpi_api.Refused
    limiter = mpi_api.RateLimiter(1, 1)
    limiter.take("ann")
    with pytest.raises(refused) as caught:
        limiter.take("ann")
    assert caught.value.status == 429 and caught.value.headers["Retry-After"] == "1"
    slots = mpi_api.Slots(1)
    slots.take("ann")
    with pytest.raises(refused):
        slots.take("ann")
    slots.take("bob")  # another user's slots are their own
    slots.give("ann")
    slots.take("ann")


def test_an_engine_configuration_without_every_limit_is_refused_naming_those_missing():
    settings = {"hub_api_url": "http://127.0.0.1:1/hub/api", "allowed_clients": ["127.0.0.1"],
                "limits": {"requests_per_second": 2, "burst": 5, "streams": 1,
                           "body_bytes": 1024}}
    with pytest.raises(ValueError,
                       match="limits lack log_bytes, wait_seconds, page_jobs; .*mpi:api:limits"):
        mpi_api.make_app(Site({}), Runner(), settings)
    with pytest.raises(ValueError, match="lack requests_per_second, burst, streams, body_bytes"):
        mpi_api.make_app(Site({}), Runner(), dict(settings, limits=None))


@pytest.mark.parametrize("method, path", [
    ("GET", "/jobs"), ("GET", "/jobs/20261202-120000-aaaaaa"),
    ("GET", "/jobs/20261202-120000-aaaaaa/logs?tail=99999"),
    ("GET", "/jobs/20261202-120000-aaaaaa/wait"), ("GET", "/events"),
    ("POST", "/jobs/20261202-120000-aaaaaa/cancel"), ("GET", "/whoami"),
])
def test_every_endpoint_refuses_a_body_over_the_limit_before_it_acts(server, method, path):
    url, runner = server
    status, _, answer = call(url, path, method=method, body=b"x" * 5000)
    assert status == 413 and "body_bytes" in answer["error"], answer
    assert runner.calls == []


def test_polled_calls_have_threads_of_their_own_so_slow_calls_never_hold_them_up():
    release = threading.Event()

    class SlowSubmit(Runner):
        def __getitem__(self, fun):
            def run(caller, **kwargs):
                if fun == "submit":
                    release.wait(30)
                return {"fun": fun, "thread": threading.current_thread().name}
            return run

    jobs = mpi_api.Jobs(SlowSubmit(), workers=1)

    async def polled_while_the_only_worker_is_busy():
        slow = asyncio.ensure_future(jobs.call("ann", "submit"))
        await asyncio.sleep(0.1)
        try:
            return [await asyncio.wait_for(jobs.call("ann", fun), 10)
                    for fun in ("status", "list")]
        finally:
            release.set()
            await slow

    answers = asyncio.run(polled_while_the_only_worker_is_busy())
    assert [a["fun"] for a in answers] == ["status", "list"]
    assert all(a["thread"].startswith("mpi-api-poll") for a in answers)


@pytest.fixture
def real_runner(tmp_path, monkeypatch):
    """(base URL of the API, the job store): the API serving the real runner's status
    and list over a real store, with two users' jobs."""
    site = Site({"cachedir": str(tmp_path)})
    store = site.store()
    for n, (user, state) in enumerate([("ann", "running"), ("bob", "queued"), ("ann", "queued"),
                                       ("ann", "succeeded")]):
        job_id = f"20261202-12000{n}-aaaaaa"
        store.add({"job_id": job_id, "name": f"run-{n}", "user": user, "state": "queued",
                   "np": 2, "submitted": 1764676800.25 + n, "uid": 100000,
                   "history": [{"state": "queued", "at": 1764676800.25 + n, "reason": None}],
                   "spec": {"config": {"storage": {"path": "/srv/dockermpi"}}}})
        if state != "queued":
            store.transition(job_id, "running", placement={"node1": 2}, started=1764676900.5)
        if state == "succeeded":
            store.transition(job_id, state, ended=1764677000.75, exit_code=0)
    store.set_meta("waiting", {"20261202-120001-aaaaaa": "user limit",
                               "20261202-120002-aaaaaa": "free slots"})
    store.set_meta("priorities", {"20261202-120002-aaaaaa": PRIORITY})
    store.set_meta("queue_places", {"20261202-120001-aaaaaa": 1, "20261202-120002-aaaaaa": 2})
    functions = {"status": functools.partial(user_calls.status, site),
                 "list": functools.partial(user_calls.list_jobs, site),
                 "history": functools.partial(user_calls.history, site)}
    with _serving(functions, ["127.0.0.0/8"]) as url:
        yield url, store


PRIORITY = {"priority": 5012, "fairshare": 0.5, "age": 0.012}


def test_a_hub_users_list_and_status_show_their_own_jobs_as_recorded(real_runner):
    url, _ = real_runner
    status, _, answer = call(url, "/jobs?state=queued,running,succeeded")
    assert status == 200
    assert answer["jobs"] == [
        {"job_id": "20261202-120000-aaaaaa", "name": "run-0", "user": "ann", "state": "running",
         "np": 2, "placement": {"node1": 2}, "submitted": 1764676800.25,
         "started": 1764676900.5, "ended": None, "reason": None, "waiting_for": None,
         "priority": None, "queue_place": None},
        {"job_id": "20261202-120002-aaaaaa", "name": "run-2", "user": "ann", "state": "queued",
         "np": 2, "placement": None, "submitted": 1764676802.25, "started": None,
         "ended": None, "reason": None, "waiting_for": "free slots", "priority": PRIORITY,
         "queue_place": 2},
        {"job_id": "20261202-120003-aaaaaa", "name": "run-3", "user": "ann",
         "state": "succeeded", "np": 2, "placement": {"node1": 2}, "submitted": 1764676803.25,
         "started": 1764676900.5, "ended": 1764677000.75, "reason": None, "waiting_for": None,
         "priority": None, "queue_place": None}]
    status, _, answer = call(url, "/jobs?state=running,succeeded")
    assert [j["job_id"] for j in answer["jobs"]] == ["20261202-120000-aaaaaa",
                                                     "20261202-120003-aaaaaa"]
    status, _, answer = call(url, "/jobs?state=running,bogus")
    assert status == 400 and "unknown job states" in answer["error"]
    status, _, answer = call(url, "/jobs/20261202-120002-aaaaaa")
    assert status == 200 and answer["waiting_for"] == "free slots" and "spec" not in answer
    assert answer["priority"] == PRIORITY
    assert (answer["state"], answer["closed"], answer["history"][0]["state"]) == (
        "queued", False, "queued")
    status, _, answer = call(url, "/jobs/20261202-120001-aaaaaa")  # bob's
    assert status == 404 and answer["error"] == "no such job: 20261202-120001-aaaaaa"


def test_a_list_and_a_history_come_in_pages_of_the_callers_own_jobs(real_runner):
    url, _ = real_runner
    every = "/jobs?state=queued,running,succeeded"
    status, _, first = call(url, every + "&limit=2")
    assert status == 200 and [j["job_id"] for j in first["jobs"]] == [
        "20261202-120000-aaaaaa", "20261202-120002-aaaaaa"]
    assert first["next"] == "20261202-120002-aaaaaa"
    status, _, last = call(url, f"{every}&limit=2&after={first['next']}")
    assert status == 200 and [j["job_id"] for j in last["jobs"]] == ["20261202-120003-aaaaaa"]
    assert last["next"] is None
    status, _, history = call(url, "/history")
    assert status == 200 and history["next"] is None
    assert [j["job_id"] for j in history["jobs"]] == ["20261202-120003-aaaaaa"]
    # bob's job as the place to start after is no such job: nothing of his is shown
    status, _, answer = call(url, "/history?after=20261202-120001-aaaaaa")
    assert (status, answer["error"]) == (404, "no such job: 20261202-120001-aaaaaa")
    status, _, answer = call(url, every + "&limit=4")
    assert status == 400 and answer["error"].startswith(
        "limit must be between 1 and 3 jobs (mpi:api:limits:page_jobs)")


def test_a_list_without_state_shows_the_queued_and_running_jobs_as_squeue(real_runner):
    # Ended jobs are the history's: what a polled list costs does not grow with them.
    url, _ = real_runner
    for path in ("/jobs", "/jobs?state="):
        status, _, answer = call(url, path)
        assert status == 200 and [j["job_id"] for j in answer["jobs"]] == [
            "20261202-120000-aaaaaa", "20261202-120002-aaaaaa"], (path, answer)


def test_a_list_and_a_status_see_what_the_job_engine_wrote_just_before(real_runner):
    url, store = real_runner
    for n in range(2):  # 4 calls: within the fixture's burst of 5
        store.update("20261202-120000-aaaaaa", reason=f"tick {n}")
        assert call(url, "/jobs/20261202-120000-aaaaaa")[2]["reason"] == f"tick {n}"
        assert call(url, "/jobs?state=running")[2]["jobs"][0]["reason"] == f"tick {n}"


class Printing(Runner):
    """A running job whose stdout grows a line at every read and whose stderr stays
    empty; it has ended once stdout was read ``reads`` times."""

    JOB = "20261202-120000-aaaaaa"

    def __init__(self, reads):
        super().__init__()
        self.reads = reads

    def stdout_reads(self):
        return sum(1 for fun, _, kw in self.calls if fun == "logs" and kw["stream"] == "stdout")

    def __getitem__(self, fun):
        def call(caller, **kwargs):
            self.calls.append((fun, caller.identity, kwargs))
            if fun == "status":
                ended = self.stdout_reads() >= self.reads
                return {"job_id": self.JOB, "user": "ann", "state":
                        "succeeded" if ended else "running", "closed": ended}
            if fun == "logs" and kwargs["stream"] == "stdout":
                return {"data": "line\n", "offset": kwargs["offset"] + 5}
            if fun == "logs":
                return {"data": "", "offset": kwargs["offset"]}
            return {"fun": fun}
        return call


def test_following_reads_a_quiet_stream_less_often_and_every_stream_at_the_end(monkeypatch):
    """Each read of a job's output is a Salt call to a node: a stream that gave nothing
    sits out 1, 2, then 3 rounds; a stream that grows is read every round; at the end
    both are read to their end. Counted in rounds, not seconds."""
    monkeypatch.setattr(mpi_api, "FOLLOW_POLL", 0.001)
    runner = Printing(reads=20)
    with _serving(runner, ["127.0.0.0/8"]) as url:
        request = urllib.request.Request(f"{url}/events?job={Printing.JOB}",
                                         headers={"Authorization": "token ann-token-0123456789"})
        with urllib.request.urlopen(request, timeout=60) as answer:
            text = answer.read().decode()
    assert text.count("event: output") == 21 and "event: end" in text
    reads = [kw["stream"] for fun, _, kw in runner.calls if fun == "logs"]
    # Rounds 0-19 while running: stderr at rounds 0, 2, 5, 9, 13, 17; the end reads both.
    assert reads.count("stdout") == 21
    assert reads.count("stderr") == 7


# ------------------------------------------------------------------------ TLS


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory):
    """Files of a CA, a hub certificate for localhost and an API one for 127.0.0.1."""
    made = tls.make("localhost", "127.0.0.1")
    folder = tmp_path_factory.mktemp("tls")
    files = {}
    for name, text in made.items():
        files[name] = str(folder / f"{name}.pem")
        (folder / f"{name}.pem").write_text(text)
    return files


def test_over_tls_a_call_is_served_and_the_hub_asked_over_tls(tls_files):
    with _serving(Runner(), ["127.0.0.0/8"], tls_files) as url:
        trusting = ssl.create_default_context(cafile=tls_files["ca"])
        status, _, answer = call(url, "/whoami", context=trusting)
        assert (status, answer["fun"]) == (200, "whoami")
        assert HubUser.asked == ["ann-token-0123456789"]
        # a client that would send its token in the clear gets no HTTP answer at all
        with pytest.raises((urllib.error.URLError, ConnectionError, http.client.HTTPException)):
            call(url.replace("https://", "http://"), "/whoami")
        # nor does one that cannot check the API's certificate get through
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
            call(url, "/whoami", context=ssl.create_default_context())
    HubUser.asked.clear()


def test_a_hub_whose_certificate_does_not_check_out_is_never_sent_the_token(tls_files):
    with _serving(Runner(), ["127.0.0.0/8"], tls_files, hub_ca=False) as url:
        trusting = ssl.create_default_context(cafile=tls_files["ca"])
        status, _, answer = call(url, "/whoami", context=trusting)
        assert status == 503 and "cannot be asked" in answer["error"]
        assert HubUser.asked == []
    HubUser.asked.clear()


def test_the_engine_refuses_plain_http_for_tokens_between_hosts(tls_files):
    settings = {"hub_api_url": "http://10.0.0.5:8081/hub/api", "allowed_clients": ["10.0.0.5"],
                "limits": dict.fromkeys(mpi_api.LIMITS, 5)}
    with pytest.raises(ValueError, match="plain http to another host.*mpi:api:hub_api_url"):
        mpi_api.make_app(Site({}), Runner(), settings)
    with pytest.raises(ValueError, match="listening on 0.0.0.0 needs tls_cert and tls_key"):
        mpi_api.tls_context(None, None, "0.0.0.0")
    assert mpi_api.tls_context(None, None, "127.0.0.1") is None
    assert mpi_api.tls_context(tls_files["api_cert"], tls_files["api_key"], "0.0.0.0")
