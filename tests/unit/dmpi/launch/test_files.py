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


def _rank(tmp_path, env):
    script = tmp_path / "program"
    script.write_text(files.program_script_text(["echo", "ran"]))
    return subprocess.run(["dash", str(script)], capture_output=True, text=True, check=False,
                          env={"PATH": "/usr/bin:/bin", **env})


@pytest.mark.parametrize("rank, here", [("0", "2"), ("1", "2"), ("2", "3"), ("4", "3")])
def test_a_rank_where_it_was_placed_runs_the_program(tmp_path, rank, here):
    found = _rank(tmp_path, {"OMPI_COMM_WORLD_RANK": rank, "OMPI_COMM_WORLD_LOCAL_SIZE": here,
                             "DMPI_TASKS_PER_NODE": "2,3", "DMPI_NODELIST": "node1,node2"})
    assert (found.returncode, found.stdout, found.stderr) == (0, "ran\n", "")


def test_ranks_all_on_one_node_stop_with_the_reason(tmp_path):
    # Open MPI's variables, then MPICH's: five ranks on the launcher's node.
    for env in ({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_LOCAL_SIZE": "5"},
                {"PMI_RANK": "3", "MPI_LOCALNRANKS": "5"}):
        found = _rank(tmp_path, dict(env, DMPI_TASKS_PER_NODE="2,3",
                                     DMPI_NODELIST="node1,node2"))
        assert found.returncode == files.PLACEMENT_EXIT and found.stdout == ""
        assert found.stderr == (f"{files.PLACEMENT_MARK} rank 3 shares its node with 5 ranks "
                                "where 3 were placed (nodes node1,node2: 2,3 ranks)\n")


def test_without_an_mpis_variables_the_program_just_runs(tmp_path):
    assert _rank(tmp_path, {}).stdout == "ran\n"


@pytest.mark.parametrize(
    "program, message",
    [("python3 app.py", "list"), ([], "non-empty"), (["a", 3], "strings"),
     (["a\0b"], "NUL"), ([""], "program name")],
)
def test_program_script_rejects(program, message):
    with pytest.raises(ValueError, match=message):
        files.program_script_text(program)


def test_the_placement_failure_is_read_from_the_jobs_stderr(tmp_path):
    said = _rank(tmp_path, {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
                            "DMPI_TASKS_PER_NODE": "2,2", "DMPI_NODELIST": "a,b"}).stderr
    stderr = "some output\n" + said + "mpirun detected that one or more processes exited\n"
    assert files.placement_failure(stderr) == (
        "rank 0 shares its node with 4 ranks where 2 were placed (nodes a,b: 2,2 ranks)")
    assert files.placement_failure("all fine\n") is None
    assert files.placement_failure(None) is None
    assert files.placement_failure(files.PLACEMENT_MARK + " \x1b[31m" + "x" * 999) == \
        "?[31m" + "x" * 295


def _watched(tmp_path, program, env=None):
    script = tmp_path / "program"
    script.write_text(files.program_script_text(program, end_job_on_failure=True))
    return subprocess.run(["dash", str(script)], capture_output=True, text=True, check=False,
                          env={"PATH": "/usr/bin:/bin", "PMI_RANK": "2", **(env or {})})


def test_under_an_mpi_that_ignores_a_ranks_exit_a_failure_ends_the_rank_by_a_signal(tmp_path):
    # Hydra ends a job only for a rank killed by a signal: exit 3 becomes SIGKILL, said.
    found = _watched(tmp_path, ["sh", "-c", "echo out; exit 3"])
    assert (found.returncode, found.stdout) == (-9, "out\n")
    assert found.stderr == f"{files.RANK_FAILED_MARK} rank 2 status 3\n"
    assert files.rank_failure("noise\n" + found.stderr) == {"rank": 2, "exit_code": 3}
    # A program killed by a signal: the script dies of the same signal.
    found = _watched(tmp_path, ["sh", "-c", "kill -SEGV $$"])
    assert found.returncode == -11
    assert files.rank_failure(found.stderr) == {"rank": 2, "signal": 11,
                                                "signal_name": "SIGSEGV"}


def test_a_failing_ranks_word_is_kept_in_the_job_directory_too(tmp_path):
    # The MPI may end the job before it forwards the rank's standard error.
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    _watched(tmp_path, ["sh", "-c", "exit 3"], {"DMPI_JOB_DIR": str(job_dir)})
    _watched(tmp_path, ["sh", "-c", "kill -TERM $$"], {"DMPI_JOB_DIR": str(job_dir),
                                                        "PMI_RANK": "0"})
    said = (job_dir / files.RANK_FAILED_FILE).read_text()
    assert said == (f"{files.RANK_FAILED_MARK} rank 2 status 3\n"
                    f"{files.RANK_FAILED_MARK} rank 0 status 143\n")
    assert files.rank_failure(said) == {"rank": 2, "exit_code": 3}
    # A directory it cannot write to changes nothing else.
    found = _watched(tmp_path, ["sh", "-c", "exit 3"], {"DMPI_JOB_DIR": str(tmp_path / "no")})
    assert found.returncode == -9
    assert found.stderr == f"{files.RANK_FAILED_MARK} rank 2 status 3\n"


def test_under_an_mpi_that_ignores_a_ranks_exit_success_and_placement_are_unchanged(tmp_path):
    found = _watched(tmp_path, ["sh", "-c", "echo fine"])
    assert (found.returncode, found.stdout, found.stderr) == (0, "fine\n", "")
    found = _watched(tmp_path, ["echo", "ran"], {"MPI_LOCALNRANKS": "5",
                                                "DMPI_TASKS_PER_NODE": "2,3",
                                                "DMPI_NODELIST": "a,b"})
    assert found.returncode == files.PLACEMENT_EXIT and found.stdout == ""


def test_a_ranks_failure_is_read_first_and_never_raises():
    mark = files.RANK_FAILED_MARK
    assert files.rank_failure(f"{mark} rank 1 status 3\n{mark} rank 0 status 137\n") == {
        "rank": 1, "exit_code": 3}
    assert files.rank_failure(f"{mark} rank 1 status 3\r\n") == {"rank": 1, "exit_code": 3}
    for junk in (None, b"x", "", f"{mark} rank ? status 3\n", f"{mark} rank 1 status 9999\n",
                 f"{mark} rank {'9' * 50} status 3\n", f"{mark} rank \u0663 status 3\n",
                 f"{mark} rank 1 status 0\n"):
        assert files.rank_failure(junk) is None, junk


def test_the_first_out_of_room_error_of_a_jobs_stderr_is_found():
    stderr = ("OSError: [Errno 122] Disk quota exceeded: '/data/out'\n"
              "write error: No space left on device\n")
    assert files.space_failure(stderr) == "Disk quota exceeded"
    assert files.space_failure("cp: error writing 'x': No space left on device") == \
        "No space left on device"
    assert files.space_failure("all fine\n") is None
    assert files.space_failure(None) is None
