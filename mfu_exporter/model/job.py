"""A training job's state on this node: what its progress reports, log lines, checkpoint events and discovery said
of it. ``mfu_exporter.model.jobs.JobTracker`` keeps and changes it; a view of it (``mfu_exporter.model.job_view``) is
computed from it and never written back.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from mfu_exporter.model.datawait import DataWaitMeter
from mfu_exporter.model.discovery_jobs import DiscoveredJob
from mfu_exporter.model.ledger import Ledger
from mfu_exporter.model.progress import CADENCE_INTERVALS, RUNNING
from mfu_exporter.model.recent import RecentValues


@dataclass
class Job:
    """One job's state: what it said and was found to be, its counters, its window of counts and its ledger."""

    name: str
    facts: dict[str, Any]
    created: float
    tokens_total: float = 0.0
    step: int | None = None
    last_report_time: float = 0.0  # the job's own time of its newest report
    last_arrival: float = 0.0  # our clock, when the newest report arrived
    progress_arrival: float | None = None  # our clock, when the newest token count arrived (events aside)
    restarts: int = 0
    replayed_tokens: float = 0.0  # tokens re-trained after restarts from checkpoints
    window: deque = field(default_factory=deque)  # (report time, tokens_total)
    window_run: int = 0  # the ledger's run the window's counts belong to: a new run's rate starts afresh
    reported: bool = False
    state: str = RUNNING
    ended: float | None = None  # our clock, when a report said the job ended
    runs: int = 1  # runs under this name since the exporter first saw it (a report after an end starts one)
    carried_tokens: float = 0.0  # tokens processed by the earlier runs, so the counters continue across runs
    flops_total: float = 0.0  # model FLOPs counted so far: each token at the FLOPs/token known when it was reported
    counted_tokens: float = 0.0  # of carried + processed tokens, those already in flops_total
    counter_created: float | None = None  # Unix time its counters began (its first count here, or a saved one)
    processed_floor: float = 0.0  # the counter at the last change: a restart's sum may round an ulp below (a reset)
    # Log-fed jobs (sources.logs): what the framework printed about its own speed, and why the log's lines give
    # no token total yet (a missing world size or sequence length), shown as the job's reason.
    framework_mfu: float | None = None
    framework_tflops_per_gpu: float | None = None
    feed_reason: str | None = None
    interval: float = 0.0  # the job's own time between its last two reports
    intervals: RecentValues = field(default_factory=lambda: RecentValues(CADENCE_INTERVALS))  # its recent intervals
    touched: bool = False  # created by another API (checkpoints, a log): counts against ingest.max_jobs like a report
    discovered: DiscoveredJob | None = None  # what discovery found of it on this node, while it finds it
    ledger: Ledger = field(default_factory=Ledger)  # where its time here went (mfu_exporter.model.ledger)
    pods: frozenset | None = None  # the pods (or Slurm steps) discovery found it in: a new one is a new run
    data_wait: DataWaitMeter | None = None  # its wait for input, once its client or log gives one
    version: int = 0  # counts the changes to the job, so a view kept of it is known to be stale
    # A log's count reaches the model at the tick after its line was read. A fed job is known silent only up to when
    # its log was last read whole (``heard_until``), so the wait for the next delivery is no stall; a feed that
    # stopped coming counts as silence once ``feed_lag`` passed, so it hides no stall either.
    fed: bool = False  # its newest token count came from a feed (a log), not a report
    heard_until: float | None = None
    feed_lag: float = 0.0

    @property
    def tokens_processed(self) -> float:
        return max(self.carried_tokens + self.tokens_total + self.replayed_tokens, self.processed_floor)

    def silence(self, now: float) -> float:
        """Seconds the job is known to have given no token count, as of ``now`` (our clock)."""
        arrival = self.progress_arrival if self.progress_arrival is not None else self.last_arrival
        heard = now
        if self.fed and self.heard_until is not None:
            heard = min(now, max(self.heard_until, now - self.feed_lag))
        return max(heard - arrival, 0.0)

    @property
    def cadence(self) -> float | None:
        """The job's own time between token counts (the median of its recent intervals); None before its second."""
        return self.intervals.median() if self.intervals else None


def gpu_facts(facts: dict, job: Job | None) -> dict:
    """``facts`` with the GPUs discovery saw the job hold, where the job named none itself. A log's tokens per
    GPU are scaled by this count too, so tokens and peak are over the same GPUs (counting every GPU on a shared
    node made a 2-GPU Slurm job's MFU four times too high on 8)."""
    if facts.get("gpus") is None and job is not None and job.discovered is not None:
        return {**facts, "gpus": list(job.discovered.gpus)}
    return facts
