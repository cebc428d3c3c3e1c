"""Every benchmark keeps working: its short mode (``--short``) runs here, so a change that
breaks one fails CI. The figures are printed, never asserted on (speed is measured by
bench/, not by tests): a test checks that the run exits 0 and prints its figure lines.
``api_cpu.py``, ``engine_scale.py`` and ``sched_scale.py`` need no cluster, and come first:
they run while the cluster is still being built. The others drive it."""

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _bench(argv, timeout=900):
    done = subprocess.run([sys.executable, *argv], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, check=False, stdin=subprocess.DEVNULL)
    print(done.stdout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def test_engine_scale_short_mode_runs_and_prints_its_figures():
    output = _bench(["bench/engine_scale.py", "--short"])
    for figure in ("engine_idle_cpu_20_nodes", "engine_pass_20_nodes_ms",
                   "engine_busy_cpu_100_nodes"):
        assert figure in output, output


def test_api_cpu_short_mode_runs_and_prints_its_figures():
    output = _bench(["bench/api_cpu.py", "--short"])
    for figure in ("api_cpu_paced_50_p95_ms", "api_cpu_call_list_cpu_ms_per_call"):
        assert figure in output, output


def test_sched_scale_short_mode_runs_and_prints_its_figures():
    output = _bench(["bench/sched_scale.py", "--short"])
    assert "sched_pass_100_nodes_ms" in output, output
    assert "sched_pass_100_nodes_shared_lists_ms" in output, output


@pytest.mark.cluster
def test_api_load_short_mode_runs_and_prints_its_figures(cluster):
    output = _bench(["bench/api_load.py", "--short"])
    assert "api_load_4_users_calls_per_s" in output and "launch idle s" in output, output


@pytest.mark.cluster
def test_datapath_short_mode_runs_and_prints_its_figures(cluster):
    # Between nodes with a candidate: the candidate's job, the same job unchanged and the
    # host side; within a node as the default run does it (no candidate, no go file).
    output = _bench(["bench/datapath.py", "--short", "--candidate", "tracked"])
    assert "DockerMPI: job namespaces on macvlan, tracked" in output, output
    assert "DockerMPI: job namespaces on macvlan, chosen" in output, output
    assert "host networking (--net=host)" in output, output
    assert "dockermpi / host: latency x" in output, output
    assert "tracked / chosen: latency x" in output, output
    assert "datapath_tracked_vs_chosen_latency_ratio" in output, output
    output = _bench(["bench/datapath.py", "--short", "--pair", "within"])
    assert "rank 0 on node1 <-> rank 1 on node1" in output, output
    assert "DockerMPI: the job's container" in output, output
    assert "datapath_within_bandwidth_ratio" in output, output


@pytest.mark.cluster
def test_detection_short_mode_runs_and_prints_its_figures(cluster):
    output = _bench(["bench/detection.py", "--short"])
    assert "detection_full_failed_median_s" in output, output
    assert "detection_peer_failed_median_s" in output, output


@pytest.mark.cluster
def test_fuzz_short_mode_runs_and_prints_its_figures(cluster):
    output = _bench(["bench/fuzz.py", "--short"])
    assert "fuzz of mpi.submit: seed 1, 80 cases" in output, output
    assert "rejected clearly | ran correctly" in output, output


@pytest.mark.cluster
def test_job_cost_short_mode_runs_and_prints_its_figures(cluster):
    output = _bench(["bench/job_cost.py", "--short"])
    for figure in ("job_cost_dockermpi_core_s", "job_cost_minimal_core_s", "job_cost_ratio"):
        assert figure in output, output
    assert "part (core-s; wall in s)" in output, output
    assert "host:process (core-s)" in output and "node1:salt-minion" in output, output


@pytest.mark.cluster
def test_launch_overhead_short_mode_runs_and_prints_its_figures(cluster):
    output = _bench(["bench/launch_overhead.py", "--short"])
    for figure in ("launch_overhead_salt_run_3_nodes_s", "launch_overhead_api_3_nodes_s",
                   "launch_overhead_user_api_3_nodes_s"):
        assert figure in output, output


@pytest.mark.cluster
def test_throughput_short_mode_runs_and_prints_its_figures(cluster):
    output = _bench(["bench/throughput.py", "--short"])
    assert "throughput_np4_jobs_per_min" in output, output
    assert "max ranks at once" in output, output
