"""The hub in a real browser (headless Chromium): a page user A's server serves cannot act
as user B in B's browser, because every user's server has an origin of its own
(mpi:hub:subdomain_host), apart from the hub's and the user API's. A ``%%mpi`` cell
run in JupyterLab shows each rank's output in a section of its own, and its Cancel button
ends the job. The jobs panel follows the user's jobs live, cancels one, notifies the user
(once she agreed) of a job that ends while her tab is hidden, and shows nothing of
another user's.

A's server is A's own process, so A can make it answer with any page: the tests take
that as given and serve A's page the short way, from a process of A's uid in A's
notebook container, routed by the hub's proxy under A's origin. The same page served on
the hub's origin (what every user's server had before) shows the attack works there.
"""

import json
import time
import urllib.parse

import pytest
import yaml

from tests.browser import ARTIFACTS, ELEMENT, Browser, BrowserError
from tests.cluster import tls
from tests.cluster.testcluster import (API_PUBLIC_URL, HUB_ADDR, HUB_DOMAIN, HUB_PUBLIC_URL,
                                       JOB_STORE, REPO)

pytestmark = pytest.mark.cluster

ATTACKER = "hub-mallory"
VICTIM = "hub-victoria"
PAGE_PORT = 8899
PAGE_PATH = "/dmpi-attack/page.html"
#: What A's page tries with B's cookies; window.report says how each attempt went.
ATTACK_PAGE = """<!doctype html>
<html><body><p>nothing to see</p><script>
const HUB = %(hub)s, API = %(api)s, VICTIM = %(victim)s;
window.report = {origin: location.origin, cookies: document.cookie};
async function attempt(name, step) {
  try { report[name] = {ok: true, value: await step()}; }
  catch (error) { report[name] = {ok: false, error: String(error)}; }
}
function framed(url) {
  return new Promise((resolve, reject) => {
    const frame = document.createElement("iframe");
    frame.onload = () => {
      try { resolve(frame.contentDocument.documentElement.outerHTML.slice(0, 200)); }
      catch (error) { reject(error); }
    };
    frame.src = url;
    document.body.appendChild(frame);
  });
}
(async () => {
  await attempt("read_xsrf", async () => {
    const answer = await fetch(HUB + "/hub/token", {credentials: "include"});
    const found = (await answer.text()).match(/xsrf_token: "([^"]+)"/);
    if (!found) throw new Error("no XSRF token in the hub's page (" + answer.status + ")");
    return found[1];
  });
  await attempt("frame_hub", () => framed(HUB + "/hub/token"));
  const xsrf = report.read_xsrf.ok ? report.read_xsrf.value : "";
  await attempt("create_token", async () => {
    const answer = await fetch(HUB + "/hub/api/users/" + encodeURIComponent(VICTIM) + "/tokens",
      {method: "POST", credentials: "include",
       headers: {"X-XSRFToken": xsrf, "Content-Type": "application/json"},
       body: JSON.stringify({note: "taken by a page of another user"})});
    if (answer.status !== 201) throw new Error("the hub answered " + answer.status);
    return (await answer.json()).token;
  });
  // A request no browser preflights: it is sent with B's cookies, its answer unread.
  await attempt("create_token_blind", async () => {
    await fetch(HUB + "/hub/api/users/" + encodeURIComponent(VICTIM) + "/tokens",
      {method: "POST", credentials: "include", mode: "no-cors",
       headers: {"Content-Type": "text/plain"},
       body: JSON.stringify({note: "taken by a page of another user"})});
    return "sent";
  });
  await attempt("call_api", async () => {
    const answer = await fetch(API + "/api/v1/jobs", {credentials: "include"});
    if (answer.status !== 200) throw new Error("the API answered " + answer.status);
    return await answer.text();
  });
  await attempt("submit_job_blind", async () => {
    await fetch(API + "/api/v1/jobs", {method: "POST", credentials: "include",
      mode: "no-cors", headers: {"Content-Type": "text/plain"},
      body: JSON.stringify({np: 1, cmd: ["rm", "-rf", "/data"]})});
    return "sent";
  });
  report.done = true;
})();
</script></body></html>
"""


def _password():
    pillar = yaml.safe_load((REPO / "pillar" / "testcluster_hub.sls").read_text())
    return pillar["mpi"]["hub"]["dummy"]["password"]


def _host(url):
    return urllib.parse.urlsplit(url).hostname


def _tokens(cluster, name):
    _, found = cluster.hub_api("GET", f"/users/{urllib.parse.quote(name, safe='')}/tokens")
    return {token["id"] for token in found["api_tokens"]}


@pytest.fixture(scope="module")
def attack(cluster):
    """A's notebook serving the attack page at PAGE_PATH from a process of A's, and a
    function that adds a proxy route to it under a host; routes and users go after."""
    cluster.wait_for_hub()
    cluster.hub_user(VICTIM)
    cluster.start_notebook(ATTACKER)
    page = ATTACK_PAGE % {"hub": json.dumps(HUB_PUBLIC_URL), "api": json.dumps(API_PUBLIC_URL),
                          "victim": json.dumps(VICTIM)}
    code, out = cluster.notebook_exec(ATTACKER, [
        "python3", "-c", "import os, sys; os.makedirs(os.path.dirname(sys.argv[1]), "
        "exist_ok=True); open(sys.argv[1], 'w').write(sys.argv[2])",
        "/data/www" + PAGE_PATH, page])
    assert code == 0, out
    container = cluster.notebook_container(ATTACKER)
    cluster.exec("hub", ["docker", "exec", "-d", container, "python3", "-m", "http.server",
                         str(PAGE_PORT), "--directory", "/data/www"])
    target = f"http://{cluster.notebook_address(ATTACKER)}:{PAGE_PORT}"
    routes = []

    def serve_under(host):
        spec = f"/{host}{PAGE_PATH.rsplit('/', 1)[0]}"
        cluster.proxy_route("POST", spec, target)
        routes.append(spec)
        return f"https://{host}:{urllib.parse.urlsplit(HUB_PUBLIC_URL).port}{PAGE_PATH}"

    try:
        yield serve_under
    finally:
        for spec in routes:
            cluster.proxy_route("DELETE", spec)
        cluster.delete_hub_user(ATTACKER)
        cluster.delete_hub_user(VICTIM)


def _browser(cluster):
    """A fresh browser that finds the hub's names and trusts its certificate (its key)
    as it would a site's."""
    rules = [f"MAP {HUB_DOMAIN} {HUB_ADDR}", f"MAP *.{HUB_DOMAIN} {HUB_ADDR}"]
    return Browser(host_rules=rules, trusted_keys=[tls.spki_sha256(cluster.tls["hub_cert"])])


def _log_in(browser, name):
    browser.get(f"{HUB_PUBLIC_URL}/hub/login?next=" + urllib.parse.quote("/hub/token"))
    browser.type(browser.find("#username_input"), name)
    browser.type(browser.find("#password_input"), _password())
    browser.click(browser.find("#login_submit"))
    browser.wait_for("location.pathname === '/hub/token'")


def _victim_opens(cluster, url):
    """B logs in to the hub in a fresh browser and opens ``url``: the page's report."""
    with _browser(cluster) as browser:
        _log_in(browser, VICTIM)
        browser.get(url)
        return browser.wait_for("window.report && window.report.done && window.report")


def test_a_page_of_another_users_server_cannot_act_as_the_visitor(cluster, attack):
    before = _tokens(cluster, VICTIM)
    report = _victim_opens(cluster, attack(f"{ATTACKER}.{HUB_DOMAIN}"))
    assert report["origin"] == f"https://{ATTACKER}.{HUB_DOMAIN}:8000"
    assert report["cookies"] == ""  # none of the hub's cookies belong to A's origin
    for step in ("read_xsrf", "frame_hub", "create_token", "call_api"):
        assert report[step]["ok"] is False, (step, report)
    # What was sent blind did nothing: B has no new token and no job.
    assert _tokens(cluster, VICTIM) == before
    code, jobs = cluster.run_json("mpi.list", user=VICTIM)
    assert code == 0 and not jobs, jobs


def test_the_same_page_on_the_hubs_own_origin_takes_a_token(cluster, attack):
    """Why per-user origins: served on the hub's origin, as every user's server was
    without subdomain_host, the page reads the XSRF token and makes a token for B."""
    before = _tokens(cluster, VICTIM)
    report = _victim_opens(cluster, attack(HUB_DOMAIN))
    assert report["origin"] == HUB_PUBLIC_URL
    assert report["read_xsrf"]["ok"] and report["create_token"]["ok"], report
    taken = _tokens(cluster, VICTIM) - before
    assert len(taken) == 1
    for token in taken:
        cluster.hub_api("DELETE", f"/users/{VICTIM}/tokens/{token}")
    # The API answers on its own origin only: the hub's page reads nothing of it.
    assert report["call_api"]["ok"] is False, report


NOTEBOOK_USER = "hub-nora"
MAGIC_CELL = """%%mpi -n 4 -N 2
from mpi4py import MPI
print("hello from", MPI.COMM_WORLD.rank)
"""
LONG_CELL = """%%mpi -n 2 --name long-cell
import time
print("started", flush=True)
time.sleep(600)
"""
#: The cell's displays as JupyterLab shows them: the state line on top, then each rank's
#: section (its title, its colour, whether it is open, its text).
_SHOWN = """
const output = document.querySelectorAll(".jp-Notebook .jp-Cell")[0].querySelector(".jp-OutputArea");
if (!output) return null;
return {
  text: output.innerText,
  button: !!output.querySelector("button.dockermpi-cancel"),
  sections: [...output.querySelectorAll("details")].map(d => ({
    title: d.querySelector("summary").innerText,
    colour: getComputedStyle(d.querySelector("summary")).color,
    open: d.open,
    visible: d.querySelector("summary").nextElementSibling.checkVisibility(),
    text: d.innerText})),
};
"""


#: The second cell's output text, and whether its Cancel button is there.
_LONG_SHOWN = """
const output = document.querySelectorAll(".jp-Notebook .jp-Cell")[1].querySelector(".jp-OutputArea");
return output && {text: output.innerText,
                  button: !!output.querySelector("button.dockermpi-cancel:not([disabled])"),
                  bar: !!output.querySelector("progress.dockermpi-walltime")};
"""


@pytest.fixture(scope="module")
def notebook_user(cluster):
    """NOTEBOOK_USER's notebook server, started once for the module's JupyterLab tests."""
    cluster.wait_for_hub()
    cluster.hub_user(NOTEBOOK_USER)
    try:
        cluster.start_notebook(NOTEBOOK_USER)
        yield NOTEBOOK_USER
    finally:
        cluster.stop_notebook(NOTEBOOK_USER)
        cluster.delete_hub_user(NOTEBOOK_USER)


def _lab(user):
    """The URL of ``user``'s JupyterLab, on the origin of their own server."""
    return (f"https://{user}.{HUB_DOMAIN}:{urllib.parse.urlsplit(HUB_PUBLIC_URL).port}"
            f"/user/{user}/lab")


def _run_cell(browser, index):
    """Shift+Enter in the editor of the notebook's cell ``index``."""
    find = (f"document.querySelectorAll('.jp-Notebook .jp-Cell')[{index}]"
            "?.querySelector('.cm-content')")
    # JupyterLab draws a cell's editor some time after the kernel is ready.
    browser.wait_for(f"(() => {{ const e = {find}; return !!e && e.checkVisibility() && "
                     "e.getBoundingClientRect().height > 0; })()")
    editor = browser.run(f"return {find};")[ELEMENT]
    browser.click(editor)
    browser.type(editor, "\ue008\ue007\ue000")  # WebDriver's Shift, Enter, release


def test_a_magic_cell_shows_each_ranks_output_apart_and_its_cancel_button_ends_the_job(
        cluster, notebook_user):
    notebook = {"nbformat": 4, "nbformat_minor": 5,
                "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                            "language": "python"}},
                "cells": [{"cell_type": "code", "id": name, "metadata": {},
                           "execution_count": None, "outputs": [], "source": source}
                          for name, source in (("magic", MAGIC_CELL), ("long", LONG_CELL))]}
    code, out = cluster.notebook_exec(notebook_user, [
        "python3", "-c", "import sys; open('/data/magic.ipynb', 'w').write(sys.argv[1])",
        json.dumps(notebook)])
    assert code == 0, out
    with _browser(cluster) as browser:
        _log_in(browser, notebook_user)
        browser.get(f"{_lab(notebook_user)}/tree/magic.ipynb")
        # The notebook is drawn (no spinner over it) and its kernel is idle (the
        # status bar says so): then Shift+Enter in a cell's editor runs the cell.
        browser.wait_for("document.querySelector('.jp-NotebookPanel .jp-Notebook') && "
                         "!document.querySelector('.jp-NotebookPanel .jp-Spinner') && "
                         "/[|] Idle/.test(document.body.innerText)", timeout=180)
        _run_cell(browser, 0)
        shown = browser.wait_for(
            f"(() => {{ const s = (() => {{ {_SHOWN} }})(); "
            "return s && /succeeded, exit code 0/.test(s.text) && s.sections.length === 4 && s; })()",
            timeout=240)
        assert not shown["button"], shown  # the job is over: nothing left to cancel
        for rank, section in enumerate(shown["sections"]):
            assert section["title"].startswith(f"rank {rank}"), shown
            assert f"hello from {rank}" in section["text"], shown
            assert section["open"] and section["visible"], shown
        # One colour per rank, and a section folds away when its title is clicked.
        assert len({section["colour"] for section in shown["sections"]}) == 4, shown
        browser.run("document.querySelectorAll('.jp-Cell .jp-OutputArea details "
                    "summary')[1].click();")
        shown = browser.wait_for(f"(() => {{ {_SHOWN} }})()")
        assert [s["open"] for s in shown["sections"]] == [True, False, True, True], shown
        assert not shown["sections"][1]["visible"], shown
        browser.screenshot(ARTIFACTS / "magic-cell-in-jupyterlab.png")
        # The long cell's job runs, its time going on against the walltime, until its
        # Cancel button interrupts the kernel.
        _run_cell(browser, 1)
        browser.wait_for(f"(() => {{ const s = (() => {{ {_LONG_SHOWN} }})(); "
                         "return s && /started/.test(s.text) && s.button && s.bar && "
                         "/ running on node.*, \\d+:\\d\\d of /.test(s.text); })()",
                         timeout=180)
        browser.screenshot(ARTIFACTS / "magic-cell-running-in-jupyterlab.png")
        folded = [s["open"] for s in browser.run(_SHOWN)["sections"]]
        assert folded == [True, False, True, True], folded  # the first cell kept its fold
        browser.run("document.querySelectorAll('.jp-Notebook .jp-Cell')[1]"
                    ".querySelector('button.dockermpi-cancel').click();")
        # The client says "interrupted: cancelling job ..." at once; the view's last word,
        # once the job is cancelled, names the state and drops the button.
        shown = browser.wait_for(f"(() => {{ const s = (() => {{ {_LONG_SHOWN} }})(); "
                                 "return s && /cancelled/.test(s.text) && !s.button && s; })()",
                                 timeout=60)
        assert "interrupted" in shown["text"], shown
        browser.screenshot(ARTIFACTS / "magic-cell-cancelled-in-jupyterlab.png")
    _, jobs = cluster.run_json("mpi.list", user=notebook_user)
    # The newest: the user's earlier runs of this test may be on record too.
    job = max((j for j in jobs if j["name"] == "long-cell"), key=lambda j: j["submitted"])
    assert job["state"] == "cancelled", job
    assert cluster.no_leftovers() == {}


OTHER_USER = "hub-oscar"
#: The jobs panel's rows as the page shows them, and whether its event stream is open;
#: window.seenStates keeps every state each row was drawn in (a MutationObserver), so a
#: state the panel showed only briefly still counts.
_PANEL = """
const panel = document.getElementById("dockermpi-jobs-panel");
if (!panel) return null;
if (!window.seenStates) {
  window.seenStates = {};
  const note = () => panel.querySelectorAll(".dmpi-job").forEach(row => {
    const seen = window.seenStates[row.dataset.jobId] ||= [];
    if (!seen.includes(row.dataset.state)) seen.push(row.dataset.state);
  });
  new MutationObserver(note).observe(panel, {subtree: true, childList: true,
                                              attributes: true, attributeFilter: ["data-state"]});
  note();
}
const status = panel.querySelector(".dmpi-status");
return {
  visible: panel.checkVisibility(),
  stream: status && status.dataset.stream,
  status: status && status.innerText,
  rows: [...panel.querySelectorAll(".dmpi-job")].map(row => ({
    id: row.dataset.jobId, state: row.dataset.state, user: row.dataset.user,
    text: row.innerText})),
  seen: window.seenStates,
};
"""


#: Records the panel's browser notifications (window.dmpiNotes) and lets the test hide the
#: tab (window.dmpiHide): headless Chromium never hides a tab it shows. Headless
#: Chromium also dismisses a permission prompt unanswered, so the prompt the panel's
#: button opens waits for the test to answer it (WebDriver's Set Permission), as the
#: user would click Allow; window.dmpiAsked counts the prompts.
_NOTIFICATION_SPY = """
const Real = window.Notification;
window.dmpiNotes = [];
window.dmpiAsked = 0;
class Recorded extends Real {
  constructor(title, options) {
    super(title, options);
    window.dmpiNotes.push({title: title, body: options.body, tag: options.tag});
  }
  static get permission() { return Real.permission; }
  static requestPermission() {
    window.dmpiAsked += 1;
    return new Promise(resolve => {
      const answered = setInterval(() => {
        if (Real.permission !== 'default') { clearInterval(answered); resolve(Real.permission); }
      }, 100);
    });
  }
}
window.Notification = Recorded;
let hidden = false;
Object.defineProperty(document, 'hidden', {configurable: true, get: () => hidden});
window.dmpiHide = value => { hidden = value; };
"""


def _panel(browser, condition, timeout=120):
    """The panel as _PANEL reads it, once ``condition`` (JS, of ``p``) holds."""
    try:
        return browser.wait_for(f"(() => {{ const p = (() => {{ {_PANEL} }})(); "
                                f"return p && ({condition}) && p; }})()", timeout=timeout)
    except BrowserError:
        raise AssertionError(f"the panel never showed {condition} in {timeout} s; it shows: "
                             f"{browser.run(_PANEL)}") from None


def _row(browser, job_id, css):
    """Click the button ``css`` of the panel's row of ``job_id``."""
    browser.run(f"document.querySelector('#dockermpi-jobs-panel .dmpi-job[data-job-id=\"{job_id}\"] "
                f"{css}').click();")


def _open_panel(browser, user):
    """Log ``user`` in to her JupyterLab and open the jobs panel from its sidebar tab."""
    _log_in(browser, user)
    # ?reset: the default layout, whatever an earlier session left open (the sidebar
    # tab's click below opens the panel from there).
    browser.get(_lab(user) + "?reset")
    tab = ".jp-SideBar [data-id=\"dockermpi-jobs-panel\"]"
    browser.wait_for(f"!!document.querySelector('.jp-LabShell') && "
                     f"!!document.querySelector('{tab}')", timeout=180)
    # A real click: Lumino's tab bars act on the pointer, not on click events.
    browser.click(browser.run(f"return document.querySelector('{tab}');")[ELEMENT])


def _other_users_job(cluster, name, command):
    """A job of OTHER_USER's (submitted on the master: how does not matter to the panel)."""
    code, job = cluster.run_json("mpi.submit", user=OTHER_USER, image="mpi", np=1, name=name,
                                 cmd=command)
    assert code == 0 and job["state"] == "queued", job
    return job["job_id"]


def _mpi_submit(cluster, user, *argv):
    """``mpi submit`` in the user's notebook container, as they type it in a terminal."""
    code, out = cluster.notebook_exec(user, ["mpi", "submit", "--json", *argv])
    assert code == 0, out
    return json.loads(out)["job_id"]


def test_the_jobs_panel_follows_the_users_jobs_live_cancels_one_and_shows_no_one_elses(
        cluster, notebook_user):
    tag = f"panel-go-{int(time.time())}"
    account = json.loads(cluster.notebook_exec(notebook_user, ["mpi", "whoami", "--json"])[1])
    # Another user's jobs, running beside hers all along.
    theirs = [_other_users_job(cluster, "not-yours", "sleep 600")]
    try:
        with _browser(cluster) as browser:
            _open_panel(browser, notebook_user)
            _panel(browser, "p.visible && p.stream === 'open'")
            # Notifications: only once she agreed, from the panel's button.
            browser.run(_NOTIFICATION_SPY)
            notify = browser.run("return document.querySelector('#dockermpi-jobs-panel "
                                 ".dmpi-notify');")[ELEMENT]
            browser.wait_for("document.querySelector('.dmpi-notify').textContent === "
                             "'Notify me when jobs end'")
            browser.click(notify)
            browser.wait_for("window.dmpiAsked === 1")
            browser.set_permission("notifications", "granted")
            browser.wait_for("document.querySelector('.dmpi-notify').textContent === "
                             "'Notifying when jobs end'")
            # A job submitted from the terminal appears, runs, and succeeds live.
            held_job = _mpi_submit(cluster, notebook_user, "-n", "4", "-N", "2", "-J",
                                   "panel-held", "--", "sh", "-c",
                                   f"while [ ! -e /data/{tag} ]; do sleep 0.3; done; "
                                   "echo released")
            _panel(browser, f"p.rows.some(r => r.id === '{held_job}' && r.state === 'running')")
            theirs.append(_other_users_job(cluster, "not-yours-2", "hostname"))
            code, out = cluster.notebook_exec(notebook_user, ["touch", f"/data/{tag}"])
            assert code == 0, out
            shown = _panel(browser, f"p.rows.some(r => r.id === '{held_job}' && "
                                    "r.state === 'succeeded')")
            assert shown["seen"][held_job][:1] in (["queued"], ["starting"], ["running"]), shown
            assert "running" in shown["seen"][held_job], shown
            # Its output, followed in a view of its own.
            _row(browser, held_job, ".dmpi-output")
            browser.wait_for("[...document.querySelectorAll('.dmpi-output-view "
                             ".dmpi-output-text')].some(e => /released/.test(e.innerText))")
            # Another job, cancelled from the panel, while she looks at another tab: a
            # notification says so (none came for the job that ended before her eyes).
            long_job = _mpi_submit(cluster, notebook_user, "-n", "2", "-J", "panel-long",
                                   "--", "sleep", "600")
            _panel(browser, f"p.rows.some(r => r.id === '{long_job}' && r.state === 'running')")
            browser.run("window.dmpiHide(true);")
            _row(browser, long_job, ".dmpi-cancel")
            shown = _panel(browser, f"p.rows.some(r => r.id === '{long_job}' && "
                                    "r.state === 'cancelled')", timeout=60)
            assert shown["visible"], shown
            notes = browser.wait_for("window.dmpiNotes.length && window.dmpiNotes")
            assert [note["tag"] for note in notes] == [f"dockermpi-{long_job}"], notes
            assert notes[0]["title"] == "panel-long cancelled", notes
            browser.run("window.dmpiHide(false);")
            # The image's settings: no one is asked to fetch Jupyter's news.
            assert not browser.run("return /Jupyter news/.test(document.body.innerText);")
            browser.screenshot(ARTIFACTS / "jobs-panel-in-jupyterlab.png")
            # Nothing of the other user's.
            assert {row["user"] for row in shown["rows"]} == {account["account"]}, shown
            assert not set(theirs) & {row["id"] for row in shown["rows"]}, shown
            assert not set(theirs) & set(shown["seen"]), shown
            notes = browser.run("return window.dmpiNotes;")
            assert [note["tag"] for note in notes] == [f"dockermpi-{long_job}"], notes
        record = cluster.run_json("mpi.status", job_id=long_job)[1]
        assert record["state"] == "cancelled", record
    finally:
        _, left = cluster.settle()  # whatever the outcome, no job of this test runs on
    assert left == {}


#: Copies the user's newest succeeded job ``count`` times in the master's store (ids no
#: job has: ``20000101-000000-<n>``), as a long month of her jobs would leave; argv:
#: store, user, count. Prints how many ended jobs she has now, then the copies' ids.
_MANY_ENDED = """
import json, sqlite3, sys
store, user, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
conn = sqlite3.connect(store, timeout=60)
state, text = conn.execute(
    "SELECT state, record FROM jobs WHERE user = ? AND state = 'succeeded' "
    "ORDER BY seq DESC LIMIT 1", (user,)).fetchone()
record = json.loads(text)
ids = [f"20000101-000000-{n:06x}" for n in range(count)]
with conn:
    for job_id in ids:
        conn.execute("INSERT INTO jobs (id, user, state, record) VALUES (?, ?, ?, ?)",
                     (job_id, user, state, json.dumps(dict(record, job_id=job_id))))
ended = conn.execute("SELECT COUNT(*) FROM jobs WHERE user = ? AND state IN "
                     "('succeeded', 'failed', 'cancelled', 'timed_out')", (user,)).fetchone()[0]
print(ended)
print("\\n".join(ids))
"""
_FORGET = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], timeout=60)
with conn:
    conn.executemany("DELETE FROM jobs WHERE id = ?", [(i,) for i in sys.argv[2:]])
"""
#: More ended jobs than one history page holds (the site's page_jobs: 1000).
MANY = 1100


def test_the_jobs_panel_reads_every_page_of_a_long_history(cluster, notebook_user):
    account = json.loads(cluster.notebook_exec(notebook_user, ["mpi", "whoami", "--json"])[1])
    job_id = _mpi_submit(cluster, notebook_user, "-n", "1", "-J", "panel-pages", "--", "true")
    assert cluster.run_json("mpi.wait", job_id=job_id, timeout=120)[1]["state"] == "succeeded"
    code, out = cluster.exec("master", ["python3", "-c", _MANY_ENDED, JOB_STORE,
                                        account["account"], str(MANY)], stdout_only=True)
    assert code == 0, out
    ended, *copies = out.split()
    try:
        assert int(ended) > MANY, out[:200]
        with _browser(cluster) as browser:
            _open_panel(browser, notebook_user)
            # The heading counts (0) until the history is read, all its pages at once.
            heading = "#dockermpi-jobs-panel .dmpi-history h3"
            shown = browser.wait_for(
                f"(() => {{ const e = document.querySelector('{heading}'); "
                f"return e && /\\([1-9]\\d*\\)/.test(e.innerText) && e.innerText; }})()",
                timeout=120)
            # Every ended job of the window, past the first page's 1000.
            assert shown == f"Ended, last 30 days ({int(ended)})", shown
            rows = browser.run("return [...document.querySelectorAll("
                               "'#dockermpi-jobs-panel .dmpi-history .dmpi-job')]"
                               ".map(r => r.dataset.jobId);")
            assert len(rows) == 200 and set(rows) <= set(copies) | {job_id}, rows[:5]
    finally:
        cluster.exec("master", ["python3", "-c", _FORGET, JOB_STORE, *copies])
