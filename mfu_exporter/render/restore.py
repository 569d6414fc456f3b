"""Checkpoint restores per job (``mfu_exporter.model.restore``) as metric families: the read side of the checkpoint
plane, beside the checkpoint source's write families."""

from __future__ import annotations

from typing import Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from mfu_exporter.model.restore import RestoreTotals


def restore_families(totals: Mapping[str, RestoreTotals]) -> Iterator[Metric]:
    if not totals:
        return
    label = ["training_job"]
    loads = CounterMetricFamily(
        "mfu_checkpoint_loads", "Checkpoint loads (restores) of the job that ended on this node.", labels=label
    )
    seconds = CounterMetricFamily(
        "mfu_checkpoint_load_seconds",
        "Seconds the job spent loading checkpoints (its ledger's checkpoint_load).",
        labels=label,
    )
    read = CounterMetricFamily(
        "mfu_checkpoint_load_read_bytes",
        "Bytes the mounts holding the job's checkpoints read during its loads (loads the storage source covered).",
        labels=label,
    )
    last = GaugeMetricFamily(
        "mfu_checkpoint_last_load_duration_seconds", "Duration of the job's last checkpoint load.", labels=label
    )
    bandwidth = GaugeMetricFamily(
        "mfu_checkpoint_last_load_read_bandwidth_bytes_per_second",
        "Bytes read ÷ duration of the job's last checkpoint load; absent when its bytes are unknown.",
        labels=label,
    )
    for job, total in sorted(totals.items()):
        loads.add_metric([job], total.loads)
        seconds.add_metric([job], total.seconds)
        read.add_metric([job], total.read_bytes)
        if total.last_seconds is not None:
            last.add_metric([job], total.last_seconds)
        if total.last_bandwidth is not None:
            bandwidth.add_metric([job], total.last_bandwidth)
    yield from (family for family in (loads, seconds, read, last, bandwidth) if family.samples)
