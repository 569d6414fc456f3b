"""A source's feed: what it read that changes the job model, as items the service applies on its tick.

A source reads in its own threads (a log follower's, the scheduler's worker); the job model changes on one thread
only, the service's tick, in the order the source read. The source returns its feed with its snapshot
(``Snapshot.feed``); ``apply_feed`` applies it to the job model and the checkpoint tracker, and returns what it
could not apply, by reason, for the source's error counter.

A log line with a token total, for example, is one ``Progress``::

    Progress(job="llm", at=1733500000.0, step=120, tokens=491520000.0, facts={"params": 7e9})
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, Union

from mfu_exporter.model.checkpoints import CheckpointTracker
from mfu_exporter.model.errors import TooManyJobs, ValidationError
from mfu_exporter.model.jobs import JobTracker
from mfu_exporter.model.progress import ProgressReport


@dataclass(frozen=True, slots=True)
class Seen:
    """The job exists and gives no total, for ``reason`` (a log without progress lines)."""

    job: str
    reason: str


@dataclass(frozen=True, slots=True)
class Progress:
    """A progress line: the step, the framework's own figures, the model facts it printed and, where it has one, the
    job's token total (``continues``: a running total of the job's own, not a rate integrated since we began)."""

    job: str
    at: float
    step: int | None = None
    tokens: float | None = None
    continues: bool = True
    framework_mfu: float | None = None
    framework_tflops_per_gpu: float | None = None
    reason: str | None = None
    facts: dict[str, Any] = field(default_factory=dict)
    # Our clock when the line was read: the job's silence counts from then, not from the tick that applied it, so
    # a stall shows as soon after its last line as after a report's.
    read: float | None = None


@dataclass(frozen=True, slots=True)
class RunEvent:
    """A run of the job starts, loads a checkpoint or says where it resumes (``JobTracker.run_event``). ``reason``:
    the job is new to this feed and has no progress of its own yet, which is why it has no total."""

    job: str
    event: str
    at: float
    step: int | None = None
    duration: float | None = None
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class DataWait:
    """One rank's running total of seconds waiting for input (``origin``: "log:<framework>")."""

    job: str
    seconds: float
    at: float
    origin: str


@dataclass(frozen=True, slots=True)
class Save:
    """A checkpoint write of the job: ``phase`` is start, finish or fail."""

    job: str
    phase: str
    name: str
    at: float
    origin: str
    duration: float | None = None


@dataclass(frozen=True, slots=True)
class Heard:
    """The source has read the logs of ``jobs`` whole up to ``until`` (our clock), and delivers what it reads every
    ``every`` seconds: a job with no line since is silent up to then (``JobTracker.heard``)."""

    jobs: tuple[str, ...]
    until: float
    every: float


FeedItem = Union[Seen, Progress, RunEvent, DataWait, Save, Heard]


def apply_feed(items: Iterable[FeedItem], jobs: JobTracker, checkpoints: CheckpointTracker | None) -> Counter:
    """Each item applied in order; what could not be, counted by reason."""
    errors: Counter = Counter()
    for item in items:
        try:
            _apply(item, jobs, checkpoints, errors)
        except TooManyJobs:
            errors["too_many_jobs"] += 1
        except ValidationError:
            errors["checkpoint_rejected" if isinstance(item, Save) else "feed_rejected"] += 1
    return errors


def _apply(item: FeedItem, jobs: JobTracker, checkpoints: CheckpointTracker | None, errors: Counter) -> None:
    if isinstance(item, Progress):
        jobs.observe(
            item.job,
            step=item.step,
            framework_mfu=item.framework_mfu,
            framework_tflops_per_gpu=item.framework_tflops_per_gpu,
            reason=item.reason,
            facts=item.facts,
            at=item.at,
        )
        if item.tokens is not None:
            report = ProgressReport(item.job, item.tokens, item.step, item.at, item.facts, continues=item.continues)
            jobs.report(report, view=False, arrived=item.read)
    elif isinstance(item, Seen):
        jobs.observe(item.job, reason=item.reason)
    elif isinstance(item, RunEvent):
        if item.reason is None:
            jobs.touch(item.job)
        else:
            jobs.observe(item.job, reason=item.reason)
        jobs.run_event(item.job, item.event, item.at, step=item.step, duration=item.duration)
    elif isinstance(item, DataWait):
        jobs.data_wait(item.job, item.seconds, item.at, item.origin)
    elif isinstance(item, Heard):
        jobs.heard(item.jobs, item.until, item.every)
    elif checkpoints is None:
        errors["checkpoint_without_tracker"] += 1
    elif item.phase == "start":
        checkpoints.start(item.job, item.name, item.at, origin=item.origin)
    elif item.phase == "finish":
        checkpoints.finish(item.job, item.name, item.at, origin=item.origin, duration=item.duration)
    else:
        checkpoints.fail(item.job, item.name, item.at, origin=item.origin, reason="log", duration=item.duration)
