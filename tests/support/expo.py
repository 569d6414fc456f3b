"""Reading expositions in tests: the samples of a text body or of a source's snapshot, as Prometheus parses them."""

from __future__ import annotations

from typing import Any, Iterable

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from mfu_exporter.render.snapshots import snapshot_families

Labels = tuple[tuple[str, str], ...]
Samples = dict[tuple[str, Labels], float]


def samples(text: str) -> Samples:
    """``{(sample name, sorted label pairs): value}`` for every sample of a text exposition."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def labels(**pairs: str) -> Labels:
    """The key ``samples`` uses for these labels."""
    return tuple(sorted(pairs.items()))


def matching(found: Samples, name: str, **wanted: str) -> list[float]:
    """Values of the samples called ``name`` whose labels include ``wanted`` (other labels may be there too)."""
    return [
        value
        for (sample, pairs), value in found.items()
        if sample == name and all(dict(pairs).get(k) == v for k, v in wanted.items())
    ]


class _Families:
    def __init__(self, families: Iterable[Metric]):
        self.families = list(families)

    def collect(self) -> list[Metric]:
        return self.families


def render(families: Iterable[Metric]) -> str:
    """The text exposition prometheus_client writes for ``families``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))
    return generate_latest(registry).decode()


def exposition(snapshot: Any) -> str:
    """The text exposition of a source's snapshot, as a scrape would carry it."""
    return render(snapshot_families(snapshot))


def snapshot_samples(snapshot: Any) -> Samples:
    """``samples`` of a snapshot's families."""
    return samples(exposition(snapshot))


def snapshot_value(snapshot: Any, name: str, **pairs: str) -> float | None:
    """The value of the one sample ``name`` with exactly these labels in a snapshot; None when it is absent."""
    return snapshot_samples(snapshot).get((name, labels(**pairs)))
