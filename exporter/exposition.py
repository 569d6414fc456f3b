"""Render /metrics bodies at most once per new state, off the event loop, and serve cached bytes.

prometheus_client's ``generate_latest`` costs milliseconds for a full node; doing it per scrape, on the loop,
would make 16 concurrent scrapers queue behind each other. Bodies are cached per (format, gzip) and keyed on a
generation that changes when any snapshot or job changes, and at least once a second (MFU depends on time).
"""

from __future__ import annotations

import asyncio
import gzip
import time
from typing import Callable

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder


class MetricsCache:
    def __init__(self, registry: CollectorRegistry, generation: Callable[[], int], monotonic: Callable[[], float] = time.monotonic):
        self._registry = registry
        self._generation = generation
        self._monotonic = monotonic
        self._bodies: dict[tuple[str, bool], tuple[tuple[int, int], bytes]] = {}
        self._pending: dict[tuple[str, bool], asyncio.Future] = {}

    def _key_generation(self) -> tuple[int, int]:
        return self._generation(), int(self._monotonic())

    async def render(self, accept: str | None, accept_encoding: str | None) -> tuple[bytes, dict[str, str]]:
        encoder, content_type = choose_encoder(accept or "")
        use_gzip = "gzip" in (accept_encoding or "")
        headers = {"Content-Type": content_type}
        if use_gzip:
            headers["Content-Encoding"] = "gzip"
        key = (content_type, use_gzip)
        generation = self._key_generation()
        cached = self._bodies.get(key)
        if cached and cached[0] == generation:
            return cached[1], headers
        pending = self._pending.get(key)
        if pending is None:
            pending = asyncio.get_running_loop().run_in_executor(None, self._encode, encoder, use_gzip)
            self._pending[key] = pending
            try:
                body = await pending
            finally:
                del self._pending[key]
            self._bodies[key] = (generation, body)
            return body, headers
        return await asyncio.shield(pending), headers

    def _encode(self, encoder: Callable[[CollectorRegistry], bytes], use_gzip: bool) -> bytes:
        body = encoder(self._registry)
        return gzip.compress(body, compresslevel=1) if use_gzip else body
