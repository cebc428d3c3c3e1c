"""
What master and nodes must agree on: the patterns of ids and names, the paths inside job
containers, Docker labels and names, job states and the tags of the master's event bus.

Both sides import this one module (``from dmpi.contract import JOB_ID_RE``); nothing
here does I/O.
"""

import re

#: A job id, ``YYYYMMDD-HHMMSS-xxxxxx`` (UTC time of submit, 3 random bytes in hex), and
#: the same inside other patterns (no anchors).
JOB_ID_PATTERN = r"[0-9]{8}-[0-9]{6}-[0-9a-f]{6}"
JOB_ID_RE = re.compile(r"^" + JOB_ID_PATTERN + r"\Z")
#: A user name as JupyterHub hands it over; it becomes a directory name on the storage.
USER_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}\Z")
#: A POSIX account or group name (the guest account; users' names inside containers).
ACCOUNT_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}\Z")
#: A Docker network (or container) name, as DockerMPI accepts it.
DOCKER_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
#: The short name of an approved image (the key under ``mpi:images``; ``image=`` of a job).
IMAGE_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,128}\Z")
#: An image reference pinned by digest, no tag: ``[registry[:port]/]repo@sha256:<64 hex>``.
IMAGE_REFERENCE_RE = re.compile(
    r"^(?P<repo>(?:[A-Za-z0-9.-]+(?::[0-9]+)?/)?[a-z0-9]+(?:[._-]+[a-z0-9]+)*"
    r"(?:/[a-z0-9]+(?:[._-]+[a-z0-9]+)*)*)"
    r"@(?P<digest>sha256:[0-9a-f]{64})\Z"
)

#: Where the user's directory ``<storage path>/users/<user>`` is mounted in job
#: containers (also the user's HOME there).
DATA_MOUNT = "/data"
#: The directory under the shared storage path that holds one directory per user.
USERS_SUBDIR = "users"
#: The directory in a user's directory that holds one directory per job.
JOBS_SUBDIR = "mpi-jobs"
#: Where the job's node-local secret directory is mounted (read-only) in its containers.
RUN_DIR = "/run/dockermpi"
#: Where a node's remote-start agent (:mod:`dmpi.node.agent`) is, on the node and,
#: mounted read-only, in job containers.
AGENT_DIR = "/usr/lib/dockermpi/agent"
#: The agent's programs, at those paths in every job container.
AGENT_SSHD = AGENT_DIR + "/sbin/sshd"
AGENT_SSH = AGENT_DIR + "/bin/ssh"
#: The user API's JupyterHub service name (mpi_api.SERVICE, jupyterhub_config.py).
API_SERVICE_NAME = "dockermpi"
#: The node-local directory of per-job secrets, unless ``mpi:job_root`` says otherwise.
DEFAULT_JOB_ROOT = "/var/lib/dockermpi/jobs"

#: Job states: the first, those with containers, and the final ones (a job ends in one).
QUEUED = "queued"
ACTIVE = ("starting", "running")
FINAL = ("succeeded", "failed", "cancelled", "timed_out")
UNENDED = (QUEUED,) + ACTIVE  # what squeue shows: a job's states before its end
STATES = UNENDED + FINAL
#: The tag every job transition is fired under on the master's event bus.
JOB_EVENT_TAG = "mpi/job/{job_id}/{state}"

#: A job's containers on a node: ``dmpi-<job id>-worker`` (sshd, the ranks) everywhere,
#: ``dmpi-<job id>-launcher`` (mpirun) on the first node.
CONTAINER_ROLES = ("worker", "launcher")
CONTAINER_NAME = "dmpi-{job_id}-{role}"
#: Docker labels on every job container: the job id, its role and whose job it is.
LABEL_JOB = "io.dockermpi.job"
LABEL_ROLE = "io.dockermpi.role"
LABEL_USER = "io.dockermpi.user"

#: Network namespaces a node keeps made ahead of jobs (``mpi:job_network:standby``): at
#: most this many, each held by a container named ``dmpi-standby-<hex>`` with the role
#: label ``standby`` until a job start takes it (and renames it ``dmpi-<job id>-netns``).
MAX_STANDBY_NAMESPACES = 16
STANDBY_ROLE = "standby"
STANDBY_PREFIX = "dmpi-standby-"
#: The role label of the throw-away container that probes an approved image (no job's).
PROBE_ROLE = "image-probe"

#: Values of the ``roles`` grain: a node that runs jobs, the host exporting NFS storage.
NODE_ROLE = "mpi-node"
NFS_SERVER_ROLE = "mpi-nfs-server"

#: The job controller's own events on the master's bus: a job's transitions, and the runner's
#: requests to the job controller (``queued``, ``cancel``).
JOB_TAG_PREFIX = "mpi/job/"
#: ``mpi/job/<job id>/<state or request>``: group 1 the job id, group 2 what happened.
JOB_TAG_RE = re.compile(
    r"^" + re.escape(JOB_TAG_PREFIX) + r"(" + JOB_ID_PATTERN + r")/([a-z_]+)\Z")
#: A node's events (``mpi/node/<id>/report``, ``.../alive``).
NODE_TAG_PREFIX = "mpi/node/{node}/"
NODE_TAG_RE = re.compile(r"^mpi/node/[^/]+/(report|alive)\Z")
#: An admin drained or resumed a node, or a network self-test judged nodes: the job
#: controller reads the drains and the self-test's verdicts from the job store again.
NODES_CHANGED_TAG = "mpi/nodes/changed"

#: The container that holds a started job's network namespace on a node.
NETNS_NAME = "dmpi-{job_id}-netns"
NETNS_RE = re.compile(r"^dmpi-(" + JOB_ID_PATTERN + r")-netns\Z")


def is_job_id(value):
    """Whether ``value`` is a job id (``YYYYMMDD-HHMMSS-xxxxxx``)."""
    return isinstance(value, str) and bool(JOB_ID_RE.match(value))


def is_user(value):
    """Whether ``value`` is a user name DockerMPI accepts (letters, digits, ``-``, ``_``;
    at most 64, starting with a letter or digit)."""
    return isinstance(value, str) and bool(USER_RE.match(value))


def job_tag(job_id, state):
    """The event tag of a job's transition or request: ``mpi/job/<job id>/<state>``."""
    return JOB_EVENT_TAG.format(job_id=job_id, state=state)


def container_name(job_id, role):
    """The name of a job's container: ``dmpi-<job id>-worker`` or ``dmpi-<job id>-launcher``.
    ``ValueError`` for anything but a job id and one of :data:`CONTAINER_ROLES`."""
    if not is_job_id(job_id):
        raise ValueError(f"{str(job_id)[:60]!r} is not a job id")
    if role not in CONTAINER_ROLES:
        raise ValueError(f"role must be one of {', '.join(CONTAINER_ROLES)}, got {str(role)[:60]!r}")
    return CONTAINER_NAME.format(job_id=job_id, role=role)

#: How a node's health report starts its storage state when the mount answers but has
#: no space, inodes or quota left (``"full: <error>"``): the node still takes jobs, since
#: a full file system is the site's to free, not the node's fault, and taking every node
#: out of service would let one user who fills it stop everyone's jobs.
STORAGE_FULL = "full"
