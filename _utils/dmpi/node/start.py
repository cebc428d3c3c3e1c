"""
A job's start on a node: its keys made and certified here, its files written where only
its uid reads them, its worker container started in a network namespace of its own (a
standby's when the node has one) behind the job's firewall, and, once every sshd of the
job answers with its host certificate, on the job's first node the container that runs
``mpirun``.
"""

import concurrent.futures
import json
import os
import time

import docker
import docker.errors
import dmpi.launch.ssh
import dmpi.seal

from dmpi.contract import AGENT_SSHD, DOCKER_NAME_RE, JOBS_SUBDIR, RUN_DIR
from dmpi.errors import NodeError, RequestError, StartFailure
from dmpi.node import agent, checks, containers, jobca, netns, standby, userdirs

SECRET_FILES = {"sshd_config", "hostfile", "passwd", "group", "program"}


def write_secrets(directory, files, uid, gid, keys):
    """The job's files (from the master) and its keys (made here) in a directory only
    the job's uid reads."""
    unknown = set(files) - SECRET_FILES
    if unknown:
        raise RequestError(f"unexpected job files: {sorted(unknown)}")
    if any(not isinstance(t, str) or len(t) > containers.SECRET_FILE_MAX for t in files.values()):
        raise RequestError("job files must be text of at most 1 MiB each")
    files = dict(files, **keys)
    os.makedirs(os.path.dirname(directory), mode=0o711, exist_ok=True)
    os.mkdir(directory, 0o700)
    os.chown(directory, uid, gid)
    for name, text in files.items():
        fd = os.open(os.path.join(directory, name),
                     os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.chown(os.path.join(directory, name), uid, gid)


def _answering_with_job_certificate(pid, expected, port):
    """Which of the sshds at the addresses of ``expected`` (``{address: CA public
    line}``), seen from the job's own namespace, present a host certificate of that
    address's node CA naming that address (a banner alone proves nothing)."""
    _, out, _ = netns.run(netns.netns(pid) + ["ssh-keyscan", "-c", "-T", "1", "-p",
                                              str(int(port))] + sorted(expected), timeout=5)
    proven = set()
    for line in out.splitlines():
        try:
            cert = dmpi.launch.ssh.read_ssh_certificate(line)
        except ValueError:
            continue
        if cert["kind"] != "host":
            continue
        proven.update(a for a in cert["principals"]
                      if a in expected and expected[a].split()[:2] == cert["ca"].split())
    return proven


def _wait_for_sshd(job_id, container, pid, expected, port, deadline):
    """Wait until every address of ``expected`` answers with its host certificate; raise
    when the worker exits or time runs out."""
    waiting = set(expected)
    while waiting:
        waiting -= _answering_with_job_certificate(
            pid, {a: expected[a] for a in waiting}, port)
        if not waiting:
            return
        container.reload()
        if container.status != "running":
            logs = container.logs(tail=20).decode(errors="replace")
            raise NodeError(f"worker sshd of job {job_id} exited: {logs.strip()}")
        if time.monotonic() > deadline:
            raise NodeError(
                f"the sshd of job {job_id} at {', '.join(sorted(waiting))} did not answer "
                f"with the job's host certificate on port {port} in time")
        time.sleep(0.05)


def start_worker(job_id, image, user, uid, gid, storage_path, job_root, network, addresses,
                 allowed_sources, sshd_port, files, launcher, job_cas, valid_seconds,
                 limits=None, ready_timeout=30, *, node_id, node_key):
    """
    Make a job's keys, write its files, start its worker container and wait until its
    sshd answers with the job's host certificate; on the job's first node, start the
    launcher.

    job_id
        The job id the runner gave.
    image
        Approved image reference, pinned by digest.
    user
        Whose job it is; ``<storage_path>/users/<user>`` is mounted at ``/data``.
    uid, gid
        The user's own ids; the containers run as them.
    storage_path
        Where the shared storage is on this node.
    job_root
        Node-local directory for per-job secrets.
    network
        The Docker job network (macvlan) on this node.
    addresses
        ``{node id: address}``: each node's job container address from the master's
        pool (one call serves every node of the job); this node takes its own.
    allowed_sources
        ``{"peers": [job addresses], "hosts": [node addresses], "unreachable":
        [networks]}``: who may reach the job's namespace (peers: everything; hosts: only
        sshd), and where the job may open connections only to its peers (CIDRs: the
        cluster network and the site's ``mpi:job_network:unreachable``).
    sshd_port
        The port sshd listens on inside the job's namespace.
    files
        ``{name: text}``: sshd_config, passwd, group, program and hostfile (no keys: the
        node makes those).
    launcher
        ``{"node": id, "argv": [...], "environment": {...}, "limits": {...},
        "status": {...}}``: the node with that id makes the job's user key and, once
        its own sshd and every other address in ``addresses`` answer with their host
        certificates, starts the container that runs mpirun (``argv``, the launcher
        command; ``environment``, set there and forwarded to the ranks, sealed to this
        node's Salt key by the master (:mod:`dmpi.seal`); ``status``,
        written as ``status.json`` just before it starts) before it returns. Every
        other node's sshd trusts the user certificates of that node's job CA.
    job_cas
        ``{node id: job CA public line}`` of every node of the job (:func:`job_ca`).
    valid_seconds
        How long the job may run: its certificates expire that long (and a grace for
        the clean-up) after they are made.
    limits
        ``{node id: {"memory": bytes, "pids": n, "nano_cpus": n, "tmp_size": bytes}}``;
        a node not named gets small limits (a worker that runs no ranks).
    ready_timeout
        Seconds to wait for sshd.
    node_id, node_key
        This node's minion id and the file of its Salt private key (which opens the
        launcher's sealed environment).

    Returns ``{"container": name, "sshd_ready_seconds": float, "namespace": "standby"
    or "own", "phases": {...}}``, and on the launcher's node also ``launcher`` (its
    container name); there ``sshd_ready_seconds`` is when every sshd of the job was
    proven. ``phases`` says when each step ended (seconds from the call: prepare,
    namespace, container, firewall, sshd, launcher). In a standby namespace the
    firewall is in place before the worker starts; in its own, just after.
    """
    checks.check_job_id(job_id)
    checks.check_user(user)
    uid, gid = checks.check_ids(uid, gid)
    if not isinstance(addresses, dict) or node_id not in addresses:
        raise RequestError(f"addresses must give this node ({node_id}) an address")
    address = checks.check_ipv4(addresses[node_id], "address")
    limits = (limits or {}).get(node_id)
    if not isinstance(network, str) or not DOCKER_NAME_RE.match(network):
        raise RequestError(f"invalid network name {network!r}")
    if not isinstance(allowed_sources, dict):
        raise RequestError(
            "allowed_sources must be {peers: [...], hosts: [...], unreachable: [...]}")
    if not isinstance(launcher, dict) or launcher.get("node") not in addresses:
        raise RequestError("launcher must name one of the job's nodes")
    starts_launcher = launcher["node"] == node_id
    started = time.monotonic()
    keys = jobca.job_keys(node_id, job_id, job_cas, launcher["node"], addresses, sshd_port,
                          valid_seconds)
    try:
        users_root = userdirs.users_root(storage_path)
    except NodeError as exc:
        raise StartFailure("storage", str(exc)) from None
    userdirs.require_user_dir(storage_path, user, uid)
    agent_build = agent.host_path()
    secret_dir = containers.secret_dir(job_root, job_id)
    write_secrets(secret_dir, files, uid, gid, keys)
    options = containers.container_options(job_id, "worker", user, uid, gid,
                                           os.path.join(users_root, user), secret_dir, limits,
                                           agent_build)
    client = containers.client()
    phases = {"prepare": time.monotonic() - started}
    holder = standby.take_standby(client, job_id, network, address)
    phases["namespace"] = time.monotonic() - started
    sshd = containers.program([AGENT_SSHD, "-D", "-e", "-f", f"{RUN_DIR}/sshd_config"])
    try:
        if holder is not None:
            # The namespace is sealed while the worker is created, and before it starts.
            options.pop("detach")
            pid = holder.attrs["State"]["Pid"]
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                sealed = pool.submit(standby.seal_standby, client, job_id, holder, pid,
                                     allowed_sources, sshd_port)
                container = client.containers.create(
                    image, network_mode=f"container:{holder.id}", **sshd, **options)
                sealed.result()
            phases["firewall"] = time.monotonic() - started
            container.start()
        else:
            container = client.containers.run(
                image, network=network, **sshd,
                networking_config={
                    network: client.api.create_endpoint_config(ipv4_address=address)},
                **containers.namespace_options(node_id), **options,
            )
            container.reload()
            pid = container.attrs["State"]["Pid"]
    except docker.errors.APIError as exc:
        raise NodeError(f"cannot start the worker of job {job_id}: {exc}") from exc
    phases["container"] = time.monotonic() - started
    holder_name = holder.id if holder is not None else options["name"]
    namespace = "standby" if holder is not None else "own"
    if holder is None:
        netns.close_namespace(job_id, pid, allowed_sources, sshd_port)
        phases["firewall"] = time.monotonic() - started
    deadline = time.monotonic() + ready_timeout
    if not starts_launcher:
        _wait_for_sshd(job_id, container, pid, {address: job_cas[node_id]},
                       sshd_port, deadline)
        phases["sshd"] = time.monotonic() - started
        return {"container": options["name"], "sshd_ready_seconds": phases["sshd"],
                "namespace": namespace, "phases": phases}
    # The launcher's node starts mpirun itself once every sshd of the job, its own
    # included, proves it is the job's: one publish starts the whole job. The job
    # directory and the launcher container are made while the sshds come up.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        prepared = pool.submit(_create_launcher, client, job_id, image, user, uid, gid,
                               storage_path, job_root, launcher["argv"],
                               launcher.get("environment"), launcher.get("limits"),
                               launcher.get("status"), holder_name, node_key)
        _wait_for_sshd(job_id, container, pid,
                       {addresses[n]: job_cas[n] for n in addresses}, sshd_port, deadline)
        launcher_container = prepared.result()
    phases["sshd"] = time.monotonic() - started
    _start_launcher(job_id, launcher_container)
    phases["launcher"] = time.monotonic() - started
    return {"container": options["name"], "sshd_ready_seconds": phases["sshd"],
            "launcher": launcher_container.name, "namespace": namespace, "phases": phases}


def _create_launcher(client, job_id, image, user, uid, gid, storage_path, job_root, argv,
                     environment, limits, status, holder_name, node_key):
    """The job directory (as the user's uid), the launcher container (by ``client``, the
    start's own) in the network namespace of container ``holder_name`` (the worker's),
    created, not started, and ``status.json`` (when ``status`` is given) saying the job
    runs."""
    checks.check_job_id(job_id)
    checks.check_user(user)
    uid, gid = checks.check_ids(uid, gid)
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise RequestError("argv must be a non-empty list of strings")
    users_root = userdirs.users_root(storage_path)
    secret_dir = containers.secret_dir(job_root, job_id)
    if not os.path.isdir(secret_dir):
        raise NodeError(f"job {job_id} has no worker on this node")
    userdirs.userfs("makedirs", uid, gid, root=users_root, parts=[user, JOBS_SUBDIR, job_id])
    options = containers.container_options(job_id, "launcher", user, uid, gid,
                                           os.path.join(users_root, user), secret_dir, limits,
                                           agent.host_path())
    options["environment"] = dict(_opened_environment(environment, node_key),
                                  **options["environment"])
    options.pop("detach")
    try:
        container = client.containers.create(
            image, network_mode=f"container:{holder_name}", **containers.program(argv),
            **options)
    except docker.errors.APIError as exc:
        raise NodeError(f"cannot start the launcher of job {job_id}: {exc}") from exc
    if status is not None:
        userdirs.write_status(job_id, storage_path, user, uid, gid, status)
    return container


def _opened_environment(environment, node_key):
    """The job's environment the master sealed to this node's key ``node_key`` (users'
    values travel sealed, so the master's job cache holds no secret of theirs)."""
    if environment is None:
        return {}
    try:
        opened = json.loads(dmpi.seal.unseal(node_key, environment))
    except (OSError, ValueError) as exc:
        raise RequestError(f"the job's environment is not sealed to this node: {exc}") \
            from exc
    if not isinstance(opened, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in opened.items()):
        raise RequestError("the job's environment must be names and text values")
    return opened


def _start_launcher(job_id, container):
    try:
        container.start()
    except docker.errors.APIError as exc:
        raise NodeError(f"cannot start the launcher of job {job_id}: {exc}") from exc
