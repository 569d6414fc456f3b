"""A short in-memory history of each job's MFU, so the status page can draw the last 15 minutes on first load. Each
point is (time, MFU, tokens/s, the hardware estimate): a job that reports nothing still has the last."""

from __future__ import annotations

from collections import deque
from typing import Iterable

from mfu_exporter.model.job_view import JobView


class MfuHistory:
    def __init__(self, span: float = 900.0, step: float = 5.0):
        self.span = span
        self.step = step
        self._points: dict[str, deque] = {}
        self._last = float("-inf")

    def record(self, now: float, views: Iterable[JobView]) -> None:
        """Keep one point per job every ``step`` seconds; jobs that are gone lose their history."""
        if now - self._last < self.step:
            return
        self._last = now
        seen = set()
        for view in views:
            seen.add(view.name)
            points = self._points.setdefault(view.name, deque(maxlen=int(self.span / self.step) + 1))
            hardware = view.hardware.headline() if view.hardware is not None else None
            points.append((round(now, 1), view.mfu, view.tokens_per_second, hardware))
        for name in set(self._points) - seen:
            del self._points[name]

    def of(self, job: str) -> list[tuple[float, float | None, float | None, float | None]]:
        return list(self._points.get(job, ()))
