"""The network self-test's parts that need no cluster (``dmpi.master.selftest``,
``dmpi.pingpong``, ``mpi_network.pingpong*``): the TCP ping-pong over real sockets on
this machine, the job program's source, settings, flags, what ``mpi.nodes`` shows of
it and refusals. The whole runs on the cluster in tests/integration/test_maintenance.py."""

import base64
import pathlib
import threading
import time

import dmpi.settings
import pytest
import yaml
from dmpi import pingpong
from dmpi.errors import RequestError, StoreError
from dmpi.master import admin_calls, selftest
from salt.exceptions import CommandExecutionError, SaltInvocationError
from tests.extension import load_extension
from tests.unit.dmpi.master.test_admin_calls import RecordingSite
from tests.unit.dmpi.master.test_planner import HEALTHY

REPO = pathlib.Path(__file__).resolve().parents[4]
network = load_extension("_modules/mpi_network.py", "mpi_network_selftest")


def _free_port():
    with pingpong.listen("127.0.0.1", 0, 1) as probe:
        return probe.getsockname()[1]


def _echo_in_thread(port, max_bytes):
    listener = pingpong.listen("127.0.0.1", port, 10)
    done = {}
    thread = threading.Thread(target=lambda: done.update(
        echoed=pingpong.echo(listener, max_bytes, 10)), daemon=True)
    thread.start()
    return listener, thread, done


def test_the_ping_pong_times_real_round_trips_and_the_echo_counts_them():
    port = _free_port()
    listener, thread, done = _echo_in_thread(port, 1 << 20)
    with pingpong.connect("127.0.0.1", port, 5) as sock:
        found = pingpong.measure(sock, 1 << 20, 50, 4)
    thread.join(10)
    listener.close()
    assert done["echoed"] == (5 + 50) + (2 + 4)  # each after a tenth as many, at least 2
    assert found["latency_us"] > 0 and found["bandwidth_mb_per_s"] > 0


def test_the_echo_refuses_a_message_longer_than_it_accepts():
    port = _free_port()
    listener = pingpong.listen("127.0.0.1", port, 10)
    failed = {}

    def serve():
        try:
            pingpong.echo(listener, 1024, 10)
        except ValueError as exc:
            failed["error"] = str(exc)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    with pingpong.connect("127.0.0.1", port, 5) as sock:
        sock.sendall(pingpong.HEADER.pack(1 << 30))
        thread.join(10)
    listener.close()
    assert "more than 1024" in failed["error"]


def test_connect_keeps_trying_until_the_echo_listens():
    port = _free_port()
    started = {}

    def late_echo():
        time.sleep(0.3)
        listener = pingpong.listen("127.0.0.1", port, 10)
        started["at"] = time.monotonic()
        pingpong.echo(listener, 64, 10)
        listener.close()

    thread = threading.Thread(target=late_echo, daemon=True)
    thread.start()
    with pingpong.connect("127.0.0.1", port, 10) as sock:
        pingpong.measure(sock, 64, 5, 2)
    thread.join(10)
    assert "at" in started


def test_the_job_program_carries_the_ping_pong_and_its_mpi_part_as_valid_python():
    argv = selftest.job_program()
    assert argv[:2] == ["python3", "-c"]
    encoded = argv[2].split("'")[1]
    source = base64.b64decode(encoded).decode()
    compile(source, "selftest-job", "exec")
    assert "def measure(" in source and "from mpi4py import MPI" in source
    assert "import dmpi" not in source  # the image has nothing of DockerMPI


def test_pairs_are_each_node_then_every_pair_once():
    assert selftest.pairs(["node3", "node1", "node2"]) == [
        ("node1", "node1"), ("node2", "node2"), ("node3", "node3"),
        ("node1", "node2"), ("node1", "node3"), ("node2", "node3")]


def _config(**selftest_settings):
    """The defaults' ``mpi:selftest``, with ``selftest_settings`` over it."""
    defaults = yaml.safe_load((REPO / "salt" / "dockermpi" / "defaults.yaml").read_text())
    return {"selftest": dict(defaults["mpi"]["selftest"], **selftest_settings)}


def test_settings_come_from_pillar_then_the_admin_and_bad_ones_are_named():
    opts = selftest.options(_config(size=1024, far_below=0.25), lat_iters="30")
    assert (opts["size"], opts["far_below"], opts["lat_iters"], opts["bw_iters"]) == \
        (1024, 0.25, 30, 20)
    for given, words in (({"size": 0}, "selftest size must be from 1"),
                         ({"size": "4M"}, "selftest size must be a whole number"),
                         ({"bw_iters": 10 ** 9}, "selftest bw_iters must be from 1"),
                         ({"lat_iters": True}, "lat_iters must be a whole number")):
        with pytest.raises(RequestError, match=words):
            selftest.options(_config(), **given)


def test_the_pillars_selftest_settings_are_checked_with_the_rest():
    config = yaml.safe_load((REPO / "salt" / "dockermpi" / "defaults.yaml").read_text())["mpi"]
    config["selftest"].update(user="Not A User", image="bad/name", size=0, far_below=-1,
                              min_ratio="high", exclude_failed_nodes="false", typo=1)
    found = [p for p in dmpi.settings.problems(config) if "selftest" in p]
    assert found == [
        "mpi:selftest:typo is not a DockerMPI setting (the keys of mpi:selftest are: user, "
        "image, size, lat_iters, bw_iters, min_bandwidth_mb_per_s, far_below, min_ratio, "
        "exclude_failed_nodes)",
        "mpi:selftest:user 'Not A User' is not a DockerMPI user name",
        "mpi:selftest:image 'bad/name' is not an image short name (a key of mpi:images)",
        "mpi:selftest:size must be a whole number from 1 to 67108864, got 0",
        "mpi:selftest:far_below must be a number of at least 0, got -1",
        "mpi:selftest:min_ratio must be a number of at least 0, got 'high'",
        "mpi:selftest:exclude_failed_nodes must be true or false, got 'false'"]


def test_the_job_output_is_found_past_anything_the_ranks_printed():
    text = "Warning: something\nSELFTEST {\"mpi\": {}, \"tcp\": {}, \"hosts\": [\"a\", \"b\"]}\n"
    assert selftest.parse_output(text)["hosts"] == ["a", "b"]
    with pytest.raises(ValueError, match="no result"):
        selftest.parse_output("Traceback ...\n")


def _pair(a, b, job_bw, host_bw=2000.0):
    job = {"mpi": {"latency_us": 20, "bandwidth_mb_per_s": job_bw},
           "tcp": {"latency_us": 25, "bandwidth_mb_per_s": job_bw}}
    return {"pair": [a, b], "job": job, "host": {"latency_us": 20, "bandwidth_mb_per_s": host_bw},
            "ratio": job_bw / host_bw}


def test_a_pair_far_below_the_median_of_its_kind_is_flagged_and_the_others_pass():
    results = [_pair("node1", "node1", 5000), _pair("node2", "node2", 5200),
               _pair("node1", "node2", 800), _pair("node1", "node3", 820),
               _pair("node2", "node3", 300)]
    selftest.flag(results, selftest.options(_config()))
    flagged = {"-".join(r["pair"]): r["problems"] for r in results if r["problems"]}
    assert list(flagged) == ["node2-node3"]
    assert "below 0.5 times the median of the pairs between nodes (800)" in \
        flagged["node2-node3"][0]


def test_the_pillars_floor_and_ratio_flag_pairs_too():
    results = [_pair("node1", "node2", 800, host_bw=2000)]
    selftest.flag(results, selftest.options(_config(min_bandwidth_mb_per_s=1000,
                                                    min_ratio=0.9)))
    assert [p.split(" is ")[0] for p in results[0]["problems"]] == \
        ["job TCP bandwidth 800 MB/s", "job TCP bandwidth"]
    assert "min_ratio (0.9)" in results[0]["problems"][1]


def _report():
    pairs = [dict(_pair("node1", "node1", 5000), passed=True, problems=[]),
             dict(_pair("node1", "node2", 300), passed=False,
                  problems=["job TCP bandwidth 300 MB/s is below ..."]),
             {"pair": ["node2", "node3"], "job": None, "host": None, "passed": False,
              "problems": ["job 20261205-1 failed: rank 1 exited 1"]}]
    return {"started": 1e9, "nodes": ["node1", "node2", "node3"], "passed": False,
            "pairs": pairs}


def test_the_matrix_shows_every_pair_with_its_figures_or_a_dash_and_its_result():
    lines = selftest.matrix(_report()).splitlines()
    assert lines[0].split()[:3] == ["pair", "job", "MPI"]
    assert lines[1].startswith("node1 ") and lines[1].endswith("ok")
    assert "node1 <-> node2" in lines[2] and "FLAGGED: job TCP bandwidth 300" in lines[2]
    assert lines[3].count(" - ") >= 3 and "rank 1 exited 1" in lines[3]


def _judged(*flagged, nodes=("node1", "node2", "node3"), started=1e9):
    """A report of every pair of ``nodes``, the ``flagged`` ones ("node1-node2") flagged."""
    pairs = []
    for a, b in selftest.pairs(nodes):
        bad = f"{a}-{b}" in flagged
        pairs.append(dict(_pair(a, b, 300 if bad else 900), passed=not bad,
                          problems=["job TCP bandwidth 300 MB/s is below ..."] if bad else []))
    return {"started": started, "nodes": list(nodes), "pairs": pairs}


def _faulty(report):
    return {n: v["at_fault"] for n, v in selftest.verdicts(report).items() if v["at_fault"]}


def test_a_node_is_at_fault_when_its_own_pair_or_all_its_pairs_with_others_are_flagged():
    assert _faulty(_judged()) == {}
    # A bad node flags every pair it is in; the others each keep a good pair.
    bad_node = _faulty(_judged("node3-node3", "node1-node3", "node2-node3"))
    assert list(bad_node) == ["node3"]
    assert bad_node["node3"].startswith("its own pair was flagged: job TCP bandwidth 300")
    assert list(_faulty(_judged("node1-node3", "node2-node3"))) == ["node3"]
    assert _faulty(_judged("node1-node3", "node2-node3"))["node3"].startswith(
        "every pair with another node was flagged (node1, node2): job TCP")
    # One bad link: both ends are flagged, neither is at fault.
    one_link = selftest.verdicts(_judged("node1-node2"))
    assert [one_link[n]["passed"] for n in ("node1", "node2", "node3")] == [False, False, True]
    assert not any(v["at_fault"] for v in one_link.values())
    # Two nodes tested: nothing tells which of the two it is.
    assert list(_faulty(_judged("node1-node2", nodes=("node1", "node2")))) == ["node1", "node2"]


def test_a_pair_whose_job_never_left_the_queue_puts_no_node_at_fault():
    report = _judged(nodes=("node1", "node2"))
    report["pairs"][2].update(job=None, passed=False, problems=[
        f"{selftest.NOT_MEASURED}: job 20261205-000000-abcdef was still queued after 180 s"])
    verdicts = selftest.verdicts(report)
    assert verdicts["node1"]["passed"] is False and verdicts["node1"]["at_fault"] is None


def test_each_node_keeps_the_verdict_of_the_last_self_test_that_tested_it(tmp_path):
    store = RecordingSite(tmp_path).store()
    selftest.record(store, _judged("node1-node3", "node2-node3", started=1e9))
    selftest.record(store, _judged(nodes=("node1", "node2"), started=2e9))
    kept = selftest.kept_verdicts(store)
    assert {n: (v["at"], v["at_fault"] is not None) for n, v in kept.items()} == {
        "node1": (2e9, False), "node2": (2e9, False), "node3": (1e9, True)}
    assert selftest.last(store)["started"] == 2e9


def test_nodes_shows_each_nodes_verdict_and_withholds_a_faulty_one_when_told(tmp_path):
    site = RecordingSite(tmp_path)
    store = site.store()
    config = {"slots_per_node": 2, "images": {}, "selftest": {"exclude_failed_nodes": False}}
    store.set_meta("site", {"config": config})
    store.nodes_seen({n: (time.time(), {"engine": "ok", "jobs": {}, "health": HEALTHY["health"]})
                      for n in ("node1", "node2", "node3")})
    assert admin_calls.nodes(site)["node1"]["selftest"] is None
    report = _judged("node1-node3", "node2-node3")
    report["pairs"][-1].update(job=None, problems=["job 20261205-1 failed: rank 1 exited 1"])
    selftest.record(store, report)
    shown = admin_calls.nodes(site)
    assert shown["node1"]["selftest"] == {
        "at": 1e9, "passed": False, "at_fault": None,
        "problems": ["node1-node3: job TCP bandwidth 300 MB/s is below ..."]}
    assert shown["node3"]["selftest"]["problems"] == [
        "node1-node3: job TCP bandwidth 300 MB/s is below ...",
        "node2-node3: job 20261205-1 failed: rank 1 exited 1"]
    assert shown["node3"]["selftest"]["at_fault"].startswith("every pair with another node")
    assert shown["node3"]["eligible"] is True  # exclusion is off
    config["selftest"]["exclude_failed_nodes"] = True
    store.set_meta("site", {"config": config})
    shown = admin_calls.nodes(site)
    assert [shown[n]["eligible"] for n in ("node1", "node2", "node3")] == [True, True, False]
    assert shown["node3"]["not_eligible_because"].startswith(
        "failed the network self-test (every pair with another node was flagged (node1, "
        "node2)")


def test_the_runner_refuses_nodes_that_are_not_mpi_nodes(tmp_path):
    site = RecordingSite(tmp_path)
    site.store().set_meta("site", {"config": {}})
    site.node_settings = lambda minion, fresh=False: dict(
        _config(), ports={"btl": [20300, 20999]}, cluster_network="10.251.1.0/24")
    with pytest.raises(RequestError, match=r"not MPI nodes: \['node9'\]"):
        selftest.run(site, None, nodes="node1,node9")
    with pytest.raises(RequestError, match="selftest size must be from 1"):
        selftest.run(site, None, size=0)


def test_the_self_tests_user_is_its_own_and_no_hub_user_can_take_or_lend_it(tmp_path):
    users = {"users": {"uid_min": 70000, "uid_max": 70100}}
    store = RecordingSite(tmp_path).store()
    # A hub user who got the name first keeps it: the self-test refuses to run as them.
    store.user_uid("mallory-selftest", 70000, 70100, identity="mallory-selftest")
    site = RecordingSite(tmp_path)
    with pytest.raises(RequestError, match="the self-test's user 'mallory-selftest' "
                                           r"\(mpi:selftest:user\) cannot be used"):
        selftest.own_user(site, users, "mallory-selftest")
    # Once the self-test holds its name, a hub user of that name is refused it.
    selftest.own_user(site, users, "dockermpi-selftest")
    selftest.own_user(site, users, "dockermpi-selftest")  # and again: still its own
    with pytest.raises(StoreError):
        store.user_uid("dockermpi-selftest", 70000, 70100, identity="dockermpi-selftest")


def test_the_minions_ping_pong_refuses_bad_arguments_and_reports_a_refused_connection():
    with pytest.raises(SaltInvocationError, match="address must be an IPv4 address"):
        network.pingpong("node2; rm -rf /", 20999, 1024, 10, 2)
    with pytest.raises(SaltInvocationError, match="port must be a whole number"):
        network.pingpong_echo("127.0.0.1", 70000, 1024)
    with pytest.raises(SaltInvocationError, match="size must be a whole number"):
        network.pingpong("127.0.0.1", 20999, 1 << 40, 10, 2)
    with pytest.raises(CommandExecutionError, match="ping-pong to 127.0.0.1"):
        network.pingpong("127.0.0.1", _free_port(), 1024, 10, 2, connect_timeout=1)


def test_the_minions_echo_and_ping_pong_meet():
    port = _free_port()
    answered = {}
    thread = threading.Thread(target=lambda: answered.update(
        echoed=network.pingpong_echo("127.0.0.1", port, 4096, timeout=10)), daemon=True)
    thread.start()
    found = network.pingpong("127.0.0.1", port, 4096, 20, 3, connect_timeout=10)
    thread.join(10)
    assert set(found) == {"latency_us", "bandwidth_mb_per_s"}
    assert answered["echoed"] == (2 + 20) + (2 + 3)


@pytest.mark.parametrize("passed", [True, False])
def test_salt_run_exits_1_exactly_when_a_pair_is_flagged(tmp_path, monkeypatch, passed):
    # salt-run reads its exit code from the answer's retcode, not from __context__
    runner = load_extension("_runners/mpi.py", "mpi_runner_selftest")
    monkeypatch.setattr(runner, "_SITE", [RecordingSite(tmp_path)])
    monkeypatch.setattr(runner, "__context__", {}, raising=False)
    monkeypatch.setattr(runner, "__user__", "root", raising=False)
    monkeypatch.setattr(selftest, "run", lambda site, caller, **kw: dict(_report(), passed=passed))
    answer = runner.selftest()
    assert answer["retcode"] == runner.__context__["retcode"] == (0 if passed else 1)
    assert answer["passed"] is passed and answer["matrix"][0].startswith("pair")
