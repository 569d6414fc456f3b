"""Loopback networking for tests: a free TCP port for a server a test starts."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now. Another process may take it before the server binds it: a harness that
    starts many servers retries on "address already in use" (``prom_harness._start_on_free_port``)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
