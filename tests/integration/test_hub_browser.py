"""The hub in a real browser (headless Chromium): a page user A's server serves cannot act
as user B in B's browser, because every user's server has an origin of its own
(mpi:hub:subdomain_host), apart from the hub's and the user API's.

A's server is A's own process, so A can make it answer with any page: the tests take
that as given and serve A's page the short way, from a process of A's uid in A's
notebook container, routed by the hub's proxy under A's origin. The same page served on
the hub's origin (what every user's server had before) shows the attack works there.
"""

import json
import urllib.parse

import pytest
import yaml

from tests.browser import Browser
from tests.cluster import tls
from tests.cluster.testcluster import (API_PUBLIC_URL, HUB_ADDR, HUB_DOMAIN, HUB_PUBLIC_URL,
                                       REPO)

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


def _victim_opens(cluster, url):
    """B logs in to the hub in a fresh browser and opens ``url``: the page's report."""
    rules = [f"MAP {HUB_DOMAIN} {HUB_ADDR}", f"MAP *.{HUB_DOMAIN} {HUB_ADDR}"]
    # The browser trusts the hub's certificate (its key) as it would a site's.
    trusted = [tls.spki_sha256(cluster.tls["hub_cert"])]
    with Browser(host_rules=rules, trusted_keys=trusted) as browser:
        browser.get(f"{HUB_PUBLIC_URL}/hub/login?next=" + urllib.parse.quote("/hub/token"))
        browser.type(browser.find("#username_input"), VICTIM)
        browser.type(browser.find("#password_input"), _password())
        browser.click(browser.find("#login_submit"))
        browser.wait_for("location.pathname === '/hub/token'")
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
