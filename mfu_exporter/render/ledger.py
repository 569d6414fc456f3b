"""The jobs' time ledgers (``mfu_exporter.model.ledger``) as metric families: GPU-seconds by kind, goodput, effective
MFU, the step-time histogram with its ideal, and restarts. At most 27 series per job: the node's series budget leaves
the ledger 30 per job (tests/unit/test_series_budget.py)."""

from __future__ import annotations

import math
from typing import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString

from mfu_exporter.model.job_view import JobView
from mfu_exporter.model.ledger import KINDS, STEP_BUCKETS

BOUNDS = (*(floatToGoString(b) for b in STEP_BUCKETS), "+Inf")


def ledger_families(views: Iterable[JobView]) -> Iterable[Metric]:
    """Families for every job whose ledger is known (a run with progress, or its client's start)."""
    label = ["training_job"]
    gpu_seconds = CounterMetricFamily(
        "mfu_job_gpu_seconds",
        "GPU-seconds of the job on this node by kind (productive, wasted, startup, checkpoint_save, "
        "checkpoint_load, down, stalled): the kinds partition its time here since its first run, so they sum to "
        "wall time × its GPUs here.",
        labels=["training_job", "kind"],
    )
    goodput = GaugeMetricFamily(
        "mfu_job_goodput_ratio",
        "Productive GPU-seconds ÷ all the job's GPU-seconds on this node, over its life here (0–1).",
        labels=label,
    )
    effective = GaugeMetricFamily(
        "mfu_job_effective_mfu_ratio",
        "The job's MFU × its goodput ratio: the share of its GPUs' peak that went into steps that advanced it.",
        labels=label,
    )
    steps = HistogramMetricFamily(
        "mfu_job_step_duration_seconds",
        "Seconds per training step, from the intervals between progress reports with no save, load or stall "
        "(an interval of n steps counts n steps of its mean).",
        labels=label,
    )
    ideal = GaugeMetricFamily(
        "mfu_job_step_ideal_seconds",
        "The job's ideal step time: the median of its recent steady steps.",
        labels=label,
    )
    over = CounterMetricFamily(
        "mfu_job_step_over_ideal_seconds",
        "Seconds the job's steady steps took beyond its ideal step time.",
        labels=label,
    )
    restarts = CounterMetricFamily(
        "mfu_job_restarts",
        "Runs of the job that started on this node after its first one seen by this exporter.",
        labels=label,
    )
    for view in views:
        ledger = view.ledger
        if ledger is None:
            continue
        key = [view.name]
        for kind in KINDS:
            gpu_seconds.add_metric([view.name, kind], ledger.gpu_seconds[kind])
        restarts.add_metric(key, ledger.restarts)
        over.add_metric(key, ledger.over_ideal_seconds)
        steps.add_metric(key, list(zip(BOUNDS, ledger.step_buckets)), ledger.step_sum)
        if ledger.ideal_step_seconds is not None and math.isfinite(ledger.ideal_step_seconds):
            ideal.add_metric(key, ledger.ideal_step_seconds)
        if ledger.goodput is not None:
            goodput.add_metric(key, ledger.goodput)
            if view.mfu is not None:
                effective.add_metric(key, view.mfu * ledger.goodput)
    return (gpu_seconds, goodput, effective, steps, ideal, over, restarts)
