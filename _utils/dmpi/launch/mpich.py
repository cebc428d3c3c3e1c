"""
MPICH's launch: the same job as :mod:`dmpi.launch.openmpi`, started by MPICH's process
manager Hydra (``mpiexec``, which starts one ``hydra_pmi_proxy`` per node over ssh and
the ranks under it). Names and behaviour were checked against the source of Hydra in
MPICH 4.0.2 (``src/pm/hydra``, tag ``v4.0.2``) and against Debian 12's ``mpich`` 4.0.2
(captured output in ``tests/unit/dmpi/launch/data/mpich/``).

What Hydra 4.0.2 offers, and what is used:

- **ssh**: ``-launcher ssh -launcher-exec AGENT_SSH`` runs DockerMPI's ssh client.
  Hydra has no command-line option for the client's arguments: it reads them from its
  own environment, ``HYDRA_LAUNCHER_EXTRA_ARGS``, split on spaces and put between its
  ``-x`` and the host (``ssh -x <extra args> <host> "<proxy>" <proxy args>``). So the
  launcher container must carry :func:`launcher_environment`, whose value is exactly
  :func:`dmpi.launch.ssh.ssh_args` (no element has a space). Hydra forks, not sshes, the
  proxy of a hostfile entry that is one of its own addresses (the launcher's node).
- **No tree launch**: Hydra 4.0.2 starts every proxy from ``mpiexec`` itself (there is
  no hierarchical launch to turn off).
- **Control port**: only ``mpiexec`` listens (each proxy connects back to it; ranks
  talk to their proxy over an inherited socket). Its port comes from a range read from
  ``mpiexec``'s environment only (``MPIR_CVAR_CH3_PORT_RANGE`` first, then
  ``MPIR_CVAR_PORT_RANGE``, ``MPIEXEC_PORT_RANGE`` and others; there is no
  ``-port-range`` option), formatted ``low:high``: :func:`launcher_environment` sets the
  first name read, so an image's own ``ENV`` cannot displace it. The address it hands the
  proxies is the hostfile entry that is local (the launcher's cluster address), so the
  proxies connect over the cluster network.
- **Interfaces**: ``-iface`` takes an interface *name* (names differ between nodes) and
  is not used. Hydra itself is steered by addresses alone: the hostfile's, as above.
  Debian 12's MPICH is built ``ch4:ucx`` (``mpichversion``: ``MPICH Device: ch4:ucx``),
  not ``ch4:ofi``: the ranks talk through UCX, whose devices too are chosen by name only
  (``UCX_NET_DEVICES``, default all). A DockerMPI job's network namespace has one
  interface besides ``lo``, on the cluster network, so "all" is the cluster network.
  ``UCX_TLS=self,sysv,posix,tcp``: shared memory within a node, TCP between nodes,
  never an RDMA device a node might have. Not UCX's ``sm`` (it adds ``cma``) nor TCP
  within a node: with either, four ranks in one container hung in ``MPI_Finalize`` after
  a 4 MB ``MPI_Bcast`` in 4 of 10 runs; with ``sysv,posix`` in none.
- **Data ports**: ``UCX_TCP_PORT_RANGE=low-high`` (UCX 1.13) confines the ranks' TCP
  listeners to the BTL range. ``MPIR_CVAR_CH3_PORT_RANGE`` is given to the ranks too,
  for an image whose MPICH is ``ch3`` (its ranks listen in that range); ``ch4`` ignores
  it. Not applicable to Debian 12's build, and not set: ``MPIR_CVAR_CH4_NETMOD`` (one
  netmod is built), libfabric's ``FI_*`` (``ch4:ofi`` only; an ``ofi`` image needs its
  own check before jobs rely on its ports).
- **Environment**: ``-genvlist`` forwards the named variables to every rank, and
  ``-genvnone`` forwards none when none are named (Hydra's default forwards all of
  ``mpiexec``'s environment, this module's settings included). Ranks on the launcher's
  own node are forked by a proxy that inherits ``mpiexec``'s environment regardless.
- **Configuration files**: ``mpiexec`` would read options from
  ``$HOME/.mpiexec.hydra.conf`` (``HOME`` is the user's directory) or
  ``HYDRA_CONFIG_FILE``; ``-configfile /dev/null`` makes it read none, so this argv is
  all of the job's options.
- **A lost node**: when a proxy's connection closes (its node or container killed),
  ``mpiexec`` fails at once and exits non-zero. Hydra has no keepalive, heartbeat or
  timeout of its own but ``MPIEXEC_TIMEOUT`` (the whole job's): a *partition* leaves
  the proxy's connection open, so ``mpiexec`` waits until the ranks fail (UCX's TCP
  keepalive, ``keepalive`` below, breaks their connections to the cut-off node) or the
  job's time limit ends it; the ssh client's ``ServerAliveInterval`` ends only ssh,
  which Hydra does not watch.
- **MPI_Finalize**: MPICH before 4.2 on UCX can hang there between nodes; the probe
  marks such images, and their jobs keep to one node
  (:func:`dmpi.launch.probe.why_one_node_only`).
- **Oversubscription**: Hydra places ranks round-robin over the hostfile's ``slots`` and
  wraps around past the last one; it has no switch to refuse, so ``np`` must not
  exceed the placement's slots (the caller's rule).

- **Which rank failed**: Hydra's "BAD TERMINATION" banner names a PID, not a rank, and
  goes to ``mpiexec``'s *standard output*; ``-print-all-exitcodes`` adds every rank's
  wait status there, which :func:`parse_failure` reads (with ``MPI_Abort``'s message
  from standard error).

The launcher container runs :func:`mpi_argv` as for Open MPI
(:func:`dmpi.launch.flavours.launcher_argv`), with :func:`launcher_environment` in its
environment.
"""

import ipaddress
import re

from dmpi.contract import AGENT_SSH
from dmpi.launch import openmpi
from dmpi.launch.ssh import DEFAULT_RUN_DIR, ssh_args
from dmpi.launch.values import (check_abs_path, check_cidr, check_job_ports, check_keepalive,
                                check_oob_and_ssh_ports, check_range, check_ranks,
                                signal_name, status_failure)

#: Hydra ends a job when a rank is killed by a signal, not when one exits non-zero (the
#: others run on): each rank's script turns a failure into a signal
#: (:func:`dmpi.launch.files.program_script_text`).
ENDS_JOB_ON_RANK_EXIT = False


def hostfile_text(placement):
    """
    Return a Hydra hostfile for a placement: ``"<address>:<slots>"`` lines.

    placement
        Ordered list of ``(address, slots)`` as for
        :func:`dmpi.launch.openmpi.hostfile_text` (checked the same way, same errors).
        Hydra fills each node's slots in this order.
    """
    openmpi.hostfile_text(placement)
    return "".join(f"{ipaddress.IPv4Address(address)}:{slots}\n" for address, slots in placement)


def launcher_environment(oob_ports, ssh_port, run_dir=DEFAULT_RUN_DIR):
    """
    Return the environment ``{name: value}`` the launcher container must have for
    ``mpiexec``: what Hydra reads from its environment only.

    oob_ports
        ``(low, high)`` or ``"low-high"``: ``mpiexec``'s control port (the one port it
        listens on) is taken from it.
    ssh_port, run_dir
        See :func:`dmpi.launch.ssh.ssh_args`: the options Hydra gives ``AGENT_SSH``.
    """
    oob_low, oob_high = check_oob_and_ssh_ports(oob_ports, ssh_port)
    return {
        "HYDRA_LAUNCHER_EXTRA_ARGS": " ".join(ssh_args(ssh_port, run_dir)),
        # The first of the eleven names Hydra tries, so no other one set in the image wins.
        "MPIR_CVAR_CH3_PORT_RANGE": f"{oob_low}:{oob_high}",
    }


def rank_settings(cluster_cidr, btl_ports, keepalive=(2, 1, 3)):
    """
    Return the ordered ``(name, value)`` environment settings of every rank (``-genv``).

    cluster_cidr
        IPv4 network of the cluster links (checked; UCX cannot take it, see the module's
        description).
    btl_ports
        ``(low, high)`` or ``"low-high"``: ports of the ranks' TCP listeners.
    keepalive
        ``(time, intvl, probes)`` in seconds of the ranks' TCP keepalive, so a rank's
        connection to a cut-off node fails in seconds (UCX's default: 10 s idle).
    """
    check_cidr(cluster_cidr)
    btl_low, btl_high = check_range(btl_ports, "BTL port range")
    ka_time, ka_intvl, ka_probes = check_keepalive(keepalive)
    return [
        ("UCX_TLS", "self,sysv,posix,tcp"),
        ("UCX_TCP_PORT_RANGE", f"{btl_low}-{btl_high}"),
        ("UCX_TCP_KEEPIDLE", f"{ka_time}s"),
        ("UCX_TCP_KEEPINTVL", f"{ka_intvl}s"),
        ("UCX_TCP_KEEPCNT", str(ka_probes)),
        # ch3 builds' ranks listen in this range; ch4 ignores it.
        ("MPIR_CVAR_CH3_PORT_RANGE", f"{btl_low}:{btl_high}"),
    ]


def mpi_argv(np, cluster_cidr, oob_ports, btl_ports, ssh_port, workdir, env_names=(),
             run_dir=DEFAULT_RUN_DIR, keepalive=(2, 1, 3), launcher="mpiexec"):
    """
    Return the Hydra ``mpiexec`` argv of a job (no shell involved).

    Arguments as :func:`dmpi.launch.openmpi.mpi_argv`: ``np`` ranks, the cluster
    network and port ranges (``oob_ports``: ``mpiexec``'s control port, set by
    :func:`launcher_environment`; ``btl_ports``: the ranks', :func:`rank_settings`), the
    ranks' absolute ``workdir``, ``env_names`` forwarded with ``-genvlist``, the per-job
    ``run_dir`` (``<run_dir>/hostfile``; every rank runs ``/bin/sh <run_dir>/program``),
    the ``keepalive`` of the ranks' TCP and the ``launcher`` (``mpiexec``, found on the
    launcher's PATH, or its absolute path in the image).
    """
    env_names = check_ranks(np, workdir, env_names, launcher, "mpiexec")
    check_abs_path(run_dir, "run_dir")
    check_job_ports(oob_ports, btl_ports, ssh_port)
    return hydra_argv([launcher, "-configfile", "/dev/null",
                       "-launcher", "ssh", "-launcher-exec", AGENT_SSH,
                       "-f", f"{run_dir}/hostfile"],
                      np, workdir, env_names,
                      rank_settings(cluster_cidr, btl_ports, keepalive), run_dir)


def hydra_argv(head, np, workdir, env_names, settings, run_dir):
    """A Hydra launcher's argv (MPICH's or Intel MPI's; arguments checked): ``head`` (the
    launcher and its own options), then ``np`` ranks in ``workdir`` with the names
    ``env_names`` forwarded and every ``(name, value)`` of ``settings`` set, each running
    ``/bin/sh <run_dir>/program``."""
    argv = [*head, "-n", str(np), "-wdir", workdir,
            # Each rank's wait status, the only place Hydra says which rank failed how.
            "-print-all-exitcodes"]
    argv += ["-genvlist", ",".join(env_names)] if env_names else ["-genvnone"]
    for name, value in settings:
        argv += ["-genv", name, value]
    return argv + ["/bin/sh", f"{run_dir}/program"]


# ---------------------------------------------------------------------- failure parse

# MPICH 4.0.2's words, as captured in tests/unit/dmpi/launch/data/mpich/. Hydra's banner
# ("BAD TERMINATION ... PID <pid> RUNNING AT <host> / EXIT CODE: <n>", on mpiexec's
# *stdout*) names a PID, never a rank, and only for a rank killed by a signal, so it is
# not read; the ranks' wait statuses of -print-all-exitcodes are:
#   [mpiexec@<host>] Exit codes: [<node>] 9,768,0,9
#   [<node>] 0,0
# one line per proxy in hostfile order, each rank's raw wait status in rank order.
# MPI_Abort's own message (on stderr; mpiexec then prints no exit codes):
#   Abort(7) on node 3 (rank 3 in comm 0): application called MPI_Abort(MPI_COMM_WORLD, 7) - process 3
# Numbers are ASCII and bounded: the text is the job's, and a rank of 5000 digits, or
# Unicode digits, must make the verdict vaguer, never raise.
_RE_ABORT = re.compile(
    r"application called MPI_Abort\([^()\n]{0,300}, (?P<code>-?[0-9]{1,10})\) - process "
    r"(?P<rank>[0-9]{1,9})\b"
)
_RE_EXIT_CODES = re.compile(r"\] Exit codes: ")
# Hydra's banner, when its proxies fail before the exit codes are printed (the other
# ranks lose their connections to the dead one and the proxies' clean-up breaks off):
# it names the node's address, and the exit code, 128 + the signal for a signal.
_RE_BANNER = re.compile(
    r"=   PID [0-9]{1,10} RUNNING AT (?P<host>[0-9]{1,3}(?:\.[0-9]{1,3}){3})\n"
    r"=   EXIT CODE: (?P<code>[0-9]{1,10})\n")
# Intel MPI's Hydra prints one banner per rank, with its number (a rank that exited
# non-zero gets none; the ones its clean-up killed get one each, "KILLED BY SIGNAL: 9").
_RE_RANK_BANNER = re.compile(
    r"=   RANK (?P<rank>[0-9]{1,9}) PID [0-9]{1,10} RUNNING AT \S{1,255}\n"
    r"=   KILLED BY SIGNAL: (?P<signal>[0-9]{1,3})\b")
# Intel MPI's Hydra when a proxy's connection closed (its node lost): the statuses it
# still prints are those of the other nodes' ranks, which its clean-up killed.
_RE_LOST_PROXY = re.compile(r"\] Error: Downstream from host \S{1,255} exited abnormally\n")
_RE_PROXY_STATUSES = re.compile(r"\[[^\]\s]{1,255}\] (?P<statuses>[0-9]{1,10}(?:,[0-9]{1,10})*)\n")
# The signal Hydra's clean-up kills the other ranks with: a rank dead of it may be a
# victim, not the cause.
_CLEANUP_SIGNAL = 9
_MAX_RANKS = 10**6


def _rank_statuses(text, at):
    """The ranks' wait statuses of the ``Exit codes`` block at ``at`` (a list; empty if
    its lines are not Hydra's)."""
    statuses = []
    while len(statuses) < _MAX_RANKS:
        line = _RE_PROXY_STATUSES.match(text, at)
        if line is None:
            break
        statuses += [int(s) for s in line.group("statuses").split(",")[:_MAX_RANKS]]
        at = line.end()
    return statuses


def _verdict_of_statuses(statuses, lost_proxy=False):
    """Which rank failed how, from the ranks' wait statuses: the first rank that exited
    non-zero; else the first killed by a signal other than the clean-up's SIGKILL; else
    the one rank killed by SIGKILL. None when all succeeded, or when several ranks died
    of SIGKILL and nothing tells the cause from the clean-up's victims, or when
    ``lost_proxy`` (a node was lost: its ranks are missing, a SIGKILL is the clean-up's)."""
    exited, signalled, killed = [], [], []
    for rank, status in enumerate(statuses):
        if status > 0xFFFF:
            return None
        number = status & 0x7F
        if number == 0 and status >> 8:
            exited.append({"rank": rank, "exit_code": status >> 8})
        elif number not in (0, 0x7F):
            verdict = {"rank": rank, "signal": number, "signal_name": signal_name(number)}
            (killed if number == _CLEANUP_SIGNAL else signalled).append(verdict)
    if exited or signalled:
        return (exited or signalled)[0]
    return killed[0] if len(killed) == 1 and not lost_proxy else None


def parse_failure(stderr_text):
    """
    Find which rank made an MPICH or Intel MPI job fail, from what ``mpiexec`` (Hydra)
    printed.

    stderr_text
        ``mpiexec``'s standard error *followed by its standard output*: Hydra prints the
        ranks' exit statuses (:func:`mpi_argv` asks for them) on standard output,
        ``MPI_Abort``'s message comes on standard error. Either alone is read as far as
        it goes.

    Returns, as :func:`dmpi.launch.openmpi.parse_failure` does, ``{"rank": int,
    "exit_code": int}`` when a rank exited non-zero or called ``MPI_Abort`` (its error
    code, its ``MPI_COMM_WORLD`` rank), ``{"rank": int, "signal": int, "signal_name":
    str}`` when a rank died on a signal, or ``None``: success, a failure that is not a
    rank's (a lost node, ssh), or one Hydra's words cannot pin on a rank (several ranks
    dead of SIGKILL: the cause and the clean-up's victims look alike). Ranks are counted
    through the proxies in hostfile order, which is how Hydra numbers them while ``np``
    does not exceed the hostfile's slots. When Hydra printed no exit statuses (its
    proxies broke off), its "BAD TERMINATION" banners give the verdict: Intel MPI's
    name each rank, MPICH's the node (``{"host": address, ...}`` instead of a rank;
    :func:`dmpi.launch.flavours.failed_rank_at` finds the rank). Intel MPI's Hydra,
    unlike MPICH's, follows ``MPI_Abort``'s message with every rank's exit status, each
    the abort's code: that block is the abort's. It never raises: the text is written
    by the user's job.

    Hydra prints its verdict after every rank has gone, so the *last* message wins
    (a last ``Exit codes`` block that pins nothing is a last word of None); a program
    that prints look-alike text earlier cannot mask the real one. Intel MPI's Hydra
    prints an ``MPI_Abort`` as exits with its code (the aborting rank's node) and the
    clean-up's SIGKILLs (the other nodes), read as the abort; after it lost a node
    ("Downstream from host ... exited abnormally"), a SIGKILL is pinned on no rank.
    """
    if not isinstance(stderr_text, str):
        return None
    text = stderr_text.replace("\r\n", "\n")
    found = []
    aborts = [(match.start(), {"rank": int(match.group("rank")),
                               "exit_code": int(match.group("code"))})
              for match in _RE_ABORT.finditer(text)]
    found += aborts[-1:]
    lost_proxy = _RE_LOST_PROXY.search(text) is not None
    for match in _RE_EXIT_CODES.finditer(text):
        statuses = _rank_statuses(text, match.end())
        if statuses:
            abort = _abort_of_statuses(statuses, [said for _, said in aborts])
            found.append((match.start(),
                          abort or _verdict_of_statuses(statuses, lost_proxy)))
    if not found:
        return _verdict_of_banners(text)
    return max(found, key=lambda item: item[0])[1]


def _abort_of_statuses(statuses, aborts):
    """The last of ``aborts`` the wait statuses show as Intel MPI's Hydra prints an
    MPI_Abort, or None: the aborting rank (and the others of its node) exited with its
    code (the low 8 bits an exit keeps), every other rank too or killed by the clean-up's
    SIGKILL (the other nodes' ranks). An abort message of the program's own with another
    rank or code than the statuses show is passed over."""
    kinds = set(statuses)
    for abort in reversed(aborts):
        exited = (abort["exit_code"] & 0xFF) << 8
        if (kinds <= {exited, _CLEANUP_SIGNAL} and abort["rank"] < len(statuses)
                and statuses[abort["rank"]] == exited):
            return abort
    return None


def _verdict_of_banners(text):
    """The verdict of Hydra's "BAD TERMINATION" banners when it printed no exit statuses:
    Intel's name each rank (:func:`_verdict_of_statuses` of the signals they give),
    MPICH's the node (``{"host": address, ...}``). None when there are none."""
    ranks = {}
    for match in _RE_RANK_BANNER.finditer(text):
        rank = int(match.group("rank"))
        if rank < _MAX_RANKS:
            ranks.setdefault(rank, int(match.group("signal")))
    if ranks:
        statuses = [ranks.get(rank, 0) for rank in range(max(ranks) + 1)]
        return _verdict_of_statuses([s if 0 < s < 0x7F else 0 for s in statuses])
    banners = list(_RE_BANNER.finditer(text))
    if not banners:
        return None
    said = status_failure(int(banners[-1].group("code")))
    return {"host": banners[-1].group("host"), **said} if said else None
