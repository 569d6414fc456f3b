"""Checkpoint restores per job: how long each load took (the time ledger's ``checkpoint_load`` bands) and how many
bytes the mounts holding the job's checkpoints read meanwhile (the storage source's counters): the read side of
the checkpoint plane, beside the writes the checkpoint tracker counts.

A load counts once its band is closed (the ledger's band after it began), once, by its number in the job's ledger.
Its bytes are the growth of the checkpoint mounts' read counters from the last storage sample at or before the
band's start to the first at or after its end: the whole load is inside, whatever the sampling interval, and a
mount's reads just before and after it (within one interval) count too; interpolating instead would split a short
load's bytes with the idle time around it. A load the samples do not cover (the exporter started during it, no
checkpoint mount configured) counts with its time and without bytes. The counters count every reader of the mount: a
restore's bytes are the mount's reads around the load, which are the restore's own on a node where nothing else
reads that mount then.

Pure: no I/O, no clock of its own, no Prometheus types (rendered in ``mfu_exporter.render.restore``).
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass
from typing import Iterable, Mapping

LOAD = "checkpoint_load"
HISTORY_SECONDS = 1800.0  # storage samples kept: a band is committed within the ledger's holdback (120 s) of its end
GIVE_UP_SECONDS = 600.0  # a load ended this long ago with no storage sample after it counts without bytes


@dataclass(frozen=True)
class RestoreTotals:
    """A job's restores on this node since the exporter started."""

    loads: int = 0
    seconds: float = 0.0
    read_bytes: float = 0.0  # of the loads whose bytes are known
    loads_with_bytes: int = 0
    last_seconds: float | None = None
    last_read_bytes: float | None = None

    @property
    def last_bandwidth(self) -> float | None:
        if self.last_read_bytes is None or not self.last_seconds or self.last_seconds <= 0:
            return None
        return self.last_read_bytes / self.last_seconds


class RestoreMeter:
    def __init__(self, history_seconds: float = HISTORY_SECONDS):
        self._history_seconds = history_seconds
        self._samples: dict[str, deque[tuple[float, float]]] = {}  # mount point -> (Unix time, read bytes)
        self._counted: dict[str, int] = {}  # job -> the number of its newest load counted
        self._totals: dict[str, RestoreTotals] = {}

    def observe_mounts(self, at: float, read_bytes: Mapping[str, float]) -> None:
        """The read counters of the checkpoint mounts, sampled at ``at`` (a counter that went back starts anew)."""
        for point, value in read_bytes.items():
            samples = self._samples.setdefault(point, deque())
            if samples and at <= samples[-1][0]:
                continue
            if samples and value < samples[-1][1]:
                samples.clear()  # remounted: the bytes before are another counter's
            samples.append((at, value))
            while samples and samples[0][0] < at - self._history_seconds:
                samples.popleft()

    def observe_job(
        self, job: str, loads: Iterable[tuple[int, int, float, float]], mounts: tuple[str, ...], now: float
    ) -> None:
        """The job's ended loads from its ledger (number, run, start, end); ``mounts``: the mount points holding its
        checkpoints. Each load counts once, by its number; a load waiting for its storage sample holds later ones."""
        counted = self._counted.get(job, 0)
        for number, _run, start, end in sorted(loads):
            if number <= counted:
                continue
            read = self._read_between(mounts, start, end)
            if read is _PENDING:
                if now - end < GIVE_UP_SECONDS:
                    break  # the storage sample after its end has not come yet
                read = None  # the storage source stopped sampling: the load counts without its bytes
            counted = self._counted[job] = number
            self._count(job, end - start, read if isinstance(read, float) else None)

    def totals(self) -> dict[str, RestoreTotals]:
        return dict(self._totals)

    def forget(self, jobs: Iterable[str]) -> None:
        for job in jobs:
            self._counted.pop(job, None)
            self._totals.pop(job, None)

    def _count(self, job: str, seconds: float, read: float | None) -> None:
        before = self._totals.get(job, RestoreTotals())
        self._totals[job] = RestoreTotals(
            loads=before.loads + 1,
            seconds=before.seconds + seconds,
            read_bytes=before.read_bytes + (read or 0.0),
            loads_with_bytes=before.loads_with_bytes + (read is not None),
            last_seconds=seconds,
            last_read_bytes=read,
        )

    def _read_between(self, mounts: tuple[str, ...], start: float, end: float) -> float | None | object:
        """Bytes the mounts read from ``start`` to ``end``; None when a mount's samples do not reach back to
        ``start``; ``_PENDING`` while none has been sampled after ``end``."""
        if not mounts:
            return None
        total = 0.0
        for point in mounts:
            samples = self._samples.get(point)
            if not samples or samples[-1][0] < end:
                return _PENDING if samples else None
            if samples[0][0] > start:
                return None
            total += _first_at_or_after(samples, end) - _last_at_or_before(samples, start)
        return max(total, 0.0)


_PENDING = object()


def _last_at_or_before(samples: deque[tuple[float, float]], when: float) -> float:
    times = [t for t, _ in samples]
    return samples[bisect.bisect_right(times, when) - 1][1]


def _first_at_or_after(samples: deque[tuple[float, float]], when: float) -> float:
    times = [t for t, _ in samples]
    return samples[bisect.bisect_left(times, when)][1]
