"""A lean HTTP/1.1 load generator: keep-alive connections, pre-encoded requests, latency per request.

Written on asyncio streams rather than an HTTP library so the client's own cost stays small beside what it
measures: a request is one write of prepared bytes, a response is read as ``Content-Length`` or chunked bytes and
not decoded. The same client measures the exporter and node_exporter, so their ratio is fair whatever it costs.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass
from typing import Awaitable, Callable

# What Prometheus 2.x sends (scrape_protocols' default order): OpenMetrics preferred, gzip accepted.
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,"
    "text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
)
PROMETHEUS = {
    "Accept": PROMETHEUS_ACCEPT,
    "User-Agent": "Prometheus/2.53.0",
    "X-Prometheus-Scrape-Timeout-Seconds": "10",
}
# The four ways a scrape can ask: format × compression.
SCRAPE_MODES = {
    "openmetrics_gzip": {**PROMETHEUS, "Accept-Encoding": "gzip"},  # Prometheus by default
    "openmetrics": {**PROMETHEUS, "Accept-Encoding": "identity"},  # Prometheus with enable_compression: false
    # vmagent, or Prometheus with scrape_protocols: [PrometheusText0.0.4]
    "text_gzip": {
        "Accept": "text/plain;version=0.0.4;q=1,*/*;q=0.1",
        "Accept-Encoding": "gzip",
        "User-Agent": "vm_promscrape",
    },
    "text": {"User-Agent": "curl/8.5.0", "Accept": "*/*"},  # a plain curl: text format, no compression
}


class HttpError(Exception):
    pass


def get_request(address: str, path: str, headers: dict[str, str]) -> bytes:
    lines = [f"GET {path} HTTP/1.1", f"Host: {address}", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def post_json_request(address: str, path: str, payload: object) -> bytes:
    body = json.dumps(payload, separators=(",", ":")).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {address}\r\nUser-Agent: python-requests/2.32.3\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


@dataclass
class Response:
    status: int
    headers: dict[bytes, bytes]
    body: bytes


class Connection:
    """One keep-alive connection; ``exchange`` sends a prepared request and reads the whole response."""

    def __init__(self, address: str):
        self.address = address
        host, port = address.rsplit(":", 1)
        self._host, self._port = host, int(port)
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def open(self) -> "Connection":
        self._reader, self._writer = await asyncio.open_connection(self._host, self._port, limit=1 << 22)
        return self

    async def exchange(self, request: bytes) -> Response:
        if self._writer is None:
            await self.open()
        self._writer.write(request)
        head = await self._reader.readuntil(b"\r\n\r\n")
        status_line, *header_lines = head[:-4].split(b"\r\n")
        headers = {}
        for line in header_lines:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        length = headers.get(b"content-length")
        if length is not None:
            body = await self._reader.readexactly(int(length))
        elif headers.get(b"transfer-encoding", b"").lower() == b"chunked":
            body = await self._read_chunked()
        else:
            raise HttpError(f"a response without a length from {self.address}: {status_line!r}")
        if headers.get(b"connection", b"").lower() == b"close":
            await self.close()
        return Response(int(status_line.split()[1]), headers, body)

    async def _read_chunked(self) -> bytes:
        parts = []
        while True:
            size = int((await self._reader.readline()).split(b";", 1)[0], 16)
            if size == 0:
                while await self._reader.readline() not in (b"\r\n", b""):
                    pass  # trailers
                return b"".join(parts)
            parts.append((await self._reader.readexactly(size + 2))[:-2])

    async def timed(self, request: bytes, expect: int = 200) -> float:
        """Seconds from sending ``request`` to the end of its response body."""
        return (await self.timed_response(request, expect))[0]

    async def timed_response(self, request: bytes, expect: int = 200) -> tuple[float, Response]:
        """``timed``'s seconds, with the response."""
        started = time.perf_counter()
        response = await self.exchange(request)
        elapsed = time.perf_counter() - started
        if response.status != expect:
            raise HttpError(f"{self.address} answered {response.status}: {response.body[:200]!r}")
        return elapsed, response

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            try:
                await self._writer.wait_closed()
            except ConnectionError:
                pass
            self._reader = self._writer = None


async def back_to_back(address: str, request: bytes, clients: int, requests_each: int) -> list[float]:
    """``clients`` connections each sending ``requests_each`` requests as fast as answers come; every latency."""
    connections = [await Connection(address).open() for _ in range(clients)]

    async def run(connection: Connection) -> list[float]:
        return [await connection.timed(request) for _ in range(requests_each)]

    try:
        return [latency for latencies in await asyncio.gather(*map(run, connections)) for latency in latencies]
    finally:
        for connection in connections:
            await connection.close()


async def in_fresh_rounds(
    address: str,
    request: bytes,
    clients: int,
    rounds: int,
    before_round: Callable[[], Awaitable[None]],
    changed_only: bool,
) -> list[float]:
    """``rounds`` times: ``before_round()`` (untimed), then ``clients`` requests at once; every latency. With
    ``changed_only``, a round counts (its latencies kept, towards ``rounds``) only when its body
    differs from the one before it: a scrape of a page published since the last (a server that serves what its
    sources and tick published), not one it answered already."""
    connections = [await Connection(address).open() for _ in range(clients)]
    latencies: list[float] = []
    last = (await connections[0].exchange(request)).body if changed_only else None
    counted = 0
    try:
        while counted < rounds:
            await before_round()
            answers = await asyncio.gather(*(connection.timed_response(request) for connection in connections))
            body = answers[0][1].body
            if not changed_only or body != last:
                latencies += [elapsed for elapsed, _ in answers]
                counted += 1
            last = body
        return latencies
    finally:
        for connection in connections:
            await connection.close()


@dataclass
class PostRun:
    latencies: list[float]  # of the accepted requests
    refused: int  # answered 503 (the server's limit on ingest requests at once)
    elapsed: float


async def post_many(address: str, next_requests: list[Callable[[], bytes]], requests_each: int) -> PostRun:
    """One connection per request maker, all at once, each until ``requests_each`` of the requests it makes as it
    goes (so times and totals are current) were accepted. A 503 is retried at once, as a reporter would after its
    backoff if the bench waited: what is measured is what the server takes while 32 requests are always waiting."""
    connections = [await Connection(address).open() for _ in next_requests]
    refused = 0

    async def run(connection: Connection, next_request: Callable[[], bytes]) -> list[float]:
        nonlocal refused
        latencies: list[float] = []
        while len(latencies) < requests_each:
            started = time.perf_counter()
            response = await connection.exchange(next_request())
            elapsed = time.perf_counter() - started
            if response.status == 503:
                refused += 1
            elif response.status == 200:
                latencies.append(elapsed)
            else:
                raise HttpError(f"{address} answered {response.status}: {response.body[:200]!r}")
        return latencies

    started = time.perf_counter()
    try:
        results = await asyncio.gather(*(run(c, make) for c, make in zip(connections, next_requests)))
    finally:
        for connection in connections:
            await connection.close()
    return PostRun([latency for latencies in results for latency in latencies], refused, time.perf_counter() - started)


def percentile(values: list[float], fraction: float) -> float:
    """Nearest-rank percentile (p99 of 1,000 values is the 990th smallest)."""
    ordered = sorted(values)
    return ordered[max(math.ceil(fraction * len(ordered)) - 1, 0)]
