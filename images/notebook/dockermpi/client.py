"""
Talk to the DockerMPI master's salt-api (rest_cherrypy) as the JupyterHub user.

Every call is one ``POST {url}/run`` of a runner low chunk that carries the user's
JupyterHub name and API token (eauth ``jupyterhub``): no salt-api session is kept, so a
token the hub revokes stops working at once. The master takes the user's identity from
the token; the client never sends a ``user``.
"""

import json
import os
import re
import shlex
import ssl
import sys
import time
import urllib.error
import urllib.request
from html import unescape

from dockermpi.render import outcome_line

FINAL_STATES = ("succeeded", "failed", "cancelled", "timed_out")
ACTIVE_STATES = ("starting", "running")
STREAMS = ("stdout", "stderr")

# salt-api gives up on a runner call after the master's rest_timeout (300 s by
# default, answering 504), so long waits are made of shorter calls.
WAIT_CALL_SECONDS = 60
HTTP_TIMEOUT = 30  # seconds on top of how long the runner itself may take

TOKEN_REFUSED = (
    "the DockerMPI API refused your JupyterHub token (expired, revoked, or your user was "
    "removed): restart your server from the hub's control panel"
)


class DockerMPIError(Exception):
    """Anything that keeps a DockerMPI call from giving its answer."""


class APIUnreachableError(DockerMPIError):
    """The salt-api could not be reached (refused, timed out, TLS failure)."""


class TokenRefusedError(DockerMPIError):
    """salt-api refused the user's JupyterHub token (or its ACL refused the call)."""


class APIError(DockerMPIError):
    """salt-api or the runner failed: an HTTP error, an exception in the runner."""


class JobError(DockerMPIError):
    """The master refused the request: a rejected job, an unknown job id, ... The
    master's answer is in ``result``."""

    def __init__(self, message, result=None):
        super().__init__(message)
        self.result = result


def salt_api_result(fun, body):
    """The runner's result from a salt-api ``/run`` answer ``{"return": [result]}``,
    raising the error it stands for when the runner failed or refused."""
    try:
        result = body["return"][0]
    except (KeyError, IndexError, TypeError):
        raise APIError(f"{fun}: unexpected answer from the DockerMPI API: {body!r:.300}") from None
    if isinstance(result, str):
        # The runner raised: RunnerClient returns the traceback as text.
        if result.startswith("Exception occurred in runner "):
            last_line = result.strip().splitlines()[-1]
            raise APIError(f"{fun} failed on the master: {last_line}")
        if result.startswith("\nPassed invalid arguments: "):
            raise APIError(f"{fun} refused its arguments: {result.strip().splitlines()[0]}")
    if isinstance(result, dict) and ("error" in result or result.get("state") == "rejected"):
        error = result.get("error") or f"{fun} was rejected"
        raise JobError(str(error), result)
    return result


def http_error_message(error):
    """What an HTTP error page of salt-api says: cherrypy puts the message in <p>."""
    try:
        text = error.read().decode("utf-8", "replace")
    except OSError:
        text = ""
    try:
        body = json.loads(text)
        detail = body.get("return") if isinstance(body, dict) else None
    except ValueError:
        found = re.search(r"<p>(.*?)</p>", text, re.S)
        detail = unescape(found.group(1)).strip() if found else None
    return f"HTTP {error.code} {error.reason}" + (f": {detail}" if detail else "")


class Client:
    """A DockerMPI client for one JupyterHub user.

    Every argument defaults to the environment of a JupyterHub single-user server:
    ``DOCKERMPI_API_URL`` (``https://master:8000``), ``DOCKERMPI_API_CA`` (a PEM file of
    the CA or certificate that signs the API's TLS certificate; system CAs when unset),
    ``DOCKERMPI_IMAGE`` (the approved image jobs run in by default),
    ``JUPYTERHUB_USER`` and ``JUPYTERHUB_API_TOKEN``.
    """

    def __init__(self, url=None, user=None, token=None, ca_file=None, image=None):
        env = os.environ
        self.url = (url or env.get("DOCKERMPI_API_URL") or "").rstrip("/")
        self.user = user or env.get("JUPYTERHUB_USER")
        self.token = token or env.get("JUPYTERHUB_API_TOKEN")
        self.ca_file = ca_file or env.get("DOCKERMPI_API_CA") or None
        self.image = image or env.get("DOCKERMPI_IMAGE") or None
        missing = [name for name, value in (("DOCKERMPI_API_URL", self.url),
                                            ("JUPYTERHUB_USER", self.user),
                                            ("JUPYTERHUB_API_TOKEN", self.token)) if not value]
        if missing:
            raise DockerMPIError(
                f"DockerMPI is not configured here: {', '.join(missing)} not set (the hub "
                "sets them in the servers it starts; outside one, set them yourself)"
            )

    log_chunk = 65536  # bytes of output per mpi.logs call while following a job

    def __repr__(self):
        return f"Client(url={self.url!r}, user={self.user!r})"

    # --- transport -----------------------------------------------------------------
    def call(self, fun, http_timeout=HTTP_TIMEOUT, **kwarg):
        """Run the runner function ``mpi.<fun>`` with ``kwarg`` (None values left out,
        so the master's defaults apply) and return its result."""
        fun = f"mpi.{fun}"
        low = {
            "client": "runner",
            "fun": fun,
            "eauth": "jupyterhub",
            "username": self.user,
            "password": self.token,
            "kwarg": {k: v for k, v in kwarg.items() if v is not None},
        }
        request = urllib.request.Request(
            self.url + "/run",
            data=json.dumps([low]).encode(),
            headers={"Accept": "application/json", "Content-Type": "application/json"},
            method="POST",
        )
        try:
            context = ssl.create_default_context(cafile=self.ca_file)
            with urllib.request.urlopen(request, timeout=http_timeout, context=context) as answer:
                text = answer.read()
        except urllib.error.HTTPError as error:
            if error.code in (401, 403):
                raise TokenRefusedError(TOKEN_REFUSED) from None
            raise APIError(f"{fun}: the DockerMPI API answered {http_error_message(error)}") \
                from None
        except urllib.error.URLError as error:
            raise APIUnreachableError(self._unreachable(error.reason)) from None
        except (OSError, ValueError) as error:  # timeouts while reading, a bad CA file
            raise APIUnreachableError(self._unreachable(error)) from None
        try:
            body = json.loads(text)
        except ValueError:
            raise APIError(f"{fun}: the DockerMPI API answered something else than JSON: "
                           f"{text[:200]!r}") from None
        return salt_api_result(fun, body)

    def _unreachable(self, reason):
        return f"cannot reach the DockerMPI API at {self.url}: {reason or 'no reason given'}"

    # --- the runner's functions --------------------------------------------------------
    def whoami(self):
        """Who the master takes you for: user, account, uid, gid, dir, dir_in_job."""
        return self.call("whoami")

    def submit(self, cmd, np=1, image=None, name=None, nodes=None, slots_per_node=None,
               walltime=None, env=None, workdir=None):
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
        return self.call("submit", image=image, np=np, cmd=list(cmd), name=name, nodes=nodes,
                         slots_per_node=slots_per_node, walltime=walltime, env=env,
                         workdir=workdir)

    def status(self, job_id):
        """The job's record."""
        return self.call("status", job_id=job_id)

    def list(self, state=None):
        """Queued and running jobs (or those in ``state``), oldest first."""
        return self.call("list", state=state)

    def history(self, since=None, until=None, state=None):
        """Your ended jobs; ``since``/``until`` in epoch seconds."""
        return self.call("history", since=since, until=until, state=state)

    def logs(self, job_id, stream="stdout", offset=None, tail=None):
        """The job's output: the last ``tail`` bytes as text, or with ``offset`` at most
        ``tail`` bytes from there as ``{"data": text, "offset": where to read next}``."""
        return self.call("logs", job_id=job_id, stream=stream, offset=offset, tail=tail)

    def cancel(self, job_id):
        """Cancel a job (queued or running) and return its record."""
        return self.call("cancel", http_timeout=HTTP_TIMEOUT * 2, job_id=job_id)

    def wait(self, job_id, timeout=None):
        """Wait until the job has ended (at most ``timeout`` seconds) and return its
        record; its ``state`` is still queued or running when the time ran out."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            chunk = WAIT_CALL_SECONDS
            if deadline is not None:
                chunk = max(0, min(chunk, deadline - time.monotonic()))
            record = self.call("wait", http_timeout=chunk + HTTP_TIMEOUT, job_id=job_id,
                               timeout=chunk)
            if record.get("state") in FINAL_STATES:
                return record
            if deadline is not None and time.monotonic() >= deadline:
                return record

    def run(self, cmd, np=1, poll=1.0, out=None, err=None, **submit_args):
        """Submit a job, show its state changes and live output, and return its final
        record. Interrupting (Ctrl-C, or the notebook's stop button) cancels the job.

        Output goes to ``out`` (stdout) and ``err`` (stderr and progress), by default
        this process's: a notebook cell shows both.
        """
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

    def follow(self, job_id, poll=1.0, out=None, err=None, first=None, streams=STREAMS,
               progress=None):
        """Print the job's state changes (to ``progress``, default ``err``) and its
        ``streams`` as they grow (stdout to ``out``, stderr to ``err``), until the job has
        ended; return the final record."""
        out = out or sys.stdout
        err = err or sys.stderr
        progress = progress or err
        sinks = {"stdout": out, "stderr": err}
        offsets = dict.fromkeys(streams, 0)
        shown_state = None
        record = first or self.status(job_id)
        while True:
            state = record.get("state")
            if state != shown_state:
                shown_state = state
                why = record.get("waiting_for") or record.get("reason")
                print(f"mpi: job {job_id} {state}" + (f" ({why})" if why else ""),
                      file=progress, flush=True)
            ended = state in FINAL_STATES
            if ended or state in ACTIVE_STATES:
                for stream in streams:
                    offsets[stream] = self._copy_output(job_id, stream, offsets[stream],
                                                        sinks[stream], progress, ended)
            if ended:
                return record
            time.sleep(poll)
            record = self.status(job_id)

    def _copy_output(self, job_id, stream, offset, sink, progress, ended):
        """Copy the job's new output from ``offset`` on to ``sink``; the next offset."""
        while True:
            try:
                chunk = self.logs(job_id, stream=stream, offset=offset, tail=self.log_chunk)
            except JobError as error:
                # Before the first rank writes, there may be no output file yet.
                if ended:
                    print(f"mpi: cannot read the job's {stream}: {error}", file=progress,
                          flush=True)
                return offset
            data, next_offset = chunk.get("data") or "", chunk.get("offset", offset)
            if data:
                sink.write(data)
                sink.flush()
            # A short chunk means we caught up; the master keeps back up to 3 bytes of a
            # character cut at the chunk's end.
            if next_offset - offset < self.log_chunk - 3:
                return next_offset
            offset = next_offset
