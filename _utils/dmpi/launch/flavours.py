"""
Which launch module starts a job, by the MPI flavour its image's probe found
(:mod:`dmpi.launch.probe`): each offers ``hostfile_text(placement)``,
``launcher_argv(stdout_path, stderr_path, np, cluster_cidr, oob_ports, btl_ports,
ssh_port, workdir, env_names, run_dir, keepalive, launcher)`` and
``parse_failure(text)`` (the launcher's standard error, then its standard output); a
flavour whose launcher reads settings from its environment only also offers
``launcher_environment(oob_ports, ssh_port)``, and one whose launcher can exit 0 after
losing a node ``lost_daemon(stderr_text)``.
"""

from dmpi.launch import mpich, openmpi, openmpi5

#: Flavour (probe's name) -> its launch module.
MODULES = {"openmpi4": openmpi, "openmpi5": openmpi5, "mpich": mpich}
#: The flavour of a job whose image was never probed: DockerMPI's own job image's.
DEFAULT = "openmpi4"


def module(flavour):
    """The launch module of ``flavour`` (None: :data:`DEFAULT`); ValueError for one
    DockerMPI cannot launch."""
    found = MODULES.get(flavour or DEFAULT)
    if found is None:
        raise ValueError(f"DockerMPI cannot launch jobs of MPI flavour {flavour!r} "
                         f"(it launches {', '.join(sorted(MODULES))})")
    return found


def launcher_environment(module, oob_ports, ssh_port):
    """``{name: value}`` the launcher container of a job of flavour ``module`` must
    have besides the job's own environment (Hydra's ssh options and control port)."""
    settings = getattr(module, "launcher_environment", None)
    return settings(oob_ports, ssh_port) if settings is not None else {}


def parse_failure(stderr_text):
    """Which rank made a job fail, from its launcher's standard error and output, whatever
    its MPI (each flavour's messages are its own; the node that reads them does not know
    the job's flavour): the first flavour's verdict found, or None. Never raises."""
    for flavour in MODULES.values():
        found = flavour.parse_failure(stderr_text)
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
