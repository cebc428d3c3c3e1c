"""JupyterHub users run MPI jobs from their own notebook, as themselves, through salt-api
with the hub's own tokens; one hub user (A, "ann.lee@example.org": a name with a dot and
an @) attacks another (B, "bob") and B comes through unharmed.

Everything here goes the way a user's does: real hub users and tokens from the real hub
on the hub host, the notebook container DockerSpawner started for them, the ``mpi``
command in it, salt-api over TLS on the master, the jupyterhub eauth module asking the
hub whose token it is.
"""

import json
import time

import pytest

from tests.cluster.testcluster import FILES, MASTER_ADDR
from tests.extension import load_extension

pytestmark = pytest.mark.cluster

mpi_config = load_extension("_utils/mpi_config.py", "mpi_config")

ANN, BOB = "ann.lee@example.org", "bob"
STORAGE = "/srv/dockermpi/users"

#: One salt-api call from inside a notebook, the way any program there could make it:
#: argv[1] is the lowstate (JSON); credentials default to the notebook's own.
_API_CALL = r"""
import json, os, ssl, sys, urllib.error, urllib.request
low = json.loads(sys.argv[1])
low.setdefault("eauth", "jupyterhub")
low.setdefault("username", os.environ["JUPYTERHUB_USER"])
low.setdefault("password", os.environ["JUPYTERHUB_API_TOKEN"])
context = ssl.create_default_context(cafile=os.environ["DOCKERMPI_API_CA"])
request = urllib.request.Request(
    os.environ["DOCKERMPI_API_URL"] + "/run", data=json.dumps([low]).encode(),
    headers={"Content-Type": "application/json", "Accept": "application/json"})
try:
    with urllib.request.urlopen(request, context=context, timeout=120) as answer:
        status, body = answer.status, answer.read()
except urllib.error.HTTPError as exc:
    status, body = exc.code, exc.read()
print(status)
print(body.decode(errors="replace"))
"""


# --------------------------------------------------------------------------- helpers


def api(cluster, notebook_user, fun, kwarg=None, client="runner", **low):
    """(HTTP status, answer) of one salt-api call made from ``notebook_user``'s notebook;
    ``low`` overrides the credentials or adds target keys (tgt, arg)."""
    low = dict(low, client=client, fun=fun)
    if kwarg is not None:
        low["kwarg"] = kwarg
    code, output = cluster.notebook_exec(notebook_user, ["python3", "-c", _API_CALL,
                                                         json.dumps(low)])
    assert code == 0, output
    status, _, body = output.partition("\n")
    try:
        return int(status), json.loads(body)
    except json.JSONDecodeError:
        return int(status), body


def refused(status, answer):
    """Whether salt-api refused the call: 401 (authentication or the ACL), or 400 for a
    client salt-api does not serve at all (only ``runner`` is enabled)."""
    return status == 401 or status == 400 and "Client disabled" in str(answer)


def no_such_function(status, answer):
    """salt-api's answer for a runner function that does not exist, before any check of
    who asks: 500 and nothing else."""
    return status == 500 and answer == {"return": "An unexpected error occurred",
                                        "status": 500}


def mpi(cluster, user, *argv):
    """Run the notebook's ``mpi`` command as the user does; (exit code, output)."""
    return cluster.notebook_exec(user, ["mpi", *argv])


def mpi_json(cluster, user, *argv):
    """``mpi ... --json``: (exit code, the answer). Progress lines (``mpi run`` prints
    them on stderr, which docker exec hands back with stdout) come before the JSON."""
    # (--json right after the command: after the program, it would be the program's)
    code, output = mpi(cluster, user, argv[0], "--json", *argv[1:])
    start = min((i for i in (output.find("{"), output.find("[")) if i >= 0), default=0)
    return code, json.JSONDecoder().raw_decode(output[start:])[0]


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
    assert me["user"] == ANN and me["account"] == mpi_config.user_for_identity(ANN)
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
    status, answer = api(cluster, ANN, "mpi.submit",
                         {"image": "notebook", "np": 1, "cmd": "hostname", "walltime": 2})
    assert status == 200 and "has no unit" in answer["return"][0]["error"], answer


# ------------------------------------------------------------------- A against B


@pytest.fixture
def bobs_job(cluster, notebooks):
    """A job of Bob's, running."""
    code, job = mpi_json(cluster, BOB, "submit", "-n", "1", "-J", "bobs", "sleep", "120")
    assert code == 0, job
    deadline = time.monotonic() + 60
    while job["state"] != "running":
        assert time.monotonic() < deadline, job
        time.sleep(0.5)
        _, job = mpi_json(cluster, BOB, "status", job["job_id"])
    yield job["job_id"]
    mpi(cluster, BOB, "cancel", job["job_id"])


def test_a_user_cannot_see_or_touch_another_users_job(cluster, notebooks, bobs_job):
    _, listed = mpi_json(cluster, ANN, "list")
    assert bobs_job not in {j["job_id"] for j in listed}
    _, history = mpi_json(cluster, ANN, "history")
    assert all(j["user"] == mpi_config.user_for_identity(ANN) for j in history)
    for argv in (["status", bobs_job], ["logs", bobs_job], ["cancel", bobs_job],
                 ["wait", bobs_job, "--timeout", "1"]):
        code, output = mpi(cluster, ANN, *argv)
        assert code != 0 and "no such job" in output, (argv, output)
    # The same calls straight to the API, and an id that does not exist: one answer.
    for fun in ("mpi.status", "mpi.logs", "mpi.cancel", "mpi.wait"):
        for job_id in (bobs_job, "20990101-000000-abcdef"):
            status, answer = api(cluster, ANN, fun, {"job_id": job_id})
            assert answer["return"][0]["error"] == f"no such job: {job_id}", answer
    _, job = mpi_json(cluster, BOB, "status", bobs_job)
    assert job["state"] == "running", job  # Bob's job did not notice


def test_a_user_cannot_submit_as_another(cluster, notebooks):
    for user in (BOB, "root", mpi_config.user_for_identity(BOB)):
        status, answer = api(cluster, ANN, "mpi.submit",
                             {"user": user, "image": "notebook", "np": 1, "cmd": "hostname"})
        result = answer["return"][0]
        assert result["state"] == "rejected" and "user cannot be chosen" in result["error"]
    # Ann's token under Bob's name: the hub says whose token it is.
    status, answer = api(cluster, ANN, "mpi.whoami", username=BOB)
    assert refused(status, answer), answer
    _, bobs = mpi_json(cluster, BOB, "list")
    assert not [j for j in bobs if j["state"] in ("queued", "starting", "running")
                and j.get("name") != "bobs"]


def test_a_user_cannot_take_another_users_directory_by_registering_its_mapped_name(
        cluster, notebooks):
    squatter = mpi_config.user_for_identity(ANN)  # a valid hub name of its own
    token = cluster.hub_token(squatter)
    status, answer = api(cluster, ANN, "mpi.whoami", username=squatter, password=token)
    assert status == 200 and "belongs to another hub user" in answer["return"][0]["error"]
    cluster.delete_hub_user(squatter)


# ------------------------------------------------------------------------- tokens


def test_forged_expired_and_revoked_tokens_are_refused(cluster, notebooks):
    assert api(cluster, ANN, "mpi.whoami")[0] == 200  # the notebook's own token works
    status, answer = api(cluster, ANN, "mpi.whoami", password="f" * 32)
    assert refused(status, answer), answer
    expiring = cluster.hub_token(ANN, expires_in=1)
    time.sleep(2.5)
    status, answer = api(cluster, ANN, "mpi.whoami", password=expiring)
    assert refused(status, answer), answer
    revoked = cluster.hub_token(ANN)
    assert api(cluster, ANN, "mpi.whoami", password=revoked)[0] == 200
    _, tokens = cluster.hub_api("GET", f"/users/{ANN}/tokens")
    token_id = [t["id"] for t in tokens["api_tokens"] if t["note"] == "dmpi-cluster test token"]
    for found in token_id:
        cluster.hub_api("DELETE", f"/users/{ANN}/tokens/{found}")
    status, answer = api(cluster, ANN, "mpi.whoami", password=revoked)
    assert refused(status, answer), answer


def test_a_token_of_a_user_the_hub_deleted_is_refused(cluster, notebooks):
    token = cluster.hub_token("leaver")
    assert api(cluster, ANN, "mpi.whoami", username="leaver", password=token)[0] == 200
    cluster.delete_hub_user("leaver")
    status, answer = api(cluster, ANN, "mpi.whoami", username="leaver", password=token)
    assert refused(status, answer), answer


def test_a_service_token_is_not_a_user(cluster, notebooks):
    from tests.cluster.testcluster import hub_admin_token

    status, answer = api(cluster, ANN, "mpi.whoami", username="dockermpi-admin",
                         password=hub_admin_token())
    assert refused(status, answer), answer


# --------------------------------------------------------------------- nothing else


@pytest.mark.parametrize("client, fun, extra", [
    ("local", "test.ping", {"tgt": "*"}),
    ("local", "cmd.run", {"tgt": "*", "arg": ["id"]}),
    ("local", "state.apply", {"tgt": "node1"}),
    ("local", "mpi_job.jobs", {"tgt": "node1"}),
    ("runner", "mpi.add_user", {"kwarg": {"user": "x"}}),
    ("runner", "mpi.users", {}),
    ("runner", "mpi.nodes", {}),
    ("runner", "mpi.migrate_users", {}),
    ("runner", "mpi.drain", {"kwarg": {"node": "node1", "reason": "mine now"}}),
    ("runner", "mpi.resume", {"kwarg": {"node": "node1"}}),
    ("runner", "mpi.prune", {}),
    ("runner", "mpi.backup", {}),
    ("runner", "mpi.restore", {"kwarg": {"path": "/tmp/x"}}),
    ("runner", "jobs.list_jobs", {}),
    ("runner", "saltutil.sync_all", {}),
    ("runner", "state.orchestrate", {"kwarg": {"mods": "x"}}),
    ("wheel", "key.list_all", {}),
    ("wheel", "key.accept", {"kwarg": {"match": "*"}}),
])
def test_a_hub_token_calls_nothing_but_the_users_job_functions(cluster, notebooks, client,
                                                               fun, extra):
    status, answer = api(cluster, ANN, fun, client=client, **extra)
    assert refused(status, answer), answer


@pytest.mark.parametrize("fun", ["mpi.node_report", "mpi.tick", "mpi.schedule",
                                 "mpi.submitx", "mpi_engine.public"])
def test_the_engine_has_no_entry_point_a_hub_token_or_anyone_could_call(cluster, notebooks,
                                                                         fun):
    # The job engine is a process in the master, not a Salt function; a name the ACL's
    # anchored pattern does not cover is not callable either.
    status, answer = api(cluster, ANN, fun)
    assert refused(status, answer) or no_such_function(status, answer), answer
    code, output = cluster.salt(["salt-run", fun], check=False)
    assert "is not available" in output, output


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


def test_the_api_listens_only_with_tls(cluster):
    code, output = cluster.exec("hub", ["python3", "-c",
        "import urllib.request; urllib.request.urlopen("
        f"'http://{MASTER_ADDR}:8000/', timeout=5)"], check=False)
    assert code != 0, output
