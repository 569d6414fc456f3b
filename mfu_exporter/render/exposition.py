"""/metrics bodies from the latest published page, each made at most once per page, format and encoding.

A body joins the page's fragments' encodings (``render/fragment.py``): a scrape of an unchanged page gets the bytes
made for the one before, and one after a change encodes only the fragments published since. prometheus_client's
``generate_latest`` costs milliseconds for a full node; doing it per scrape, on the loop, would make 16 concurrent
scrapers queue behind each other. A body that needs a source's snapshot encoded is made in a thread; one whose
snapshots are all encoded (the common case: ``sampled`` encodes each new one ahead of the next scrape) is made on
the loop, which costs less than the trip to a thread and back (docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

from prometheus_client.exposition import choose_encoder

from mfu_exporter.render.encode import Encoder, Library, plain_openmetrics
from mfu_exporter.render.fragment import Page

log = logging.getLogger(__name__)


class Exposition:
    """Serves ``page()``'s bodies (``ExporterCollector.page``), encoded by ``encoder``.

    ``sampled`` (a ``Scheduler.on_sample`` listener) encodes each new snapshot that a scraper's next scrape will find
    the latest right away, off the loop, in every format a scraper comes back for; ``ticked`` does the same for what
    the tick published, and the page's body is joined then too. That scrape then finds its body made. A format
    counts as scraped periodically until twice its last interval between scrapes has passed (at most
    ``WARM_FOR``): a Prometheus keeps its format warm, a one-off curl or a burst of scrapes does not."""

    WARM_FOR = 300.0  # longer than any scrape interval in use
    WARM_MARGIN = 1.0  # seconds of a scraper's jitter
    # Seconds the encoding ahead waits after a new snapshot for the others of the same round: the sources sharing
    # an interval sample together (``Scheduler``), so one call encodes every new snapshot of the round instead of
    # one call (an executor wake-up, a pass over every fragment) per source.
    AHEAD_DELAY = 0.005

    def __init__(
        self,
        page: Callable[[], Page],
        encoder: Encoder | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ):
        self._page = page
        self.encoder = encoder or Encoder()
        self._monotonic = monotonic
        # content type -> (its library encoder, when last scraped, seconds since the scrape before (None after the
        # first), whether that scrape asked for gzip)
        self._scraped: dict[str, tuple[Library, float, float | None, bool]] = {}
        # (content type, whether the sampled fragments or the tick's) whose encoding ahead is scheduled, not started
        self._ahead_due: set[tuple[str, bool]] = set()
        self._ahead_tasks: set[asyncio.Task] = set()

    async def render(self, accept: str | None, accept_encoding: str | None) -> tuple[bytes, dict[str, str]]:
        library, content_type = choose_encoder(accept or "")
        now = self._monotonic()
        use_gzip = "gzip" in (accept_encoding or "")
        previous = self._scraped.get(content_type)
        self._scraped[content_type] = (library, now, None if previous is None else now - previous[1], use_gzip)
        headers = {"Content-Type": content_type}
        if use_gzip:
            headers["Content-Encoding"] = "gzip"
        page = self._page()
        body = page.kept(content_type, use_gzip)
        if body is not None:
            return body, headers
        key = (content_type, use_gzip)
        pending = page.pending.get(key)
        if pending is not None:
            return await asyncio.shield(pending), headers
        if page.encoded(content_type, use_gzip):
            # Every snapshot's encoding is made: what is left (the jobs' part, the exporter's own series, gzip of what
            # changed) takes a fraction of a millisecond, less than handing it to a thread and back.
            return page.body(library, content_type, use_gzip, self.encoder), headers
        pending = asyncio.get_running_loop().run_in_executor(
            None, page.body, library, content_type, use_gzip, self.encoder
        )
        page.pending[key] = pending
        try:
            body = await pending
        finally:
            del page.pending[key]
        return body, headers

    def sampled(self, source: str | None = None, next_in: float | None = None) -> None:
        """Encode a source's new snapshot, and the exporter's own series its sample moved, ahead of the next scrape,
        in the formats scraped periodically. A sample that kept its snapshot's fragment (it read what the last one
        did) leaves every snapshot encoded: the scrape makes the rest on the loop, as cheaply as a thread would.

        ``next_in`` is the seconds until the source samples again. A snapshot the source will replace before a
        format's next scrape is due (with ``WARM_MARGIN`` to spare) is not encoded ahead for it: the one that
        replaces it will be. A Prometheus scraping every 15 s then finds the 1 s sources' snapshots of the last
        second or two encoded, not fifteen rounds of encodings it never reads."""
        self._schedule(True, next_in)

    def ticked(self, next_in: float) -> None:
        """Encode what the tick published (the jobs, the parts it moved) ahead of the next scrape, as ``sampled``
        does a snapshot: only when the next tick, ``next_in`` seconds away, comes after that scrape is due. Each
        job's view moves at every tick, so a scrape would otherwise encode every job's series on the loop."""
        self._schedule(False, next_in)

    def _schedule(self, sampled: bool, next_in: float | None) -> None:
        """Schedule encoding the page's fragments published by a sample (``sampled``) or else by the tick, in each
        format scraped periodically whose next scrape they will still be the latest for."""
        now = self._monotonic()
        page = self._page()
        for content_type, (library, scraped_at, interval, use_gzip) in list(self._scraped.items()):
            if now - scraped_at > self.WARM_FOR:
                del self._scraped[content_type]
            elif (
                interval is not None
                and not (sampled and page.encoded(content_type, use_gzip))
                and now - scraped_at <= 2 * interval + self.WARM_MARGIN
                and (next_in is None or now + next_in + self.WARM_MARGIN >= scraped_at + interval)
                and plain_openmetrics(content_type) is not None
                and (content_type, sampled) not in self._ahead_due
            ):
                self._ahead_due.add((content_type, sampled))
                task = asyncio.get_running_loop().create_task(
                    self._encode_ahead(library, content_type, use_gzip, sampled)
                )
                self._ahead_tasks.add(task)
                task.add_done_callback(self._ahead_tasks.discard)

    async def _encode_ahead(self, library: Library, content_type: str, use_gzip: bool, sampled: bool) -> None:
        await asyncio.sleep(self.AHEAD_DELAY)
        await asyncio.get_running_loop().run_in_executor(
            None, self._encode_fragments, library, content_type, use_gzip, sampled
        )

    async def settled(self) -> None:
        """Wait for the encoding ahead scheduled so far to be done."""
        while self._ahead_tasks:
            await asyncio.gather(*self._ahead_tasks)

    def _encode_fragments(self, library: Library, content_type: str, use_gzip: bool, sampled: bool) -> None:
        """Encode the latest page's fragments whose ``sampled`` is ``sampled`` that are not encoded yet (with their
        deflate segments when the format's last scrape asked for gzip): all of the round's, as a fragment published
        after this call's start schedules the next call. Then join the body if nothing is left to encode."""
        self._ahead_due.discard((content_type, sampled))
        try:
            page = self._page()
            for fragment in page.fragments:
                if fragment.sampled == sampled:
                    if use_gzip:
                        fragment.piece(content_type, library, self.encoder)
                    else:
                        fragment.data(content_type, library, self.encoder)
            if all(fragment.encoded(content_type) for fragment in page.fragments):
                page.body(library, content_type, use_gzip, self.encoder)  # joining costs little once all are made
        except Exception:
            log.exception("encoding ahead of the next scrape failed")
