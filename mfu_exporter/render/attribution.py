"""The attribution's standings (``mfu_exporter.model.attribution.Attributor.standings``) as metric families."""

from __future__ import annotations

from typing import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from mfu_exporter.model.attribution import CAUSES, JobStanding


def attribution_families(standings: Iterable[JobStanding], unobserved_seconds: float = 0.0) -> Iterable[Metric]:
    label = ["training_job", "cause"]
    bottleneck = GaugeMetricFamily(
        "mfu_job_bottleneck",
        "1 for the cause the job's MFU gap is attributed to now, 0 for the others.",
        labels=label,
    )
    lost = CounterMetricFamily(
        "mfu_job_lost_gpu_seconds",
        "GPU-seconds lost below the job's baseline MFU, by cause: GPUs × (baseline − MFU) ÷ baseline over time.",
        labels=label,
    )
    # The shard's attribution reads these two (one series per job, a few more while causes change), not the
    # counters and bottleneck above (a series per cause).
    rates = GaugeMetricFamily(
        "mfu_job_lost_gpu_seconds_per_second",
        "GPU-seconds lost per second over the last 5 minutes, by cause: the causes that lost some in that window.",
        labels=label,
    )
    blamed = GaugeMetricFamily(
        "mfu_job_blamed_lost_gpu_seconds_per_second",
        "The cause the job's gap is attributed to now, and the GPU-seconds it lost per second over the last 5 minutes.",
        labels=label,
    )
    baseline = GaugeMetricFamily(
        "mfu_job_baseline_mfu_ratio",
        "The job's healthy MFU: expected_mfu, or a high percentile of its recent MFU.",
        labels=["training_job"],
    )
    for standing in standings:
        name = standing.job
        for cause, seconds in standing.lost_seconds:
            lost.add_metric([name, cause], seconds)
        for cause, rate in standing.loss_rates:
            if rate > 0:
                rates.add_metric([name, cause], rate)
        verdict = standing.verdict
        if verdict is None:
            continue
        for cause in CAUSES:
            bottleneck.add_metric([name, cause], 1.0 if cause == verdict.cause else 0.0)
        blamed.add_metric([name, verdict.cause], standing.blamed_rate() or 0.0)
        if verdict.baseline is not None:
            baseline.add_metric([name], verdict.baseline)
    unobserved = CounterMetricFamily(
        "mfu_exporter_unobserved_seconds",
        "Seconds the exporter did not run its evaluation (stopped, starved, suspended), booked to no job's cause.",
        value=unobserved_seconds,
    )
    return (bottleneck, lost, rates, blamed, baseline, unobserved)
