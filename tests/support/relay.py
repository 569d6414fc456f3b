"""A relay for ``tests/support/paging_harness.py``, run as ``python -m tests.support.relay TARGET PATIENCE``: it
listens on a free loopback port, prints its ``host:port``, and serves TARGET's ``/metrics`` (``Relay``) until
stopped; ``/late`` says how many answers came from the previous exposition."""

from __future__ import annotations

import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import requests


class Relay:
    """An HTTP server on a free loopback port serving the demo's newest ``/metrics``: each request asks the demo
    afresh and answers with its reply once it comes, or after ``patience`` wall seconds with the last one it had.

    Prometheus's scrape timeout is its interval, 15 s divided by the speed (187 ms at 80): a demo starved of CPU on a
    loaded machine can take longer, and a failed scrape marks every series stale, which starts each alert's ``for:``
    again. A real node's scrape has seconds; here a slow answer makes the sample a little older instead (its values
    from the demo's last answer), never a failed scrape. ``up`` then says whether the relay answered."""

    def __init__(self, target: str, patience: float):
        self.target = target.rstrip("/") + "/metrics"
        self.patience = patience
        self.body, self.content_type = b"", "text/plain; version=0.0.4"
        self.lock = threading.Lock()
        self.fetching: threading.Thread | None = None
        self.late = 0  # answers given from the last body, the demo being slower than the patience
        relay = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/late":
                    body, content_type = str(relay.late).encode(), "text/plain"
                else:
                    body, content_type = relay.newest()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", content_type)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # Prometheus gave up on this scrape (its timeout): it counts it failed

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.server_address[1]}"

    def fetch(self) -> None:
        try:
            response = requests.get(self.target, headers={"Accept": "text/plain"}, timeout=30)
            if response.status_code == 200:
                with self.lock:
                    self.body, self.content_type = response.content, response.headers["Content-Type"]
        except requests.RequestException:
            pass

    def newest(self) -> tuple[bytes, str]:
        with self.lock:
            if self.fetching is None or not self.fetching.is_alive():
                self.fetching = threading.Thread(target=self.fetch, daemon=True)
                self.fetching.start()
            fetching = self.fetching
        fetching.join(self.patience)
        with self.lock:
            self.late += fetching.is_alive()
            return self.body, self.content_type

    def start(self) -> "Relay":
        self.fetch()
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def main(target: str, patience: str) -> None:
    relay = Relay(target, float(patience)).start()
    print(relay.address, flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main(*sys.argv[1:3])
