"""
``%%mpi``: run a notebook cell as an MPI job, its output streaming back into the cell.

    %%mpi -n 8 -N 2 -t 10m -o total
    from mpi4py import MPI
    total = MPI.COMM_WORLD.allreduce(MPI.COMM_WORLD.rank)
    print("rank", MPI.COMM_WORLD.rank)

The cell is written, with a small runner around it, to
``<your directory>/.dockermpi/cells/<stamp>.py`` and run there by ``python3`` on every
rank, in the notebook's image unless ``--image`` names another approved one. Every line
a rank prints comes back labelled with the rank, in one colour per rank; ``--ranks``
shows some ranks only (the job's stdout file keeps all). The first rank that raises
ends the job (``MPI_Abort`` when mpi4py is in use) and its traceback is shown above the
output. Interrupting the kernel cancels the job (the cell fails, saying so); so does the
cell's Cancel button, which asks the notebook server to interrupt this kernel. ``-o name``
brings rank 0's variables back into the notebook once the job has succeeded. The job's
record names the notebook and the cell (``origin``). Above the output, the job's state
line ticks while it waits or runs (dockermpi.view).

``%mpi command ...`` (one line) is the ``mpi`` command in the cell: ``%mpi run -n 4
python3 pi.py`` shows its job the same way; ``%mpi list``, ``%mpi history`` print.

DockerMPI's notebooks load this extension at start; elsewhere ``%load_ext dockermpi``.
"""

import html
import os
import pickle
import re
import secrets
import shlex
import time

from dockermpi.client import Client, DockerMPIError
from dockermpi.render import outcome_line
from dockermpi.view import (JobInterrupted, JobOutput, JobView, cell_number, jupyter_shell,
                            kernel_id, notebook_origin)

CELL_DIR = ".dockermpi/cells"  # under the user's directory, as the notebook and jobs see it
#: What the runner puts before each line a rank prints: MARK rank MARK, and MARK rank
#: FAILED MARK before the lines of the traceback that ended that rank.
MARK = "\x1e"
FAILED = "!"
LABELLED_RE = re.compile(r"\x1e(\d{1,7})(!?)\x1e(.*)\Z", re.S)
OTHER = "mpirun"  # lines with no rank's label: the launcher's own messages
LINES_SHOWN = 500  # a rank's last lines shown in the cell; its stdout file keeps all
ANSI_COLOURS = (34, 32, 35, 36, 33, 31)
HTML_COLOURS = ("#1f77b4", "#2ca02c", "#9467bd", "#17becf", "#bcbd22", "#d62728",
                "#8c564b", "#e377c2")

RUNNER = '''\
# Written by DockerMPI's %%mpi magic: runs one notebook cell on this MPI rank.
import linecache, os, pickle, sys, traceback

SOURCE = {source!r}
NAMES = {names!r}
RESULT = {result!r}


def rank():
    for name in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"):
        if os.environ.get(name, "").isdigit():
            return os.environ[name]
    return "0"


class Labelled(object):
    """Writes each whole line once, after this rank's label."""

    def __init__(self, stream, label):
        self.stream, self.label, self.part = stream, label, ""

    def write(self, text):
        lines = (self.part + text).split("\\n")
        self.part = lines.pop()
        if lines:
            self.stream.write("".join(self.label + line + "\\n" for line in lines))
            self.stream.flush()
        return len(text)

    def flush(self):
        if self.part:
            self.stream.write(self.label + self.part + "\\n")
            self.part = ""
        self.stream.flush()

    def isatty(self):
        return False

    def __getattr__(self, name):
        return getattr(self.stream, name)


def end_job():
    """Ends this rank so that the whole job ends now, instead of peers waiting on it."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.COMM_WORLD.Abort(1)
    os._exit(1)


def main():
    me = rank()
    sys.stdout = Labelled(sys.__stdout__, "\\x1e" + me + "\\x1e")
    sys.stderr = Labelled(sys.__stderr__, "\\x1e" + me + "\\x1e")
    linecache.cache["<cell>"] = (len(SOURCE), None, SOURCE.splitlines(True), "<cell>")
    namespace = {{"__name__": "__main__"}}
    try:
        exec(compile(SOURCE, "<cell>", "exec"), namespace)
        if NAMES and me == "0":
            missing = [name for name in NAMES if name not in namespace]
            if missing:
                raise NameError("%%mpi -o: not defined on rank 0: " + ", ".join(missing))
            with open(RESULT + ".part", "wb") as handle:
                pickle.dump(dict((name, namespace[name]) for name in NAMES), handle, 4)
            os.replace(RESULT + ".part", RESULT)
    except SystemExit:
        sys.stdout.flush()
        sys.stderr.flush()
        raise
    except BaseException:
        sys.stdout.flush()
        sys.stderr.flush()
        failed = Labelled(sys.__stderr__, "\\x1e" + me + "!\\x1e")
        kind, error, frames = sys.exc_info()
        traceback.print_exception(kind, error, frames.tb_next, file=failed)  # from the cell on
        failed.flush()
        end_job()
    sys.stdout.flush()
    sys.stderr.flush()


main()
'''


class CellJobFailed(DockerMPIError):
    """The cell's job did not succeed; IPython shows this one line, not a traceback."""

    def _render_traceback_(self):
        return [str(self)]


def runner_text(source, names, result):
    """The Python file that runs ``source`` on a rank (see :data:`RUNNER`)."""
    return RUNNER.format(source=source, names=list(names), result=result)


def parse_ranks(text):
    """``"0,2-4"`` -> {0, 2, 3, 4}; None for None."""
    if text is None:
        return None
    ranks = set()
    for part in text.split(","):
        found = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if not found:
            raise ValueError(f"--ranks {text!r}: give ranks and ranges like 0,2-4")
        first = int(found.group(1))
        last = int(found.group(2) or first)
        if last < first:
            raise ValueError(f"--ranks {text!r}: {first}-{last} is an empty range")
        ranks.update(range(first, last + 1))
    return ranks


def parse_names(values):
    """``-o a,b -o c`` -> ["a", "b", "c"], each a Python identifier."""
    names = []
    for value in values or ():
        for name in value.split(","):
            name = name.strip()
            if not name.isidentifier():
                raise ValueError(f"-o {value!r}: {name!r} is not a variable name")
            if name not in names:
                names.append(name)
    return names


class RankOutput(JobOutput):
    """A job's stdout and stderr as the runner labels them, split by rank as it arrives.

    ``lines[rank]``: that rank's last LINES_SHOWN lines as ``(stream, text)``;
    ``failed``: the ranks whose traceback came, in the order they came, with
    ``tracebacks[rank]`` its lines. Lines with no label are the launcher's (OTHER)."""

    def __init__(self, ranks=None):
        super().__init__()
        self.ranks = ranks
        self.lines = {}
        self.dropped = {}
        self.failed = []
        self.tracebacks = {}

    def add(self, stream, line):
        found = LABELLED_RE.match(line)
        if found:
            rank, failed, text = int(found.group(1)), found.group(2), found.group(3)
        else:
            rank, failed, text = OTHER, "", line
        if failed:
            if rank not in self.tracebacks:
                self.failed.append(rank)
                self.tracebacks[rank] = []
            self.tracebacks[rank].append(text)
        if rank != OTHER and self.ranks is not None and rank not in self.ranks:
            return
        kept = self.lines.setdefault(rank, [])
        kept.append((stream, text))
        if len(kept) > LINES_SHOWN:
            del kept[0]
            self.dropped[rank] = self.dropped.get(rank, 0) + 1
        self.changed = True

    def first_failure(self, record):
        """(rank, traceback lines) of the rank that failed first, or None: the rank the
        job's record names when its traceback came, else the first traceback to come."""
        named = (record.get("failure") or {}).get("rank")
        if named in self.tracebacks:
            return named, self.tracebacks[named]
        if self.failed:
            return self.failed[0], self.tracebacks[self.failed[0]]
        return None

    def ordered_ranks(self):
        return sorted((r for r in self.lines if r != OTHER)) + (
            [OTHER] if OTHER in self.lines else [])

    def new_lines(self):
        """The lines not printed yet, rank by rank, each labelled ``[rank]``."""
        return [f"[{rank}] {text}" for rank in self.ordered_ranks()
                for text in self._unprinted(rank, self.lines[rank], self.dropped.get(rank, 0))]

    def plain(self):
        """The output as labelled text lines, ANSI-coloured per rank."""
        out = []
        for rank in self.ordered_ranks():
            colour = 0 if rank == OTHER else ANSI_COLOURS[rank % len(ANSI_COLOURS)]
            label = f"\x1b[1;{colour}m[{rank}]\x1b[0m " if colour else f"[{rank}] "
            if self.dropped.get(rank):
                out.append(f"{label}... {self.dropped[rank]} earlier lines in the job's files")
            out.extend(label + text for _, text in self.lines[rank])
        return "\n".join(out)

    def html(self):
        """The output as one collapsible section per rank, each in its colour."""
        parts = ['<div class="dockermpi-ranks" style="font-family:monospace">']
        for rank in self.ordered_ranks():
            colour = "#555" if rank == OTHER else HTML_COLOURS[rank % len(HTML_COLOURS)]
            title = OTHER if rank == OTHER else f"rank {rank}"
            count = len(self.lines[rank]) + self.dropped.get(rank, 0)
            body = "".join(
                f'<div style="{"color:#c00" if stream == "stderr" else ""}">'
                f"{html.escape(text) or '&nbsp;'}</div>" for stream, text in self.lines[rank])
            if self.dropped.get(rank):
                body = (f"<div><i>... {self.dropped[rank]} earlier lines in the job's "
                        "files</i></div>") + body
            parts.append(
                f'<details open data-rank="{html.escape(str(rank))}">'
                f'<summary style="color:{colour};font-weight:bold">{title} '
                f'<span style="font-weight:normal">({count} line{"" if count == 1 else "s"})'
                '</span></summary>'
                f'<div style="border-left:3px solid {colour};padding-left:6px;'
                f'white-space:pre-wrap">{body}</div></details>')
        parts.append("</div>")
        return "".join(parts)


def mpi_command(line):
    """``%mpi command ...``: the ``mpi`` command run in this kernel, so that ``run`` shows
    the job's view in the cell; a non-zero status fails the cell."""
    from IPython.core.error import UsageError

    from dockermpi import cli
    try:
        argv = shlex.split(line)
    except ValueError as error:
        raise UsageError(f"%mpi: {error}") from None
    try:
        status = cli.main(argv)
    except SystemExit as done:  # argparse has printed the help, or what is wrong
        if done.code in (0, None):
            return
        raise UsageError("%mpi: see the usage above, or %mpi --help") from None
    if status:
        raise CellJobFailed(f"mpi {argv[0]}: exit status {status}")


def _magics():
    from IPython.core import magic_arguments
    from IPython.core.error import UsageError
    from IPython.core.magic import Magics, line_cell_magic, magics_class

    @magics_class
    class MPIMagics(Magics):
        """The ``%%mpi`` cell magic."""

        client = None

        @magic_arguments.magic_arguments()
        @magic_arguments.argument("-n", "--np", type=int, default=1,
                                  help="number of MPI ranks (default 1)")
        @magic_arguments.argument("-N", "--nodes", default=None,
                                  help="a node count, or node names separated by commas")
        @magic_arguments.argument("-t", "--walltime", default=None,
                                  help="longest run time: 90s, 30m, 2h, HH:MM:SS")
        @magic_arguments.argument("--image", default=None,
                                  help="approved image to run in (default: this notebook's)")
        @magic_arguments.argument("--slots-per-node", type=int, default=None,
                                  help="ranks per node")
        @magic_arguments.argument("-o", "--output", action="append", default=[],
                                  help="rank 0's variables to bring back (a,b or repeated)")
        @magic_arguments.argument("--ranks", default=None,
                                  help="show these ranks' output only: 0,2-4")
        @magic_arguments.argument("--name", default=None, help="the job's name")
        @line_cell_magic
        def mpi(self, line, cell=None):
            """``%%mpi [options]``: run this cell as an MPI job: every rank runs it with
            python3; output streams back labelled by rank; ``-o`` brings rank 0's
            variables back.

            ``%mpi command ...``: the ``mpi`` command in the cell (``%mpi run -n 4
            python3 pi.py``, ``%mpi list``, ``%mpi --help``); ``run`` shows the job as
            ``%%mpi`` does."""
            if cell is None:
                return mpi_command(line)
            args = magic_arguments.parse_argstring(self.mpi, line)
            try:
                ranks = parse_ranks(args.ranks)
                names = parse_names(args.output)
                nodes = args.nodes
                if nodes is not None:
                    nodes = int(nodes) if nodes.isdigit() else nodes.split(",")
            except ValueError as error:
                raise UsageError(str(error)) from None
            try:
                compile(cell, "<cell>", "exec")
            except SyntaxError as error:
                raise UsageError(f"the cell is not valid Python: {error}") from None
            if self.client is None:
                type(self).client = Client()
            client = self.client
            root = client.whoami().get("dir_in_job")
            if not root or not os.path.isdir(root):
                raise UsageError(f"%%mpi needs your DockerMPI directory at {root}, as the "
                                 "jobs see it (DockerMPI's notebooks have it there)")
            cells = os.path.join(root, CELL_DIR)
            os.makedirs(cells, exist_ok=True)
            stem = os.path.join(cells, time.strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3))
            script, result = stem + ".py", stem + ".result"
            with open(script, "w", encoding="utf-8") as handle:
                handle.write(runner_text(cell, names, result))
            here = os.path.realpath(os.getcwd())
            workdir = os.path.relpath(here, os.path.realpath(root)) if (
                here + os.sep).startswith(os.path.realpath(root) + os.sep) else None
            record = client.submit(
                ["python3", "-u", script], np=args.np, image=args.image, nodes=nodes,
                slots_per_node=args.slots_per_node, walltime=args.walltime,
                name=args.name or f"cell-{cell_number(self.shell) or 0}", workdir=workdir,
                origin=notebook_origin(self.shell))
            output = RankOutput(ranks)
            rich = jupyter_shell() is self.shell
            view = JobView(output, rich, kernel_id() if rich else None)
            try:
                final = view.follow(client, record)
            except JobInterrupted as interrupted:
                raise CellJobFailed(f"interrupted: {outcome_line(interrupted.record)}") from None
            if final.get("state") != "succeeded":
                raise CellJobFailed(outcome_line(final))
            if names:
                with open(result, "rb") as handle:
                    self.shell.user_ns.update(pickle.load(handle))
                os.remove(result)

    return MPIMagics


def load_ipython_extension(ipython):
    """``%load_ext dockermpi``: registers ``%%mpi``."""
    ipython.register_magics(_magics())
