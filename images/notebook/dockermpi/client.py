"""
Talk to DockerMPI's user API (v1, REST and server-sent events) as the JupyterHub user.

The API is the hub service ``dockermpi``, reached through the hub's proxy at
``DOCKERMPI_API_URL``. Every request carries ``Authorization: token
<JUPYTERHUB_API_TOKEN>`` and nothing else about the caller: the API asks the hub who the
token belongs to, so a token the hub revokes stops working at once and the client never
sends a user. Errors come back as ``{"error": "<one line>", "status": <code>}``; a 429
is waited out (its Retry-After, at most 30 s) and retried, up to 5 times in a row.

Following a job (``follow``, ``run``) reads the event stream ``GET /api/v1/events?job=ID``:
state changes, the job's output as it grows and, once the job has ended and all its
output was sent, its final record. A stream that breaks is reopened; the new one sends
the output again from the start, and what was already written is skipped by byte offset.
Only the standard library is used: the notebook image has no requests or sseclient.
"""

import http.client
import json
import os
import shlex
import ssl
import sys
import threading
import time
import urllib.parse

from dockermpi.render import FINAL_STATES, outcome_line, state_detail
from dockermpi.view import JobView, OutputTail, jupyter_shell, kernel_id, notebook_origin

STREAMS = ("stdout", "stderr")

API = "/api/v1"
HTTP_TIMEOUT = 30  # seconds for an answer, on top of how long a wait may take
WAIT_CALL_SECONDS = 60  # the API's longest wait per call; longer waits are several calls
RATE_LIMIT_RETRIES = 5  # 429s in a row waited out before giving up
RETRY_AFTER_CAP = 30  # seconds: a longer Retry-After is not waited out in full at once
STREAM_RETRIES = 5  # failed reopenings of an event stream in a row before giving up

TOKEN_REFUSED = (
    "the DockerMPI API refused your JupyterHub token (expired, revoked, or your user was "
    "removed): restart your server from the hub's control panel"
)


class DockerMPIError(Exception):
    """Anything that keeps a DockerMPI call from giving its answer."""


class APIUnreachableError(DockerMPIError):
    """The API could not be reached (refused, timed out, TLS failure, broken stream)."""


class TokenRefusedError(DockerMPIError):
    """The API refused the user's JupyterHub token (HTTP 401 or 403)."""


class APIError(DockerMPIError):
    """The API failed: an HTTP error other than a refusal, rate limited for too long,
    an answer that is not what the API promises."""


class RateLimitedError(APIError):
    """The API's rate limit refused the call more times in a row than are waited out."""


class JobError(DockerMPIError):
    """The master refused the request (HTTP 400 or 404): a rejected job, a bad argument,
    an unknown job id, ... The API's answer is in ``result``."""

    def __init__(self, message, result=None):
        super().__init__(message)
        self.result = result


def pause(seconds):
    """Sleep; one place for the client's waits (tests replace it)."""
    time.sleep(seconds)


def retry_after_seconds(value):
    """A 429's ``Retry-After`` (integer seconds) as how long to wait, capped."""
    try:
        seconds = int(value)
    except (TypeError, ValueError):
        seconds = 1  # absent or an HTTP date: wait a little rather than hammer the API
    return min(max(seconds, 0), RETRY_AFTER_CAP)


def error_body(text):
    """The JSON error body ``{"error": ..., "status": ...}`` of an HTTP error's answer
    ``text``, or None when it has none (an HTML page of the hub or its proxy, say)."""
    try:
        body = json.loads(text.decode("utf-8", "replace"))
    except ValueError:
        return None
    return body if isinstance(body, dict) and isinstance(body.get("error"), str) else None


def one_line(text, limit=300):
    """``text`` on one line, at most ``limit`` characters."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def api_tls_context(ca_file):
    """The TLS context that checks the API's certificate against ``ca_file`` (the
    system's CAs when None); APIUnreachableError when that file cannot be used."""
    try:
        return ssl.create_default_context(cafile=ca_file)
    except (OSError, ValueError) as error:  # a missing or unreadable CA file
        raise APIUnreachableError(f"cannot use DOCKERMPI_API_CA {ca_file}: {error}") from None


def unreachable_text(url, reason):
    """Why a call did not reach the API at ``url``."""
    return f"cannot reach the DockerMPI API at {url}: {reason or 'no reason given'}"


def query_string(params):
    """``?a=1&b=x`` of the parameters that are set (None left out, so the API's defaults
    apply); a list of states becomes the comma-separated list the API takes."""
    pairs = [(name, ",".join(value) if isinstance(value, (list, tuple)) else value)
             for name, value in params.items() if value is not None]
    return "?" + urllib.parse.urlencode(pairs) if pairs else ""


class Client:
    """A DockerMPI client for one JupyterHub user.

    Every argument defaults to the environment of a JupyterHub single-user server:
    ``DOCKERMPI_API_URL`` (``http://<hub>:8000/services/dockermpi``, http or https),
    ``DOCKERMPI_API_CA`` (a PEM file of the CA or certificate that signs the API's TLS
    certificate; system CAs when unset), ``DOCKERMPI_IMAGE`` (the approved image jobs
    run in by default) and ``JUPYTERHUB_API_TOKEN``. ``user`` (``JUPYTERHUB_USER``) is
    only for show: the API takes who you are from the token.
    """

    stream_idle_timeout = 45  # seconds without a byte before a stream counts as broken:
    # the API sends a keepalive every 15 s

    def __init__(self, url=None, user=None, token=None, ca_file=None, image=None):
        env = os.environ
        self.url = (url or env.get("DOCKERMPI_API_URL") or "").rstrip("/")
        self.user = user or env.get("JUPYTERHUB_USER")
        self.token = token or env.get("JUPYTERHUB_API_TOKEN")
        self.ca_file = ca_file or env.get("DOCKERMPI_API_CA") or None
        self.image = image or env.get("DOCKERMPI_IMAGE") or None
        missing = [name for name, value in (("DOCKERMPI_API_URL", self.url),
                                            ("JUPYTERHUB_API_TOKEN", self.token)) if not value]
        if missing:
            raise DockerMPIError(
                f"DockerMPI is not configured here: {', '.join(missing)} not set (the hub "
                "sets them in the servers it starts; outside one, set them yourself)"
            )
        self._tls = None
        self._local = threading.local()  # each thread's kept connection

    def __repr__(self):
        return f"Client(url={self.url!r}, user={self.user!r})"

    # --- transport -----------------------------------------------------------------
    def _tls_context(self):
        if self._tls is None:
            self._tls = api_tls_context(self.ca_file)
        return self._tls

    def _unreachable(self, reason):
        return unreachable_text(self.url, reason)

    def _new_connection(self, timeout):
        """A connection to the API, opened by its first request."""
        parts = urllib.parse.urlsplit(self.url)
        try:
            port = parts.port
        except ValueError as error:
            raise APIUnreachableError(self._unreachable(error)) from None
        if parts.scheme == "https":
            return http.client.HTTPSConnection(parts.hostname, port, timeout=timeout,
                                               context=self._tls_context())
        if parts.scheme == "http":
            return http.client.HTTPConnection(parts.hostname, port, timeout=timeout)
        raise APIUnreachableError(self._unreachable(
            "DOCKERMPI_API_URL must start with https:// or http://"))

    def _kept_connection(self, timeout, fresh):
        """This thread's connection to the API, kept open between calls: a notebook
        polling its jobs pays for one TLS handshake, not one per call (which costs the
        API, and every user waiting behind it, far more than the call itself). ``fresh``
        closes the kept one first."""
        kept = getattr(self._local, "connection", None)
        if kept is not None and (fresh or kept[0] != os.getpid()):
            kept[1].close()
            kept = None
        if kept is None:
            kept = (os.getpid(), self._new_connection(timeout))
            self._local.connection = kept
        kept[1].timeout = timeout
        if kept[1].sock is not None:
            kept[1].sock.settimeout(timeout)
        return kept[1]

    def close(self):
        """Close this thread's kept connection (it is opened again when needed)."""
        kept = getattr(self._local, "connection", None)
        if kept is not None:
            kept[1].close()
            self._local.connection = None

    def _exchange(self, method, path, params, data, headers, timeout, stream):
        """The API's answer (any status) to one request. A call goes on this thread's
        kept connection; a repeatable one (GET, cancel) that finds it closed by the other
        end is sent again once on a new one, while a submit always starts on a new
        connection, so it can never be sent twice. An event stream gets a connection of
        its own, handed to the answer."""
        target = urllib.parse.urlsplit(self.url).path + API + path + query_string(params or {})
        repeatable = method == "GET" or path.endswith("/cancel")
        for attempt in (0, 1):
            if stream:
                connection = self._new_connection(timeout)
                headers = dict(headers, Connection="close")
            else:
                connection = self._kept_connection(timeout, fresh=attempt > 0 or not repeatable)
            reused = connection.sock is not None
            try:
                connection.request(method, target, body=data, headers=headers)
                return connection.getresponse()
            except (http.client.RemoteDisconnected, ConnectionResetError,
                    BrokenPipeError) as error:
                connection.close()
                if not (reused and repeatable and attempt == 0):
                    raise APIUnreachableError(self._unreachable(error)) from None
            except (OSError, http.client.HTTPException) as error:  # refused, a timeout, TLS
                connection.close()
                raise APIUnreachableError(self._unreachable(error)) from None

    def open(self, method, path, params=None, body=None, timeout=HTTP_TIMEOUT,
             accept="application/json", stream=False):
        """The API's open answer to ``method path`` (a 2xx): HTTP errors raised as what
        they stand for, 429s waited out and retried. Read it whole (``call`` does) before
        the next call, or pass ``stream`` for an answer read for long."""
        what = f"{method} {API}{path}"
        headers = {"Authorization": f"token {self.token}", "Accept": accept}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        elif method == "POST":
            data = b""
        for attempt in range(RATE_LIMIT_RETRIES + 1):
            answer = self._exchange(method, path, params, data, headers, timeout, stream)
            if 200 <= answer.status < 300:
                return answer
            try:
                with answer:
                    text = answer.read()
            except (OSError, http.client.HTTPException) as error:
                raise APIUnreachableError(self._unreachable(error)) from None
            if answer.status != 429:
                raise self._http_error(what, answer.status, answer.reason, text)
            if attempt == RATE_LIMIT_RETRIES:
                raise RateLimitedError(
                    f"{what}: the DockerMPI API's rate limit refused "
                    f"{RATE_LIMIT_RETRIES + 1} requests in a row (HTTP 429); try "
                    "again later, or make fewer calls")
            pause(retry_after_seconds(answer.getheader("Retry-After")))

    @staticmethod
    def _http_error(what, status, reason, text):
        """The exception an HTTP error answer stands for."""
        body = error_body(text)
        said = one_line(body["error"]) if body else None
        if status in (401, 403):
            return TokenRefusedError(TOKEN_REFUSED + (f" (the API said: {said})" if said else ""))
        if status in (400, 404) and body:
            return JobError(said, body)
        # Without the API's JSON error the answer is the hub's or its proxy's: a 404 of a
        # DOCKERMPI_API_URL that names no service, say.
        return APIError(f"{what}: the DockerMPI API answered HTTP {status} {reason}"
                        + (f": {said}" if said else ""))

    def call(self, method, path, params=None, body=None, timeout=HTTP_TIMEOUT):
        """The API's JSON answer to ``method path``."""
        what = f"{method} {API}{path}"
        answer = self.open(method, path, params=params, body=body, timeout=timeout)
        try:
            with answer:
                text = answer.read()
        except (OSError, http.client.HTTPException) as error:
            self.close()
            raise APIUnreachableError(self._unreachable(error)) from None
        try:
            return json.loads(text)
        except ValueError:
            raise APIError(f"{what}: the DockerMPI API answered something else than JSON: "
                           f"{text[:200]!r}") from None

    def _field(self, path, answer, name):
        """``answer[name]`` of an answer that must have it."""
        if not isinstance(answer, dict) or name not in answer:
            raise APIError(f"GET {API}{path}: unexpected answer from the DockerMPI API "
                           f"(no {name!r}): {answer!r:.200}")
        return answer[name]

    @staticmethod
    def _job_path(job_id, action=""):
        return f"/jobs/{urllib.parse.quote(str(job_id), safe='')}" + (f"/{action}" if action
                                                                    else "")

    # --- the API's calls ---------------------------------------------------------------
    def whoami(self):
        """Who the master takes you for: user, account, uid, gid, dir, dir_in_job."""
        return self.call("GET", "/whoami")

    def images(self):
        """The approved images: name, reference, whether jobs can run on it
        (``runs_jobs``, ``why_no_jobs``) and what the nodes' probe found in it (MPI
        flavour, version and launcher, python3, mpi4py, OS)."""
        return self._field("/images", self.call("GET", "/images"), "images")

    def submit(self, cmd, np=1, image=None, name=None, nodes=None, slots_per_node=None,
               walltime=None, env=None, workdir=None, origin=None):
        """Queue a job and return its record (``job_id``, ``state: queued``, ...).

        cmd
            The program and its arguments: a list of words (no shell runs it); a string
            is split into words like a shell would.
        np
            Number of MPI ranks.
        image
            Approved image to run in; default ``DOCKERMPI_IMAGE``, this notebook's image.
        nodes
            A node count, a list of node names or one grain match (``G@rack:a``).
        walltime
            With its unit: ``90s``, ``30m``, ``2h``, ``1d``, ``MM:SS``, ``HH:MM:SS`` or
            ``D-HH:MM:SS`` (the master refuses a bare number).
        origin
            ``{"notebook": path, "cell": number}``: where the job came from (the
            ``%%mpi`` magic sends it), kept in its record.
        env
            ``{name: value}`` exported to every rank.
        workdir
            Working directory relative to your directory (``.`` is the directory
            itself); by default the job's own ``mpi-jobs/<job id>``.
        """
        if isinstance(cmd, str):
            cmd = shlex.split(cmd)
        image = image or self.image
        if not image:
            raise DockerMPIError("no image given and DOCKERMPI_IMAGE is not set")
        job = {"image": image, "np": np, "cmd": list(cmd), "name": name, "nodes": nodes,
               "slots_per_node": slots_per_node, "walltime": walltime, "env": env,
               "workdir": workdir, "origin": origin}
        # Unset fields stay out of the body: the master's defaults apply.
        return self.call("POST", "/jobs", body={k: v for k, v in job.items() if v is not None})

    def submit_mpijob(self, manifest, image=None):
        """Queue a Kubeflow MPI Operator job (``manifest``: the MPIJob's YAML text) and
        return its record. ``image``: the approved image to run it in (default: the one
        its manifest names by reference or digest). The master refuses, naming the
        field, whatever of it DockerMPI cannot honour."""
        body = {"mpijob": manifest}
        if image:
            body["image"] = image
        return self.call("POST", "/jobs", body=body)

    def status(self, job_id):
        """The job's record."""
        return self.call("GET", self._job_path(job_id))

    def list(self, state=None):
        """Queued and running jobs (or those in ``state``: one, comma-separated ones or a
        list), oldest first."""
        return self._pages("/jobs", {"state": state})

    def history(self, since=None, until=None, state=None):
        """Your ended jobs, in submission order; ``since``/``until`` in epoch seconds."""
        return self._pages("/history", {"since": since, "until": until, "state": state})

    def _pages(self, path, params):
        """Every row of a paged listing: its pages one after another (``next``)."""
        rows, after = [], None
        while True:
            answer = self.call("GET", path, dict(params, after=after))
            rows += self._field(path, answer, "jobs")
            following = answer.get("next")
            if not following or following == after:
                return rows
            after = following

    def usage(self, since=None, until=None):
        """Your usage between ``since`` and ``until`` (epoch seconds), as the master
        counts it."""
        return self.call("GET", "/usage", {"since": since, "until": until})

    def logs(self, job_id, stream="stdout", offset=None, tail=None):
        """The job's output: the last ``tail`` bytes as text, or with ``offset`` at most
        ``tail`` bytes from there as ``{"data": text, "offset": where to read next}``."""
        path = self._job_path(job_id, "logs")
        answer = self.call("GET", path, {"stream": stream, "tail": tail, "offset": offset})
        return answer if offset is not None else self._field(path, answer, "data")

    def cancel(self, job_id):
        """Cancel a job (queued or running) and return its record."""
        return self.call("POST", self._job_path(job_id, "cancel"), timeout=HTTP_TIMEOUT * 2)

    def wait(self, job_id, timeout=None):
        """Wait until the job has ended (at most ``timeout`` seconds, None for as long as
        it takes) and return its record; its ``state`` is still queued or running when
        the time ran out."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            chunk = WAIT_CALL_SECONDS
            if deadline is not None:
                chunk = max(0, min(chunk, deadline - time.monotonic()))
            record = self.call("GET", self._job_path(job_id, "wait"), {"timeout": chunk},
                               timeout=chunk + HTTP_TIMEOUT)
            if record.get("state") in FINAL_STATES:
                return record
            if deadline is not None and time.monotonic() >= deadline:
                return record

    def run(self, cmd, np=1, poll=1.0, out=None, err=None, **submit_args):
        """Submit a job, show its state changes and live output, and return its final
        record. Interrupting (Ctrl-C, or the notebook's stop button) cancels the job.

        Output goes to ``out`` (stdout) and ``err`` (stderr and progress), by default
        this process's. In a Jupyter kernel, with neither given, the cell shows the job
        instead (dockermpi.view: its state ticking against the walltime, a Cancel button,
        the output under it), and the job's record names the notebook and cell.
        """
        shell = jupyter_shell() if out is None and err is None else None
        if shell is not None:
            submit_args.setdefault("origin", notebook_origin(shell))
            return self._run_in_cell(cmd, np, poll, submit_args)
        out = out or sys.stdout
        err = err or sys.stderr
        record = self.submit(cmd, np=np, **submit_args)
        job_id = record["job_id"]
        try:
            record = self.follow(job_id, poll=poll, out=out, err=err, first=record)
        except KeyboardInterrupt:
            print(f"mpi: interrupted: cancelling job {job_id}", file=err, flush=True)
            record = self.cancel(job_id)
            print(f"mpi: job {job_id} {record.get('state')}", file=err, flush=True)
            raise
        print(outcome_line(record), file=err, flush=True)
        return record

    def _run_in_cell(self, cmd, np, poll, submit_args):
        """``run`` in a Jupyter kernel: the job's view in the cell (view.JobView)."""
        record = self.submit(cmd, np=np, **submit_args)
        return JobView(OutputTail(), rich=True, kernel=kernel_id()).follow(self, record, poll)

    def follow(self, job_id, poll=1.0, out=None, err=None, first=None, streams=STREAMS,
               progress=None, on_state=None):
        """Print the job's state changes (to ``progress``, default ``err``) and its
        ``streams`` as they grow (stdout to ``out``, stderr to ``err``), until the job has
        ended; return the final record. ``on_state``, if given, takes each state record
        instead of the state lines being printed.

        Reads the job's event stream; when it breaks (a reset, ``stream_idle_timeout``
        seconds without a byte, closed before the job's end), it is reopened after
        ``poll`` seconds; after STREAM_RETRIES reopenings in a row that bring no event,
        the last failure is raised. ``first`` is a record of the job already at hand
        (``run`` passes the submit's), shown at once.
        """
        follower = _Follower(job_id, {"stdout": out or sys.stdout, "stderr": err or sys.stderr},
                             streams, progress or err or sys.stderr, on_state)
        if first:
            follower.show_state(first)
        failures = 0
        while True:
            try:
                with self.open("GET", "/events", {"job": job_id},
                               timeout=self.stream_idle_timeout,
                               accept="text/event-stream", stream=True) as stream:
                    kind = stream.headers.get_content_type()
                    if kind != "text/event-stream":
                        raise APIError(f"GET {API}/events: the DockerMPI API answered {kind}, "
                                       "not an event stream")
                    for event, data in sse_events(stream):
                        failures = 0
                        final = follower.take(event, data)
                        if final is not None:
                            return final
                broken = APIUnreachableError("the API closed it before the job's end")
            except RateLimitedError:
                raise  # already waited out for a while: more tries would only add to it
            except (APIUnreachableError, APIError) as error:
                broken = error
            except (OSError, http.client.HTTPException) as error:  # a reset, an idle timeout
                broken = APIUnreachableError(one_line(f"{type(error).__name__}: {error}"))
            failures += 1
            if failures > STREAM_RETRIES:
                raise type(broken)(f"cannot follow job {job_id}: its event stream failed "
                                   f"{failures} times in a row: {broken}")
            pause(poll)


def sse_events(lines):
    """The (event, data) pairs of a server-sent event stream read from ``lines`` (an
    open HTTP answer), as the stream sends them. Comments (``: keepalive``) and fields
    other than ``event`` and ``data`` are skipped; an event cut off by the stream's end
    is dropped, not given half."""
    event, data = "message", []
    for raw in lines:
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if not line:
            if data:
                yield event, "\n".join(data)
            event, data = "message", []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "event":
            event = value
        elif field == "data":
            data.append(value)


class _Follower:
    """What ``Client.follow`` has shown of one job: the last state printed and, per
    stream, how many bytes of output were written, so that the output a reopened stream
    sends again from offset 0 is written once."""

    def __init__(self, job_id, sinks, streams, progress, on_state=None):
        self.job_id = job_id
        self.sinks = sinks
        self.streams = streams
        self.progress = progress
        self.on_state = on_state
        self.written = dict.fromkeys(STREAMS, 0)
        self.shown_state = None

    def show_state(self, record):
        """A line for each new state, and for a queued job each new reason or place
        (or every state record to ``on_state``)."""
        if self.on_state is not None:
            self.on_state(record)
            return
        shown = (record.get("state"), state_detail(record))
        if shown != self.shown_state:
            self.shown_state = shown
            print(f"mpi: job {self.job_id} {shown[0]}{shown[1]}", file=self.progress,
                  flush=True)

    def take(self, event, data):
        """Act on one event; the final record once the job's ``end`` came."""
        try:
            payload = json.loads(data)
        except ValueError:
            raise APIError(f"the event stream of job {self.job_id} sent {event} data that is "
                           f"not JSON: {data[:200]!r}") from None
        if not isinstance(payload, dict) or payload.get("job_id", self.job_id) != self.job_id:
            return None
        if event == "state":
            self.show_state(payload)
        elif event == "output":
            self.write_output(payload)
        elif event == "end":
            self.show_state(payload)  # in case the stream's last state event was missed
            return payload
        return None

    def write_output(self, event):
        stream = event.get("stream")
        if stream not in self.streams:
            return
        data = (event.get("data") or "").encode("utf-8")
        end = int(event.get("offset", self.written[stream] + len(data)))
        start = end - len(data)
        # Bytes below what was written came before, on a stream that broke since.
        new = data[max(0, self.written[stream] - start):]
        if not new:
            return
        sink = self.sinks[stream]
        sink.write(new.decode("utf-8", "replace"))
        sink.flush()
        self.written[stream] = end
