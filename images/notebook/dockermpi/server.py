"""
The DockerMPI side panel's way to the user API: a Jupyter Server extension in the user's
own notebook server.

The panel runs in the browser, and the browser must never hold the user's JupyterHub
token. So the panel calls this server, ``<base_url>dockermpi/api/v1/<path>``, where
jupyter_server lets through only the server's own logged-in user (and checks XSRF on
POSTs), and the call goes on from here to ``DOCKERMPI_API_URL`` with the server's
``JUPYTERHUB_API_TOKEN``: only the calls the panel needs (``ALLOWED``), none of the
browser's headers but Content-Type and Accept, and back only the answer's status, JSON
body, Content-Type and Retry-After.

The API lets a user hold 4 event streams at once, and a user may have many tabs open.
So the all-jobs stream (``events`` without ``job``) is opened once per server and shared
by every tab (``EventFanOut``); a tab that falls too far behind is cut off rather than
let it hold up the others or fill memory. A job's own stream (``events?job=ID``) is
passed through on a connection of its own, closed as soon as its tab goes away.

``<base_url>dockermpi/settings`` tells the panel how often it may poll.
"""

import asyncio
import collections
import datetime
import json
import os
import re
import urllib.parse

from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import httpclient, httputil, iostream, tcpclient, web
from tornado.http1connection import HTTP1Connection, HTTP1ConnectionParameters

from dockermpi.client import (APIUnreachableError, api_tls_context, one_line,
                              retry_after_seconds, unreachable_text)

API_ROUTE = "dockermpi/api/v1/"
SETTINGS_ROUTE = "dockermpi/settings"
JOB_ID = re.compile(r"[0-9]{8}-[0-9]{6}-[0-9a-f]{6}")  # dmpi.contract.JOB_ID_PATTERN
ALLOWED = {
    "GET": re.compile(rf"whoami|images|jobs|jobs/{JOB_ID.pattern}|jobs/{JOB_ID.pattern}/logs"
                      r"|history|usage|events"),
    "POST": re.compile(rf"jobs|jobs/{JOB_ID.pattern}/cancel"),
}
# jupyter_server's own query arguments: the browser's credentials, never the API's.
DROPPED_QUERY_ARGUMENTS = ("token", "_xsrf")

BODY_LIMIT = 1 << 20  # bytes of a request body, the API's own default limit
ANSWER_LIMIT = 64 << 20  # bytes of an answer (a 1 MiB log tail as JSON is at most ~6 MiB)
ERROR_BODY_LIMIT = 64 << 10  # bytes kept of a refused event stream's answer
STREAM_BODY_LIMIT = 1 << 62  # a stream lives long: tornado's 100 MB default would end it
CONNECT_TIMEOUT = 10  # seconds to connect to the API, TLS included
REQUEST_TIMEOUT = 60  # seconds for an answer; a cancel waits up to 15 s for the controller
KEEPALIVE_SECONDS = 15  # a tab gets at least a comment this often, like the API's streams
IDLE_SECONDS = 45  # an upstream stream without a byte this long is broken (3 keepalives)
LINGER_SECONDS = 5  # the shared stream outlives its last tab this long (a page reload)
MAX_BEHIND = 1000  # events a tab may be behind before it is cut off, as the API cuts
MAX_EVENT_BYTES = 4 << 20  # a longer event means the stream is not what the API sends
BACKOFF_FIRST = 1  # seconds before reopening a broken shared stream, doubling ...
BACKOFF_MAX = 60  # ... up to this
REFRESH_DEFAULT, REFRESH_MIN, REFRESH_MAX = 30, 5, 3600
KEEPALIVE = b": keepalive\n\n"


class ProxyError(Exception):
    """An answer in the API's error shape given by this server: the call never reaches the
    API (refused, unconfigured) or the API could not be reached."""

    def __init__(self, status, error):
        super().__init__(error)
        self.status, self.error = status, error


def error_json(status, error):
    """The API's error body: ``{"error": ..., "status": ...}``."""
    return json.dumps({"error": error, "status": status}).encode()


def refresh_seconds(environ, log):
    """How often the panel may poll: ``DOCKERMPI_REFRESH_SECONDS``, a whole number from 5
    to 3600; anything else is logged and the default used."""
    text = (environ.get("DOCKERMPI_REFRESH_SECONDS") or "").strip()
    if not text:
        return REFRESH_DEFAULT
    try:
        seconds = int(text)
    except ValueError:
        seconds = None
    if seconds is None or not REFRESH_MIN <= seconds <= REFRESH_MAX:
        log.warning("DockerMPI: DOCKERMPI_REFRESH_SECONDS=%r is not a whole number of "
                    "seconds from %d to %d; the panel refreshes every %d s", text,
                    REFRESH_MIN, REFRESH_MAX, REFRESH_DEFAULT)
        return REFRESH_DEFAULT
    return seconds


class Upstream:
    """The API as this server reaches it: its URL, the server's token, its CA, and the
    forwarding of plain (not streamed) calls."""

    def __init__(self, environ):
        self.url = (environ.get("DOCKERMPI_API_URL") or "").rstrip("/")
        self.token = environ.get("JUPYTERHUB_API_TOKEN") or ""
        self.ca_file = environ.get("DOCKERMPI_API_CA") or None
        self.missing = [name for name, value in (("DOCKERMPI_API_URL", self.url),
                                                 ("JUPYTERHUB_API_TOKEN", self.token))
                        if not value]
        self.parts = urllib.parse.urlsplit(self.url)
        self.tcp = tcpclient.TCPClient()
        self._tls = None
        self._http = None

    def check(self):
        """Refuse (503) when this server is not set up to reach the API."""
        if self.missing:
            raise ProxyError(503, f"DockerMPI is not configured in this server: "
                                  f"{', '.join(self.missing)} not set (the hub sets them in "
                                  "the servers it starts)")
        try:
            self.parts.port
        except ValueError:
            valid = False
        else:
            valid = self.parts.scheme in ("http", "https") and bool(self.parts.hostname)
        if not valid:
            raise ProxyError(503, "DOCKERMPI_API_URL must be an https:// or http:// URL, "
                                  f"not {self.url!r}")

    def unreachable(self, reason):
        """The 502 for a call that could not reach the API, naming it and why."""
        return ProxyError(502, unreachable_text(self.url, reason))

    def tls_context(self):
        """The TLS context checking the API's certificate (None for http)."""
        if self.parts.scheme != "https":
            return None
        if self._tls is None:
            try:
                self._tls = api_tls_context(self.ca_file)
            except APIUnreachableError as error:
                raise self.unreachable(error) from None
        return self._tls

    def headers(self, accept, content_type=None):
        """The headers of a call: the server's token, and nothing of the browser's but
        what it accepts and, for a body, JSON."""
        headers = {"Authorization": f"token {self.token}", "Accept": accept}
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    def target(self, path, query):
        """The path and query of ``<base>/api/v1/<path>`` on the API's host."""
        return (f"{self.parts.path}/api/v1/{path}" + (f"?{query}" if query else ""))

    async def call(self, method, path, query, body, accept):
        """Forward one call; the API's answer as (status, headers, body)."""
        self.check()
        if self._http is None:
            # An instance of our own: its connection limit is not shared with the
            # server's other uses of AsyncHTTPClient.
            self._http = httpclient.AsyncHTTPClient(force_instance=True,
                                                    max_body_size=ANSWER_LIMIT)
        request = httpclient.HTTPRequest(
            f"{self.parts.scheme}://{self.parts.netloc}{self.target(path, query)}",
            method=method, headers=self.headers(accept, "application/json"
                                                if method == "POST" else None),
            body=body if method == "POST" else None, connect_timeout=CONNECT_TIMEOUT,
            request_timeout=REQUEST_TIMEOUT, follow_redirects=False,
            ssl_options=self.tls_context())
        try:
            response = await self._http.fetch(request, raise_error=False)
        except (OSError, httpclient.HTTPClientError, iostream.StreamClosedError,
                httputil.HTTPInputError) as error:
            raise self.unreachable(error) from None
        return response.code, response.headers, response.body or b""


def is_json(headers):
    """Whether an answer says its body is JSON."""
    content_type = headers.get("Content-Type", "").split(";")[0].strip().lower()
    return content_type == "application/json"


class EventStream(httputil.HTTPMessageDelegate):
    """One event stream of the API, on a connection of its own.

    Not AsyncHTTPClient: a fetch cannot be ended from outside, and a stream must end the
    moment its tab or its last subscriber goes, and after IDLE_SECONDS without a byte
    (the API sends a keepalive every 15 s, so a silent stream is a broken one).
    ``on_open(headers)`` is called when the API answers 200, ``on_data(bytes)`` with each
    piece of the stream after it; either may return an awaitable, which holds back the
    reading of the stream until it is done."""

    def __init__(self, upstream, query, on_open, on_data):
        self.upstream, self.query = upstream, query
        self.on_open, self.on_data = on_open, on_data
        self.status = None  # the API's answer's status, once it came
        self.headers = httputil.HTTPHeaders()
        self.error_body = bytearray()  # the body of an answer other than 200
        self.ended = False  # the API ended its answer itself
        self.broken = None  # why the stream ended otherwise
        self._closed = False
        self._iostream = None
        self._last_byte = 0.0
        self._watchdog = None

    def close(self, reason):
        """End the stream now; ``reason`` is why (the first one given is kept)."""
        if not self._closed:
            self._closed = True
            self.broken = self.broken or reason
            if self._iostream is not None:
                self._iostream.close()
            if self._watchdog is not None:
                self._watchdog.cancel()

    async def run(self):
        """Open the stream and read it until it ends; ProxyError if it cannot be opened."""
        upstream = self.upstream
        upstream.check()
        tls = upstream.tls_context()
        host = upstream.parts.hostname
        port = upstream.parts.port or (443 if tls else 80)
        try:
            stream = await upstream.tcp.connect(
                host, port, ssl_options=tls, max_buffer_size=MAX_EVENT_BYTES * 2,
                timeout=datetime.timedelta(seconds=CONNECT_TIMEOUT))
        except iostream.StreamClosedError as error:  # the TLS handshake failed
            raise upstream.unreachable(error.real_error or error) from None
        except (OSError, TimeoutError) as error:
            raise upstream.unreachable(error or "timed out connecting") from None
        if self._closed:  # given up while connecting
            stream.close()
            return
        self._iostream = stream
        self._touch()
        self._watch()
        connection = HTTP1Connection(stream, True, HTTP1ConnectionParameters(
            no_keep_alive=True, max_body_size=STREAM_BODY_LIMIT))
        headers = httputil.HTTPHeaders(upstream.headers("text/event-stream"))
        headers["Host"] = upstream.parts.netloc.rpartition("@")[2]
        headers["Connection"] = "close"
        try:
            connection.write_headers(httputil.RequestStartLine(
                "GET", upstream.target("events", self.query), "HTTP/1.1"), headers)
            connection.finish()
            await connection.read_response(self)
        except iostream.StreamClosedError as error:
            if not self._closed:
                self.broken = f"the connection broke ({error.real_error or error})"
        finally:
            if not (self.ended or self._closed or self.broken):
                self.broken = "the API closed the connection" + (
                    "" if self.status else " without an answer")
            self.close(None)

    def _touch(self):
        self._last_byte = asyncio.get_running_loop().time()

    def _watch(self):
        loop = asyncio.get_running_loop()
        idle = loop.time() - self._last_byte
        if idle >= IDLE_SECONDS:
            self.close(f"no byte from the API in {IDLE_SECONDS} s")
        else:
            self._watchdog = loop.call_later(IDLE_SECONDS - idle, self._watch)

    # --- tornado's HTTPMessageDelegate ----------------------------------------------
    def headers_received(self, start_line, headers):
        """The API's answer began."""
        self._touch()
        self.status, self.headers = start_line.code, headers
        return self.on_open(headers) if self.status == 200 else None

    def data_received(self, chunk):
        """A piece of the answer: the stream's, or a refusal's body."""
        self._touch()
        if self.status == 200:
            return self.on_data(chunk)
        self.error_body += chunk[:ERROR_BODY_LIMIT - len(self.error_body)]
        return None

    def finish(self):
        """The API ended its answer."""
        self.ended = True

    def on_connection_close(self):
        """The connection closed before the answer's end."""
        if not self._closed:
            self.broken = self.broken or "the API closed the stream"


class Subscriber:
    """One tab's place in the shared stream: the events it has yet to be sent."""

    def __init__(self):
        self.events = collections.deque()
        self.closed = False
        self._ready = asyncio.Event()

    def offer(self, event):
        """Queue an event; False (and closed) when the tab is too far behind."""
        if self.closed:
            return False
        if len(self.events) >= MAX_BEHIND:
            self.close()
            return False
        self.events.append(event)
        self._ready.set()
        return True

    def close(self):
        """Take no more events; the tab's handler ends its stream."""
        self.closed = True
        self.events.clear()
        self._ready.set()

    async def next_events(self, timeout):
        """The queued events, waiting up to ``timeout`` for one: [] when none came,
        None once closed."""
        if not self.events and not self.closed:
            try:
                await asyncio.wait_for(self._ready.wait(), timeout)
            except asyncio.TimeoutError:
                pass
        self._ready.clear()
        if self.closed:
            return None
        events = list(self.events)
        self.events.clear()
        return events


class EventFanOut:
    """This server's one all-jobs event stream of the API, shared by all its tabs.

    Opened when the first tab subscribes, closed LINGER_SECONDS after the last one left,
    reopened with backoff (a 429's Retry-After) while any is subscribed. Events go to
    the tabs whole; the API's keepalives do not, each tab gets its own."""

    def __init__(self, upstream, log):
        self.upstream, self.log = upstream, log
        self.subscribers = {}  # Subscriber: how to hang up on its tab
        self._task = None
        self._stream = None
        self._linger = None
        self._stopping = False
        self._wake = asyncio.Event()
        self._partial = b""

    def subscribe(self, hang_up):
        """A new tab's Subscriber; ``hang_up()`` closes the tab's connection if it is cut
        off."""
        subscriber = Subscriber()
        self.subscribers[subscriber] = hang_up
        self._stopping = False
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._keep_open())
        return subscriber

    def unsubscribe(self, subscriber):
        """A tab went away (or was cut off)."""
        subscriber.close()
        self.subscribers.pop(subscriber, None)
        if not self.subscribers and self._linger is None:
            self._linger = asyncio.get_running_loop().call_later(LINGER_SECONDS,
                                                                 self._stop_if_unused)

    def _stop_if_unused(self):
        self._linger = None
        if not self.subscribers:
            self._stopping = True
            self._wake.set()
            if self._stream is not None:
                self._stream.close("no tab is subscribed any more")

    def _on_data(self, chunk):
        """Cut the stream into whole events and hand them to every tab."""
        events = (self._partial + chunk).replace(b"\r\n", b"\n").split(b"\n\n")
        self._partial = events.pop()
        for event in events:
            if event and not all(line.startswith(b":") for line in event.split(b"\n")):
                self._broadcast(event + b"\n\n")
        if len(self._partial) > MAX_EVENT_BYTES and self._stream is not None:
            self._stream.close(f"an event of over {MAX_EVENT_BYTES} bytes")

    def _broadcast(self, event):
        for subscriber, hang_up in list(self.subscribers.items()):
            if not subscriber.offer(event):
                self.log.warning("DockerMPI: cut off a tab more than %d events behind on "
                                 "the job event stream", MAX_BEHIND)
                self.unsubscribe(subscriber)
                hang_up()

    async def _keep_open(self):
        """Hold the stream open while any tab is subscribed (or lingers)."""
        delay = BACKOFF_FIRST
        while not self._stopping:
            self._partial = b""
            stream = self._stream = EventStream(self.upstream, "", lambda headers: None,
                                                self._on_data)
            started = asyncio.get_running_loop().time()
            try:
                await stream.run()
                why = stream.broken or "the API ended it"
            except ProxyError as error:
                why = error.error
            except Exception:  # a bug here must not end the stream for good
                self.log.exception("DockerMPI: the job event stream failed")
                why = "an error in this server"
            finally:
                self._stream = None
            if self._stopping:
                break
            lasted = asyncio.get_running_loop().time() - started
            if stream.status == 200 and lasted >= BACKOFF_MAX:
                delay = BACKOFF_FIRST  # it worked a good while: a new break, a short wait
            wait = delay
            if stream.status == 429 and "Retry-After" in stream.headers:
                wait = retry_after_seconds(stream.headers["Retry-After"])
            if stream.status not in (None, 200):
                why = f"the API answered {stream.status}: " + one_line(
                    bytes(stream.error_body).decode("utf-8", "replace"))
            self.log.warning("DockerMPI: the job event stream from %s ended (%s); "
                             "reopening it in %s s", self.upstream.url, why, wait)
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), wait)
            except asyncio.TimeoutError:
                pass
            delay = min(delay * 2, BACKOFF_MAX)


class Gateway:
    """What the extension's handlers share."""

    def __init__(self, environ, log, base_url):
        self.upstream = Upstream(environ)
        self.events = EventFanOut(self.upstream, log)
        self.api_prefix = url_path_join(base_url, API_ROUTE)
        self.settings = {"refresh_seconds": refresh_seconds(environ, log),
                         "user": environ.get("JUPYTERHUB_USER"), "jobs_dir": "mpi-jobs"}


class GatewayHandler(APIHandler):
    """A handler of the extension: refusals in the API's error shape."""

    def initialize(self, gateway):
        self.gateway = gateway

    def write_error(self, status_code, **kwargs):
        """jupyter_server's and tornado's refusals (403, ...) as the API gives its own."""
        error = kwargs.get("exc_info", (None, None, None))[1]
        message = httputil.responses.get(status_code, "Unknown")
        if isinstance(error, web.HTTPError) and error.log_message:
            message = error.log_message % error.args if error.args else error.log_message
        self.finish(error_json(status_code, message))


class ApiProxyHandler(GatewayHandler):
    """``<base_url>dockermpi/api/v1/<path>``: the panel's calls, forwarded as this server's
    user when ALLOWED, refused here otherwise."""

    def initialize(self, gateway):
        super().initialize(gateway)
        self._on_leave = None  # what ends the upstream side when the tab goes away

    @web.authenticated
    async def get(self, path):
        """Forward a GET (or follow an event stream)."""
        await self._forward("GET")

    @web.authenticated
    async def post(self, path):
        """Forward a POST."""
        await self._forward("POST")

    @web.authenticated
    def delete(self, path):
        """Other methods: refused, as the API refuses them."""
        self._answer_error(ProxyError(405, f"{self.request.method} is not allowed here"))

    put = patch = delete

    def on_connection_close(self):
        """The tab went away: end what its request holds open upstream."""
        if self._on_leave is not None:
            self._on_leave()

    async def _forward(self, method):
        upstream = self.gateway.upstream
        try:
            path = self._allowed_path(method)
            if path == "events":
                job_id = self.get_query_argument("job", "")
                if not job_id:
                    return await self._all_jobs_events()
                if not JOB_ID.fullmatch(job_id):
                    raise ProxyError(404, f"no such job: {one_line(job_id, 200)}")
                return await self._job_events(job_id)
            upstream.check()
            if len(self.request.body) > BODY_LIMIT:
                raise ProxyError(413, f"the request body is over {BODY_LIMIT} bytes")
            status, headers, body = await upstream.call(
                method, path, self._forwarded_query(), self.request.body,
                self.request.headers.get("Accept") or "application/json")
            self._answer(status, headers, body)
        except ProxyError as error:
            self._answer_error(error)

    def _allowed_path(self, method):
        """The API path asked for, if ALLOWED for ``method``; else 404 or 405. The raw
        path is checked, so nothing percent-encoded (``%2e%2e``, ``%2f``) gets through."""
        prefix = self.gateway.api_prefix
        path = self.request.path[len(prefix):] if self.request.path.startswith(prefix) else ""
        if ALLOWED[method].fullmatch(path):
            return path
        if any(allowed.fullmatch(path) for allowed in ALLOWED.values()):
            raise ProxyError(405, f"{method} is not allowed here")
        raise ProxyError(404, f"no such endpoint: {one_line(path, 200)}")

    def _forwarded_query(self):
        pairs = urllib.parse.parse_qsl(self.request.query, keep_blank_values=True)
        return urllib.parse.urlencode([(name, value) for name, value in pairs
                                       if name not in DROPPED_QUERY_ARGUMENTS])

    def _answer(self, status, headers, body):
        """Give the API's answer: its status, JSON body, Content-Type and Retry-After."""
        content_type = headers.get("Content-Type", "application/json")
        if not is_json(headers):  # a page of the hub or its proxy, say
            reason = (f"the DockerMPI API at {self.gateway.upstream.url} answered {status} "
                      "without a JSON body")
            if status < 400:
                raise ProxyError(502, reason)
            body, content_type = error_json(status, reason), "application/json"
        self.set_status(status)
        if headers.get("Retry-After"):
            self.set_header("Retry-After", headers["Retry-After"])
        self.set_header("Cache-Control", "no-store")
        self.finish(body, set_content_type=content_type)

    def _answer_error(self, error):
        self.set_status(error.status)
        self.set_header("Cache-Control", "no-store")
        self.finish(error_json(error.status, error.error))

    def _start_event_stream(self):
        self.set_status(200)
        self.set_header("Content-Type", "text/event-stream")
        self.set_header("Cache-Control", "no-store")
        self.set_header("X-Accel-Buffering", "no")  # no proxy on the way holds events back

    def _tab_is_gone(self):
        connection = self.request.connection.stream
        return connection is None or connection.closed()

    def _end_event_stream(self):
        if not self._tab_is_gone():
            self.finish(set_content_type="text/event-stream")

    async def _all_jobs_events(self):
        """The tab's share of the server's one all-jobs stream, with a keepalive at least
        every KEEPALIVE_SECONDS."""
        self.gateway.upstream.check()
        fan_out = self.gateway.events
        subscriber = fan_out.subscribe(hang_up=self.request.connection.close)
        self._on_leave = subscriber.close
        try:
            self._start_event_stream()
            await self.flush()
            while True:
                events = await subscriber.next_events(KEEPALIVE_SECONDS)
                if events is None:
                    break
                self.write(b"".join(events) if events else KEEPALIVE)
                await self.flush()
        except iostream.StreamClosedError:
            pass  # the tab went away, or was cut off
        finally:
            fan_out.unsubscribe(subscriber)
        self._end_event_stream()

    async def _job_events(self, job_id):
        """One job's stream, passed through as it comes; closed upstream when the tab
        goes away (seen at the latest when the API's next keepalive is passed on)."""
        stream = None

        async def pass_on(data=None):
            try:
                if data:
                    self.write(data)
                await self.flush()
            except iostream.StreamClosedError:
                stream.close("the tab went away")

        def opened(headers):
            self._start_event_stream()
            return pass_on()

        stream = EventStream(self.gateway.upstream, urllib.parse.urlencode({"job": job_id}),
                             opened, pass_on)
        self._on_leave = lambda: stream.close("the tab went away")
        await stream.run()
        if stream.status == 200:
            self._end_event_stream()
        elif stream.status is not None:
            self._answer(stream.status, stream.headers, bytes(stream.error_body))
        elif not self._tab_is_gone():
            raise self.gateway.upstream.unreachable(stream.broken)


class SettingsHandler(GatewayHandler):
    """``<base_url>dockermpi/settings``: what the panel needs to know of this server."""

    @web.authenticated
    def get(self):
        """The panel's settings: how often it may poll, the user, the jobs' directory."""
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(self.gateway.settings))


def _load_jupyter_server_extension(serverapp):
    """Add the panel's routes to the server (jupyter_server calls this at start)."""
    base_url = serverapp.web_app.settings["base_url"]
    gateway = Gateway(os.environ, serverapp.log, base_url)
    if gateway.upstream.missing:
        serverapp.log.warning("DockerMPI: %s not set; the panel's calls are answered 503",
                              ", ".join(gateway.upstream.missing))
    serverapp.web_app.add_handlers(".*$", [
        (url_path_join(base_url, API_ROUTE, "(.*)"), ApiProxyHandler, {"gateway": gateway}),
        (url_path_join(base_url, SETTINGS_ROUTE), SettingsHandler, {"gateway": gateway}),
    ])
    serverapp.log.info("DockerMPI: the panel's API is at %s, forwarded to %s",
                       gateway.api_prefix, gateway.upstream.url or "(not configured)")
