"""The job model's families: each job's MFU, rate, counters, state and hardware figures, from its ``JobView``."""

from __future__ import annotations

from typing import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily

from mfu_exporter.model.job_view import JobView
from mfu_exporter.model.progress import STATES


def job_families(views: list[JobView]) -> Iterable:
    """Per-job metric families; every series is labelled ``training_job`` (``job`` is Prometheus's own).

    An ended job keeps its counters (tokens, FLOPs), step, last report time, FLOPs per token, info and state until
    it is forgotten; its rate, MFU, ETA, peak and GPU count go at once. A window whose MFU came out above 1 exports
    no MFU and no peak, so the cluster-wide MFU rule (which counts nodes exporting both halves) leaves it out too.
    """
    label = ["training_job"]
    tokens = CounterMetricFamily(
        "mfu_job_tokens",
        "Tokens this job has processed on this node since this exporter (or one before it, with state.dir) first "
        "counted it, tokens trained again after restarts from checkpoints included.",
        labels=label,
    )
    flops = CounterMetricFamily(
        "mfu_job_model_flops", "Model FLOPs done by this job on this node: FLOPs per token × tokens.", labels=label
    )
    peak = GaugeMetricFamily(
        "mfu_job_peak_flops", "Dense peak FLOP/s of this job's GPUs on this node, for its dtype.", labels=label
    )
    gpus = GaugeMetricFamily("mfu_job_gpus", "GPUs this job uses on this node.", labels=label)
    rate = GaugeMetricFamily("mfu_job_tokens_per_second", "Tokens per second over the MFU window.", labels=label)
    mfu = GaugeMetricFamily(
        "mfu_model_flops_utilization_ratio", "Model FLOPs utilization over the MFU window (0–1).", labels=label
    )
    step = GaugeMetricFamily("mfu_job_step", "Training step of the newest progress report.", labels=label)
    last = GaugeMetricFamily(
        "mfu_job_last_report_timestamp_seconds", "Unix time of the newest progress report.", labels=label
    )
    per_token = GaugeMetricFamily(
        "mfu_job_flops_per_token",
        "Model FLOPs per token: 6·P plus the attention term when the shape is known.",
        labels=label,
    )
    eta = GaugeMetricFamily("mfu_job_eta_seconds", "Seconds until target_tokens at the current rate.", labels=label)
    state = GaugeMetricFamily(
        "mfu_job_state",
        "1 for the job's state as its newest progress report gave it (running, finished, failed, cancelled), 0 for the others.",
        labels=["training_job", "state"],
    )
    framework = GaugeMetricFamily(
        "mfu_job_framework_mfu_ratio",
        "The MFU the training framework printed in its log (0–1), or its printed TFLOP/s per GPU over this node's "
        "per-GPU peak; by the framework's FLOPs convention, beside ours.",
        labels=label,
    )
    info = InfoMetricFamily(
        "mfu_job",
        "Facts of the job that are not numbers, one series per pod (or Slurm job) discovery found it in: how it was "
        "found, its scheduler, namespace, pod, Slurm job ID and user, for joins.",
        labels=label,
    )
    hardware = GaugeMetricFamily(
        "mfu_job_hardware_flops_utilization_ratio",
        "Hardware estimate of the job's FLOPs utilization: mean over its GPUs here of GPM tensor activity × SM clock ÷ "
        "the SKU's reference clock (0–1); beside the formula MFU, and the only figure for a job that reports nothing.",
        labels=label,
    )
    gpu_util = GaugeMetricFamily(
        "mfu_job_gpu_utilization_ratio", "Mean NVML GPU utilization over the job's GPUs here (0–1).", labels=label
    )
    tensor = GaugeMetricFamily(
        "mfu_job_tensor_active_ratio", "Mean GPM tensor activity over the job's GPUs here (0–1).", labels=label
    )
    job_gpu = InfoMetricFamily(
        "mfu_job_gpu",
        "1 for each GPU of this node the job holds, as discovery or its gpus list says: one job-GPU series, never a "
        "training_job label on every GPU series.",
        labels=label,
    )
    data_wait = CounterMetricFamily(
        "mfu_job_data_wait_seconds",
        "GPU-seconds this job's training loop waited for its next batch on this node: one rank's wait (its client's "
        "data_wait_seconds, or its framework's data-loading timer) times the job's GPUs here.",
        labels=label,
    )
    data_wait_ratio = GaugeMetricFamily(
        "mfu_job_data_wait_ratio",
        "Share of wall time this job's training loop spent waiting for its next batch over the MFU window (0-1).",
        labels=label,
    )
    for view in views:
        key = [view.name]
        if view.data_wait is not None:
            # A counter stays while the job is known, ended or not (gaps in a counter read as resets).
            data_wait.add_metric(key, view.data_wait.gpu_seconds)
        if view.reported:
            # A node of the job that sees no progress (its log has none: the framework prints on another rank)
            # exports no token or FLOPs counters, so the cluster rules count only the nodes that measure. A job only
            # discovered has none either: its hardware figures stand in.
            # Its _created (OpenMetrics) is when these counters began: at the job's first count here, or where an
            # earlier exporter began them (state.dir), so a scraper can tell a new series from a reset.
            tokens.add_metric(key, view.tokens_processed, created=view.counter_created)
        if view.discovered is None or "reported" in view.found_by:
            last.add_metric(key, view.last_report_time)
        for name in STATES:
            state.add_metric([view.name, name], 1.0 if name == view.state else 0.0)
        base = {"dtype": str(view.facts.get("dtype", "bf16")), "found_by": ",".join(view.found_by)}
        pods = view.discovered.pods if view.discovered else ()
        for pod in pods or (None,):
            info.add_metric(
                key,
                {
                    **base,
                    "scheduler": pod.scheduler if pod else "",
                    "namespace": pod.namespace if pod else "",
                    "pod": pod.pod if pod else "",
                    "slurm_job_id": pod.slurm_job_id if pod else "",
                    "user": pod.user if pod else "",
                },
            )
        if view.step is not None:
            step.add_metric(key, view.step)
        if view.flops_per_token is not None:
            per_token.add_metric(key, view.flops_per_token)
        # A node of the job that sees no progress exports no FLOPs counter either (see tokens above).
        if view.model_flops is not None and view.reported:
            flops.add_metric(key, view.model_flops, created=view.counter_created)
        if not view.running:
            continue
        # A job that ended holds no GPUs here any more, so neither the job-GPU series nor the GPUs' figures stay.
        for index in view.gpu_indices or ():
            job_gpu.add_metric(key, {"gpu": str(index)})
        if view.hardware is not None:
            for family, value in (
                (hardware, view.hardware.hardware_flops_utilization),
                (gpu_util, view.hardware.gpu_utilization),
                (tensor, view.hardware.tensor_active),
            ):
                if value is not None:
                    family.add_metric(key, value)
        if view.peak_flops is not None and view.implausible_mfu is None:
            peak.add_metric(key, view.peak_flops)
        if view.gpus is not None:
            gpus.add_metric(key, view.gpus)
        if view.tokens_per_second is not None:
            rate.add_metric(key, view.tokens_per_second)
        if view.mfu is not None:
            mfu.add_metric(key, view.mfu)
        if view.eta_seconds is not None:
            eta.add_metric(key, view.eta_seconds)
        # A framework dividing by a wrong peak prints impossible figures (torchtitan's A100 fallback: 563 %).
        if view.framework_mfu is not None and 0.0 <= view.framework_mfu <= 1.0:
            framework.add_metric(key, view.framework_mfu)
        if view.data_wait is not None and view.data_wait.ratio is not None:
            data_wait_ratio.add_metric(key, view.data_wait.ratio)
    return (
        tokens,
        flops,
        peak,
        gpus,
        rate,
        mfu,
        step,
        last,
        per_token,
        eta,
        state,
        framework,
        info,
        hardware,
        gpu_util,
        tensor,
        job_gpu,
        data_wait,
        data_wait_ratio,
    )
