"""Training jobs on this node: the tracker of their state.

A job's state (``mfu_exporter.model.job.Job``) is what its progress reports (``mfu_exporter.model.progress``), log
lines, checkpoint events and discovery said of it; ``JobTracker`` keeps it (reports merged, discovery's finds, expiry)
and hands out each job's MFU view (``mfu_exporter.model.job_view``), computed from that state. Nothing here knows
about HTTP; its refusals are ``mfu_exporter.model.errors.IngestError`` (``ValidationError`` 400, ``TooManyJobs`` 429).

A job ends when a report says ``state`` finished, failed or cancelled: its MFU, rate, ETA, peak and GPU series go at
once, it no longer takes a slot under ``max_jobs``, and its counters stay until ``job_ttl`` (or until
``max_jobs`` ended jobs are newer). A running report after that is a new run, on the same counters.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

from mfu_exporter.config import DEFAULTS
from mfu_exporter.model.datawait import DataWaitMeter
from mfu_exporter.model.discovery_jobs import DiscoveredJob
from mfu_exporter.model.errors import TooManyJobs
from mfu_exporter.model.job import Job, gpu_facts
from mfu_exporter.model.job_view import JobView, ViewBuilder, flops_per_token
from mfu_exporter.model.ledger import Ledger, LedgerView, tick_gap
from mfu_exporter.model.progress import (
    FACT_DEFAULTS,
    MAX_FUTURE_SECONDS,
    REPORT_RESOLUTION_SECONDS,
    RUNNING,
    ProgressReport,
    rate_window,
)
from mfu_exporter.model.readings import GpuInfo, GpuReading
from mfu_exporter.model.resume import SavedCounters, counters_start

log = logging.getLogger(__name__)

# A job's view is computed again when the job changes, at each tick (mfu.interval), and on a read when the view it has is older
# than this (the tick's period): reports, scrapes and status requests between two ticks share one computation.
VIEW_MAX_AGE = 1.0


@dataclass(frozen=True)
class Accepted:
    """What the ingest API answers for an accepted report: the job, its state and run after it, and its version
    (counts the job's changes, ticks included)."""

    job: str
    state: str
    run: int
    version: int


class JobTracker:
    """Thread-safe store of jobs reporting to this node, and of the jobs discovery finds on it.

    ``gpu_inventory`` and ``gpu_readings`` are the GPU source's, for the jobs' views (``ViewBuilder``).

    A discovered job and a reporting job of one name are one job. Discovered jobs have their own cap (the
    discovery source's ``max_jobs``), so they never take a reporting job's place under ``ingest.max_jobs``; one
    that discovery stops finding ends, unless it reports too (then only its discovery facts go).
    """

    def __init__(
        self,
        configured: dict[str, dict] | None = None,
        window: float = DEFAULTS.mfu.window,  # the config table's defaults (mfu_exporter/config/)
        max_jobs: int = DEFAULTS.ingest.max_jobs,
        job_ttl: float = DEFAULTS.ingest.job_ttl,
        gpu_inventory: Callable[[], list[GpuInfo] | None] = lambda: None,
        clock: Callable[[], float] = time.time,
        gpu_readings: Callable[[], dict[int, GpuReading] | None] = lambda: None,
        monotonic: Callable[[], float] = time.monotonic,
        interval: float = 1.0,  # seconds between ticks (the service's mfu.interval): a gap in them is measured on it
    ):
        self._configured = configured or {}
        self._tick_gap = tick_gap(interval)
        self._interval = interval
        self.window = window
        self.max_jobs = max_jobs
        self.job_ttl = job_ttl
        self._builder = ViewBuilder(self._configured, window, gpu_inventory, gpu_readings)
        self._clock = clock
        self._monotonic = monotonic  # the ledgers' clock: a wall-clock step moves no second from one kind to another
        self._born = monotonic()  # a ledger counts no time before this exporter started
        self._lock = threading.Lock()
        self._jobs: dict[str, Job] = {}
        # Each job's view as last computed, (its version, clock, view): shared by reads until the job changes or ages.
        self._kept: dict[str, tuple[int, float, JobView]] = {}
        self._saved: dict[str, SavedCounters] = {}  # an earlier exporter's counters, until each job counts again
        self._warned: set[tuple[str, str]] = set()  # (job, reason) already logged
        self.generation = 0
        self._expiry_bound = (float("inf"), 0.0)  # (clock of the last pass over the jobs, their oldest arrival then)

    def report(self, report: ProgressReport, view: bool = True, arrived: float | None = None) -> JobView | None:
        """The report merged into its job; the job's view after it (``view``), else None. A log source feeds many
        lines at once and needs no view of each (a view looks the peak up); the tick logs its reason then.
        ``arrived``: our clock when the count reached this node (a log line read before the tick), else now."""
        now = self._clock()
        with self._lock:
            job = self._merge(report, now, arrived)
            return self._answer(job, now) if view else None

    def accept(self, report: ProgressReport) -> Accepted:
        """The report merged into its job, answered without the job's view (the ingest API's answer): the view is
        computed by the tick, or by the first read after the change (``views``)."""
        now = self._clock()
        with self._lock:
            job = self._merge(report, now)
            return Accepted(job.name, job.state, job.runs, job.version)

    def _merge(self, report: ProgressReport, now: float, arrived: float | None = None) -> Job:
        """``report`` merged into its job (the lock held); the job."""
        self._expire(now)
        job = self._jobs.get(report.job)
        if job is None or not (job.reported or job.touched):
            # New to the ingest APIs (a job only discovered so far takes no slot until it reports).
            if report.state == RUNNING:
                self._admit()
            if job is None:
                job = Job(report.job, dict(self._configured.get(report.job, {})), created=now)
                self._jobs[report.job] = job
        elif job.state != RUNNING and report.state == RUNNING:
            self._admit()
            self._new_run(job, now)
        if report.run is not None and job.ledger.is_past_run(report.run):
            # A late report of a run that has ended (its process is gone, a newer one runs): neither a restart nor
            # progress of the run alive.
            return job
        job.facts.update(report.facts)
        at = report.time if report.time is not None else now
        if report.tokens_total is None:
            # An event of the run (start, heartbeat, checkpoint load): its ledger's, no totals to count.
            job.touched = True
            job.last_arrival = now
            self._ledger_report(job, report, at, now)
            if report.state != job.state:
                self._end(job, report.state, now)
            self._changed(job)
            return job
        before = job.tokens_total if job.reported else report.tokens_total
        if not job.reported:
            self._first_count(job, report.tokens_total, continues=report.continues)
        elif report.tokens_total < job.tokens_total:
            # Restarted from a checkpoint: a new window, never a negative rate; the exported counters keep
            # counting up (re-trained tokens are work done again), so rate() sees no false reset spike.
            job.window.clear()
            job.restarts += 1
            job.replayed_tokens += job.tokens_total - report.tokens_total
        if job.window and at < job.window[-1][0]:
            at = job.window[-1][0]  # reports out of order by the job's clock: keep the window monotonic
        if job.window and at > job.window[-1][0]:
            job.interval = at - job.window[-1][0]
            job.intervals.append(job.interval)
        if len(job.window) >= 2 and at - job.window[-2][0] < REPORT_RESOLUTION_SECONDS:
            # Jobs may report every step: the rate needs only the window's ends, so reports closer than the
            # resolution replace the newest point and a window holds ~one point per second, not per step.
            job.window[-1] = (at, report.tokens_total)
        else:
            job.window.append((at, report.tokens_total))
        while len(job.window) > 2 and job.window[1][0] < at - rate_window(self.window, job.cadence):
            job.window.popleft()
        job.tokens_total = report.tokens_total
        if report.data_wait_seconds is not None:
            self._data_wait(job, at, report.data_wait_seconds, "client")
        if report.step is not None:
            job.step = report.step
        job.last_report_time = at
        arrival = now if arrived is None else min(arrived, now)
        job.fed = arrived is not None
        job.progress_arrival = max(job.progress_arrival or arrival, arrival)  # counts fed in order never go back
        job.last_arrival = max(job.last_arrival, arrival)
        job.reported = True
        job.feed_reason = None  # a total arrived: a log's word on why it had none (another feed's) is over
        self._count_flops(job)
        self._ledger_report(job, report, at, now, before)
        if job.ledger.run_count != job.window_run:
            # A new process since the window's first count: its old figure must not come back.
            job.window = deque([job.window[-1]])
            job.window_run = job.ledger.run_count
        if report.state != job.state:
            self._end(job, report.state, now)
        self._changed(job)
        return job

    def _first_count(self, job: Job, total: float, continues: bool) -> None:
        """The job's first token count here: its counters begin at 0, or where an earlier exporter left them."""
        start = counters_start(self._saved.pop(job.name, None), total, continues, self._clock())
        job.carried_tokens, job.flops_total, job.counted_tokens, job.counter_created = start

    def counters(self) -> dict[str, SavedCounters]:
        """Each counting job's counters, for an exporter after this one to resume (``restore``)."""
        now = self._clock()
        with self._lock:
            # Restored and not counting yet: kept for a later exporter still, until the job's TTL.
            self._saved = {name: c for name, c in self._saved.items() if now - c.seen <= self.job_ttl}
            kept = dict(self._saved)
            for job in self._jobs.values():
                if job.reported:
                    created = job.counter_created if job.counter_created is not None else job.created
                    counted = (job.tokens_processed, job.tokens_total, job.flops_total, created)
                    kept[job.name] = SavedCounters(*counted, seen=max(job.last_arrival, job.created))
            return kept

    def restore(self, saved: dict[str, SavedCounters]) -> None:
        """What an earlier exporter counted (``counters``): each job's counters resume at its first count here."""
        with self._lock:
            self._saved = {name: counters for name, counters in saved.items() if name not in self._jobs}

    def _answer(self, job: Job, now: float) -> JobView:
        answer = self._view(job, now)
        self._warn(answer)
        return answer

    def _changed(self, job: Job) -> None:
        """A change to the job: its kept view is stale, and the model's generation (its count of changes) moves."""
        job.version += 1
        self.generation += 1

    # -- the time ledger (mfu_exporter.model.ledger) ----------------------------------------------------------------
    def _clocks(self, at: float | None, now: float) -> tuple[float, float, float]:
        """(the event's monotonic time, monotonic now, Unix minus monotonic time). An event's own Unix time counts
        back from now on the monotonic clock, never past it: a report that arrives late keeps its time."""
        mono = self._monotonic()
        when = mono if at is None else mono - min(max(now - at, 0.0), MAX_FUTURE_SECONDS)
        return max(when, min(self._born, mono)), mono, now - mono

    def _ledger(self, job: Job, mono: float, offset: float) -> Ledger:
        job.ledger.set_gpus(mono, offset, self._job_gpus(job) or 0)
        return job.ledger

    def _job_gpus(self, job: Job) -> int | None:
        return self._builder.resolve_gpus(gpu_facts({**FACT_DEFAULTS, **job.facts}, job))[1]

    def _ledger_report(self, job: Job, report: ProgressReport, at: float, now: float, before: float = 0.0) -> None:
        """The report for the job's ledger; ``before`` is the job's token total before it."""
        when, mono, offset = self._clocks(at, now)
        ledger = self._ledger(job, mono, offset)
        if report.event == "start" or report.run is not None:
            ledger.start_run(when, offset, "client", report.run, restart=report.event == "start")
        if report.event == "heartbeat" or report.heartbeat:
            ledger.alive(when, report.heartbeat)
        if report.event == "checkpoint_load_started":
            ledger.load("started", when, offset, resume=report.step)
        elif report.event == "checkpoint_load_finished":
            ledger.load("finished", when, offset, duration=report.duration, resume=report.step)
        elif report.tokens_total is not None:
            position = report.step if report.step is not None else report.tokens_total
            ledger.progress(when, offset, float(position), "client", steps=report.step is not None)
            if report.step is not None and report.tokens_total > before:
                ledger.advanced(when, offset)  # tokens grew within the step: progress, whatever the step says
        if report.state != RUNNING:
            ledger.end_run(when, offset, report.state)

    def run_event(
        self,
        name: str,
        event: str,
        at: float | None = None,
        *,
        step: int | None = None,
        duration: float | None = None,
        source: str = "log",
    ) -> None:
        """What a log (or another feed) says of the job's run: ``start`` (start-up lines: a new process),
        ``checkpoint_load_started``/``_finished`` (``step``: resumed from), ``training_starts`` (``step``: the
        first step it trains), ``alive`` (a line with nothing else). Needs the job known (observe or touch)."""
        with self._job_ledger(name, at) as found:
            if found is None:
                return
            ledger, when, offset = found
            if event == "start":
                ledger.start_run(when, offset, source)
            elif event in ("checkpoint_load_started", "checkpoint_load_finished"):
                phase = "started" if event.endswith("started") else "finished"
                ledger.load(phase, when, offset, duration=duration, resume=step)
            elif event == "training_starts" and step is not None:
                ledger.resume_at(when, offset, float(max(step - 1, 0)), source)
            else:
                ledger.alive(when)

    def data_wait(self, name: str, total: float, at: float, source: str) -> None:
        """A running total of one rank's seconds waiting for input, from a feed other than the progress API (a
        log: ``source`` "log:<framework>"). Needs the job known (observe or touch)."""
        with self._lock:
            job = self._jobs.get(name)
            if job is None:
                return
            self._data_wait(job, at, total, source)
            self._changed(job)

    def _data_wait(self, job: Job, at: float, total: float, source: str) -> None:
        if job.data_wait is None:
            job.data_wait = DataWaitMeter(source)
        job.data_wait.observe(at, total, self._job_gpus(job), source)

    def checkpoint_event(self, name: str, phase: str, at: float, duration: float | None) -> None:
        """A checkpoint write of the job started, finished or failed (the checkpoint tracker tells, for every feed)."""
        with self._job_ledger(name, at) as found:
            if found is not None:
                ledger, when, offset = found
                ledger.save(phase, when, offset, duration)

    @contextlib.contextmanager
    def _job_ledger(self, name: str, at: float | None) -> Iterator[tuple[Ledger, float, float] | None]:
        """Under the lock: the job's ledger (its GPU count brought up to date), the event's monotonic time and the
        clocks' offset; None for a job not known. A change to the model either way."""
        now = self._clock()
        with self._lock:
            job = self._jobs.get(name)
            if job is None:
                yield None
                return
            when, mono, offset = self._clocks(at, now)
            yield self._ledger(job, mono, offset), when, offset
            self._changed(job)

    def observe(
        self,
        name: str,
        *,
        step: int | None = None,
        framework_mfu: float | None = None,
        framework_tflops_per_gpu: float | None = None,
        reason: str | None = None,
        facts: dict[str, Any] | None = None,
        at: float | None = None,
    ) -> None:
        """What a log line says besides a token total: the step, the framework's own figures, model facts it
        printed, or why the line gives no total (``reason``; None once a total arrives through ``report``).
        ``at`` is the line's time (the step's, for the ledger). Creates the job like touch (and raises TooManyJobs
        like it)."""
        self.touch(name)
        with self._lock:
            job = self._jobs.get(name)
            if job is None:
                return
            if facts:
                job.facts.update(facts)
            if step is not None:
                job.step = step
                when, mono, offset = self._clocks(at, self._clock())
                self._ledger(job, mono, offset).progress(when, offset, float(step), "log")
            if framework_mfu is not None:
                job.framework_mfu = framework_mfu
            if framework_tflops_per_gpu is not None:
                job.framework_tflops_per_gpu = framework_tflops_per_gpu
            job.feed_reason = reason
            job.last_arrival = max(job.last_arrival, self._clock())
            self._changed(job)

    def gpu_count(self, name: str) -> int | None:
        """The job's GPUs on this node as its MFU counts them: its gpus fact, else the GPUs discovery saw it hold,
        else the GPU inventory (``_gpu_facts``, the rule the MFU's peak follows)."""
        with self._lock:
            job = self._jobs.get(name)
            facts = {**FACT_DEFAULTS, **(job.facts if job else self._configured.get(name, {}))}
            facts = gpu_facts(facts, job)
        return self._builder.resolve_gpus(facts)[1]

    def _admit(self) -> None:
        """Refuse one more running job past the cap; ended jobs keep their counters but take no slot, and jobs only
        discovered count against discovery.max_jobs instead."""
        if sum(1 for j in self._jobs.values() if j.state == RUNNING and (j.reported or j.touched)) >= self.max_jobs:
            raise TooManyJobs(f"this exporter already tracks {self.max_jobs} running jobs (ingest.max_jobs)")

    def _new_run(self, job: Job, now: float) -> None:
        """A report after the job ended: a run of its own, whose counters carry on from the last run's."""
        log.info("job %s: reporting again after it %s: run %d starts", job.name, job.state, job.runs + 1)
        job.carried_tokens += job.tokens_total + job.replayed_tokens
        job.tokens_total = job.replayed_tokens = 0.0
        job.restarts = 0
        job.step = None
        job.window.clear()
        job.facts = dict(self._configured.get(job.name, {}))
        job.state, job.ended, job.runs = RUNNING, None, job.runs + 1
        job.framework_mfu = job.framework_tflops_per_gpu = job.feed_reason = None
        job.created = now
        self._warned = {key for key in self._warned if key[0] != job.name}

    def _end(self, job: Job, state: str, now: float) -> None:
        if job.state == RUNNING:
            log.info(
                "job %s %s (its progress report says so): its MFU series end, its counters stay for %s",
                job.name,
                state,
                "ingest.job_ttl",
            )
        job.state, job.ended = state, now
        job.window.clear()
        ended = sorted((j for j in self._jobs.values() if j.state != RUNNING), key=lambda j: j.ended or 0.0)
        for old in ended[: max(len(ended) - self.max_jobs, 0)]:
            # Ended jobs are bounded too, or a stream of short runs would grow memory and /metrics until the TTL.
            self._forget(old.name)

    def _count_flops(self, job: Job) -> None:
        """Add the tokens not yet counted at the job's current FLOPs per token: the counter never goes back, even
        when the job changes its model facts (an earlier token keeps the FLOPs it was counted with)."""
        processed = job.processed_floor = job.tokens_processed  # each count's value is the floor of the next
        fpt = flops_per_token({**FACT_DEFAULTS, **job.facts})
        if fpt is None:
            return  # counted once params arrive: then all tokens so far, as if they had been known from the start
        if processed > job.counted_tokens:
            job.flops_total += fpt * (processed - job.counted_tokens)
            job.counted_tokens = processed

    def heard(self, names: Iterable[str], until: float, every: float) -> None:
        """A feed has read the logs of the jobs ``names`` whole up to ``until`` (our clock), and delivers what it
        reads every ``every`` seconds: a fed job is silent up to then at least, whatever the tick still waits for."""
        with self._lock:
            for name in names:
                job = self._jobs.get(name)
                if job is not None and (job.heard_until is None or until > job.heard_until):
                    job.heard_until = until
                    # Twice the longest a delivery takes (the feed's, then the tick's): a load may delay either.
                    job.feed_lag = 2.0 * (every + self._interval)
                    self._changed(job)  # its silence moved: a view kept of it is stale

    def touch(self, name: str) -> None:
        """Create a job known only from another API (checkpoints) so it counts against the cap."""
        now = self._clock()
        with self._lock:
            self._expire(now)
            job = self._jobs.get(name)
            if job is None or not (job.reported or job.touched):
                self._admit()
                if job is None:
                    job = self._jobs[name] = Job(name, dict(self._configured.get(name, {})), created=now)
                job.touched = True
                self._changed(job)

    def set_discovered(self, found: dict[str, DiscoveredJob]) -> None:
        """What discovery finds now: new jobs begin, known ones get its facts, the ones it no longer finds end
        (or, when they also report, keep only what they report)."""
        now = self._clock()
        with self._lock:
            changed = False
            when, mono, offset = self._clocks(None, now)
            for name, discovered in found.items():
                job = self._jobs.get(name)
                if job is None:
                    job = self._jobs[name] = Job(name, dict(self._configured.get(name, {})), created=now)
                    changed = True
                if job.discovered != discovered:
                    job.discovered = discovered
                    changed = True
                pods = frozenset(
                    (p.scheduler, p.namespace, p.pod, p.slurm_job_id, step)
                    for p in discovered.pods
                    for step in (p.slurm_steps.split(",") if p.slurm_steps else [""])
                )
                if pods != job.pods:
                    # Found again, or in a pod (a Slurm step) it was not in before: a new process, a new run.
                    # Found for the first time: the run it is in, whose start we did not see.
                    restart = job.pods is not None and bool(pods - job.pods)
                    if job.pods is None or restart:
                        self._ledger(job, mono, offset).start_run(when, offset, "discovery", restart=restart)
                    job.pods = pods
                job.version += 1
            for name, job in list(self._jobs.items()):
                if job.pods is not None and name not in found:
                    # Its pod (or Slurm step) went away: the run ended at its last sign of life.
                    ledger = self._ledger(job, mono, offset)
                    ledger.end_run(ledger.last_seen if ledger.last_seen is not None else when, offset, "gone")
                    job.pods = None
                    job.version += 1
                    changed = True
                if job.discovered is not None and name not in found:
                    job.discovered = None
                    job.version += 1
                    changed = True
                    self._expiry_bound = (float("inf"), 0.0)  # it may expire now: the next pass looks at every job
                    if not (job.reported or job.touched):
                        self._forget(name)
            if changed:
                self.generation += 1

    def names(self) -> list[str]:
        with self._lock:
            return list(self._jobs)

    def is_discovered(self, name: str) -> bool:
        """Whether the job model holds the job as discovery last found it (its GPUs known to ``gpu_count``)."""
        with self._lock:
            job = self._jobs.get(name)
            return job is not None and job.discovered is not None

    def views(self) -> list[JobView]:
        """Every job as it stands now; a read that changes nothing (scrapes and the status API call it, from the
        encoder's threads too). A job past ``job_ttl`` is left out, though the tick or the next report forgets it.
        Each job's view is the one kept since its last change or tick while it is younger than ``VIEW_MAX_AGE``."""
        now = self._clock()
        with self._lock:
            return self._views(now)

    def tick(self) -> list[JobView]:
        """The 1 s evaluation: forget the jobs past ``job_ttl``, log once each job's new reason for having no MFU,
        and return the views (``views()`` then). Reads never do this, so a scrape leaves the model as it found it."""
        now = self._clock()
        with self._lock:
            self._expire(now)
            _, mono, offset = self._clocks(None, now)
            for job in self._jobs.values():
                self._ledger(job, mono, offset).tick(mono, offset, self._tick_gap)
                job.version += 1  # its ledger moved on: every view is computed again, once, here
            views = self._views(now)
            for view in views:
                self._warn(view)
            return views

    def _views(self, now: float) -> list[JobView]:
        # Jobs that report first (their formula MFU is the headline), then those only discovered; each in the order
        # they appeared.
        ordered = sorted(
            (job for job in self._jobs.values() if not self._expired(job, now)),
            key=lambda job: not (job.reported or job.touched),
        )
        return [self._view(job, now) for job in ordered]

    def _expired(self, job: Job, now: float) -> bool:
        # A job discovery still finds holds GPUs here: it does not expire for want of reports.
        return job.discovered is None and now - max(job.last_arrival, job.created) > self.job_ttl

    def _warn(self, view: JobView) -> None:
        """Log a running job's reason for having no MFU, once per job and reason. Per job: two jobs without params
        each deserve a line, though the reason reads the same. A job only discovered has no formula MFU by nature
        (its hardware figures stand in): nothing to warn about."""
        if (
            not (view.reason and view.running and "reported" in view.found_by)
            or (view.name, view.reason) in self._warned
        ):
            return
        self._warned.add((view.name, view.reason))
        log.warning("job %s: no MFU: %s", view.name, view.reason)

    def _expire(self, now: float) -> None:
        # Every report comes here: skip the pass over the jobs while even the oldest arrival seen at the last pass is
        # within the TTL. Arrivals only move forward, and new ones are at least that pass's clock, so the oldest is a
        # bound for all; a clock that went back since that pass makes a full pass.
        scanned_at, oldest = self._expiry_bound
        if scanned_at <= now and now - oldest <= self.job_ttl:
            return
        expired = [name for name, job in self._jobs.items() if self._expired(job, now)]
        for name in expired:
            self._forget(name)
            self.generation += 1
        self._expiry_bound = (now, min([now, *(max(j.last_arrival, j.created) for j in self._jobs.values())]))

    def _forget(self, name: str) -> None:
        """Drop the job, its kept view and its logged reasons: a job of the same name later is a new one, and what
        is kept per job stays as small as the jobs."""
        del self._jobs[name]
        self._kept.pop(name, None)
        self._warned = {key for key in self._warned if key[0] != name}

    def _view(self, job: Job, now: float) -> JobView:
        kept = self._kept.get(job.name)
        if kept is not None and kept[0] == job.version and 0.0 <= now - kept[1] < VIEW_MAX_AGE:
            return kept[2]
        view = self._builder.view(job, now, self._ledger_view(job, now))
        self._kept[job.name] = (job.version, now, view)
        return view

    def _ledger_view(self, job: Job, now: float) -> LedgerView | None:
        if not job.ledger.fed:
            return None  # no progress feed: its steps cannot be told from a hang, so its time is not split
        _, mono, offset = self._clocks(None, now)
        return job.ledger.view(mono, offset)
