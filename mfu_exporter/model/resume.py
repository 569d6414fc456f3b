"""What one exporter leaves for the next on the same node, so a job's counters resume instead of restarting.

Prometheus reads a counter that comes back lower as a reset and adds its whole value again: a job's token and FLOPs
counters must resume where they were after an exporter restart, or begin at 0. ``JobTracker.counters`` gives them,
the service writes them to ``state.dir`` (``mfu_exporter.statefile``), and ``JobTracker.restore`` takes them back at the
next start. Pure: the JSON form only, no files.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SavedCounters:
    """A job's counters as an exporter left them: the exported tokens and FLOPs, the job's own running total then
    (``raw_tokens``), when the series began (Unix time, its OpenMetrics ``_created``) and when the job was last heard
    of (``seen``: a job silent for ``ingest.job_ttl`` is forgotten, saved or not)."""

    tokens: float
    raw_tokens: float
    flops: float
    created: float
    seen: float
    # Saved as its exporter stopped (the file's "final"), not periodically: nothing was counted after it.
    final: bool = True

    def as_json(self) -> dict[str, float]:
        return {field: getattr(self, field) for field in FIELDS}

    @classmethod
    def from_json(cls, data: Any) -> SavedCounters | None:
        """The saved counters, or None when ``data`` is not what ``as_json`` writes (a damaged or foreign file)."""
        if not isinstance(data, dict):
            return None
        values = [data.get(key) for key in FIELDS]
        numbers = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if len(numbers) != len(FIELDS) or not all(math.isfinite(v) and v >= 0 for v in numbers):
            return None
        tokens, raw, flops, created, seen = numbers
        return cls(tokens, raw, flops, created, seen)


FIELDS = ("tokens", "raw_tokens", "flops", "created", "seen")


def counters_start(
    saved: SavedCounters | None, total: float, continues: bool, now: float
) -> tuple[float, float, float, float]:
    """Where a job's counters start at its first count here (``total``, the job's own running total): (tokens to add
    to its total, FLOPs counted, tokens counted in them, Unix time the series began). At 0 with nothing saved. Saved
    by an earlier exporter: a total at or above the saved one, in a frame that survives a restart (``continues``: a
    running total of the job's own), adds what the job did meanwhile; otherwise the counters resume where they were
    and count from this total on. Never lower than saved: Prometheus would read a reset.

    A save that was not ``final`` (``saved.final``: a periodic one, left by an exporter that was killed) may be older than the last
    value exported: a running total still says what the job did since, but a total in a frame of its own does not,
    and resuming at the saved value could be lower than the last value exported. Such a job begins a new series at 0,
    with its own ``_created``; so does a running total that went back below the saved one (the job restarted
    meanwhile: the tokens it counted after that save, before the restart, are in no total now)."""
    if saved is None:
        return -total, 0.0, 0.0, now
    if continues and total >= saved.raw_tokens:
        carried = saved.tokens - saved.raw_tokens
    elif saved.final:
        carried = saved.tokens - total
    else:
        return -total, 0.0, 0.0, now
    while carried + total < saved.tokens:  # rounded an ulp below the saved value: Prometheus would read a reset
        carried = math.nextafter(carried, math.inf)
    return carried, saved.flops, saved.tokens, saved.created
