"""What starting a job sends to its nodes (``dmpi.master.starter``): the account a user
has inside the job, each node's limits, the environment ranks see, the job's files. The
whole start, through a recording transport, is in test_controller.py."""

import pytest
from dmpi.contract import ACCOUNT_RE
from dmpi.master import starter

CONFIG = {
    "ports": {"sshd": [20000, 20000], "oob": [20100, 20299], "btl": [20300, 20999]},
    "limits": {"memory_per_slot_mb": 512, "pids_per_slot": 128, "cpus_per_slot": 1.5,
               "tmp_size_mb": 64},
}
RECORD = {"job_id": "20261204-070000-abcdef", "np": 3, "name": "pi", "uid": 100007,
          "user": "Alice", "cmd": ["python3", "/data/pi.py"],
          "placement": {"node2": 2, "node1": 1},
          "output": {"dir_in_job": "/data/mpi-jobs/20261204-070000-abcdef"}}
ADDRESSES = {"node1": "10.251.1.130", "node2": "10.251.1.131"}


@pytest.mark.parametrize("user, account", [
    ("Alice", "alice"), ("root", "mpiuser"), ("Nobody", "mpiuser"), ("sshd", "mpiuser")])
def test_a_user_is_an_account_of_their_own_unless_it_names_a_system_one(user, account):
    assert starter.account_name(user, ACCOUNT_RE) == account


def test_a_nodes_limits_grow_with_its_ranks_plus_room_for_sshd_and_orted():
    one, two = starter.node_limits(CONFIG, 1), starter.node_limits(CONFIG, 2)
    assert two["memory"] - one["memory"] == 512 * starter.MIB
    assert one["memory"] == (512 + starter.SLOT_OVERHEAD_MIB) * starter.MIB
    assert two["pids"] == 2 * 128 + starter.SLOT_OVERHEAD_PIDS
    assert two["nano_cpus"] == 3 * 10 ** 9
    assert one["tmp_size"] == two["tmp_size"] == 64 * starter.MIB


def test_ranks_are_told_their_job_in_placement_order():
    assert starter.job_environment(RECORD, ADDRESSES) == {
        "DMPI_JOB_ID": RECORD["job_id"], "DMPI_JOB_DIR": RECORD["output"]["dir_in_job"],
        "DMPI_NTASKS": "3", "DMPI_NODELIST": "node2,node1", "DMPI_TASKS_PER_NODE": "2,1",
        "DMPI_ADDRESSES": "10.251.1.131,10.251.1.130", "DMPI_JOB_NAME": "pi"}


def test_the_job_files_give_the_user_their_uid_and_each_node_its_ranks():
    files = starter.job_files(CONFIG, RECORD, ADDRESSES)
    assert set(files) == {"sshd_config", "passwd", "group", "program", "hostfile"}
    assert "alice:x:100007:100007:" in files["passwd"]
    assert "Port 20000" in files["sshd_config"]
    assert files["hostfile"].splitlines() == ["10.251.1.131 slots=2 max_slots=2",
                                              "10.251.1.130 slots=1 max_slots=1"]
