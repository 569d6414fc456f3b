"""The logs source as the service runs it, without the service: each sample's feed applied to a job model and
a checkpoint tracker, as the service's tick applies them (``mfu_exporter.model.feed``)."""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable

from mfu_exporter.model.checkpoints import CheckpointTracker
from mfu_exporter.model.feed import apply_feed
from mfu_exporter.model.jobs import JobTracker
from mfu_exporter.sources.base import ModelReads, Snapshot
from mfu_exporter.sources.logs import LogsSource


class Fed:
    """``source`` bound to ``tracker``; ``pods`` is what discovery's latest snapshot says of the jobs' pods.
    ``errors`` adds up every sample's errors and what its feed could not change (``too_many_jobs``...), as the
    scheduler and the service add up the source's error counter."""

    def __init__(
        self,
        source: LogsSource,
        tracker: JobTracker,
        checkpoints: CheckpointTracker | None = None,
        pods: Callable[[], dict[str, list[tuple[str, str]]]] = dict,
    ):
        self.source, self.tracker, self.checkpoints, self.pods = source, tracker, checkpoints, pods
        self.errors: Counter = Counter()
        source.bind(
            ModelReads(
                gpu_count=tracker.gpu_count,
                is_discovered=tracker.is_discovered,
                job_names=tracker.names,
                discovered_pods=lambda: self.pods(),
            )
        )

    def sample(self) -> Snapshot:
        """A follower's pass (which finds new files, as its thread does between two samples), then a sample."""
        self.source.follower.poll()
        snapshot = self.source.sample()
        self.errors.update(snapshot.errors)
        self.errors.update(apply_feed(snapshot.feed, self.tracker, self.checkpoints))
        return snapshot

    def poll(self) -> None:
        """The follower's pass over its files, then what it read applied."""
        self.source.follower.poll()
        self.errors.update(apply_feed(self.source.take_feed(), self.tracker, self.checkpoints))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.source, name)
