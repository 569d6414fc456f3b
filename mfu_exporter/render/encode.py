"""Render /metrics bodies at most once per new state, and serve cached bytes.

prometheus_client's ``generate_latest`` costs milliseconds for a full node; doing it per scrape, on the loop,
would make 16 concurrent scrapers queue behind each other. Bodies are cached per (format, gzip) and keyed on a
generation that changes when any snapshot or job changes, and at least once a second (MFU depends on time). A
render that must encode a source's snapshot runs in a thread; one that finds every snapshot encoded ahead (the
common case) encodes the few changed parts on the loop, and gzips by joining kept deflate segments.

A scrape after a state change (every scrape of a Prometheus scraping every 15 s) waits for a render, and most of a
render was prometheus_client's encoder checking and escaping every name of every sample (character by character
for OpenMetrics). ``encode`` writes the very same bytes about three times faster for what this exporter produces
(gauge, counter, info and histogram families with plain names, no timestamps or exemplars) and hands anything else
to the library's encoder, family by family (docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import gzip
import itertools
import logging
import math
import operator
import re
import struct
import threading
import time
import zlib
from typing import Callable, Iterable

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString

from mfu_exporter.render.snapshots import snapshot_families
from mfu_exporter.sources.base import Snapshot

log = logging.getLogger(__name__)

OPENMETRICS = "application/openmetrics-text"
# Escapings under which a plain name is written as it is. (``dots`` doubles underscores; ``values`` prefixes U__.)
PLAIN_NAME_ESCAPINGS = frozenset({"underscores", "allow-utf-8"})
# A name no encoder or escaping changes: OpenMetrics writes sample names through its label-name escaper, which
# turns ':' into '_', and a label name starting with '__' is reserved, quoted under allow-utf-8.
_PLAIN_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# Family types written here, with their type in the text format and the suffix it adds to the family name.
_TEXT_TYPES = {
    "gauge": ("gauge", ""),
    "counter": ("counter", "_total"),
    "info": ("gauge", "_info"),
    "histogram": ("histogram", ""),
}
_EOF = "# EOF\n"
GZIP_LEVEL = 1  # a scrape's body compresses ~6x at level 1; higher levels cost more CPU than the bytes they save
# A gzip member's header (RFC 1952): deflate, no flags, no time, XFL 4 (the fastest level), OS unknown; and the final
# empty block that ends a deflate stream made of full-flush segments.
GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x04\xff"
_FINAL_BLOCK = b"\x03\x00"
_plain_names: set[str] = set()  # names seen to be plain; a few hundred at most, the names this exporter writes
MAX_LABEL_TEXTS = 65536  # label sets kept; a full node has about 1,300
_label_texts: dict[tuple, str] = {}
MAX_KEPT_FAMILIES = 4096  # families whose lines are kept, by name; a full node has about 60
# family name -> (the samples last written, their lines, the signs of their values)
_kept_lines: dict[str, tuple[list, list[str], list[float]]] = {}
_ONES = itertools.repeat(1.0)
_VALUE = operator.itemgetter(2)  # Sample.value


def _plain(name: str) -> bool:
    if name in _plain_names:
        return True
    if _PLAIN_NAME.fullmatch(name) is None or name.startswith("__"):
        return False
    _plain_names.add(name)
    return True


def _content_type_parameters(content_type: str) -> dict[str, str]:
    parameters = {}
    for parameter in content_type.split(";")[1:]:
        key, _, value = parameter.strip().partition("=")
        parameters[key] = value
    return parameters


def _label_text(labels: dict[str, str]) -> str | None:
    """``a="1",b="2"`` as both formats write a sample's labels; None when a name is not plain or a value not text.
    Kept by label set (``_label_texts``): a node's series keep their labels from one render to the next."""
    pairs = []
    for label, value in sorted(labels.items()):
        if type(value) is not str or not _plain(label):
            return None
        escaped = value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
        pairs.append(f'{label}="{escaped}"')
    if len(_label_texts) >= MAX_LABEL_TEXTS:
        _label_texts.clear()  # label sets churn slowly (jobs come and go); starting over costs one render
    text = _label_texts[tuple(labels.items())] = ",".join(pairs)
    return text


def _plain_openmetrics(content_type: str) -> bool | None:
    """Whether ``content_type`` is OpenMetrics 1.0 (True) or the text format (False) with names written as they
    are, which ``encode_families`` writes; None for the rest, which only the library's encoder writes."""
    parameters = _content_type_parameters(content_type)
    openmetrics = content_type.startswith(OPENMETRICS)
    if parameters.get("escaping", "underscores") not in PLAIN_NAME_ESCAPINGS or (
        openmetrics and parameters.get("version") != "1.0.0"
    ):
        return None
    return openmetrics


def encode(registry: CollectorRegistry, encoder: Callable[[CollectorRegistry], bytes], content_type: str) -> bytes:
    """The bytes ``encoder`` (with ``content_type``, both from ``choose_encoder``) makes of ``registry``."""
    openmetrics = _plain_openmetrics(content_type)
    if openmetrics is None:
        return encoder(registry)
    return (encode_families(registry.collect(), encoder, openmetrics) + (_EOF if openmetrics else "")).encode("utf-8")


def encode_families(
    families: Iterable[Metric], encoder: Callable[[CollectorRegistry], bytes], openmetrics: bool
) -> str:
    """The families as ``encoder`` writes them, without OpenMetrics' closing ``# EOF``."""
    parts = []
    for metric in families:
        text = _encode_family(metric, openmetrics)
        if text is None:
            text = encoder(_OneFamily(metric)).decode("utf-8")
            if openmetrics:
                text = text.removesuffix(_EOF)
        parts.append(text)
    return "".join(parts)


class _OneFamily:
    """A registry of one family, for the library's encoder."""

    def __init__(self, metric: Metric):
        self._metric = metric

    def collect(self) -> list[Metric]:
        return [self._metric]


def _encode_family(metric: Metric, openmetrics: bool) -> str | None:
    """The family in the text format or OpenMetrics 1.0, as prometheus_client writes it; None when it needs what
    only the library does (an unusual type or name, timestamps, exemplars, native histograms, _created samples)."""
    name = metric.name
    text_type = _TEXT_TYPES.get(metric.type)
    if text_type is None or not _plain(name):
        return None
    documentation = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
    if openmetrics:
        documentation = documentation.replace('"', r"\"")
        lines = [f"# HELP {name} {documentation}\n# TYPE {name} {metric.type}\n"]
        if metric.unit:
            lines.append(f"# UNIT {name} {metric.unit}\n")
    else:
        family_name = name + text_type[1]
        lines = [f"# HELP {family_name} {documentation}\n# TYPE {family_name} {text_type[0]}\n"]
    body = _sample_lines(metric)
    if body is None:
        return None
    lines.append(body)
    return "".join(lines)


def _sample_lines(metric: Metric) -> str | None:
    """The family's sample lines, the same in both formats; None when a sample needs the library.

    The lines are kept by family name with the samples they were written from: from one sample of a node to the
    next most series keep their value (error counters, link facts, idle GPUs), and a sample equal to the one kept
    at its place is written as it was. Which samples differ is found by C-level comparisons (``map``), so a family
    costs a Python-level write only for its changed samples. Equal samples are written the same: ``floatToGoString``
    writes ``float(value)``, so 1, 1.0 and True all read 1.0; but equal zeros differ in sign, which it writes, so
    the signs are compared too."""
    samples = list(metric.samples)  # a copy: the family's own list could grow after it is encoded
    try:
        signs = list(map(math.copysign, _ONES, map(_VALUE, samples)))
    except (TypeError, ValueError, OverflowError):  # a value that is no real number: the library says what it is
        signs = None
    kept = _kept_lines.get(metric.name)
    if signs is not None and kept is not None and len(kept[0]) == len(samples):
        lines = kept[1].copy()
        try:
            differs = map(operator.or_, map(operator.ne, samples, kept[0]), map(operator.ne, signs, kept[2]))
            changed = list(itertools.compress(itertools.count(), differs))
        except Exception:  # noqa: BLE001 - a label or value whose comparison fails: every sample is written afresh
            changed = range(len(samples))
    else:
        lines = [""] * len(samples)
        changed = range(len(samples))
    # The text format moves these to separate gauges after the family: left to the library.
    moved = None
    for index in changed:
        sample = samples[index]
        sample_name, labels, value = sample.name, sample.labels, sample.value
        if moved is None:
            name = metric.name
            moved = {name + "_created", name + "_gsum", name + "_gcount"}
        if (
            sample.timestamp is not None
            or sample.exemplar is not None
            or sample.native_histogram is not None
            or value is None
            or sample_name in moved
            or not _plain(sample_name)
        ):
            _kept_lines.pop(metric.name, None)
            return None
        if labels:
            try:
                label_text = _label_texts.get(tuple(labels.items()))
            except TypeError:  # a value that cannot be hashed, hence not text: the library says what it makes of it
                label_text = None
            else:
                if label_text is None:
                    label_text = _label_text(labels)
            if label_text is None:
                _kept_lines.pop(metric.name, None)
                return None
            lines[index] = f"{sample_name}{{{label_text}}} {floatToGoString(value)}\n"
        else:
            lines[index] = f"{sample_name} {floatToGoString(value)}\n"
    if signs is not None:
        if len(_kept_lines) >= MAX_KEPT_FAMILIES and metric.name not in _kept_lines:
            _kept_lines.clear()  # family names churn slowly, if at all; starting over costs one render
        _kept_lines[metric.name] = (samples, lines, signs)
    return "".join(lines)


class MetricsCache:
    """``parts``, when given, returns the registry's families in parts (``ExporterCollector.parts``): a source
    snapshot's families are then encoded once per format and kept while the snapshot is the latest, so a render
    after a state change encodes only what changed; and ``sampled`` (a ``Scheduler.on_sample`` listener) encodes each
    new snapshot that a scraper's next scrape will find the latest right away, off the loop, in every format a
    scraper comes back for, so that scrape finds it done and encodes only the jobs' and the exporter's own series.
    A format counts as scraped periodically until twice its last interval between scrapes has passed (at most
    ``WARM_FOR``): a Prometheus keeps its format warm, a one-off curl or a burst of scrapes does not."""

    WARM_FOR = 300.0  # longer than any scrape interval in use
    WARM_MARGIN = 1.0  # seconds of a scraper's jitter
    # Seconds the encoding ahead waits after a new snapshot for the others of the same round: the sources sharing
    # an interval sample together (``Scheduler``), so one call encodes every new snapshot of the round instead of
    # one call (an executor wake-up, a pass over every snapshot) per source.
    AHEAD_DELAY = 0.005

    def __init__(
        self,
        registry: CollectorRegistry,
        generation: Callable[[], int],
        monotonic: Callable[[], float] = time.monotonic,
        parts: Callable[[], list[Snapshot | Callable[[], Iterable[Metric]]]] | None = None,
    ):
        self._registry = registry
        self._generation = generation
        self._monotonic = monotonic
        self._parts = parts
        self._bodies: dict[tuple[str, bool], tuple[tuple[int, int], bytes]] = {}
        self._pending: dict[tuple[str, bool], asyncio.Future] = {}
        # content type -> (encoder, when last scraped, seconds since the scrape before; None after the first)
        self._scraped: dict[str, tuple[Callable[[CollectorRegistry], bytes], float, float | None]] = {}
        # id(snapshot) -> (the snapshot, its encoding by content type); holding the snapshot keeps its id unique.
        self._fragments: dict[int, tuple[Snapshot, dict[str, str]]] = {}
        self._fragments_lock = threading.Lock()
        self._ahead_due: set[str] = set()  # content types whose encoding ahead is scheduled and not yet started
        self._ahead_tasks: set[asyncio.Task] = set()
        # A call part -> (the families it last returned, their encoding by content type). A part that returns the very
        # same object again (the jobs' families while no job changed, the process' read once a second) is not
        # encoded again; one that builds new families each time is.
        self._kept: dict[Callable, tuple[object, dict[str, str]]] = {}
        # content type -> id(text) -> (the text, its UTF-8 bytes, its deflate segment): the last gzip render's texts.
        self._deflated: dict[str, dict[int, tuple[str, bytes, bytes]]] = {}

    def _key_generation(self) -> tuple[int, int]:
        return self._generation(), int(self._monotonic())

    async def render(self, accept: str | None, accept_encoding: str | None) -> tuple[bytes, dict[str, str]]:
        encoder, content_type = choose_encoder(accept or "")
        now = self._monotonic()
        previous = self._scraped.get(content_type)
        self._scraped[content_type] = (encoder, now, None if previous is None else now - previous[1])
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
            parts = self._parts() if self._parts is not None else None
            if parts is not None and self._encoded_ahead(parts, content_type):
                # Every snapshot's encoding is kept: what is left (the jobs' part, the exporter's own series, gzip)
                # takes a fraction of a millisecond, less than handing it to a thread and back (docs/benchmarks.md).
                body = self._encode(encoder, content_type, use_gzip, parts)
                self._bodies[key] = (generation, body)
                return body, headers
            pending = asyncio.get_running_loop().run_in_executor(
                None, self._encode, encoder, content_type, use_gzip, parts
            )
            self._pending[key] = pending
            try:
                body = await pending
            finally:
                del self._pending[key]
            self._bodies[key] = (generation, body)
            return body, headers
        return await asyncio.shield(pending), headers

    def sampled(self, source: str | None = None, next_in: float | None = None) -> None:
        """Encode the sources' new snapshots ahead of the next scrape, in the formats scraped periodically.

        ``next_in`` is the seconds until the source samples again. A snapshot the source will replace before a
        format's next scrape is due (with ``WARM_MARGIN`` to spare) is not encoded ahead for it: the one that
        replaces it will be. A Prometheus scraping every 15 s then finds the 1 s sources' snapshots of the last
        second or two encoded, not fifteen rounds of encodings it never reads."""
        if self._parts is None:
            return
        now = self._monotonic()
        for content_type, (encoder, scraped_at, interval) in list(self._scraped.items()):
            if now - scraped_at > self.WARM_FOR:
                del self._scraped[content_type]
            elif (
                interval is not None
                and now - scraped_at <= 2 * interval + self.WARM_MARGIN
                and (next_in is None or now + next_in + self.WARM_MARGIN >= scraped_at + interval)
                and _plain_openmetrics(content_type) is not None
                and content_type not in self._ahead_due
            ):
                self._ahead_due.add(content_type)
                task = asyncio.get_running_loop().create_task(self._encode_ahead(encoder, content_type))
                self._ahead_tasks.add(task)
                task.add_done_callback(self._ahead_tasks.discard)

    async def _encode_ahead(self, encoder: Callable[[CollectorRegistry], bytes], content_type: str) -> None:
        await asyncio.sleep(self.AHEAD_DELAY)
        await asyncio.get_running_loop().run_in_executor(None, self._encode_snapshots, encoder, content_type)

    async def settled(self) -> None:
        """Wait for the encoding ahead scheduled so far to be done."""
        while self._ahead_tasks:
            await asyncio.gather(*self._ahead_tasks)

    def _encode_snapshots(self, encoder: Callable[[CollectorRegistry], bytes], content_type: str) -> None:
        """Encode the latest snapshots not encoded yet (all of the round's; a snapshot newer than this call's start
        schedules the next call)."""
        self._ahead_due.discard(content_type)
        try:
            snapshots = [part for part in self._parts() if isinstance(part, Snapshot)]
            for snapshot in snapshots:
                self._fragment(snapshot, encoder, content_type)
            self._keep_fragments(snapshots)
        except Exception:
            log.exception("encoding a new snapshot ahead of the next scrape failed")

    def _encoded_ahead(self, parts: list[Snapshot | Callable[[], Iterable[Metric]]], content_type: str) -> bool:
        """Whether every snapshot among ``parts`` has its encoding in ``content_type`` kept (a format this encoder
        writes itself), so that a render encodes only the call parts."""
        if _plain_openmetrics(content_type) is None:
            return False
        with self._fragments_lock:
            for part in parts:
                if isinstance(part, Snapshot):
                    kept = self._fragments.get(id(part))
                    if kept is None or kept[0] is not part or content_type not in kept[1]:
                        return False
        return True

    def _encode(
        self,
        encoder: Callable[[CollectorRegistry], bytes],
        content_type: str,
        use_gzip: bool,
        parts: list[Snapshot | Callable[[], Iterable[Metric]]] | None = None,
    ) -> bytes:
        openmetrics = _plain_openmetrics(content_type)
        if self._parts is None or openmetrics is None:
            body = encode(self._registry, encoder, content_type)
        else:
            parts = parts if parts is not None else self._parts()
            texts = [
                self._fragment(part, encoder, content_type)
                if isinstance(part, Snapshot)
                else self._call_part(part, encoder, content_type, openmetrics)
                for part in parts
            ]
            self._keep_fragments([part for part in parts if isinstance(part, Snapshot)])
            if openmetrics:
                texts.append(_EOF)
            if use_gzip:
                return self._gzip(texts, content_type)
            body = "".join(texts).encode("utf-8")
        return gzip.compress(body, compresslevel=1) if use_gzip else body

    def _gzip(self, texts: list[str], content_type: str) -> bytes:
        """The texts joined, gzipped: one gzip member whose deflate stream is each text's own segment in turn. A
        segment is compressed from an empty window and ends byte-aligned (``Z_FULL_FLUSH``), so segments join into a
        valid stream (as pigz joins its blocks), and a text kept from the last render (a snapshot's encoding, the
        jobs' families while unchanged) keeps its segment: a render compresses only the texts that changed."""
        previous = self._deflated.get(content_type, {})
        kept: dict[int, tuple[str, bytes, bytes]] = {}
        compressor = None
        segments, crc, size = [GZIP_HEADER], 0, 0
        for text in texts:
            if not text:
                continue
            known = previous.get(id(text))
            if known is None or known[0] is not text:
                data = text.encode("utf-8")
                if compressor is None:
                    compressor = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, -zlib.MAX_WBITS)
                known = (text, data, compressor.compress(data) + compressor.flush(zlib.Z_FULL_FLUSH))
            kept[id(text)] = known
            segments.append(known[2])
            crc = zlib.crc32(known[1], crc)
            size += len(known[1])
        self._deflated[content_type] = kept  # the texts of this render only: the next one reuses what it can
        segments += [_FINAL_BLOCK, struct.pack("<II", crc, size & 0xFFFFFFFF)]
        return b"".join(segments)

    def _fragment(self, snapshot: Snapshot, encoder: Callable[[CollectorRegistry], bytes], content_type: str) -> str:
        with self._fragments_lock:
            encodings = self._fragments.setdefault(id(snapshot), (snapshot, {}))[1]
            text = encodings.get(content_type)
        if text is None:  # two threads may both encode it: the same text, and rarer than a lock held while encoding
            text = encode_families(snapshot_families(snapshot), encoder, bool(_plain_openmetrics(content_type)))
            with self._fragments_lock:
                encodings[content_type] = text
        return text

    def _call_part(
        self,
        part: Callable[[], Iterable[Metric]],
        encoder: Callable[[CollectorRegistry], bytes],
        content_type: str,
        openmetrics: bool,
    ) -> str:
        families = part()
        with self._fragments_lock:
            kept = self._kept.get(part)
            text = kept[1].get(content_type) if kept is not None and kept[0] is families else None
        if text is None:
            text = encode_families(families, encoder, openmetrics)
            if isinstance(families, (list, tuple)):  # a generator is new each time: nothing to keep
                with self._fragments_lock:
                    kept = self._kept.get(part)
                    if kept is None or kept[0] is not families:
                        kept = self._kept[part] = (families, {})
                    kept[1][content_type] = text
        return text

    def _keep_fragments(self, snapshots: list[Snapshot]) -> None:
        """Forget the encodings of snapshots that are no longer the latest."""
        latest = {id(snapshot) for snapshot in snapshots}
        with self._fragments_lock:
            for key in [key for key in self._fragments if key not in latest]:
                del self._fragments[key]
