"""
What of which job is on a node, and a job's end there: every container and secret of
it removed, whatever state it is in.
"""

import logging
import os
import shutil

import docker
import docker.errors

from dmpi.contract import LABEL_JOB, LABEL_ROLE, NETNS_NAME
from dmpi.errors import DockerMPIError, NodeError
from dmpi.node import checks, containers, standby, userdirs

log = logging.getLogger(__name__)


def cleanup(node_id, job_id, job_root, status=None, status_node=None, storage_path=None,
            user=None, uid=None, gid=None, keep_standby=0):
    """
    Remove every container and secret of a job from node ``node_id`` (this one);
    idempotent. Then, with ``keep_standby``, make the network namespaces the node keeps
    ready (:func:`dmpi.node.standby.keep`, from the job's image); a failure there is
    logged, never the clean-up's.

    job_id, job_root
        As for :func:`start_worker`.
    status
        Optional final status record, written first as ``status.json`` in the job's
        output directory (needs ``storage_path``, ``user``, ``uid`` and ``gid``).
    status_node
        Only the node with this id writes ``status``: one call serves all of a job's
        nodes, and the shared file is written once.
    keep_standby
        How many network namespaces this node keeps made ahead of jobs
        (``mpi:job_network:standby``); 0 leaves them as they are.

    Returns ``{"removed": [container names], "secrets_removed": bool}``, and
    ``standby`` (what :func:`dmpi.node.standby.keep` did) when it ran.
    """
    checks.check_job_id(job_id)
    standby.check_count(keep_standby)
    if status is not None and status_node in (None, node_id):
        try:
            userdirs.write_status(job_id, storage_path, user, uid, gid, status)
        except DockerMPIError as exc:
            log.error("job %s: cannot write status.json: %s", job_id, exc)
    removed, image = [], None
    client = containers.client()
    # (another clean-up of the same job may remove a container while it is listed)
    found = client.containers.list(all=True, filters={"label": f"{LABEL_JOB}={job_id}"},
                                   ignore_removed=True)
    # The namespace's holder last: the job's containers are in its namespace.
    found += client.containers.list(
        all=True, filters={"name": NETNS_NAME.format(job_id=job_id)}, ignore_removed=True)
    for container in found:
        if container.name == f"dmpi-{job_id}-worker":
            image = (container.attrs or {}).get("Image")
        try:
            container.remove(force=True)
            removed.append(container.name)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            # Another clean-up of the same job is removing it right now (409).
            if exc.status_code != 409:
                raise NodeError(f"cannot remove {container.name}: {exc}") from exc
    secret_dir = containers.secret_dir(job_root, job_id)
    had_secrets = os.path.isdir(secret_dir)
    shutil.rmtree(secret_dir, ignore_errors=True)
    if os.path.exists(secret_dir):
        raise NodeError(f"cannot remove {secret_dir}")
    result = {"removed": sorted(removed), "secrets_removed": had_secrets}
    if keep_standby and image:
        try:
            result["standby"] = standby.keep(image, keep_standby, node_id, client)
        except DockerMPIError as exc:
            log.error("cannot keep %s standby network namespaces: %s", keep_standby, exc)
    return result


def jobs(job_root="/var/lib/dockermpi/jobs"):
    """
    List the DockerMPI job containers and secret directories on this node.

    Returns ``{job_id: {"containers": {name: status}, "secrets": bool}}``.
    """
    found = {}
    for container in containers.client().containers.list(
            all=True, filters={"label": LABEL_ROLE}, ignore_removed=True):
        job_id, _ = containers.job_of(container)
        if job_id:
            job = found.setdefault(job_id, {"containers": {}, "secrets": False})
            job["containers"][container.name] = container.status
    if os.path.isdir(job_root):
        for name in os.listdir(job_root):
            found.setdefault(name, {"containers": {}, "secrets": False})["secrets"] = True
    return found
