"""Render /metrics bodies at most once per new state, off the event loop, and serve cached bytes.

prometheus_client's ``generate_latest`` costs milliseconds for a full node; doing it per scrape, on the loop,
would make 16 concurrent scrapers queue behind each other. Bodies are cached per (format, gzip) and keyed on a
generation that changes when any snapshot or job changes, and at least once a second (MFU depends on time).

A scrape after a state change (every scrape of a Prometheus scraping every 15 s) waits for a render, and most of a
render was prometheus_client's encoder checking and escaping every name of every sample (character by character
for OpenMetrics). ``encode`` writes the very same bytes about three times faster for what this exporter produces
(gauge, counter, info and histogram families with plain names, no timestamps or exemplars) and hands anything else
to the library's encoder, family by family (docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import gzip
import re
import time
from typing import Callable

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString

OPENMETRICS = "application/openmetrics-text"
# Escapings under which a plain name is written as it is. (``dots`` doubles underscores; ``values`` prefixes U__.)
PLAIN_NAME_ESCAPINGS = frozenset({"underscores", "allow-utf-8"})
# A name no encoder or escaping changes: OpenMetrics writes sample names through its label-name escaper, which
# turns ':' into '_', and a label name starting with '__' is reserved, quoted under allow-utf-8.
_PLAIN_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# Family types written here, with their type in the text format and the suffix it adds to the family name.
_TEXT_TYPES = {"gauge": ("gauge", ""), "counter": ("counter", "_total"), "info": ("gauge", "_info"),
               "histogram": ("histogram", "")}
_EOF = "# EOF\n"
_plain_names: set[str] = set()  # names seen to be plain; a few hundred at most, the names this exporter writes


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


def encode(registry: CollectorRegistry, encoder: Callable[[CollectorRegistry], bytes], content_type: str) -> bytes:
    """The bytes ``encoder`` (with ``content_type``, both from ``choose_encoder``) makes of ``registry``."""
    parameters = _content_type_parameters(content_type)
    openmetrics = content_type.startswith(OPENMETRICS)
    if parameters.get("escaping", "underscores") not in PLAIN_NAME_ESCAPINGS or (openmetrics and parameters.get("version") != "1.0.0"):
        return encoder(registry)
    parts = []
    for metric in registry.collect():
        text = _encode_family(metric, openmetrics)
        if text is None:
            text = encoder(_OneFamily(metric)).decode("utf-8")
            if openmetrics:
                text = text.removesuffix(_EOF)
        parts.append(text)
    if openmetrics:
        parts.append(_EOF)
    return "".join(parts).encode("utf-8")


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
        documentation = documentation.replace('"', r'\"')
        lines = [f"# HELP {name} {documentation}\n# TYPE {name} {metric.type}\n"]
        if metric.unit:
            lines.append(f"# UNIT {name} {metric.unit}\n")
    else:
        family_name = name + text_type[1]
        lines = [f"# HELP {family_name} {documentation}\n# TYPE {family_name} {text_type[0]}\n"]
    # The text format moves these to separate gauges after the family: left to the library.
    moved = {name + "_created", name + "_gsum", name + "_gcount"}
    for sample in metric.samples:
        sample_name, labels, value = sample.name, sample.labels, sample.value
        if (sample.timestamp is not None or sample.exemplar is not None or sample.native_histogram is not None
                or value is None or sample_name in moved or not _plain(sample_name)):
            return None
        if labels:
            pairs = []
            for label, label_value in sorted(labels.items()):
                if type(label_value) is not str or not _plain(label):
                    return None
                escaped = label_value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')
                pairs.append(f'{label}="{escaped}"')
            lines.append(f"{sample_name}{{{','.join(pairs)}}} {floatToGoString(value)}\n")
        else:
            lines.append(f"{sample_name} {floatToGoString(value)}\n")
    return "".join(lines)


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
            pending = asyncio.get_running_loop().run_in_executor(None, self._encode, encoder, content_type, use_gzip)
            self._pending[key] = pending
            try:
                body = await pending
            finally:
                del self._pending[key]
            self._bodies[key] = (generation, body)
            return body, headers
        return await asyncio.shield(pending), headers

    def _encode(self, encoder: Callable[[CollectorRegistry], bytes], content_type: str, use_gzip: bool) -> bytes:
        body = encode(self._registry, encoder, content_type)
        return gzip.compress(body, compresslevel=1) if use_gzip else body
