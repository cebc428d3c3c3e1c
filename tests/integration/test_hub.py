"""JupyterHub users run MPI jobs from their own notebook, as themselves, through
DockerMPI's API (the hub's service ``dockermpi``) with the hub's own tokens; one hub user
(A, "ann.lee@example.org": a name with a dot and an @) attacks another (B, "bob") and B
comes through unharmed.

Everything here goes the way a user's does: real hub users and tokens from the real hub
on the hub host, the notebook container DockerSpawner started for them, the ``mpi``
command in it, the hub's proxy forwarding to the API on the master, the API asking the
hub whose token it is.
"""

import json
import re
import subprocess
import threading
import time
import urllib.request

import pytest

from tests.cluster.testcluster import (API_PUBLIC_URL, FILES, HUB_ADDR, MASTER_ADDR,
                                       STORAGE_ADDR, api_process, hub_admin_token)
import dmpi.settings

pytestmark = pytest.mark.cluster


ANN, BOB = "ann.lee@example.org", "bob"
STORAGE = "/srv/dockermpi/users"
API = "/api/v1"

#: One call of DockerMPI's API from inside a notebook, the way any program there could
#: make it: argv is method, path (after DOCKERMPI_API_URL), body ('' for none), token
#: ('' for the notebook's own, '-' for none), then extra headers as NAME=VALUE.
_API_CALL = r"""
import json, os, ssl, sys, urllib.error, urllib.request
CA = ssl.create_default_context(cafile=os.environ.get("DOCKERMPI_API_CA"))
method, path, body, token = sys.argv[1:5]
headers = dict(h.split("=", 1) for h in sys.argv[5:])
token = os.environ["JUPYTERHUB_API_TOKEN"] if token == "" else token
if token != "-":
    headers["Authorization"] = "token " + token
request = urllib.request.Request(os.environ["DOCKERMPI_API_URL"] + path, method=method,
                                 data=body.encode() if body else None, headers=headers)
try:
    with urllib.request.urlopen(request, timeout=120, context=CA) as answer:
        status, retry, text = answer.status, answer.headers.get("Retry-After"), answer.read()
except urllib.error.HTTPError as exc:
    status, retry, text = exc.code, exc.headers.get("Retry-After"), exc.read()
print(json.dumps({"status": status, "retry_after": retry}))
print(text.decode(errors="replace"))
"""


# --------------------------------------------------------------------------- helpers


def api(cluster, notebook_user, method, path, body=None, token="", headers=None):
    """(HTTP status, answer) of one API call from ``notebook_user``'s notebook, with its
    own token unless ``token`` is given (None: no token at all)."""
    argv = ["python3", "-c", _API_CALL, method, API + path,
            "" if body is None else json.dumps(body), "-" if token is None else token]
    argv += [f"{k}={v}" for k, v in (headers or {}).items()]
    code, output = cluster.notebook_exec(notebook_user, argv)
    assert code == 0, output
    head, _, text = output.partition("\n")
    status = json.loads(head)["status"]
    try:
        return status, json.loads(text)
    except json.JSONDecodeError:
        return status, text


def token_refused(status, answer):
    """The API's answer to a token it does not take from this caller."""
    return status == 403 and "does not accept this token" in answer["error"]


def until(condition, what, timeout=60):
    """Wait until ``condition()`` is true (at most ``timeout`` s: then fail, saying what
    was waited for); returns its value."""
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)
    return found


def mpi(cluster, user, *argv):
    """Run the notebook's ``mpi`` command as the user does; (exit code, output)."""
    return cluster.notebook_exec(user, ["mpi", *argv])


def mpi_json(cluster, user, *argv):
    """``mpi ... --json``: (exit code, the answer). Progress lines (``mpi run`` prints
    them on stderr, which docker exec hands back with stdout) come before the JSON."""
    # (--json right after the command: after the program, it would be the program's)
    code, output = mpi(cluster, user, argv[0], "--json", *argv[1:])
    # The answer starts on a line of its own ("{", "[" or "[]"); the job's output before
    # it may hold brackets too.
    found = re.search(r"^(\{|\[|\[\])$", output, re.MULTILINE)
    return code, json.JSONDecoder().raw_decode(output[found.start() if found else 0:])[0]


def account(cluster, user):
    code, found = mpi_json(cluster, user, "whoami")
    assert code == 0, found
    return found


@pytest.fixture(scope="module")
def notebooks(cluster):
    """Ann's and Bob's notebook servers, started by the hub as a user starts theirs."""
    started = {user: cluster.start_notebook(user) for user in (ANN, BOB)}
    yield started
    for user in started:
        cluster.stop_notebook(user)


# ------------------------------------------------------------------------------ runs


def test_a_user_runs_an_mpi4py_job_over_three_nodes_from_their_notebook(cluster, notebooks):
    me = account(cluster, ANN)
    assert me["user"] == ANN and me["account"] == dmpi.settings.user_for_identity(ANN)
    assert me["account"] != ANN  # a name with '.' and '@' gets a safe directory name
    program = (FILES / "pi.py").read_text()
    code, output = cluster.notebook_exec(
        ANN, ["python3", "-c", f"open('/data/pi.py', 'w').write({program!r})"])
    assert code == 0, output
    code, output = mpi(cluster, ANN, "run", "-n", "6", "-N", "3", "-J", "pi", "-t", "5",
                       "python3", "/data/pi.py")
    assert code == 0, output
    assert "pi ~= 3.14159" in output and "from 6 ranks on 3 hosts" in output, output
    assert "succeeded" in output, output  # the final line: state and exit code
    _, ended = mpi_json(cluster, ANN, "history")
    job = [j for j in ended if j["name"] == "pi"][-1]
    assert job["state"] == "succeeded" and job["exit_code"] == 0
    assert sorted(job["nodes"]) == cluster.nodes and job["core_hours"] > 0
    # The result is in Ann's directory, as Ann's uid, for her notebook to read.
    stdout = f"/data/mpi-jobs/{job['job_id']}/stdout"
    code, text = cluster.notebook_exec(ANN, ["cat", stdout])
    assert code == 0 and "pi ~= 3.14159" in text
    _, owner = cluster.exec("node1", ["stat", "-c", "%u", f"{STORAGE}/{me['account']}"
                                      f"/mpi-jobs/{job['job_id']}/stdout"])
    assert int(owner) == me["uid"]


def test_a_job_sees_its_id_name_ranks_and_nodes_like_slurm_jobs_do(cluster, notebooks):
    code, job = mpi_json(cluster, ANN, "run", "-n", "2", "-J", "envcheck", "/bin/sh", "-c",
                         'echo "$DMPI_JOB_ID $DMPI_JOB_NAME $DMPI_NTASKS $DMPI_NODELIST"; pwd')
    assert code == 0, job
    _, text = cluster.notebook_exec(ANN, ["cat", f"/data/mpi-jobs/{job['job_id']}/stdout"])
    first, cwd = text.splitlines()[0].split(), text.splitlines()[-1]
    assert first[:3] == [job["job_id"], "envcheck", "2"]
    assert set(first[3].split(",")) == set(job["placement"])
    assert cwd == f"/data/mpi-jobs/{job['job_id']}"  # its own directory, no one else's


#: Runs cells (argv[1]: JSON list of [code, interrupt_when]) in a real IPython kernel, as
#: JupyterLab does, and prints per cell what the kernel sent: its displays as last
#: updated (in the order first shown), its stream text and its error. A cell is
#: interrupted once one of its displays' text holds interrupt_when.
_RUN_CELLS = r"""
import json, sys, time
from jupyter_client.manager import start_new_kernel
manager, kernel = start_new_kernel(kernel_name="python3")
results = []
for code, interrupt_when in json.loads(sys.argv[1]):
    msg_id = kernel.execute(code)
    displays, said, order, text, error, interrupted = {}, {}, [], [], None, False
    deadline = time.monotonic() + 600
    while True:
        msg = kernel.get_iopub_msg(timeout=max(1, deadline - time.monotonic()))
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind in ("display_data", "update_display_data"):
            shown = content.get("transient", {}).get("display_id") or len(order)
            order += [] if shown in order else [shown]
            displays[shown] = content["data"]
            said.setdefault(shown, []).append(content["data"].get("text/plain", ""))
        elif kind == "stream":
            text.append(content["text"])
        elif kind == "error":
            error = {"ename": content["ename"], "traceback": content["traceback"]}
        elif kind == "status" and content["execution_state"] == "idle":
            break
        if interrupt_when and not interrupted and any(
                interrupt_when in d.get("text/plain", "") for d in displays.values()):
            manager.interrupt_kernel()
            interrupted = True
    results.append({"displays": [displays[d] for d in order], "said": [said[d] for d in order],
                    "text": "".join(text), "error": error})
manager.shutdown_kernel(now=True)
print("#cells " + json.dumps(results))  # the kernel's own warnings come on stderr too
"""


def run_cells(cluster, notebook, cells):
    """Ann's notebook's cells (``[code, interrupt when a display shows this]``) run in a
    real kernel in her container, as ``notebook``; what each cell showed (_RUN_CELLS)."""
    code, output = cluster.notebook_exec(
        ANN, ["python3", "-c", _RUN_CELLS, json.dumps(cells)],
        environment={"JPY_SESSION_NAME": notebook})
    assert code == 0, output
    found = [line for line in output.splitlines() if line.startswith("#cells ")]
    assert found, output
    return json.loads(found[0][len("#cells "):])


MAGIC_SUCCEEDS = """%%mpi -n 4 -N 2 --name magic-allreduce -o total,hosts
from mpi4py import MPI
import socket
comm = MPI.COMM_WORLD
print("rank", comm.rank, "of", comm.size)
total = comm.allreduce(comm.rank)
hosts = sorted(set(comm.allgather(socket.gethostname())))
"""
MAGIC_RANK_RAISES = """%%mpi -n 3 -t 5m --name magic-raises
from mpi4py import MPI
if MPI.COMM_WORLD.rank == 2:
    raise KeyError("rank two broke")
MPI.COMM_WORLD.Barrier()  # never passed: rank 2 does not come
"""
MAGIC_SLEEPS = """%%mpi -n 2 -t 5m --name magic-interrupted
import time
print("started", flush=True)
time.sleep(600)
"""


def test_a_notebook_cell_runs_as_an_mpi_job_under_the_mpi_magic(cluster, notebooks):
    ran, back, raised, interrupted = run_cells(
        cluster, "/data/work/magic.ipynb",
        [[MAGIC_SUCCEEDS, None], ["print('BACK', total, len(hosts))", None],
         [MAGIC_RANK_RAISES, None], [MAGIC_SLEEPS, "running"]])
    _, ended = mpi_json(cluster, ANN, "history")
    jobs = {j["name"]: j for j in ended if j["name"] and j["name"].startswith("magic-")}
    # Loaded without %load_ext; each rank's lines come labelled, per rank in the HTML.
    head, body = ran["displays"]
    assert "succeeded" in head["text/plain"] and ran["error"] is None, ran
    for rank in range(4):
        assert f'data-rank="{rank}"' in body["text/html"], body
        assert f"[{rank}]\x1b[0m rank {rank} of 4" in body["text/plain"], body
    assert back["text"] == "BACK 6 2\n", back  # rank 0's variables, in the notebook
    assert jobs["magic-allreduce"]["state"] == "succeeded"
    _, record = mpi_json(cluster, ANN, "status", jobs["magic-allreduce"]["job_id"])
    assert record["origin"] == {"notebook": "/data/work/magic.ipynb", "cell": 1}, record
    # The cell's file, and the results rank 0 leaves beside it, are Ann's alone: Bob's
    # uid can neither read the code nor put a result of its own there for her to load.
    cells = f"{STORAGE}/{account(cluster, ANN)['account']}/.dockermpi/cells"
    cell_file = f"{cells}/{record['cmd'][-1].rsplit('/', 1)[1]}"
    assert "allreduce" in cluster.exec("node1", ["cat", cell_file])[1]
    code, text = cluster.as_user(BOB, ["cat", cell_file], check=False)
    assert code != 0 and "allreduce" not in text, text
    code, text = cluster.as_user(BOB, ["sh", "-c", f"echo x > {cells}/planted.result"],
                                 check=False)
    assert code != 0, text
    # The raising rank ends the job instead of the others waiting for it for ever, and
    # its traceback is on top.
    head = raised["displays"][0]["text/plain"]
    assert "rank 2 failed:" in head and "KeyError: 'rank two broke'" in head, raised
    assert 'File "<cell>", line 3' in head, head
    assert raised["error"]["ename"] == "CellJobFailed", raised
    assert jobs["magic-raises"]["state"] == "failed", jobs["magic-raises"]
    # Interrupting the kernel cancels the job.
    assert interrupted["error"]["ename"] == "CellJobFailed", interrupted
    assert "interrupted: mpi: job" in interrupted["error"]["traceback"][0], interrupted
    assert jobs["magic-interrupted"]["state"] == "cancelled", jobs["magic-interrupted"]


LINE_RUN = "%mpi run -n 2 -t 5m -J line-run sh -c 'echo from-line; sleep 6'"
CLIENT_RUN = """import dockermpi
ran = dockermpi.Client().run(["sh", "-c", "echo from-client >&2; exit 4"], np=2,
                             walltime="5m", name="client-run")"""


def test_a_job_run_from_a_cell_shows_its_state_ticking_its_output_and_its_end(
        cluster, notebooks):
    line_run, client_run, exit_code = run_cells(
        cluster, "/data/work/run.ipynb",
        [[LINE_RUN, None], [CLIENT_RUN, None], ["print(ran['exit_code'])", None]])
    # %mpi run: the state line went on by itself while the job ran, against the walltime.
    head, body = line_run["displays"]
    running = {said for said in line_run["said"][0]
               if re.search(r" running on node\d:\d.*, \d:\d\d of 5:00$", said)}
    assert len(running) >= 2, line_run["said"][0]
    assert "succeeded" in head["text/plain"] and "Cancel job" not in head["text/html"], head
    assert body["text/plain"] == "from-line\nfrom-line", body
    assert line_run["error"] is None, line_run
    # Client.run: the same view; the job failed, the cell did not (run returns the record).
    head, body = client_run["displays"]
    assert "failed, exit code 4" in head["text/plain"], head
    assert "from-client" in body["text/plain"].splitlines(), body  # and mpirun's own lines
    assert '<div style="color:#c00">from-client</div>' in body["text/html"], body
    assert client_run["error"] is None and exit_code["text"] == "4\n", (client_run, exit_code)
    _, ended = mpi_json(cluster, ANN, "history")
    jobs = {j["name"]: j for j in ended if j["name"] in ("line-run", "client-run")}
    _, record = mpi_json(cluster, ANN, "status", jobs["client-run"]["job_id"])
    assert record["origin"] == {"notebook": "/data/work/run.ipynb", "cell": 2}, record


def test_a_job_origin_is_checked_before_anything_is_queued(cluster, notebooks):
    before = len(mpi_json(cluster, ANN, "history")[1]) + len(mpi_json(cluster, ANN, "list")[1])
    for origin in ({"notebook": "\x1b]0;pwned\x07"}, {"cell": "1; rm"}, "x",
                   {"notebook": "a", "user": BOB}):
        body = {"image": "notebook", "cmd": ["true"], "origin": origin}
        status, answer = api(cluster, ANN, "POST", "/jobs", body)
        assert status == 400 and "origin" in answer["error"], (origin, answer)
    after = len(mpi_json(cluster, ANN, "history")[1]) + len(mpi_json(cluster, ANN, "list")[1])
    assert after == before


def test_exit_codes_are_explained(cluster, notebooks):
    code, output = mpi(cluster, ANN, "run", "-n", "1", "no-such-program")
    assert code != 0 and "not found" in output.strip().splitlines()[-1], output
    code, output = mpi(cluster, ANN, "run", "-n", "1", "/bin/sh", "-c", "kill -KILL $$")
    # mpirun sees either the rank die of the signal or its shell exit 137: both named.
    final = output.strip().splitlines()[-1]
    assert code != 0 and "SIGKILL" in final, output


def test_a_bare_walltime_number_is_minutes_in_the_mpi_command_and_refused_by_the_api(
        cluster, notebooks):
    code, job = mpi_json(cluster, ANN, "submit", "-n", "1", "-t", "2", "hostname")
    assert code == 0 and job["walltime"] == 120, job
    status, answer = api(cluster, ANN, "POST", "/jobs",
                         {"image": "notebook", "np": 1, "cmd": ["hostname"], "walltime": 2})
    assert status == 400 and "has no unit" in answer["error"], answer
    assert answer["state"] == "rejected"


def test_the_api_describes_itself_and_answers_bad_calls_in_json(cluster, notebooks):
    status, spec = api(cluster, ANN, "GET", "/openapi.json", token=None)
    assert status == 200 and spec["openapi"].startswith("3.")
    assert {"/jobs", "/jobs/{job_id}", "/events", "/whoami"} <= set(spec["paths"])
    status, answer = api(cluster, ANN, "GET", "/no-such-endpoint")
    assert status == 404 and "no such endpoint" in answer["error"], answer
    status, answer = api(cluster, ANN, "POST", "/jobs", {"image": "notebook", "cmd": ["x"],
                                                          "np": 1, "sudo": True})
    assert status == 400 and "unknown job fields: sudo" in answer["error"], answer
    status, answer = api(cluster, ANN, "GET", "/whoami", token=None)
    assert status == 401 and "no JupyterHub token" in answer["error"], answer
    status, images = api(cluster, ANN, "GET", "/images")
    assert status == 200 and "notebook" in [i["name"] for i in images["images"]]


# ------------------------------------------------------------------- A against B


@pytest.fixture
def bobs_job(cluster, notebooks):
    """A job of Bob's, running."""
    code, job = mpi_json(cluster, BOB, "submit", "-n", "1", "-J", "bobs", "sleep", "120")
    assert code == 0, job
    until(lambda: mpi_json(cluster, BOB, "status", job["job_id"])[1]["state"] == "running",
          "Bob's job to run")
    yield job["job_id"]
    mpi(cluster, BOB, "cancel", job["job_id"])


def test_a_user_cannot_see_or_touch_another_users_job(cluster, notebooks, bobs_job):
    _, listed = mpi_json(cluster, ANN, "list")
    assert bobs_job not in {j["job_id"] for j in listed}
    _, history = mpi_json(cluster, ANN, "history")
    assert all(j["user"] == dmpi.settings.user_for_identity(ANN) for j in history)
    for argv in (["status", bobs_job], ["logs", bobs_job], ["cancel", bobs_job],
                 ["wait", bobs_job, "--timeout", "1"]):
        code, output = mpi(cluster, ANN, *argv)
        assert code != 0 and "no such job" in output, (argv, output)
    # The same calls straight to the API, and an id that does not exist: one answer.
    for method, path in (("GET", ""), ("GET", "/logs"), ("POST", "/cancel"),
                         ("GET", "/wait?timeout=1"), ("GET", "/events?job=")):
        for job_id in (bobs_job, "20990101-000000-abcdef"):
            where = f"/events?job={job_id}" if path == "/events?job=" else f"/jobs/{job_id}{path}"
            status, answer = api(cluster, ANN, method, where)
            assert status == 404 and answer["error"] == f"no such job: {job_id}", answer
    _, job = mpi_json(cluster, BOB, "status", bobs_job)
    assert job["state"] == "running", job  # Bob's job did not notice


#: One call to a notebook server's own address on the hub host (what the proxy forwards
#: to): argv is method, URL, token ('' for none); prints the status, then the body.
_SERVER_CALL = r"""
import sys, urllib.error, urllib.request
method, url, token = sys.argv[1:4]
headers = {"Authorization": "token " + token} if token else {}
request = urllib.request.Request(url, method=method, headers=headers,
                                 data=b"" if method == "POST" else None)
try:
    with urllib.request.urlopen(request, timeout=60) as answer:
        print(answer.status); print(answer.read().decode(errors="replace"))
except urllib.error.HTTPError as exc:
    print(exc.code); print(exc.read().decode(errors="replace"))
"""


def test_a_users_panel_calls_through_her_server_reach_her_jobs_alone(cluster, notebooks,
                                                                     bobs_job):
    # The jobs panel's way in: <server>/dockermpi/api/v1/... on the user's own server,
    # which calls the API with the server's token. Ann's token opens Ann's server only,
    # and through it the API answers for Ann only.
    ann_token = cluster.hub_token(ANN)

    prefixes = {user: cluster.notebook_exec(user, ["printenv", "JUPYTERHUB_SERVICE_PREFIX"])[1]
                .strip() for user in (ANN, BOB)}

    def call(method, user, path, token=ann_token):
        url = f"http://{cluster.notebook_address(user)}:8888{prefixes[user]}dockermpi/{path}"
        code, out = cluster.exec("hub", ["python3", "-c", _SERVER_CALL, method, url, token])
        assert code == 0, out
        status, _, text = out.partition("\n")
        return int(status), text

    status, text = call("GET", ANN, "api/v1/jobs")
    assert status == 200, text
    assert bobs_job not in text and all(
        j["user"] == dmpi.settings.user_for_identity(ANN) for j in json.loads(text)["jobs"])
    for method, path in (("GET", f"api/v1/jobs/{bobs_job}"),
                         ("GET", f"api/v1/jobs/{bobs_job}/logs"),
                         ("POST", f"api/v1/jobs/{bobs_job}/cancel"),
                         ("GET", f"api/v1/events?job={bobs_job}")):
        status, text = call(method, ANN, path)
        assert status == 404 and f"no such job: {bobs_job}" in text, (method, path, text)
    # Paths the API has no business being asked: refused by Ann's server itself.
    for method, path in (("GET", "api/v1/jobs/..%2F..%2Fhub%2Fapi%2Fusers"),
                         ("GET", "api/v1/openapi.json/../../../hub/api/users"),
                         ("POST", "api/v1/whoami")):
        status, text = call(method, ANN, path)
        assert status in (404, 405), (method, path, status, text)
    # Bob's server takes neither Ann's token nor no token.
    for token in (ann_token, ""):
        for method, path in (("GET", "api/v1/jobs"), ("GET", "settings"),
                             ("POST", f"api/v1/jobs/{bobs_job}/cancel")):
            status, text = call(method, BOB, path, token)
            assert status in (302, 403), (method, path, status, text)
            assert bobs_job not in text
    _, job = mpi_json(cluster, BOB, "status", bobs_job)
    assert job["state"] == "running", job  # Bob's job did not notice


#: Follows the notebook's own event stream for argv[2] seconds, appending what comes to
#: the file argv[1] as it comes ("open" first).
_READ_EVENTS = r"""
import os, ssl, sys, time, urllib.request
CA = ssl.create_default_context(cafile=os.environ.get("DOCKERMPI_API_CA"))
request = urllib.request.Request(os.environ["DOCKERMPI_API_URL"] + "/api/v1/events",
    headers={"Authorization": "token " + os.environ["JUPYTERHUB_API_TOKEN"]})
end = time.monotonic() + float(sys.argv[2])
with open(sys.argv[1], "ab", buffering=0) as log, \
        urllib.request.urlopen(request, timeout=30, context=CA) as stream:
    log.write(b"open\n")
    while time.monotonic() < end:
        line = stream.readline()
        if not line:
            break
        log.write(line)
"""


def test_a_users_events_and_answers_carry_nothing_of_another_users_job(cluster, notebooks):
    secret = "s3cr3t-" + "b0b" * 8
    log = f"/data/events-{time.monotonic_ns()}.log"
    # Ann follows her whole event stream while Bob runs a job that prints a secret.
    cluster.exec("hub", ["docker", "exec", "-d", cluster.notebook_container(ANN), "python3",
                         "-c", _READ_EVENTS, log, "300"])

    def seen():
        return cluster.notebook_exec(ANN, ["cat", log])[1]

    until(lambda: "open" in seen(), "Ann's event stream to open")
    code, output = mpi(cluster, BOB, "run", "-n", "2", "--export", f"SECRET_TOKEN={secret}",
                       "-J", "secretive", "/bin/sh", "-c", 'echo "$SECRET_TOKEN"; env')
    assert code == 0 and secret in output, output  # Bob sees his own, live
    code, ann_job = mpi_json(cluster, ANN, "run", "-n", "1", "-J", "annsown", "true")
    assert code == 0, ann_job
    # Ann's stream carried her own job to its end, after Bob's had ended.
    text = until(lambda: (t := seen()) and '"state": "succeeded"' in t
                 and ann_job["job_id"] in t and t, "Ann's own job's end in her stream")
    assert "event: state" in text
    assert secret not in text and "secretive" not in text and '"user": "bob"' not in text
    for path in ("/jobs", "/history", "/usage"):
        status, answer = api(cluster, ANN, "GET", path)
        assert status == 200 and secret not in json.dumps(answer)
        assert "secretive" not in json.dumps(answer), answer
    # Bob's job as the place Ann's pages start after is no such job to her.
    status, bobs = api(cluster, BOB, "GET", "/history?state=succeeded")
    assert status == 200, bobs
    bob_job = [row["job_id"] for row in bobs["jobs"] if row["name"] == "secretive"][-1]
    for path in ("/history?", "/jobs?state=succeeded&"):
        status, answer = api(cluster, ANN, "GET", f"{path}after={bob_job}")
        assert (status, answer["error"]) == (404, f"no such job: {bob_job}"), answer


def test_two_users_following_at_once_each_get_only_their_own_jobs_output(cluster, notebooks):
    # Ann's and Bob's `mpi run` follow their jobs at the same time, Bob's printing a secret.
    secret = "s3cr3t-" + "f0110w" * 4
    lines = {ANN: "ann-line", BOB: secret}
    followed = {}

    def follow(user):
        followed[user] = mpi(cluster, user, "run", "-n", "1", "/bin/sh", "-c",
                             f"for i in 1 2 3 4 5 6; do echo {lines[user]}-$i; sleep 1; done")

    runs = [threading.Thread(target=follow, args=(user,)) for user in lines]
    for run in runs:
        run.start()
    for run in runs:
        run.join()
    for user, line in lines.items():
        code, output = followed[user]
        other = lines[BOB if user == ANN else ANN]
        assert code == 0 and all(f"{line}-{i}" in output for i in range(1, 7)), output
        assert other not in output, output


#: Everything on the master's event bus, one line per event (tag, then the data as
#: JSON), into argv[1] until argv[1] + ".stop" exists; "open" once it listens.
_BUS_LISTENER = r"""
import json, os, sys, salt.config, salt.utils.event
opts = salt.config.master_config("/etc/salt/master")
out = sys.argv[1]
with salt.utils.event.get_master_event(opts, opts["sock_dir"], listen=True) as bus, \
        open(out, "w") as seen:
    seen.write("open\n")
    seen.flush()
    while not os.path.exists(out + ".stop"):
        event = bus.get_event(wait=1, full=True)
        if event:
            seen.write(event["tag"] + " " + json.dumps(event["data"], default=repr) + "\n")
            seen.flush()
"""

#: The master's job cache (what Salt keeps of every publish and return) written since
#: argv[1] (Unix time), as one JSON document.
_JOB_CACHE_SINCE = r"""
import json, os, sys, salt.payload
since = float(sys.argv[1])
kept = []
for folder, _, names in os.walk("/var/cache/salt/master/jobs"):
    for path in (os.path.join(folder, n) for n in names if n.endswith(".p")):
        if os.path.getmtime(path) >= since:
            with open(path, "rb") as handle:
                kept.append(salt.payload.load(handle))
print(json.dumps(kept, default=repr))
"""


def test_no_private_key_nor_a_users_secret_or_output_passes_through_salt(cluster, notebooks):
    """Job keys are made on the nodes and only public keys travel; the user's
    environment travels sealed to the launcher's node, the output sealed to the master.
    A listener on the master's bus during a job over two nodes, and the master's job
    cache after it, see the publishes and returns, never a private key or the secret."""
    secret = "s3cr3t-" + "k3y" * 8
    bus_log = f"/tmp/dmpi-bus-{time.monotonic_ns()}.log"
    since = float(cluster.exec("master", ["date", "+%s"])[1]) - 1
    cluster.exec("master", ["sh", "-c", f"setsid /opt/saltstack/salt/bin/python3 -c "
                            f"'{_BUS_LISTENER}' {bus_log} >/dev/null 2>&1 &"])

    def seen():
        return cluster.exec("master", ["cat", bus_log], check=False)[1]

    try:
        until(lambda: seen().startswith("open"), "the bus listener to open")
        code, job = mpi_json(cluster, BOB, "submit", "-n", "4", "-N", "2", "--export",
                             f"SECRET_TOKEN={secret}", "/bin/sh", "-c", 'echo "$SECRET_TOKEN"')
        assert code == 0, job
        code, ended = mpi_json(cluster, BOB, "wait", job["job_id"])
        assert code == 0 and ended["state"] == "succeeded" and len(ended["placement"]) == 2, ended
        code, tail = mpi(cluster, BOB, "logs", job["job_id"])
        assert code == 0 and tail.count(secret) == 4, tail
        bus = until(lambda: (t := seen()) and "mpi_job.cleanup" in t and t,
                    "the job's clean-up publish on the bus")
    finally:
        cluster.exec("master", ["touch", f"{bus_log}.stop"])
    # The listener saw the job start and its output read: what it says is the whole story.
    assert "mpi_job.start_worker" in bus and "mpi_job.read_output" in bus
    assert "job_cas" in bus and '"sealed": "rsa-oaep-sha256+aes-256-gcm"' in bus
    assert "PRIVATE KEY" not in bus
    assert secret not in bus
    code, cache = cluster.exec("master", ["/opt/saltstack/salt/bin/python3", "-c",
                                          _JOB_CACHE_SINCE, str(since)])
    assert code == 0 and "mpi_job.start_worker" in cache, cache[:500]
    assert "PRIVATE KEY" not in cache and secret not in cache


#: One call of the hub's own API with the notebook server's token, as any program in the
#: notebook could make it: argv is method and path (after JUPYTERHUB_API_URL); prints
#: the HTTP status.
_HUB_CALL = r"""
import json, os, sys, urllib.error, urllib.request
method, path = sys.argv[1:3]
request = urllib.request.Request(
    os.environ["JUPYTERHUB_API_URL"] + path, method=method,
    data=b"{}" if method == "POST" else None,
    headers={"Authorization": "token " + os.environ["JUPYTERHUB_API_TOKEN"]})
try:
    with urllib.request.urlopen(request, timeout=60) as answer:
        print(answer.status)
except urllib.error.HTTPError as exc:
    print(exc.code)
"""


def test_a_notebook_servers_token_does_nothing_beyond_its_scopes(cluster, notebooks):
    """The server's token names its user and reaches DockerMPI's API; it lists no users,
    makes no token, starts or stops no server and reads nobody else."""
    quoted = ANN.replace("@", "%40")

    def hub(method, path):
        code, out = cluster.notebook_exec(ANN, ["python3", "-c", _HUB_CALL, method, path])
        assert code == 0, out
        return int(out.split()[-1])

    assert hub("GET", "/user") == 200
    assert api(cluster, ANN, "GET", "/whoami")[0] == 200
    for method, path in (("GET", "/users"), ("GET", f"/users/{BOB}"),
                         ("POST", f"/users/{quoted}/tokens"), ("GET", f"/users/{quoted}/tokens"),
                         ("POST", f"/users/{BOB}/server"), ("DELETE", f"/users/{quoted}/server"),
                         ("GET", "/groups"), ("GET", "/services"), ("GET", "/proxy")):
        assert hub(method, path) in (403, 404), (method, path)


def test_a_user_cannot_submit_as_another(cluster, notebooks):
    for user in (BOB, "root", dmpi.settings.user_for_identity(BOB)):
        status, answer = api(cluster, ANN, "POST", "/jobs",
                             {"user": user, "image": "notebook", "np": 1, "cmd": ["hostname"]})
        assert status == 400 and "unknown job fields: user" in answer["error"], answer
    # Whatever name Ann's call claims, the hub says whose token it is.
    for headers in ({"X-Forwarded-User": BOB}, {"X-Remote-User": BOB},
                    {"JupyterHub-User": BOB}):
        status, me = api(cluster, ANN, "GET", "/whoami?user=bob", headers=headers)
        assert status == 200 and me["user"] == ANN, me
    status, answer = api(cluster, ANN, "GET", "/jobs?user=bob")
    assert status == 200 and all(j["user"] != BOB for j in answer["jobs"]), answer


def test_a_user_cannot_take_another_users_directory_by_registering_its_mapped_name(
        cluster, notebooks):
    squatter = dmpi.settings.user_for_identity(ANN)  # a valid hub name of its own
    token = cluster.hub_token(squatter)
    status, answer = api(cluster, ANN, "GET", "/whoami", token=token)
    assert status == 400 and "belongs to another hub user" in answer["error"], answer
    cluster.delete_hub_user(squatter)


# ------------------------------------------------------------------------- tokens


def test_forged_expired_revoked_and_unscoped_tokens_are_refused(cluster, notebooks):
    assert api(cluster, ANN, "GET", "/whoami")[0] == 200  # the notebook's own token works
    assert token_refused(*api(cluster, ANN, "GET", "/whoami", token="f" * 32))
    assert token_refused(*api(cluster, ANN, "GET", "/whoami", token="x y\u00e9"))
    expiring = cluster.hub_token(ANN, expires_in=1)
    until(lambda: token_refused(*api(cluster, ANN, "GET", "/whoami", token=expiring)),
          "the expired token to be refused")
    # A token of Ann's without the service's scope: what the hub gives a server (the
    # OAuth token of one user visiting another's server) or a user's narrow token.
    for scopes in (["read:users!user"], ["access:servers!user", "users:activity!user"]):
        narrow = cluster.hub_token(ANN, scopes=scopes)
        assert token_refused(*api(cluster, ANN, "GET", "/whoami", token=narrow)), scopes
    revoked = cluster.hub_token(ANN)
    assert api(cluster, ANN, "GET", "/whoami", token=revoked)[0] == 200
    _, tokens = cluster.hub_api("GET", f"/users/{ANN}/tokens")
    for found in [t["id"] for t in tokens["api_tokens"] if t["note"] == "dmpi-cluster test token"]:
        cluster.hub_api("DELETE", f"/users/{ANN}/tokens/{found}")
    # Refused once the API's short memory of the hub's answer (token_cache_seconds) ends.
    until(lambda: token_refused(*api(cluster, ANN, "GET", "/whoami", token=revoked)),
          "the revoked token to be refused")


#: Calls of the API on a connection kept open, as dockermpi.Client makes them: argv[1]
#: is a JSON list of [path, token] ('' the notebook's own token, '-' none); prints, per
#: call, [status, answer, the connection's local port]. A call that finds the connection
#: closed by the API (it closes one after refusing a call) is sent again on a new one.
_KEPT_CONNECTION_CALLS = r"""
import http.client, json, os, ssl, sys, urllib.parse
url = urllib.parse.urlsplit(os.environ["DOCKERMPI_API_URL"])
CA = ssl.create_default_context(cafile=os.environ.get("DOCKERMPI_API_CA"))
connection = http.client.HTTPSConnection(url.hostname, url.port, context=CA, timeout=60)
answers = []
for path, token in json.loads(sys.argv[1]):
    token = os.environ["JUPYTERHUB_API_TOKEN"] if token == "" else token
    headers = {} if token == "-" else {"Authorization": "token " + token}
    for attempt in (0, 1):
        try:
            connection.request("GET", url.path + "/api/v1" + path, headers=headers)
            answer = connection.getresponse()
            break
        except http.client.RemoteDisconnected:
            connection.close()
    port = connection.sock.getsockname()[1]
    answers.append([answer.status, json.loads(answer.read()), port])
print(json.dumps(answers))
"""


def test_a_kept_connection_carries_no_identity_from_one_call_to_the_next(
        cluster, notebooks, bobs_job):
    """Every call on a kept connection is judged by its own token alone: right after
    Ann's own call, on the same connection, a call without a token, with a forged one or
    asking for Bob's job gets nothing."""
    own = ["/whoami", ""]
    calls = [own, ["/whoami", "-"], own, ["/whoami", "f" * 32], own,
             [f"/jobs/{bobs_job}", ""], own, [f"/jobs/{bobs_job}", "-"]]
    code, output = cluster.notebook_exec(
        ANN, ["python3", "-c", _KEPT_CONNECTION_CALLS, json.dumps(calls)])
    assert code == 0, output
    answers = json.loads(output)
    for (status, me, port), (_, _, next_port) in zip(answers[::2], answers[1::2]):
        assert status == 200 and me["user"] == ANN
        assert next_port == port, answers  # the attempt rode on Ann's own connection
    (none, _, _), forged, (bobs, found, _), (bobs_anon, _, _) = answers[1::2]
    assert none == 401 and token_refused(*forged[:2])
    assert bobs == 404 and found["error"] == f"no such job: {bobs_job}"
    assert bobs_anon == 401


def test_a_token_of_a_user_the_hub_deleted_is_refused(cluster, notebooks):
    token = cluster.hub_token("leaver")
    status, me = api(cluster, ANN, "GET", "/whoami", token=token)
    assert status == 200 and me["user"] == "leaver"
    cluster.delete_hub_user("leaver")
    until(lambda: token_refused(*api(cluster, ANN, "GET", "/whoami", token=token)),
          "the deleted user's token to be refused")


def test_a_service_token_is_not_a_user(cluster, notebooks):
    assert token_refused(*api(cluster, ANN, "GET", "/whoami", token=hub_admin_token()))


def test_the_admin_token_is_in_no_notebooks_or_jobs_reach(cluster, notebooks):
    """The site tooling's admin token (settings.json, root only on the hub host) is in no
    process environment, mount or file a notebook can read, nor in a job's environment."""
    admin = hub_admin_token()
    code, found = cluster.notebook_exec(ANN, [
        "sh", "-c", 'grep -rlsF -- "$0" /proc/[0-9]*/environ /etc /data /tmp /run /opt '
        '/root /home; echo searched', admin])
    assert found.split() == ["searched"], found
    code, output = mpi(cluster, ANN, "run", "-n", "2", "-N", "2", "-t", "2", "sh", "-c",
                       "env; cat /proc/1/environ; ls -la /data /etc/dockermpi 2>&1; exit 0")
    assert code == 0 and "DMPI_JOB_ID" in output, output
    assert admin not in output


# -------------------------------------------------------------------------- limits


def test_a_flooding_user_gets_429_while_another_users_calls_go_on(cluster, notebooks):
    flood = r"""
import json, os, ssl, urllib.error, urllib.request
CA = ssl.create_default_context(cafile=os.environ.get("DOCKERMPI_API_CA"))
codes = {}
request = urllib.request.Request(os.environ["DOCKERMPI_API_URL"] + "/api/v1/jobs",
    headers={"Authorization": "token " + os.environ["JUPYTERHUB_API_TOKEN"]})
retry = None
for _ in range(150):
    try:
        with urllib.request.urlopen(request, timeout=30, context=CA) as answer:
            code = answer.status
    except urllib.error.HTTPError as exc:
        code, retry = exc.code, exc.headers.get("Retry-After") or retry
    codes[code] = codes.get(code, 0) + 1
print(json.dumps({"codes": codes, "retry_after": retry}))
"""
    code, output = cluster.notebook_exec(ANN, ["python3", "-c", flood])
    assert code == 0, output
    found = json.loads(output.strip().splitlines()[-1])
    assert found["codes"].get("429", 0) > 0 and int(found["retry_after"]) >= 1, found
    # Bob, meanwhile and at once, is served.
    status, answer = api(cluster, BOB, "GET", "/jobs")
    assert status == 200, answer


def test_a_50_mb_body_gets_413_and_the_api_does_not_grow(cluster, notebooks):
    def api_memory_kib():
        return api_process(lambda argv: cluster.exec("master", argv, stdout_only=True)[1])[
            "rss_kib"]

    before = api_memory_kib()
    big = r"""
import os, ssl, urllib.error, urllib.request
CA = ssl.create_default_context(cafile=os.environ.get("DOCKERMPI_API_CA"))
body = b"{" + b" " * (50 << 20) + b"}"
request = urllib.request.Request(os.environ["DOCKERMPI_API_URL"] + "/api/v1/jobs", data=body,
    method="POST", headers={"Authorization": "token " + os.environ["JUPYTERHUB_API_TOKEN"],
                            "Content-Type": "application/json"})
try:
    urllib.request.urlopen(request, timeout=120, context=CA)
    print(200)
except urllib.error.HTTPError as exc:
    print(exc.code, exc.read().decode())
"""
    code, output = cluster.notebook_exec(ANN, ["python3", "-c", big])
    assert code == 0 and output.startswith("413") and "body_bytes" in output, output
    assert api_memory_kib() - before < 20 << 10  # far less than the 50 MiB sent


# --------------------------------------------------------------------- nothing else


def test_a_notebook_reaches_the_api_on_the_master_and_nothing_else_there(cluster, notebooks):
    """Of the master, a notebook reaches DockerMPI's API alone: not Salt's publisher and
    request server, salt-api's port or the registry (which listens: its refusal is the
    hub host's firewall)."""
    probe = r"""
import socket, sys
for port in (8001, 4505, 4506, 8000, 5000):
    try:
        socket.create_connection((sys.argv[1], port), timeout=5).close()
        print(port, "open")
    except OSError as exc:
        print(port, "closed")
"""
    code, output = cluster.notebook_exec(ANN, ["python3", "-c", probe, MASTER_ADDR])
    assert code == 0, output
    assert output.split() == ["8001", "open", "4505", "closed", "4506", "closed", "8000",
                              "closed", "5000", "closed"], output
    code, _ = cluster.exec("hub", ["timeout", "5", "bash", "-c", f"</dev/tcp/{MASTER_ADDR}/5000"],
                           check=False)
    assert code == 0, "the registry is not open from the hub host: nothing to prove"
    _, units = cluster.exec("master", ["systemctl", "is-active", "salt-api"], check=False)
    assert units.strip() != "active"


def test_a_notebook_reaches_no_port_of_a_storage_server_over_tcp_or_udp(cluster, notebooks):
    """A host of the cluster network serving NFS (the hub host's own ports:
    test_hub_host)."""
    with cluster.storage_stand_in("master") as address:
        code, output = cluster.notebook_exec(ANN, [
            "python3", "-c", cluster.STORAGE_PROBE, address, *map(str, cluster.STORAGE_PORTS)])
    assert code == 0, output
    assert cluster.storage_unanswered(output) == list(cluster.STORAGE_PORTS), output


def test_a_notebook_user_sees_their_own_quota_only(cluster, notebooks):
    anns, bobs = account(cluster, ANN)["account"], account(cluster, BOB)["account"]
    status, answer = api(cluster, ANN, "GET", "/usage")
    assert status == 200, answer
    assert set(answer["storage"]) == {anns}, answer
    mine = answer["storage"][anns]
    assert mine["bytes_limit"] == 2048 << 20 and mine["files_limit"] == 100000, mine
    assert bobs not in json.dumps(answer)
    code, shown = mpi_json(cluster, BOB, "usage")
    assert code == 0 and set(shown["storage"]) == {bobs}, shown


def test_a_notebook_reaches_no_port_of_the_glusterfs_server(cluster, notebooks):
    ports = cluster.glusterfs_ports()
    code, output = cluster.notebook_exec(ANN, [
        "python3", "-c", cluster.STORAGE_PROBE, STORAGE_ADDR, *map(str, ports)])
    assert code == 0, output
    assert cluster.storage_unanswered(output) == ports, output


def test_a_userspace_glusterfs_client_in_a_notebook_reads_nothing(cluster, notebooks):
    # Ann brings a working GlusterFS client (libgfapi and its plugins, test_tenants shows
    # it reading from a host as root) into her directory and runs it in her notebook,
    # claiming Bob's uid: her notebook reaches no port of the storage host.
    mine, bobs = account(cluster, ANN), account(cluster, BOB)
    kit = cluster.glusterfs_client_kit(mine["account"])
    cluster.as_user(bobs["account"], ["sh", "-c", f"echo bob > {bobs['dir']}/gfapi.txt"])
    code, output = cluster.notebook_exec(ANN, [
        "timeout", "120", "python3", "-c", cluster.GLUSTERFS_CLIENT, STORAGE_ADDR,
        "dockermpi", f"/users/{bobs['account']}/gfapi.txt", str(bobs["uid"]),
        str(bobs["gid"])], environment={"LD_LIBRARY_PATH": kit})
    assert code == 0, output
    answer = [line for line in output.splitlines() if line.startswith("{")]
    assert answer and json.loads(answer[-1]) == {
        "init": -1, "error": "Transport endpoint is not connected"}, output


# ------------------------------------------------------------- who runs what, where


def _inspect(cluster, host, name):
    _, found = cluster.exec(host, ["docker", "inspect", name], stdout_only=True)
    return json.loads(found)[0]


def test_the_notebook_and_the_jobs_of_a_user_run_as_their_uid_with_only_their_directory(
        cluster, notebooks):
    me = account(cluster, ANN)
    home = f"{STORAGE}/{me['account']}"
    notebook = _inspect(cluster, "hub", notebooks[ANN])
    assert notebook["Config"]["User"] == f"{me['uid']}:{me['gid']}"
    data = [m for m in notebook["Mounts"] if m["Destination"] == "/data"]
    assert [m["Source"] for m in data] == [home] and data[0]["RW"]
    others = [m for m in notebook["Mounts"] if m["Destination"] != "/data"]
    assert all(not m["RW"] and not m["Source"].startswith(STORAGE) for m in others), others
    assert "@sha256:" in notebook["Config"]["Image"]
    code, ids = cluster.notebook_exec(ANN, ["id", "-u"])
    assert int(ids) == me["uid"]
    code, listing = cluster.notebook_exec(ANN, ["ls", "/srv", f"/data/../{BOB}"])
    assert code != 0  # nothing of the shared storage but Ann's own directory

    code, job = mpi_json(cluster, ANN, "submit", "-n", "2", "-N", "2", "sleep", "60")
    assert code == 0, job
    try:
        deadline = time.monotonic() + 60
        while job["state"] != "running":
            assert time.monotonic() < deadline, job
            time.sleep(0.5)
            _, job = mpi_json(cluster, ANN, "status", job["job_id"])
        for node in job["placement"]:
            _, names = cluster.exec(node, ["docker", "ps", "--format", "{{.Names}}", "--filter",
                                           f"label=io.dockermpi.job={job['job_id']}"],
                                    stdout_only=True)
            for name in names.split():
                info = _inspect(cluster, node, name)
                assert info["Config"]["User"].split(":")[0] == str(me["uid"])
                shared = [m["Source"] for m in info["Mounts"] if m["Source"].startswith(STORAGE)]
                assert shared == [home], info["Mounts"]
    finally:
        mpi(cluster, ANN, "cancel", job["job_id"])


#: mpi4py's allreduce, with the MPI library that ran it (the image's own).
ALLREDUCE = ("from mpi4py import MPI; c = MPI.COMM_WORLD; "
             "print(f'rank {c.Get_rank()} of {c.Get_size()}: {c.allreduce(c.Get_rank() + 1)} "
             "' + MPI.Get_library_version().split(chr(10))[0])")


def test_a_user_picks_the_image_of_their_notebook_and_their_jobs_run_in_it(cluster, notebooks):
    cara = "cara"
    try:
        container = cluster.start_notebook(cara, image="notebook-mpich")
        _, approved = cluster.run_json("mpi.images")
        reference = {i["name"]: i["reference"] for i in approved["images"]}["notebook-mpich"]
        assert _inspect(cluster, "hub", container)["Config"]["Image"] == reference
        code, found = cluster.notebook_exec(
            cara, ["sh", "-c", "echo $DOCKERMPI_IMAGE; command -v mpirun"])
        assert code == 0 and found.split() == ["notebook-mpich", "/opt/venv/bin/mpirun"], found
        # Its jobs run in it by default: MPICH from its virtualenv, over three nodes.
        code, job = mpi_json(cluster, cara, "run", "-n", "3", "-N", "3", "python3", "-c",
                             ALLREDUCE)
        assert code == 0 and job["state"] == "succeeded", job
        assert job["image"] == "notebook-mpich" and len(job["placement"]) == 3, job
        _, output = cluster.notebook_exec(cara, ["cat", f"/data/mpi-jobs/{job['job_id']}/stdout"])
        # (Hydra's mpiexec adds each rank's exit status: "[mpiexec@node1] Exit codes: ...")
        ranks = sorted(line for line in output.splitlines() if line.startswith("rank "))
        assert [line.split(" MPICH")[0] for line in ranks] == [
            f"rank {r} of 3: 6" for r in range(3)], output
        assert all("MPICH Version:" in line for line in ranks), output
    finally:
        cluster.stop_notebook(cara)


@pytest.mark.parametrize("image", [
    "mpi",                                  # approved, but not offered for notebooks
    "registry:5000/anything@sha256:" + "0" * 64,  # a reference of the user's
    "../notebook", ["notebook"], {"notebook": 1}, 7,
])
def test_only_an_image_offered_for_notebooks_starts(cluster, notebooks, image):
    dan = "dan"
    cluster.hub_user(dan)
    try:
        status, answer = cluster.hub_api("POST", f"/users/{dan}/server", {"image": image},
                                         check=False)
        assert status == 400, answer
        assert "is not offered for notebooks (offered: notebook, notebook-mpich)" in \
            str(answer), answer
        _, user = cluster.hub_api("GET", f"/users/{dan}")
        assert not user.get("servers") and cluster.notebook_container(dan) is None, user
    finally:
        cluster.stop_notebook(dan)
    # Ann's notebook, started before, runs on as it was.
    assert cluster.notebook_container(ANN) == notebooks[ANN]
    assert cluster.notebook_exec(ANN, ["printenv", "DOCKERMPI_IMAGE"]) == (0, "notebook\n")


def test_the_api_serves_the_hub_hosts_proxy_only(cluster):
    # From a node host (not the hub's): refused by the API whatever the token.
    code, output = cluster.exec("node1", ["python3", "-c",
        "import ssl, urllib.request, urllib.error\n"
        "try:\n"
        f"    urllib.request.urlopen('https://{MASTER_ADDR}:8001/services/dockermpi/api/v1/"
        "openapi.json', timeout=5, context=ssl._create_unverified_context())\n"
        "    print('served')\n"
        "except urllib.error.HTTPError as e:\n"
        "    print(e.code)\n"], check=False)
    assert output.strip() == "403", output


#: Reads every frame on every interface of the network namespace it runs in until its
#: stdin closes, then prints JSON: how many TCP payload bytes went to or from each port
#: in argv[2:], and how many frames held the bytes of argv[1].
_CAPTURE = r"""
import json, select, socket, struct, sys
secret, ports = sys.argv[1].encode(), {int(p): 0 for p in sys.argv[2:]}
raw = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
found = 0
print("capturing", flush=True)
while True:
    ready, _, _ = select.select([raw, sys.stdin], [], [])
    if sys.stdin in ready and not sys.stdin.readline():
        break
    if raw in ready:
        frame = raw.recv(65535)
        found += secret in frame
        if frame[12:14] == b"\x08\x00" and frame[23] == 6:
            ip = 14 + (frame[14] & 15) * 4
            source, dest = struct.unpack("!HH", frame[ip:ip + 4])
            payload = len(frame) - ip - (frame[ip + 12] >> 4) * 4
            for port in {source, dest} & set(ports):
                ports[port] += payload
print(json.dumps({"ports": ports, "secret_frames": found}))
"""


def test_no_users_token_crosses_the_cluster_network_readable(cluster, notebooks):
    """A host on the cluster network that reads every packet of the master (where the API
    runs) while a user's call goes through: the proxy forwards the call to the API, the
    API asks the hub whose token it is; the token is in neither hop's bytes."""
    token = cluster.hub_token(BOB)  # new: the API has no answer for it yet, so asks the hub
    pid = cluster.container("master").attrs["State"]["Pid"]
    capture = subprocess.Popen(["nsenter", "-t", str(pid), "-n", "python3", "-c", _CAPTURE,
                                token, "8000", "8001"],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert capture.stdout.readline().strip() == "capturing"
        request = urllib.request.Request(API_PUBLIC_URL + API + "/whoami",
                                         headers={"Authorization": f"token {token}"})
        with cluster.public_open(request) as answer:
            assert json.loads(answer.read())["user"] == BOB
    finally:
        out, _ = capture.communicate("", timeout=60)
    seen = json.loads(out)
    # Both hops went by the master (the test saw them), encrypted: no frame has the token.
    assert seen["ports"]["8001"] > 0 and seen["ports"]["8000"] > 0, seen
    assert seen["secret_frames"] == 0, seen


def test_the_api_and_the_proxy_speak_tls_only(cluster):
    """Plain HTTP, as a client that would send a token in the clear, gets no HTTP answer
    from the API on the master or from the hub's proxy."""
    probe = r"""
import socket, sys
for host, port in ((sys.argv[1], 8001), (sys.argv[2], 8000)):
    with socket.create_connection((host, port), timeout=10) as conn:
        conn.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nAuthorization: token abc\r\n\r\n")
        conn.settimeout(10)
        try:
            first = conn.recv(64)
        except OSError:
            first = b""
        print(port, "http" if first.startswith(b"HTTP/") else "no-http")
"""
    code, output = cluster.exec("hub", ["python3", "-c", probe, MASTER_ADDR, HUB_ADDR])
    assert code == 0 and output.split() == ["8001", "no-http", "8000", "no-http"], output
