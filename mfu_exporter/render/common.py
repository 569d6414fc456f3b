"""What the renderers of render/ share: the series-level filter and the one-gauge node summary."""

from __future__ import annotations

from typing import Iterable, Iterator, Mapping

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from mfu_exporter.sources.base import exports


def levelled(families: Iterable[Metric], levels: Mapping[str, str], series: str) -> Iterator[Metric]:
    """The families a source set to ``series: level`` exports, by the level its table tags each with."""
    return (family for family in families if exports(series, levels[family.name]))


def node_gauge(name: str, text: str, value: float | None) -> Iterator[Metric]:
    """A node summary that is one gauge without labels, absent while ``value`` is None (no window yet)."""
    if value is not None:
        family = GaugeMetricFamily(name, text)
        family.add_metric([], value)
        yield family
