"""Start ``mfu-exporter demo`` as a real subprocess on a free loopback port, for tests that need a live node."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import urllib.request
from typing import Iterator

from tests.support.expo import Samples, samples
from tests.support.net import free_port
from tests.support.wait import wait_until


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read()


def get_json(url: str) -> dict:
    return json.loads(get(url))


def metric_samples(base: str) -> Samples:
    """The samples of the demo's ``/metrics`` (``tests.support.expo.samples``)."""
    return samples(get(base + "metrics").decode())


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
        wait_until(
            lambda: process.poll() is None and get(base + "readyz"), 30, "the demo to be ready", ignore=(OSError,)
        )
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
