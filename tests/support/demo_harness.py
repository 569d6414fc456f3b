"""Start ``mfu-exporter demo`` as a real subprocess on a free loopback port, for tests that need a live node."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Iterator

from prometheus_client.parser import text_string_to_metric_families


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read()


def get_json(url: str) -> dict:
    return json.loads(get(url))


def metric_samples(base: str) -> dict[tuple[str, tuple], float]:
    text = get(base + "metrics").decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def wait_until(predicate, timeout: float, what: str, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
        except OSError:
            last = None
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


@contextlib.contextmanager
def running_demo(*args: str, speed: float = 20.0, port: int | None = None) -> Iterator[str]:
    """Yield the demo's base URL (``http://127.0.0.1:PORT/``) once it is ready; stop it with SIGINT afterwards."""
    port = port or free_port()
    command = [
        sys.executable,
        "-m",
        "exporter",
        "demo",
        "--web.listen-address",
        f"127.0.0.1:{port}",
        "--speed",
        str(speed),
        "--log.level",
        "warning",
        *args,
    ]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )
    base = f"http://127.0.0.1:{port}/"
    try:
        wait_until(lambda: process.poll() is None and get(base + "readyz"), 30, "the demo to be ready")
        yield base
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        output = process.stdout.read().decode(errors="replace")
        if process.returncode not in (0, -signal.SIGINT):
            raise AssertionError(f"demo exited {process.returncode}:\n{output}")
