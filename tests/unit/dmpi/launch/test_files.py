"""
Unit tests for :mod:`dmpi.launch.files`: passwd and group lines, and the program script
that runs a user's command word for word, whatever the words.
"""

import subprocess

import pytest

from dmpi.launch import files

HOSTILE_PROGRAM = ["printf", "%s\\0", "$(touch pwned)", "; touch pwned2", "`id`", "a b", ":",
                   "-np", "6", "--host", "x:6", "--mca", "plm", "isolated", "it's", "\n", "",
                   "\\", "*"]



# ---------------------------------------------------------------------- passwd / group


def test_passwd_names_guest_with_data_home():
    text = files.passwd_text("guest", 2000, 2000)
    entries = {fields[0]: fields for fields in (line.split(":") for line in text.splitlines())}
    assert all(len(fields) == 7 for fields in entries.values())
    assert entries["guest"] == ["guest", "x", "2000", "2000", "DockerMPI user", "/data", "/bin/sh"]
    assert entries["root"][2] == "0"
    assert "sshd" in entries


def test_group_names_guest_group():
    lines = files.group_text("guest", 2000).splitlines()
    assert "guest:x:2000:" in lines


@pytest.mark.parametrize(
    "args, message",
    [
        (("guest", 0, 2000), "not root"),
        (("guest", 2000, 0), "not root"),
        (("root", 2000, 2000), "clashes"),
        (("guest", 65534, 2000), "clashes"),
        (("bad:name", 2000, 2000), "POSIX name"),
    ],
)
def test_passwd_rejects(args, message):
    with pytest.raises(ValueError, match=message):
        files.passwd_text(*args)


def test_group_rejects_root_gid():
    with pytest.raises(ValueError, match="not root"):
        files.group_text("guest", 0)


def test_program_script_runs_every_word_as_data(tmp_path):
    script = tmp_path / "program"
    script.write_text(files.program_script_text(HOSTILE_PROGRAM))
    result = subprocess.run(["/bin/sh", str(script)], cwd=tmp_path, capture_output=True,
                            check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.decode().split("\0")[:-1] == HOSTILE_PROGRAM[2:]
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "pwned2").exists()


def test_program_script_keeps_the_exit_code_and_reports_a_missing_program(tmp_path):
    script = tmp_path / "program"
    script.write_text(files.program_script_text(["sh", "-c", "exit 7"]))
    assert subprocess.run(["/bin/sh", str(script)], check=False).returncode == 7
    script.write_text(files.program_script_text(["no-such-program-here"]))
    assert subprocess.run(["/bin/sh", str(script)], capture_output=True,
                          check=False).returncode == 127


@pytest.mark.parametrize(
    "program, message",
    [("python3 app.py", "list"), ([], "non-empty"), (["a", 3], "strings"),
     (["a\0b"], "NUL"), ([""], "program name")],
)
def test_program_script_rejects(program, message):
    with pytest.raises(ValueError, match=message):
        files.program_script_text(program)
