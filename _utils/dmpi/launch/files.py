"""
The files every container of a job reads, besides ssh's: the user's passwd and group
lines (bind-mounted over ``/etc/passwd`` and ``/etc/group``) and the program script that
runs the user's command without a shell parsing it.
"""

import re
import shlex

from dmpi.launch.values import check_abs_path, check_id, check_name, status_failure


def passwd_text(user, uid, gid, home="/data", shell="/bin/sh"):
    """
    Return an ``/etc/passwd`` for job containers that names the job's user.

    user, uid, gid
        The job's account: a POSIX name and the user's own uid and gid (never 0).
    home
        The account's home, the data directory mount (default ``/data``).
    shell
        Login shell; sshd runs ``orted`` through it.

    Keeps ``root``, ``nobody`` and ``sshd`` lines next to the account so tools that look
    those names up keep working.
    """
    check_name(user, "user")
    check_id(uid, "uid")
    check_id(gid, "gid")
    check_abs_path(home, "home")
    check_abs_path(shell, "shell")
    if uid == 65534 or user in ("root", "nobody", "sshd"):
        raise ValueError(f"account {user!r} (uid {uid}) clashes with a system account")
    lines = [
        "root:x:0:0:root:/root:/usr/sbin/nologin",
        f"{user}:x:{uid}:{gid}:DockerMPI user:{home}:{shell}",
        "sshd:x:100:65534::/run/sshd:/usr/sbin/nologin",
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin",
    ]
    return "\n".join(lines) + "\n"


def group_text(group, gid):
    """
    Return an ``/etc/group`` for job containers that names the user's own group.

    group, gid
        The user's private group (same id as the uid); gid must not be 0.
    """
    check_name(group, "group")
    check_id(gid, "gid")
    if gid == 65534 or group in ("root", "nogroup"):
        raise ValueError(f"group {group!r} (gid {gid}) clashes with a system group")
    lines = [
        "root:x:0:",
        f"{group}:x:{gid}:",
        "nogroup:x:65534:",
    ]
    return "\n".join(lines) + "\n"


#: What a rank says, then exits with, when the MPI did not start it where DockerMPI placed
#: it (the slots a job holds are what it may use).
PLACEMENT_MARK = "DockerMPI: ranks did not run where they were placed:"
PLACEMENT_EXIT = 86

#: Before the program: the rank's node must hold as many of the job's ranks as DockerMPI
#: placed there (``DMPI_TASKS_PER_NODE``, ranks laid out by slot in node order), as the
#: MPI tells each rank (Open MPI: ``OMPI_COMM_WORLD_LOCAL_SIZE``; MPICH and Intel MPI:
#: ``MPI_LOCALNRANKS``). An MPI that ignores the hostfile and starts every rank on the
#: launcher's node is stopped here. Plain POSIX sh: any image's /bin/sh runs it.
_PLACEMENT_CHECK = r"""rank=${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-}}
here=${OMPI_COMM_WORLD_LOCAL_SIZE:-${MPI_LOCALNRANKS:-}}
if [ -n "$rank" ] && [ -n "$here" ] && [ -n "${DMPI_TASKS_PER_NODE:-}" ]; then
  first=0; placed=; saved_ifs=$IFS; IFS=,
  for count in $DMPI_TASKS_PER_NODE; do
    if [ "$rank" -lt $((first + count)) ]; then placed=$count; break; fi
    first=$((first + count))
  done
  IFS=$saved_ifs
  if [ "$here" != "$placed" ]; then
    echo "%(mark)s rank $rank shares its node with $here ranks where $placed were placed (nodes $DMPI_NODELIST: $DMPI_TASKS_PER_NODE ranks)" >&2
    exit %(code)d
  fi
fi
""" % {"mark": PLACEMENT_MARK, "code": PLACEMENT_EXIT}


#: What a rank's script says when its program failed, under an MPI that does not end a
#: job when one rank exits non-zero (:data:`_END_JOB_ON_FAILURE`).
RANK_FAILED_MARK = "DockerMPI: the program of a rank failed:"

#: Where a failing rank's script also writes what it said, in the job's directory
#: (``DMPI_JOB_DIR``, on the shared storage): the MPI forwards a rank's standard error
#: to the launcher, and Hydra may end the job before it has.
RANK_FAILED_FILE = "ranks-failed"

#: After the program, under such an MPI (Hydra, which only ends a job when a rank is
#: killed by a signal; the others would run on to the walltime): a non-zero exit is
#: said (on standard error and in :data:`RANK_FAILED_FILE`), then the script ends by
#: the program's own signal, or by SIGKILL for an exit code, so the MPI ends the job at
#: once. Plain POSIX sh.
_END_JOB_ON_FAILURE = r"""status=$?
if [ "$status" -ne 0 ]; then
  said="%(mark)s rank ${rank:-?} status $status"
  echo "$said" >&2
  if [ -n "${DMPI_JOB_DIR:-}" ]; then echo "$said" >>"$DMPI_JOB_DIR/%(file)s"; fi 2>/dev/null
  if [ "$status" -gt 128 ] && [ "$status" -lt 193 ]; then kill -$((status - 128)) $$; fi
  kill -9 $$
fi
exit "$status"
""" % {"mark": RANK_FAILED_MARK, "file": RANK_FAILED_FILE}
_RANK_FAILED_RE = re.compile(re.escape(RANK_FAILED_MARK)
                             + r" rank ([0-9]{1,9}) status ([0-9]{1,3})\n")


def program_script_text(program, end_job_on_failure=False):
    """
    Return the script every rank runs: ``exec`` of the user's program, each word quoted.

    program
        The user's program argv (non-empty list of strings without NUL).

    The program reaches mpirun as a file (``<run_dir>/program``, run with ``/bin/sh``),
    never as mpirun arguments: mpirun reads ``:`` anywhere in its argv as the start of
    another program group with its own ``-np`` and ``--host``, so a user's words in its
    argv would be mpirun syntax. Each word is single-quoted (:func:`shlex.quote`), so the
    shell only execs it; ``exec`` keeps the rank's exit code and signals the program's.
    Before it, the rank checks it runs where it was placed (:data:`_PLACEMENT_CHECK`).

    end_job_on_failure
        True for an MPI that does not end a job when a rank exits non-zero: the program
        runs as the script's child, and a failure ends the script by a signal
        (:data:`_END_JOB_ON_FAILURE`), which the MPI does act on.
    """
    if isinstance(program, str) or not isinstance(program, (list, tuple)) or not program:
        raise ValueError("program must be a non-empty list of strings (argv), not a string")
    for arg in program:
        if not isinstance(arg, str) or "\0" in arg:
            raise ValueError(f"program arguments must be strings without NUL, got {arg!r}")
    if not program[0]:
        raise ValueError("program must start with a program name")
    words = " ".join(shlex.quote(arg) for arg in program)
    run = words + "\n" + _END_JOB_ON_FAILURE if end_job_on_failure else "exec " + words + "\n"
    return ("# DockerMPI: the job's program (generated; each word is data)\n"
            + _PLACEMENT_CHECK + run)


def placement_failure(stderr_text):
    """What the first rank that found itself elsewhere than placed said (the text after
    :data:`PLACEMENT_MARK`, at most 300 characters), from the job's standard error; None
    when none did. Never raises: the text is the job's."""
    if not isinstance(stderr_text, str):
        return None
    at = stderr_text.find(PLACEMENT_MARK)
    if at < 0:
        return None
    line = stderr_text[at + len(PLACEMENT_MARK):].split("\n", 1)[0]
    return "".join(c if c.isprintable() else "?" for c in line.strip())[:300] or None


#: How C libraries and Python say a write found no room (strerror of EDQUOT, ENOSPC).
SPACE_ERRORS = ("Disk quota exceeded", "No space left on device")


def space_failure(stderr_text):
    """The first of :data:`SPACE_ERRORS` a failed job's standard error holds, or None: a
    rank that ran out of room in the user's directory (quota or a full file system) or
    its sized /tmp. Never raises: the text is the job's."""
    if not isinstance(stderr_text, str):
        return None
    found = [(stderr_text.find(error), error) for error in SPACE_ERRORS]
    found = [(at, error) for at, error in found if at >= 0]
    return min(found)[1] if found else None


def rank_failure(stderr_text):
    """Which rank's program failed how, from the first :data:`RANK_FAILED_MARK` line in a
    job's standard error: ``{"rank": int, "exit_code": int}``, or ``{"rank": int,
    "signal": int, "signal_name": str}`` for a status above 128 (a shell's 128 + signal);
    None when no rank said so. Never raises: the text is the job's."""
    if not isinstance(stderr_text, str):
        return None
    match = _RANK_FAILED_RE.search(stderr_text.replace("\r\n", "\n"))
    if match is None:
        return None
    said = status_failure(int(match.group(2)))
    return {"rank": int(match.group(1)), **said} if said else None
