"""Unit tests of the notebook's DockerMPI client (images/notebook/dockermpi): how ``mpi``
arguments become runner arguments, how records and tables read, and how every answer
salt-api's rest_cherrypy can give (Salt 3008) becomes a result or a clear error.

The HTTP tests talk to a real local HTTP server that answers like salt-api."""

import http.server
import io
import json
import pathlib
import socket
import sys
import threading

import pytest
from cherrypy._cperror import get_error_page

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "images" / "notebook"))

import dockermpi  # noqa: E402
from dockermpi import cli, render  # noqa: E402
from dockermpi.client import Client, salt_api_result  # noqa: E402

JOB = "20261201-114410-dbd5d6"
ENV = {
    "DOCKERMPI_API_URL": "http://127.0.0.1:1",
    "DOCKERMPI_IMAGE": "notebook",
    "JUPYTERHUB_USER": "alice",
    "JUPYTERHUB_API_TOKEN": "0123abcd",
}


@pytest.fixture(autouse=True)
def hub_environment(monkeypatch):
    for name in ("DOCKERMPI_API_URL", "DOCKERMPI_API_CA", "DOCKERMPI_IMAGE", "JUPYTERHUB_USER",
                 "JUPYTERHUB_API_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)


def record(state="succeeded", **fields):
    return {"job_id": JOB, "name": "pi", "user": "alice", "state": state, "np": 6,
            "exit_code": 0 if state == "succeeded" else None,
            "placement": {"node1": 2, "node2": 2, "node3": 2},
            "submitted": 1_764_589_450.0, "started": 1_764_589_451.0,
            "ended": 1_764_589_454.5 if state == "succeeded" else None,
            "explanation": "all 6 ranks exited 0" if state == "succeeded" else None,
            "reason": None, "waiting_for": None,
            "history": [{"state": "queued", "at": 1_764_589_450.0, "reason": None}],
            "output": {"dir_in_job": f"/data/mpi-jobs/{JOB}"},
            "retcode": 0 if state == "succeeded" else 1, **fields}


def parse(argv):
    return cli.build_parser().parse_args(argv)


# --- mpi submit/run arguments -> mpi.submit kwarg ------------------------------------------
def test_submit_options_map_to_runner_arguments(monkeypatch):
    monkeypatch.chdir("/tmp")  # -D is relative to where mpi runs, like Slurm's
    args = parse(["submit", "-n", "6", "-N", "3", "--ntasks-per-node", "2", "-t", "30",
                  "-J", "pi", "-D", "work", "--image", "mpi", "--export", "OMP_NUM_THREADS=1",
                  "--export", "GREETING=a=b", "python3", "pi.py"])
    assert cli.submit_args(args) == {
        "cmd": ["python3", "pi.py"], "np": 6, "image": "mpi", "name": "pi", "nodes": 3,
        "slots_per_node": 2, "walltime": "30m", "env": {"OMP_NUM_THREADS": "1",
                                                        "GREETING": "a=b"},
        "workdir": "/tmp/work",
    }


@pytest.mark.parametrize("argv, program", [
    (["-n", "2", "python3", "x.py", "-n", "5", "--json", "-t", "1"],
     ["python3", "x.py", "-n", "5", "--json", "-t", "1"]),
    (["-n", "2", "--", "-weird-program", "--image", "x"], ["-weird-program", "--image", "x"]),
    (["./a.out", "--", "x"], ["./a.out", "--", "x"]),
])
def test_program_options_are_the_programs(argv, program):
    args = parse(["run"] + argv)
    assert cli.submit_args(args)["cmd"] == program
    assert cli.submit_args(args)["image"] is None
    assert args.json is False


@pytest.mark.parametrize("given, sent", [("30", "30m"), ("90s", "90s"), ("2h", "2h"),
                                         ("10:00", "10:00"), ("1-02:00:00", "1-02:00:00")])
def test_a_bare_walltime_is_minutes_like_slurm_others_go_as_written(given, sent):
    assert cli.submit_args(parse(["submit", "-t", given, "hostname"]))["walltime"] == sent


def test_nodes_are_a_count_or_passed_as_written():
    assert cli.submit_args(parse(["submit", "-N", "G@rack:a", "hostname"]))["nodes"] == "G@rack:a"
    assert cli.submit_args(parse(["submit", "-N", "node1,node2", "hostname"]))["nodes"] == \
        "node1,node2"


def test_ranks_default_to_one_or_nodes_times_ranks_per_node():
    assert cli.submit_args(parse(["submit", "hostname"]))["np"] == 1
    assert cli.submit_args(parse(["submit", "-N", "3", "--ntasks-per-node", "4",
                                  "hostname"]))["np"] == 12


def test_submit_without_program_is_refused():
    with pytest.raises(dockermpi.DockerMPIError, match="no program"):
        cli.submit_args(parse(["submit", "-n", "2"]))


def test_export_needs_name_and_value(capsys):
    with pytest.raises(SystemExit):
        parse(["submit", "--export", "NOVALUE", "hostname"])
    assert "expected NAME=VALUE" in capsys.readouterr().err


def test_history_dates_become_epoch_seconds():
    args = parse(["history", "--since", "2026-12-01", "--until", "1764600000"])
    assert isinstance(args.since, float) and args.until == 1_764_600_000.0


def test_submit_sends_the_command_as_a_list_of_words_and_leaves_out_unset_options():
    client = Client()
    calls = []
    client.call = lambda fun, **kwarg: calls.append((fun, kwarg)) or record("queued")
    client.submit("python3 'my script.py' --n 3", np=4)
    assert calls == [("submit", {"image": "notebook", "np": 4,
                                 "cmd": ["python3", "my script.py", "--n", "3"], "name": None,
                                 "nodes": None, "slots_per_node": None, "walltime": None,
                                 "env": None, "workdir": None})]


# --- rendering ---------------------------------------------------------------------------
@pytest.mark.parametrize("seconds, text", [(0, "0:00"), (59.6, "1:00"), (3_725, "1:02:05"),
                                           (90_061, "1-01:01:01"), (None, "-")])
def test_durations_read_like_slurm(seconds, text):
    assert render.duration(seconds) == text


def test_outcome_line_says_state_exit_code_placement_and_explanation():
    assert render.outcome_line(record()) == (
        f"mpi: job {JOB} succeeded, exit code 0, on node1:2,node2:2,node3:2: "
        "all 6 ranks exited 0")
    failed = record("failed", exit_code=139, reason="rank 2 was killed by SIGSEGV")
    assert render.outcome_line(failed).endswith("exit code 139, on node1:2,node2:2,node3:2: "
                                                "rank 2 was killed by SIGSEGV")


def test_record_text_lists_the_fields_people_ask_about():
    text = render.record_text(record(closed=True))
    assert text.splitlines()[0] == f"job {JOB} (pi)"
    for expected in ("state        succeeded (cleaned up)", "exit code    0",
                     "placement    node1:2,node2:2,node3:2", "elapsed      0:04",
                     f"output       /data/mpi-jobs/{JOB}", "history"):
        assert expected in text
    assert "waiting for" not in text


def test_queue_shows_why_queued_jobs_wait_and_where_running_ones_run():
    rows = [record("running", started=1000.0, ended=None),
            record("queued", job_id="20261201-114411-000001", name=None, started=None,
                   placement=None, waiting_for="resources")]
    lines = render.queue_text(rows, now=1125.0).splitlines()
    assert lines[0].split() == ["JOBID", "NAME", "USER", "STATE", "NP", "TIME",
                                "NODELIST(REASON)"]
    assert lines[1].split() == [JOB, "pi", "alice", "running", "6", "2:05",
                                "node1:2,node2:2,node3:2"]
    assert lines[2].split() == ["20261201-114411-000001", "-", "alice", "queued", "6", "0:00",
                                "(resources)"]


def test_history_table_has_one_row_per_ended_job():
    rows = [dict(record(), elapsed=3.5, core_hours=0.0058)]
    lines = render.history_text(rows).splitlines()
    assert lines[0].split()[:8] == ["JOBID", "NAME", "STATE", "EXIT", "NP", "ELAPSED",
                                    "CORE-H", "ENDED"]
    assert lines[1].split()[:7] == [JOB, "pi", "succeeded", "0", "6", "0:04", "0.01"]
    assert lines[1].endswith("all 6 ranks exited 0")


def test_empty_tables_are_just_headers():
    assert render.queue_text([]).split() == ["JOBID", "NAME", "USER", "STATE", "NP", "TIME",
                                             "NODELIST(REASON)"]


# --- salt-api answers -> results or errors (shapes from rest_cherrypy and RunnerClient) ---
def test_the_runner_result_is_the_first_return():
    assert salt_api_result("mpi.status", {"return": [record()]}) == record()
    assert salt_api_result("mpi.list", {"return": [[]]}) == []
    assert salt_api_result("mpi.logs", {"return": ["hello\n"]}) == "hello\n"


def test_a_failed_job_is_a_result_not_an_error():
    failed = record("failed", exit_code=3, retcode=1)
    assert salt_api_result("mpi.wait", {"return": [failed]}) == failed


def test_a_rejected_submit_is_a_job_error_carrying_the_answer():
    answer = {"state": "rejected", "error": "np must be at least 1", "retcode": 1}
    with pytest.raises(dockermpi.JobError, match="np must be at least 1") as caught:
        salt_api_result("mpi.submit", {"return": [answer]})
    assert caught.value.result == answer


def test_a_runner_refusal_is_a_job_error():
    with pytest.raises(dockermpi.JobError, match=f"no job {JOB}"):
        salt_api_result("mpi.status", {"return": [{"error": f"no job {JOB}", "retcode": 1}]})


def test_an_exception_in_the_runner_gives_its_last_traceback_line():
    text = ("Exception occurred in runner mpi.nosuch: Traceback (most recent call last):\n"
            '  File "salt/client/mixins.py", line 386, in low\n'
            "salt.exceptions.CommandExecutionError: 'mpi.nosuch' is not available.\n")
    with pytest.raises(dockermpi.APIError, match="mpi.nosuch failed on the master: "
                                                 "salt.exceptions.CommandExecutionError: "
                                                 "'mpi.nosuch' is not available."):
        salt_api_result("mpi.nosuch", {"return": [text]})


def test_arguments_the_runner_does_not_take_are_an_api_error():
    text = ("\nPassed invalid arguments: logs() got an unexpected keyword argument 'offset'."
            "\n\nUsage:\n...")
    with pytest.raises(dockermpi.APIError, match="unexpected keyword argument 'offset'"):
        salt_api_result("mpi.logs", {"return": [text]})


@pytest.mark.parametrize("body", [{}, {"return": []}, {"status": 500}, []])
def test_unexpected_answers_are_api_errors(body):
    with pytest.raises(dockermpi.APIError, match="unexpected answer"):
        salt_api_result("mpi.status", body)


class FakeSaltAPI(http.server.BaseHTTPRequestHandler):
    """Answers POST /run with the server's next canned (status, content type, body)."""

    def do_POST(self):
        length = int(self.headers["Content-Length"])
        self.server.requests.append((self.path, dict(self.headers),
                                     json.loads(self.rfile.read(length))))
        status, content_type, body = self.server.answer
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def salt_api(monkeypatch):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeSaltAPI)
    server.requests = []
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    monkeypatch.setenv("DOCKERMPI_API_URL", f"http://127.0.0.1:{server.server_port}/")
    yield server
    server.shutdown()
    server.server_close()


def cherrypy_error_page(status, message):
    """The page salt-api sends for an HTTPError: cherrypy's HTML one (rest_cherrypy
    sets no JSON error page)."""
    return get_error_page(status, message=message)


def test_every_call_posts_one_runner_chunk_with_the_hub_credentials(salt_api):
    salt_api.answer = (200, "application/json", json.dumps({"return": [record()]}).encode())
    assert Client().wait(JOB, timeout=0) == record()
    path, headers, body = salt_api.requests[0]
    assert path == "/run"
    assert headers["Accept"] == "application/json"
    assert headers["Content-Type"] == "application/json"
    assert body == [{"client": "runner", "fun": "mpi.wait", "eauth": "jupyterhub",
                     "username": "alice", "password": "0123abcd",
                     "kwarg": {"job_id": JOB, "timeout": 0}}]


@pytest.mark.parametrize("status, message", [
    (401, 'Authentication failure of type "eauth" occurred for user alice.'),
    (403, "Bad IP"),
], ids=["401", "403"])
def test_a_refused_token_says_to_restart_the_server(salt_api, status, message):
    salt_api.answer = (status, "text/html", cherrypy_error_page(status, message))
    with pytest.raises(dockermpi.TokenRefusedError, match="restart your server from the hub"):
        Client().whoami()


@pytest.mark.parametrize("status, content_type, body, expected", [
    (503, "text/html", cherrypy_error_page(503, "Salt Master is not available."),
     "HTTP 503 Service Unavailable: Salt Master is not available."),
    (400, "text/html", cherrypy_error_page(400, "Client disabled: 'runner'."),
     "HTTP 400 Bad Request: Client disabled: 'runner'."),
    (504, "text/html", cherrypy_error_page(504, None),
     "HTTP 504 Gateway Timeout: The gateway server did not receive a timely response"),
    (500, "application/json", json.dumps({"status": 500,
                                           "return": "An unexpected error occurred"}).encode(),
     "HTTP 500 Internal Server Error: An unexpected error occurred"),
], ids=["master down", "client disabled", "runner timeout", "unexpected error"])
def test_other_http_errors_say_what_salt_api_said(salt_api, status, content_type, body,
                                                  expected):
    salt_api.answer = (status, content_type, body)
    with pytest.raises(dockermpi.APIError) as caught:
        Client().status(JOB)
    assert str(caught.value) == f"mpi.status: the DockerMPI API answered {expected}"


def test_a_closed_port_is_unreachable(monkeypatch):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"https://127.0.0.1:{port}"
    monkeypatch.setenv("DOCKERMPI_API_URL", url)
    with pytest.raises(dockermpi.APIUnreachableError,
                       match=f"cannot reach the DockerMPI API at {url}: .*refused"):
        Client().whoami()


def test_tls_to_a_plain_http_server_is_unreachable(salt_api, monkeypatch):
    url = f"https://127.0.0.1:{salt_api.server_port}"
    monkeypatch.setenv("DOCKERMPI_API_URL", url)
    with pytest.raises(dockermpi.APIUnreachableError, match=f"cannot reach .* at {url}: "):
        Client().whoami()


def test_missing_configuration_is_named(monkeypatch):
    monkeypatch.delenv("JUPYTERHUB_USER")
    monkeypatch.delenv("JUPYTERHUB_API_TOKEN")
    with pytest.raises(dockermpi.DockerMPIError,
                       match="JUPYTERHUB_USER, JUPYTERHUB_API_TOKEN not set"):
        Client(url="https://master:8000")


# --- the mpi command ---------------------------------------------------------------------
def test_mpi_without_configuration_prints_one_clear_line(monkeypatch, capsys):
    monkeypatch.delenv("DOCKERMPI_API_URL")
    assert cli.main(["whoami"]) == 1
    assert capsys.readouterr().err == (
        "mpi: DockerMPI is not configured here: DOCKERMPI_API_URL not set (the hub sets them "
        "in the servers it starts; outside one, set them yourself)\n")


def test_a_rejected_submit_prints_the_error_and_fails(salt_api, capsys):
    answer = {"state": "rejected", "error": "image 'x' is not approved", "retcode": 1}
    salt_api.answer = (200, "application/json", json.dumps({"return": [answer]}).encode())
    assert cli.main(["submit", "--image", "x", "hostname"]) == 1
    assert capsys.readouterr().err == "mpi: image 'x' is not approved\n"
    assert cli.main(["submit", "--json", "hostname"]) == 1
    assert json.loads(capsys.readouterr().out) == answer


class ScriptedClient(Client):
    """A client whose runner answers come from a script, one per call, in order."""

    def __init__(self, answers):
        super().__init__()
        self.answers = list(answers)
        self.calls = []

    def call(self, fun, http_timeout=None, **kwarg):
        self.calls.append((fun, kwarg))
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer


def logs_chunk(data, offset):
    return {"data": data, "offset": offset}


def test_run_shows_states_and_output_as_they_come_and_returns_the_final_record():
    client = ScriptedClient([
        record("queued", exit_code=None, waiting_for="resources"),  # submit
        record("running"),                                          # status
        logs_chunk("rank 0\n", 7),                                  # stdout
        dockermpi.JobError("no output yet"),                        # stderr: no file yet
        record("succeeded"),
        logs_chunk("rank 1\n", 14), logs_chunk("warning\n", 8),
    ])
    out, err = io.StringIO(), io.StringIO()
    final = client.run(["python3", "pi.py"], np=6, poll=0, out=out, err=err)
    assert final == record("succeeded")
    assert out.getvalue() == "rank 0\nrank 1\n"
    assert err.getvalue().splitlines() == [
        f"mpi: job {JOB} queued (resources)",
        f"mpi: job {JOB} running",
        f"mpi: job {JOB} succeeded",
        "warning",
        render.outcome_line(record("succeeded")),
    ]
    assert [(kwarg["stream"], kwarg["offset"]) for fun, kwarg in client.calls
            if fun == "logs"] == [("stdout", 0), ("stderr", 0), ("stdout", 7), ("stderr", 0)]


def test_following_reads_full_chunks_until_a_short_one():
    client = ScriptedClient([logs_chunk("a" * 10, 10), logs_chunk("b" * 8, 18),
                             logs_chunk("c" * 4, 22)])
    client.log_chunk = 10
    out = io.StringIO()
    assert client.follow(JOB, out=out, err=io.StringIO(), first=record(),
                         streams=("stdout",)) == record()
    assert out.getvalue() == "a" * 10 + "b" * 8 + "c" * 4
    assert [kwarg["offset"] for _, kwarg in client.calls] == [0, 10, 18]


def test_interrupting_run_cancels_the_job():
    client = ScriptedClient([record("queued"), KeyboardInterrupt(), record("cancelled")])
    err = io.StringIO()
    with pytest.raises(KeyboardInterrupt):
        client.run("sleep 100", poll=0, out=io.StringIO(), err=err)
    assert client.calls[-1] == ("cancel", {"job_id": JOB})
    assert err.getvalue().splitlines()[-2:] == [f"mpi: interrupted: cancelling job {JOB}",
                                                f"mpi: job {JOB} cancelled"]


def test_wait_returns_the_record_when_its_time_is_up():
    client = ScriptedClient([record("running")])
    assert client.wait(JOB, timeout=0)["state"] == "running"
    assert client.calls == [("wait", {"job_id": JOB, "timeout": 0})]


@pytest.mark.parametrize("job, status", [
    (record("succeeded"), 0), (record("failed", exit_code=3), 3),
    (record("timed_out", exit_code=None), 1), (record("failed", exit_code=300), 1),
])
def test_mpi_run_exits_with_the_jobs_exit_code(job, status):
    assert cli.job_exit_status(job) == status
