"""A job's data wait: how long its training loop waited for the next batch, from its client or its log.

The job gives a running total of one rank's wall seconds (the client's ``data_wait_seconds``, a log's
``WaitAction``); a total that goes down is a new process's (a restart), counted from zero again. Each increase
counts once for each of the job's GPUs on this node, so the exported total is in GPU-seconds (data-parallel ranks
wait for their batches in lockstep: one rank's wait is every local GPU's). The share is the wait's part of the
wall time over the MFU window: Δwait ÷ Δt between the oldest and newest figures inside it, at most 1. Data wait
is time a step still spends: it stays inside the ledger's ``productive`` and is shown beside it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

# Figures closer than this replace the newest point, as a job's token window does (jobs may report every step).
RESOLUTION_SECONDS = 1.0
# Points kept for the share, at least: enough for a window of any length at one point per resolution.
MAX_POINTS = 4096
# The recent share, over the last figures this far apart (or the last interval when figures are sparser). It tells
# the attribution that a loader waits now, as a drop in recent progress tells it the job slowed: the share over the
# MFU window would cross the line only a fraction of a window later.
RECENT_SECONDS = 2.0


@dataclass
class DataWaitMeter:
    """One job's data wait: the running totals it sent and what they add up to."""

    source: str  # "client", or "log:<framework>"
    rank_seconds: float = 0.0  # one rank's wait, summed over every process of the job (monotonic)
    gpu_seconds: float = 0.0  # each increase x the job's GPUs here when it came (monotonic)
    last_total: float | None = None  # the newest running total the job sent
    points: deque = field(default_factory=lambda: deque(maxlen=MAX_POINTS))  # (time, rank_seconds)

    def observe(self, at: float, total: float, gpus: int | None, source: str) -> None:
        """A running total of one rank's seconds, as of ``at`` (the job's time)."""
        # The first figure counts whole (the job's wait so far, as its first token total does); a total below the
        # last is a new process's, counted from zero.
        grown = total if self.last_total is None or total < self.last_total else total - self.last_total
        self.last_total = total
        self.source = source
        self.rank_seconds += grown
        self.gpu_seconds += grown * (gpus or 0)
        if self.points and at < self.points[-1][0]:
            at = self.points[-1][0]
        if len(self.points) >= 2 and at - self.points[-2][0] < RESOLUTION_SECONDS:
            self.points[-1] = (at, self.rank_seconds)
        else:
            self.points.append((at, self.rank_seconds))

    def share(self, newest: float, window: float) -> float | None:
        """The wait's share of wall time over the window ending at the newest figure; None with under two figures
        a second apart."""
        points = [p for p in self.points if p[0] >= newest - window]
        if len(points) < 2 and len(self.points) >= 2:
            points = [self.points[-2], self.points[-1]]  # figures sparser than the window: the last interval
        if len(points) < 2:
            return None
        (t0, w0), (t1, w1) = points[0], points[-1]
        if t1 - t0 < RESOLUTION_SECONDS:
            return None
        return min(max((w1 - w0) / (t1 - t0), 0.0), 1.0)

    @property
    def newest(self) -> float | None:
        return self.points[-1][0] if self.points else None


@dataclass(frozen=True)
class DataWaitView:
    """A job's data wait at one instant: GPU-seconds so far, its share of wall time over the MFU window and over the
    last seconds (None until two figures are a second apart), and where it came from."""

    gpu_seconds: float
    rank_seconds: float
    ratio: float | None
    source: str
    recent_ratio: float | None = None  # over the last RECENT_SECONDS of figures (None as ratio is)

    def as_json(self) -> dict:
        return {
            "gpu_seconds_total": self.gpu_seconds,
            "rank_seconds_total": self.rank_seconds,
            "ratio": self.ratio,
            "recent_ratio": self.recent_ratio,
            "source": self.source,
        }
