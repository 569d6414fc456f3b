"""Checkpoint writes per job (``mfu_exporter.sources.checkpoint.CheckpointSample``: the tracker's totals at a sample) as
metric families."""

from __future__ import annotations

from typing import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString

from mfu_exporter.model.checkpoints import DURATION_BUCKETS, JobTotals
from mfu_exporter.render.common import levelled
from mfu_exporter.sources.checkpoint import FAMILY_LEVELS, CheckpointSample


def checkpoint_sample_families(sample: CheckpointSample) -> Iterable[Metric]:
    return levelled(checkpoint_families(sample.totals, sample.at), FAMILY_LEVELS, sample.series)


def checkpoint_families(totals: dict[str, JobTotals], at: float = 0.0) -> Iterable[Metric]:
    """The families of ``totals``; a write in progress is as old as it is at ``at`` (the sample's time)."""
    label = ["training_job"]
    duration = HistogramMetricFamily(
        "mfu_checkpoint_write_duration_seconds", "Duration of successful checkpoint writes.", labels=label
    )
    writes = CounterMetricFamily(
        "mfu_checkpoint_writes", "Checkpoint writes that ended, successful or failed.", labels=label
    )
    failures = CounterMetricFamily(
        "mfu_checkpoint_write_failures", "Checkpoint writes that failed, were deleted or timed out.", labels=label
    )
    written = CounterMetricFamily(
        "mfu_checkpoint_written_bytes", "Bytes of successful checkpoint writes.", labels=label
    )
    in_progress = GaugeMetricFamily(
        "mfu_checkpoint_in_progress", "1 while a checkpoint write of the job is in progress.", labels=label
    )
    in_progress_seconds = GaugeMetricFamily(
        "mfu_checkpoint_in_progress_seconds",
        "How long the oldest checkpoint write of the job in progress has run; 0 while none is.",
        labels=label,
    )
    last_success = GaugeMetricFamily(
        "mfu_checkpoint_last_success_timestamp_seconds",
        "Unix time the last successful checkpoint write ended.",
        labels=label,
    )
    last_duration = GaugeMetricFamily(
        "mfu_checkpoint_last_duration_seconds", "Duration of the last successful checkpoint write.", labels=label
    )
    bandwidth = GaugeMetricFamily(
        "mfu_checkpoint_last_write_bandwidth_bytes_per_second",
        "Bytes per second of the last successful checkpoint write whose size is known.",
        labels=label,
    )
    bounds = [floatToGoString(b) for b in DURATION_BUCKETS] + ["+Inf"]
    for job, job_totals in sorted(totals.items()):
        key = [job]
        duration.add_metric(key, list(zip(bounds, job_totals.cumulative_buckets)), job_totals.duration_sum)
        writes.add_metric(key, job_totals.writes)
        failures.add_metric(key, job_totals.failures)
        written.add_metric(key, job_totals.written_bytes)
        in_progress.add_metric(key, 1.0 if job_totals.in_progress else 0.0)
        since = job_totals.in_progress_since
        in_progress_seconds.add_metric(key, max(at - since, 0.0) if since is not None else 0.0)
        if job_totals.last_success is not None and job_totals.last_duration is not None:  # set together
            last_success.add_metric(key, job_totals.last_success)
            last_duration.add_metric(key, job_totals.last_duration)
        if job_totals.last_bandwidth is not None:
            bandwidth.add_metric(key, job_totals.last_bandwidth)
    return (
        duration,
        writes,
        failures,
        written,
        in_progress,
        in_progress_seconds,
        last_success,
        last_duration,
        bandwidth,
    )
