"""The discovery source's sample (``mfu_exporter.sources.discovery.DiscoverySample``) as metric families."""

from __future__ import annotations

from collections import Counter
from typing import Iterable

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from mfu_exporter.sources.discovery import DiscoverySample


def discovery_families(sample: DiscoverySample) -> Iterable[Metric]:
    counts = Counter(job.scheduler for job in sample.jobs.values())
    family = GaugeMetricFamily(
        "mfu_discovery_jobs",
        "Jobs holding GPUs on this node that discovery found, by scheduler.",
        labels=["scheduler"],
    )
    for scheduler in ("kubernetes", "slurm", "mixed"):
        family.add_metric([scheduler], float(counts.get(scheduler, 0)))
    yield family
