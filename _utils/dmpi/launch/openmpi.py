"""
Open MPI's launch: the hostfile, the MCA parameters that keep ``mpirun`` and its
daemons inside the job's ports and network, the launcher's command line, and which rank
failed how, read from Open MPI's own messages.

A *launcher* container on the first node runs :func:`mpi_argv` (``mpirun`` over the
node's ssh, :mod:`dmpi.node.agent`, :mod:`dmpi.launch.ssh`, to the workers) with its
output redirected into the job directory (:func:`dmpi.launch.flavours.launcher_argv`).
"""

import ipaddress
import re

from dmpi.contract import AGENT_SSH
from dmpi.launch.ssh import DEFAULT_RUN_DIR, ssh_args
from dmpi.launch.values import (check_cidr, check_job_ports, check_keepalive,
                                check_ranks, signal_name)


def hostfile_text(placement):
    """
    Return an Open MPI hostfile for a placement.

    placement
        Ordered list of ``(address, slots)``: each node's cluster IPv4 address and the
        number of ranks it takes. Ranks are laid out in this order (by slot).

    Produces ``"<address> slots=<n> max_slots=<n>"`` lines.
    """
    if not isinstance(placement, (list, tuple)) or not placement:
        raise ValueError("placement must be a non-empty list of (address, slots)")
    seen = set()
    lines = []
    for item in placement:
        try:
            address, slots = item
        except (TypeError, ValueError):
            raise ValueError(f"placement entry must be (address, slots), got {item!r}") from None
        try:
            addr = ipaddress.IPv4Address(address)
        except ValueError:
            raise ValueError(f"placement address must be an IPv4 address, got {address!r}") from None
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise ValueError(f"slots for {addr} must be a positive integer, got {slots!r}")
        if addr in seen:
            raise ValueError(f"address {addr} appears twice in the placement")
        seen.add(addr)
        lines.append(f"{addr} slots={slots} max_slots={slots}")
    return "\n".join(lines) + "\n"


def mca_params(cluster_cidr, oob_ports, btl_ports, ssh_port, run_dir=DEFAULT_RUN_DIR,
               keepalive=(2, 1, 3)):
    """
    Return the ordered list of ``(name, value)`` MCA settings of a DockerMPI job.

    cluster_cidr
        IPv4 network of the cluster links, e.g. ``"10.197.1.0/24"``. Open MPI's OOB and
        TCP BTL bind to interfaces in it (by CIDR, never by interface name: names differ
        between nodes).
    oob_ports
        ``(low, high)`` or ``"low-high"``: ports for mpirun's and orted's out-of-band
        listeners.
    btl_ports
        ``(low, high)`` or ``"low-high"``: ports for the ranks' TCP BTL listeners.
    ssh_port, run_dir
        See :func:`ssh_args`.
    keepalive
        ``(time, intvl, probes)`` of the OOB TCP keepalive, so a partition ends mpirun in
        seconds instead of hanging (defaults in Open MPI are 10/60/3).
    """
    cidr = check_cidr(cluster_cidr)
    (oob_low, oob_high), (btl_low, btl_high) = check_job_ports(oob_ports, btl_ports, ssh_port)
    ka_time, ka_intvl, ka_probes = check_keepalive(keepalive)
    return [
        # Launch: ssh to the workers' unprivileged sshd; every orted from mpirun directly
        # (a tree spawn would need orted-to-orted ssh as well).
        ("plm", "rsh"),
        ("plm_rsh_agent", AGENT_SSH),
        ("plm_rsh_args", " ".join(ssh_args(ssh_port, run_dir))),
        ("plm_rsh_no_tree_spawn", "1"),
        # Out-of-band (mpirun <-> orted <-> ranks) on the cluster network, fixed ports.
        ("oob", "tcp"),
        ("oob_tcp_if_include", cidr),
        ("oob_tcp_dynamic_ipv4_ports", f"{oob_low}-{oob_high}"),
        # The OOB opens a dual-stack IPv6 listener whatever disable_ipv6_family says;
        # giving it the same range keeps it inside the range (or it finds none free).
        ("oob_tcp_dynamic_ipv6_ports", f"{oob_low}-{oob_high}"),
        ("oob_tcp_disable_ipv6_family", "1"),
        ("oob_tcp_keepalive_time", str(ka_time)),
        ("oob_tcp_keepalive_intvl", str(ka_intvl)),
        ("oob_tcp_keepalive_probes", str(ka_probes)),
        # Data path: TCP between nodes, shared memory within a node, no InfiniBand/UCX.
        ("pml", "ob1"),
        ("btl", "self,vader,tcp"),
        ("btl_tcp_if_include", cidr),
        ("btl_tcp_port_min_v4", str(btl_low)),
        ("btl_tcp_port_range_v4", str(btl_high - btl_low + 1)),
        ("btl_tcp_disable_family", "6"),
        # The TCP BTL opens an IPv6 listener regardless; keep it inside the range too.
        ("btl_tcp_port_min_v6", str(btl_low)),
        ("btl_tcp_port_range_v6", str(btl_high - btl_low + 1)),
        # Without CAP_SYS_PTRACE CMA/knem single copy fails; copy through the shm segment.
        ("btl_vader_single_copy_mechanism", "none"),
        ("osc", "^ucx"),
        # Containers see the node's cores; do not pin ranks on behalf of the site.
        ("hwloc_base_binding_policy", "none"),
        ("rmaps_base_oversubscribe", "0"),
    ]


def mpi_argv(np, cluster_cidr, oob_ports, btl_ports, ssh_port, workdir, env_names=(),
             run_dir=DEFAULT_RUN_DIR, keepalive=(2, 1, 3), launcher="mpirun"):
    """
    Return the ``mpirun`` argv of a job (no shell involved).

    np
        Number of ranks (positive integer).
    cluster_cidr, oob_ports, btl_ports, ssh_port, keepalive
        See :func:`mca_params`.
    workdir
        Absolute working directory of every rank (under ``/data``).
    env_names
        Names of environment variables forwarded to the ranks with ``-x``.
    run_dir
        See :func:`ssh_args`; the hostfile is ``<run_dir>/hostfile`` and every rank runs
        ``/bin/sh <run_dir>/program`` (:func:`program_script_text`).
    launcher
        ``mpirun`` (found on the launcher's PATH) or its absolute path in the image, as
        the image's probe found it: run so, Open MPI starts its daemons on the other
        nodes from the same prefix.
    """
    env_names = check_ranks(np, workdir, env_names, launcher, "mpirun")
    params = mca_params(cluster_cidr, oob_ports, btl_ports, ssh_port, run_dir, keepalive)
    argv = [launcher, "--hostfile", f"{run_dir}/hostfile", "-np", str(np), "--wdir", workdir]
    for name, value in params:
        argv += ["--mca", name, value]
    for name in env_names:
        argv += ["-x", name]
    return argv + ["/bin/sh", f"{run_dir}/program"]


# ---------------------------------------------------------------------- failure parse

# Open MPI 4.1.4 help messages (orte/tools/orterun/help-orterun.txt, help-mpi-api.txt),
# as captured from real runs in tests/unit/dmpi/launch/data/mpirun/. mpirun wraps some of them at
# fixed columns, so whitespace between words is matched loosely.
# Numbers are ASCII and bounded ([0-9]{1,9}): the text is the job's, and a rank of 5000
# digits, or Unicode digits, must make the verdict vaguer, never raise.
_RE_SIGNAL = re.compile(
    r"mpirun noticed that process rank (?P<rank>[0-9]{1,9}) with PID [0-9]{1,12} on node "
    r"\S{1,255}\s{1,80}exited on signal (?P<signal>[0-9]{1,3})(?: \((?P<name>[^)\n]{0,40})\))?\."
)
_RE_EXIT = re.compile(
    r"mpirun detected that one or more processes exited with non-zero status,\s{1,80}"
    r"thus causing\s{1,80}the job to be terminated\. The first process to do so was:\s{1,80}"
    r"Process name:\s{1,80}\[\[[0-9]{1,12},[0-9]{1,12}\],(?P<rank>[0-9]{1,9})\]\s{1,80}"
    r"Exit code:\s{1,80}(?P<code>[0-9]{1,9})\b"
)
_RE_ABORT = re.compile(
    r"MPI_ABORT was invoked on rank (?P<rank>[0-9]{1,9}) in communicator \S{1,255}\s{1,80}"
    r"with errorcode (?P<code>-?[0-9]{1,10})\."
)


def parse_failure(stderr_text):
    """
    Find which rank made an Open MPI 4.1 job fail, from mpirun's standard error.

    stderr_text
        mpirun's standard error (str). It may hold the ranks' own standard error too.

    Returns ``{"rank": int, "exit_code": int}`` when a rank exited non-zero or called
    ``MPI_Abort`` (the abort's error code), ``{"rank": int, "signal": int,
    "signal_name": str}`` when a rank died on a signal (``signal_name`` like
    ``"SIGSEGV"``), or ``None`` when no such message is present: success, or a failure
    that is not a rank's (lost daemon, program not found, ssh failure). It never raises:
    the text is written by the user's job.

    mpirun prints its verdict after every rank has gone, so the *last* message wins; a
    program that prints look-alike text earlier cannot mask the real one.
    """
    if not isinstance(stderr_text, str):
        return None
    text = stderr_text.replace("\r\n", "\n")
    found = []
    for kind, regex in (("signal", _RE_SIGNAL), ("exit", _RE_EXIT), ("abort", _RE_ABORT)):
        for match in regex.finditer(text):
            found.append((match.start(), kind, match))
    if not found:
        return None
    _, kind, match = max(found, key=lambda item: item[0])
    rank = int(match.group("rank"))
    if kind == "signal":
        number = int(match.group("signal"))
        return {"rank": rank, "signal": number, "signal_name": signal_name(number, match.group("name"))}
    return {"rank": rank, "exit_code": int(match.group("code"))}
