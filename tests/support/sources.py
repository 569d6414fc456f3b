"""Stand-ins for a source and a clock, for tests of the scheduler, the service and the HTTP layer."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Iterable

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from mfu_exporter.sources.base import Snapshot, SourceUnavailable


@dataclass(frozen=True)
class FakeValue:
    """The scripted source's readings: its name and one value. A readings type of a test renders itself."""

    name: str
    value: float

    def families(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(f"mfu_{self.name}_value", "A value from the scripted test source.")
        family.add_metric([], self.value)
        yield family


class Clock:
    """A clock the test moves by hand: ``clock()`` is ``clock.now``."""

    def __init__(self, now: float = 100.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


class ScriptedSource:
    """A source whose behaviour each test sets: a value, an outage, or a call that blocks until released."""

    def __init__(self, name="fake", interval=0.05, timeout=0.2):
        self.name, self.interval, self.timeout = name, interval, timeout
        self.value = 1.0
        self.unavailable: SourceUnavailable | None = None
        self.release = threading.Event()
        self.release.set()
        self.calls = 0
        self.closed = False

    def sample(self):
        self.calls += 1
        self.release.wait()
        if self.unavailable:
            raise self.unavailable
        value = self.value
        return Snapshot(readings=FakeValue(self.name, value), status={"value": value})

    def close(self):
        self.closed = True
        self.release.set()
