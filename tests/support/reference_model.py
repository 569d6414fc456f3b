"""The truth of an event sequence, for the job model's property test: what each job counter and gauge should read.

What really happened is the job's runs (a process starts, may load a checkpoint, trains at its rate, may crash);
what the exporter saw is the reports it accepted. From both, this model says what the exporter may export:

- ``JobTruth``: the job's own running total, whether a process is alive, and the tokens its processes trained
  between two instants (a restart's replay from its checkpoint included: that work was done again);
- ``TokenTruth``: the bounds of the token counter's increase over the whole sequence. At most the tokens trained
  between the first report an exporter counted and the newest it accepted (more is an over-count). At least what
  the accepted reports prove: the tokens between each two consecutive accepted reports that the counter can join,
  which are those of one run seen by one exporter, or by an exporter that resumed the counters from ``state.dir``
  with the job's running total (the same frame after the restart). Nothing joins a report to the one before it
  across a crash (the dead run's last tokens and the new run's first ones are in no report's difference), across
  an exporter restart without ``state.dir``, or in an integrated frame (a log reader's sum since it began reading);
- ``Series``: a counter as Prometheus's ``rate()`` and ``increase()`` read it across exporter restarts: a drop is a
  reset to 0, so the new value is added whole; the model refuses a drop within one exporter, and a restart that
  begins at a lower value larger than the most its new series could have counted since it began.

Pure and tiny: no exporter code, no clock of its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class Run:
    """One process of the job: started, trains from ``trains_from`` (after its checkpoint load) at ``rate`` from
    its checkpoint's total ``start_total``, until it crashes (``ended``)."""

    run_id: str | None
    started: float
    trains_from: float
    start_total: float
    rate: float
    ended: float = math.inf

    def total(self, t: float) -> float:
        """The run's own running total at ``t`` (what its reports say)."""
        return self.start_total + self.rate * max(min(t, self.ended) - self.trains_from, 0.0)

    def processed(self, t0: float, t1: float) -> float:
        """Tokens this run trained in [t0, t1]."""
        return self.rate * max(min(t1, self.ended) - max(t0, self.trains_from), 0.0)


@dataclass
class JobTruth:
    runs: list[Run] = field(default_factory=list)

    def alive(self, t: float) -> bool:
        return any(run.started <= t < run.ended for run in self.runs)

    def processed(self, t0: float, t1: float) -> float:
        return sum(run.processed(t0, t1) for run in self.runs)

    @property
    def restarts(self) -> int:
        return max(len(self.runs) - 1, 0)


@dataclass
class TokenTruth:
    """The token counter's bounds from the reports accepted, in the order they were accepted."""

    job: JobTruth
    first: float | None = None  # the job time of the first report an exporter counted
    last: tuple[float, Run] | None = None  # the newest accepted report: its time and run
    proven: float = 0.0  # tokens between consecutive accepted reports the counter can join
    joins: bool = True  # whether the next accepted report joins the newest one (False after a break)
    newest: float | None = None  # the latest job time of an accepted report

    def accepted(self, t: float, run: Run) -> None:
        if self.last is not None and self.joins and self.last[1] is run and t >= self.last[0]:
            self.proven += self.job.processed(self.last[0], t)
        if self.first is None:
            self.first = t
        self.newest = t if self.newest is None else max(self.newest, t)
        self.last, self.joins = (t, run), True

    def exporter_restarted(self, resumes: bool) -> None:
        """A new exporter: it joins its first count to the last one's only when it ``resumes`` the saved counters
        in the job's own running total."""
        self.joins = self.joins and resumes

    def most(self) -> float:
        """The most the counter may have counted: every token trained from its first count to the newest report."""
        if self.first is None or self.newest is None:
            return 0.0
        return self.job.processed(self.first, self.newest)

    def since(self, t: float) -> float:
        """The most a counter that began at the report of time ``t`` may have counted since."""
        return self.job.processed(t, self.newest) if self.newest is not None else 0.0


@dataclass
class Series:
    """One counter series, scrape by scrape, across exporter restarts.

    A series is known by when it began (its ``_created``): the same one goes on within one exporter, or resumes in
    the next from ``state.dir``, and never goes down; a new one begins at 0 at an exporter's first count and holds
    at most what that exporter can have counted since. ``increase`` is what the exporters counted, as a Prometheus
    that reads ``_created`` sums it; ``naive`` is what one that does not reads (a drop is a reset to 0, the new
    value added whole): it misses a new series that passed the old value before its first scrape, so it reads
    less, never more."""

    name: str
    created: object = None  # what identifies the series the newest value belongs to
    value: float = 0.0  # the newest value (a series that appears begins from 0 as far as increase() goes)
    increase: float = 0.0
    naive: float = 0.0

    def scrape(self, value: float, created: object, fresh_most: float, tolerance: float) -> list[str]:
        """Take one scraped ``value`` of the series begun at ``created``; a series that began in the exporter
        scraped may hold ``fresh_most`` at most. The broken invariants, said in words."""
        if not math.isfinite(value) or value < 0:
            return [f"{self.name}: {value!r} is not a counter value"]
        broken = []
        self.naive += value if value < self.value else value - self.value
        if created == self.created:
            if value < self.value:
                broken.append(f"{self.name} went down in one series (begun {created!r}): {self.value!r} -> {value!r}")
            self.increase += max(value - self.value, 0.0)
        else:
            if value > fresh_most * (1 + tolerance) + 1e-6:
                broken.append(
                    f"{self.name} began a new series at {value!r}, above the {fresh_most!r} its exporter can have "
                    f"counted (the last value was {self.value!r})"
                )
            self.increase += value
        self.value, self.created = value, created
        return broken
