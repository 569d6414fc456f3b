"""A job's lost GPU-seconds by cause over the last 5 minutes, as rates: what the shard's attribution reads.

The shard names, per job and cause, the node that loses most to the cause it blames now. Computed from every node's
``mfu_job_lost_gpu_seconds_total`` by cause and ``mfu_job_bottleneck``, that costs nodes × jobs × causes series an
evaluation; the node knows its own blamed cause and its rates, so it exports them (``render/attribution.py``) and the
shard reads one series per node and job (a few more for the causes that lost some in the window).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Mapping

# The shard's rate window (``[5m]`` in alerts/mfu-exporter.shard.yaml): a node's rate is the one the shard would
# compute from its counters.
WINDOW_SECONDS = 300.0
# Snapshots of the counters are kept this far apart at least: the window's start is known to a second.
SNAPSHOT_SECONDS = 1.0


@dataclass
class LossWindow:
    """Snapshots of a job's lost GPU-seconds by cause, back to the newest at or before the window's start."""

    history: deque = field(default_factory=deque)  # (our clock, the counters' values in their order)
    rates: tuple[tuple[str, float], ...] = ()  # (cause, GPU-seconds lost per second over the window)

    def remember(self, now: float, lost_seconds: Mapping[str, float]) -> None:
        """Snapshot the counters and compute their rates: the increase since the window's start ÷ the window, or ÷
        the time since the snapshot taken for it when that is older. The first snapshot is the job's first
        evaluation, every counter at 0: a job younger than the window reads as the shard's rate() of a counter
        that started at 0 (its increase ÷ the window)."""
        history = self.history
        if not history or now - history[-1][0] >= SNAPSHOT_SECONDS:
            history.append((now, tuple(lost_seconds.values())))
        start = now - WINDOW_SECONDS
        while len(history) > 1 and history[1][0] <= start:
            history.popleft()
        since, before = history[0]
        span = max(now - since, WINDOW_SECONDS)
        self.rates = tuple(
            (cause, max(seconds - earlier, 0.0) / span)
            for (cause, seconds), earlier in zip(lost_seconds.items(), before)
        )
