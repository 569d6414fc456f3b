"""Checkpoint writes per job: from the job's own events (exact) and from watching checkpoint directories.

Two feeds fill one ``CheckpointTracker`` (``mfu_exporter.model.checkpoints``): the ingest API, and this source's
watches.

* ``CheckpointWatch``, one per ``sources.checkpoint.watch`` entry: a new directory (or file) under the watched path
  is a write. It starts when its first file appears and finishes when the done marker appears (PyTorch DCP writes
  ``.metadata`` last) or, without a marker, once nothing changed for the quiet period, which is not counted in the
  duration. A write whose directory disappears has failed.

inotify gives exact times and costs nothing between events, but NFS, Lustre and GPFS only report writes made by
this node, so paths on those file systems (and every path when inotify is unavailable) are polled each sample. A
write keeps aggregates only (bytes, files, newest mtime), never a record per file, so a checkpoint of thousands of
shards costs the same memory as one file, and no metric is ever labelled with a file.
"""

from __future__ import annotations

import logging
import os
import select
import stat
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from inotify_simple import INotify
from inotify_simple import flags as IN

from mfu_exporter.config import CheckpointConfig, Enabled, WatchConfig
from mfu_exporter.model.checkpoints import MAX_OPEN_PER_JOB, CheckpointTracker, JobTotals
from mfu_exporter.node.fswatch import Tree, filesystem_type, is_network_filesystem, measure
from mfu_exporter.sources.base import Snapshot, SourceContext

log = logging.getLogger(__name__)

MAX_WRITES_PER_WATCH = MAX_OPEN_PER_JOB  # so the tracker never supersedes a write a watch still follows
MAX_DIRECTORY_WATCHES_PER_WRITE = 256  # a deeper tree is polled instead of spending the node's inotify watches


CHANGES = IN.CREATE | IN.MOVED_TO | IN.MOVED_FROM | IN.DELETE | IN.MODIFY | IN.CLOSE_WRITE
TOP_MASK = CHANGES | IN.DELETE_SELF | IN.MOVE_SELF | IN.ONLYDIR
TREE_MASK = CHANGES | IN.ONLYDIR


# --- events from the job -------------------------------------------------------------------------------------


# --- the tracker ---------------------------------------------------------------------------------------------


# --- directory watching --------------------------------------------------------------------------------------


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
                except Exception:
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

    def __init__(
        self,
        index: int,
        spec: WatchConfig,
        tracker: CheckpointTracker,
        notifier: Notifier | None,
        mode_problem: str,
        mounts_file: str,
    ):
        self.path = spec.path
        self.job = spec.job
        self.marker = spec.done_marker
        self.quiet_period = spec.quiet_period
        self._poll_setting = spec.poll
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
        if (
            self.marker
            and route.relative == ""
            and event.name == self.marker
            and event.mask & (IN.CREATE | IN.MOVED_TO)
            and write.marker_at is None
        ):
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
            "writes": [
                {"checkpoint": w.checkpoint, "started": w.started}
                for w in self._writes.values()
                if w.started is not None
            ],
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
        if self._poll_setting is Enabled.TRUE:
            return "poll", "poll: true"
        if self._mode_problem:
            return "poll", self._mode_problem
        if self._poll_setting is Enabled.AUTO:
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
                    directories.extend(
                        os.path.join(current, e.name) for e in entries if e.is_dir(follow_symlinks=False)
                    )
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
        self._tracker.finish(
            self.job, write.checkpoint, at, origin=self.origin, size=tree.bytes, duration=at - write.started
        )

    def _vanish(self, write: Write, at: float) -> None:
        self._end(write)
        if write.started is not None:
            self._tracker.fail(self.job, write.checkpoint, max(at, write.started), origin=self.origin, reason="deleted")

    def _end(self, write: Write) -> None:
        self._writes.pop(write.name, None)
        for descriptor in write.watch_descriptors:
            self._notifier.remove(descriptor)
        write.watch_descriptors.clear()


# The lowest series level (sources.checkpoint.series) at which each family is on: minimal has what the central rules
# read (a write in progress, failures, the last success and duration, the duration histogram for the p95).
FAMILY_LEVELS = {
    "mfu_checkpoint_write_duration_seconds": "minimal",
    "mfu_checkpoint_writes": "standard",
    "mfu_checkpoint_write_failures": "minimal",
    "mfu_checkpoint_written_bytes": "standard",
    "mfu_checkpoint_in_progress": "minimal",
    "mfu_checkpoint_in_progress_seconds": "minimal",
    "mfu_checkpoint_last_success_timestamp_seconds": "minimal",
    "mfu_checkpoint_last_duration_seconds": "minimal",
    "mfu_checkpoint_last_write_bandwidth_bytes_per_second": "standard",
}


@dataclass(frozen=True)
class CheckpointSample:
    """The tracker's totals per job at one sample: what ``mfu_exporter.render.checkpoint`` exports."""

    series: str  # sources.checkpoint.series: which families are exported (FAMILY_LEVELS)
    totals: dict[str, JobTotals]
    at: float = 0.0  # the sample's time: a write in progress is this old (mfu_checkpoint_in_progress_seconds)


class CheckpointSource:
    """The ``checkpoint`` source: each sample polls the watches, ends quiet writes, times out stale ones and
    renders the tracker's totals. The tracker itself is shared with the ingest API through the Service."""

    name = "checkpoint"

    def __init__(
        self,
        section: CheckpointConfig,
        tracker: CheckpointTracker,
        mounts_file: str = "/proc/self/mounts",
        clock: Callable[[], float] = time.time,
        inotify_factory: Callable[[], INotify] = INotify,
    ):
        self.interval = section.interval
        self.timeout = section.timeout
        self.series = section.series
        self._previous: tuple[dict, Snapshot] | None = None  # the last sample's totals and snapshot
        self.tracker = tracker
        self._clock = clock
        self._lock = threading.Lock()
        self._errors: Counter = Counter()  # met by the inotify thread, handed to the next sample
        self._notifier: Notifier | None = None
        problem = ""
        if any(spec.poll is not Enabled.TRUE for spec in section.watch):
            try:
                self._notifier = Notifier(inotify_factory())
            except OSError as exc:
                problem = f"inotify unavailable ({exc.strerror or exc}): polling"
                log.warning("checkpoint watches: %s", problem)
        self._watches = [
            CheckpointWatch(index, spec, tracker, self._notifier, problem, mounts_file)
            for index, spec in enumerate(section.watch)
        ]
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
        status = {
            "watches": watches,
            "jobs": {
                job: {"writes": t.writes, "failures": t.failures, "in_progress": t.in_progress}
                for job, t in totals.items()
            },
        }
        previous = self._previous
        # Checkpoints come minutes apart: most samples find what the last one did. The same readings again keep their
        # published fragment (render/collector), instead of encoding the job's histogram every second.
        # A write in progress ages with each sample: its snapshot is new.
        writing = any(t.in_progress_since is not None for t in totals.values())
        if (
            not errors
            and not writing
            and previous is not None
            and previous[0] == totals
            and previous[1].status == status
        ):
            return previous[1]
        snapshot = Snapshot(readings=CheckpointSample(self.series, totals, at=now), errors=errors, status=status)
        self._previous = None if errors else (totals, snapshot)
        return snapshot

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


def checkpoint_source(section: CheckpointConfig, ctx: SourceContext) -> CheckpointSource:
    """The ``mfu_exporter.sources.SOURCES`` factory: ``sources.checkpoint`` with its own tracker on ``ctx``'s wall clock
    (the service hands the tracker to the checkpoint API), and the mount table under ``ctx``'s procfs."""
    tracker = CheckpointTracker(
        started_timeout=section.started_timeout,
        forget_after=section.forget_after,
        pinned=[spec.job for spec in section.watch],
        clock=ctx.wall,
    )
    return CheckpointSource(
        section, tracker, mounts_file=os.path.join(ctx.paths.procfs, "self", "mounts"), clock=ctx.wall
    )
