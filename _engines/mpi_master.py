"""
The Salt engine on the master that runs DockerMPI's job controller
(:mod:`dmpi.master.controller`), the one long-lived object that owns every job's life,
and feeds it from Salt's event bus.

It reads, from the master's event bus:

- ``mpi/node/<id>/report``: a node's evidence, sent when it changes (and now and then);
- ``mpi/node/<id>/alive``: a node's heartbeat, with the fingerprint of its evidence;
- ``mpi/job/<id>/queued`` and ``mpi/job/<id>/cancel``: fired by the ``mpi`` runner;
- ``mpi/nodes/changed``: an admin drained or resumed a node (``mpi.drain``,
  ``mpi.resume``) or a self-test judged nodes (``mpi.selftest``); the drains and
  verdicts themselves are read from the job store.

and once a second walks the clock (walltimes, silent nodes, the queue). A node silent
for a few seconds gets its host probed (a TCP connect to pillar
``mpi:engine:probe_port`` on its cluster address, in a thread of its own). The node's id
is the one the master authenticated, never one the event carries. Nothing here is a
Salt function: users cannot call the controller, only ask the ``mpi`` runner.

Master configuration:

.. code-block:: yaml

    engines:
      - mpi_master: {}

Optional settings: ``interval`` (seconds between passes of the clock, default 1) and
``settings_interval`` (seconds between reads of the site's settings, default 60). The
queue is planned with the site's settings as the nodes see them, read every
``settings_interval`` by a thread of this engine and at each submit.

:depends: the ``dmpi`` package (``_utils``); the ``mpi_node`` engine on the nodes
"""

import logging
import threading
import time

from dmpi.contract import JOB_TAG_RE, NODE_TAG_RE, NODES_CHANGED_TAG
from dmpi.master import controller
from dmpi.master.site import Site

log = logging.getLogger(__name__)

__virtualname__ = "mpi_master"

#: What the runner asks of the controller on the bus (its own transitions are news).
_REQUESTS = ("queued", "cancel")


def __virtual__():
    if __opts__.get("__role") != "master":
        return False, "mpi_master runs on the Salt master"
    return __virtualname__


def _dispatch(jobs, tag, data):
    """Hand one event to the job controller."""
    match = NODE_TAG_RE.match(tag)
    if match:
        node = data.get("id")  # set by the master from the minion's authenticated load
        payload = data.get("data")
        if not isinstance(node, str) or not isinstance(payload, dict):
            return
        if match.group(1) == "report":
            jobs.node_report(node, payload.get("report"))
        else:
            jobs.heartbeat(node, payload.get("digest"))
        return
    match = JOB_TAG_RE.match(tag)
    if match and match.group(2) in _REQUESTS:
        jobs.job_requested(match.group(1))
    elif tag == NODES_CHANGED_TAG:
        jobs.nodes_changed()  # what changed is read from the store, not the event


def _loaded(dunder):
    """The loader behind one of Salt's dunders. The dunder itself resolves through the
    calling thread's loader context, which the controller's worker threads do not have."""
    return dunder.value() if hasattr(dunder, "value") else dunder


def _read_settings(site, every):
    """Read the site's settings every ``every`` seconds (``Site.settings`` stores them
    for the controller's next plan); a failure is logged when it changes, the settings the
    controller has are kept."""
    last_error = None
    while True:
        time.sleep(every)
        try:
            site.settings(fresh=True)
            error = None
        except Exception as exc:  # pylint: disable=broad-except
            error = str(exc)
        if error != last_error:
            if error:
                log.warning("DockerMPI job controller: the site's settings were not read "
                            "again, the last ones stay: %s", error)
            elif last_error:
                log.info("DockerMPI job controller: the site's settings are read again")
        last_error = error


def start(interval=1.0, settings_interval=60.0):
    """Run the job controller until the master stops."""
    site = Site(_loaded(__opts__))
    jobs = controller.JobController(site.store(), site)
    threading.Thread(target=_read_settings, args=(site, float(settings_interval)),
                     name="mpi-settings", daemon=True).start()
    interval = float(interval)
    next_pass = time.monotonic()
    log.info("DockerMPI job controller started")
    with site.job_events() as bus:
        bus.subscribe("mpi/")
        while True:
            event = bus.get_event(wait=max(0.01, next_pass - time.monotonic()), tag="mpi/",
                                  match_type="startswith", full=True)
            try:
                if event:
                    _dispatch(jobs, event["tag"], event["data"])
                now = time.monotonic()
                if now >= next_pass:
                    next_pass = now + interval
                    jobs.tick()
            except Exception:  # pylint: disable=broad-except
                # One bad event or a store hiccup must not stop the controller for everyone.
                log.exception("DockerMPI job controller: error handling %s",
                              event["tag"] if event else "the clock")
