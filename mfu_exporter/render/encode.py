"""The fast encoder: metric families to the text format or OpenMetrics 1.0, the bytes prometheus_client writes.

Most of a render was prometheus_client's encoder checking and escaping every name of every sample (character by
character for OpenMetrics). ``Encoder`` writes the very same bytes about three times faster for what this exporter
produces (gauge, counter, info and histogram families with plain names, no timestamps or exemplars) and hands
anything else to the library's encoder, family by family (docs/benchmarks.md). What it keeps between encodings (the
names it found plain, label texts, each family's last sample lines) is its own, bounded, so each service's encoder
is independent of every other's.

A gzip body is one gzip member whose deflate stream joins segments compressed one per fragment
(``deflate_segment``, ``gzip_member``): a fragment keeps its segment, so a body compresses only what changed.
"""

from __future__ import annotations

import itertools
import math
import operator
import re
import struct
import zlib
from typing import Callable, Iterable

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString

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
EOF = "# EOF\n"
GZIP_LEVEL = 1  # a scrape's body compresses ~6x at level 1; higher levels cost more CPU than the bytes they save
# A gzip member's header (RFC 1952): deflate, no flags, no time, XFL 4 (the fastest level), OS unknown; and the final
# empty block that ends a deflate stream made of full-flush segments.
GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x04\xff"
_FINAL_BLOCK = b"\x03\x00"
_ONES = itertools.repeat(1.0)
_VALUE = operator.itemgetter(2)  # Sample.value

Library = Callable[[CollectorRegistry], bytes]  # prometheus_client's encoder of a format (``choose_encoder``)


def _content_type_parameters(content_type: str) -> dict[str, str]:
    parameters = {}
    for parameter in content_type.split(";")[1:]:
        key, _, value = parameter.strip().partition("=")
        parameters[key] = value
    return parameters


def plain_openmetrics(content_type: str) -> bool | None:
    """Whether ``content_type`` is OpenMetrics 1.0 (True) or the text format (False) with names written as they
    are, which ``Encoder`` writes; None for the rest, which only the library's encoder writes."""
    parameters = _content_type_parameters(content_type)
    openmetrics = content_type.startswith(OPENMETRICS)
    if parameters.get("escaping", "underscores") not in PLAIN_NAME_ESCAPINGS or (
        openmetrics and parameters.get("version") != "1.0.0"
    ):
        return None
    return openmetrics


def deflate_segment(data: bytes) -> bytes:
    """``data`` as a deflate segment that joins others into one stream: compressed from an empty window and ended
    byte-aligned (``Z_FULL_FLUSH``), as pigz joins its blocks."""
    compressor = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, -zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush(zlib.Z_FULL_FLUSH)


def gzip_member(pieces: Iterable[tuple[bytes, bytes]]) -> bytes:
    """One gzip member of the pieces' data, in order, from their deflate segments (``deflate_segment``)."""
    segments, crc, size = [GZIP_HEADER], 0, 0
    for data, segment in pieces:
        if data:
            segments.append(segment)
            crc = zlib.crc32(data, crc)
            size += len(data)
    segments += [_FINAL_BLOCK, struct.pack("<II", crc, size & 0xFFFFFFFF)]
    return b"".join(segments)


EOF_PIECE = (EOF.encode("utf-8"), deflate_segment(EOF.encode("utf-8")))  # OpenMetrics' closing line, compressed once


def encode(registry: CollectorRegistry, library: Library, content_type: str, encoder: Encoder | None = None) -> bytes:
    """The bytes ``library`` (with ``content_type``, both from ``choose_encoder``) makes of ``registry``."""
    openmetrics = plain_openmetrics(content_type)
    if openmetrics is None:
        return library(registry)
    text = (encoder or Encoder()).families(registry.collect(), library, openmetrics)
    return (text + (EOF if openmetrics else "")).encode("utf-8")


def encode_families(
    families: Iterable[Metric], library: Library, openmetrics: bool, encoder: Encoder | None = None
) -> str:
    """The families as ``library`` writes them, without OpenMetrics' closing ``# EOF``."""
    return (encoder or Encoder()).families(families, library, openmetrics)


class _OneFamily:
    """A registry of one family, for the library's encoder."""

    def __init__(self, metric: Metric):
        self._metric = metric

    def collect(self) -> list[Metric]:
        return [self._metric]


class Encoder:
    """Writes families as prometheus_client's encoders do, keeping what repeats from one encoding to the next.

    One per service (``build_service``): from one sample of a source to the next most series keep their names,
    labels and values, so their lines are kept by family name with the samples they were written from. Each kept
    table is bounded and starts over when full, which costs one encoding. Encodings may run in several threads at
    once: each table is read and replaced whole per entry, which the GIL keeps consistent."""

    MAX_PLAIN_NAMES = 65536  # names found plain; the names this exporter writes are a few hundred
    MAX_LABEL_TEXTS = 65536  # label sets kept; a full node has about 1,300
    MAX_KEPT_FAMILIES = 4096  # families whose lines are kept, by name; a full node has about 60

    def __init__(self) -> None:
        self._plain_names: set[str] = set()
        self._label_texts: dict[tuple, str] = {}
        # family name -> (the samples last written, their lines, the signs of their values)
        self._kept_lines: dict[str, tuple[list, list[str], list[float]]] = {}

    def families(self, families: Iterable[Metric], library: Library, openmetrics: bool) -> str:
        """The families as ``library`` writes them, without OpenMetrics' closing ``# EOF``."""
        parts = []
        for metric in families:
            text = self._family(metric, openmetrics)
            if text is None:
                text = library(_OneFamily(metric)).decode("utf-8")
                if openmetrics:
                    text = text.removesuffix(EOF)
            parts.append(text)
        return "".join(parts)

    def _plain(self, name: str) -> bool:
        if name in self._plain_names:
            return True
        if _PLAIN_NAME.fullmatch(name) is None or name.startswith("__"):
            return False
        if len(self._plain_names) >= self.MAX_PLAIN_NAMES:
            self._plain_names.clear()
        self._plain_names.add(name)
        return True

    def _label_text(self, labels: dict[str, str]) -> str | None:
        """``a="1",b="2"`` as both formats write a sample's labels; None when a name is not plain or a value not
        text. Kept by label set: a node's series keep their labels from one encoding to the next."""
        pairs = []
        for label, value in sorted(labels.items()):
            if type(value) is not str or not self._plain(label):
                return None
            escaped = value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
            pairs.append(f'{label}="{escaped}"')
        if len(self._label_texts) >= self.MAX_LABEL_TEXTS:
            self._label_texts.clear()  # label sets churn slowly (jobs come and go); starting over costs one render
        text = self._label_texts[tuple(labels.items())] = ",".join(pairs)
        return text

    def _family(self, metric: Metric, openmetrics: bool) -> str | None:
        """The family in the text format or OpenMetrics 1.0, as prometheus_client writes it; None when it needs what
        only the library does (an unusual type or name, timestamps, exemplars, native histograms, _created samples)."""
        name = metric.name
        text_type = _TEXT_TYPES.get(metric.type)
        if text_type is None or not self._plain(name):
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
        body = self._sample_lines(metric)
        if body is None:
            return None
        lines.append(body)
        return "".join(lines)

    def _sample_lines(self, metric: Metric) -> str | None:
        """The family's sample lines, the same in both formats; None when a sample needs the library.

        A sample equal to the one kept at its place is written as it was. Which samples differ is found by C-level
        comparisons (``map``), so a family costs a Python-level write only for its changed samples. Equal samples
        are written the same: ``floatToGoString`` writes ``float(value)``, so 1, 1.0 and True all read 1.0; but
        equal zeros differ in sign, which it writes, so the signs are compared too."""
        kept_lines = self._kept_lines
        samples = list(metric.samples)  # a copy: the family's own list could grow after it is encoded
        try:
            signs = list(map(math.copysign, _ONES, map(_VALUE, samples)))
        except (TypeError, ValueError, OverflowError):  # a value that is no real number: the library says what it is
            signs = None
        kept = kept_lines.get(metric.name)
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
        label_texts = self._label_texts
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
                or not self._plain(sample_name)
            ):
                kept_lines.pop(metric.name, None)
                return None
            if labels:
                try:
                    label_text = label_texts.get(tuple(labels.items()))
                except TypeError:  # a value that cannot be hashed, hence not text: the library says what it makes of it
                    label_text = None
                else:
                    if label_text is None:
                        label_text = self._label_text(labels)
                if label_text is None:
                    kept_lines.pop(metric.name, None)
                    return None
                lines[index] = f"{sample_name}{{{label_text}}} {floatToGoString(value)}\n"
            else:
                lines[index] = f"{sample_name} {floatToGoString(value)}\n"
        if signs is not None:
            if len(kept_lines) >= self.MAX_KEPT_FAMILIES and metric.name not in kept_lines:
                kept_lines.clear()  # family names churn slowly, if at all; starting over costs one render
            kept_lines[metric.name] = (samples, lines, signs)
        return "".join(lines)
