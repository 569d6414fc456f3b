"""A job's time ledger on this node: where every GPU-second went, in seven kinds that partition its time.

From the job's first run here until it ends, every second × the job's GPUs here is one of:

- ``productive``: training steps past the highest position the job ever reached (a step, else a token total);
- ``wasted``: steps redone after a restart, from where the run resumed up to that highest position;
- ``startup``: from a run's start (a start event, start-up lines, discovery finding its pod) to its first step,
  checkpoint load excluded; where the log says when the training loop begins ("Training starts at step N"), to then;
- ``checkpoint_save``: a checkpoint save under way (the job, its log or the watcher says so);
- ``checkpoint_load``: a checkpoint being restored (the job or its log says so);
- ``down``: no run of the job is alive here, between a crash and the restart;
- ``stalled``: a run is alive but made no progress for longer than a few of its own report intervals (never before
  it has shown one interval: a job that logs every few minutes is not stalled before its second line).

The ledger is a state machine on the exporter's monotonic clock. An event says what the job does from its time on
(a run starts, a load or a save starts or ends, a step is reached, a run ends); the time since the last event is
**pending** until the next event says what it was. A step report settles it: the steps it reports take their
ideal time at its end (training), and what the steps leave is the earlier state (start-up before a run's first
step, a stall when the wait was longer than ``stall_after``). So a run's first step is not counted as start-up,
and a crash is ``down`` from the run's last sign of life, even though both are known only later. Pending time
older than ``holdback`` is committed as what it looked like then, so the counters lag at most that much.

The ideal step time is the median of the job's recent steady per-step durations (report intervals with no save,
load or stall, divided by the steps they cover); a step-time histogram and the seconds over the ideal come from
the same intervals. Pure: no I/O, no clock of its own, no Prometheus types (rendered in ``mfu_exporter.render``).
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from mfu_exporter.model.recent import RecentValues

KINDS = ("productive", "wasted", "startup", "checkpoint_save", "checkpoint_load", "down", "stalled")
# Why a run ended: another run started (``restarted``), its client stopped sending heartbeats (``lost``), its pod or
# Slurm step went away (``gone``), or the job said how it ended.
END_REASONS = ("restarted", "lost", "gone", "finished", "failed", "cancelled")
JOB_ENDS = ("finished", "failed", "cancelled")
# Step-time buckets, seconds: 12 bounds + Inf, sum and count are 15 series per job, inside the ledger's 30 per job.
STEP_BUCKETS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0)
HOLDBACK_SECONDS = 120.0
STALL_FACTOR = 5.0  # a stall is a wait longer than this many of the job's median report intervals
STALL_MIN_SECONDS = 10.0  # and never shorter than this: a report a few seconds late is not a hang
STEADY_INTERVALS = 256  # recent steady per-step durations kept for the ideal step time
MAX_RUNS = 32  # runs kept for the API and the timeline; the counters count every run
MAX_BANDS = 256  # timeline bands kept per job (consecutive bands of one kind merge)
MAX_LOADS = 16  # closed checkpoint loads kept for the restore meter, which takes each by its number within a tick
HEARTBEAT_MISSES = 3  # a run whose client sends heartbeats is lost after this many intervals without one
# Evaluations further apart than this (or than GAP_TICKS of the tick's interval, when longer) mean the exporter
# itself did not run (stopped, starved, suspended): what the jobs did meanwhile was not observed, and what they sent
# meanwhile waits to be read.
TICK_GAP_SECONDS = 5.0
GAP_TICKS = 2  # a tick late by a whole interval is a busy process, not a stopped one


def tick_gap(interval: float) -> float:
    """Seconds between two evaluations at the tick's ``interval`` (``mfu.interval``) past which the exporter did not
    run: a 1 s tick's gap is 5 s, a 5 s tick's 10 s."""
    return max(TICK_GAP_SECONDS, GAP_TICKS * interval)


@dataclass
class Run:
    """One run of the job on this node (a process, a pod, a Slurm step), for the API and the timeline."""

    number: int
    start: float  # Unix time
    source: str  # what said it started: client, log, discovery, report
    run_id: str | None = None
    first_step_time: float | None = None
    end: float | None = None
    end_reason: str | None = None
    resume: float | None = None  # the position it resumed from, when a load or start-up line says so

    def as_json(self) -> dict[str, Any]:
        return {
            "run": self.number,
            "run_id": self.run_id,
            "source": self.source,
            "start": self.start,
            "first_step_time": self.first_step_time,
            "end": self.end,
            "end_reason": self.end_reason,
            "resume_step": self.resume,
        }


@dataclass(frozen=True)
class LedgerView:
    """A copy of a ledger's figures at one instant, for metrics and JSON without the lock."""

    gpu_seconds: dict[str, float]
    seconds: dict[str, float]
    goodput: float | None
    restarts: int
    runs: tuple[dict[str, Any], ...]
    bands: tuple[tuple[int, str, float, float], ...]  # (run number, kind, start, end), Unix times
    step_buckets: tuple[int, ...]  # cumulative, last is +Inf
    step_sum: float
    step_count: int
    # The checkpoint loads that ended, newest last: (number, run, start, end), Unix times. The number counts the
    # job's loads here from 1 and identifies each load, whatever the clocks do.
    loads: tuple[tuple[int, int, float, float], ...]
    ideal_step_seconds: float | None
    over_ideal_seconds: float
    pending_seconds: float
    state: str

    def as_json(self) -> dict[str, Any]:
        return {
            "kinds": dict(self.gpu_seconds),
            "seconds": dict(self.seconds),
            "goodput": self.goodput,
            "restarts": self.restarts,
            "runs": list(self.runs),
            "bands": [{"run": r, "kind": k, "start": s, "end": e} for r, k, s, e in self.bands],
            "ideal_step_seconds": self.ideal_step_seconds,
            "over_ideal_seconds": self.over_ideal_seconds,
            "pending_seconds": self.pending_seconds,
            "state": self.state,
        }


@dataclass
class Ledger:
    """One job's ledger. Every method takes ``now`` (the exporter's monotonic seconds) and ``offset`` (Unix time
    minus monotonic time, for the run times and bands people read); event times are monotonic seconds already
    clamped by the caller to no later than ``now``. A time earlier than what is already settled counts as that."""

    gpus: int = 0
    holdback: float = HOLDBACK_SECONDS
    gpu_seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(KINDS, 0.0))
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(KINDS, 0.0))
    # The state machine: none (before the first run, after the job ended), down, startup, load, save, training.
    phase: str = "none"
    settled: float | None = None  # monotonic time up to which every second is counted
    origin: float | None = None  # monotonic time of the first event: every second since is a kind, or idle
    idle_seconds: float = 0.0  # seconds since the origin while the job had ended (not counted in any kind)
    run: Run | None = None
    runs: deque = field(default_factory=lambda: deque(maxlen=MAX_RUNS))
    run_count: int = 0
    bands: deque = field(default_factory=lambda: deque(maxlen=MAX_BANDS))
    loads: deque = field(default_factory=lambda: deque(maxlen=MAX_LOADS))  # (number, run, start, end), monotonic
    load_count: int = 0
    high_water: float | None = None  # the highest position ever reached
    position: float | None = None  # the current run's latest position
    position_at: float | None = None  # when it was reached (monotonic)
    # The last progress of any kind: a step, or tokens growing between steps (a job whose steps take minutes and
    # reports tokens meanwhile is not hung between them).
    advanced_at: float | None = None
    last_seen: float | None = None  # the run's last sign of life: an event, a step, a heartbeat, a log line
    heartbeat: float | None = None  # the run's client heartbeat interval, when it sends them
    before_save: str = "training"  # the phase a save interrupted
    # A save blocks training until the run shows progress during it (a step, growing tokens): an async save, or
    # one the checkpoint watcher saw while the job trained on, is not checkpoint_save time.
    save_blocks: bool = True
    saves_open: int = 0
    # A run's first step when the step time is still unknown: (its time, the steps it reports) until the next
    # step gives the step time and says how much of the wait before it was start-up.
    first: tuple[float, float, str, float | None] | None = None  # (time, steps, kind before, resumed from)
    # When the run said its training loop began (a start-up line: "Training starts at step N"): the steps up to its
    # first report took all the time since, however slow they were.
    loop_from: float | None = None
    intervals: RecentValues = field(default_factory=lambda: RecentValues(STEADY_INTERVALS))  # between reports
    step_durations: RecentValues = field(default_factory=lambda: RecentValues(STEADY_INTERVALS))  # per step
    step_buckets: list[int] = field(default_factory=lambda: [0] * (len(STEP_BUCKETS) + 1))
    step_sum: float = 0.0
    step_count: int = 0
    over_ideal: float = 0.0
    ended: bool = False
    fed: bool = False  # a progress feed said something: steps, or a client's start
    last_tick: float | None = None  # the exporter's last tick
    watching_since: float = -math.inf  # its ticks' return after a gap of its own (``tick``)

    # -- events -----------------------------------------------------------------------------------------------
    def start_run(self, at: float, offset: float, source: str, run_id: str | None = None, restart: bool = True) -> None:
        """A run starts at ``at``. The run alive goes on when this is the same one: its id, a first id for a run
        known without one, a start that is not a new process (``restart`` False: discovery finding a pod it
        already knew of), or a second feed's start of a run that has done no step yet. Otherwise the run alive
        ended at its last sign of life (restarted), and the wait since then is down."""
        if self.run is not None and self.run.end is None:
            same = (
                self.run.run_id in (None, run_id)
                if run_id is not None
                else not restart or self.position is None and self.phase in ("startup", "load")
            )
            if same:
                self.run.run_id = run_id or self.run.run_id
                self.last_seen = max(self.last_seen or at, at)
                return
            self.end_run(self.last_seen if self.last_seen is not None else at, offset, "restarted")
        at = self._at(at)
        self._settle(at, offset)
        self.fed = self.fed or source in ("client", "log")
        self.ended = False
        self.run_count += 1
        self.run = Run(self.run_count, at + offset, source, run_id)
        self.runs.append(self.run)
        self.phase, self.position, self.position_at, self.first = "startup", None, None, None
        self.advanced_at, self.loop_from = None, None
        self.last_seen, self.heartbeat, self.saves_open = at, None, 0

    def progress(self, at: float, offset: float, position: float, source: str, steps: bool = True) -> None:
        """The run reached ``position`` (a step, or a token total when ``steps`` is False) at ``at``."""
        if not math.isfinite(position) or position < 0:
            return
        self.fed = True
        if self.run is None or self.run.end is not None or self.phase in ("none", "down"):
            self.start_run(at, offset, source)
        elif self.position is not None and position < self.position:
            # The position went back with no start seen: a new process resumed from a checkpoint. The old run
            # ended at its last sign of life; the new one did at least one step before this report. It keeps the
            # old one's id: its reports carry that id (torchrun keeps one across its restarts), a new id would
            # have started a run before this.
            last = self.last_seen if self.last_seen is not None else at
            run_id = self.run.run_id
            self.end_run(last, offset, "restarted")
            self.start_run(max(at - (self.ideal_step() or 0.0), last), offset, source, run_id)
        at = self._at(at)
        run = self.run
        assert run is not None
        self.last_seen = max(self.last_seen or at, at)
        if self.phase == "training" and self.first is not None and self.position is not None:
            if position > self.position:
                self._settle_first(at, position, offset)
        if self.phase in ("startup", "load"):
            self._first_step(at, position, offset)
            return
        if self.position is None:
            self.position, self.position_at = position, at
            return
        done = position - self.position
        if done <= 0:
            return  # the same step again (a resend): a sign of life, no progress
        waited = at - (self.position_at if self.position_at is not None else at)
        ideal = self.ideal_step()
        busy = at - self._settled()
        if self.phase == "save" and self.save_blocks:
            # The first progress during a save: the save blocked until the steps began, then no longer.
            training = min(busy, done * ideal) if ideal else busy
            self._commit_until(at - training, offset, "checkpoint_save")
            self.save_blocks = False
        elif ideal and at - self._since(at) > self.stall_after() and done * ideal < busy:
            self._commit_until(at - done * ideal, offset, "stalled")
        elif steps and waited > 0 and self.first is None:
            # Steady: no save, load or stall within the steps (tokens growing meanwhile count as progress).
            self._observe_steps(waited, done, at - self._since(at) <= self.stall_after())
        self._commit_steps(at, self.position, position, offset)
        self.position, self.position_at = position, at

    def load(
        self, phase: str, at: float, offset: float, duration: float | None = None, resume: float | None = None
    ) -> None:
        """A checkpoint load ``started`` or ``finished`` (a finish with its duration needs no start)."""
        if self.run is None or self.run.end is not None or self.phase in ("none", "down"):
            self.start_run(at - (duration or 0.0), offset, "load")
        at = self._at(at)
        if resume is not None and self.run is not None:
            self.run.resume = resume
        self.last_seen = max(self.last_seen or at, at)
        if phase == "started":
            if self.phase in ("startup", "training"):
                self._settle(at, offset)
                self.phase = "load"
            return
        if self.phase != "load" and duration:
            self._commit_until(at - duration, offset, None)
            self.phase = "load"
        self._settle(at, offset)
        if self.phase == "load":
            self.phase = "startup"
        self.position, self.position_at = None, None  # steps count again from where the load resumed

    def resume_at(self, at: float, offset: float, resume: float, source: str) -> None:
        """The run trains next from ``resume`` (a start-up line: "Training starts at step N" is resume N - 1)."""
        if self.run is None or self.run.end is not None or self.phase in ("none", "down"):
            self.start_run(at, offset, source)
        if self.run is not None and self.position is None:
            self.run.resume = resume
            self.last_seen = max(self.last_seen or at, at)
            if self.phase == "startup":
                self.loop_from = self._at(at)

    def save(self, phase: str, at: float, offset: float, duration: float | None = None) -> None:
        """A checkpoint save ``started``, ``finished`` or ``failed``; a finish with its duration needs no start."""
        if self.run is None or self.run.end is not None or self.phase in ("none", "down"):
            return  # nothing alive to block
        at = self._at(at)
        if phase == "started":
            if self.phase != "save":
                self._settle(at, offset)
                self.before_save, self.phase, self.save_blocks = self.phase, "save", True
            self.saves_open += 1
            return
        if self.phase != "save":
            if not duration:
                return
            self._commit_until(at - duration, offset, None)
            self.before_save, self.phase, self.saves_open, self.save_blocks = self.phase, "save", 1, True
        self._settle(at, offset)
        self.saves_open = max(self.saves_open - 1, 0)
        if self.saves_open == 0:
            self.phase = self.before_save
            if self.phase == "training" and self.position is not None and self.save_blocks:
                self.position_at = at  # the next step's wait starts after the blocking save

    def advanced(self, at: float, offset: float) -> None:
        """The run progressed without a new step (its token total grew): not a stall, and a save under way does not
        block it (the time since the last settled moment was training)."""
        if self.run is None or self.run.end is not None:
            return
        if self.phase == "save" and self.before_save == "training" and self.save_blocks:
            self.save_blocks = False
            self._commit_until(self._at(at), offset, self._training_kind(self.position))
        if self.phase == "training" or self.phase == "save" and not self.save_blocks:
            self.advanced_at = max(self.advanced_at or at, at)
            self.last_seen = max(self.last_seen or at, at)

    def alive(self, at: float, heartbeat: float | None = None) -> None:
        """A sign of life of the run (a heartbeat, a log line with no step): not progress, but not dead."""
        if self.run is not None and self.run.end is None:
            self.last_seen = max(self.last_seen or at, at)
            if heartbeat:
                self.heartbeat = heartbeat

    def end_run(self, at: float, offset: float, reason: str) -> None:
        """The run alive ended at ``at``: down from there, unless the job itself ended (then nothing accrues)."""
        if self.run is None or self.run.end is not None:
            if reason in JOB_ENDS and not self.ended:
                self._settle(self._at(at), offset)
                self.phase, self.ended = "none", True
            return
        at = self._at(at)
        self._settle(at, offset)
        self.run.end, self.run.end_reason = at + offset, reason
        self.phase = "none" if reason in JOB_ENDS else "down"
        self.ended = reason in JOB_ENDS
        self.first, self.saves_open = None, 0

    def set_gpus(self, now: float, offset: float, gpus: int) -> None:
        """The job's GPUs here changed: what is pending is counted at the old count, later time at the new one."""
        gpus = max(int(gpus), 0)
        if gpus != self.gpus:
            if self.settled is not None and self.phase != "none":
                self._settle(self._at(now), offset)
            self.gpus = gpus

    def tick(self, now: float, offset: float, gap: float = TICK_GAP_SECONDS) -> None:
        """A lost client (no heartbeat for a few intervals) ends its run; pending time older than the holdback is
        committed as what it looks like. After a gap in the exporter's own ticks (it was stopped, starved), the
        heartbeats sent meanwhile wait in its socket: a run's silence counts from its return at the earliest, and
        from the ledger's first tick (the job may have been first heard of just before a gap). ``gap``: ``tick_gap``
        of the tick's interval."""
        if self.last_tick is None or now - self.last_tick > gap:
            self.watching_since = now
        self.last_tick = now
        if (
            self.run is not None
            and self.run.end is None
            and self.heartbeat
            and self.last_seen is not None
            and now - max(self.last_seen, self.watching_since) > HEARTBEAT_MISSES * self.heartbeat
        ):
            self.end_run(self.last_seen, offset, "lost")
        if self.settled is not None and now - self.holdback > self.settled:
            if self.first is not None and now - self.holdback >= self.first[0]:
                self._settle_first(None, None, offset)
            self._commit_until(now - self.holdback, offset, None)

    def finish(self, now: float, offset: float) -> None:
        """Settle everything up to ``now`` as it looks (the exporter stops, a test reads the truth)."""
        if self.first is not None:
            self._settle_first(None, None, offset)
        if self.settled is not None:
            self._settle(self._at(now), offset)

    # -- figures ----------------------------------------------------------------------------------------------
    def ideal_step(self) -> float | None:
        if not self.step_durations:
            return None
        return self.step_durations.median()

    def stall_after(self) -> float:
        if not self.intervals:
            return math.inf  # no cadence yet: a wait before its second report is not known to be a stall
        return max(STALL_MIN_SECONDS, STALL_FACTOR * self.intervals.median())

    def is_past_run(self, run_id: str) -> bool:
        """Whether ``run_id`` names a run of the job that a later run replaced (a late report of it is no new run).
        The newest run's id is never past: a run lost for want of heartbeats that reports again is that run."""
        newest = self.runs[-1].run_id if self.runs else None
        return run_id != newest and any(run.run_id == run_id for run in self.runs)

    def restarts(self) -> int:
        return max(self.run_count - 1, 0)

    def view(self, now: float, offset: float) -> LedgerView:
        total = sum(self.gpu_seconds.values())
        seconds_total = sum(self.seconds.values())
        if total > 0:
            goodput: float | None = self.gpu_seconds["productive"] / total
        elif seconds_total > 0:
            goodput = self.seconds["productive"] / seconds_total
        else:
            goodput = None
        cumulative, running = [], 0
        for count in self.step_buckets:
            running += count
            cumulative.append(running)
        return LedgerView(
            gpu_seconds=dict(self.gpu_seconds),
            seconds=dict(self.seconds),
            goodput=goodput,
            restarts=self.restarts(),
            runs=tuple(run.as_json() for run in self.runs),
            bands=tuple((number, kind, start + offset, end + offset) for number, kind, start, end in self.bands),
            step_buckets=tuple(cumulative),
            step_sum=self.step_sum,
            step_count=self.step_count,
            loads=tuple((n, run, start + offset, end + offset) for n, run, start, end in self.loads),
            ideal_step_seconds=self.ideal_step(),
            over_ideal_seconds=self.over_ideal,
            pending_seconds=max(now - self.settled, 0.0) if self.settled is not None and self.phase != "none" else 0.0,
            state=self._presumed(now),
        )

    # -- internals --------------------------------------------------------------------------------------------
    def _settled(self) -> float:
        return self.settled if self.settled is not None else 0.0

    def _at(self, at: float) -> float:
        """An event time no earlier than what is settled: the counted past is not rewritten."""
        return at if self.settled is None or at >= self.settled else self.settled

    def _presumed(self, at: float) -> str:
        """The kind the time at ``at`` gets if nothing more is heard (pending time committed by the holdback)."""
        if self.phase == "none":
            return "none"
        if self.phase == "down":
            return "down"
        if self.phase == "startup":
            if self.loop_from is not None and at > self.loop_from:
                return self._training_kind(self.run.resume if self.run is not None else None)
            return "startup"
        if self.phase == "load":
            return "checkpoint_load"
        if self.phase == "save" and self.save_blocks:
            return "checkpoint_save"
        since = self._since(at)
        if at - since > self.stall_after():
            return "stalled"
        return self._training_kind(self.position)

    def _since(self, at: float) -> float:
        """When the run last progressed (a step or growing tokens), else its last sign of life, else ``at``."""
        known = [t for t in (self.position_at, self.advanced_at) if t is not None]
        if known:
            return max(known)
        return self.last_seen if self.last_seen is not None else at

    def _training_kind(self, position: float | None) -> str:
        if position is not None and self.high_water is not None and position < self.high_water:
            return "wasted"
        return "productive"

    def _settle(self, at: float, offset: float) -> None:
        """Commit everything pending up to ``at`` as it looks."""
        if self.first is not None:
            self._settle_first(None, None, offset)
        self._commit_until(at, offset, None)

    def _commit_until(self, until: float, offset: float, kind: str | None) -> None:
        """Count [settled, until] as ``kind``, or as presumed (a training wait turns stalled at its threshold)."""
        if self.settled is None:
            self.settled = self.origin = until
            return
        if until <= self.settled:
            return
        if kind is None and (self.phase == "training" or self.phase == "save" and not self.save_blocks):
            if self.position_at is not None or self.last_seen is not None:
                onset = self._since(until) + self.stall_after()
                if self.settled < onset < until:
                    self._count(self._training_kind(self.position), self.settled, onset, offset)
        if kind is None and self.phase == "startup" and self.loop_from is not None and self.settled < self.loop_from:
            self._count("startup", self.settled, min(self.loop_from, until), offset)
        self._count(kind or self._presumed(until), self.settled, until, offset)

    def _count(self, kind: str, start: float, end: float, offset: float = 0.0) -> None:
        seconds = end - start
        if seconds <= 0:
            return
        self.settled = end
        if kind == "none":
            self.idle_seconds += seconds
            return
        self.seconds[kind] += seconds
        self.gpu_seconds[kind] += seconds * self.gpus
        # Bands are kept on the monotonic clock (a wall-clock step does not tear them) and shown in Unix time.
        number = self.run.number if self.run is not None else 0
        if self.bands and self.bands[-1][:2] == (number, kind) and self.bands[-1][3] == start:
            self.bands[-1] = (number, kind, self.bands[-1][2], end)
            return
        if self.bands and self.bands[-1][1] == "checkpoint_load":
            # A band after a load's band: that load ended.
            self.load_count += 1
            self.loads.append((self.load_count, *self.bands[-1][:1], *self.bands[-1][2:]))
        self.bands.append((number, kind, start, end))

    def _commit_steps(self, at: float, start: float | None, end: float, offset: float) -> None:
        """Count the pending time up to ``at`` as training over positions (start, end]: the share of them at or
        below the high-water mark is wasted, the rest productive; then raise the high-water mark."""
        busy_from = self._settled()
        busy = at - busy_from
        if busy > 0:
            high = self.high_water
            if start is None or high is None or end <= start:
                wasted_share = 0.0 if high is None or end > high else 1.0
            else:
                wasted_share = min(max((min(end, high) - start) / (end - start), 0.0), 1.0)
            split = busy_from + busy * wasted_share
            self._count("wasted", busy_from, split, offset)
            self._count("productive", split, at, offset)
        self.high_water = end if self.high_water is None else max(self.high_water, end)

    def _first_step(self, at: float, position: float, offset: float) -> None:
        """The run's first step: the steps it reports took their ideal time at its end, the rest was start-up (or
        the load, when no end of the load was seen); with no step time known yet, the next step decides. Where the
        run said when its loop began, the steps took all the time since."""
        run = self.run
        assert run is not None
        before = "checkpoint_load" if self.phase == "load" else "startup"
        resume = run.resume
        if resume is None and self.high_water is None:
            resume = 0.0  # the job's first run here: it starts from the beginning as far as we know
        steps = position - resume if resume is not None and position > resume else 1.0
        ideal = self.ideal_step()
        self.phase = "training"
        if self.loop_from is not None:
            training = max(at - max(self.loop_from, self._settled()), 0.0)
            self.loop_from = None
            self._commit_until(at - training, offset, before)
            run.first_step_time = at - training + offset
            self._commit_steps(at, resume, position, offset)
            self.position, self.position_at = position, at
            return
        if ideal is None:
            self.first = (at, steps, before, resume)
            self.position, self.position_at = position, at
            return
        training = min(steps * ideal, max(at - self._settled(), 0.0))
        self._commit_until(at - training, offset, before)
        run.first_step_time = at - training + offset
        self._commit_steps(at, resume, position, offset)
        self.position, self.position_at = position, at

    def _settle_first(self, at: float | None, position: float | None, offset: float) -> None:
        """Settle a run's first step once the second gives the step time (``at``, ``position``), or, with neither
        (another event came first), count its whole wait as start-up."""
        first = self.first
        assert first is not None and self.run is not None
        first_at, steps, before, resume = first
        self.first = None
        first_position = self.position
        assert first_position is not None
        if at is not None and position is not None and position > first_position and at > first_at:
            per_step = (at - first_at) / (position - first_position)
            training = min(steps * per_step, max(first_at - self._settled(), 0.0))
        else:
            training = 0.0
        self._commit_until(first_at - training, offset, before)
        self.run.first_step_time = first_at - training + offset
        self._commit_steps(first_at, resume, first_position, offset)

    def _observe_steps(self, waited: float, done: float, steady: bool) -> None:
        per_step = waited / done
        if not math.isfinite(per_step):
            return
        self.intervals.append(waited)
        if not steady:
            return
        count = max(int(round(done)), 1)
        index = bisect.bisect_left(STEP_BUCKETS, per_step)
        self.step_buckets[index] += count
        self.step_sum += waited
        self.step_count += count
        ideal = self.ideal_step()
        if ideal is not None and per_step > ideal:
            self.over_ideal += (per_step - ideal) * done
        self.step_durations.append(per_step)
