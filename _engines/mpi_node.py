"""
A DockerMPI node's evidence for the master's job controller: one long-lived process in the
salt-minion that sends what changes, when it changes, and a small heartbeat otherwise.

Every ``interval`` seconds, and at once when the Docker engine says a job container
started, died or went away, it builds :func:`mpi_job.report <_modules.mpi_job.report>`
(Docker engine health, each job's containers, launcher exit code and failed rank,
limits hit, whether this node reaches the job's other containers) and adds, per job,
``unreachable_peers``: the peers that failed the last ``failures`` probes in a row (one
failed probe is not yet a partition; a peer that failed one is probed again at once,
not an ``interval`` later, so a partition is told in about a second). Then it fires, to
the master:

- ``mpi/node/<id>/report`` with the report when its content changed, and every
  ``refresh`` seconds in any case (so a restarted master has it soon);
- ``mpi/node/<id>/alive`` otherwise, every ``heartbeat`` seconds: the fingerprint of
  the last report, nothing else (the master counts a node silent for 5 s as lost).

The master reads silence as a lost node, so nothing may stop the heartbeat: when
building the report fails for any reason, the report still goes out, saying so in
``error`` (the node's jobs are then judged by the master's other evidence).

Minion configuration (highstate writes it: ``dockermpi.node.engine``):

.. code-block:: yaml

    engines:
      - mpi_node:
          storage_path: /srv/dockermpi
          job_root: /var/lib/dockermpi/jobs
          health: 10

Every ``health`` seconds, and at once when Docker says an image was pulled, loaded,
tagged or removed, it also looks at the node's health (:func:`mpi_job.health
<_modules.mpi_job.health>`: the Docker engine answering, shared storage mounted and
writable, the image digests present) and sends it in ``health`` with the reports; the
master schedules new jobs only on healthy nodes holding the job's image.

Optional: ``interval`` (default 1), ``heartbeat`` (default 2), ``refresh`` (default 10),
``health`` (default 10),
``probe_timeout`` (seconds per TCP probe, default 0.5; probes run in parallel) and
``failures`` (consecutive failed probes before a peer is unreachable, default 2).

:depends: the ``mpi_job`` execution module, the Docker SDK
"""

import hashlib
import json
import logging
import os
import threading
import time

import dmpi_current

# A minion that outlived an upgrade imports the library below anew (dmpi_current): the
# minion loads this module in its own process too, to start the engine.
dmpi_current.ensure()

from dmpi.contract import DEFAULT_JOB_ROOT, LABEL_JOB, NODE_TAG_PREFIX

try:
    import docker

    HAS_DOCKER = True
except ImportError:
    HAS_DOCKER = False

log = logging.getLogger(__name__)

__virtualname__ = "mpi_node"

DEFAULTS = {
    "job_root": DEFAULT_JOB_ROOT,
    "interval": 1.0,
    "heartbeat": 2.0,  # well inside the master's 5 s before a silent node is lost
    "refresh": 10.0,
    "health": 10.0,
    "probe_timeout": 0.5,
    "failures": 2,
}
# Container events after which the node's evidence has changed.
_CHANGES = ("start", "die", "destroy", "oom", "kill")
# Image events after which the node's health (the images it holds) has changed.
_IMAGE_CHANGES = ("pull", "load", "import", "tag", "untag", "delete")


def __virtual__():
    if not HAS_DOCKER:
        return False, "mpi_node needs the Docker SDK for Python"
    return __virtualname__


def check_config(config):
    """The engine's settings with defaults; ValueError naming a bad one."""
    conf = {**DEFAULTS, **{k: v for k, v in (config or {}).items() if v is not None}}
    for key in ("storage_path", "job_root"):
        if not isinstance(conf.get(key), str) or not os.path.isabs(conf[key]):
            raise ValueError(f"mpi_node needs an absolute path in {key}, got {conf.get(key)!r}")
    for key in ("interval", "heartbeat", "refresh", "health", "probe_timeout"):
        try:
            conf[key] = float(conf[key])
        except (TypeError, ValueError):
            raise ValueError(f"mpi_node: {key} must be a number of seconds") from None
        if conf[key] <= 0:
            raise ValueError(f"mpi_node: {key} must be positive")
    if isinstance(conf["failures"], bool) or not isinstance(conf["failures"], int) or \
            conf["failures"] < 1:
        raise ValueError("mpi_node: failures must be a positive integer")
    return conf


def fingerprint(report):
    """A short fingerprint of a report's content (its time left out)."""
    content = {k: v for k, v in report.items() if k not in ("time", "digest")}
    return hashlib.sha256(json.dumps(content, sort_keys=True, default=str).encode()
                          ).hexdigest()[:16]


class Reporter:
    """What to send after each look at the node: builds the report, counts failed
    probes per job and peer, and chooses between a report and a heartbeat."""

    def __init__(self, conf, report_fn, clock=time.time, health_fn=None):
        self.conf = conf
        self.report_fn = report_fn
        self.clock = clock
        self.health_fn = health_fn
        self.health = None
        self.health_at = None
        self.health_due = threading.Event()  # set when Docker says the images changed
        self.failures = {}
        self.sent_digest = None
        self.sent_report = 0.0
        self.sent_any = 0.0

    def evidence(self):
        """The report with ``unreachable_peers`` per job; never raises."""
        try:
            report = self.report_fn(self.conf["storage_path"], job_root=self.conf["job_root"],
                                    probe_timeout=self.conf["probe_timeout"])
            failures = {}
            for job_id, job in report["jobs"].items():
                for address, reachable in job.get("peers", {}).items():
                    if not reachable:
                        failures[(job_id, address)] = self.failures.get((job_id, address), 0) + 1
                job["unreachable_peers"] = sorted(
                    address for address in job.get("peers", {})
                    if failures.get((job_id, address), 0) >= self.conf["failures"])
            # Only failures of this look survive: a success, or a job or peer gone, resets.
            self.failures = failures
        except Exception as exc:  # pylint: disable=broad-except
            # The heartbeat must go on whatever went wrong; the error travels with it.
            log.exception("mpi_node: the report failed")
            report = {"engine": "ok", "jobs": {}, "time": self.clock(),
                      "error": f"{type(exc).__name__}: {str(exc)[:500]}"}
        self._add_health(report)
        report["digest"] = fingerprint(report)
        return report

    def suspects(self):
        """Whether a peer failed its last probes but not yet ``failures`` of them: the
        next look should come at once to settle it."""
        return any(0 < count < self.conf["failures"] for count in self.failures.values())

    def _add_health(self, report):
        """Health is looked at every ``health`` seconds or when the images changed; the
        last look travels with every report (its content, without a time, so an
        unchanged health does not change the report's fingerprint)."""
        if self.health_fn is None:
            return
        now = self.clock()
        if self.health is None or self.health_due.is_set() or \
                now - self.health_at >= self.conf["health"]:
            self.health_due.clear()
            try:
                # Short bounds: the heartbeat waits for this look.
                self.health = self.health_fn(self.conf["storage_path"], engine_timeout=2)
            except Exception as exc:  # pylint: disable=broad-except
                log.exception("mpi_node: the health check failed")
                self.health = {"docker": "unknown", "storage": "unknown", "images": [],
                               "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            self.health_at = now
        report["health"] = self.health

    def next_event(self):
        """(tag suffix, data) to send now, or None."""
        report = self.evidence()
        now = self.clock()
        if report["digest"] != self.sent_digest or now - self.sent_report >= self.conf["refresh"]:
            self.sent_digest, self.sent_report, self.sent_any = report["digest"], now, now
            return "report", {"report": report}
        if now - self.sent_any >= self.conf["heartbeat"]:
            self.sent_any = now
            return "alive", {"digest": report["digest"], "time": now}
        return None


def _watch_containers(wake):
    """Wake the reporter whenever a job container changes (Docker's event stream)."""
    _watch(wake, {"type": "container", "label": LABEL_JOB}, _CHANGES)


def _watch_images(wake, health_due):
    """Wake the reporter, with its health due, whenever the node's images change."""
    _watch(wake, {"type": "image"}, _IMAGE_CHANGES, health_due)


def _watch(wake, filters, actions, due=None):
    """Follow Docker's events matching ``filters``; each of ``actions`` wakes the
    reporter (and sets ``due``). Reconnects when the stream ends (the engine restarted:
    everything may have changed)."""
    while True:
        try:
            client = docker.from_env()
            for event in client.events(decode=True, filters=filters):
                if event.get("Action", event.get("status")) in actions:
                    if due is not None:
                        due.set()
                    wake.set()
        except Exception as exc:  # pylint: disable=broad-except
            log.debug("mpi_node: Docker event stream ended (%s); reconnecting", exc)
        if due is not None:
            due.set()
        wake.set()  # the engine may have restarted: look now
        time.sleep(1)


def start(**config):
    """Report this node's evidence until the minion stops."""
    try:
        conf = check_config(config)
    except ValueError as exc:
        log.error("%s; the node sends no reports and will be seen as lost", exc)
        return
    reporter = Reporter(conf, __salt__["mpi_job.report"], health_fn=__salt__["mpi_job.health"])
    wake = threading.Event()
    threading.Thread(target=_watch_containers, args=(wake,), daemon=True,
                     name="mpi-node-docker-events").start()
    threading.Thread(target=_watch_images, args=(wake, reporter.health_due), daemon=True,
                     name="mpi-node-image-events").start()
    prefix = NODE_TAG_PREFIX.format(node=__opts__["id"])
    log.info("DockerMPI node reporter started")
    while True:
        wake.wait(conf["interval"])
        wake.clear()
        try:
            event = reporter.next_event()
            if event:
                __salt__["event.send"](prefix + event[0], event[1])
            if reporter.suspects():
                wake.set()  # the probes themselves pace it: a lost peer takes probe_timeout
        except Exception:  # pylint: disable=broad-except
            log.exception("mpi_node: cannot send to the master")
            time.sleep(conf["interval"])
