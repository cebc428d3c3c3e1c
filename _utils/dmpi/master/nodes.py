"""
What the job controller knows of each node (:class:`NodeBook`): its last report and
health, when it was last heard, whether its evidence is current, and, while it is
silent, what a probe of its host found (:func:`probe_host`). Whether a node is alive
and what its silence means are the rules' (``dmpi.jobs.rules``); what follows for its
jobs is the controller's (:mod:`dmpi.master.controller`). No Salt.
"""

import socket

from dmpi.jobs import rules

PROBE_TIMEOUT = 1.0  # seconds a TCP connect to a silent node's host may take


def probe_host(address, port, timeout=PROBE_TIMEOUT):
    """
    Whether a host is up, by one TCP connect to ``address:port``: ``(answered, words)``.
    An accepted connection and a refused one (the host's kernel sent a reset) both
    prove the host and the path to it are up; a timeout or an unreachable host or
    network prove nothing is answering there.
    """
    try:
        with socket.create_connection((address, int(port)), timeout=timeout):
            return True, f"its host answers on port {port} (connection accepted)"
    except ConnectionRefusedError:
        return True, f"its host answers on port {port} (connection refused)"
    except socket.timeout:
        return False, f"no answer from {address} port {port} within {timeout} s"
    except OSError as exc:
        return False, f"{address} port {port}: {exc.strerror or exc}"


class NodeBook:
    """
    Each node's evidence, as the rules read it (``seen``: ``{node: {"last_seen",
    "report", "digest", "usable", "health", "probe"}}``), starting from what the job
    store kept (``stored``: its ``nodes()``).

    Not thread-safe by itself: the controller calls it under its lock.
    """

    def __init__(self, stored, started):
        self.seen = {}
        for node, kept in stored.items():
            report = kept["report"] if isinstance(kept["report"], dict) else {}
            self.seen[node] = {"last_seen": kept["last_seen"], "report": report,
                               "digest": report.get("digest"),
                               "usable": not report.get("error"),
                               "health": report.get("health")}
        self.started = started
        # Nodes heard since the controller started. Minions need a while to reconnect
        # after a master restart; until a node is heard again (or restart_grace passed)
        # its silence says nothing.
        self.heard = set()
        self.unflushed = set()  # nodes whose last sign the store does not have yet
        self.probes = {}  # node -> when its host's last probe started
        self.host_addresses = {}  # node -> its host's address, once looked up

    def report(self, node, report, now):
        """Record a node's full report; ``(was_alive, health_changed)``. A report the
        node could not build (``error``) makes it alive without evidence; health
        travels with reports when the node has it, else the last is kept. A node not
        heard since the controller started was not alive to the scheduler."""
        seen = self.seen.get(node)
        was_alive = (seen is not None and node in self.heard
                     and node in rules.alive({node: seen}, now))
        health = report.get("health")
        changed = False
        if not isinstance(health, dict):
            health = (seen or {}).get("health")
        elif health != (seen or {}).get("health"):
            changed = True
        self.seen[node] = {"last_seen": now, "report": report, "digest": report.get("digest"),
                           "usable": not report.get("error"), "health": health}
        self.heard.add(node)
        self.unflushed.add(node)
        return was_alive, changed

    def heartbeat(self, node, evidence_digest, now):
        """Record that a node is alive and its evidence is still the report with this
        fingerprint (``digest``); True when that may change what the queue can start
        (a node new to the controller, first heard since it started, or back from
        silence)."""
        seen = self.seen.get(node)
        first = node not in self.heard
        self.heard.add(node)
        self.unflushed.add(node)
        if seen is None:
            # Heard of before its first report (the controller restarted): alive, no
            # evidence until its next full report.
            self.seen[node] = {"last_seen": now, "report": {}, "digest": None,
                               "usable": False}
            return True
        back = now - seen["last_seen"] > rules.timeouts()["node"]
        seen["last_seen"] = now
        if evidence_digest != seen["digest"]:
            seen["usable"] = False  # a change we missed: wait for the full report
        return back or first

    def alive(self, now):
        return rules.alive(self.seen, now)

    def evidence(self, names, now):
        """What the rules see of the nodes ``names``: a node not heard since the
        controller started counts as alive (without evidence) until restart_grace has
        passed."""
        judge_all = now - self.started > rules.timeouts()["restart_grace"]
        view = {}
        for node in names:
            seen = self.seen.get(node)
            if seen is None:
                continue
            if not judge_all and node not in self.heard:
                seen = dict(seen, last_seen=now, usable=False)
            view[node] = seen
        return view

    def job_ca(self, node):
        """The job CA public key the node last reported, or None."""
        return ((self.seen.get(node) or {}).get("health") or {}).get("job_ca_public")

    def probes_due(self, on_node, now):
        """The silent nodes running jobs (``on_node``: node -> its jobs) whose host is
        due a probe now (``rules.probe_due``); each is marked as probed from ``now``."""
        due = [node for node, jobs in on_node.items()
               if jobs and node in self.seen
               and rules.probe_due(self.seen[node], now, self.probes.get(node))]
        for node in due:
            self.probes[node] = now
        return due

    def probed(self, node, started, answered, detail):
        """A probe's answer goes on the node's evidence, unless the node spoke since
        the probe started."""
        seen = self.seen.get(node)
        if seen is not None and seen["last_seen"] < started:
            seen["probe"] = {"started": started, "answered": answered, "detail": detail}

    def silent(self, on_node, now):
        """What ``mpi.nodes`` shows of silent nodes running jobs and their hosts'
        probes."""
        view = {}
        for node, jobs in on_node.items():
            seen = self.seen.get(node)
            if not jobs or seen is None or now - seen["last_seen"] <= \
                    rules.timeouts()["node"]:
                continue
            probe = seen.get("probe") or {}
            view[node] = {"since": seen["last_seen"], "host_answers": probe.get("answered"),
                          "probe": probe.get("detail")}
        return view

    def take_unflushed(self):
        """``{node: (last seen, report)}`` of the nodes heard since the last call, for
        the store."""
        rows = {n: (self.seen[n]["last_seen"], self.seen[n]["report"]) for n in self.unflushed}
        self.unflushed.clear()
        return rows
