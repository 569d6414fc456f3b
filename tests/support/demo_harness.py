"""Start ``mfu-exporter demo`` as a real subprocess on a free loopback port, for tests that need a live node."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import ssl
import subprocess
import sys
import urllib.request
from typing import Iterator

from tests.support.expo import Samples, samples
from tests.support.net import free_port
from tests.support.wait import wait_until


def get(url: str, context: ssl.SSLContext | None = None, headers: dict[str, str] | None = None) -> bytes:
    request = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(request, timeout=10, context=context) as response:
        return response.read()


def get_json(url: str, context: ssl.SSLContext | None = None, headers: dict[str, str] | None = None) -> dict:
    return json.loads(get(url, context, headers))


def metric_samples(base: str) -> Samples:
    """The samples of the demo's ``/metrics`` (``tests.support.expo.samples``)."""
    return samples(get(base + "metrics").decode())


@contextlib.contextmanager
def running_demo(
    *args: str, speed: float = 20.0, port: int | None = None, context: ssl.SSLContext | None = None
) -> Iterator[str]:
    """Yield the demo's base URL (``http://127.0.0.1:PORT/``, ``https`` with a TLS ``context``) once it is ready;
    stop it with SIGINT afterwards."""
    port = port or free_port()
    command = [
        sys.executable,
        "-m",
        "mfu_exporter",
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
    base = f"{'https' if context else 'http'}://127.0.0.1:{port}/"
    try:
        wait_until(
            lambda: process.poll() is None and get(base + "readyz", context),
            30,
            "the demo to be ready",
            ignore=(OSError,),
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
