"""
DockerMPI's user API on the Salt master: one long-lived process, registered with
JupyterHub as the external service ``dockermpi``, through which hub users (their
notebooks, the ``mpi`` command, ``dockermpi.Client``) queue, watch and cancel their jobs.

Who calls is the hub's answer about the caller's token (``GET <hub API>/user``): only a
*user*'s token that carries the scope ``access:services!service=dockermpi`` (or
``access:services``) is taken, and the answer is kept for ``token_cache_seconds``. Each
call runs one of the user calls (:data:`dmpi.master.user_calls.CALLS`, nothing else) in
this process, in a worker thread, as that user: it shows and touches that user's jobs
only.
Live events come from the master's event bus, filtered here by the job's owner: a
stream carries nothing of any other user.

Requests come through the hub's proxy (``/services/dockermpi/``), whose host is the only
client accepted (``allowed_clients``): users never reach Salt itself. Users' tokens cross
the network encrypted only: the API serves TLS (``tls_cert``, ``tls_key``) unless it
listens on loopback, and asks the hub over https (``hub_ca`` verifies it when the hub's
certificate is not from a system CA) unless the hub is on loopback.

Master configuration (written by the ``dockermpi.api`` state from pillar ``mpi:api``):

.. code-block:: yaml

    engines:
      - mpi_api:
          hub_api_url: https://hub.example.org/hub/api
          hub_ca: /etc/dockermpi/api-tls/hub-ca.pem
          port: 8001
          tls_cert: /etc/dockermpi/api-tls/tls.crt
          tls_key: /etc/dockermpi/api-tls/tls.key
          allowed_clients: [10.0.0.5]
          limits: {requests_per_second: 20, burst: 40, streams: 4,
                   body_bytes: 1048576, log_bytes: 1048576, wait_seconds: 60,
                   page_jobs: 1000}

:depends: tornado (a dependency of Salt); the ``dmpi`` package (``_utils``)
"""

import asyncio
import collections
import concurrent.futures
import functools
import ipaddress
import json
import logging
import math
import re
import ssl
import threading
import time

import dmpi.settings
from dmpi.contract import (API_SERVICE_NAME, FINAL, JOB_ID_PATTERN, JOB_TAG_PREFIX,
                           JOB_TAG_RE, STATES, UNENDED)
from dmpi.errors import DockerMPIError, NoSuchJob, RequestError
from dmpi.master import user_calls
from dmpi.master.site import Site

log = logging.getLogger(__name__)

__virtualname__ = "mpi_api"

SERVICE = API_SERVICE_NAME
SCOPES = ("access:services", f"access:services!service={SERVICE}")
PREFIX = f"/services/{SERVICE}"
KEEPALIVE = 15  # seconds between comments on an idle event stream
FOLLOW_POLL = 1.0  # seconds between reads of a followed job's output
FOLLOW_CHUNK = 65536  # bytes of output per read while following
# A stream that gave nothing is read again after 1, then 2, then every 3 rounds of
# FOLLOW_POLL, not every round: each read is a Salt call that costs the node some 40-80 ms
# of CPU, and most jobs' stderr stays empty.
FOLLOW_QUIET_ROUNDS = 3
STREAM_QUEUE = 1000  # events kept for a slow reader before its stream is ended
TOKEN_CACHE_ENTRIES = 10000
HUB_TIMEOUT = 10
CALLS_PER_USER = 4  # of the worker threads, one user's calls hold at most this many
POLLED = ("status", "list")  # what users poll: reads of the job store only
POLLED_WORKERS = 2  # threads of their own for those
#: What ``GET /jobs`` lists without ``state`` (squeue's view): ended jobs are the history's,
#: so what a polled list costs does not grow with everything a user ever ran.
LISTED_BY_DEFAULT = ",".join(UNENDED)
DISCARD_BYTES = 1 << 30  # a body past the limit is read and dropped up to this size
_JOB_ID = f"({JOB_ID_PATTERN})"
_TOKEN_RE = re.compile(r"^[\x21-\x7e]{8,512}\Z")
#: what ``limits`` must name (pillar ``mpi:api:limits``, from salt/dockermpi/defaults.yaml)
LIMITS = dmpi.settings.API_LIMITS


def __virtual__():
    if __opts__.get("__role") != "master":
        return False, "mpi_api runs on the Salt master"
    return __virtualname__


class Refused(Exception):
    """An answer other than 2xx: HTTP status, one-line reason, extra headers/body."""

    def __init__(self, status, message, headers=None, body=None):
        super().__init__(message)
        self.status = status
        self.headers = headers or {}
        self.body = body or {}


# ------------------------------------------------------------------ who is calling


class HubIdentity:
    """Asks the hub whose a token is; keeps each answer (accepted or refused) for
    ``cache_seconds``, so a class of users polling costs the hub one call per token
    per period."""

    def __init__(self, hub_api_url, cache_seconds, http_client, ca_file=None):
        self.url = hub_api_url.rstrip("/") + "/user"
        self.ca_file = ca_file or None
        self.cache_seconds = float(cache_seconds)
        self.http = http_client
        self.cache = collections.OrderedDict()  # token -> (expires, name or None)
        self.asking = {}  # token -> future, so a burst of one token asks the hub once

    async def user(self, token):
        """The hub name of the user whose token this is; Refused(403) otherwise."""
        now = time.monotonic()
        cached = self.cache.get(token)
        if cached and cached[0] > now:
            name = cached[1]
        else:
            if token not in self.asking:
                self.asking[token] = asyncio.ensure_future(self._ask(token))
            try:
                name = await asyncio.shield(self.asking[token])
            finally:
                self.asking.pop(token, None)
        if name is None:
            raise Refused(403, "the hub does not accept this token for the dockermpi service "
                               "(forged, expired, revoked, its user removed, or without the "
                               "scope access:services!service=dockermpi)")
        return name

    async def _ask(self, token):
        import tornado.httpclient  # pylint: disable=import-outside-toplevel

        request = tornado.httpclient.HTTPRequest(
            self.url, headers={"Authorization": f"token {token}", "Accept": "application/json"},
            connect_timeout=HUB_TIMEOUT, request_timeout=HUB_TIMEOUT, ca_certs=self.ca_file)
        try:
            answer = await self.http.fetch(request, raise_error=False)
        except Exception as exc:  # pylint: disable=broad-except
            log.error("mpi_api: cannot ask the hub at %s: %s", self.url, exc)
            raise Refused(503, "the hub cannot be asked who you are; try again") from None
        if answer.code in (401, 403, 404):
            name = None
        elif answer.code != 200:
            log.error("mpi_api: the hub answered %s to a token check", answer.code)
            raise Refused(503, "the hub cannot be asked who you are; try again")
        else:
            name = self._accepted_name(answer.body)
        self.cache[token] = (time.monotonic() + self.cache_seconds, name)
        self.cache.move_to_end(token)
        while len(self.cache) > TOKEN_CACHE_ENTRIES:
            self.cache.popitem(last=False)
        return name

    @staticmethod
    def _accepted_name(body):
        """The user's name when the hub's model is a user's and the token may use this
        service; None otherwise."""
        try:
            model = json.loads(body)
        except ValueError:
            return None
        if not isinstance(model, dict) or model.get("kind", "user") != "user":
            return None
        name = model.get("name")
        scopes = model.get("scopes")
        if not isinstance(name, str) or not isinstance(scopes, list):
            return None
        return name if any(scope in SCOPES for scope in scopes) else None


class RateLimiter:
    """A token bucket per user: ``rate`` calls a second, ``burst`` at once."""

    def __init__(self, rate, burst):
        self.rate = float(rate)
        self.burst = float(burst)
        self.buckets = {}  # user -> (tokens, when)

    def take(self, user):
        """Spend one call of ``user``'s; Refused(429) with Retry-After when none is left."""
        now = time.monotonic()
        tokens, when = self.buckets.get(user, (self.burst, now))
        tokens = min(self.burst, tokens + (now - when) * self.rate)
        if tokens < 1:
            self.buckets[user] = (tokens, now)
            retry = max(1, math.ceil((1 - tokens) / self.rate))
            raise Refused(429, f"too many requests: at most {self.rate:g} a second "
                               f"(mpi:api:limits:requests_per_second); retry in {retry} s",
                          headers={"Retry-After": str(retry)})
        self.buckets[user] = (tokens - 1, now)


class Slots:
    """At most ``limit`` things (event streams and waits; calls in worker threads) per
    user at once."""

    def __init__(self, limit, what="open event streams and waits",
                 setting="mpi:api:limits:streams", then="close one first"):
        self.limit = int(limit)
        self.what, self.setting, self.then = what, setting, then
        self.held = collections.Counter()

    def take(self, user):
        if self.held[user] >= self.limit:
            raise Refused(429, f"too many {self.what}: at most {self.limit} at once "
                               f"({self.setting}); {self.then}",
                          headers={"Retry-After": "5"})
        self.held[user] += 1

    def give(self, user):
        self.held[user] -= 1
        if self.held[user] <= 0:
            del self.held[user]


# ------------------------------------------------------------ the user calls, in-process


class Jobs:
    """The user calls (``functions``: name -> function(caller, **kwargs)), called as a
    hub user in worker threads.

    The calls users poll (:data:`POLLED`) have a few threads of their own: they only
    read the store, in a fraction of a millisecond, and a few threads serve a crowd of
    them with far less CPU than many threads taking turns at Python's lock; nor do they
    wait behind the slow calls (submit, logs, whoami ask the nodes or the file server),
    which keep the ``workers`` threads."""

    def __init__(self, functions, workers):
        self.functions = functions
        self.pool = concurrent.futures.ThreadPoolExecutor(workers,
                                                          thread_name_prefix="mpi-api")
        self.polled = concurrent.futures.ThreadPoolExecutor(POLLED_WORKERS,
                                                            thread_name_prefix="mpi-api-poll")

    def _call_as(self, identity, fun, kwargs):
        return self.functions[fun](user_calls.hub_user(identity), **kwargs)

    async def call(self, identity, fun, **kwargs):
        """The call's answer; Refused(400/404) when it refused."""
        kwargs = {k: v for k, v in kwargs.items() if v is not None}
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self.polled if fun in POLLED else self.pool,
                                              self._call_as, identity, fun, kwargs)
        except TypeError as exc:  # an argument the function does not take
            raise Refused(400, f"bad arguments for {fun}: {exc}") from None
        except NoSuchJob as exc:
            raise Refused(404, str(exc)) from None
        except DockerMPIError as exc:
            body = {"state": "rejected"} if fun == "submit" else {}
            raise Refused(400, str(exc).strip(), body=body) from None


class Listeners:
    """Every open event stream, by DockerMPI user; fed from the master's bus by one
    thread that reads each changed job's record and hands it to its owner only."""

    def __init__(self, site, loop):
        self.site = site
        self.loop = loop
        self.by_user = collections.defaultdict(set)  # user -> {asyncio.Queue}

    def add(self, user, queue):
        self.by_user[user].add(queue)

    def discard(self, user, queue):
        self.by_user[user].discard(queue)
        if not self.by_user[user]:
            del self.by_user[user]

    def _deliver(self, user, record):
        for queue in list(self.by_user.get(user, ())):
            try:
                queue.put_nowait(record)
            except asyncio.QueueFull:
                # A reader this far behind is ended, never waited for.
                self.discard(user, queue)
                queue.overflowed = True

    def run(self):
        """Follow the bus until the process ends (in a thread of its own)."""
        store = self.site.store()
        while True:
            try:
                with self.site.job_events() as bus:
                    bus.subscribe(JOB_TAG_PREFIX)
                    while True:
                        event = bus.get_event(wait=5, tag=JOB_TAG_PREFIX, match_type="startswith",
                                              full=True)
                        if not event:
                            continue
                        match = JOB_TAG_RE.match(event["tag"])
                        if not match or match.group(2) == "cancel":
                            continue
                        record = store.get(match.group(1))
                        if record is None:
                            continue
                        view = user_calls.public(store, record)
                        self.loop.call_soon_threadsafe(self._deliver, record["user"], view)
            except Exception:  # pylint: disable=broad-except
                log.exception("mpi_api: reading the event bus failed; reconnecting")
                time.sleep(1)


# ----------------------------------------------------------------------- HTTP


def _openapi():
    """The API's OpenAPI 3 document."""
    job_id = {"name": "job_id", "in": "path", "required": True,
              "schema": {"type": "string", "pattern": f"^{JOB_ID_PATTERN}$"}}
    epoch = {"type": "number", "description": "seconds since the epoch"}
    error = {"description": "refused: {error, status}",
             "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    record = {"description": "a job record",
              "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Job"}}}}

    def op(summary, ok=None, params=(), body=None, errors=(400, 401, 403, 429)):
        answer = {"summary": summary, "parameters": list(params),
                  "responses": {"200": ok or {"description": "the answer"},
                                **{str(code): error for code in errors}}}
        if body:
            answer["requestBody"] = body
        return answer

    query = lambda name, schema, text: {"name": name, "in": "query", "schema": schema,  # noqa: E731
                                        "description": text}
    with_job = (400, 401, 403, 404, 429)
    # A page of jobs: {"jobs": [...], "next": the job id to ask after for the next page}.
    paging = [query("limit", {"type": "integer", "minimum": 1},
                    "jobs at most (default and most: the site's page_jobs)"),
              query("after", {"type": "string", "pattern": f"^{JOB_ID_PATTERN}$"},
                    "the next page: the jobs submitted after this one (a page's next)")]
    page = {"description": "{jobs: [rows], next: the job id to ask after, or null on "
                           "the last page}",
            "content": {"application/json": {"schema": {"type": "object", "properties": {
                "jobs": {"type": "array", "items": {"type": "object"}},
                "next": {"type": "string", "nullable": True}}}}}}
    # Where a job came from: the notebook and its cell (the %%mpi magic sends it).
    origin_schema = {"type": "object", "properties": {"notebook": {"type": "string"},
                                                      "cell": {"type": "integer"}}}
    return {
        "openapi": "3.0.3",
        "info": {"title": "DockerMPI user API", "version": "1",
                 "description": "Queue, watch and cancel MPI jobs as the JupyterHub user "
                                "whose token is presented (Authorization: token <token>)."},
        "servers": [{"url": f"{PREFIX}/api/v1"}],
        "components": {
            "securitySchemes": {"hubToken": {"type": "apiKey", "in": "header",
                                             "name": "Authorization"}},
            "schemas": {
                "Error": {"type": "object", "required": ["error", "status"],
                          "properties": {"error": {"type": "string"},
                                         "status": {"type": "integer"}}},
                "Job": {"type": "object", "properties": {
                    "job_id": {"type": "string"}, "name": {"type": "string", "nullable": True},
                    "origin": dict(origin_schema, nullable=True),
                    "user": {"type": "string"}, "state": {"type": "string", "enum": list(STATES)},
                    "np": {"type": "integer"}, "exit_code": {"type": "integer", "nullable": True},
                    "reason": {"type": "string", "nullable": True},
                    "waiting_for": {"type": "string", "nullable": True},
                    "queue_place": {"type": "integer", "nullable": True, "description":
                                    "while queued: 1 for the next job to start"},
                    "placement": {"type": "object"}, "timings": {"type": "object"},
                    "history": {"type": "array"}, "output": {"type": "object"},
                    "closed": {"type": "boolean"}}},
                "Submit": {"oneOf": [
                    {"type": "object", "required": ["image", "cmd"], "properties": {
                        "image": {"type": "string"}, "np": {"type": "integer", "minimum": 1},
                        "cmd": {"type": "array", "items": {"type": "string"}},
                        "name": {"type": "string"},
                        "nodes": {"oneOf": [{"type": "integer"}, {"type": "string"},
                                            {"type": "array", "items": {"type": "string"}}]},
                        "slots_per_node": {"type": "integer"}, "walltime": {"type": "string"},
                        "env": {"type": "object", "additionalProperties": {"type": "string"}},
                        "workdir": {"type": "string"}, "origin": origin_schema}},
                    {"type": "object", "required": ["mpijob"], "properties": {
                        "mpijob": {"type": "string", "description":
                                   "a Kubeflow MPIJob (kubeflow.org/v2beta1 or v1), as YAML"},
                        "image": {"type": "string", "description":
                                  "the approved image to run it in (else the one its "
                                  "manifest names by reference or digest)"}}}]},
            },
        },
        "security": [{"hubToken": []}],
        "paths": {
            "/whoami": {"get": op("who the API takes you for: user, account, uid, dir")},
            "/images": {"get": op("the approved images: the reference each is pinned to, "
                                  "whether jobs can run on it and why not, and what the "
                                  "nodes' probe found in it (MPI, launcher, python3, "
                                  "mpi4py, OS)")},
            "/jobs": {
                "get": op("your queued, starting and running jobs, oldest first (or those "
                          "in state; ended jobs: /history)", ok=page, errors=with_job,
                          params=[query("state", {"type": "string"}, "states, comma-separated"),
                                  *paging]),
                "post": {**op("queue a job", ok=record, errors=(400, 401, 403, 413, 429),
                              body={"required": True, "content": {"application/json": {
                                  "schema": {"$ref": "#/components/schemas/Submit"}}}}),
                         "responses": {"201": record, **{str(c): error for c in
                                                         (400, 401, 403, 413, 429)}}},
            },
            "/jobs/{job_id}": {"get": op("one of your jobs", ok=record, params=[job_id],
                                         errors=with_job)},
            "/jobs/{job_id}/logs": {"get": op(
                "the job's output: the last tail bytes, or from offset on",
                params=[job_id, query("stream", {"type": "string", "enum": ["stdout", "stderr"]},
                                      "which stream"),
                        query("tail", {"type": "integer"}, "bytes at most"),
                        query("offset", {"type": "integer"}, "read from this byte on")],
                errors=with_job)},
            "/jobs/{job_id}/cancel": {"post": op("cancel the job", ok=record, params=[job_id],
                                                 errors=with_job)},
            "/jobs/{job_id}/wait": {"get": op(
                "the record once the job has ended, or when timeout ran out", ok=record,
                params=[job_id, query("timeout", {"type": "number"}, "seconds, at most the "
                                      "site's limit")], errors=with_job)},
            "/history": {"get": op("your ended jobs, in submission order", ok=page,
                                   errors=with_job, params=[
                query("since", epoch, "from"), query("until", epoch, "to"),
                query("state", {"type": "string"}, "states, comma-separated"), *paging])},
            "/usage": {"get": op("your core-hours, fair-share standing and storage quota", params=[
                query("since", epoch, "from"), query("until", epoch, "to")])},
            "/events": {"get": op(
                "server-sent events of your jobs: state (a job record), and with job= that "
                "job's output and end",
                ok={"description": "text/event-stream"},
                params=[query("job", {"type": "string"}, "follow this job's output too")],
                errors=with_job)},
        },
    }


def make_app(site, functions, settings):
    """The tornado application of the API (importing tornado only here: a minion that
    loads this module's ``__virtual__`` needs none of it)."""
    import tornado.httpclient  # pylint: disable=import-outside-toplevel
    import tornado.iostream  # pylint: disable=import-outside-toplevel
    import tornado.web  # pylint: disable=import-outside-toplevel

    limits = settings.get("limits") if isinstance(settings.get("limits"), dict) else {}
    missing = [name for name in LIMITS if name not in limits]
    if missing:
        # The dockermpi.api state writes every limit (mpi:api:limits over the defaults):
        # a configuration without some is not one it wrote.
        raise ValueError(f"mpi_api: the engine's limits lack {', '.join(missing)}; the "
                         "dockermpi.api state writes every one (pillar mpi:api:limits over "
                         "salt/dockermpi/defaults.yaml)")
    if not dmpi.settings.is_encrypted_or_local(settings["hub_api_url"]):
        raise ValueError(f"mpi_api: hub_api_url {settings['hub_api_url']} is plain http to "
                         "another host: users' tokens would cross the network readable; "
                         "give the hub's https URL (pillar mpi:api:hub_api_url)")
    identity = HubIdentity(settings["hub_api_url"], settings.get("token_cache_seconds", 30),
                           tornado.httpclient.AsyncHTTPClient(), settings.get("hub_ca"))
    rate = RateLimiter(limits["requests_per_second"], limits["burst"])
    slots = Slots(limits["streams"])
    calls = Slots(CALLS_PER_USER, "calls in progress", "mpi_api CALLS_PER_USER",
                  "wait for one to end")
    jobs = Jobs(functions, int(settings.get("workers", 16)))
    listeners = Listeners(site, asyncio.get_event_loop())
    try:
        allowed = [ipaddress.ip_network(a, strict=False)
                   for a in settings.get("allowed_clients") or []]
    except (TypeError, ValueError) as exc:
        raise ValueError(f"mpi_api: allowed_clients must list IP addresses or networks: "
                         f"{exc}") from None
    if not allowed:
        # Fail closed: the proxy's host is the only client the API is meant to have.
        raise ValueError("mpi_api: allowed_clients is empty; name the hub host's address")
    body_limit = int(limits["body_bytes"])

    @tornado.web.stream_request_body
    class Handler(tornado.web.RequestHandler):
        """Every endpoint: the caller's host and token checked, their rate spent, a
        body read only up to the limit, every answer JSON."""

        needs_user = True
        hub_user = None
        user = None

        def __init_subclass__(cls, **kwargs):
            """Each endpoint's get and post refuse a body past the limit first."""
            super().__init_subclass__(**kwargs)
            for name in ("get", "post"):
                if name in cls.__dict__:
                    setattr(cls, name, _whole_body_first(cls.__dict__[name]))

        def initialize(self):
            self.chunks = []
            self.received = 0
            self.too_large = False

        def set_default_headers(self):
            self.set_header("Content-Type", "application/json")
            self.set_header("Cache-Control", "no-store")

        async def prepare(self):
            remote = ipaddress.ip_address(self.request.remote_ip or "0.0.0.0")
            if not any(remote in net for net in allowed):
                raise Refused(403, "this API is reached through the hub's proxy only")
            # A body is read in chunks and, past the limit, dropped: memory stays flat
            # whatever its size, and the caller gets 413 rather than a reset connection.
            self.request.connection.set_max_body_size(DISCARD_BYTES)
            if self.needs_user:
                self.hub_user = await identity.user(self._token())
                try:
                    self.user = dmpi.settings.user_for_identity(self.hub_user)
                except RequestError as exc:
                    raise Refused(403, str(exc)) from None
                rate.take(self.hub_user)

        def data_received(self, chunk):
            self.received += len(chunk)
            if self.received > body_limit:
                self.too_large = True
                self.chunks = []
            elif not self.too_large:
                self.chunks.append(chunk)

        def _token(self):
            header = self.request.headers.get("Authorization", "")
            kind, _, token = header.partition(" ")
            token = token.strip()
            if kind.lower() not in ("token", "bearer") or not token:
                raise Refused(401, "no JupyterHub token: send Authorization: token <token> "
                                   "(JUPYTERHUB_API_TOKEN in your server)")
            if not _TOKEN_RE.match(token):
                raise Refused(403, "the hub does not accept this token for the dockermpi "
                                   "service")
            return token

        def refuse_large_body(self):
            """The one place a body past the limit is refused: before every endpoint's
            method, once the whole body is in (see ``__init_subclass__``)."""
            if self.too_large:
                raise Refused(413, f"the request body is larger than {body_limit} bytes "
                                   "(mpi:api:limits:body_bytes)")

        def json_body(self):
            try:
                body = json.loads(b"".join(self.chunks) or b"{}")
            except ValueError:
                raise Refused(400, "the request body is not JSON") from None
            if not isinstance(body, dict):
                raise Refused(400, "the request body must be a JSON object")
            return body

        def number(self, name, default=None, kind=float):
            text = self.get_query_argument(name, None)
            if text in (None, ""):
                return default
            try:
                value = kind(text)
            except ValueError:
                raise Refused(400, f"{name} must be a number, got {text[:40]!r}") from None
            if isinstance(value, float) and not math.isfinite(value):
                raise Refused(400, f"{name} must be a finite number")
            return value

        def answer(self, value, status=200):
            self.set_status(status)
            self.finish(json.dumps(value, default=str))

        def write_error(self, status_code, **kwargs):
            exc = kwargs.get("exc_info", (None, None))[1]
            if isinstance(exc, Refused):
                for name, value in exc.headers.items():
                    self.set_header(name, value)
                body = dict(exc.body, error=str(exc), status=exc.status)
            elif isinstance(exc, tornado.web.HTTPError):
                body = {"error": exc.log_message or self._reason, "status": status_code}
            else:
                body = {"error": "the DockerMPI API failed on this call; the master's log "
                                 "says why", "status": status_code}
            self.set_header("Content-Type", "application/json")
            self.finish(json.dumps(body, default=str))

        def _handle_request_exception(self, e):
            if isinstance(e, Refused):
                if self._finished:
                    return
                self.send_error(e.status, exc_info=(type(e), e, None))
                return
            super()._handle_request_exception(e)

        async def page(self, fun, **kwargs):
            """``{"jobs": rows, "next": id}``: at most ``limit`` rows (the site's
            page_jobs), and the job id to ask ``after`` for the next page (None: the
            last page). One row more than asked for tells whether there is a next."""
            most = int(limits["page_jobs"])
            limit = self.number("limit", most, int)
            if not 1 <= limit <= most:
                raise Refused(400, f"limit must be between 1 and {most} jobs "
                                   "(mpi:api:limits:page_jobs); ask for the next page with "
                                   "after=<the last job id>")
            rows = await self.call(fun, limit=limit + 1,
                                   after=self.get_query_argument("after", None) or None,
                                   **kwargs)
            more = len(rows) > limit
            return {"jobs": rows[:limit], "next": rows[limit - 1]["job_id"] if more else None}

        async def call(self, fun, **kwargs):
            # The worker threads are shared: no user holds more than a few of them.
            calls.take(self.hub_user)
            try:
                return await jobs.call(self.hub_user, fun, **kwargs)
            finally:
                calls.give(self.hub_user)

    class OpenAPI(Handler):
        needs_user = False

        def get(self):
            self.answer(_openapi())

    class Whoami(Handler):
        async def get(self):
            self.answer(await self.call("whoami"))

    class Images(Handler):
        async def get(self):
            self.answer(await self.call("images"))

    class JobList(Handler):
        async def get(self):
            self.answer(await self.page("list", state=self.get_query_argument(
                "state", None) or LISTED_BY_DEFAULT))

        async def post(self):
            body = self.json_body()
            # A Kubeflow MPIJob ("mpijob": its YAML text), in "image" when named.
            fun, allowed_keys = ("submit_mpijob", {"mpijob", "image"}) if "mpijob" in body \
                else ("submit", {"image", "np", "cmd", "name", "nodes", "slots_per_node",
                                 "walltime", "env", "workdir", "origin"})
            unknown = sorted(set(body) - allowed_keys)
            if unknown:
                raise Refused(400, f"unknown job fields: {', '.join(unknown)[:200]} (known: "
                                   f"{', '.join(sorted(allowed_keys))})")
            self.answer(await self.call(fun, **body), status=201)

    class Job(Handler):
        async def get(self, job_id):
            self.answer(await self.call("status", job_id=job_id))

    class Logs(Handler):
        async def get(self, job_id):
            tail = self.number("tail", 65536, int)
            if not 1 <= tail <= int(limits["log_bytes"]):
                raise Refused(400, f"tail must be between 1 and {limits['log_bytes']} bytes "
                                   "(mpi:api:limits:log_bytes)")
            offset = self.number("offset", None, int)
            stream = self.get_query_argument("stream", "stdout")
            found = await self.call("logs", job_id=job_id, stream=stream, tail=tail,
                                    offset=offset)
            self.answer(found if isinstance(found, dict) else {"data": found})

    class Cancel(Handler):
        async def post(self, job_id):
            self.answer(await self.call("cancel", job_id=job_id))

    async def until_final(user, job_id, queue, seconds):
        """The job's record once it has ended, or the latest when ``seconds`` ran out."""
        deadline = time.monotonic() + seconds
        record = await jobs.call(user, "status", job_id=job_id)
        while record.get("state") not in FINAL:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                # Events make this prompt; reading the record every 5 s makes it certain.
                event = await asyncio.wait_for(queue.get(), min(left, 5))
                if event.get("job_id") != job_id and not getattr(queue, "overflowed", False):
                    continue
            except asyncio.TimeoutError:
                pass
            record = await jobs.call(user, "status", job_id=job_id)
        return record

    class Wait(Handler):
        async def get(self, job_id):
            most = float(limits["wait_seconds"])
            # Longer asks get the site's longest wait (mpi:api:limits:wait_seconds): the
            # caller sees the job still running and waits again.
            seconds = min(self.number("timeout", most), most)
            if seconds < 0:
                raise Refused(400, "timeout must be 0 or more seconds")
            slots.take(self.hub_user)
            queue = asyncio.Queue(STREAM_QUEUE)
            listeners.add(self.user, queue)
            try:
                self.answer(await until_final(self.hub_user, job_id, queue, seconds))
            finally:
                listeners.discard(self.user, queue)
                slots.give(self.hub_user)

    class History(Handler):
        async def get(self):
            self.answer(await self.page(
                "history", since=self.number("since"), until=self.number("until"),
                state=self.get_query_argument("state", None)))

    class Usage(Handler):
        async def get(self):
            self.answer(await self.call("usage", since=self.number("since"),
                                        until=self.number("until")))

    class Events(Handler):
        closed = False

        def on_connection_close(self):
            self.closed = True

        async def send(self, kind, data):
            self.write(f"event: {kind}\ndata: {json.dumps(data, default=str)}\n\n")
            await self.flush()

        async def get(self):
            job_id = self.get_query_argument("job", None)
            first = await self.call("status", job_id=job_id) if job_id else None
            slots.take(self.hub_user)
            queue = asyncio.Queue(STREAM_QUEUE)
            listeners.add(self.user, queue)
            try:
                self.set_header("Content-Type", "text/event-stream")
                self.set_header("X-Accel-Buffering", "no")
                await self.flush()
                if job_id:
                    await self.follow(first, queue)
                else:
                    await self.relay(queue)
            except tornado.iostream.StreamClosedError:
                pass
            finally:
                listeners.discard(self.user, queue)
                slots.give(self.hub_user)
            if not self._finished:
                self.finish()

        async def relay(self, queue):
            while not self.closed:
                try:
                    record = await asyncio.wait_for(queue.get(), KEEPALIVE)
                except asyncio.TimeoutError:
                    self.write(": keepalive\n\n")
                    await self.flush()
                    continue
                if getattr(queue, "overflowed", False):
                    return
                await self.send("state", record)

        async def follow(self, record, queue):
            job_id = record["job_id"]
            offsets = {"stdout": 0, "stderr": 0}
            rest = {stream: 0 for stream in offsets}  # rounds a quiet stream sits out
            skip = dict(rest)
            await self.send("state", record)
            shown = (record["state"], record.get("closed"))
            last_write = time.monotonic()
            while not self.closed:
                ended = record["state"] in FINAL
                if ended or record["state"] in ("starting", "running"):
                    for stream in offsets:
                        if skip[stream] and not ended:
                            skip[stream] -= 1
                            continue
                        after = await self.copy(job_id, stream, offsets[stream], ended)
                        rest[stream] = 0 if after > offsets[stream] else \
                            min(rest[stream] + 1, FOLLOW_QUIET_ROUNDS)
                        skip[stream], offsets[stream] = rest[stream], after
                if ended:
                    await self.send("end", record)
                    return
                try:
                    await asyncio.wait_for(queue.get(), FOLLOW_POLL)
                    if getattr(queue, "overflowed", False):
                        return
                except asyncio.TimeoutError:
                    pass
                record = await self.call("status", job_id=job_id)
                if (record["state"], record.get("closed")) != shown:
                    shown = (record["state"], record.get("closed"))
                    await self.send("state", record)
                    last_write = time.monotonic()
                elif time.monotonic() - last_write > KEEPALIVE:
                    self.write(": keepalive\n\n")
                    await self.flush()
                    last_write = time.monotonic()

        async def copy(self, job_id, stream, offset, ended):
            """Send the job's output from ``offset`` on; the next offset."""
            while True:
                try:
                    chunk = await self.call("logs", job_id=job_id, stream=stream,
                                            offset=offset, tail=FOLLOW_CHUNK)
                except Refused:
                    return offset  # no output file yet, or the node is not reporting
                data, after = chunk.get("data") or "", int(chunk.get("offset", offset))
                if data:
                    await self.send("output", {"job_id": job_id, "stream": stream,
                                               "data": data, "offset": after})
                if after - offset < FOLLOW_CHUNK - 3 or self.closed:
                    return after
                offset = after

    class NotFound(Handler):
        needs_user = False

        def prepare(self):
            raise Refused(404, f"no such endpoint: {self.request.path[:200]}")

    base = f"{PREFIX}/api/v1"
    routes = [
        (f"{base}/openapi.json", OpenAPI),
        (f"{base}/whoami", Whoami),
        (f"{base}/images", Images),
        (f"{base}/jobs", JobList),
        (f"{base}/jobs/{_JOB_ID}", Job),
        (f"{base}/jobs/{_JOB_ID}/logs", Logs),
        (f"{base}/jobs/{_JOB_ID}/cancel", Cancel),
        (f"{base}/jobs/{_JOB_ID}/wait", Wait),
        (f"{base}/history", History),
        (f"{base}/usage", Usage),
        (f"{base}/events", Events),
    ]
    app = tornado.web.Application(routes, default_handler_class=NotFound,
                                  compress_response=False, xheaders=False)
    return app, listeners


def _whole_body_first(method):
    """``method`` (an endpoint's get or post), run only once the request body passed
    :meth:`Handler.refuse_large_body`."""

    @functools.wraps(method)
    def checked(self, *args, **kwargs):
        self.refuse_large_body()
        return method(self, *args, **kwargs)
    return checked


def _loaded(dunder):
    """The loader behind one of Salt's dunders (see ``mpi_master._loaded``)."""
    return dunder.value() if hasattr(dunder, "value") else dunder


def tls_context(cert, key, host):
    """The server side TLS of the API (None on loopback without a certificate)."""
    if not (cert and key):
        if dmpi.settings.is_loopback(host):
            return None
        raise ValueError(f"mpi_api: listening on {host} needs tls_cert and tls_key (pillar "
                         "mpi:api:tls): the hub's proxy sends users' tokens here")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    return context


def start(hub_api_url, port=8001, host="0.0.0.0", allowed_clients=None,
          token_cache_seconds=30, limits=None, workers=16, tls_cert=None, tls_key=None,
          hub_ca=None):
    """Serve the API until the master stops."""
    import tornado.httpserver  # pylint: disable=import-outside-toplevel

    ssl_options = tls_context(tls_cert, tls_key, host)
    site = Site(_loaded(__opts__))
    functions = {name: functools.partial(fun, site) for name, fun in user_calls.CALLS.items()}
    settings = {"hub_api_url": hub_api_url, "allowed_clients": allowed_clients,
                "token_cache_seconds": token_cache_seconds, "limits": limits,
                "workers": workers, "hub_ca": hub_ca}
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    app, listeners = make_app(site, functions, settings)
    threading.Thread(target=listeners.run, name="mpi-api-bus", daemon=True).start()
    server = tornado.httpserver.HTTPServer(app, max_body_size=DISCARD_BYTES,
                                           max_buffer_size=1 << 20,
                                           idle_connection_timeout=3600,
                                           ssl_options=ssl_options)
    server.listen(int(port), address=host)
    log.info("DockerMPI user API listening on %s:%s (%s)", host, port,
             "TLS" if ssl_options else "plain HTTP, loopback")
    loop.run_forever()
