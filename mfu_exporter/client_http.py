"""The client's HTTP: JSON POSTs to the exporter over a kept-alive connection, with the standard library only (the
client distribution, clients/python, ships this module beside ``mfu_exporter.client``)."""

from __future__ import annotations

import http.client
import json
import select
import ssl
from typing import Any, Mapping
from urllib.parse import urlsplit

from mfu_exporter import __version__


class Answer:
    """What the exporter answered: the parts of ``requests.Response`` the reporter reads."""

    def __init__(self, status_code: int, headers: Mapping[str, str], body: bytes):
        self.status_code = status_code
        self.headers = headers
        self.text = body.decode("utf-8", "replace")

    def json(self) -> Any:
        return json.loads(self.text)


class HttpSession:
    """POSTs JSON over one kept-alive connection per origin (``http.client``), opened again when the exporter closed
    it while idle or after any error. Used from the reporter's one background thread only."""

    def __init__(self, ssl_context: ssl.SSLContext | None = None):
        self._ssl_context = ssl_context
        self._origin: tuple[str, str] | None = None
        self._connection: http.client.HTTPConnection | None = None

    def post(
        self, url: str, json: Any = None, headers: Mapping[str, str] | None = None, timeout: float | None = None
    ) -> Answer:
        parts = urlsplit(url)
        connection = self._connect((parts.scheme, parts.netloc), timeout)
        body = _dumps(json)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        sent = {"Content-Type": "application/json", "User-Agent": f"mfu-exporter-client/{__version__}"}
        try:
            connection.request("POST", path, body=body, headers={**sent, **(headers or {})})
            response = connection.getresponse()
            answer = Answer(response.status, response.headers, response.read())
        except BaseException:
            self.close()
            raise
        if response.will_close:
            self.close()
        return answer

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
        self._connection = self._origin = None

    def _connect(self, origin: tuple[str, str], timeout: float | None) -> http.client.HTTPConnection:
        if self._connection is not None and (origin != self._origin or _closed_by_peer(self._connection)):
            self.close()
        if self._connection is None:
            scheme, netloc = origin
            if scheme == "https":
                context = self._ssl_context or ssl.create_default_context()
                self._connection = http.client.HTTPSConnection(netloc, timeout=timeout, context=context)
            elif scheme == "http":
                self._connection = http.client.HTTPConnection(netloc, timeout=timeout)
            else:
                raise ValueError(f"the exporter's URL must be http:// or https://, got {scheme}://")
            self._origin = origin
        self._connection.timeout = timeout
        if self._connection.sock is not None:
            self._connection.sock.settimeout(timeout)
        return self._connection


def _closed_by_peer(connection: http.client.HTTPConnection) -> bool:
    """An idle kept-alive socket that is readable has been closed by the server (or holds junk): not reusable."""
    sock = connection.sock
    if sock is None:
        return False
    try:
        return bool(select.select([sock], [], [], 0)[0])
    except (OSError, ValueError):
        return True


def _dumps(payload: Any) -> bytes:
    # NaN goes out as JSON's NaN, as requests sends it: the exporter refuses it naming the field, and the reporter
    # drops that report rather than retrying it.
    return json.dumps(payload).encode("utf-8")
