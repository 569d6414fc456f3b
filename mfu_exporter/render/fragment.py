"""One published part of /metrics, and the page of them a scrape is served from.

Every part of the exposition is published as a ``Fragment`` when what it shows changes: a source's fragment when
its sample ends, the exporter's own series then too, the jobs' and the service's other parts at the service's tick
(``ExporterCollector``). A fragment never changes once published: its families are built once (from readings that
do not change either), and its encoding in a format, made on the first scrape in that format (or ahead of it,
``Exposition.sampled``), is kept on it with its deflate segment, so a later body joins bytes. A new fragment
replaces the old one, and the old one's encodings go with it.

A ``Page`` is the fragments in the order /metrics writes them, as published at one moment; publishing makes a new
page. A page's bodies, one per format and encoding, are joined once and kept on it.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Callable, Iterable

from prometheus_client.metrics_core import Metric

from mfu_exporter.render.encode import EOF_PIECE, Encoder, Library, deflate_segment, gzip_member, plain_openmetrics


class Fragment:
    """A part's families, built once by ``build`` when first needed, and their encoding per format, made once.

    ``build`` must read only what does not change after publication (a snapshot's readings, the tick's job views,
    families built at publication). ``ahead``: a fragment a scrape must not encode on the event loop (a source's
    snapshot: milliseconds for the GPU source's); the rest are small enough to. ``sampled``: published by a source's
    sample (its snapshot, the exporter's own series), not by the tick: ``Exposition`` encodes each group ahead of a
    periodic scrape when it is published."""

    __slots__ = ("_build", "_families", "_encoded", "_segments", "_lock", "ahead", "sampled", "__weakref__")

    def __init__(self, build: Callable[[], Iterable[Metric]], ahead: bool = False, sampled: bool = False):
        self._build: Callable[[], Iterable[Metric]] | None = build
        self._families: list[Metric] | None = None
        self._encoded: dict[str, bytes] = {}  # content type -> the families' encoding, UTF-8
        self._segments: dict[str, bytes] = {}  # content type -> that encoding's deflate segment
        # Held while building or encoding: two scrapes (or a scrape and the encoding ahead) do the work once.
        self._lock = threading.Lock()
        self.ahead = ahead
        self.sampled = sampled

    @classmethod
    def of(cls, families: Iterable[Metric]) -> Fragment:
        """A fragment of families built already."""
        built = list(families)
        return cls(lambda: built)

    def families(self) -> list[Metric]:
        families = self._families
        if families is None:
            with self._lock:
                families = self._built()
        return families

    def _built(self) -> list[Metric]:
        if self._families is None:
            assert self._build is not None
            self._families = list(self._build())
            self._build = None  # what it read is no longer held
        return self._families

    def encoded(self, content_type: str, use_gzip: bool = False) -> bool:
        """Whether the encoding in ``content_type`` is made (a render then only joins it), with its deflate segment
        when ``use_gzip``."""
        return content_type in self._encoded and (not use_gzip or content_type in self._segments)

    def data(self, content_type: str, library: Library, encoder: Encoder) -> bytes:
        """The families in ``content_type`` (a format ``plain_openmetrics`` accepts), without OpenMetrics' ``# EOF``."""
        data = self._encoded.get(content_type)
        if data is None:
            with self._lock:
                data = self._encoded.get(content_type)
                if data is None:
                    openmetrics = bool(plain_openmetrics(content_type))
                    data = encoder.families(self._built(), library, openmetrics).encode("utf-8")
                    self._encoded[content_type] = data
        return data

    def piece(self, content_type: str, library: Library, encoder: Encoder) -> tuple[bytes, bytes]:
        """``data`` with its deflate segment, for a gzip body."""
        data = self.data(content_type, library, encoder)
        segment = self._segments.get(content_type)
        if segment is None:
            with self._lock:
                segment = self._segments.get(content_type)
                if segment is None:
                    segment = self._segments[content_type] = deflate_segment(data)
        return data, segment


class _Families:
    """A registry of the page's families, for the library's encoder."""

    def __init__(self, fragments: tuple[Fragment, ...]):
        self._fragments = fragments

    def collect(self) -> Iterable[Metric]:
        for fragment in self._fragments:
            yield from fragment.families()


class Page:
    """The fragments /metrics writes, in order, as published at one moment, and the bodies made of them."""

    __slots__ = ("fragments", "_bodies", "_lock", "pending")

    def __init__(self, fragments: Iterable[Fragment]):
        self.fragments = tuple(fragments)
        self._bodies: dict[tuple[str, bool], bytes] = {}  # (content type, gzip) -> the body
        self._lock = threading.Lock()
        # (content type, gzip) -> the render of that body under way in a thread, which scrapes of the page await.
        self.pending: dict[tuple[str, bool], asyncio.Future[bytes]] = {}

    def collect(self) -> Iterable[Metric]:
        return _Families(self.fragments).collect()

    def kept(self, content_type: str, use_gzip: bool) -> bytes | None:
        """The body already made for the format and encoding, if any."""
        return self._bodies.get((content_type, use_gzip))

    def encoded(self, content_type: str, use_gzip: bool = False) -> bool:
        """Whether every fragment worth encoding ahead is encoded in ``content_type`` (with its deflate segment when
        ``use_gzip``): what is left of a body is small enough to make on the event loop."""
        return plain_openmetrics(content_type) is not None and all(
            fragment.encoded(content_type, use_gzip) for fragment in self.fragments if fragment.ahead
        )

    def body(self, library: Library, content_type: str, use_gzip: bool, encoder: Encoder) -> bytes:
        """The page in ``content_type`` (``library`` is its encoder), gzipped when ``use_gzip``; made once."""
        key = (content_type, use_gzip)
        body = self._bodies.get(key)
        if body is None:
            body = self._make(library, content_type, use_gzip, encoder)
            with self._lock:
                body = self._bodies.setdefault(key, body)
        return body

    def _make(self, library: Library, content_type: str, use_gzip: bool, encoder: Encoder) -> bytes:
        openmetrics = plain_openmetrics(content_type)
        if openmetrics is None:  # a format only the library writes
            body = library(_Families(self.fragments))
            return gzip_member([(body, deflate_segment(body))]) if use_gzip else body
        if use_gzip:
            pieces = [fragment.piece(content_type, library, encoder) for fragment in self.fragments]
            return gzip_member([*pieces, EOF_PIECE] if openmetrics else pieces)
        data = [fragment.data(content_type, library, encoder) for fragment in self.fragments]
        if openmetrics:
            data.append(EOF_PIECE[0])
        return b"".join(data)
