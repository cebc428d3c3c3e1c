"""What the job controller knows of each node (``dmpi.master.nodes``): reports,
heartbeats, the grace after a restart, host probes. What follows for jobs is
test_controller.py's; the host probe is tried on real sockets here."""

import socket

from dmpi.jobs import rules
from dmpi.master.nodes import NodeBook, probe_host

REPORT = {"digest": "d1", "jobs": {}, "health": {"docker": "ok"}}


def test_a_stored_node_is_known_but_not_heard_until_it_speaks():
    book = NodeBook({"node1": {"last_seen": 10.0, "report": REPORT}}, started=100.0)
    assert book.seen["node1"]["digest"] == "d1" and book.seen["node1"]["usable"]
    # Before restart_grace has passed, an unheard node counts as alive without evidence.
    view = book.evidence(["node1", "node9"], now=101.0)
    assert list(view) == ["node1"]
    assert view["node1"]["last_seen"] == 101.0 and view["node1"]["usable"] is False
    later = 100.0 + rules.timeouts()["restart_grace"] + 1
    assert book.evidence(["node1"], now=later)["node1"]["last_seen"] == 10.0


def test_a_report_tells_whether_the_node_was_alive_and_its_health_changed():
    book = NodeBook({}, started=0.0)
    assert book.report("node1", REPORT, now=1.0) == (False, True)
    assert book.report("node1", REPORT, now=2.0) == (True, False)
    # A report without health keeps the last health.
    assert book.report("node1", {"digest": "d2", "jobs": {}}, now=3.0) == (True, False)
    assert book.seen["node1"]["health"] == {"docker": "ok"}
    failed = book.report("node1", {"error": "cannot list containers"}, now=4.0)
    assert failed == (True, False) and book.seen["node1"]["usable"] is False


def test_a_heartbeat_with_another_digest_makes_the_evidence_unusable_until_a_report():
    book = NodeBook({}, started=0.0)
    assert book.heartbeat("node1", "d1", now=1.0) is True  # new: the queue may change
    book.report("node1", REPORT, now=2.0)
    assert book.heartbeat("node1", "d1", now=3.0) is False
    assert book.seen["node1"]["usable"] is True
    assert book.heartbeat("node1", "d9", now=4.0) is False
    assert book.seen["node1"]["usable"] is False
    back = 4.0 + rules.timeouts()["node"] + 1
    assert book.heartbeat("node1", "d9", now=back) is True  # back from silence


def test_the_store_gets_each_node_heard_once_per_flush():
    book = NodeBook({}, started=0.0)
    book.report("node1", REPORT, now=1.0)
    book.heartbeat("node1", "d1", now=2.0)
    assert book.take_unflushed() == {"node1": (2.0, REPORT)}
    assert book.take_unflushed() == {}


def test_a_probe_answer_is_kept_only_while_the_node_stays_silent():
    book = NodeBook({}, started=0.0)
    book.report("node1", REPORT, now=1.0)
    silent_at = 1.0 + rules.timeouts()["node"] + 1
    assert book.probes_due({"node1": {"job"}, "node2": {"job"}}, silent_at) == ["node1"]
    assert book.probes_due({"node1": {"job"}}, silent_at) == []  # already under way
    book.probed("node1", silent_at, False, "no answer")
    assert book.silent({"node1": {"job"}}, silent_at)["node1"]["host_answers"] is False
    book.report("node1", REPORT, now=silent_at + 1)
    book.probed("node1", silent_at, False, "a late answer")
    assert book.seen["node1"].get("probe") is None
    assert book.silent({"node1": {"job"}}, silent_at + 1) == {}


def test_a_host_probe_tells_an_answering_host_from_a_silent_one():
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen(1)
        port = listening.getsockname()[1]
        assert probe_host("127.0.0.1", port)[0] is True
    # Nothing listens there now: the kernel refuses, which proves the host is up.
    answered, words = probe_host("127.0.0.1", port)
    assert answered is True and "refused" in words
