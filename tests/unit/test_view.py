"""Unit tests of a job's view in a notebook cell (images/notebook/dockermpi/view.py) and of
the state line it shows (render.progress_line): what it says in each state, that it
ticks while the job waits or runs and stops at the end, the Cancel button, the output
under it. The view in a real kernel against the real API: tests/integration/test_hub.py."""

import pathlib
import sys
import threading
import time
import types

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "images" / "notebook"))

from dockermpi import render, view  # noqa: E402

KERNEL = "0b5f3a52-8f3e-4f4a-9b1e-2f6d7c8a9e10"
CONDITION_TIMEOUT = 60


def wait_until(condition, what):
    deadline = time.monotonic() + CONDITION_TIMEOUT
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.01)


def job(state, **fields):
    return {"job_id": "j1", "state": state, "np": 4, "submitted": 1000.0,
            "started": None, "walltime": 600, "placement": None, **fields}


RUNNING = job("running", started=1010.0, placement={"node1": 2, "node2": 2})


@pytest.mark.parametrize("record, now, line", [
    (job("queued", waiting_for="resources", queue_place=2), 1065.0,
     "mpi: job j1 queued (resources; place 2 in the queue), waiting 1:05"),
    (job("queued"), None, "mpi: job j1 queued"),
    (job("starting", placement={"node1": 4}), 1003.0, "mpi: job j1 starting on node1:4"),
    (RUNNING, 1072.0, "mpi: job j1 running on node1:2,node2:2, 1:02 of 10:00"),
    (RUNNING, None, "mpi: job j1 running on node1:2,node2:2"),
    (job("running", started=1010.0, walltime=None, placement={"node1": 4}), 1011.0,
     "mpi: job j1 running on node1:4, 0:01"),
    (job("succeeded", exit_code=0, explanation="all 4 ranks exited 0"), 2000.0,
     "mpi: job j1 succeeded, exit code 0: all 4 ranks exited 0"),
    (job("failed", exit_code=1, explanation="rank 3 exited with code 1",
         failure={"rank": 3, "exit_code": 1}), 2000.0,
     "mpi: job j1 failed, exit code 1: rank 3 exited with code 1"),
    (job("timed_out", exit_code=1, reason="walltime of 10:00 reached",
         failure={"rank": 2, "signal": 9, "signal_name": "SIGKILL"}), 2000.0,
     "mpi: job j1 timed_out, exit code 1: walltime of 10:00 reached; "
     "rank 2 failed first, of SIGKILL"),
])
def test_the_state_line_says_why_where_and_how_long(record, now, line):
    assert render.progress_line(record, now) == line


class Displays:
    """IPython's display(), recorded: every bundle each display showed, in order."""

    def __init__(self):
        self.shown = []
        self.lock = threading.Lock()

    def display(self, bundle, raw=False, display_id=False):
        assert raw and display_id
        history = [bundle]
        self.shown.append(history)

        def update(new, raw=False):
            with self.lock:
                history.append(new)
        return types.SimpleNamespace(update=update)

    def last(self, which):
        with self.lock:
            return self.shown[which][-1]


@pytest.fixture
def displays(monkeypatch):
    import IPython.display
    shown = Displays()
    monkeypatch.setattr(IPython.display, "display", shown.display)
    return shown


class Clock:
    def __init__(self, now):
        self.now = now

    def __call__(self):
        return self.now


def test_a_running_jobs_line_ticks_against_its_walltime_until_it_ends(displays, monkeypatch):
    monkeypatch.setattr(view, "TICK_SECONDS", 0.01)
    clock = Clock(1015.0)
    shown = view.JobView(view.OutputTail(), rich=True, kernel=KERNEL, clock=clock)
    shown.show(RUNNING)
    head = displays.last(0)
    assert head["text/plain"] == "mpi: job j1 running on node1:2,node2:2, 0:05 of 10:00"
    assert 'max="600" value="5"' in head["text/html"]
    assert f"api/kernels/{KERNEL}/interrupt" in head["text/html"]
    clock.now = 1052.0  # no new record: the line goes on by itself
    wait_until(lambda: "0:42 of 10:00" in displays.last(0)["text/plain"], "the line ticks")
    assert 'value="42"' in displays.last(0)["text/html"]
    shown.end(job("succeeded", exit_code=0, explanation="all 4 ranks exited 0"))
    final = displays.last(0)
    assert final["text/plain"] == "mpi: job j1 succeeded, exit code 0: all 4 ranks exited 0"
    assert "button" not in final["text/html"] and "<progress" not in final["text/html"]
    assert shown.stop.is_set()


def test_a_queued_jobs_line_counts_its_wait(displays, monkeypatch):
    monkeypatch.setattr(view, "TICK_SECONDS", 0.01)
    clock = Clock(1003.0)
    shown = view.JobView(view.OutputTail(), rich=True, clock=clock)
    shown.show(job("queued", waiting_for="resources", queue_place=1))
    assert displays.last(0)["text/plain"].endswith("waiting 0:03")
    clock.now = 1130.0
    wait_until(lambda: displays.last(0)["text/plain"].endswith("waiting 2:10"), "it ticks")
    assert "button" not in displays.last(0)["text/html"]  # no kernel known: no button
    shown.end(job("cancelled", reason="cancelled by request"))


def test_the_output_comes_under_the_line_stderr_marked_and_escaped(displays):
    shown = view.JobView(view.OutputTail(), rich=True, clock=Clock(1011.0))
    shown.show(RUNNING)
    shown.sink("stdout").write("hello\n<b>not bold</b>\npart")
    shown.sink("stderr").write("warning\n")
    shown.end(job("failed", exit_code=2, explanation="rank 0 exited with code 2",
                  failure={"rank": 0, "exit_code": 2}))
    body = displays.last(1)
    assert body["text/plain"] == "hello\n<b>not bold</b>\nwarning\npart"
    assert "&lt;b&gt;not bold&lt;/b&gt;" in body["text/html"]
    assert '<div style="color:#c00">warning</div>' in body["text/html"]
    assert displays.last(0)["text/plain"] == (
        "mpi: job j1 failed, exit code 2: rank 0 exited with code 2")


def test_the_streams_final_record_ends_the_view_and_the_same_end_draws_nothing_again(
        displays):
    shown = view.JobView(view.OutputTail(), rich=True, kernel=KERNEL, clock=Clock(1011.0))
    shown.show(RUNNING)
    shown.sink("stdout").write("last line, no newline")
    final = job("succeeded", exit_code=0)
    shown.show(final)  # the stream's last state: the view has ended
    assert shown.ended and "button" not in displays.last(0)["text/html"]
    assert displays.last(1)["text/plain"] == "last line, no newline"
    drawn = [len(history) for history in displays.shown]
    shown.end(final)  # following returns the same record: nothing is drawn anew
    assert [len(history) for history in displays.shown] == drawn
    shown.sink("stdout").write("late line\n")  # output after the final state
    shown.end(final)
    assert displays.last(1)["text/plain"] == "last line, no newline\nlate line"


def test_an_interrupt_note_replaces_the_line_until_the_end(displays):
    shown = view.JobView(view.OutputTail(), rich=True, kernel=KERNEL, clock=Clock(1011.0))
    shown.show(RUNNING)
    shown.say("mpi: interrupted: cancelling job j1")
    assert displays.last(0)["text/plain"] == "mpi: interrupted: cancelling job j1"
    shown.end(job("cancelled", reason="cancelled by request"))
    assert displays.last(0)["text/plain"] == (
        "mpi: job j1 cancelled: cancelled by request")


def test_the_output_keeps_its_last_lines_and_counts_the_rest():
    output = view.OutputTail()
    output.take("stdout", "".join(f"{n}\n" for n in range(view.LINES_SHOWN + 3)))
    assert len(output.lines) == view.LINES_SHOWN and output.dropped == 3
    assert output.plain().startswith("... 3 earlier lines in the job's files\n3\n")
    assert "... 3 earlier lines" in output.html()


def test_in_a_terminal_each_state_is_one_line_and_the_output_follows(capsys):
    shown = view.JobView(view.OutputTail(), rich=False, clock=Clock(1011.0))
    shown.show(job("queued", waiting_for="resources"))
    shown.show(job("queued", waiting_for="resources"))
    shown.show(RUNNING)
    shown.sink("stdout").write("one\ntwo\n")
    shown.show(RUNNING)
    shown.end(job("succeeded", exit_code=0))
    assert capsys.readouterr().out.splitlines() == [
        "mpi: job j1 queued (resources)",
        "mpi: job j1 running on node1:2,node2:2",
        "one", "two",
        "mpi: job j1 succeeded, exit code 0"]


def test_the_state_line_has_a_cancel_button_that_interrupts_this_kernel_until_the_job_ends():
    shown = view.JobView(view.OutputTail(), rich=False, kernel=KERNEL)
    shown.record = RUNNING
    markup = shown.head_bundle()["text/html"]
    assert markup.count('class="dockermpi-cancel"') == 1, markup
    assert f"api/kernels/{KERNEL}/interrupt" in markup and "X-XSRFToken" in markup, markup
    shown.record = job("succeeded", exit_code=0)  # the end's record, before end() ran
    assert "dockermpi-cancel" not in shown.head_bundle()["text/html"]
    shown.record, shown.ended = RUNNING, True
    assert "dockermpi-cancel" not in shown.head_bundle()["text/html"]


@pytest.mark.parametrize("path, expected", [
    (f"/tmp/jupyter-runtime/kernel-{KERNEL}.json", KERNEL),
    ("/tmp/jupyter-runtime/kernel-x');alert(1);('.json", None),
    ("/tmp/other.json", None)])
def test_the_kernel_id_comes_from_the_connection_files_name_and_nothing_else(
        monkeypatch, path, expected):
    connect = type(sys)("ipykernel.connect")
    connect.get_connection_file = lambda: path
    monkeypatch.setitem(sys.modules, "ipykernel", type(sys)("ipykernel"))
    monkeypatch.setitem(sys.modules, "ipykernel.connect", connect)
    assert view.kernel_id() == expected


def test_outside_a_jupyter_kernel_there_is_no_shell_to_draw_in():
    assert view.jupyter_shell() is None
