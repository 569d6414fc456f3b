"""Checkpoint writes per job: the ingest event model and the tracker both feeds fill.

Two feeds fill one ``CheckpointTracker``. The ingest API (``POST /api/v1/checkpoints``, parsed by
``parse_checkpoint_event``) carries the job's own started, finished or failed events with its own times. The
checkpoint source's directory watches (``mfu_exporter.sources.checkpoint``) see writes appear on disk.

Nothing here knows about HTTP or files: bad events raise ``ValidationError`` like progress reports do, the late end
of a write already counted raises ``CheckpointConflict`` (both ``mfu_exporter.model.errors.IngestError``).
"""

from __future__ import annotations

import bisect
import logging
import math
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from mfu_exporter.model.errors import CheckpointConflict, ValidationError
from mfu_exporter.model.progress import reject_unknown, require_object, validate_job_name, validate_time

log = logging.getLogger(__name__)

DURATION_BUCKETS = (1, 2, 5, 10, 15, 30, 45, 60, 120, 300, 600, 900, 1800, 3600)


MAX_CHECKPOINT_BYTES = 2**50  # 1 PiB: far above a 1T-parameter model with its Adam state (~16 TB)


MAX_DURATION_SECONDS = 86400.0
# A write timed below a millisecond says nothing about the storage: its bytes over that time could be any bandwidth,
# up to an infinite one (a petabyte over 5e-324 s). Such a write gets no bandwidth.
MIN_TIMED_SECONDS = 1e-3


MAX_OPEN_PER_JOB = 16  # started, not yet finished: async saves overlap a few, a leaking job must not grow us


MAX_ENDED_BY_US_PER_JOB = 64  # API writes we failed for the job (timeout, superseded), remembered to refuse late ends


CHECKPOINT_NAME = re.compile(r"^[^\x00-\x1f\x7f]{1,256}\Z")


PHASES = ("started", "finished", "failed")


EVENT_FIELDS = ("job", "checkpoint", "phase", "time", "bytes", "duration_seconds", "ok")


API = "api"


@dataclass(frozen=True)
class CheckpointEvent:
    job: str
    checkpoint: str
    phase: str | None  # None: the single-shot form, a save the job timed itself
    time: float | None  # the job's time of this event (the end, for finished, failed and single-shot)
    bytes: float | None
    duration: float | None
    ok: bool


def _bounded_number(body: dict, key: str, limit: float, message: str) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or not 0 <= value <= limit
    ):
        raise ValidationError(key, message)
    return float(value)


def parse_checkpoint_event(body: Any, now: float) -> CheckpointEvent:
    """Validate a ``POST /api/v1/checkpoints`` body; raises ValidationError naming the field."""
    body = require_object(body)
    reject_unknown(body, EVENT_FIELDS)
    job = validate_job_name(body.get("job"))
    name = body.get("checkpoint")
    if not isinstance(name, str) or not CHECKPOINT_NAME.match(name):
        raise ValidationError(
            "checkpoint", 'checkpoint must be a name of 1–256 printable characters, like "step-12000"'
        )
    phase = body.get("phase")
    if phase is not None and phase not in PHASES:
        raise ValidationError("phase", "phase must be started, finished or failed")
    at = validate_time(body.get("time"), now)
    size = _bounded_number(
        body, "bytes", MAX_CHECKPOINT_BYTES, "bytes must be the checkpoint's size in bytes, from 0 to 2^50 (1 PiB)"
    )
    duration = _bounded_number(
        body,
        "duration_seconds",
        MAX_DURATION_SECONDS,
        "duration_seconds must be the write's duration in seconds, from 0 to 86400 (a day)",
    )
    ok = body.get("ok")
    if ok is not None and not isinstance(ok, bool):
        raise ValidationError("ok", "ok must be true or false")
    if phase is None:
        if duration is None:
            raise ValidationError(
                "duration_seconds",
                "send phase (started, finished or failed), or duration_seconds for a save the job timed itself",
            )
        ok = True if ok is None else ok
    else:
        if ok is not None:
            raise ValidationError(
                "ok", "ok belongs to the single-shot form without phase; with phase, send failed for a failed write"
            )
        if phase == "started" and duration is not None:
            raise ValidationError("duration_seconds", "a started event has no duration yet; send it with finished")
        ok = phase != "failed"
    if size is not None and (not ok or phase == "started"):
        raise ValidationError("bytes", "bytes is counted for finished writes only")
    return CheckpointEvent(job, name, phase, at, size, duration, ok)


@dataclass
class OpenWrite:
    checkpoint: str
    started: float


@dataclass
class JobCheckpoints:
    """One job's checkpoint history, as aggregates: what the metrics and the job JSON need, nothing per write."""

    bucket_counts: list[int] = field(default_factory=lambda: [0] * (len(DURATION_BUCKETS) + 1))  # last: +Inf
    duration_sum: float = 0.0
    writes: int = 0  # finished and failed
    failures: int = 0
    written_bytes: float = 0.0
    last_checkpoint: str | None = None  # of the last successful write, like the last_* gauges
    last_success: float | None = None
    last_duration: float | None = None
    last_bytes: float | None = None
    last_bandwidth: float | None = None
    last_failure: dict[str, Any] | None = None
    last_ended: float | None = None  # of any write, for the MFU-window overlap
    open: dict[tuple[str, str], OpenWrite] = field(default_factory=dict)  # (origin, checkpoint) -> write
    # API writes the exporter counted as failed without the job saying so, oldest first: checkpoint -> reason.
    # A finished or failed event arriving later is refused rather than counting the same write a second time.
    ended_by_us: dict[str, str] = field(default_factory=dict)
    touched: float = 0.0  # our clock, of the newest event


@dataclass(frozen=True)
class JobTotals:
    """A copy of one job's numbers, taken at a sample, for rendering without the lock."""

    cumulative_buckets: tuple[int, ...]
    duration_sum: float
    writes: int
    failures: int
    written_bytes: float
    in_progress: int
    last_success: float | None
    last_duration: float | None
    last_bandwidth: float | None
    in_progress_since: float | None = None  # when the oldest write in progress started; None while none is


class CheckpointTracker:
    """Thread-safe store of checkpoint writes per job, fed by the ingest API and by directory watches.

    ``origin`` keeps the feeds apart: the API's writes are keyed ``("api", name)``, a watch's ``(path, name)``, so
    a job reporting events and a watch naming the same job never finish each other's writes. Writes started and
    never finished fail with reason ``timeout`` after ``started_timeout``; a job with no event for
    ``forget_after`` is forgotten, except the jobs named by watches (``pinned``), whose series exist from the start.
    The API's writes failed that way (and those ``superseded`` by too many open ones) are remembered, up to
    ``MAX_ENDED_BY_US_PER_JOB`` per job, so the job's late finished or failed for one raises ``CheckpointConflict``
    instead of counting that write again.
    """

    def __init__(
        self,
        started_timeout: float = 7200.0,
        forget_after: float = 86400.0,
        pinned: Iterable[str] = (),
        clock: Callable[[], float] = time.time,
    ):
        self.started_timeout = started_timeout
        self.forget_after = forget_after
        self._pinned = set(pinned)
        self._clock = clock
        self._lock = threading.RLock()  # record() holds it across its check, admit() and the change
        self._jobs: dict[str, JobCheckpoints] = {name: JobCheckpoints(touched=clock()) for name in self._pinned}
        # Told of every write that starts, finishes or fails, from every feed (API, log, watch): (job, phase, time,
        # duration). The job model's time ledger counts the saves' time from them.
        self.listeners: list[Callable[[str, str, float, float | None], None]] = []

    def _tell(self, job: str, phase: str, at: float, duration: float | None) -> None:
        for listener in self.listeners:
            listener(job, phase, at, duration)

    def record(self, event: CheckpointEvent, admit: Callable[[str], None] = lambda job: None) -> dict[str, Any]:
        """Apply one API event; returns the answer for the job.

        ``admit(job)`` runs once the event is known to apply and before anything changes (the job cap: it raises
        to refuse the job), so a rejected event changes nothing here or there.
        """
        now = self._clock()
        at = event.time if event.time is not None else now
        if event.phase == "started" and now - at > self.started_timeout:
            # A write that started before the timeout would be failed at once, its age counted as its duration.
            raise ValidationError(
                "time",
                f"time is {now - at:.0f} s ago, before sources.checkpoint.started_timeout "
                f"({self.started_timeout:g} s): a write that started then has timed out; send its time, or none",
            )
        answer: dict[str, Any] = {"job": event.job, "checkpoint": event.checkpoint}
        with self._lock:
            if event.phase != "started":
                self._not_ended_by_us(event)
            if event.phase != "started" and event.ok:
                self._duration(event.job, event.checkpoint, API, at, event.duration)
            admit(event.job)
            if event.phase == "started":
                self.start(event.job, event.checkpoint, at)
                return {**answer, "state": "in_progress"}
            if event.ok:
                duration = self.finish(event.job, event.checkpoint, at, size=event.bytes, duration=event.duration)
                return {**answer, "state": "finished", "duration_seconds": duration, "bytes": event.bytes}
            failed = self.fail(event.job, event.checkpoint, at, reason="failed", duration=event.duration)
            return {**answer, "state": "failed", "duration_seconds": failed}

    def start(self, job: str, checkpoint: str, at: float, origin: str = API) -> None:
        with self._lock:
            state = self._job(job)
            opened = state.open
            if (origin, checkpoint) not in opened and sum(1 for o, _ in opened if o == origin) >= MAX_OPEN_PER_JOB:
                key, oldest = min(
                    ((k, w) for k, w in opened.items() if k[0] == origin), key=lambda item: item[1].started
                )
                del opened[key]
                self._failed(job, state, oldest.checkpoint, at, "superseded", at - oldest.started)
                self._ended_by_us(state, key, "superseded")
            if origin == API:
                state.ended_by_us.pop(checkpoint, None)  # the job writes this checkpoint again: a new write
            opened[(origin, checkpoint)] = OpenWrite(checkpoint, at)  # a repeated started restarts the clock
            self._tell(job, "started", at, None)

    def finish(
        self,
        job: str,
        checkpoint: str,
        at: float,
        origin: str = API,
        size: float | None = None,
        duration: float | None = None,
    ) -> float:
        """Count a successful write; ``duration`` (the job's own timing) wins over ``at`` minus its start."""
        with self._lock:
            duration = self._duration(job, checkpoint, origin, at, duration)
            state = self._job(job)
            state.open.pop((origin, checkpoint), None)
            state.bucket_counts[bisect.bisect_left(DURATION_BUCKETS, duration)] += 1
            state.duration_sum += duration
            state.writes += 1
            state.last_checkpoint = checkpoint
            state.last_success = at
            state.last_duration = duration
            state.last_ended = max(state.last_ended or at, at)
            state.last_bytes = size
            if size is not None:
                state.written_bytes += size
            state.last_bandwidth = size / duration if size is not None and duration >= MIN_TIMED_SECONDS else None
            self._tell(job, "finished", at, duration)
            return duration

    def fail(
        self,
        job: str,
        checkpoint: str,
        at: float,
        origin: str = API,
        reason: str = "failed",
        duration: float | None = None,
    ) -> float | None:
        with self._lock:
            state = self._job(job)
            opened = state.open.pop((origin, checkpoint), None)
            if duration is None and opened is not None:
                duration = max(at - opened.started, 0.0)
            self._failed(job, state, checkpoint, at, reason, duration)
            self._tell(job, "failed", at, duration)
            return duration

    def tick(self) -> list[tuple[str, str]]:
        """Time out writes started too long ago and forget idle jobs; returns the timed-out (origin, checkpoint)."""
        now = self._clock()
        expired = []
        with self._lock:
            for job, state in list(self._jobs.items()):
                for key, write in list(state.open.items()):
                    if now - write.started > self.started_timeout:
                        del state.open[key]
                        self._failed(job, state, write.checkpoint, now, "timeout", now - write.started)
                        self._ended_by_us(state, key, "timeout")
                        self._tell(job, "failed", now, now - write.started)
                        expired.append(key)
                if job not in self._pinned and not state.open and now - state.touched > self.forget_after:
                    del self._jobs[job]
        return expired

    def overlap(self, job: str, window: float) -> dict[str, Any] | None:
        """The job's writes as its JSON shows them: one in progress, or one that ended inside the MFU window,
        explains a dip in MFU. None when the job never wrote a checkpoint here."""
        now = self._clock()
        with self._lock:
            state = self._jobs.get(job)
            if state is None:
                return None
            oldest = min(state.open.values(), key=lambda w: w.started, default=None)
            return {
                "in_progress": oldest.checkpoint if oldest else None,
                "started": oldest.started if oldest else None,
                "elapsed_seconds": max(now - oldest.started, 0.0) if oldest else None,
                "writes_in_progress": len(state.open),
                "overlaps_window": oldest is not None
                or (state.last_ended is not None and state.last_ended >= now - window),
                "last_checkpoint": state.last_checkpoint,
                "last_success": state.last_success,
                "last_duration_seconds": state.last_duration,
                "last_bytes": state.last_bytes,
                "last_failure": dict(state.last_failure) if state.last_failure else None,
            }

    def totals(self) -> dict[str, JobTotals]:
        with self._lock:
            result = {}
            for job, state in self._jobs.items():
                oldest = min((write.started for write in state.open.values()), default=None)
                cumulative, running = [], 0
                for count in state.bucket_counts:
                    running += count
                    cumulative.append(running)
                result[job] = JobTotals(
                    tuple(cumulative),
                    state.duration_sum,
                    state.writes,
                    state.failures,
                    state.written_bytes,
                    len(state.open),
                    state.last_success,
                    state.last_duration,
                    state.last_bandwidth,
                    oldest,
                )
            return result

    def _duration(self, job: str, checkpoint: str, origin: str, at: float, duration: float | None) -> float:
        """The duration of a write ending at ``at``; raises ValidationError, changing nothing, when it has none."""
        if duration is not None:
            return duration
        state = self._jobs.get(job)
        opened = state.open.get((origin, checkpoint)) if state else None
        if opened is None:
            raise ValidationError(
                "duration_seconds",
                f"no started event is open for checkpoint {checkpoint!r} of job {job!r} "
                "(never sent, already finished, or timed out); send duration_seconds with finished",
            )
        if at < opened.started:
            raise ValidationError(
                "time", f"time is before the started time of checkpoint {checkpoint!r} ({opened.started})"
            )
        return at - opened.started

    def _not_ended_by_us(self, event: CheckpointEvent) -> None:
        """Raise CheckpointConflict, changing nothing, for the end of a write already counted as failed here."""
        state = self._jobs.get(event.job)
        reason = state.ended_by_us.get(event.checkpoint) if state else None
        if reason is None:
            return
        why = (
            f"no finished within sources.checkpoint.started_timeout ({self.started_timeout:g} s)"
            if reason == "timeout"
            else f"more than {MAX_OPEN_PER_JOB} writes of the job were open"
        )
        raise CheckpointConflict(
            "checkpoint",
            f"checkpoint {event.checkpoint!r} of job {event.job!r} was already counted "
            f"as a failed write ({reason}: {why}); this late end is not counted again",
        )

    @staticmethod
    def _ended_by_us(state: JobCheckpoints, key: tuple[str, str], reason: str) -> None:
        origin, checkpoint = key
        if origin != API:
            return  # a watch is told by tick() and drops the write itself; only a job's events can come late
        state.ended_by_us.pop(checkpoint, None)
        state.ended_by_us[checkpoint] = reason
        if len(state.ended_by_us) > MAX_ENDED_BY_US_PER_JOB:
            del state.ended_by_us[next(iter(state.ended_by_us))]

    def _job(self, job: str) -> JobCheckpoints:
        state = self._jobs.get(job)
        if state is None:
            state = self._jobs[job] = JobCheckpoints()
        state.touched = self._clock()
        return state

    def _failed(
        self, job: str, state: JobCheckpoints, checkpoint: str, at: float, reason: str, duration: float | None
    ) -> None:
        state.writes += 1
        state.failures += 1
        state.last_failure = {"checkpoint": checkpoint, "reason": reason, "time": at, "duration_seconds": duration}
        state.last_ended = max(state.last_ended or at, at)
        log.warning("job %s: checkpoint %s failed (%s)", job, checkpoint, reason)
