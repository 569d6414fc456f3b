"""Debian's headless Chromium driven through chromedriver (W3C WebDriver over HTTP on loopback), for tests that read a
rendered page: the DOM after its scripts ran, element geometry, computed styles, screenshots."""

from __future__ import annotations

import base64
import contextlib
import json
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterator

from tests.support.net import free_port
from tests.support.tools import require_tool
from tests.support.wait import wait_until

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--force-device-scale-factor=1",
]


class Browser:
    """One WebDriver session: ``get`` a URL, ``execute`` JavaScript in the page and receive its JSON answer,
    ``screenshot`` the viewport."""

    def __init__(self, endpoint: str, session: str) -> None:
        self.endpoint, self.session = endpoint, session

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body or {}).encode() if method == "POST" else None
        url = f"{self.endpoint}/session/{self.session}{path}"
        request = urllib.request.Request(url, data, {"Content-Type": "application/json"}, method=method)
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                return json.loads(response.read())["value"]
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"WebDriver {method} {path}: {exc.read().decode(errors='replace')[:2000]}") from None

    def get(self, url: str) -> None:
        self.call("POST", "/url", {"url": url})

    def execute(self, script: str, *args: Any) -> Any:
        """The value of ``script`` (a function body: ``return ...``) run in the page, ``args`` as ``arguments``."""
        return self.call("POST", "/execute/sync", {"script": script, "args": list(args)})

    def screenshot(self, path: Path) -> Path:
        path.write_bytes(base64.b64decode(self.call("GET", "/screenshot")))
        return path


@contextlib.contextmanager
def browser(tmp_path: Path, width: int, height: int = 1500) -> Iterator[Browser]:
    """A headless Chromium whose viewport is ``width`` × ``height`` CSS pixels, closed afterwards."""
    chromium = require_tool("chromium", "chromium")
    driver = require_tool("chromedriver", "chromium-driver")
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    log = tmp_path / f"chromedriver-{port}.log"
    process = subprocess.Popen(
        [driver, f"--port={port}", f"--log-path={log}"], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
    )
    try:
        wait_until(lambda: process.poll() is None and _ready(endpoint), 30, "chromedriver to listen", ignore=(OSError,))
        options = {
            "binary": chromium,
            "args": [*FLAGS, f"--window-size={width},{height}", f"--user-data-dir={tmp_path / f'profile-{port}'}"],
        }
        capabilities = {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": options}}
        request = urllib.request.Request(
            endpoint + "/session",
            json.dumps({"capabilities": capabilities}).encode(),
            {"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                session = json.loads(response.read())["value"]["sessionId"]
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"no Chromium session: {exc.read().decode(errors='replace')[:2000]}") from None
        page = Browser(endpoint, session)
        try:
            yield page
        finally:
            with contextlib.suppress(OSError, AssertionError):
                page.call("DELETE", "")
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _ready(endpoint: str) -> bool:
    with urllib.request.urlopen(endpoint + "/status", timeout=5) as response:
        return bool(json.loads(response.read())["value"]["ready"])
