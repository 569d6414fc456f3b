"""The interface every source implements, and the snapshot it hands the daemon.

A source is sampled in its own worker thread by the scheduler (``exporter.scheduler``); a scrape never calls it.
``sample()`` may block or hang (NVML on a sick GPU does); the scheduler's timeout protects everything else.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Protocol

from prometheus_client.metrics_core import Metric


class SourceUnavailable(Exception):
    """The source cannot sample on this machine right now (no NVML library, no RDMA devices...).

    ``reason`` becomes the ``reason`` label of ``mfu_exporter_source_errors_total`` and is shown on the status
    page; ``retry_after`` tells the scheduler to wait that long before trying again.
    """

    def __init__(self, reason: str, detail: str = "", retry_after: float | None = None):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail
        self.retry_after = retry_after


@dataclass
class Snapshot:
    """What one sample cycle produced.

    ``render`` yields fresh metric families from this snapshot's data each time it is called (at most once per
    scrape body); ``errors`` counts problems met during this cycle by reason (a missing counter file, one lost GPU)
    that did not fail the whole source; ``status`` is a JSON-able summary for the status page and APIs.
    """

    render: Callable[[], Iterable[Metric]] = lambda: ()
    errors: Counter = field(default_factory=Counter)
    status: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)


class Source(Protocol):
    name: str
    interval: float
    timeout: float

    def sample(self) -> Snapshot:
        """Take one sample (blocking). Raise SourceUnavailable when the source cannot work here."""

    def close(self) -> None:
        """Release handles; called once at shutdown from the source's worker thread."""


@dataclass
class Paths:
    sysfs: str = "/sys"
    procfs: str = "/proc"
