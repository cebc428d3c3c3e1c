"""
The ``mpi`` command: run MPI jobs on the DockerMPI cluster from a notebook's terminal,
the way Slurm's commands do.
"""

import argparse
import datetime
import json
import os
import sys

from dockermpi.client import FINAL_STATES, Client, DockerMPIError, JobError
from dockermpi.render import (history_text, images_text, outcome_line, queue_text,
                              record_text, usage_text, whoami_text)

INTERRUPTED = 130  # what a shell reports for a program ended by Ctrl-C

EXAMPLES = """\
examples:
  mpi run -n 6 python3 ~/pi.py     run, show the output live, exit with the job's code
  job=$(mpi submit --parsable -n 6 -t 30 -J pi -D . python3 pi.py)   (-t 30: minutes; -D .: here)
  mpi list; mpi status $job; mpi logs -f $job; mpi cancel $job; mpi history --since 2026-12-01

Output is for people; --json gives the API's answer as JSON. Configured by
DOCKERMPI_API_URL, DOCKERMPI_API_CA, DOCKERMPI_IMAGE and JUPYTERHUB_API_TOKEN, which
the hub sets in your server."""


def export_pair(text):
    """``NAME=VALUE`` of ``--export`` as a (name, value) pair."""
    name, equals, value = text.partition("=")
    if not equals or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, value


def node_spec(text):
    """``-N``: a node count stays a number; names or a grain match go as written."""
    return int(text) if text.isdigit() else text


def slurm_walltime(text):
    """``-t`` as Slurm reads it: a bare number is minutes (the master wants a unit)."""
    return f"{text}m" if text.isdigit() else text


def working_directory(text):
    """``-D``: relative to where ``mpi`` runs, as Slurm's is. The notebook sees your
    directory at /data, the same path as the job's ranks, so the absolute path is theirs
    too (the master refuses anything outside /data)."""
    return os.path.normpath(os.path.join(os.getcwd(), text))


def epoch_time(text):
    """``--since``/``--until``: epoch seconds, or a local date or date and time
    (``2026-12-01``, ``2026-12-01T14:00``, ``2026-12-01 14:00:30``)."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return datetime.datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a date like 2026-12-01 or 2026-12-01T14:00, got {text!r}") from None


def add_job_options(parser):
    parser.add_argument("-n", "--ntasks", type=int, metavar="NP",
                        help="number of MPI ranks (default 1, or NODES x K with -N and "
                             "--ntasks-per-node)")
    parser.add_argument("-N", "--nodes", type=node_spec,
                        help="how many nodes, which ones (node1,node2) or a grain match "
                             "(G@rack:a)")
    parser.add_argument("--ntasks-per-node", type=int, metavar="K", help="ranks per node")
    parser.add_argument("-t", "--time", dest="walltime", metavar="TIME", type=slurm_walltime,
                        help="wall time: minutes (like Slurm), or 90s, 30m, 2h, 1d, MM:SS, "
                             "HH:MM:SS, D-HH:MM:SS")
    parser.add_argument("-J", "--job-name", dest="name", help="a name for the job")
    parser.add_argument("-D", "--chdir", dest="workdir", metavar="DIR", type=working_directory,
                        help="working directory, relative to where you are (-D . runs "
                             "here; default: the job's own mpi-jobs/JOBID)")
    parser.add_argument("--image", metavar="NAME",
                        help="approved image to run in (default: $DOCKERMPI_IMAGE, this "
                             "notebook's image)")
    parser.add_argument("--export", type=export_pair, action="append", metavar="NAME=VALUE",
                        help="set an environment variable in every rank (repeatable)")
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="program [args...]",
                        help="the program and its arguments (no shell runs them)")


def build_parser():
    output = argparse.ArgumentParser(add_help=False)
    output.add_argument("--json", action="store_true", help="print the answer as JSON")

    parser = argparse.ArgumentParser(
        prog="mpi", description="Run MPI jobs on the DockerMPI cluster, like Slurm.",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXAMPLES,
    )
    commands = parser.add_subparsers(dest="action", required=True, metavar="command")

    for action, help_text in (("submit", "queue a job and print its id"),
                              ("run", "submit a job and follow it until it ends "
                                      "(Ctrl-C cancels it)")):
        job = commands.add_parser(action, parents=[output], help=help_text)
        add_job_options(job)
        if action == "submit":
            job.add_argument("--parsable", action="store_true",
                             help="print the job id alone (as sbatch --parsable), for "
                                  "job=$(mpi submit --parsable ...)")
            job.add_argument("--mpijob", metavar="FILE",
                             help="submit a Kubeflow MPI Operator MPIJob (YAML) instead of "
                                  "a program: its launcher's command, workers and slots, env "
                                  "and resources; --image names the approved image to run it "
                                  "in (default: the one its manifest names by reference or "
                                  "digest)")

    for action, help_text in (("status", "a job's record"), ("cancel", "cancel a job")):
        commands.add_parser(action, parents=[output], help=help_text).add_argument("job_id")

    wait = commands.add_parser("wait", parents=[output], help="wait until a job has ended")
    wait.add_argument("job_id")
    wait.add_argument("--timeout", type=float, metavar="S", help="give up after S seconds")

    queue = commands.add_parser("list", parents=[output], help="queued and running jobs")
    queue.add_argument("--state", help="only jobs in this state (or a comma-separated list)")

    history = commands.add_parser("history", parents=[output], help="your ended jobs")
    history.add_argument("--since", type=epoch_time, metavar="DATE")
    history.add_argument("--until", type=epoch_time, metavar="DATE")
    history.add_argument("--state", help="only jobs that ended in this state")

    logs = commands.add_parser("logs", parents=[output], help="a job's output")
    logs.add_argument("job_id")
    logs.add_argument("--stderr", action="store_true", help="standard error, not output")
    logs.add_argument("-f", "--follow", action="store_true",
                      help="keep printing new output until the job ends")

    usage = commands.add_parser(
        "usage", parents=[output],
        help="your jobs and core-hours, fair-share standing and storage quota")
    usage.add_argument("--since", type=epoch_time, metavar="DATE")
    usage.add_argument("--until", type=epoch_time, metavar="DATE")

    commands.add_parser("whoami", parents=[output], help="who the cluster takes you for")
    commands.add_parser("images", parents=[output],
                        help="the approved images and the MPI each holds")
    return parser


def submit_args(args):
    """The keyword arguments of ``Client.submit`` that ``mpi submit``/``mpi run`` mean."""
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise DockerMPIError("no program given: mpi submit [options] program [args...]")
    np = args.ntasks
    if np is None:
        spread = isinstance(args.nodes, int) and args.ntasks_per_node
        np = args.nodes * args.ntasks_per_node if spread else 1
    return {
        "cmd": command,
        "np": np,
        "image": args.image,
        "name": args.name,
        "nodes": args.nodes,
        "slots_per_node": args.ntasks_per_node,
        "walltime": args.walltime,
        "env": dict(args.export) if args.export else None,
        "workdir": args.workdir,
    }


def read_mpijob(args):
    """The text of ``--mpijob FILE`` (``-``: standard input); no other job option goes
    with it but --image."""
    given = [option for option, value in (("-n", args.ntasks), ("-N", args.nodes),
                                          ("--ntasks-per-node", args.ntasks_per_node),
                                          ("-t", args.walltime), ("-J", args.name),
                                          ("-D", args.workdir), ("--export", args.export),
                                          ("a program", args.command)) if value]
    if given:
        raise DockerMPIError(f"--mpijob takes its job from the manifest: leave out "
                             f"{', '.join(given)}")
    try:
        if args.mpijob == "-":
            return sys.stdin.read()
        with open(args.mpijob, encoding="utf-8") as handle:
            return handle.read()
    except OSError as exc:
        raise DockerMPIError(f"cannot read {args.mpijob}: {exc.strerror}") from None


def job_exit_status(record):
    """What ``mpi run``/``mpi wait`` exit with: 0 when the job succeeded, else its exit
    code, or 1 when it has none."""
    if record.get("state") == "succeeded":
        return 0
    code = record.get("exit_code")
    return code if isinstance(code, int) and 0 < code < 256 else 1


def show(args, result, human):
    print(json.dumps(result, indent=2, sort_keys=True) if args.json else human(result))


def run_command(client, args):
    """Carry out one parsed command; return the exit status."""
    action = args.action
    if action == "submit":
        record = client.submit_mpijob(read_mpijob(args), image=args.image) if args.mpijob \
            else client.submit(**submit_args(args))
        if args.parsable and not args.json:
            print(record["job_id"])
        else:
            show(args, record, lambda r: f"submitted job {r['job_id']} ({r.get('state')})")
    elif action == "run":
        try:
            record = client.run(**submit_args(args))
        except KeyboardInterrupt:
            return INTERRUPTED
        if args.json:
            show(args, record, None)
        return job_exit_status(record)
    elif action == "status":
        show(args, client.status(args.job_id), record_text)
    elif action == "cancel":
        show(args, client.cancel(args.job_id), outcome_line)
    elif action == "wait":
        record = client.wait(args.job_id, timeout=args.timeout)
        show(args, record, outcome_line)
        return job_exit_status(record)
    elif action == "list":
        show(args, client.list(state=args.state), queue_text)
    elif action == "history":
        show(args, client.history(since=args.since, until=args.until, state=args.state),
             history_text)
    elif action == "logs":
        return show_logs(client, args)
    elif action == "usage":
        show(args, client.usage(since=args.since, until=args.until), usage_text)
    elif action == "whoami":
        show(args, client.whoami(), whoami_text)
    elif action == "images":
        show(args, client.images(), images_text)
    return 0


def show_logs(client, args):
    stream = "stderr" if args.stderr else "stdout"
    if args.follow:
        record = client.follow(args.job_id, streams=(stream,), out=sys.stdout, err=sys.stdout,
                               progress=sys.stderr)
        return 0 if record.get("state") in FINAL_STATES else 1
    text = client.logs(args.job_id, stream=stream)
    if args.json:
        show(args, text, None)
    else:
        sys.stdout.write(text if isinstance(text, str) else text.get("data", ""))
    return 0


def main(argv=None):
    """The ``mpi`` console script."""
    args = build_parser().parse_args(argv)
    try:
        return run_command(Client(), args)
    except JobError as error:
        if args.json and error.result is not None:
            show(args, error.result, None)
        print(f"mpi: {error}", file=sys.stderr)
        return 1
    except DockerMPIError as error:
        print(f"mpi: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
