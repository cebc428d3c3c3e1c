"""
A job in a notebook cell: what ``%%mpi``, ``%mpi run`` and ``Client.run`` show while the
job queues, runs and ends.

On top, one line says where the job is: queued (why, its place in the queue and how
long it has waited), starting, running (where, and its run time against its walltime,
with a bar), then how it ended (exit code, the rank that failed first and, under
``%%mpi``, that rank's traceback). While the job may still run, a Cancel button beside
it interrupts the kernel through the notebook server, as the kernel's own stop button
does; the running call takes the interrupt and cancels the job. Under it, the job's
output as it comes (the last LINES_SHOWN lines; the job's files keep all).

Both are display outputs updated in place, ticking once a second while the job waits or
runs. The button is plain HTML rather than an ipywidgets button on purpose: a widget's
click is a message to the kernel, which it reads only once the cell is done, and the
cell is busy following the job. In a terminal IPython, lines are printed as they come.
"""

import contextvars
import html
import os
import re
import threading
import time

from dockermpi.render import FINAL_STATES, duration, progress_line

KERNEL_FILE_RE = re.compile(r"kernel-([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\.json")
#: The Cancel button's click: the notebook server's own interrupt of this kernel (the
#: page's base URL and XSRF cookie, as JupyterLab itself calls it). KERNEL is the
#: kernel's id.
CANCEL_CLICK = (
    "this.disabled=true;this.textContent='Cancelling...';"
    "var c=JSON.parse(document.getElementById('jupyter-config-data').textContent);"
    "var x=(document.cookie.match(/(?:^|; )_xsrf=([^;]*)/)||[])[1];"
    "fetch(c.baseUrl+'api/kernels/KERNEL/interrupt',{method:'POST',credentials:'same-origin',"
    "headers:x?{'X-XSRFToken':decodeURIComponent(x)}:{}});")
LINES_SHOWN = 500  # the output's last lines shown in the cell; the job's files keep all
REDRAW_SECONDS = 0.5  # the output is drawn again at most this often while it comes
TICK_SECONDS = 1.0  # the state line's clock advances this often while the job waits or runs


def jupyter_shell():
    """The IPython shell of the Jupyter kernel this code runs in, or None (a terminal,
    a script, IPython's terminal shell)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    return shell if type(shell).__name__ == "ZMQInteractiveShell" else None


def kernel_id():
    """This Jupyter kernel's id (from its connection file's name), or None."""
    try:
        from ipykernel.connect import get_connection_file
        name = os.path.basename(get_connection_file())
    except (ImportError, RuntimeError, AttributeError):
        return None
    found = KERNEL_FILE_RE.fullmatch(name)
    return found.group(1) if found else None


def notebook_origin(shell):
    """The notebook (as Jupyter names the kernel's session) and cell a job comes from."""
    origin = {}
    notebook = os.environ.get("JPY_SESSION_NAME")
    if notebook and notebook.isprintable():
        origin["notebook"] = notebook[-512:]
    count = cell_number(shell)
    if count is not None:
        origin["cell"] = count
    return origin or None


def cell_number(shell):
    """The running cell's number (its ``In [n]``): IPython counts the cell before it
    runs, so ``execution_count`` is already the next one's."""
    count = getattr(shell, "execution_count", None)
    return count - 1 if isinstance(count, int) and count >= 1 else None


class JobOutput:
    """A job's stdout and stderr, taken as they come and cut into lines, each given to
    ``add(stream, line)``; ``changed`` says whether any came since the last drawing.
    ``new_lines()`` gives the lines to print that were not given before (a terminal's
    view)."""

    def __init__(self):
        self.partial = {"stdout": "", "stderr": ""}
        self.changed = False
        self.printed = {}  # per part of the output: how many of its lines were given

    def take(self, stream, text):
        lines = (self.partial[stream] + text).split("\n")
        self.partial[stream] = lines.pop()
        for line in lines:
            self.add(stream, line)

    def finish(self):
        """The job has ended: its last lines, even with no newline at their end."""
        for stream, part in self.partial.items():
            if part:
                self.add(stream, part)
            self.partial[stream] = ""

    def add(self, stream, line):
        raise NotImplementedError

    def _unprinted(self, part, lines, dropped):
        """Of ``part``'s kept ``lines`` (``dropped`` more went before them), the texts
        not given yet."""
        total = len(lines) + dropped
        seen = self.printed.get(part, 0)
        self.printed[part] = total
        return [text for _, text in lines[max(0, len(lines) - (total - seen)):]]


class OutputTail(JobOutput):
    """A job's stdout and stderr as they come, in that order: the last LINES_SHOWN
    lines as ``(stream, text)``, and how many earlier ones were dropped."""

    def __init__(self):
        super().__init__()
        self.lines = []
        self.dropped = 0

    def add(self, stream, line):
        self.lines.append((stream, line))
        if len(self.lines) > LINES_SHOWN:
            del self.lines[0]
            self.dropped += 1
        self.changed = True

    def first_failure(self, record):
        return None  # the state line names the rank; its traceback is in stderr above

    def new_lines(self):
        return self._unprinted(None, self.lines, self.dropped)

    def plain(self):
        head = [f"... {self.dropped} earlier lines in the job's files"] if self.dropped else []
        return "\n".join(head + [text for _, text in self.lines])

    def html(self):
        body = "".join(
            f'<div style="{"color:#c00" if stream == "stderr" else ""}">'
            f"{html.escape(text) or '&nbsp;'}</div>" for stream, text in self.lines)
        if self.dropped:
            body = f"<div><i>... {self.dropped} earlier lines in the job's files</i></div>" + body
        return ('<div class="dockermpi-output" style="font-family:monospace;'
                f'white-space:pre-wrap">{body}</div>')


class JobInterrupted(KeyboardInterrupt):
    """Following a job in its view was interrupted, and the job cancelled: ``record`` is
    its record after the cancel."""

    def __init__(self, record):
        super().__init__(f"cancelled job {record.get('job_id')}")
        self.record = record


class JobView:
    """What a cell shows of one job: the state line (with a Cancel button while the job
    may run, then the first failing rank) on top, the job's ``output`` (an OutputTail,
    or the magic's per-rank output) under it.

    ``show(record)`` takes each state record, ``sink(stream)`` is where the job's output
    goes, ``end(record)`` the final record. ``rich``: a Jupyter kernel's displays,
    updated in place and ticking; else printed lines. ``clock`` gives the epoch time."""

    def __init__(self, output, rich, kernel=None, clock=time.time):
        self.output = output
        self.rich = rich
        self.kernel = kernel
        self.clock = clock
        self.record = {}
        self.note = None
        self.ended = False
        self.failure = None
        self.drawn = 0.0
        self.said = None
        self.lock = threading.Lock()
        self.stop = threading.Event()
        if rich:
            from IPython.display import display
            self.head = display(self.head_bundle(), raw=True, display_id=True)
            self.body = display({"text/plain": ""}, raw=True, display_id=True)
            # The cell's context goes with the clock's thread, so that its updates are
            # the cell's output in every ipykernel.
            ticker = threading.Thread(target=contextvars.copy_context().run, args=(self._tick,),
                                      name="dockermpi-job-view", daemon=True)
            ticker.start()

    # ------------------------------------------------------------------ the state line
    def state_text(self, now):
        """The state line; ``now`` None leaves out the times (a terminal's line)."""
        if self.note:
            return self.note
        return progress_line(self.record, now) if self.record else "mpi: submitting"

    def head_bundle(self):
        text = self.state_text(self.clock())
        button = ""
        if self.kernel and not self.ended and self.record.get("state") not in FINAL_STATES:
            click = html.escape(CANCEL_CLICK.replace("KERNEL", self.kernel), quote=True)
            button = (f' <button class="dockermpi-cancel" title="interrupt the kernel: the '
                      f'job is cancelled" onclick="{click}">Cancel job</button>')
        markup = f'<div class="dockermpi-state"><b>{html.escape(text)}</b>{button}'
        bar = self.walltime_bar()
        if bar:
            markup += f"<br>{bar}"
        markup += "</div>"
        if self.failure:
            rank, lines = self.failure
            text += f"\nrank {rank} failed:\n" + "\n".join(lines)
            markup += (f'<div style="color:#c00"><b>rank {html.escape(str(rank))} failed:'
                       f'</b><pre>{html.escape(chr(10).join(lines))}</pre></div>')
        return {"text/plain": text, "text/html": markup}

    def walltime_bar(self):
        """A running job's run time against its walltime, as a bar, or ''."""
        record = self.record
        if self.ended or record.get("state") != "running" or not record.get("started") \
                or not record.get("walltime"):
            return ""
        ran = max(0.0, self.clock() - record["started"])
        return (f'<progress class="dockermpi-walltime" max="{int(record["walltime"])}" '
                f'value="{int(min(ran, record["walltime"]))}" style="width:20em" '
                f'title="{duration(ran)} of the walltime {duration(record["walltime"])}">'
                "</progress>")

    def _draw_head(self):
        with self.lock:
            if self.rich:
                self.head.update(self.head_bundle(), raw=True)
                return
            said = self.state_text(None)
            if said != self.said:
                self.said = said
                print(said, flush=True)

    def _tick(self):
        while not self.stop.wait(TICK_SECONDS):
            if self.record.get("state") in ("queued", "running") and not self.note:
                self._draw_head()

    def show(self, record):
        """A state record of the job (a final one ends the view)."""
        if record.get("state") in FINAL_STATES:
            self.end(record)
            return
        self.record = record
        self._draw_head()

    def say(self, line):
        """A line of DockerMPI's own in place of the state (``interrupted: ...``)."""
        self.note = line
        self._draw_head()

    def follow(self, client, record, poll=1.0):
        """Follow the submitted job (``record``, as ``client.submit`` answered) in this
        view until it has ended; its final record. An interrupt (the Cancel button, the
        kernel's stop) cancels the job, shows so and raises JobInterrupted."""
        job_id = record["job_id"]
        try:
            final = client.follow(job_id, poll=poll, out=self.sink("stdout"),
                                  err=self.sink("stderr"), first=record, on_state=self.show)
        except KeyboardInterrupt:
            self.say(f"mpi: interrupted: cancelling job {job_id}")
            cancelled = client.cancel(job_id)
            self.end(cancelled)
            raise JobInterrupted(cancelled) from None
        self.end(final)
        return final

    # ------------------------------------------------------------------ the output
    def sink(self, stream):
        """A file-like object taking ``stream``'s text into the output."""
        return _Sink(self, stream)

    def draw(self, final=False):
        if not (final or self.output.changed) or (
                not final and time.monotonic() - self.drawn < REDRAW_SECONDS):
            return
        self.drawn = time.monotonic()
        self.output.changed = False
        if self.rich:
            self.body.update({"text/plain": self.output.plain(), "text/html": self.output.html()},
                             raw=True)
            return
        for line in self.output.new_lines():
            print(line, flush=True)

    def end(self, record):
        """The job's final record: the last output, how it ended, no more Cancel. It
        comes as the stream's last state and again when following returns: then only
        what changed is drawn again (a drawing anew would unfold what the user folded)."""
        again = self.ended
        self.stop.set()
        self.ended = True
        self.note = None
        self.output.finish()
        failure = None if record.get("state") == "succeeded" else \
            self.output.first_failure(record)
        if not again or self.output.changed:
            self.draw(final=True)
        if again and (record, failure) == (self.record, self.failure):
            return
        self.record, self.failure = record, failure
        self._draw_head()
        if failure and not self.rich:
            rank, lines = failure
            print(f"rank {rank} failed:\n" + "\n".join(lines), flush=True)


class _Sink:
    def __init__(self, view, stream):
        self.view, self.stream = view, stream

    def write(self, text):
        self.view.output.take(self.stream, text)
        self.view.draw()
        return len(text)

    def flush(self):
        pass


__all__ = ["JobInterrupted", "JobOutput", "JobView", "OutputTail", "cell_number", "jupyter_shell",
           "kernel_id", "notebook_origin"]
