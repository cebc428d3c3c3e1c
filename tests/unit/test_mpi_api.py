"""The user API's HTTP layer (``_engines/mpi_api.py``) on a real tornado server: who may
call, per-user limits, bodies, errors. The runner's functions are stand-ins that record
who called them; a small tornado app answers for the hub's ``GET /user``. The real hub,
runner and proxy are in tests/integration/test_hub.py."""

import asyncio
import json
import threading
import time
import urllib.error
import urllib.request

import pytest
import tornado.httpserver
import tornado.web

from tests.extension import load_extension

mpi_api = load_extension("_engines/mpi_api.py", "mpi_api")
mpi_caller = load_extension("_utils/mpi_caller.py", "mpi_caller")
mpi_config = load_extension("_utils/mpi_config.py", "mpi_config")

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
    """The runner's functions as the API calls them: each records the hub user its
    thread acts for."""

    def __init__(self):
        self.calls = []

    def __getitem__(self, name):
        fun = name.split(".", 1)[1]

        def call(**kwargs):
            self.calls.append((fun, mpi_caller.hub_user(), kwargs))
            if fun == "status" and kwargs["job_id"] != "20261202-120000-aaaaaa":
                return {"error": f"no such job: {kwargs['job_id']}", "retcode": 1}
            if fun == "submit":
                return {"job_id": "20261202-120000-aaaaaa", "state": "queued", "retcode": 0}
            if fun == "list":
                return []
            return {"fun": fun, "retcode": 0}
        return call


class Utils(dict):
    pass


@pytest.fixture
def server(request):
    """(base URL of the API, the stand-in runner); the hub stand-in on another port."""
    runner = Runner()
    utils = Utils({"mpi_caller.as_hub_user": mpi_caller.as_hub_user,
                   "mpi_config.user_for_identity": mpi_config.user_for_identity})
    ready = threading.Event()
    found = {}

    def serve():
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        hub = tornado.httpserver.HTTPServer(tornado.web.Application([("/hub/api/user", HubUser)]))
        hub_port = _listen(hub)
        settings = {"hub_api_url": f"http://127.0.0.1:{hub_port}/hub/api",
                    "allowed_clients": getattr(request, "param", ["127.0.0.0/8"]),
                    "token_cache_seconds": 60,
                    "limits": {"requests_per_second": 2, "burst": 5, "streams": 1,
                               "body_bytes": 1024, "log_bytes": 4096, "wait_seconds": 5}}
        app, _ = mpi_api.make_app({}, runner, utils, settings)
        api = tornado.httpserver.HTTPServer(app, max_body_size=mpi_api.DISCARD_BYTES)
        found["url"] = f"http://127.0.0.1:{_listen(api)}{mpi_api.PREFIX}/api/v1"
        found["loop"] = loop
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(30)
    HubUser.asked.clear()
    yield found["url"], runner
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


def call(url, path, token="ann-token-0123456789", method="GET", body=None, headers=None):
    """(status, headers, JSON answer)."""
    headers = dict(headers or {})
    if token:
        headers["Authorization"] = f"token {token}"
    request = urllib.request.Request(url + path, method=method, data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.headers, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, json.loads(exc.read())


def test_each_call_runs_as_the_hub_user_whose_token_it_is(server):
    url, runner = server
    assert call(url, "/whoami")[0] == 200
    assert call(url, "/whoami", token="bob-token-0123456789")[0] == 200
    assert [(fun, who) for fun, who, _ in runner.calls] == [("whoami", "ann"),
                                                            ("whoami", "bob")]
    assert mpi_caller.hub_user() is None  # nothing leaks into other threads


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
