"""Headless Chromium for the hub's browser tests, driven by Debian's chromedriver over the
W3C WebDriver protocol (plain HTTP and JSON: no client library needed).

Each ``Browser`` is one fresh profile (its own cookies) and one chromedriver process;
``host_rules`` are Chromium's ``--host-resolver-rules`` (e.g. ``MAP *.hub.test 10.0.0.5``),
so test names resolve without DNS.
"""

import base64
import json
import os
import pathlib
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

CHROMIUM = "/usr/bin/chromium"
#: Where the browser tests leave their screenshots (CI keeps the folder as artefacts).
ARTIFACTS = pathlib.Path(os.environ.get("DMPI_ARTIFACTS")
                         or pathlib.Path(__file__).resolve().parents[1] / "artifacts")
CHROMEDRIVER = "/usr/bin/chromedriver"
#: The W3C key of an element reference in WebDriver's answers.
ELEMENT = "element-6066-11e4-a52e-4f735466cecf"


class BrowserError(Exception):
    """chromedriver refused a command or did not start."""


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Browser:
    """One headless Chromium session. Use as a context manager."""

    def __init__(self, host_rules=(), trusted_keys=(), start_timeout=60):
        self.profile = tempfile.mkdtemp(prefix="dmpi-chromium-")
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.driver = subprocess.Popen([CHROMEDRIVER, f"--port={port}"],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.session = None
        try:
            deadline = time.monotonic() + start_timeout
            while not self._ready():
                if self.driver.poll() is not None or time.monotonic() > deadline:
                    raise BrowserError(f"{CHROMEDRIVER} did not start on port {port}")
                time.sleep(0.1)
            args = ["--headless=new", "--no-sandbox", "--disable-gpu",
                    "--disable-dev-shm-usage", "--no-first-run", "--window-size=1280,1024",
                    f"--user-data-dir={self.profile}"]
            if host_rules:
                args.append("--host-resolver-rules=" + ", ".join(host_rules))
            if trusted_keys:
                args.append("--ignore-certificate-errors-spki-list=" + ",".join(trusted_keys))
            answer = self._call("POST", "/session", {"capabilities": {"alwaysMatch": {
                "browserName": "chrome",
                "goog:chromeOptions": {"binary": CHROMIUM, "args": args}}}})
            self.session = answer["sessionId"]
        except BaseException:
            self.close()
            raise

    def _ready(self):
        try:
            with urllib.request.urlopen(self.url + "/status", timeout=5) as answer:
                return json.loads(answer.read())["value"].get("ready", False)
        except (OSError, ValueError, KeyError):
            return False

    def _call(self, method, path, body=None):
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=120) as answer:
                return json.loads(answer.read())["value"]
        except urllib.error.HTTPError as exc:
            raise BrowserError(f"WebDriver {method} {path}: {exc.read().decode()}") from None

    def _session(self, method, path, body=None):
        return self._call(method, f"/session/{self.session}{path}", body)

    def get(self, url):
        """Open ``url`` and wait until its page has loaded."""
        self._session("POST", "/url", {"url": url})

    def current_url(self):
        return self._session("GET", "/url")

    def find(self, css):
        """The element reference of the first element matching ``css``."""
        return self._session("POST", "/element", {"using": "css selector", "value": css})[ELEMENT]

    def type(self, element, text):
        self._session("POST", f"/element/{element}/value", {"text": text})

    def click(self, element):
        self._session("POST", f"/element/{element}/click", {})

    def run(self, script, *args):
        """Run ``script`` (a function body) in the page; returns what it returns."""
        return self._session("POST", "/execute/sync", {"script": script, "args": list(args)})

    def set_permission(self, name, state):
        """Set the page's permission ``name`` (``notifications``) to ``state`` (``granted``,
        ``denied``, ``prompt``), as the user would in the browser's prompt or settings."""
        self._session("POST", "/permissions", {"descriptor": {"name": name}, "state": state})

    def screenshot(self, path):
        """Save what the page shows now as a PNG at ``path``."""
        path = pathlib.Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(self._session("GET", "/screenshot")))
        return path

    def wait_for(self, expression, timeout=60):
        """Wait until the page's JavaScript ``expression`` is truthy; returns its value."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.run(f"return {expression};")
            if value:
                return value
            if time.monotonic() > deadline:
                raise BrowserError(f"{expression} stayed {value!r} for {timeout} s at "
                                   f"{self.current_url()}")
            time.sleep(0.2)

    def close(self):
        if self.session:
            try:
                self._call("DELETE", f"/session/{self.session}")
            except (BrowserError, OSError):
                pass
            self.session = None
        self.driver.terminate()
        try:
            self.driver.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.driver.kill()
            self.driver.wait()
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
