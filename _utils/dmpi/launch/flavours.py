"""
Which launch module starts a job, by the MPI flavour its image's probe found
(:mod:`dmpi.launch.probe`): each offers ``hostfile_text(placement)``,
``mpi_argv(np, cluster_cidr, oob_ports, btl_ports, ssh_port, workdir, env_names,
run_dir, keepalive, launcher)`` (its mpirun or mpiexec command, which
:func:`launcher_argv` runs) and ``parse_failure(text)`` (the launcher's standard error,
then its standard output); a
flavour whose launcher reads settings from its environment only also offers
``launcher_environment(oob_ports, ssh_port)``, and one whose launcher can exit 0 after
losing a node ``lost_daemon(stderr_text)``; one whose launcher needs more of the
launcher container than its argv gives a ``LAUNCHER_PRELUDE`` to that container's script.
"""

import ipaddress

from dmpi.launch import intelmpi, mpich, openmpi, openmpi5
from dmpi.launch.values import check_output_paths

#: Flavour (probe's name) -> its launch module.
MODULES = {"openmpi4": openmpi, "openmpi5": openmpi5, "mpich": mpich, "intelmpi": intelmpi}
#: The flavour of a job whose image was never probed: DockerMPI's own job image's.
DEFAULT = "openmpi4"
#: The launcher container's fixed wrapper script. User strings only ever arrive as
#: positional parameters: $1 is the stdout file, $2 the stderr file, the rest the MPI's
#: command.
LAUNCHER_SCRIPT = 'out="$1"; err="$2"; shift 2; exec "$@" >"$out" 2>"$err"'


def module(flavour):
    """The launch module of ``flavour`` (None: :data:`DEFAULT`); ValueError for one
    DockerMPI cannot launch."""
    found = MODULES.get(flavour or DEFAULT)
    if found is None:
        raise ValueError(f"DockerMPI cannot launch jobs of MPI flavour {flavour!r} "
                         f"(it launches {', '.join(sorted(MODULES))})")
    return found


def hostfile_slots(text):
    """``[(address, slots)]`` of a job's hostfile, whatever its flavour's format
    (``address slots=N ...`` or ``address:N``), in order; lines that are not an IPv4
    address are skipped, and slots that cannot be read count as 1. Never raises."""
    entries = []
    for line in text.splitlines():
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        address, _, count = words[0].partition(":")
        for word in words[1:]:
            if word.startswith("slots="):
                count = word[len("slots="):]
        try:
            entries.append((str(ipaddress.IPv4Address(address)),
                            int(count) if count.isdigit() and len(count) < 7 else 1))
        except ValueError:
            continue
    return entries


def hostfile_addresses(text):
    """The node addresses of a job's hostfile (:func:`hostfile_slots`), in order."""
    return [address for address, _ in hostfile_slots(text)]


def failed_rank_at(failure, hostfile_text):
    """A failure a launcher pinned on a node, not a rank (``{"host": address, ...}``:
    MPICH's "BAD TERMINATION" banner), with the rank instead: the one rank the hostfile
    puts at that address (ranks fill the slots in hostfile order). None when that node
    holds several of the job's slots or none (what else the failure holds, such as
    ``placement``, stays). Any other failure is returned as is."""
    if not isinstance(failure, dict) or "host" not in failure:
        return failure
    first = 0
    for address, slots in hostfile_slots(hostfile_text):
        if address == failure["host"] and slots == 1:
            return {"rank": first, **{k: v for k, v in failure.items() if k != "host"}}
        first += slots
    rest = {k: v for k, v in failure.items()
            if k not in ("host", "exit_code", "signal", "signal_name")}
    return rest or None


def launcher_argv(module, stdout_path, stderr_path, *mpi_args, **mpi_kwargs):
    """
    Return the launcher container's command: ``/bin/sh -c <fixed script> sh <stdout>
    <stderr> <the MPI's command>``.

    module
        The flavour's launch module (:func:`module`).
    stdout_path, stderr_path
        Absolute paths (in the job directory under ``/data``) that receive the MPI
        launcher's standard output and error.
    mpi_args, mpi_kwargs
        The module's ``mpi_argv`` arguments.

    The script is a constant (:data:`LAUNCHER_SCRIPT`, after the module's own
    ``LAUNCHER_PRELUDE`` if it has one); the paths and the MPI's whole command arrive as positional
    parameters, so no user string is parsed by a shell. The script ``exec``\ s the
    launcher, so the container's exit code is its.
    """
    check_output_paths(stdout_path, stderr_path)
    script = getattr(module, "LAUNCHER_PRELUDE", "") + LAUNCHER_SCRIPT
    return (["/bin/sh", "-c", script, "sh", stdout_path, stderr_path]
            + module.mpi_argv(*mpi_args, **mpi_kwargs))


def ends_job_on_rank_exit(module):
    """Whether the MPI of a flavour's launch ``module`` ends a job when one rank exits
    non-zero (its ``ENDS_JOB_ON_RANK_EXIT``; Open MPI's mpirun does)."""
    return getattr(module, "ENDS_JOB_ON_RANK_EXIT", True)


def launcher_environment(module, oob_ports, ssh_port):
    """``{name: value}`` the launcher container of a job of flavour ``module`` must
    have besides the job's own environment (Hydra's ssh options and control port)."""
    settings = getattr(module, "launcher_environment", None)
    return settings(oob_ports, ssh_port) if settings is not None else {}


def parse_failure(stderr_text):
    """Which rank made a job fail, from its launcher's standard error and output, whatever
    its MPI (each flavour's messages are its own; the node that reads them does not know
    the job's flavour): the first flavour's verdict found, or None. Never raises."""
    # Flavours that share a launcher's words share its parser: each is tried once.
    for parse in dict.fromkeys(flavour.parse_failure for flavour in MODULES.values()):
        found = parse(stderr_text)
        if found is not None:
            return found
    return None


def lost_daemon(stderr_text):
    """What a launcher that exited 0 said of a node's daemon it lost (None: nothing),
    whatever its MPI. Never raises."""
    for flavour in MODULES.values():
        check = getattr(flavour, "lost_daemon", None)
        if check is not None and check(stderr_text):
            return flavour.LOST_DAEMON_REASON
    return None
