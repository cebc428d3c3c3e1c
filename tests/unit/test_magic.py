"""Unit tests of the ``%%mpi`` cell magic (images/notebook/dockermpi/magic.py): the runner
it writes around a cell, run by a real python3 as a rank would run it; how the ranks'
labelled output is split, kept and drawn; the magic's own argument checks in a real
IPython shell. The magic against the real API and a real job: tests/integration/test_hub.py."""

import os
import pathlib
import pickle
import subprocess
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1].parent / "images" / "notebook"))

from dockermpi import magic, view  # noqa: E402

IPython = pytest.importorskip("IPython")


def run_rank(tmp_path, source, rank="0", names=(), launcher="OMPI_COMM_WORLD_RANK"):
    result = tmp_path / "cell.result"
    script = tmp_path / "cell.py"
    script.write_text(magic.runner_text(source, names, str(result)))
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK")}
    env[launcher] = rank
    done = subprocess.run([sys.executable, "-u", str(script)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    return done, result


def test_every_line_a_rank_prints_carries_its_label(tmp_path):
    done, _ = run_rank(tmp_path, "print('a')\nprint('b', end='')\nimport sys\n"
                                 "sys.stderr.write('warn\\nmore')\n", rank="3")
    assert done.returncode == 0
    assert done.stdout == "\x1e3\x1ea\n\x1e3\x1eb\n"
    assert done.stderr == "\x1e3\x1ewarn\n\x1e3\x1emore\n"


@pytest.mark.parametrize("launcher", ["OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"])
def test_the_rank_comes_from_each_launchers_variable(tmp_path, launcher):
    done, _ = run_rank(tmp_path, "print(1)", rank="5", launcher=launcher)
    assert done.stdout == "\x1e5\x1e1\n"


def test_a_raising_rank_prints_its_traceback_marked_and_ends_non_zero(tmp_path):
    done, _ = run_rank(tmp_path, "x = 1\nprint('before')\nraise ValueError('bad input')\n",
                       rank="2")
    assert done.returncode == 1
    assert done.stdout == "\x1e2\x1ebefore\n"
    lines = done.stderr.rstrip("\n").split("\n")  # not splitlines: \x1e ends a line there
    assert all(line.startswith("\x1e2!\x1e") for line in lines)
    text = "\n".join(line[4:] for line in lines)
    assert text.startswith("Traceback (most recent call last):")
    assert 'File "<cell>", line 3' in text and "raise ValueError('bad input')" in text
    assert "exec(compile" not in text  # the runner's own frame is left out
    assert text.endswith("ValueError: bad input")


def test_sys_exit_keeps_its_code_and_is_no_traceback(tmp_path):
    done, _ = run_rank(tmp_path, "import sys\nprint('x')\nsys.exit(3)\n")
    assert done.returncode == 3 and done.stderr == "" and done.stdout == "\x1e0\x1ex\n"


def test_rank_0_saves_the_named_variables_and_other_ranks_do_not(tmp_path):
    done, result = run_rank(tmp_path, "total = sum(range(5))\nnames = ['a']\n", rank="1",
                            names=["total"])
    assert done.returncode == 0 and not result.exists()
    done, result = run_rank(tmp_path, "total = sum(range(5))\nnames = ['a']\n",
                            names=["total", "names"])
    assert done.returncode == 0
    assert pickle.loads(result.read_bytes()) == {"total": 10, "names": ["a"]}
    assert not pathlib.Path(str(result) + ".part").exists()


def test_a_named_variable_rank_0_lacks_fails_the_rank(tmp_path):
    done, result = run_rank(tmp_path, "total = 1\n", names=["total", "missing"])
    assert done.returncode == 1 and not result.exists()
    assert "NameError: %%mpi -o: not defined on rank 0: missing" in done.stderr


def test_output_is_split_by_rank_and_the_launchers_lines_kept_apart():
    output = magic.RankOutput()
    output.take("stdout", "\x1e1\x1eone\n\x1e0\x1ezero\nmpirun noted")
    output.take("stdout", " something\n")
    output.take("stderr", "\x1e1\x1ewarning\n")
    assert output.lines == {1: [("stdout", "one"), ("stderr", "warning")],
                            0: [("stdout", "zero")],
                            magic.OTHER: [("stdout", "mpirun noted something")]}
    assert output.ordered_ranks() == [0, 1, magic.OTHER]
    assert "\x1b[1;32m[1]\x1b[0m one" in output.plain()


def test_the_rank_filter_shows_some_ranks_but_still_finds_the_failure():
    output = magic.RankOutput(ranks={0})
    output.take("stdout", "\x1e0\x1ezero\n\x1e3\x1ethree\n")
    output.take("stderr", "\x1e3!\x1eTraceback\n\x1e3!\x1eKeyError: 'x'\n")
    assert set(output.lines) == {0}
    assert output.first_failure({"state": "failed"}) == (3, ["Traceback", "KeyError: 'x'"])


def test_the_first_failing_rank_is_the_records_when_its_traceback_came():
    output = magic.RankOutput()
    output.take("stderr", "\x1e4!\x1eTraceback 4\n\x1e2!\x1eTraceback 2\n")
    assert output.first_failure({"failure": {"rank": 2}})[0] == 2
    assert output.first_failure({"failure": {"rank": 7}})[0] == 4
    assert output.first_failure({}) == (4, ["Traceback 4"])
    assert magic.RankOutput().first_failure({"failure": {"rank": 1}}) is None


def test_a_rank_keeps_its_last_lines_and_counts_the_rest():
    output = magic.RankOutput()
    output.take("stdout", "".join(f"\x1e0\x1e{n}\n" for n in range(magic.LINES_SHOWN + 7)))
    assert len(output.lines[0]) == magic.LINES_SHOWN and output.dropped[0] == 7
    assert output.lines[0][0] == ("stdout", "7")
    assert "... 7 earlier lines" in output.plain() and "... 7 earlier lines" in output.html()


def test_a_ranks_output_is_escaped_in_the_cells_html():
    output = magic.RankOutput()
    output.take("stdout", "\x1e0\x1e<script>alert(1)</script>\n")
    markup = output.html()
    assert "<script>" not in markup and "&lt;script&gt;alert(1)&lt;/script&gt;" in markup
    assert '<details open data-rank="0">' in markup


@pytest.mark.parametrize("text, ranks", [("0", {0}), ("0,2-4", {0, 2, 3, 4}),
                                         (" 1 - 2 ", {1, 2}), (None, None)])
def test_rank_filters(text, ranks):
    assert magic.parse_ranks(text) == ranks


@pytest.mark.parametrize("text", ["", "a", "3-1", "1,,2"])
def test_bad_rank_filters_are_refused(text):
    with pytest.raises(ValueError, match="--ranks"):
        magic.parse_ranks(text)


def test_output_names():
    assert magic.parse_names(["a,b", "c", "a"]) == ["a", "b", "c"]
    with pytest.raises(ValueError, match="'1x' is not a variable name"):
        magic.parse_names(["a,1x"])


@pytest.fixture
def shell():
    from IPython.core.interactiveshell import InteractiveShell
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "dockermpi")
    yield ip
    InteractiveShell.clear_instance()


@pytest.mark.parametrize("line, cell, words", [
    ("-n 2 --ranks x", "print(1)", "--ranks 'x'"),
    ("-n 2 -o 9a", "print(1)", "'9a' is not a variable name"),
    ("-n 2", "print(1", "the cell is not valid Python"),
])
def test_the_magic_refuses_bad_arguments_before_asking_the_api(shell, monkeypatch, line,
                                                               cell, words):
    from IPython.core.error import UsageError
    monkeypatch.setenv("DOCKERMPI_API_URL", "http://127.0.0.1:1/nowhere")
    with pytest.raises(UsageError, match=words):
        shell.run_cell_magic("mpi", line, cell)


def test_a_failed_jobs_error_is_one_line_in_ipython():
    error = magic.CellJobFailed("mpi: job x failed, exit code 1: rank 2 exited with code 1")
    assert error._render_traceback_() == [str(error)]


def test_the_cell_number_is_the_running_cells_own(shell):
    shell.user_ns["magic"] = magic
    for expected in (1, 2):
        shell.run_cell("number = magic.cell_number(get_ipython())", store_history=True)
        assert shell.user_ns["number"] == expected


def test_what_follow_writes_is_split_by_rank_and_printed_in_a_terminal(capsys):
    output = magic.RankOutput()
    shown = view.JobView(output, rich=False)
    sink = shown.sink("stdout")
    assert sink.write("\x1e0\x1ezero\n\x1e1\x1eon") == len("\x1e0\x1ezero\n\x1e1\x1eon")
    sink.write("e\n")
    shown.end({"job_id": "j", "state": "succeeded", "exit_code": 0})
    assert output.lines == {0: [("stdout", "zero")], 1: [("stdout", "one")]}
    printed = capsys.readouterr().out.splitlines()
    assert printed[:2] == ["[0] zero", "[1] one"] and "succeeded" in printed[-1]


def test_a_failing_ranks_traceback_is_shown_above_the_output(capsys):
    output = magic.RankOutput()
    shown = view.JobView(output, rich=False)
    shown.sink("stderr").write("\x1e2!\x1eTraceback\n\x1e2!\x1eKeyError: 'x'\n")
    shown.end({"job_id": "j", "state": "failed", "exit_code": 1, "failure": {"rank": 2}})
    assert shown.head_bundle()["text/plain"].endswith("rank 2 failed:\nTraceback\nKeyError: 'x'")
    assert "rank 2 failed:\nTraceback\nKeyError: 'x'" in capsys.readouterr().out


def test_mpi_on_one_line_is_the_mpi_command(shell, capsys):
    shell.run_line_magic("mpi", "--help")
    assert "Run MPI jobs on the DockerMPI cluster" in capsys.readouterr().out


@pytest.mark.parametrize("line, words", [
    ("", "see the usage above"), ("frobnicate", "see the usage above"),
    ("run -n 2 'echo", "No closing quotation")])
def test_a_bad_mpi_command_line_is_a_usage_error(shell, line, words):
    from IPython.core.error import UsageError
    with pytest.raises(UsageError, match=words):
        shell.run_line_magic("mpi", line)
