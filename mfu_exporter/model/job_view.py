"""A job's MFU view: from its state (``mfu_exporter.model.job.Job``) and this node's GPUs, its rate, GPUs, peak, MFU,
ETA and the reason it has none, at one instant (``JobView``, for metrics, JSON and the status page).

MFU over the window = FLOPs/token × Δtokens/Δt ÷ (job GPUs here × dense peak), with Δ taken between the oldest and
newest report inside the window, at least ``REPORT_RESOLUTION_SECONDS`` apart. A rate needs a time step of a second
or more, so every figure is finite. An MFU above 1 is more FLOP/s than the GPUs' peak, so one of the job's facts is
wrong: that window is not exported and the job's reason says which fact to suspect.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from mfu_exporter.model import flops as mfu_math
from mfu_exporter.model.datawait import RECENT_SECONDS, DataWaitView
from mfu_exporter.model.discovery_jobs import DiscoveredJob, HardwareFigures, hardware_figures
from mfu_exporter.model.job import Job, gpu_facts
from mfu_exporter.model.ledger import LedgerView
from mfu_exporter.model.progress import (
    FACT_DEFAULTS,
    FACT_KEYS,
    MODEL_KEYS,
    REPORT_RESOLUTION_SECONDS,
    RUNNING,
    rate_window,
    stall_after,
)
from mfu_exporter.model.readings import GpuInfo, GpuReading

# The ledger's states in which no step of the job runs on this node, and what each means for its MFU (0).
NOT_TRAINING = {
    "down": "no run of the job is alive on this node (its process ended)",
    "startup": "a new run of the job is starting (no step yet)",
    "checkpoint_load": "a new run of the job is loading its checkpoint",
}


@dataclass
class JobView:
    """A job's state at one instant, for metrics, JSON and the status page."""

    name: str
    tokens_total: float
    step: int | None
    last_report_time: float
    tokens_per_second: float | None
    flops_per_token: float | None
    gpus: int | None
    peak_flops: float | None
    mfu: float | None
    eta_seconds: float | None
    reason: str | None
    facts: dict[str, Any]
    restarts: int
    gpu_indices: list[int] | None = None
    found_by: tuple[str, ...] = ()  # reported, config, kubernetes, slurm
    discovered: DiscoveredJob | None = None
    hardware: HardwareFigures | None = None
    replayed_tokens: float = 0.0
    state: str = RUNNING
    runs: int = 1
    tokens_processed: float = 0.0  # monotonic: tokens of earlier runs, the reported total and replayed tokens
    model_flops: float | None = None  # the FLOPs counter; None until the job's FLOPs per token are known
    implausible_mfu: float | None = None  # an MFU above 1, withheld from the metrics (``reason`` says why)
    reported: bool = True  # False for a job known only by name (checkpoints, a log with no progress lines yet)
    framework_mfu: float | None = None  # the framework's own MFU (printed, or its TFLOP/s/GPU over our peak)
    framework_tflops_per_gpu: float | None = None
    ledger: LedgerView | None = None  # None until a run of it shows progress (or its client says it started)
    data_wait: DataWaitView | None = None  # None until its client or log gives a data-wait figure
    progress_arrival: float | None = None  # our clock, when its newest token count arrived: a stop shows as none since
    cadence_seconds: float | None = None  # the job's own time between token counts, learned (median of recent ones)
    window_seconds: float | None = None  # the MFU window its rate is over: mfu.window, or its cadence when longer
    stall_after_seconds: float | None = None  # silence longer than this is a stall; None until its cadence is known
    silence_seconds: float | None = None  # how long it is known to have given no count, as of the view; None unreported
    counter_created: float | None = None  # Unix time its token and FLOPs counters began (OpenMetrics _created)

    @property
    def running(self) -> bool:
        return self.state == RUNNING

    def as_json(self) -> dict[str, Any]:
        return {
            "job": self.name,
            # What never happened is null, not 0: a job known only by discovery (or by name) has reported nothing.
            "tokens_total": self.tokens_total if self.reported else None,
            "step": self.step,
            "last_report_time": self.last_report_time if self.reported else None,
            "tokens_per_second": self.tokens_per_second,
            "flops_per_token": self.flops_per_token,
            "gpus": self.gpus,
            "gpu_indices": self.gpu_indices,
            "found_by": list(self.found_by),
            "discovered": self.discovered.as_json() if self.discovered else None,
            "hardware": self.hardware.as_json() if self.hardware else None,
            "peak_flops": self.peak_flops,
            "mfu": self.mfu,
            "eta_seconds": self.eta_seconds,
            "reason": self.reason,
            "restarts": self.restarts,
            "replayed_tokens": self.replayed_tokens,
            "state": self.state,
            "runs": self.runs,
            "implausible_mfu": self.implausible_mfu,
            "framework_mfu": self.framework_mfu,
            "framework_tflops_per_gpu": self.framework_tflops_per_gpu,
            "ledger": self.ledger.as_json() if self.ledger is not None else None,
            "data_wait": self.data_wait.as_json() if self.data_wait is not None else None,
            "cadence_seconds": self.cadence_seconds,
            "window_seconds": self.window_seconds,
            "stall_after_seconds": self.stall_after_seconds,
            "model": {k: self.facts.get(k) for k in MODEL_KEYS},
            **{k: self.facts.get(k) for k in FACT_KEYS},
        }


class ViewBuilder:
    """Builds a job's ``JobView`` from its state. ``gpu_inventory`` returns this node's GPUs (from the GPU source) or
    None when unknown; it is how a job's peak is found without this module knowing about NVML. ``gpu_readings``
    returns the GPU source's latest readings by index (or None): each job's hardware figures are their means over
    the job's GPUs. ``configured`` is the config's ``jobs`` (a job named there is found by ``config``)."""

    def __init__(
        self,
        configured: dict[str, dict],
        window: float,
        gpu_inventory: Callable[[], list[GpuInfo] | None],
        gpu_readings: Callable[[], dict[int, GpuReading] | None],
    ):
        self._configured = configured
        self.window = window
        self._gpu_inventory = gpu_inventory
        self._gpu_readings = gpu_readings

    def _rate(self, job: Job, now: float) -> float | None:
        """Tokens/s between the job's own counts over its MFU window; 0 once its silence is a stall (``stall_after``
        of its cadence), and never before it has a cadence: the time between two of its lines is neither."""
        if not job.reported:
            return None
        cadence = job.cadence
        overdue = stall_after(cadence)
        if overdue is not None and job.silence(now) > overdue:
            return 0.0
        window = rate_window(self.window, cadence)
        points = [p for p in job.window if p[0] >= job.last_report_time - window]
        if len(points) < 2 and len(job.window) >= 2:
            points = [job.window[-2], job.window[-1]]  # a cadence that changed since: its last interval
        if len(points) < 2:
            return None
        (t0, n0), (t1, n1) = points[0], points[-1]
        if t1 - t0 < REPORT_RESOLUTION_SECONDS:
            # Two counts close together (a framework's summary right after its last line): from the newest count a
            # second or more before the last, when the window keeps one.
            earlier = [p for p in job.window if t1 - p[0] >= REPORT_RESOLUTION_SECONDS]
            if not earlier:
                return None  # a zero or sub-second step divides nothing: wait for reports further apart
            t0, n0 = earlier[-1]
        return (n1 - n0) / (t1 - t0)

    def resolve_gpus(self, facts: dict) -> tuple[list[GpuInfo] | None, int | None, str | None]:
        """The job's GPUs on this node (when the inventory is known) and their count."""
        wanted = facts.get("gpus")
        inventory = self._gpu_inventory()
        if inventory is None:
            if isinstance(wanted, int):
                return None, wanted, None
            if isinstance(wanted, list):
                return None, len(wanted), None
            return None, None, "the job gave no gpus and the GPU inventory is unknown (GPU source down)"
        if wanted is None:
            return inventory, len(inventory), None if inventory else "no GPUs visible on this node"
        if isinstance(wanted, int):
            if wanted > len(inventory):
                return inventory, wanted, f"the job declares {wanted} GPUs but this node has {len(inventory)}"
            return sorted(inventory, key=lambda g: g.index)[:wanted], wanted, None
        by_key = {g.index: g for g in inventory} | {g.uuid: g for g in inventory}
        chosen = [by_key[w] for w in wanted if w in by_key]
        missing = [w for w in wanted if w not in by_key]
        if missing:
            return chosen, len(wanted), f"job GPUs not found on this node: {', '.join(map(str, missing))}"
        # Validation refuses a repeated entry, but an index and a UUID can name the same GPU: counted twice, its
        # peak would halve the job's MFU.
        named: dict[int, int | str] = {}  # GPU index -> how the job named it (its index or its UUID)
        for key, gpu in zip(wanted, chosen):
            if gpu.index in named:
                return (
                    None,
                    None,
                    f"job GPUs name GPU {gpu.index} twice (as {named[gpu.index]} and {key}); list each GPU once",
                )
            named[gpu.index] = key
        return chosen, len(wanted), None

    def _peak(self, facts: dict, gpus: list[GpuInfo] | None, count: int | None) -> tuple[float | None, str | None]:
        if facts.get("peak_tflops"):
            return (facts["peak_tflops"] * 1e12 * count, None) if count else (None, None)
        if count is None:
            return None, None
        if gpus is None:
            return None, "the GPU models here are unknown (GPU source down or absent); set peak_tflops for this job"
        dtype = facts.get("dtype") or "bf16"
        total = 0.0
        for gpu in gpus:
            peak = mfu_math.peak_flops(gpu.name, dtype)
            if peak is None:
                return None, f"no {dtype} peak known for GPU {gpu.name!r}; set peak_tflops for this job"
            total += peak
        if len(gpus) < count:
            return None, None
        return total, None

    def view(self, job: Job, now: float, ledger: LedgerView | None) -> JobView:
        facts = {**FACT_DEFAULTS, **job.facts}
        running = job.state == RUNNING
        rate = self._rate(job, now) if running else None
        if running and job.reported and ledger is not None and ledger.state in NOT_TRAINING:
            # Its process is gone, or a new one starts or loads its checkpoint: no step runs, whatever the window
            # of the last run held.
            rate = 0.0
        reason = None
        fpt = flops_per_token(facts)
        if fpt is None:
            reason = "model params unknown: send model.params in a progress report or set jobs.<name>.params"
        gpus, count, gpu_reason = self.resolve_gpus(gpu_facts(facts, job))
        peak, peak_reason = self._peak(facts, gpus, count)
        reason = reason or gpu_reason or peak_reason
        if reason is None and peak is None:
            reason = "peak FLOP/s unknown for this job's GPUs"
        if job.feed_reason and (reason is None or not job.reported):
            reason = job.feed_reason
        if reason is None and rate is None and running:
            reason = (
                "waiting for progress reports at least 1 s apart"
                if len(job.window) >= 2
                else "waiting for a second progress report"
            )
        mfu = implausible = None
        # No reason means every fact is known; the checks for None say so to the type checker.
        if reason is None and running and fpt is not None and rate is not None and peak is not None:
            mfu = mfu_math.model_flops_utilization(fpt, rate, peak)
            if not 0.0 <= mfu <= 1.0:
                reason = self._implausible(facts, gpus, count, fpt * rate, peak)
                implausible, mfu = mfu, None
        if not running:
            reason = f"the job {job.state}: MFU is measured while a job runs"
        framework = job.framework_mfu
        if framework is None and job.framework_tflops_per_gpu is not None and peak and count:
            # Megatron and NeMo print their FLOPs count as TFLOP/s per GPU, not an MFU: over our per-GPU peak.
            framework = job.framework_tflops_per_gpu * 1e12 / (peak / count)
        eta = None
        target = facts.get("target_tokens")
        if target and rate and running:
            eta = max(target - job.tokens_total, 0.0) / rate
            if not math.isfinite(eta):
                eta = None  # a rate so slow the remaining tokens take longer than a double counts
        return JobView(
            name=job.name,
            tokens_total=job.tokens_total,
            step=job.step,
            last_report_time=job.last_report_time,
            progress_arrival=job.progress_arrival,
            cadence_seconds=job.cadence,
            window_seconds=rate_window(self.window, job.cadence),
            stall_after_seconds=stall_after(job.cadence),
            silence_seconds=job.silence(now) if job.reported else None,
            counter_created=job.counter_created,
            tokens_per_second=rate,
            flops_per_token=fpt,
            gpus=count,
            peak_flops=peak,
            mfu=mfu,
            eta_seconds=eta,
            reason=reason,
            facts=facts,
            restarts=job.restarts,
            replayed_tokens=job.replayed_tokens,
            gpu_indices=[g.index for g in gpus] if gpus is not None else None,
            state=job.state,
            runs=job.runs,
            tokens_processed=job.tokens_processed,
            model_flops=job.flops_total if fpt is not None or job.flops_total > 0 else None,
            implausible_mfu=implausible,
            framework_mfu=framework,
            framework_tflops_per_gpu=job.framework_tflops_per_gpu,
            ledger=ledger,
            data_wait=self._data_wait(job, running),
            reported=job.reported,
            found_by=self._found_by(job),
            discovered=job.discovered,
            hardware=hardware_figures(
                [g.index for g in gpus] if gpus is not None else None,
                self._gpu_readings(),
                job.discovered.shared_gpus if job.discovered else (),
            ),
        )

    def _data_wait(self, job: Job, running: bool) -> DataWaitView | None:
        meter = job.data_wait
        if meter is None:
            return None
        ratio = recent = None
        # A share only while figures keep coming: one from a window before the job's newest report is history.
        newest = meter.newest
        window = rate_window(self.window, job.cadence)
        if running and newest is not None and job.last_report_time - newest <= window:
            ratio = meter.share(newest, window)
            recent = meter.share(newest, RECENT_SECONDS)
        return DataWaitView(meter.gpu_seconds, meter.rank_seconds, ratio, meter.source, recent)

    def _implausible(
        self, facts: dict, gpus: list[GpuInfo] | None, count: int | None, achieved: float, peak: float
    ) -> str:
        """Why an MFU above 1 cannot be: the job's fact that must be wrong. The text stays the same from one window
        to the next (no live figures), so it is logged once; the value is in the job's ``implausible_mfu``."""
        head = "MFU above 1 (more model FLOP/s than the peak of the job's GPUs here), so a fact of the job is wrong: "
        override = facts.get("peak_tflops")
        if override:
            table = self._table_peak(facts, gpus, count)
            if table is None or achieved <= table:
                known = f", the GPU table says {table / 1e12 / count:g}" if table and count else ""
                return head + f"peak_tflops ({override:g} TFLOP/s per GPU{known}) is below what its GPUs do"
        inventory = self._gpu_inventory()
        if inventory and count is not None and count < len(inventory) and achieved <= peak / count * len(inventory):
            return (
                head + f"gpus ({count}) is fewer than the GPUs the job trains on here (this node has {len(inventory)})"
            )
        return head + (
            "tokens_total grows faster than these GPUs can train (it must count this node's tokens, not "
            "the whole job's) or model.params is too large"
        )

    def _table_peak(self, facts: dict, gpus: list[GpuInfo] | None, count: int | None) -> float | None:
        """The peak of the job's GPUs from the GPU table, ignoring a peak_tflops override; None when unknown."""
        if gpus is None or count is None or len(gpus) < count:
            return None
        return self._peak({**facts, "peak_tflops": None}, gpus, count)[0]

    def _found_by(self, job: Job) -> tuple[str, ...]:
        found = []
        if job.reported or job.touched:
            found.append("reported")
        if job.name in self._configured:
            found.append("config")
        if job.discovered is not None:
            found += sorted({pod.scheduler for pod in job.discovered.pods})
        return tuple(found)


def flops_per_token(facts: dict) -> float | None:
    if not facts.get("params"):
        return None
    return mfu_math.flops_per_token(
        mfu_math.ModelShape(
            facts["params"],
            facts.get("layers"),
            facts.get("heads"),
            facts.get("head_dim"),
            facts.get("seq_len"),
            bool(facts.get("causal_attention")),
        )
    )
