"""
What starting a job sends to its nodes: one publish of ``mpi_job.start_worker`` to every
node of the placement, carrying each node's limits and addresses, the job's files (its
sshd configuration, passwd, hostfile, program), the launcher's command line and its
sealed environment. The job controller (:mod:`dmpi.master.controller`) decides when a job
starts and records the outcome; this module only brings it up.
"""

import posixpath
import time

import dmpi.launch.files
import dmpi.launch.flavours
import dmpi.launch.probe
import dmpi.launch.ssh
from dmpi.contract import ACCOUNT_RE, DATA_MOUNT
from dmpi.jobs import record as job_record

MIB = 1 << 20
SLOT_OVERHEAD_MIB = 64  # sshd and orted beside a node's ranks
SLOT_OVERHEAD_PIDS = 32


class StartError(Exception):
    """A job could not be started; the message says why (without Salt's info dump)."""


def account_name(user, pattern):
    """The POSIX account name the user has inside job containers."""
    lowered = user.lower()
    if lowered in ("root", "nobody", "sshd") or not pattern.match(lowered):
        return "mpiuser"  # system names stay the system's inside the container
    return lowered


def job_ports(config):
    """(sshd port, OOB range, BTL range) inside every job's own network namespace."""
    ports = config["ports"]
    return int(ports["sshd"][0]), tuple(int(p) for p in ports["oob"]), \
        tuple(int(p) for p in ports["btl"])


def node_limits(config, ranks):
    """The limits of the container that runs ``ranks`` of a job's ranks on a node."""
    limits = config["limits"]
    return {
        "memory": (ranks * int(limits["memory_per_slot_mb"]) + SLOT_OVERHEAD_MIB) * MIB,
        "pids": ranks * int(limits["pids_per_slot"]) + SLOT_OVERHEAD_PIDS,
        "nano_cpus": int(ranks * float(limits["cpus_per_slot"]) * 1e9),
        "tmp_size": int(limits["tmp_size_mb"]) * MIB,
    }


def job_environment(record, job_addresses):
    """What every rank is told about its job (like Slurm's SLURM_JOB_ID and friends)."""
    return {
        "DMPI_JOB_ID": record["job_id"],
        "DMPI_JOB_DIR": record["output"]["dir_in_job"],
        "DMPI_NTASKS": str(record["np"]),
        "DMPI_NODELIST": ",".join(record["placement"]),
        "DMPI_TASKS_PER_NODE": ",".join(str(n) for n in record["placement"].values()),
        "DMPI_ADDRESSES": ",".join(job_addresses[n] for n in record["placement"]),
        "DMPI_JOB_NAME": record.get("name") or "",
    }


def bring_up(transport, record, timings, job_cas, clock=time.time):
    """Workers on every node and the launcher, in one publish through ``transport``
    (the controller's); ``job_cas`` the job CA each node reported. Returns (start
    time, timings); raises on any failure."""
    spec, placement = record["spec"], record["placement"]
    config = spec["config"]
    nodes = list(placement)
    job_addresses = record["job_addresses"]
    common = {
        "job_id": record["job_id"],
        "image": spec["image_ref"],
        "user": record["user"],
        "uid": record["uid"],
        "gid": record["uid"],
        "storage_path": config["storage"]["path"],
        "job_root": config["job_root"],
    }
    sshd_port, oob_ports, btl_ports = job_ports(config)
    host_addresses = transport.host_addresses(nodes, config["cluster_network"])
    files = job_files(config, record, job_addresses)
    environment = dict(spec["env"], **job_environment(record, job_addresses))
    launch = job_launch(record)
    flavour = dmpi.launch.flavours.module(launch.get("flavour"))
    argv = dmpi.launch.flavours.launcher_argv(
        flavour, posixpath.join(record["output"]["dir_in_job"], "stdout"),
        posixpath.join(record["output"]["dir_in_job"], "stderr"),
        record["np"], config["cluster_network"], oob_ports, btl_ports, sshd_port,
        spec["workdir"], env_names=sorted(set(environment) | set(launch["image_env"])),
        launcher=launch["launcher"],
    )
    launcher_node = nodes[0]
    allowed = {"peers": sorted(job_addresses.values()),
               "hosts": sorted(host_addresses.values()),
               "unreachable": [config["cluster_network"]]
               + list(config["job_network"].get("unreachable") or [])}
    mark = time.monotonic()
    # One publish starts the whole job: each node takes its own address and limits,
    # and the launcher's node starts mpirun once every peer's sshd is proven. That
    # node runs its ranks in the launcher container, so its worker gets the small
    # default limits.
    view = job_record.public(dict(record, state="running", started=clock(), timings=timings))
    workers = transport.call(
        nodes, "mpi_job.start_worker", timeout=30,
        network=config["job_network"]["name"], addresses=job_addresses,
        allowed_sources=allowed, sshd_port=sshd_port, files=files,
        limits={n: node_limits(config, placement[n]) for n in nodes if n != launcher_node},
        launcher={"node": launcher_node, "argv": argv,
                  "environment": transport.seal_for(launcher_node, dict(
                      environment, **dmpi.launch.flavours.launcher_environment(
                          flavour, oob_ports, sshd_port))),
                  "status": view, "limits": node_limits(config, placement[launcher_node])},
        job_cas=job_cas, valid_seconds=record["walltime"],
        **common)
    if not workers[launcher_node].get("launcher"):
        raise StartError(f"{launcher_node} did not start the launcher")
    # Running from now: node reports taken before this saw a job still coming up
    # (peers' sshd not yet answering, no launcher yet) and say nothing about it.
    started = clock()
    timings["containers_up"] = round(time.monotonic() - mark, 3)
    timings["sshd_ready"] = round(max(w["sshd_ready_seconds"] for w in workers.values()), 3)
    return started, timings


def job_launch(record):
    """How the job's image is launched (:func:`dmpi.launch.probe.launch_of`); a record
    without it (an image never probed): Open MPI 4's mpirun on the image's PATH."""
    return (record.get("spec") or {}).get("launch") or dmpi.launch.probe.launch_of(None)


def job_files(config, record, job_addresses):
    """The files every container of the job reads: sshd's configuration, the
    account's passwd and group lines, the program and the hostfile."""
    account = account_name(record["user"], ACCOUNT_RE)
    uid = record["uid"]
    sshd_port = job_ports(config)[0]
    flavour = dmpi.launch.flavours.module(job_launch(record).get("flavour"))
    return {
        "sshd_config": dmpi.launch.ssh.sshd_config_text(sshd_port, account),
        "passwd": dmpi.launch.files.passwd_text(account, uid, uid, home=DATA_MOUNT),
        "group": dmpi.launch.files.group_text(account, uid),
        "program": dmpi.launch.files.program_script_text(
            record["cmd"], end_job_on_failure=not dmpi.launch.flavours.ends_job_on_rank_exit(
                flavour)),
        "hostfile": flavour.hostfile_text(
            [(job_addresses[node], ranks) for node, ranks in record["placement"].items()]
        ),
    }
