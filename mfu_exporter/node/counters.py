"""Deltas and rates of hardware counters between two samples, aware of wraps and resets.

Prometheus handles counter resets itself, so the exported values stay raw. The daemon's own consumers (the
status page, loss attribution) need rates, and a naive ``current - previous`` goes negative when a driver reload
resets a counter and jumps by 2^32 when an mlx5 Q-counter wraps. The rules here:

- a counter that went up increased by the difference;
- a counter narrower than 64 bits that went down wrapped, if the wrapped increase is one the hardware could have
  produced in the elapsed time (``max_wrap_rate`` events per second, at most half the counter's range);
- anything else that went down was reset: its delta for that interval is unknown (``None``), never negative or
  huge. A 64-bit counter is never taken to wrap: at 10^9 events a second that takes five centuries.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Mapping

# More events per second than any counter of a 400 Gb/s port sees (~6e8 minimum-size frames per second); it
# bounds how far a narrow counter may have wrapped before a decrease counts as a reset instead.
DEFAULT_MAX_WRAP_RATE = 1e9


def increase(
    previous: int, current: int, width: int, elapsed: float, max_wrap_rate: float = DEFAULT_MAX_WRAP_RATE
) -> int | None:
    """How much a ``width``-bit counter grew from ``previous`` to ``current``; None when it was reset."""
    if current >= previous:
        return current - previous
    if width < 64:
        modulus = 1 << width
        if previous < modulus:
            wrapped = current + modulus - previous
            if wrapped <= min(max_wrap_rate * elapsed, modulus // 2):
                return wrapped
    return None


@dataclass
class Changes:
    """What a set of counters did between the previous sample and this one."""

    elapsed: float | None  # seconds since the previous sample; None on the first
    deltas: dict[str, int] = field(default_factory=dict)  # counters whose increase is known
    resets: list[str] = field(default_factory=list)  # counters that went backwards (reset, reload)

    def rate(self, name: str, scale: float = 1.0) -> float | None:
        """Per-second increase of ``name`` times ``scale``; None when unknown."""
        delta = self.deltas.get(name)
        if delta is None or not self.elapsed:
            return None
        return delta * scale / self.elapsed

    def rates(self) -> dict[str, float]:
        if not self.elapsed:
            return {}
        elapsed = self.elapsed
        return {name: delta / elapsed for name, delta in self.deltas.items()}


class CounterHistory:
    """The previous readings of one group of counters read together (one RDMA port, one NIC).

    ``widths`` names the counters narrower than 64 bits; every other counter is taken as 64-bit. Counters that
    disappear from a reading are forgotten, so one that comes back (a stat set that changed with the PFC
    configuration, a device plugged in again) starts a fresh baseline instead of a bogus delta.
    """

    def __init__(self, widths: Mapping[str, int] | None = None, max_wrap_rate: float = DEFAULT_MAX_WRAP_RATE):
        self._widths = widths or {}
        self._max_wrap_rate = max_wrap_rate
        self._previous: Mapping[str, int] = {}
        self._previous_time: float | None = None

    def update(self, now: float, values: Mapping[str, int]) -> Changes:
        """Record ``values`` read at ``now`` (a monotonic clock) and return what changed since the last call."""
        previous, previous_time = self._previous, self._previous_time
        self._previous, self._previous_time = values, now
        if previous_time is None or now <= previous_time:
            return Changes(None)
        elapsed = now - previous_time
        changes = Changes(elapsed)
        deltas, widths, max_wrap_rate = changes.deltas, self._widths, self._max_wrap_rate
        for name, current in values.items():
            before = previous.get(name)
            if before is None:
                continue
            if current >= before:
                deltas[name] = current - before
                continue
            grown = increase(before, current, widths.get(name, 64), elapsed, max_wrap_rate)
            if grown is None:
                changes.resets.append(name)
            else:
                deltas[name] = grown
        return changes


class Totals:
    """Per-node sums of counters that stay monotonic while the devices under them come and go.

    A plain sum over devices drops when a GPU falls off the bus or a port is unplugged, and a drop reads as a counter
    reset to Prometheus (a spike in ``rate``). Here each device's increase is added instead: a device's first reading
    adds nothing, a value that went down was reset and adds itself. So a total counts from when the exporter started.
    """

    def __init__(self) -> None:
        self.totals: dict[str, float] = {}
        self._last: dict[tuple[str, str], float] = {}

    def add_reading(self, device: str, name: str, value: float) -> None:
        """The latest raw value of counter ``name`` on ``device``."""
        last = self._last.get((device, name))
        self._last[device, name] = value
        total = self.totals.get(name, 0.0)
        if last is not None:
            total += value - last if value >= last else value
        self.totals[name] = total

    def add_increase(self, name: str, increase: float) -> None:
        """An increase known already (a ``Changes`` delta, wraps and resets handled there)."""
        self.totals[name] = self.totals.get(name, 0.0) + increase


class WindowedRates:
    """Rates of several counters over the last ``window`` seconds, for the largest of them (the node's busiest port).

    Each sample adds the counters' increases since the previous one; the rate of a counter is its increase between
    the oldest sample kept and the newest over the time between them. A sliding window, not the last second, because
    a scrape every 15 s would otherwise see one second in fifteen.
    """

    def __init__(self, window: float):
        self.window = window
        self._totals: dict[str, float] = {}
        self._samples: deque[tuple[float, dict[str, float]]] = deque()

    def add(self, now: float, increases: Mapping[str, float]) -> None:
        totals = self._totals
        for name, increase in increases.items():
            totals[name] = totals.get(name, 0.0) + increase
        self._samples.append((now, dict(totals)))
        while len(self._samples) > 2 and now - self._samples[1][0] >= self.window:
            self._samples.popleft()

    def max_rate(self) -> float | None:
        """The highest per-second rate of any counter over the window; None until two samples span some time."""
        if len(self._samples) < 2:
            return None
        (start, first), (end, last) = self._samples[0], self._samples[-1]
        if end <= start:
            return None
        return max((value - first.get(name, 0.0) for name, value in last.items()), default=0.0) / (end - start)
