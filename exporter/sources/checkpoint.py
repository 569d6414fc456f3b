"""Checkpoint writes per job: from the job's own events (exact) and from watching checkpoint directories.

Two feeds fill one ``CheckpointTracker``:

* the ingest API (``POST /api/v1/checkpoints``, parsed by ``parse_checkpoint_event``): the job says started,
  finished or failed with its own times, or sends one event for a save it timed itself;
* ``CheckpointWatch``, one per ``sources.checkpoint.watch`` entry: a new directory (or file) under the watched path
  is a write. It starts when its first file appears and finishes when the done marker appears (PyTorch DCP writes
  ``.metadata`` last) or, without a marker, once nothing changed for the quiet period, which is not counted in the
  duration. A write whose directory disappears has failed.

inotify gives exact times and costs nothing between events, but NFS, Lustre and GPFS only report writes made by
this node, so paths on those file systems (and every path when inotify is unavailable) are polled each sample. A
write keeps aggregates only (bytes, files, newest mtime), never a record per file, so a checkpoint of thousands of
shards costs the same memory as one file, and no metric is ever labelled with a file.

Nothing here knows about HTTP: bad events raise ``ValidationError`` like progress reports do.
"""

from __future__ import annotations

import bisect
import logging
import math
import os
import re
import select
import stat
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable

from inotify_simple import INotify
from inotify_simple import flags as IN
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from exporter.jobs import ValidationError, reject_unknown, require_object, validate_job_name, validate_time
from exporter.sources.base import Snapshot

if TYPE_CHECKING:
    from exporter.runtime import Paths

log = logging.getLogger(__name__)

DURATION_BUCKETS = (1, 2, 5, 10, 15, 30, 45, 60, 120, 300, 600, 900, 1800, 3600)
MAX_CHECKPOINT_BYTES = 2**50  # 1 PiB: far above a 1T-parameter model with its Adam state (~16 TB)
MAX_DURATION_SECONDS = 86400.0
MAX_OPEN_PER_JOB = 16  # started, not yet finished: async saves overlap a few, a leaking job must not grow us
MAX_ENDED_BY_US_PER_JOB = 64  # API writes we failed for the job (timeout, superseded), remembered to refuse late ends
MAX_WRITES_PER_WATCH = MAX_OPEN_PER_JOB  # so the tracker never supersedes a write a watch still follows
MAX_DIRECTORY_WATCHES_PER_WRITE = 256  # a deeper tree is polled instead of spending the node's inotify watches
CHECKPOINT_NAME = re.compile(r"^[^\x00-\x1f\x7f]{1,256}$")
PHASES = ("started", "finished", "failed")
EVENT_FIELDS = ("job", "checkpoint", "phase", "time", "bytes", "duration_seconds", "ok")
API = "api"

# Where inotify sees only this node's writes (inotify(7)): remote ranks' shards and rank 0's marker never show.
NETWORK_FILESYSTEMS = frozenset({
    "nfs", "nfs4", "lustre", "gpfs", "cifs", "smb3", "smbfs", "ceph", "beegfs", "wekafs", "panfs", "pvfs2",
    "orangefs", "afs", "9p", "glusterfs", "ocfs2", "gfs2", "virtiofs", "fuse",
})

CHANGES = IN.CREATE | IN.MOVED_TO | IN.MOVED_FROM | IN.DELETE | IN.MODIFY | IN.CLOSE_WRITE
TOP_MASK = CHANGES | IN.DELETE_SELF | IN.MOVE_SELF | IN.ONLYDIR
TREE_MASK = CHANGES | IN.ONLYDIR


# --- events from the job -------------------------------------------------------------------------------------


class CheckpointConflict(Exception):
    """An event for a write that already ended here (the server answers 409); ``field`` names the key at fault."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field
        self.message = message


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
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not 0 <= value <= limit:
        raise ValidationError(key, message)
    return float(value)


def parse_checkpoint_event(body: Any, now: float) -> CheckpointEvent:
    """Validate a ``POST /api/v1/checkpoints`` body; raises ValidationError naming the field."""
    body = require_object(body)
    reject_unknown(body, EVENT_FIELDS)
    job = validate_job_name(body.get("job"))
    name = body.get("checkpoint")
    if not isinstance(name, str) or not CHECKPOINT_NAME.match(name):
        raise ValidationError("checkpoint", 'checkpoint must be a name of 1–256 printable characters, like "step-12000"')
    phase = body.get("phase")
    if phase is not None and phase not in PHASES:
        raise ValidationError("phase", "phase must be started, finished or failed")
    at = validate_time(body.get("time"), now)
    size = _bounded_number(body, "bytes", MAX_CHECKPOINT_BYTES, "bytes must be the checkpoint's size in bytes, from 0 to 2^50 (1 PiB)")
    duration = _bounded_number(body, "duration_seconds", MAX_DURATION_SECONDS,
                               "duration_seconds must be the write's duration in seconds, from 0 to 86400 (a day)")
    ok = body.get("ok")
    if ok is not None and not isinstance(ok, bool):
        raise ValidationError("ok", "ok must be true or false")
    if phase is None:
        if duration is None:
            raise ValidationError("duration_seconds", "send phase (started, finished or failed), or duration_seconds for a save the job timed itself")
        ok = True if ok is None else ok
    else:
        if ok is not None:
            raise ValidationError("ok", "ok belongs to the single-shot form without phase; with phase, send failed for a failed write")
        if phase == "started" and duration is not None:
            raise ValidationError("duration_seconds", "a started event has no duration yet; send it with finished")
        ok = phase != "failed"
    if size is not None and (not ok or phase == "started"):
        raise ValidationError("bytes", "bytes is counted for finished writes only")
    return CheckpointEvent(job, name, phase, at, size, duration, ok)


# --- the tracker ---------------------------------------------------------------------------------------------


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

    def __init__(self, started_timeout: float = 7200.0, forget_after: float = 86400.0, pinned: Iterable[str] = (),
                 clock: Callable[[], float] = time.time):
        self.started_timeout = started_timeout
        self.forget_after = forget_after
        self._pinned = set(pinned)
        self._clock = clock
        self._lock = threading.RLock()  # record() holds it across its check, admit() and the change
        self._jobs: dict[str, JobCheckpoints] = {name: JobCheckpoints(touched=clock()) for name in self._pinned}

    def record(self, event: CheckpointEvent, admit: Callable[[str], None] = lambda job: None) -> dict[str, Any]:
        """Apply one API event; returns the answer for the job.

        ``admit(job)`` runs once the event is known to apply and before anything changes (the job cap: it raises
        to refuse the job), so a rejected event changes nothing here or there.
        """
        at = event.time if event.time is not None else self._clock()
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
            duration = self.fail(event.job, event.checkpoint, at, reason="failed", duration=event.duration)
            return {**answer, "state": "failed", "duration_seconds": duration}

    def start(self, job: str, checkpoint: str, at: float, origin: str = API) -> None:
        with self._lock:
            state = self._job(job)
            opened = state.open
            if (origin, checkpoint) not in opened and sum(1 for o, _ in opened if o == origin) >= MAX_OPEN_PER_JOB:
                key, oldest = min(((k, w) for k, w in opened.items() if k[0] == origin), key=lambda item: item[1].started)
                del opened[key]
                self._failed(job, state, oldest.checkpoint, at, "superseded", at - oldest.started)
                self._ended_by_us(state, key, "superseded")
            if origin == API:
                state.ended_by_us.pop(checkpoint, None)  # the job writes this checkpoint again: a new write
            opened[(origin, checkpoint)] = OpenWrite(checkpoint, at)  # a repeated started restarts the clock

    def finish(self, job: str, checkpoint: str, at: float, origin: str = API, size: float | None = None,
               duration: float | None = None) -> float:
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
            state.last_bandwidth = size / duration if size is not None and duration > 0 else None
            return duration

    def fail(self, job: str, checkpoint: str, at: float, origin: str = API, reason: str = "failed",
             duration: float | None = None) -> float | None:
        with self._lock:
            state = self._job(job)
            opened = state.open.pop((origin, checkpoint), None)
            if duration is None and opened is not None:
                duration = max(at - opened.started, 0.0)
            self._failed(job, state, checkpoint, at, reason, duration)
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
                "overlaps_window": oldest is not None or (state.last_ended is not None and state.last_ended >= now - window),
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
                cumulative, running = [], 0
                for count in state.bucket_counts:
                    running += count
                    cumulative.append(running)
                result[job] = JobTotals(
                    tuple(cumulative), state.duration_sum, state.writes, state.failures, state.written_bytes,
                    len(state.open), state.last_success, state.last_duration, state.last_bandwidth,
                )
            return result

    def _duration(self, job: str, checkpoint: str, origin: str, at: float, duration: float | None) -> float:
        """The duration of a write ending at ``at``; raises ValidationError, changing nothing, when it has none."""
        if duration is not None:
            return duration
        state = self._jobs.get(job)
        opened = state.open.get((origin, checkpoint)) if state else None
        if opened is None:
            raise ValidationError("duration_seconds", f"no started event is open for checkpoint {checkpoint!r} of job {job!r} "
                                                      "(never sent, already finished, or timed out); send duration_seconds with finished")
        if at < opened.started:
            raise ValidationError("time", f"time is before the started time of checkpoint {checkpoint!r} ({opened.started})")
        return at - opened.started

    def _not_ended_by_us(self, event: CheckpointEvent) -> None:
        """Raise CheckpointConflict, changing nothing, for the end of a write already counted as failed here."""
        state = self._jobs.get(event.job)
        reason = state.ended_by_us.get(event.checkpoint) if state else None
        if reason is None:
            return
        why = (f"no finished within sources.checkpoint.started_timeout ({self.started_timeout:g} s)" if reason == "timeout"
               else f"more than {MAX_OPEN_PER_JOB} writes of the job were open")
        raise CheckpointConflict("checkpoint", f"checkpoint {event.checkpoint!r} of job {event.job!r} was already counted "
                                               f"as a failed write ({reason}: {why}); this late end is not counted again")

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

    def _failed(self, job: str, state: JobCheckpoints, checkpoint: str, at: float, reason: str, duration: float | None) -> None:
        state.writes += 1
        state.failures += 1
        state.last_failure = {"checkpoint": checkpoint, "reason": reason, "time": at, "duration_seconds": duration}
        state.last_ended = max(state.last_ended or at, at)
        log.warning("job %s: checkpoint %s failed (%s)", job, checkpoint, reason)


def checkpoint_families(totals: dict[str, JobTotals]) -> Iterable:
    label = ["training_job"]
    duration = HistogramMetricFamily("mfu_checkpoint_write_duration_seconds", "Duration of successful checkpoint writes.", labels=label)
    writes = CounterMetricFamily("mfu_checkpoint_writes", "Checkpoint writes that ended, successful or failed.", labels=label)
    failures = CounterMetricFamily("mfu_checkpoint_write_failures", "Checkpoint writes that failed, were deleted or timed out.", labels=label)
    written = CounterMetricFamily("mfu_checkpoint_written_bytes", "Bytes of successful checkpoint writes.", labels=label)
    in_progress = GaugeMetricFamily("mfu_checkpoint_in_progress", "1 while a checkpoint write of the job is in progress.", labels=label)
    last_success = GaugeMetricFamily("mfu_checkpoint_last_success_timestamp_seconds", "Unix time the last successful checkpoint write ended.", labels=label)
    last_duration = GaugeMetricFamily("mfu_checkpoint_last_duration_seconds", "Duration of the last successful checkpoint write.", labels=label)
    bandwidth = GaugeMetricFamily("mfu_checkpoint_last_write_bandwidth_bytes_per_second",
                                  "Bytes per second of the last successful checkpoint write whose size is known.", labels=label)
    bounds = [floatToGoString(b) for b in DURATION_BUCKETS] + ["+Inf"]
    for job, job_totals in sorted(totals.items()):
        key = [job]
        duration.add_metric(key, list(zip(bounds, job_totals.cumulative_buckets)), job_totals.duration_sum)
        writes.add_metric(key, job_totals.writes)
        failures.add_metric(key, job_totals.failures)
        written.add_metric(key, job_totals.written_bytes)
        in_progress.add_metric(key, 1.0 if job_totals.in_progress else 0.0)
        if job_totals.last_success is not None:
            last_success.add_metric(key, job_totals.last_success)
            last_duration.add_metric(key, job_totals.last_duration)
        if job_totals.last_bandwidth is not None:
            bandwidth.add_metric(key, job_totals.last_bandwidth)
    return (duration, writes, failures, written, in_progress, last_success, last_duration, bandwidth)


# --- directory watching --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tree:
    """The aggregate of a write's files at one look: enough to see that it changed."""

    bytes: int
    files: int
    newest_mtime_ns: int


def measure(path: str, is_dir: bool) -> Tree | None:
    """Size, file count and newest mtime under ``path`` (symlinks not followed); None once it is gone.

    Raises OSError when ``path`` cannot be read (permissions); unreadable directories below it are skipped."""
    try:
        if not is_dir:
            info = os.lstat(path)
            return Tree(info.st_size, 1, info.st_mtime_ns)
        total = files = newest = 0
        directories = [path]
        while directories:
            directory = directories.pop()
            try:
                with os.scandir(directory) as entries:
                    for entry in entries:
                        try:
                            if entry.is_dir(follow_symlinks=False):
                                directories.append(entry.path)
                                continue
                            info = entry.stat(follow_symlinks=False)
                        except FileNotFoundError:
                            continue  # removed while we looked: a temporary file renamed into place
                        total += info.st_size
                        files += 1
                        newest = max(newest, info.st_mtime_ns)
            except OSError:
                if directory == path:
                    raise
        return Tree(total, files, newest)
    except (FileNotFoundError, NotADirectoryError):
        return None


def filesystem_type(path: str, mounts_file: str) -> str | None:
    """The type of the file system holding ``path``, from the longest matching mount point in ``mounts_file``."""
    target = os.path.realpath(path)
    best, kind = "", None
    try:
        with open(mounts_file, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                fields = line.split()
                if len(fields) < 3:
                    continue
                point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[1])
                inside = target == point or target.startswith(point.rstrip("/") + "/")
                if inside and len(point) >= len(best):
                    best, kind = point, fields[2]
    except OSError:
        return None
    return kind


def is_network_filesystem(kind: str | None) -> bool:
    return kind is not None and (kind in NETWORK_FILESYSTEMS or kind.startswith("fuse."))


@dataclass(eq=False)
class Write:
    """A new entry under a watched path: pending while it is an empty directory, then writing until it ends."""

    checkpoint: str  # its name when first seen; kept through renames (tmp dir renamed into place)
    name: str  # its name now
    inode: int
    is_dir: bool
    started: float | None = None
    last_activity: float = 0.0
    tree: Tree | None = None
    marker_at: float | None = None
    polled: bool = False  # inotify cannot cover it (too many directories, events lost): polled like NFS
    watch_descriptors: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Route:
    """What an inotify watch descriptor belongs to: a watched path's top directory, or a directory of a write."""

    watch: "CheckpointWatch"
    write: Write | None
    relative: str  # the directory inside the write ("" for its top)


class Notifier:
    """One inotify instance for the whole source, read by a thread so each event is stamped when it happens.

    The thread holds no state of its own: it calls ``on_readable`` (which reads and routes, under the source's
    lock) whenever events wait. It closes the descriptors itself when it ends, so a slow thread never reads a
    descriptor number already reused by someone else.
    """

    def __init__(self, inotify: INotify):
        self._inotify = inotify
        self.routes: dict[int, Route] = {}
        self._wake_read, self._wake_write = os.pipe()
        self._thread: threading.Thread | None = None

    def add(self, path: str, mask: int, route: Route) -> int:
        descriptor = self._inotify.add_watch(path, mask)
        self.routes[descriptor] = route
        return descriptor

    def remove(self, descriptor: int) -> None:
        self.routes.pop(descriptor, None)
        try:
            self._inotify.rm_watch(descriptor)
        except OSError:
            pass  # already gone with its directory

    def read(self) -> list:
        return self._inotify.read(timeout=0)

    def start(self, on_readable: Callable[[], None]) -> None:
        self._thread = threading.Thread(target=self._run, args=(on_readable,), name="checkpoint-inotify", daemon=True)
        self._thread.start()

    def _run(self, on_readable: Callable[[], None]) -> None:
        poller = select.poll()
        poller.register(self._inotify.fileno(), select.POLLIN)
        poller.register(self._wake_read, select.POLLIN)
        try:
            while True:
                ready = poller.poll()
                if any(fd == self._wake_read for fd, _ in ready):
                    return
                try:
                    on_readable()
                except Exception:  # noqa: BLE001 - a watcher bug must not end event reading; sample() retries the path
                    log.exception("checkpoint watcher: handling inotify events failed")
        finally:
            self._release()

    def close(self) -> None:
        if self._thread is None:
            self._release()
            return
        os.write(self._wake_write, b"x")  # the thread ends only on this byte: the descriptor is still ours here
        self._thread.join(2.0)

    def _release(self) -> None:
        os.close(self._wake_read)
        os.close(self._wake_write)
        self._inotify.close()


class CheckpointWatch:
    """One ``sources.checkpoint.watch`` entry: finds the writes under ``path`` and reports them to the tracker.

    Every sample lists ``path`` (the source of truth for what exists, renames matched by inode); inotify, where it
    works, adds exact times in between. Entries present when the exporter starts are old checkpoints, not writes.
    """

    def __init__(self, index: int, spec: dict, tracker: CheckpointTracker, notifier: Notifier | None,
                 mode_problem: str, mounts_file: str):
        self.path = spec["path"]
        self.job = spec["job"]
        self.marker = spec["done_marker"]
        self.quiet_period = spec["quiet_period"]
        self._poll_setting = spec["poll"]
        self._tracker = tracker
        self._notifier = notifier
        self._mode_problem = mode_problem  # why inotify cannot be used at all, "" when it can
        self._mounts_file = mounts_file
        self.origin = f"watch[{index}]"  # its writes' key in the tracker, apart from the API's and other watches'
        self.mode = "poll"
        self.detail = ""  # why this mode, or a problem met by the latest sample
        self._mode_detail = ""
        self._attached = False
        self._first_look = True
        self._top: int | None = None
        self._top_lost = False
        self._known: dict[str, int] = {}  # every entry name under path -> inode, finished writes included
        self._writes: dict[str, Write] = {}  # current name -> write not ended yet
        self._appeared: dict[str, float] = {}  # names inotify saw arrive, with when, until the listing adopts them
        self._vanished: dict[str, float] = {}

    # called under the source's lock, from sample() and from the inotify thread

    def reconcile(self, now: float, errors: Counter) -> None:
        if self._top_lost:
            self._top_lost = False
            self._detach(now)  # deleted or moved away, maybe already made anew: what was in it is gone
        if not self._attached and not self._attach(errors):
            return
        self.detail = self._mode_detail
        try:
            with os.scandir(self.path) as entries:
                listing = {entry.name: (entry.inode(), entry.is_dir(follow_symlinks=False)) for entry in entries}
        except (FileNotFoundError, NotADirectoryError):
            self._detach(now)
            return
        except OSError as exc:
            errors["watch_unreadable"] += 1
            self.detail = f"cannot list {self.path}: {exc.strerror}"
            return
        self._follow_renames(listing, now)
        for name, (inode, is_dir) in listing.items():
            if name not in self._known:
                self._adopt(name, inode, is_dir, self._appeared.get(name, now), errors)
        self._appeared.clear()
        self._vanished.clear()
        for write in list(self._writes.values()):
            try:
                self._advance(write, now)
            except OSError as exc:
                errors["write_unreadable"] += 1
                self.detail = f"cannot read {os.path.join(self.path, write.name)}: {exc.strerror}"

    def on_event(self, route: Route, event, at: float, errors: Counter) -> None:
        if route.write is None:
            self._on_top_event(event, at, errors)
            return
        write = route.write
        if self._writes.get(write.name) is not write:
            return  # ended meanwhile; its watches are being removed
        if event.mask & IN.ISDIR and event.mask & (IN.CREATE | IN.MOVED_TO):
            self._watch_tree(write, os.path.join(route.relative, event.name), errors)
        self._activity(write, at)
        if (self.marker and route.relative == "" and event.name == self.marker
                and event.mask & (IN.CREATE | IN.MOVED_TO) and write.marker_at is None):
            write.marker_at = at

    def on_overflow(self) -> None:
        """Events were lost: the writes under way are polled from now on, so none finishes early."""
        for write in self._writes.values():
            write.polled = True

    def abandon(self, checkpoint: str) -> None:
        """The tracker timed this write out: stop following it (its entry stays known, it is not new again)."""
        for write in list(self._writes.values()):
            if write.checkpoint == checkpoint:
                self._end(write)

    def close(self) -> None:
        for write in list(self._writes.values()):
            self._end(write)
        if self._top is not None and self._notifier is not None:
            self._notifier.remove(self._top)
        self._top = None

    def status(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "job": self.job,
            "mode": self.mode,
            "state": "watching" if self._attached else "waiting for the path to exist",
            "detail": self.detail,
            "writes": [{"checkpoint": w.checkpoint, "started": w.started} for w in self._writes.values() if w.started is not None],
        }

    # internals

    def _attach(self, errors: Counter) -> bool:
        first_look, self._first_look = self._first_look, False
        if not os.path.isdir(self.path):
            self.detail = f"{self.path} does not exist yet"
            return False
        self.mode, self.detail = self._choose_mode()
        if self.mode == "inotify":
            try:
                self._top = self._notifier.add(self.path, TOP_MASK, Route(self, None, ""))
            except OSError as exc:
                errors["inotify_watch_failed"] += 1
                self.mode, self.detail = "poll", f"inotify watch failed ({exc.strerror}): polling"
        self._mode_detail = self.detail
        self._attached = True
        if first_look:
            # Checkpoints already there when the exporter starts are history, not writes we can time.
            try:
                with os.scandir(self.path) as entries:
                    self._known = {entry.name: entry.inode() for entry in entries}
            except OSError:
                self._known = {}
        return True

    def _choose_mode(self) -> tuple[str, str]:
        if self._poll_setting == "true":
            return "poll", "poll: true"
        if self._mode_problem:
            return "poll", self._mode_problem
        if self._poll_setting == "auto":
            kind = filesystem_type(self.path, self._mounts_file)
            if is_network_filesystem(kind):
                return "poll", f"{kind} file system: inotify would see only this node's writes, polling"
        return "inotify", ""

    def _detach(self, now: float) -> None:
        """The watched path itself is gone: its writes failed; wait for it again, and all in it will be new."""
        for write in list(self._writes.values()):
            self._vanish(write, now)
        if self._top is not None:
            self._notifier.remove(self._top)
            self._top = None
        self._known.clear()
        self._attached = False
        self.detail = f"{self.path} disappeared"

    def _on_top_event(self, event, at: float, errors: Counter) -> None:
        if event.mask & (IN.DELETE_SELF | IN.MOVE_SELF):
            self._top_lost = True
            return
        name = event.name
        if event.mask & IN.CREATE and name not in self._known:
            try:
                info = os.lstat(os.path.join(self.path, name))
            except FileNotFoundError:
                return
            self._adopt(name, info.st_ino, stat.S_ISDIR(info.st_mode), at, errors)
        elif event.mask & (IN.CREATE | IN.MOVED_TO):
            self._appeared.setdefault(name, at)  # a rename, a move from outside or a name made anew: the listing tells
        elif event.mask & (IN.DELETE | IN.MOVED_FROM):
            self._vanished.setdefault(name, at)
        elif name in self._writes and not self._writes[name].is_dir:
            self._activity(self._writes[name], at)  # a checkpoint that is one file, being written

    def _follow_renames(self, listing: dict[str, tuple[int, bool]], now: float) -> None:
        """Match entries gone from the listing to new names with the same inode; the rest were deleted."""
        new_by_inode = {inode: name for name, (inode, _) in listing.items() if name not in self._known}
        for name, inode in list(self._known.items()):
            if name in listing and listing[name][0] == inode:
                continue
            del self._known[name]
            write = self._writes.get(name)
            renamed = new_by_inode.pop(inode, None)
            if renamed is not None:
                self._known[renamed] = inode
                if write is not None:
                    del self._writes[name]
                    write.name = renamed
                    self._writes[renamed] = write
            elif write is not None:
                self._vanish(write, self._vanished.get(name, now))

    def _adopt(self, name: str, inode: int, is_dir: bool, at: float, errors: Counter) -> None:
        self._known[name] = inode
        if self.marker and not is_dir:
            return  # with a done marker, checkpoints are directories; files beside them are not writes
        if len(self._writes) >= MAX_WRITES_PER_WATCH:
            errors["too_many_writes"] += 1
            self.detail = f"more than {MAX_WRITES_PER_WATCH} writes at once under {self.path}; ignoring {name}"
            return
        write = Write(checkpoint=name, name=name, inode=inode, is_dir=is_dir, polled=self.mode == "poll")
        self._writes[name] = write
        if is_dir and not write.polled:
            self._watch_tree(write, "", errors)
        try:
            write.tree = measure(os.path.join(self.path, name), is_dir)
        except OSError as exc:
            errors["write_unreadable"] += 1  # left pending: the next sample looks again
            self.detail = f"cannot read {os.path.join(self.path, name)}: {exc.strerror}"
            return
        if write.tree is not None and (write.tree.files or not is_dir):
            self._begin(write, at)

    def _watch_tree(self, write: Write, relative: str, errors: Counter) -> None:
        """Watch a directory of a write and every directory below it (inotify watches are not recursive)."""
        directories = [relative]
        while directories and not write.polled:
            current = directories.pop()
            if len(write.watch_descriptors) >= MAX_DIRECTORY_WATCHES_PER_WRITE:
                write.polled = True
                errors["too_many_directories"] += 1
                return
            absolute = os.path.join(self.path, write.name, current)
            try:
                write.watch_descriptors.append(self._notifier.add(absolute, TREE_MASK, Route(self, write, current)))
                with os.scandir(absolute) as entries:
                    directories.extend(os.path.join(current, e.name) for e in entries if e.is_dir(follow_symlinks=False))
            except FileNotFoundError:
                continue  # removed while we looked; the listing decides whether the write still exists
            except OSError as exc:
                write.polled = True  # most likely the node's inotify watch limit: poll this write instead
                errors["inotify_watch_failed"] += 1
                self.detail = f"cannot watch {absolute} ({exc.strerror}): polling it"

    def _begin(self, write: Write, at: float) -> None:
        write.started = at
        write.last_activity = at
        self._tracker.start(self.job, write.checkpoint, at, origin=self.origin)

    def _activity(self, write: Write, at: float) -> None:
        if write.started is None:
            self._begin(write, at)
        write.last_activity = max(write.last_activity, at)

    def _advance(self, write: Write, now: float) -> None:
        """Poll what inotify does not cover, then end the write if its marker is there or it has gone quiet."""
        path = os.path.join(self.path, write.name)
        if write.polled or write.started is None:
            tree = measure(path, write.is_dir)
            if tree is None:
                return  # gone: the next listing ends it as deleted
            if tree != write.tree:
                write.tree = tree
                if tree.files or not write.is_dir:
                    self._activity(write, now)
        if write.started is None:
            return
        if self.marker:
            if write.marker_at is None and os.path.lexists(os.path.join(path, self.marker)):
                write.marker_at = now
            if write.marker_at is not None:
                self._finish(write, write.marker_at)
        elif now - write.last_activity >= self.quiet_period:
            self._finish(write, write.last_activity)

    def _finish(self, write: Write, at: float) -> None:
        tree = measure(os.path.join(self.path, write.name), write.is_dir)
        if tree is None:
            return  # deleted right at the end: the next listing counts it as failed
        self._end(write)
        at = max(at, write.started)  # a wall clock stepped back between two looks must not give a negative duration
        self._tracker.finish(self.job, write.checkpoint, at, origin=self.origin, size=tree.bytes, duration=at - write.started)

    def _vanish(self, write: Write, at: float) -> None:
        self._end(write)
        if write.started is not None:
            self._tracker.fail(self.job, write.checkpoint, max(at, write.started), origin=self.origin, reason="deleted")

    def _end(self, write: Write) -> None:
        self._writes.pop(write.name, None)
        for descriptor in write.watch_descriptors:
            self._notifier.remove(descriptor)
        write.watch_descriptors.clear()


class CheckpointSource:
    """The ``checkpoint`` source: each sample polls the watches, ends quiet writes, times out stale ones and
    renders the tracker's totals. The tracker itself is shared with the ingest API through the Runtime."""

    name = "checkpoint"

    def __init__(self, section: dict, tracker: CheckpointTracker, mounts_file: str = "/proc/self/mounts",
                 clock: Callable[[], float] = time.time, inotify_factory: Callable[[], INotify] = INotify):
        self.interval = section["interval"]
        self.timeout = section["timeout"]
        self.tracker = tracker
        self._clock = clock
        self._lock = threading.Lock()
        self._errors: Counter = Counter()  # met by the inotify thread, handed to the next sample
        self._notifier: Notifier | None = None
        problem = ""
        if any(spec["poll"] != "true" for spec in section["watch"]):
            try:
                self._notifier = Notifier(inotify_factory())
            except OSError as exc:
                problem = f"inotify unavailable ({exc.strerror or exc}): polling"
                log.warning("checkpoint watches: %s", problem)
        self._watches = [CheckpointWatch(index, spec, tracker, self._notifier, problem, mounts_file)
                         for index, spec in enumerate(section["watch"])]
        self._by_origin = {watch.origin: watch for watch in self._watches}
        if self._notifier is not None:
            self._notifier.start(self._pump)

    def sample(self) -> Snapshot:
        with self._lock:
            self._pump_locked()
            for origin, checkpoint in self.tracker.tick():
                if origin in self._by_origin:
                    self._by_origin[origin].abandon(checkpoint)
            now = self._clock()
            for watch in self._watches:
                watch.reconcile(now, self._errors)
            errors, self._errors = self._errors, Counter()
            watches = [watch.status() for watch in self._watches]
        totals = self.tracker.totals()
        return Snapshot(
            render=lambda: checkpoint_families(totals),
            errors=errors,
            status={"watches": watches, "jobs": {job: {"writes": t.writes, "failures": t.failures, "in_progress": t.in_progress}
                                                 for job, t in totals.items()}},
        )

    def close(self) -> None:
        with self._lock:
            for watch in self._watches:
                watch.close()
        if self._notifier is not None:
            self._notifier.close()

    def _pump(self) -> None:
        with self._lock:
            self._pump_locked()

    def _pump_locked(self) -> None:
        if self._notifier is None:
            return
        events = self._notifier.read()
        if not events:
            return
        at = self._clock()
        for event in events:
            if event.mask & IN.Q_OVERFLOW:
                self._errors["inotify_overflow"] += 1
                for watch in self._watches:
                    watch.on_overflow()
                continue
            route = self._notifier.routes.get(event.wd)
            if route is None:
                continue
            if event.mask & IN.IGNORED:
                self._notifier.routes.pop(event.wd, None)  # the directory is gone; the kernel dropped the watch
                continue
            route.watch.on_event(route, event, at, self._errors)


def checkpoint_source(section: dict, paths: "Paths") -> CheckpointSource:
    tracker = CheckpointTracker(started_timeout=section["started_timeout"], forget_after=section["forget_after"],
                                pinned=[spec["job"] for spec in section["watch"]])
    return CheckpointSource(section, tracker, mounts_file=os.path.join(paths.procfs, "self", "mounts"))
