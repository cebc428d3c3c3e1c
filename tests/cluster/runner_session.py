"""A long-lived Salt ``RunnerClient`` and ``LocalClient`` in the test cluster's master.

A ``salt-run`` or ``salt`` process costs about 0.7 s of CPU before it does anything
(imports, configuration, module loading). Tests that poll and benchmarks that time the
runner call the same functions through one long-lived Python process instead, the way
the master's API engine holds them: modules loaded once, one JSON request per line in,
one JSON answer per line out. A runner call's arguments are the strings ``salt-run``
would be given, read back by Salt's own parser, and its exit code is the one
``salt-run`` would exit with.
"""

import json
import os
import selectors
import subprocess
import time

MASTER_PYTHON = "/opt/saltstack/salt/bin/python3"  # the Python that has Salt on the master

_PROGRAM = r"""
import json, sys, time, traceback
import salt.client, salt.config, salt.runner, salt.utils.event
opts = salt.config.master_config("/etc/salt/master")
runner = salt.runner.RunnerClient(opts)
local = salt.client.LocalClient(mopts=opts)
runner.functions["mpi.status"]  # loads the runner modules before the first timed call
print(json.dumps({"ready": True}), flush=True)


def exit_code(data):
    # What salt-run exits with for this full return (salt/cli/run.py).
    ret = data
    if isinstance(ret, dict) and "return" in ret and "retcode" not in ret:
        ret = ret["return"]
    if isinstance(ret, dict) and isinstance(ret.get("retcode"), int):
        return ret["retcode"]
    return 0


def closed(job_id, timeout):
    # The job's record once its clean-up is done: the controller's "closed" event wakes
    # this (a status read after subscribing catches one that came before), never a poll.
    deadline = time.monotonic() + timeout
    tag = f"mpi/job/{job_id}/closed"
    with salt.utils.event.get_master_event(opts, opts["sock_dir"], listen=True) as bus:
        bus.subscribe(tag)
        while True:
            job = runner.cmd("mpi.status", kwarg={"job_id": job_id}, pub_data={"user": "root"},
                             print_event=False)
            left = deadline - time.monotonic()
            if not isinstance(job, dict) or job.get("closed") or left <= 0:
                return job
            bus.get_event(wait=min(left, 5), tag=tag)


for line in sys.stdin:
    request = json.loads(line)
    start = time.monotonic()
    answer = {}
    try:
        if "closed" in request:
            answer["ret"] = closed(request["closed"], request["timeout"])
        elif "targets" in request:
            answer["ret"] = local.cmd(request["targets"], request["fun"], tgt_type="list",
                                      timeout=request["timeout"])
        else:
            runner.context.pop("retcode", None)
            data = runner.cmd(request["fun"], arg=request.get("arg") or [],
                              kwarg=request.get("kwarg"), pub_data={"user": "root"},
                              print_event=False, full_return=True)
            answer["ret"], answer["retcode"] = data["return"], exit_code(data)
    except Exception:
        answer["exception"] = traceback.format_exc()[-3000:]
    answer["seconds"] = time.monotonic() - start
    print(json.dumps(answer, default=repr), flush=True)
"""


class SessionError(Exception):
    """The session failed a call: the function raised, the answer did not come in time,
    or the process is gone. A session that raised this is not used again."""


class RunnerSession:
    """The session process in ``container`` (the master's). One call at a time: open one
    session per parallel caller. ``send`` and ``answer`` split a call for callers that
    ask several sessions at once."""

    def __init__(self, container, start_timeout=120):
        self.container = container
        self.process = subprocess.Popen(
            ["docker", "exec", "-i", container, MASTER_PYTHON, "-c", _PROGRAM],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            bufsize=0)
        self._pending = b""
        if not self._answer("the session's start", start_timeout).get("ready"):
            self.close()
            raise SessionError(f"the runner session in {container} did not start")

    def alive(self):
        return self.process.poll() is None

    def run(self, fun, arg=(), kwarg=None, timeout=None):
        """``(exit code, return, seconds)`` of runner function ``fun`` as ``salt-run fun
        *arg`` gives them (``arg``: its command-line strings, ``key=value`` ones
        included); ``kwarg`` values go to the function as they are. ``timeout``: seconds,
        or None to wait as long as salt-run would."""
        self.send({"fun": fun, "arg": list(arg), "kwarg": kwarg or {}})
        answer = self.answer(fun, timeout)
        return answer["retcode"], answer["ret"], answer["seconds"]

    def local(self, targets, fun, timeout=10):
        """``{minion: return}`` of execution function ``fun`` (no arguments) on the
        minions ``targets`` (a list), each given ``timeout`` seconds as the salt command
        gives them; a minion that did not answer is missing."""
        self.send({"targets": list(targets), "fun": fun, "timeout": timeout})
        return self.answer(fun, timeout + 120)["ret"]

    def closed(self, job_id, timeout=60):
        """``mpi.status`` of job ``job_id`` once its clean-up is done (``closed``), woken
        by the job's ``closed`` event on the master's bus rather than by polling, so that
        waiting costs the master nothing; as it is when ``timeout`` seconds passed."""
        self.send({"closed": job_id, "timeout": timeout})
        return self.answer("waiting for the job to close", timeout + 60)["ret"]

    def send(self, request):
        """Ask for one call and return at once; :meth:`answer` waits for it."""
        try:
            self.process.stdin.write(json.dumps(request).encode() + b"\n")
        except OSError as exc:
            raise SessionError(f"the runner session in {self.container} is gone: "
                               f"{exc}") from exc

    def answer(self, fun, timeout=None):
        """The answer to the call :meth:`send` asked for (``ret``, ``retcode`` for a
        runner call, ``seconds`` it took in the master)."""
        answer = self._answer(fun, timeout)
        if "exception" in answer:
            raise SessionError(f"{fun} raised in the runner session: {answer['exception']}")
        return answer

    def _answer(self, fun, timeout):
        deadline = None if timeout is None else time.monotonic() + timeout
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            while b"\n" not in self._pending:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise SessionError(f"{fun} gave no answer in {timeout} s")
                if selector.select(left):
                    chunk = os.read(self.process.stdout.fileno(), 65536)
                    if not chunk:
                        raise SessionError(f"the runner session in {self.container} "
                                           f"exited ({self.process.poll()}) during {fun}")
                    self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        return json.loads(line)

    def close(self):
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
