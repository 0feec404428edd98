"""A real browser for the live page's tests: Debian's chromium, driven through chromedriver's W3C
WebDriver HTTP API (plain JSON over loopback, no client library, nothing downloaded).

scripts/install-tools.sh installs both (`chromium`, `chromium-driver`); a test that needs them
fails, never skips, when they are missing. Chromium runs headless as root here, so it needs
--no-sandbox, and a fresh profile per session so that nothing carries over between tests.
The browser's console (errors, uncaught exceptions, failed loads) is read through chromedriver's
log endpoint (``goog:loggingPrefs``).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support.harness import free_port

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1400,2000",
]


def browser_binaries() -> tuple[str, str]:
    """chromium and chromedriver, or the test fails saying how to install them."""
    chromium = shutil.which("chromium")
    driver = shutil.which("chromedriver")
    if chromium is None or driver is None:
        pytest.fail(
            "chromium and chromedriver are not installed: run scripts/install-tools.sh (as "
            "root; Debian's chromium and chromium-driver packages) first"
        )
    return chromium, driver


class WebDriverError(AssertionError):
    """chromedriver answered an error (the message says which command and why)."""


@dataclass
class Browser:
    """One WebDriver session: a page, scripts run in it, its console and screenshots."""

    driver_url: str
    session: str
    console: list[dict[str, Any]] = field(default_factory=list)

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        return _request(method, f"{self.driver_url}/session/{self.session}{path}", body)

    def open(self, url: str) -> None:
        self._call("POST", "/url", {"url": url})

    def run(self, script: str, *args: Any) -> Any:
        """The value of a function body run in the page (``arguments`` holds ``args``)."""
        return self._call("POST", "/execute/sync", {"script": script, "args": list(args)})

    def wait_for(self, what: str, script: str, *args: Any, timeout: float = 30.0) -> Any:
        """Run ``script`` until it returns something truthy; that value."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.run(script, *args)
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"not within {timeout}s: {what} (last: {value!r})")
            time.sleep(0.2)

    def read_console(self) -> list[dict[str, Any]]:
        """Every console entry since the session began (chromedriver hands each out once)."""
        self.console += self._call("POST", "/se/log", {"type": "browser"})
        return self.console

    def console_errors(self) -> list[dict[str, Any]]:
        return [entry for entry in self.read_console() if entry["level"] == "SEVERE"]

    def screenshot(self, path: Path) -> bytes:
        png = base64.b64decode(self._call("GET", "/screenshot"))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(png)
        return png

    def full_height(self) -> None:
        """Make the window as tall as the page, so that a screenshot shows all of it."""
        height = self.run("return document.documentElement.scrollHeight")
        self._call("POST", "/window/rect", {"width": 1400, "height": min(int(height) + 40, 6000)})


def _request(method: str, url: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            answer = json.loads(response.read())
    except urllib.error.HTTPError as error:
        answer = json.loads(error.read())
        value = answer.get("value", {})
        message = f"{method} {url}: {value.get('error')}: {value.get('message')}"
        raise WebDriverError(message) from None
    return answer["value"]


@contextlib.contextmanager
def chromium() -> Iterator[Browser]:
    """A headless chromium with a fresh profile, driven by its own chromedriver."""
    binary, driver = browser_binaries()
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="mtp-ui-browser-") as scratch:
        log = (Path(scratch) / "chromedriver.log").open("wb")
        process = subprocess.Popen(
            [driver, f"--port={port}", "--allowed-ips=127.0.0.1"],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            _wait_ready(url, process)
            args = [*CHROMIUM_ARGS, f"--user-data-dir={Path(scratch) / 'profile'}"]
            capabilities = {
                "browserName": "chrome",
                "goog:loggingPrefs": {"browser": "ALL"},
                "goog:chromeOptions": {"binary": binary, "args": args},
            }
            asked = {"capabilities": {"alwaysMatch": capabilities}}
            session = _request("POST", f"{url}/session", asked)
            browser = Browser(url, session["sessionId"])
            try:
                yield browser
            finally:
                with contextlib.suppress(WebDriverError, OSError):
                    _request("DELETE", f"{url}/session/{browser.session}")
        finally:
            _stop_group(process)
            log.close()


def _stop_group(process: subprocess.Popen[bytes]) -> None:
    """chromedriver and the chromium it started (its own process group)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _wait_ready(url: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        assert process.poll() is None, "chromedriver exited at start"
        with contextlib.suppress(OSError, ValueError, KeyError):
            if _request("GET", f"{url}/status")["ready"]:
                return
        time.sleep(0.1)
    raise TimeoutError("chromedriver not ready within 20 s")
