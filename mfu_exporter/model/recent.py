"""RecentValues: the last values of a series and their median, for the ledger's ideal step and a job's cadence."""

from __future__ import annotations

import bisect
from collections import deque


class RecentValues:
    """The last ``size`` values and their upper median. The values are also kept sorted as they come and go (a
    bisection each), so a median is a lookup: each report and each view of a job reads the medians several times,
    and sorting 256 values for them was the ledger's largest cost per report."""

    def __init__(self, size: int):
        self._size = size
        self._recent: deque[float] = deque()
        self._sorted: list[float] = []

    def append(self, value: float) -> None:
        if len(self._recent) == self._size:
            del self._sorted[bisect.bisect_left(self._sorted, self._recent.popleft())]
        self._recent.append(value)
        bisect.insort(self._sorted, value)

    def median(self) -> float:
        return self._sorted[len(self._sorted) // 2]

    def __len__(self) -> int:
        return len(self._recent)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RecentValues) and self._recent == other._recent

    def __repr__(self) -> str:
        return f"RecentValues({list(self._recent)!r})"
