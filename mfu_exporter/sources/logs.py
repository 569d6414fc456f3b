"""The logs source: MFU with no change to the job, from the training log it already writes.

It follows the files of ``sources.logs.files`` (globs, each with its job and format) and, on Kubernetes, the
container logs of the pods discovery found holding GPUs (``<pods_root>/<namespace>_<pod>_<uid>/<container>/*.log``,
CRI format), with ``mfu_exporter.node.tail``. Each line goes through ``mfu_exporter.logs`` (transport, parser, derivation)
in the follower's thread as it is read, and becomes an item of the source's feed (``mfu_exporter.model.feed``) that
the next snapshot carries: the service applies it on its tick to the same job model as a progress report (same
series, MFU by our formula, ETA, attribution) and to the checkpoint tracker of the checkpoint source (origin ``log``).

What a log cannot say comes from ``jobs.<job>``, which wins over what the log printed: a job's GPUs on this node,
its world size, sequence length, global batch, and the model (torchtitan prints all parameters, embeddings and
every MoE expert included, where our FLOPs want the active ones).

Cluster view. Frameworks print progress on one rank (Megatron's iteration line on the last global rank, torchtitan,
HF and NeMo on rank 0), so in a multi-node job one node's log has progress lines and the others' have none. The
node with them turns the job's global count into its own share (× node GPUs ÷ world size, ``mfu_exporter.logs.derive``)
and exports the numerator and denominator of MFU for its own GPUs; in a synchronous job that share's MFU is the
job's. Every other node following a log of the job exports the job's ``mfu_job_gpus`` and peak but no FLOPs, so
the cluster MFU rule (which counts only nodes exporting both halves) is the one node's, which is right; their GPUs
still join their node signals (a paused NIC, a hot GPU) to the job in the cluster attribution rules. The job's
summed token rate (``training_job:mfu_job_tokens:rate5m``) is then the printing node's share only: it is still 0
exactly when the job stalls, which is what the rules read it for.
"""

from __future__ import annotations

import glob
import logging
import math
import os
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping

from mfu_exporter.config import MAX_TOKENS, LogsConfig
from mfu_exporter.logs import (
    INTEGRATED,
    Facts,
    JobLog,
    LogStream,
    RunAction,
    SaveAction,
    Startup,
    Update,
    WaitAction,
)
from mfu_exporter.logs.straggler import KEYWORDS as STRAGGLER_WORDS
from mfu_exporter.logs.straggler import StragglerFinding, StragglerScanner
from mfu_exporter.model.feed import DataWait, FeedItem, Heard, Progress, RunEvent, Save, Seen
from mfu_exporter.model.progress import MAX_CLOCK_SKEW_SECONDS, REPORT_RESOLUTION_SECONDS
from mfu_exporter.nccl.debug import TransportFinding, TransportScanner
from mfu_exporter.node.tail import HEAD, Follower, Lines
from mfu_exporter.sources.base import ModelReads, Snapshot, SourceContext

log = logging.getLogger(__name__)

ORIGIN = "log"
MAX_FILES = 256  # files followed at once: a glob matching a directory of rotated shards must not open them all
MAX_STATUS_FILES = 32
FIND_INTERVAL = 1.0  # the longest between two looks for new files, whatever the source's interval
# Feed items read and not yet taken by a sample (about 300 bytes each): a sample takes them every interval, and a
# framework prints a few progress lines a second. Only a flood of them, or samples that stop, meets the bound; the
# oldest items then go, counted as feed_dropped.
MAX_PENDING_FEED = 20_000
NO_PROGRESS = (
    "no progress line in this node's log of the job yet (frameworks print progress on one rank: Megatron on "
    "the last, torchtitan, HF and NeMo on rank 0), so its MFU is on the node that prints them"
)
STARTUP_FACTS = {"params": "params", "seq_len": "seq_len", "layers": "layers", "heads": "heads", "head_dim": "head_dim"}

STRAGGLER_KEYWORDS = re.compile("|".join(map(re.escape, STRAGGLER_WORDS)))


@dataclass(frozen=True, slots=True)
class LogCollectives:
    """What a job's log says of its collectives: the transport its ``NCCL INFO`` lines show
    (``mfu_exporter.nccl.debug``) and the slow rank the job names (``mfu_exporter.logs.straggler``). The logs source's
    snapshot carries one per job (``LogsSample``); render/collectives.py exports it, the attribution reads it."""

    transport: TransportFinding | None = None
    straggler: StragglerFinding | None = None


@dataclass(frozen=True)
class LogsSample:
    """The logs source's readings: what each job's log says of its collectives (the rest of what it reads is the
    snapshot's feed, for the job model and the checkpoint tracker)."""

    collectives: Mapping[str, LogCollectives] = field(default_factory=dict)


class _JobScanners:
    """A job's NCCL and straggler lines, over all its files, scanned as they are read (bounded state)."""

    __slots__ = ("transport", "straggler", "skipped")

    def __init__(self) -> None:
        self.transport = TransportScanner()
        self.straggler = StragglerScanner()
        self.skipped = 0

    def feed(self, lines: Iterable[str]) -> None:
        for line in lines:
            try:
                self._feed(line)
            except Exception:  # noqa: BLE001 - a line that breaks a scanner is skipped; the rest is read
                self.skipped += 1

    def _feed(self, line: str) -> None:
        if "NCCL INFO" in line:  # the scanner's own test, without its regex on every line of the log
            if "NCCL INFO NCCL version" in line:  # a new run's NCCL starts: what the last one chose is over
                self.transport = TransportScanner()
            self.transport.feed(line)
        elif self.straggler.in_block or STRAGGLER_KEYWORDS.search(line) is not None:
            self.straggler.feed(line)  # inside a multi-line report any line is read: one not of it ends it

    def reading(self) -> LogCollectives:
        return LogCollectives(self.transport.finding(), self.straggler.finding())


class _Followed:
    __slots__ = ("path", "job", "stream", "kind", "lines", "generation", "announced")

    def __init__(self, path: str, job: str, stream: LogStream, kind: str, generation: int):
        self.path, self.job, self.stream, self.kind, self.lines = path, job, stream, kind, 0
        self.generation = generation  # the pass in which the file was first wanted: later files take over
        self.announced: str | None = None  # the stream's no-progress reason last given to the job and the log


def pod_log_glob(root: str, namespace: str, pod: str) -> str:
    """The kubelet's layout: ``<root>/<namespace>_<pod>_<uid>/<container>/<restart count>.log``."""
    return os.path.join(root, f"{glob.escape(namespace)}_{glob.escape(pod)}_*", "*", "*.log")


class LogsSource:
    name = "logs"

    def __init__(
        self,
        section: LogsConfig,
        jobs_config: dict | None = None,
        use_inotify: bool = True,
        clock: Callable[[], float] = time.time,
    ):
        self.interval = section.interval
        self.timeout = section.timeout
        self.files = section.files
        self.discovered_pods = section.discovered_pods
        self.pods_root = section.pods_root
        self.takeover_after = section.takeover_after
        self.jobs_config = jobs_config or {}
        self.clock = clock
        self._model: ModelReads | None = None
        self._lock = threading.Lock()
        self._feed: list[FeedItem] = []  # read since the last sample, in order
        self.max_feed = MAX_PENDING_FEED
        self._wanted: dict[str, tuple[str, str, str | None, str]] = {}  # path -> (job, format, pattern, container)
        self._followed: dict[str, _Followed] = {}
        self._joblogs: dict[str, JobLog] = {}
        self._scanners: dict[str, _JobScanners] = {}
        self._fed: set[str] = set()
        # Jobs this source created (a Seen handed over) that the model did not list yet: the service applies a feed
        # at its tick, several samples later, and a second Seen would replace the reason a later line gave.
        self._announced: set[str] = set()
        self._warned: set[str] = set()
        self._counts: Counter = Counter()
        self._reported: Counter = Counter()
        self._started = False
        self._passes = 0
        self._first_wanted: dict[str, int] = {}
        self.follower = Follower(
            [],
            self._on_lines,
            # The follower finds new files, apart from the samples: a new file's lines that print no time are
            # stamped when read, so a run's start line found a sample late would take its startup from the ledger.
            interval=min(self.interval, FIND_INTERVAL),
            max_line_bytes=section.max_line_bytes,
            use_inotify=use_inotify,
            clock=clock,
            find=self._find,
        )

    def bind(self, model: ModelReads) -> None:
        """What it reads of the job model: a job's GPUs on this node, the jobs known, discovery's pods."""
        self._model = model

    # -- sampling (the scheduler's thread) ----------------------------------------------------------------
    def sample(self) -> Snapshot:
        if self._model is None:  # not bound yet (the required-source probe): nothing to feed, nothing read
            return Snapshot(status={"files": [], "followed": 0, "wanted": 0})
        if not self._started:
            self._started = True
            self.follower.poll()  # the first pass here: bounded resume of what exists, then the thread follows
            self.follower.start()
        with self._lock:
            wanted = self._wanted
        jobs_seen = {job for job, *_ in wanted.values()}
        known = set(self._model.job_names())
        follower_errors = self.follower.error_counts()  # the follower's lock first, as its thread takes them
        read_until = self.follower.read_until  # before the feed is taken: the lines of that pass are in it
        with self._lock:
            # A node whose log has no progress lines still shows the job's GPUs (cluster attribution). A job this
            # sample's feed creates already has its reason.
            created = {r.job for r in self._feed if isinstance(r, (Seen, Progress, RunEvent))}
            self._announced = (self._announced | created) & (jobs_seen - known)
            new = sorted(jobs_seen - self._fed - known - self._announced)
            self._feed.extend(Seen(job, NO_PROGRESS) for job in new)
            self._announced.update(new)
            self._hear(read_until, self.interval + self.follower.interval)
            feed, self._feed = tuple(self._feed), []
            self._scanners = {job: s for job, s in self._scanners.items() if job in jobs_seen}
            collectives = {job: scanners.reading() for job, scanners in sorted(self._scanners.items())}
        return Snapshot(
            readings=LogsSample({job: found for job, found in collectives.items() if found != LogCollectives()}),
            errors=self._new_errors(follower_errors),
            status=self._status(wanted, follower_errors),
            feed=feed,
        )

    def take_feed(self) -> tuple[FeedItem, ...]:
        """What the lines read since the last call say, in the order read, once each, then how far the jobs' logs
        were read. The service's tick takes it between samples too: a line reaches the job model at the tick after
        it was read, not at the next sample's tick, and a job's silence shows as soon."""
        read_until = self.follower.read_until  # before the feed is taken: the lines of that pass are in it
        with self._lock:
            self._hear(read_until, self.follower.interval)
            feed, self._feed = tuple(self._feed), []
        return feed

    def _hear(self, read_until: float | None, every: float) -> None:
        """Add to the feed how far the follower read the logs of every job it follows (its last whole pass), with
        ``every``, the most seconds until the next word of it. Under ``self._lock``."""
        jobs = sorted({job for job, *_ in self._wanted.values()})
        if read_until is not None and jobs:
            self._feed.append(Heard(tuple(jobs), read_until, every))

    def close(self) -> None:
        self.follower.stop()

    # -- finding files (the follower's thread, before each pass) -------------------------------------------
    def _find(self) -> list[str]:
        """The files wanted now (configured globs, discovered pods' logs), as the follower's patterns."""
        wanted = self._expand()
        with self._lock:
            self._passes += 1
            # Only what is wanted now is remembered (pods come and go): a file that comes back is a newer one.
            self._first_wanted = {p: self._first_wanted.get(p, self._passes) for p in wanted}
            self._followed = {p: f for p, f in self._followed.items() if p in wanted}
            self._wanted = wanted
        return [glob.escape(p) for p in wanted]

    def _expand(self) -> dict[str, tuple[str, str, str | None, str]]:
        wanted: dict[str, tuple[str, str, str | None, str]] = {}
        for entry in self.files:
            for path in sorted(glob.glob(entry.path)):
                if os.path.isfile(path):
                    wanted.setdefault(path, (entry.job, entry.format, entry.pattern, "auto"))
        if self.discovered_pods and self._model is not None:
            try:
                pods = self._model.discovered_pods()
            except Exception:  # noqa: BLE001 - discovery's data is another source's; a bad one must not stop logs
                self._counts["discovery_failed"] += 1
                pods = {}
            for job, refs in sorted(pods.items()):
                if not self._model.is_discovered(job):
                    # The job model takes discovery's answer on its tick: until then it does not know the
                    # job's GPUs, and a per-GPU log (torchtitan's tps) read now would count every GPU of the node.
                    continue
                for namespace, pod in refs:
                    for path in sorted(glob.glob(pod_log_glob(self.pods_root, namespace, pod))):
                        wanted.setdefault(path, (job, "auto", None, "cri"))
        if len(wanted) > MAX_FILES:
            self._counts["too_many_files"] += 1
            wanted = dict(list(wanted.items())[:MAX_FILES])
        return wanted

    def _new_errors(self, follower_errors: Counter) -> Counter:
        with self._lock:
            total = Counter(self._counts) + follower_errors
            for followed in self._followed.values():
                total += followed.stream.errors
            for joblog in self._joblogs.values():
                total += joblog.skipped
            total["unreadable_line"] += sum(scanners.skipped for scanners in self._scanners.values())
        for benign in ("rotated", "truncated", "rewritten", "ambiguous_line"):
            total.pop(benign, None)  # what logs do, not problems: they show in the status
        errors = Counter({k: v - self._reported[k] for k, v in total.items() if v > self._reported[k]})
        self._reported = total
        return errors

    def _status(self, wanted: dict, follower_errors: Counter) -> dict[str, Any]:
        with self._lock:
            files = []
            for path in sorted(self._followed)[:MAX_STATUS_FILES]:
                f = self._followed[path]
                files.append(
                    {
                        "path": path,
                        "job": f.job,
                        "format": f.stream.format,
                        "lines": f.lines,
                        "container": f.kind,
                        "unrecognised": f.stream.unrecognised,
                        "formats": f.stream.formats,
                        "progress_lines": f.stream.progress_lines,
                        "no_progress": f.stream.no_progress,
                        # A mixed log's progress lines of the poorer framework, left out by the richness rule.
                        "left_out": f.stream.left_out,
                    }
                )
            return {
                "files": files,
                "followed": len(self._followed),
                "wanted": len(wanted),
                "rotations": follower_errors["rotated"],
                "truncations": follower_errors["truncated"],
            }

    # -- lines (the follower's thread) --------------------------------------------------------------------
    def _on_lines(self, batch: Lines) -> None:
        # Called in the follower's thread holding its lock; this source's lock comes second, as in sample().
        with self._lock:
            self._lines(batch)

    def _lines(self, batch: Lines) -> None:
        want = self._wanted.get(batch.path)
        if want is None:
            return
        job, fmt, pattern, container = want
        followed = self._followed.get(batch.path)
        if followed is None or followed.job != job:
            stream = LogStream(fmt, pattern, container)
            generation = self._first_wanted.get(batch.path, 0)
            followed = self._followed[batch.path] = _Followed(batch.path, job, stream, container, generation)
        joblog = self._joblogs.setdefault(job, JobLog(self.takeover_after))
        facts = self._facts(job)
        stream = followed.stream
        # The head too: NCCL prints its transport at start-up, which a restart of the exporter reads as the head.
        self._scanners.setdefault(job, _JobScanners()).feed(batch.lines)
        out: list = []
        events = stream.feed_many(batch.lines, batch.read_time)
        ahead = batch.read_time + MAX_CLOCK_SKEW_SECONDS
        if any(event.time > ahead for event in events):
            # A line dated ahead of this node's clock (a time zone the line does not name, a wrong clock) is read
            # as of when it was read: a time in the future would hold the job's counts there.
            self._counts["line_time_ahead"] += sum(event.time > ahead for event in events)
            events = [replace(e, time=batch.read_time) if e.time > ahead else e for e in events]
        if batch.kind == HEAD:  # the file's head, read at a restart: its start-up facts, not old progress
            events = [e for e in events if isinstance(e.record, Startup)]
        if events:
            parser = stream.parser
            ends = bool(parser and parser.ends_saves_at_next_step)
            out.extend(joblog.feed(batch.path, events, facts, ends, followed.generation, live=batch.kind != HEAD))
        followed.lines += len(batch.lines)
        if stream.unrecognised and batch.path not in self._warned:
            self._warned.add(batch.path)
            log.warning("sources.logs: %s (job %s): %s", batch.path, job, stream.unrecognised)
        if stream.no_progress != followed.announced:
            followed.announced = stream.no_progress
            if stream.no_progress is not None:
                self._unread(job, batch.path, stream.no_progress)
        updates = [item for item in out if isinstance(item, Update)]
        seen = 0  # updates met so far: the next one is updates[seen]
        for item in out:
            if isinstance(item, Update):
                seen += 1
                after = updates[seen] if seen < len(updates) else None
                # Lines read together (a backlog, a burst) closer than the job model's resolution would only
                # replace each other in its window: feed the last of them, and any before a total that drops.
                if (
                    after is not None
                    and after.time - item.time < REPORT_RESOLUTION_SECONDS
                    and (item.tokens_total is None or (after.tokens_total or 0.0) >= item.tokens_total)
                ):
                    continue
                self._apply(job, item, joblog, batch.read_time)
            elif isinstance(item, SaveAction):
                self._save(job, item)
            elif isinstance(item, RunAction):
                self._run(job, item, batch.read_time)
            elif isinstance(item, WaitAction):
                self._wait(job, item, batch.read_time)

    def _unread(self, job: str, path: str, reason: str) -> None:
        """A detected format whose progress lines read nothing: the job's reason and the log say so at once, rather
        than the job showing no MFU with no word why (the stream counts it as ``no_progress_read``)."""
        log.warning("sources.logs: %s (job %s): %s", path, job, reason)
        self._add(Seen(job, f"{os.path.basename(path)}: {reason}"))

    def _add(self, item: FeedItem) -> None:
        """Under the source's lock: ``item`` for the next sample to hand the service."""
        if len(self._feed) >= self.max_feed:
            del self._feed[0]
            self._counts["feed_dropped"] += 1
        self._feed.append(item)

    def _facts(self, job: str) -> Facts:
        configured = self.jobs_config.get(job, {})
        gpus = self._model.gpu_count(job) if self._model is not None else None
        return Facts(
            node_gpus=gpus,
            world_size=configured.get("world_size"),
            seq_len=configured.get("seq_len"),
            global_batch=configured.get("global_batch"),
        )

    def _model_facts(self, job: str, joblog: JobLog) -> dict[str, Any]:
        """What the log printed of the model, where ``jobs.<job>`` does not say it."""
        configured = self.jobs_config.get(job, {})
        facts = {}
        for ours, theirs in STARTUP_FACTS.items():
            value = getattr(joblog.startup, theirs)
            if configured.get(ours) is None and value is not None and value > 0:
                facts[ours] = value
        return facts

    def _apply(self, job: str, update: Update, joblog: JobLog, read_time: float) -> None:
        at = update.time
        if not math.isfinite(at) or at <= 0 or at > read_time + MAX_CLOCK_SKEW_SECONDS:
            at = read_time  # a log clock far off (a time zone the line does not name): when we read it
        mfu = update.framework_mfu
        tflops = update.framework_tflops_per_gpu
        tokens = update.tokens_total
        if tokens is not None and not (math.isfinite(tokens) and 0 <= tokens <= MAX_TOKENS):
            self._counts["tokens_out_of_range"] += 1
            tokens = None
        else:
            self._fed.add(job)
        self._add(
            Progress(
                job,
                at,
                step=update.step,
                tokens=float(tokens) if tokens is not None else None,
                # A rate integrated since this reader began is no running total of the job's own: after a restart
                # of the exporter it starts again from the lines read then.
                continues=update.how != INTEGRATED,
                framework_mfu=mfu if mfu is not None and math.isfinite(mfu) else None,
                framework_tflops_per_gpu=tflops if tflops is not None and math.isfinite(tflops) else None,
                reason=update.reason,
                facts=self._model_facts(job, joblog),
                read=read_time,
            )
        )

    def _run(self, job: str, action: RunAction, read_time: float) -> None:
        """A run of the job starts, loads a checkpoint or says where it resumes: the job's time ledger. A job not
        fed progress yet is known from now on, with the reason a log without progress lines gives."""
        at = action.time
        if not math.isfinite(at) or at <= 0 or at > read_time + MAX_CLOCK_SKEW_SECONDS:
            at = read_time
        reason = None if job in self._fed else NO_PROGRESS
        self._add(RunEvent(job, action.event, at, step=action.step, duration=action.duration, reason=reason))

    def _wait(self, job: str, action: WaitAction, read_time: float) -> None:
        """The job's running data-wait total (one rank's seconds), for its data-wait figures and the cause input."""
        if not math.isfinite(action.seconds) or action.seconds < 0:
            return
        at = action.time
        if not math.isfinite(at) or at <= 0 or at > read_time + MAX_CLOCK_SKEW_SECONDS:
            at = read_time
        self._add(DataWait(job, action.seconds, at, f"log:{action.framework}"))

    def _save(self, job: str, action: SaveAction) -> None:
        self._add(Save(job, action.phase, action.name, action.time, ORIGIN, duration=action.duration))


def logs_source(section: LogsConfig, ctx: SourceContext) -> LogsSource:
    """The ``mfu_exporter.sources.SOURCES`` factory: ``sources.logs``, with ``jobs:`` for what a log cannot say (world
    size, sequence length), on ``ctx``'s wall clock."""
    return LogsSource(section, ctx.config["jobs"], clock=ctx.wall)
