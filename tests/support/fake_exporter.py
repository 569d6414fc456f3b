"""A stand-in for the exporter's ingest API in the client's tests: a real HTTP/1.1 server on loopback (keep-alive, as
the daemon serves) that records every POST and answers from a script per path.

Answers for a path are used in the order they were added, the last one repeated; ``drop=True`` closes the connection
without answering (what the client sees when the exporter dies mid-request), and ``callback`` computes the answer
from the request (it may block, to hold the client's thread on one request).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable


@dataclass
class Call:
    path: str
    body: bytes
    headers: dict[str, str]
    peer: tuple[str, int]  # the client's address and port: one per TCP connection

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Answer:
    status: int = 200
    body: Any = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    drop: bool = False
    callback: Callable[[Call], tuple[int, Any]] | None = None


class FakeExporter:
    def __init__(self) -> None:
        self.calls: list[Call] = []
        self._answers: dict[str, list[Answer]] = {}
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name="fake-exporter", daemon=True
        )
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> "FakeExporter":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def add(
        self,
        path: str,
        status: int = 200,
        body: Any = None,
        *,
        headers: dict[str, str] | None = None,
        drop: bool = False,
        callback: Callable[[Call], tuple[int, Any]] | None = None,
    ) -> None:
        answer = Answer(status, {} if body is None else body, dict(headers or {}), drop, callback)
        with self._lock:
            self._answers.setdefault(path, []).append(answer)

    def bodies(self, path: str | None = None) -> list[Any]:
        """The JSON of every request so far (to ``path`` only, if given), in the order they arrived."""
        return [call.json() for call in list(self.calls) if path is None or call.path == path]

    def reset(self) -> None:
        self.calls.clear()

    def _next(self, path: str) -> Answer:
        with self._lock:
            script = self._answers.get(path)
            if not script:
                return Answer(404, {"error": f"no answer for {path}"})
            return script.pop(0) if len(script) > 1 else script[0]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the daemon (aiohttp) serves

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                call = Call(self.path, body, dict(self.headers.items()), self.client_address)
                answer = exporter._next(self.path)
                if answer.drop:
                    exporter.calls.append(call)
                    self.close_connection = True
                    return
                status, payload = answer.callback(call) if answer.callback else (answer.status, answer.body)
                data = json.dumps(payload).encode()
                exporter.calls.append(call)  # after the answer is decided: a blocked callback is not yet a call
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in answer.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler
