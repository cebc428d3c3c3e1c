"""
A Kubeflow MPI Operator job (``kind: MPIJob``, ``kubeflow.org/v2beta1``, and
``kubeflow.org/v1`` where it differs) as a DockerMPI job request.

What maps: the image (to an approved image by its reference or digest, or the one the
user names, whose probed MPI must be the manifest's ``mpiImplementation``), the
launcher's command with its ``mpirun -n N`` wrapper removed (``N`` must be Worker
replicas x slotsPerWorker), Worker replicas and slotsPerWorker (nodes and
ranks per node), the launcher container's environment, ``activeDeadlineSeconds`` (the
walltime) and the containers' resources, checked against what a slot gets. The worker's
command (the operator's sshd) and the ssh settings are DockerMPI's own. Whatever else it
names and DockerMPI cannot honour is refused, naming the field.

The manifest is the user's text: YAML without aliases (no amplification), at most
:data:`MAX_MANIFEST_BYTES`, read as plain data.
"""

import posixpath
import re

import yaml

from dmpi.contract import DATA_MOUNT
from dmpi.errors import RequestError
from dmpi.launch.flavours import DEFAULT as UNPROBED_FLAVOUR
from dmpi.launch.probe import FLAVOUR_NAMES

MAX_MANIFEST_BYTES = 256 * 1024
API_VERSIONS = ("kubeflow.org/v2beta1", "kubeflow.org/v1")
#: spec.mpiImplementation -> the probed MPI flavours (dmpi.launch.flavours) it runs on.
IMPLEMENTATIONS = {"OpenMPI": ("openmpi4", "openmpi5"), "Intel": ("intelmpi",),
                   "MPICH": ("mpich",)}
#: The launcher commands whose wrapper is removed, and the options of theirs that map.
LAUNCHERS = ("mpirun", "mpiexec", "mpiexec.hydra", "prterun", "orterun")
_NP_OPTIONS = ("-n", "-np", "--np", "-c", "--n")
_IGNORED_FLAGS = ("--allow-run-as-root",)
_DIGEST_RE = re.compile(r"@(sha256:[0-9a-f]{64})\Z")
_QUANTITY_RE = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(m|k|Ki|M|Mi|G|Gi|T|Ti)?\Z")
_UNITS = {None: 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
          "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}

#: Fields DockerMPI honours or has no need of; any other is refused by name.
_SPEC_FIELDS = {"slotsPerWorker", "runLauncherAsWorker", "runPolicy", "mpiReplicaSpecs",
                "sshAuthMountPath", "launcherCreationPolicy", "mpiImplementation",
                "cleanPodPolicy", "mainContainer"}
_RUN_POLICY_FIELDS = {"cleanPodPolicy", "ttlSecondsAfterFinished", "activeDeadlineSeconds",
                      "backoffLimit", "suspend"}
_REPLICA_FIELDS = {"replicas", "template", "restartPolicy"}
_POD_FIELDS = {"containers", "restartPolicy"}
_CONTAINER_FIELDS = {"name", "image", "command", "args", "env", "resources",
                     "securityContext", "imagePullPolicy", "workingDir"}
#: A worker's readiness probe waits for the operator's sshd, which DockerMPI replaces by
#: its own readiness check.
_WORKER_CONTAINER_FIELDS = _CONTAINER_FIELDS | {"readinessProbe"}
#: What a container may ask of its security context: no more than DockerMPI gives
#: (its own unprivileged uid, no capabilities, no new privileges).
_SECURITY_OK = {"runAsUser": None, "runAsGroup": None, "runAsNonRoot": True,
                "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": None,
                "privileged": False}


class _NoAliasLoader(yaml.SafeLoader):  # pylint: disable=too-many-ancestors
    """Safe YAML that refuses anchors and aliases."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            raise RequestError("mpijob: YAML aliases (*name) are not accepted")
        return super().compose_node(parent, index)


def load(manifest):
    """The manifest as data: a mapping (as given) or its YAML/JSON text."""
    if isinstance(manifest, dict):
        return manifest
    if not isinstance(manifest, str):
        raise RequestError("mpijob must be the MPIJob's YAML text or a mapping")
    if len(manifest.encode("utf-8", "replace")) > MAX_MANIFEST_BYTES:
        raise RequestError(f"mpijob is larger than {MAX_MANIFEST_BYTES // 1024} KiB")
    try:
        found = yaml.load(manifest, Loader=_NoAliasLoader)  # noqa: S506 (safe, no aliases)
    except yaml.YAMLError as exc:
        raise RequestError(f"mpijob is not YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(found, dict):
        raise RequestError("mpijob must be one MPIJob (a YAML mapping)")
    return found


def _shown(value):
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _mapping(value, field):
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RequestError(f"mpijob {field} must be a mapping, got {_shown(value)}")
    return value


def _only(mapping, allowed, field):
    for key in mapping:
        if key not in allowed:
            raise RequestError(f"mpijob {field}.{key} cannot be honoured by DockerMPI "
                               f"(it takes {', '.join(sorted(allowed))})")


def _count(value, field, default=None, minimum=1):
    if value is None and default is not None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise RequestError(f"mpijob {field} must be a whole number of at least {minimum}, "
                           f"got {_shown(value)}")
    return value


def _quantity(value, field, cpu):
    text = str(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else value
    match = _QUANTITY_RE.match(text) if isinstance(text, str) else None
    if not match or (cpu and match.group(2) not in (None, "m")) \
            or (not cpu and match.group(2) == "m"):
        raise RequestError(f"mpijob {field} {_shown(value)} is not a Kubernetes "
                           f"{'CPU' if cpu else 'memory'} quantity")
    number = float(match.group(1))
    if cpu:
        return number / 1000 if match.group(2) == "m" else number
    return number * _UNITS[match.group(2)]


def _container(replica, role, main):
    template = _mapping(replica.get("template"), f"{role}.template")
    _only(template, {"spec", "metadata"}, f"{role}.template")
    pod = _mapping(template.get("spec"), f"{role}.template.spec")
    _only(pod, _POD_FIELDS, f"{role}.template.spec")
    containers = pod.get("containers")
    if not isinstance(containers, list) or not containers:
        raise RequestError(f"mpijob {role}.template.spec.containers must list the "
                           f"{role.lower()}'s container")
    chosen = [c for c in containers if isinstance(c, dict) and c.get("name") == main] \
        if main else []
    if chosen:
        container = chosen[0]
    elif len(containers) > 1:
        raise RequestError(f"mpijob {role}.template.spec.containers: DockerMPI runs one "
                           f"container per {role.lower()} (name it in spec.mainContainer)")
    else:
        container = containers[0]
    field = f"{role}.template.spec.containers[{containers.index(container)}]"
    container = _mapping(container, field)
    _only(container, _WORKER_CONTAINER_FIELDS if role == "Worker" else _CONTAINER_FIELDS,
          field)
    security = _mapping(container.get("securityContext"), f"{field}.securityContext")
    for key, value in security.items():
        if key not in _SECURITY_OK or (_SECURITY_OK[key] is not None
                                       and value != _SECURITY_OK[key]):
            raise RequestError(f"mpijob {field}.securityContext.{key}: {_shown(value)} "
                               "cannot be honoured (DockerMPI runs every rank as the user's "
                               "own unprivileged uid, with no capabilities)")
    return container, field


def _image(container, field, approved, chosen):
    """The approved short name the container's image maps to."""
    if chosen is not None:
        if chosen not in approved:
            raise RequestError(f"image {chosen!r} is not approved; approved images: "
                               f"{sorted(approved)}")
        return chosen
    image = container.get("image")
    if not isinstance(image, str) or not image:
        raise RequestError(f"mpijob {field}.image is required")
    for name, reference in sorted(approved.items()):
        if image == reference:
            return name
    digest = _DIGEST_RE.search(image)
    if digest:
        for name, reference in sorted(approved.items()):
            if reference.endswith("@" + digest.group(1)):
                return name
    raise RequestError(
        f"mpijob {field}.image {_shown(image)} is no approved image (by reference or "
        f"digest); name the approved image to run it in (image=...; approved: "
        f"{', '.join(sorted(approved)) or 'none'})")


def _launcher_command(container, field, np_expected):
    """The program under the launcher's ``mpirun -n N`` wrapper."""
    parts = [container.get("command") or [], container.get("args") or []]
    words = [w for part in parts if isinstance(part, list) for w in part]
    if not all(isinstance(p, list) for p in parts) or not words \
            or not all(isinstance(w, str) for w in words):
        raise RequestError(f"mpijob {field}.command and args must give the launcher's "
                           "mpirun command line, as strings")
    if posixpath.basename(words[0]) not in LAUNCHERS:
        raise RequestError(
            f"mpijob {field}.command must start with mpirun (or mpiexec) and its "
            f"arguments: DockerMPI runs the program under it itself; got {_shown(words[0])}")
    np, index = None, 1
    while index < len(words) and words[index].startswith("-"):
        word = words[index]
        name, _, inline = word.partition("=")
        if name in _NP_OPTIONS:
            if not inline:
                index += 1
                inline = words[index] if index < len(words) else ""
            if not inline.isdigit() or int(inline) < 1:
                raise RequestError(f"mpijob {field}: {name} {_shown(inline)} is not a "
                                   "number of ranks")
            np = int(inline)
        elif word not in _IGNORED_FLAGS:
            raise RequestError(f"mpijob {field}: mpirun option {word} cannot be honoured "
                               "(DockerMPI sets the launch itself; it takes -n)")
        index += 1
    program = words[index:]
    if not program:
        raise RequestError(f"mpijob {field}: no program after the mpirun options")
    if np is not None and np != np_expected:
        raise RequestError(
            f"mpijob {field}: mpirun -n {np} is not Worker replicas x slotsPerWorker "
            f"({np_expected}): DockerMPI runs one rank per slot")
    return program


def _environment(container, field):
    env = {}
    for index, item in enumerate(container.get("env") or []):
        item = _mapping(item, f"{field}.env[{index}]")
        if "valueFrom" in item:
            raise RequestError(f"mpijob {field}.env[{index}].valueFrom (secrets, config maps, "
                               "fields) cannot be honoured: give the value")
        _only(item, {"name", "value"}, f"{field}.env[{index}]")
        name, value = item.get("name"), item.get("value", "")
        if not isinstance(name, str) or not isinstance(value, str):
            raise RequestError(f"mpijob {field}.env[{index}] needs a name and a text value")
        env[name] = value
    return env


def _resources(container, field, slots, limits):
    """Refuse resources beyond what ``slots`` slots get on a node."""
    resources = _mapping(container.get("resources"), f"{field}.resources")
    _only(resources, {"limits", "requests"}, f"{field}.resources")
    most = {"cpu": slots * float(limits["cpus_per_slot"]),
            "memory": slots * int(limits["memory_per_slot_mb"]) * 2**20}
    for kind in ("limits", "requests"):
        asked = _mapping(resources.get(kind), f"{field}.resources.{kind}")
        _only(asked, {"cpu", "memory"}, f"{field}.resources.{kind}")
        for name, value in asked.items():
            amount = _quantity(value, f"{field}.resources.{kind}.{name}", name == "cpu")
            if amount > most[name] + 1e-9:
                shown = (f"{most[name]:g} CPUs" if name == "cpu"
                         else f"{most[name] / 2**20:g} MiB")
                raise RequestError(
                    f"mpijob {field}.resources.{kind}.{name} {value} is more than its "
                    f"{slots} slot(s) get ({shown}: mpi:limits:"
                    f"{'cpus_per_slot' if name == 'cpu' else 'memory_per_slot_mb'})")


def _implementation(spec):
    implementation = spec.get("mpiImplementation", "OpenMPI")
    if not isinstance(implementation, str) or implementation not in IMPLEMENTATIONS:
        raise RequestError(f"mpijob spec.mpiImplementation {_shown(implementation)} cannot be "
                           f"honoured: DockerMPI launches {', '.join(IMPLEMENTATIONS)}")
    return implementation


def _check_implementation(implementation, name, flavour):
    """Refuse an image whose probed MPI (``flavour``; None: not probed, launched as
    :data:`UNPROBED_FLAVOUR`) is not the manifest's ``spec.mpiImplementation``."""
    if (flavour or UNPROBED_FLAVOUR) in IMPLEMENTATIONS[implementation]:
        return
    if flavour is None:
        raise RequestError(f"mpijob spec.mpiImplementation {implementation}: image {name!r} "
                           f"has not been probed by a node yet, and an image not probed is "
                           f"launched as {FLAVOUR_NAMES[UNPROBED_FLAVOUR]}; submit again "
                           "once `mpi.images` shows its MPI")
    raise RequestError(f"mpijob spec.mpiImplementation {implementation} does not match image "
                       f"{name!r}, whose MPI is {FLAVOUR_NAMES.get(flavour, flavour)}")


def to_request(manifest, approved, limits, image=None, flavour_of=None):
    """
    The submit arguments (``image``, ``np``, ``cmd``, ``nodes``, ``slots_per_node``,
    ``walltime``, ``env``, ``name``) of an MPIJob ``manifest`` (YAML text or mapping).

    approved
        The approved images, ``{short name: reference}``.
    limits
        The site's ``mpi:limits`` (per-slot CPU and memory).
    image
        The approved image to run it in, instead of mapping the manifest's.
    flavour_of
        The MPI flavour the nodes' probe found in an approved image, by its short name
        (None: not probed); without it no image counts as probed.

    RequestError naming the field for anything it cannot honour.
    """
    job = load(manifest)
    if job.get("apiVersion") not in API_VERSIONS or job.get("kind") != "MPIJob":
        raise RequestError(f"mpijob must be a kind: MPIJob of apiVersion "
                           f"{' or '.join(API_VERSIONS)}, got {_shown(job.get('kind'))} "
                           f"{_shown(job.get('apiVersion'))}")
    _only(job, {"apiVersion", "kind", "metadata", "spec", "status"}, "")
    metadata = _mapping(job.get("metadata"), "metadata")
    spec = _mapping(job.get("spec"), "spec")
    _only(spec, _SPEC_FIELDS, "spec")
    implementation = _implementation(spec)
    policy = _mapping(spec.get("runPolicy"), "spec.runPolicy")
    _only(policy, _RUN_POLICY_FIELDS, "spec.runPolicy")
    if policy.get("suspend"):
        raise RequestError("mpijob spec.runPolicy.suspend: true cannot be honoured: submit "
                           "the job when it should run")
    if policy.get("backoffLimit") not in (None, 0):
        raise RequestError(f"mpijob spec.runPolicy.backoffLimit {_shown(policy['backoffLimit'])}"
                           " cannot be honoured: DockerMPI does not restart a failed job "
                           "(set it to 0 or leave it out)")
    slots = _count(spec.get("slotsPerWorker"), "spec.slotsPerWorker", default=1)
    replicas = _mapping(spec.get("mpiReplicaSpecs"), "spec.mpiReplicaSpecs")
    _only(replicas, {"Launcher", "Worker"}, "spec.mpiReplicaSpecs")
    if "Launcher" not in replicas or "Worker" not in replicas:
        raise RequestError("mpijob spec.mpiReplicaSpecs needs a Launcher and a Worker")
    launcher = _mapping(replicas["Launcher"], "Launcher")
    worker = _mapping(replicas["Worker"], "Worker")
    for role, replica in (("Launcher", launcher), ("Worker", worker)):
        _only(replica, _REPLICA_FIELDS, role)
    _count(launcher.get("replicas"), "Launcher.replicas", default=1)
    if launcher.get("replicas") not in (None, 1):
        raise RequestError("mpijob Launcher.replicas must be 1")
    workers = _count(worker.get("replicas"), "Worker.replicas", default=1)
    as_worker = spec.get("runLauncherAsWorker") is True
    nodes = workers + (1 if as_worker else 0)
    main = spec.get("mainContainer")
    launch_container, launch_field = _container(launcher, "Launcher", main)
    work_container, work_field = _container(worker, "Worker", main)
    name = _image(launch_container, launch_field, approved, image)
    if image is None and _image(work_container, work_field, approved, None) != name:
        raise RequestError(f"mpijob {work_field}.image differs from the launcher's: DockerMPI "
                           "runs one image for the whole job")
    _check_implementation(implementation, name, flavour_of(name) if flavour_of else None)
    np = nodes * slots
    program = _launcher_command(launch_container, launch_field, np)
    env = _environment(launch_container, launch_field)
    extra = {k: v for k, v in _environment(work_container, work_field).items()
             if env.get(k) != v}
    if extra:
        raise RequestError(f"mpijob {work_field}.env {sorted(extra)[0]} differs from the "
                           "launcher's env: every rank gets the launcher's environment")
    _resources(work_container, work_field, slots, limits)
    _resources(launch_container, launch_field, slots if as_worker else 1, limits)
    deadline = policy.get("activeDeadlineSeconds")
    request = {"image": name, "np": np, "cmd": program, "nodes": nodes,
               "slots_per_node": slots, "env": env or None,
               "walltime": None if deadline is None
               else f"{_count(deadline, 'spec.runPolicy.activeDeadlineSeconds')}s",
               "name": metadata.get("name")}
    workdir = launch_container.get("workingDir")
    if workdir is not None:
        if not isinstance(workdir, str) or not (workdir == DATA_MOUNT
                                                or workdir.startswith(DATA_MOUNT + "/")):
            raise RequestError(f"mpijob {launch_field}.workingDir {_shown(workdir)} cannot be "
                               f"honoured: a job works in the user's directory, {DATA_MOUNT}")
        request["workdir"] = posixpath.relpath(workdir, DATA_MOUNT)  # as submit takes it
    return request
