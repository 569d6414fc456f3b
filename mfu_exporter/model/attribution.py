"""Where did the MFU go: at each tick (``mfu.interval``), the gap between a job's healthy baseline and its current
MFU gets one cause.

Causes, in order of precedence (the first whose signal is present wins, so overlapping faults resolve the same way
on every node and in the cluster rules):

1. ``gpu_lost``    a GPU of the job is off the bus (NVML GpuIsLost, Unknown)
2. ``checkpoint``  a checkpoint write of the job is in progress
3. ``network``     NCCL carries the job's inter-node traffic over TCP sockets on a node with an active RDMA port (its
                   log's ``NCCL INFO`` lines), a NIC of the job paused over the threshold, a pause storm, RDMA
                   retransmissions/timeouts, or CNPs at or over a fixed rate (``cnp_per_second``, the level the
                   cluster rules use too; not a rise over the job's healthy rate, so set it above the CNP rate the job
                   sees when healthy)
4. ``thermal``     a GPU of the job was held down for heat at least ``throttle_ratio`` of the interval
5. ``power``       a GPU of the job was held down for power (power cap, power brake) as long, or is in HW slowdown
6. ``straggler``   one rank holds the job back: named by the job (Megatron's straggler detector, nvidia-resiliency-ext's
                   scores) or by NCCL Inspector (the rank whose collectives are the shortest: its peers wait in them).
                   After thermal and power, which name the hardware reason a rank is slow; before stalled, since a
                   straggling job still makes progress. The cluster rules add the hardware comparison (a node whose
                   SM clock, throttle time or tensor activity lies beyond the median ± 3 MAD of the job's nodes)
7. ``stalled``     no progress at all
8. ``input``       the job says it waits for its input: its data-wait share of wall time (client or log,
                   ``mfu_exporter.model.datawait``) at or over ``input_wait_ratio``; the evidence names the wait and the
                   read throughput of the node's dataset mounts where the storage source reads them
9. ``idle``        the job's GPUs are mostly idle and no sampled signal explains it (no data-wait figure says why:
                   data loading, host side, or a fault no source sees)
10. ``unknown``    a gap and no signal that explains it

A job's NICs are the RDMA devices nearest each of its GPUs by PCIe topology (same switch, else same host bridge or
NUMA node: the path its GPUDirect traffic takes), so on a node shared by jobs one job's paused NIC does not blame
the other; every NIC of the node counts when the job has all the node's GPUs or the topology does not place a GPU,
and the evidence says so.

``none`` means the job runs within ``tolerance`` of its baseline. The baseline is the job's ``expected_mfu`` when
configured, else a high percentile of its recent MFU. Every evaluation adds
GPUs × (baseline − MFU) ÷ baseline × Δt to ``mfu_job_lost_gpu_seconds_total{cause}``, so a stacked rate of it shows
where the capacity went. This module reads the sources' latest snapshot data; it never calls a source.

On time and to the second. The MFU is a rate over a window (``mfu.window``, 60 s by default) and moves a window
after the fault; the signals move at the next sample of their source. They are time shares over each sample's
interval, from counters (a NIC's pause duration per priority, a GPU's throttle time per reason, retransmission and
error counts, CNPs), so an episode between two samples counts in full: a 2 s full pause in a 5 s interval is 40 % of
it. What has only a state is read at the sample (a GPU off the bus, a checkpoint write in progress, NCCL's transport,
the HW slowdown bit, GPU utilization, a reason on a driver without its throttle-time counter). So:

- a cause appears as soon as its signal shows and the job's *recent* progress (its last report interval, or no
  report when one was due) is below the baseline by the tolerance, without waiting for the window's MFU;
- after its signal clears, a cause *holds* for one MFU window plus twice the longer of the job's report interval
  and the sources' sampling interval: the window still holds the slow seconds, and its gap, booked each tick,
  goes to the cause that made it, not to ``unknown``;
- of the causes seen now or held, the first by precedence wins; ``stalled``, ``idle`` and ``unknown``, which have no
  signal of their own, are given only when no cause was seen within the window.

Booking the window's gap with the hold books each slow second once: a window passes the lost area through whole,
a window late.

The counters' 5-minute rates are computed here too (``JobStanding.loss_rates``), from the bookings themselves: a shard
that reads the rate the node loses to its blamed cause, one series per job, instead of every cause's counter on
every node, evaluates in time proportional to nodes × jobs, not nodes × jobs × causes.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterable

from mfu_exporter.config import AttributionConfig
from mfu_exporter.model.evidence import (
    POWER_REASONS,
    THERMAL_REASONS,
    NodeSignals,
    job_nics,
    network_evidence,
    socket_fallback,
    throttled,
)
from mfu_exporter.model.job_view import NOT_TRAINING, JobView
from mfu_exporter.model.ledger import tick_gap
from mfu_exporter.model.loss_window import LossWindow
from mfu_exporter.model.progress import REPORT_RESOLUTION_SECONDS
from mfu_exporter.model.readings import GpuReading, JobCollectives, MountSignal

CAUSES = (
    "none",
    "gpu_lost",
    "checkpoint",
    "network",
    "thermal",
    "power",
    "straggler",
    "stalled",
    "input",
    "idle",
    "unknown",
)
# Causes that stand on a signal of their own (a reading, an event): seen now, or within the window, they explain
# the gap. The rest (no progress, idle GPUs, nothing) are what is left when none does.
SIGNAL_CAUSES = frozenset({"gpu_lost", "checkpoint", "network", "thermal", "power", "straggler", "input"})
PRECEDENCE = {cause: rank for rank, cause in enumerate(CAUSES)}
# An evaluation this much later than its period is a busy process, not the job: no report is overdue for it.
LATE_EVALUATIONS = 1.5
# Evaluations further apart than ``tick_gap`` of the tick's interval (mfu_exporter.model.ledger) mean the exporter itself
# did not run: what the jobs did meanwhile was not observed, so that time is booked to no job's cause but to the
# exporter's own counter.


# The thresholds are the config's ``attribution`` section, defaults and all (one table: mfu_exporter/config/).
Thresholds = AttributionConfig


@dataclass
class Verdict:
    cause: str
    evidence: str
    baseline: float | None
    lost_fraction: float  # (baseline − MFU) ÷ baseline, 0 when healthy
    signal: str = "mfu"  # what the baseline is of: the formula MFU, or a hardware figure for a job that reports none
    since: float | None = None  # when this cause became the job's verdict (the clock of ``evaluate``)
    baseline_from: str | None = None  # what the baseline was learned from, for people

    def as_json(self) -> dict[str, Any]:
        return {
            "cause": self.cause,
            "evidence": self.evidence,
            "baseline_mfu": self.baseline,
            "lost_fraction": self.lost_fraction,
            "signal": self.signal,
            "since": self.since,
            "baseline_from": self.baseline_from,
        }


@dataclass(frozen=True)
class JobStanding:
    """One job's attribution as exported: its verdict now (None: nothing to judge) and its lost GPU-seconds."""

    job: str
    lost_seconds: tuple[tuple[str, float], ...]  # (cause, GPU-seconds) once the job had a verdict; () before
    verdict: Verdict | None
    # (cause, GPU-seconds lost per second over the last 5 minutes: model/loss_window.py), every cause, as lost_seconds
    loss_rates: tuple[tuple[str, float], ...] = ()

    def blamed_rate(self) -> float | None:
        """What the cause blamed now loses per second over the window (0 for a cause without a counter: none); None
        without a verdict."""
        if self.verdict is None:
            return None
        return dict(self.loss_rates).get(self.verdict.cause, 0.0)


def _job_gpus(view: JobView, signals: NodeSignals) -> list[GpuReading]:
    indices = view.gpu_indices or sorted(signals.gpus)
    return [signals.gpus[i] for i in indices if i in signals.gpus]


def _gpu_lost(view: JobView, signals: NodeSignals) -> bool:
    return any(not gpu.up for gpu in _job_gpus(view, signals))


def classify(view: JobView, signals: NodeSignals, limits: Thresholds, stopped: bool = False) -> tuple[str, str]:
    """The cause of a degraded job's gap and the evidence for it, by precedence. ``stopped``: the job's report is
    overdue (its recent progress is none), which is ``stalled`` as much as a window without progress is."""
    indices = view.gpu_indices or sorted(signals.gpus)
    gpus = _job_gpus(view, signals)
    lost = [g for g in gpus if not g.up]
    if lost:
        return "gpu_lost", ", ".join(f"GPU {g.index} ({g.uuid or '?'}) is off the bus" for g in lost)
    writes = signals.checkpoint(view.name)
    if writes and writes.get("in_progress"):
        return "checkpoint", f"checkpoint {writes['in_progress']} writing for {writes.get('elapsed_seconds') or 0:.0f}s"
    collectives = signals.collectives.get(view.name, JobCollectives())
    network = socket_fallback(collectives, signals) or network_evidence(signals, limits, job_nics(indices, signals))
    if network:
        return "network", network
    for cause, reasons in (("thermal", THERMAL_REASONS), ("power", POWER_REASONS)):
        hit = [(g, throttled(g, reasons, limits.throttle_ratio)) for g in gpus]
        hit = [(g, r) for g, r in hit if r]
        if hit:
            return cause, "; ".join(
                f"GPU {g.index} throttled: {', '.join(r)}"
                + (f" at {g.temperature:.0f} °C" if g.temperature is not None else "")
                for g, r in hit
            )
    if collectives.straggler:
        return "straggler", collectives.straggler
    if view.tokens_per_second == 0:
        if view.ledger is not None and view.ledger.state in NOT_TRAINING:
            return "stalled", NOT_TRAINING[view.ledger.state]
        return "stalled", "no token progress over the MFU window"
    wait = view.data_wait
    # The recent share too: a loader that waits now shows at once, as the job's recent progress does.
    shares = [] if wait is None else [r for r in (wait.ratio, wait.recent_ratio) if r is not None]
    if wait is not None and shares and max(shares) >= limits.input_wait_ratio:
        reads = dataset_reads(view.name, signals.mounts)
        return "input", (
            f"waiting for its next batch {100 * max(shares):.0f}% of wall time ({_wait_source(wait.source)}), over "
            f"the {100 * limits.input_wait_ratio:.0f}% line" + (f"; {reads}" if reads else "")
        )
    if stopped:
        return "stalled", "no progress report since one was due"
    utilizations = [g.utilization for g in gpus if g.utilization is not None]
    if utilizations and sum(utilizations) / len(utilizations) < limits.idle_utilization:
        return (
            "idle",
            f"GPUs {100 * sum(utilizations) / len(utilizations):.0f}% busy on average, no sampled signal explains it"
            + (
                " (the job gives no data-wait figure: report data_wait_seconds to tell input from the rest)"
                if wait is None
                else ""
            ),
        )
    return "unknown", "MFU is below its baseline and no sampled signal explains it"


def dataset_reads(job: str, mounts: Iterable[MountSignal]) -> str | None:
    """The job's dataset mounts and their read throughput now, for the evidence of "input"; None when the storage
    source knows none of its data paths (``jobs.<name>.data_paths``)."""
    parts = []
    for mount in mounts:
        if (job, "data") not in mount.jobs:
            continue
        rate = mount.read_bytes_per_second
        read = f"reads {rate / 1e6:,.1f} MB/s" if rate is not None else "reads not measured yet"
        parts.append(f"dataset mount {mount.mount_point} ({mount.fstype} {mount.device}) {read}")
    return "; ".join(parts) or None


def _wait_source(source: str) -> str:
    if source.startswith("log:"):
        return f"its {source[4:]} log's data-loading timer"
    return "its client's data_wait_seconds"


@dataclass
class _Held:
    """A cause seen with its signal, and when it was last seen: it holds while the MFU window still holds its gap."""

    cause: str
    evidence: str
    seen: float


@dataclass
class _JobAttribution:
    history: deque
    lost_seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CAUSES[1:], 0.0))
    last_recorded: float = float("-inf")
    last_evaluated: float | None = None
    verdict: Verdict | None = None
    judged: bool = False  # had a verdict once: from then on its lost GPU-seconds are exported, verdict or not
    signal: str | None = None
    # The job's distinct reports as evaluations saw them: (its report time, tokens processed, our clock when seen).
    reports: deque = field(default_factory=lambda: deque(maxlen=16))
    # GPU-seconds of a gap no cause explained yet, and since when: they go to a cause seen within the window, or
    # to unknown once the window holds none of them (a counter only grows, so nothing is taken back from unknown).
    unexplained: float = 0.0
    unexplained_since: float | None = None
    held: dict[str, _Held] = field(default_factory=dict)  # cause -> when its signal was last seen
    expected: bool = False  # the baseline is the job's expected_mfu, not learned
    losses: LossWindow = field(default_factory=LossWindow)  # lost_seconds over the last 5 minutes


def _recent(view: JobView, state: _JobAttribution, now: float, elapsed: float) -> tuple[float | None, float, bool]:
    """The job's recent MFU (over its newest report interval at least a second long), its cadence, and whether its
    next report is overdue (then the recent MFU is 0: it is not progressing). A report is overdue once the job's
    silence passes its ``stall_after`` (a few of its own intervals): between two of its lines a job is neither
    stalled nor slow. None when it has not reported twice, or its FLOPs per token or peak are unknown."""
    if view.reported and (not state.reports or state.reports[-1][0] != view.last_report_time):
        if state.reports and view.tokens_processed < state.reports[-1][1]:
            state.reports.clear()  # a new count (a new exporter view of a restarted job): rates start over
        state.reports.append((view.last_report_time, view.tokens_processed, now))
    if len(state.reports) < 2 or not view.flops_per_token or not view.peak_flops:
        return None, 0.0, False
    last = state.reports[-1]
    interval = view.cadence_seconds or 0.0
    # Since it arrived (as the view knows it), else since an evaluation first saw it (a tick later at most).
    silent = view.silence_seconds if view.silence_seconds is not None else now - last[2]
    overdue = view.stall_after_seconds
    if overdue is not None and silent > max(overdue, LATE_EVALUATIONS * elapsed):
        return 0.0, interval, True
    reference = next((p for p in reversed(state.reports) if last[0] - p[0] >= REPORT_RESOLUTION_SECONDS), None)
    if reference is None:
        return None, interval, False
    rate = (last[1] - reference[1]) / (last[0] - reference[0])
    return view.flops_per_token * rate / view.peak_flops, interval, False


def _signal(view: JobView) -> tuple[str, float | None]:
    """The figure a job's gap is measured on: its formula MFU when it reports one, else the hardware figure over
    its GPUs (GPM FLOPs estimate, else tensor activity, else GPU utilization), so a job that reports nothing still
    gets a cause, against its own baseline of that figure."""
    if view.mfu is not None:
        return "mfu", view.mfu
    hardware = getattr(view, "hardware", None)
    if hardware is None or "reported" in getattr(view, "found_by", ()):
        return "mfu", None  # a reporting job without MFU yet: wait for it, not for a figure it will leave
    for name in ("hardware_flops_utilization", "tensor_active", "gpu_utilization"):
        value = getattr(hardware, name)
        if value is not None:
            return name, value
    return "mfu", None


class Attributor:
    """Keeps each job's baseline and lost GPU-seconds by cause; ``evaluate`` runs at each tick on the event loop."""

    def __init__(self, limits: Thresholds = Thresholds(), window: float = 60.0, interval: float = 1.0):
        self.limits = limits
        # Evaluations further apart than this: the exporter did not run. ``interval``: the tick's (mfu.interval).
        self.gap = tick_gap(interval)
        self.window = window  # the MFU window (mfu.window): how long a cleared cause's gap stays in the MFU
        self._jobs: dict[str, _JobAttribution] = {}
        self._lock = threading.Lock()
        self.evaluations = 0  # passes done: the standings change only with it (their families are kept between)
        self.unobserved_seconds = 0.0  # the exporter's own gaps between evaluations (``self.gap``)
        self._last_evaluation: float | None = None

    def baseline(self, view: JobView, state: _JobAttribution) -> float | None:
        state.expected = bool(view.facts.get("expected_mfu")) and state.signal == "mfu"
        if state.expected:
            return view.facts["expected_mfu"]
        if len(state.history) < self.limits.baseline_min_samples:
            return None
        ordered = sorted(state.history)
        return ordered[min(int(self.limits.baseline_percentile * len(ordered)), len(ordered) - 1)]

    def evaluate(self, now: float, views: Iterable[JobView], signals: NodeSignals) -> None:
        with self._lock:
            gap = self._last_evaluation is not None and now - self._last_evaluation > self.gap
            if gap:
                assert self._last_evaluation is not None
                self.unobserved_seconds += now - self._last_evaluation
            self._last_evaluation = max(now, self._last_evaluation or now)
            seen = set()
            for view in views:
                seen.add(view.name)
                state = self._jobs.get(view.name)
                if state is None:
                    size = int(self.limits.baseline_window / self.limits.baseline_interval)
                    state = self._jobs[view.name] = _JobAttribution(history=deque(maxlen=max(size, 1)))
                self._evaluate(now, view, state, signals, gap)
                state.losses.remember(now, state.lost_seconds)
                state.judged = state.judged or state.verdict is not None
            for name in set(self._jobs) - seen:
                del self._jobs[name]
            self.evaluations += 1

    def _evaluate(
        self, now: float, view: JobView, state: _JobAttribution, signals: NodeSignals, gap: bool = False
    ) -> None:
        elapsed = 0.0 if state.last_evaluated is None else max(now - state.last_evaluated, 0.0)
        state.last_evaluated = now
        signal, value = _signal(view)
        recent, interval, stopped = _recent(view, state, now, elapsed) if signal == "mfu" else (value, 0.0, False)
        if value is None or not view.running:
            # No MFU and no hardware figure to explain (the job JSON says why), or the job ended: nothing to blame.
            state.verdict = None
            state.held.clear()
            state.lost_seconds["unknown"] += state.unexplained
            state.unexplained, state.unexplained_since = 0.0, None
            return
        if signal != state.signal:
            # A job found by discovery that starts reporting: its MFU gets a baseline of its own, never one learnt
            # from a hardware figure of another scale.
            state.history.clear()
            state.last_recorded = float("-inf")
            state.signal = signal
        shown = "MFU" if signal == "mfu" else signal.replace("_", " ")
        baseline = self.baseline(view, state)
        # The baseline learns only from health: no cause now or held (an incident's slow seconds would lower it
        # until the incident looked healthy), frozen while one lasts.
        healthy = not state.held and (state.verdict is None or state.verdict.cause == "none")
        if healthy and now - state.last_recorded >= self.limits.baseline_interval and value > 0:
            state.history.append(value)
            state.last_recorded = now
        if not baseline:
            if signal == "mfu" and (stopped or view.tokens_per_second == 0):
                # No progress at all is a gap whatever the job's healthy figure: its cause needs no baseline.
                cause, evidence = classify(view, signals, self.limits, stopped)
                self._judge(state, now, Verdict(cause, evidence, None, 1.0, signal))
                return
            self._judge(
                state, now, Verdict("none", f"learning the healthy baseline from recent {shown}", None, 0.0, signal)
            )
            return
        lost = max(baseline - value, 0.0) / baseline  # the window's gap: what the MFU shows and each tick books
        recent_lost = max(baseline - recent, 0.0) / baseline if recent is not None else 0.0
        # A hardware figure is the last sample's, no window behind it: its cause holds a couple of samples. The
        # signals are read over the sources' interval, so a cause is seen up to an interval after the seconds it
        # slowed and holds as long again after it clears.
        window = (view.window_seconds or self.window) if signal == "mfu" else 0.0
        hold = window + 2 * max(interval, elapsed, signals.interval, 1.0)
        for cause in [cause for cause, seen in state.held.items() if now - seen.seen > hold]:
            del state.held[cause]  # the window no longer holds the seconds it slowed
        found: tuple[str, str] | None = None
        # A GPU of the job off the bus stops it (its collectives wait for the rank): no need to wait for a drop.
        if lost >= self.limits.tolerance or recent_lost >= self.limits.tolerance or _gpu_lost(view, signals):
            cause, evidence = classify(view, signals, self.limits, stopped)
            if cause in SIGNAL_CAUSES:
                state.held[cause] = _Held(cause, evidence, now)
            elif not state.held and (lost >= self.limits.tolerance or cause == "stalled"):
                # No signal now nor within the window: what is left (no progress, idle GPUs, or nothing known).
                found = (cause, evidence)
        booked = found[0] if found is not None else None
        if state.held:
            held = min(state.held.values(), key=lambda h: PRECEDENCE[h.cause])
            booked = held.cause  # the window's gap, however small, is the seconds this cause slowed
            if held.seen == now:
                found = (held.cause, held.evidence)
            elif lost >= self.limits.tolerance:  # shown while the job recovers; within the tolerance, none
                found = (
                    held.cause,
                    f"{held.evidence} (cleared {now - held.seen:.0f} s ago; the {window:g} s MFU window still"
                    " holds its slow seconds)",
                )
            else:
                found = None
        # After a gap of the exporter's own, the seconds since the last evaluation were not observed: none is booked.
        amount = 0.0 if gap else (view.gpus or 0) * min(lost, 1.0) * elapsed
        if booked == "unknown":
            state.unexplained += amount
            state.unexplained_since = now if state.unexplained_since is None else state.unexplained_since
        elif booked is not None:
            state.lost_seconds[booked] += amount
            if booked in SIGNAL_CAUSES and state.unexplained:
                # A signal seen within the window of an unexplained gap: its seconds were this cause's.
                state.lost_seconds[booked] += state.unexplained
                state.unexplained, state.unexplained_since = 0.0, None
        if state.unexplained_since is not None and now - state.unexplained_since > hold:
            state.lost_seconds["unknown"] += state.unexplained
            state.unexplained, state.unexplained_since = 0.0, None
        if found is None:
            self._judge(
                state,
                now,
                Verdict(
                    "none", f"{shown} within {100 * self.limits.tolerance:.0f}% of its baseline", baseline, lost, signal
                ),
            )
            return
        self._judge(state, now, Verdict(found[0], found[1], baseline, lost, signal))

    def _judge(self, state: _JobAttribution, now: float, verdict: Verdict) -> None:
        """The job's verdict now, with when its cause began and what its baseline was learned from."""
        if verdict.baseline is not None:
            verdict.baseline_from = self._baseline_from(state, verdict)
        previous = state.verdict
        verdict.since = previous.since if previous is not None and previous.cause == verdict.cause else now
        state.verdict = verdict

    def _baseline_from(self, state: _JobAttribution, verdict: Verdict) -> str:
        if state.expected:
            return "expected_mfu (configured)"
        return (
            f"the {100 * self.limits.baseline_percentile:g}th percentile of its healthy samples, one per "
            f"{self.limits.baseline_interval:g} s over {self.limits.baseline_window:g} s (none while a cause lasts)"
        )

    def verdict(self, job: str) -> Verdict | None:
        with self._lock:
            state = self._jobs.get(job)
            return state.verdict if state else None

    def standings(self) -> list[JobStanding]:
        """Each known job's verdict now and its lost GPU-seconds by cause (``mfu_exporter.render.attribution``)."""
        with self._lock:
            return [
                JobStanding(
                    name,
                    # A counter stays while its job is known, also when there is no verdict now (an ended job, a
                    # window with no MFU): gaps in a counter read as resets.
                    tuple(state.lost_seconds.items()) if state.judged else (),
                    state.verdict,
                    state.losses.rates if state.judged else (),
                )
                for name, state in self._jobs.items()
            ]
