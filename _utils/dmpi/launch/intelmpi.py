"""
Intel MPI's launch: the same job as :mod:`dmpi.launch.mpich`, started by Intel's own
Hydra (``mpiexec.hydra``, which its ``mpirun`` script runs; it starts a
``hydra_bstrap_proxy`` per node over ssh, then ``hydra_pmi_proxy`` and the ranks under
it). Names and behaviour were checked against Intel MPI 2021.18.1 from PyPI's
``impi-rt`` wheel with its libfabric 2.4 (``mpiexec.hydra -help``, the variables its
binaries read, captured output in ``tests/unit/dmpi/launch/data/intelmpi/``).

Where it differs from MPICH's Hydra, and what is used:

- **Hostfile**: ``-f`` takes host names only and ignores ``:N`` (it spreads the ranks
  evenly); ``-machinefile`` reads ``host:N`` and fills each node's N slots in order. So
  :func:`mpi_argv` passes the hostfile with ``-machinefile``.
- **ssh**: ``-launcher ssh -launcher-exec AGENT_SSH``; the client's arguments come from
  ``I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS`` in ``mpiexec``'s environment
  (:func:`launcher_environment`). Hydra forks, not sshes, the proxy of its own node.
- **No tree launch**: ``I_MPI_HYDRA_BRANCH_COUNT=-1`` makes ``mpiexec`` start every
  node's proxy itself (Intel's default only from 128 nodes up, set so a site's or an
  image's value cannot change it).
- **Its own address**: ``mpiexec`` tells the proxies to connect back to its host
  *name*, which is the same in every container of a job (each node resolves it to its
  own container); ``-localhost`` does not change that, ``I_MPI_HYDRA_IFACE`` does, and it
  takes an interface *name*, which differs between a job's namespaces (``eth0`` or
  ``eth1``). So :data:`LAUNCHER_PRELUDE` names the namespace's one Ethernet interface
  before it runs ``mpiexec``.
- **Ranks' fabric**: ``I_MPI_FABRICS=shm:ofi`` (shared memory within a node, libfabric
  between nodes) with libfabric's ``tcp`` provider only (``I_MPI_OFI_PROVIDER``,
  ``FI_PROVIDER``: never an RDMA device a node might have). A DockerMPI job's network
  namespace has one interface besides ``lo``, on the cluster network.
- **Ports**: the kernel's, for ``mpiexec``'s control port and the ranks' listeners
  alike, not the job's OOB and BTL ranges. Intel MPI hands ``I_MPI_PORT_RANGE`` (the
  control port's) to the ranks too, and each listener takes a random port of a range
  set so: ranks on one node then draw the same port and fail in ``MPI_Init`` ("OFI EP
  enable failed ... Address already in use"). With ``FI_TCP_PORT_LOW_RANGE`` and
  ``FI_TCP_PORT_HIGH_RANGE`` set to the BTL range, 3 of 150 starts of four ranks on one
  host failed, and 1 of 150 of two; without a range, 0 of 150 of four. A range adds no
  isolation: the job's namespace firewall lets only the job's own containers reach any
  of its ports (:func:`dmpi.node.netns.job_firewall_rules`).
- **No pinning**: ``I_MPI_PIN=0``. A job's containers are limited in CPU time, not given
  cores of their own, so Intel MPI's pinning of each node's ranks to cores 0, 1, ...
  would put the ranks of every job on a node on the same cores.
- **Environment**: ``-genvlist`` / ``-genvnone`` as for MPICH.
- **Configuration file**: ``mpiexec`` reads options from ``$HOME/.mpiexec.conf``
  (``HOME`` is the user's directory) and has no switch to skip it (``-configfile
  /dev/null`` crashes it). What the user writes there changes only their own job; the
  options of :func:`mpi_argv` come after it and win, ranks that a ``-ppn`` there moves
  are stopped by the placement check of :mod:`dmpi.launch.files`.
- **A rank that exits non-zero** ends the job: Hydra kills the other ranks (SIGKILL).
- **A lost node or a partition**: as for MPICH, ``mpiexec`` fails when a proxy's
  connection closes; a partition is caught by DockerMPI's peer probes (no keepalive is
  set: libfabric's tcp provider has none to set).
- **Which rank failed**: what ``mpiexec`` prints is MPICH Hydra's, read by
  :func:`dmpi.launch.mpich.parse_failure` (``-print-all-exitcodes``'s wait statuses,
  ``MPI_Abort``'s message, the "BAD TERMINATION" banners, which Intel's Hydra prints per
  rank with its number).
"""

from dmpi.contract import AGENT_SSH
from dmpi.launch import mpich
from dmpi.launch.ssh import DEFAULT_RUN_DIR, ssh_args
from dmpi.launch.values import (check_abs_path, check_cidr, check_job_ports, check_keepalive,
                                check_oob_and_ssh_ports, check_range, check_ranks)

#: Intel's Hydra kills the other ranks when one exits non-zero.
ENDS_JOB_ON_RANK_EXIT = True
#: What the launcher container's script does first (before
#: :data:`dmpi.launch.flavours.LAUNCHER_SCRIPT`): name the job namespace's one Ethernet
#: interface (``type`` 1 in the kernel's /sys, never what the user says; not ``lo``, nor
#: the ``tunl0`` or ``sit0`` a host's tunnel modules put in every namespace) in
#: ``I_MPI_HYDRA_IFACE``.
LAUNCHER_PRELUDE = ('unset I_MPI_HYDRA_IFACE; for net in /sys/class/net/*; do '
                    'read -r type 2>/dev/null <"$net/type" && [ "$type" = 1 ] '
                    '&& export I_MPI_HYDRA_IFACE="${net##*/}"; done; ')
#: The hostfile (``host:N``) and the words ``mpiexec`` prints are MPICH Hydra's.
hostfile_text = mpich.hostfile_text
parse_failure = mpich.parse_failure


def launcher_environment(oob_ports, ssh_port, run_dir=DEFAULT_RUN_DIR):
    """
    Return the environment ``{name: value}`` the launcher container must have for
    ``mpiexec``: what Intel's Hydra reads from its environment only.

    oob_ports
        ``(low, high)`` or ``"low-high"``: checked against ``ssh_port`` as for the other
        flavours (``mpiexec`` listens on a port of the kernel's, see above).
    ssh_port, run_dir
        See :func:`dmpi.launch.ssh.ssh_args`: the options Hydra gives ``AGENT_SSH``.
    """
    check_oob_and_ssh_ports(oob_ports, ssh_port)
    return {
        "I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS": " ".join(ssh_args(ssh_port, run_dir)),
        "I_MPI_HYDRA_BRANCH_COUNT": "-1",
    }


def rank_settings(cluster_cidr, btl_ports, keepalive=(2, 1, 3)):
    """
    Return the ordered ``(name, value)`` environment settings of every rank (``-genv``).

    cluster_cidr
        IPv4 network of the cluster links (checked; libfabric is steered by the
        namespace's one interface, see the module's description).
    btl_ports, keepalive
        Checked as for the other flavours; the ranks listen on the kernel's ports and
        libfabric's tcp provider takes no keepalive (see the module's description).
    """
    check_cidr(cluster_cidr)
    check_range(btl_ports, "BTL port range")
    check_keepalive(keepalive)
    return [
        ("I_MPI_FABRICS", "shm:ofi"),
        ("I_MPI_OFI_PROVIDER", "tcp"),
        ("FI_PROVIDER", "tcp"),
        ("I_MPI_PIN", "0"),
    ]


def mpi_argv(np, cluster_cidr, oob_ports, btl_ports, ssh_port, workdir, env_names=(),
             run_dir=DEFAULT_RUN_DIR, keepalive=(2, 1, 3), launcher="mpirun"):
    """
    Return Intel MPI's ``mpirun`` (or ``mpiexec.hydra``) argv of a job (no shell).

    Arguments as :func:`dmpi.launch.mpich.mpi_argv`; ``launcher`` is Intel's ``mpirun``
    script or ``mpiexec``, found on the launcher's PATH or by its absolute path in the
    image.

    """
    env_names = check_ranks(np, workdir, env_names, launcher, "mpirun")
    check_abs_path(run_dir, "run_dir")
    check_job_ports(oob_ports, btl_ports, ssh_port)
    return mpich.hydra_argv([launcher, "-launcher", "ssh", "-launcher-exec", AGENT_SSH,
                             "-machinefile", f"{run_dir}/hostfile"],
                            np, workdir, env_names,
                            rank_settings(cluster_cidr, btl_ports, keepalive), run_dir)

