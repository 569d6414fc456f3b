"""The one prometheus_client Collector, and the publisher of /metrics' fragments; never calls a source.

Each part of /metrics is published as an immutable ``Fragment`` (``render/fragment.py``) when what it shows changes,
and the fragments make a new ``Page`` in /metrics' order: the exporter's own series, the sources' latest snapshots
in the scheduler's order, the jobs, then the parts added by the service. ``sampled`` (a ``Scheduler.on_sample``
listener) publishes the sampled source's snapshot and the exporter's own series; ``tick`` (the service's tick, every ``mfu.interval``)
publishes the jobs' views it computed, the exporter's own series when a sample that changed nothing else moved them,
and the added parts whose key moved. A progress report changes the job model
only: /metrics shows it from the next tick.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from mfu_exporter import __version__
from mfu_exporter.model.job_view import JobView
from mfu_exporter.model.jobs import JobTracker
from mfu_exporter.render.fragment import Fragment, Page
from mfu_exporter.render.jobs import job_families
from mfu_exporter.render.ledger import ledger_families
from mfu_exporter.render.snapshots import renderers, snapshot_families
from mfu_exporter.scheduler import Scheduler


@dataclass
class _Part:
    """A part added by the service: collected again at a tick when ``key()`` moved (at every tick when ``key`` is
    None), and its latest fragment with the key it was collected at."""

    collect: Callable[[], Any]
    render: Callable[[Any], Iterable[Metric]] | None
    key: Callable[[], object] | None
    seen: object = None
    fragment: Fragment | None = None

    def refresh(self) -> Fragment:
        seen = None if self.key is None else self.key()  # read first: a change meanwhile moves it past what is read
        if self.fragment is None or self.key is None or seen != self.seen:
            self.seen, self.fragment = seen, self._published()
        return self.fragment

    def _published(self) -> Fragment:
        render = self.render
        if render is None:
            return Fragment.of(self.collect())
        read = self.collect()
        return Fragment(lambda: render(read))


class ExporterCollector(Collector):
    def __init__(self, scheduler: Scheduler, jobs: JobTracker):
        self._scheduler = scheduler
        self._own_stale = False  # a sample moved the exporter's own series since ``_own`` was made
        self._shown_up: dict[str, bool] = {}  # source name -> whether ``_own`` shows it up
        self._make_own()
        self._sources: dict[str, Fragment] = {}  # source name -> its latest snapshot's fragment
        self._shown: dict[str, Any] = {}  # source name -> the readings its fragment shows
        self._renderers = renderers()  # this service's: what they keep between samples is its own
        self._job_fragment = _job_fragment(jobs.views())
        self._parts: list[_Part] = []
        self.page = self._page()

    def add(
        self,
        collect: Callable[[], Any],
        key: Callable[[], object] | None = None,
        render: Callable[[Any], Iterable[Metric]] | None = None,
    ) -> None:
        """Families published after the others: collected now, and again at each tick when ``key()`` has changed
        (at every tick without ``key``). ``collect`` builds new families each time, from what it reads then; with
        ``render``, it reads what does not change once read, and ``render`` builds its families from that when the
        fragment is first encoded (a part the tick changes but a scrape reads far less often)."""
        part = _Part(collect, render, key)
        part.refresh()
        self._parts.append(part)
        self.page = self._page()

    def describe(self) -> list:
        # Registration must not touch any source (NVML could hang); an empty description skips the collision check.
        return []

    def collect(self) -> Iterable[Metric]:
        return self.page.collect()

    def sampled(self, source: str, next_in: float | None = None) -> None:
        """Publish ``source``'s latest snapshot (none while it has none) and the exporter's own series, which its
        sample just changed. The snapshot's families are built when first encoded, from its readings alone. A good
        sample whose readings equal the shown ones publishes nothing: the tick publishes its own series."""
        state = self._scheduler.states.get(source)
        snapshot = state.snapshot if state is not None else None
        if snapshot is None:
            self._sources.pop(source, None)
            self._shown.pop(source, None)
        elif source not in self._sources or not _same(snapshot.readings, self._shown[source]):
            build = functools.partial(snapshot_families, snapshot, self._renderers)
            self._sources[source] = Fragment(build, ahead=True, sampled=True)
            self._shown[source] = snapshot.readings
        elif state is not None and state.up and self._shown_up.get(source):
            # A good sample that read what the last one did (a quiet log, no checkpoint write) keeps its fragment,
            # and the page with it: only its duration, time of success and error counts moved, which the next
            # tick publishes.
            self._own_stale = True
            return
        self._make_own()
        self.page = self._page()

    def _make_own(self) -> None:
        self._own = _own_fragment(self._scheduler)
        self._shown_up = {name: state.up for name, state in self._scheduler.states.items()}
        self._own_stale = False

    def tick(self, views: list[JobView]) -> None:
        """Publish the jobs' ``views`` (the tick's), the exporter's own series when a sample moved them, and the
        added parts whose key moved."""
        self._job_fragment = _job_fragment(views)
        if self._own_stale:
            self._make_own()
        try:
            for part in self._parts:
                part.refresh()
        finally:
            self.page = self._page()  # a part that failed keeps its last fragment; the others are published

    def _page(self) -> Page:
        sources = self._sources
        return Page(
            [
                self._own,
                *(sources[name] for name in self._scheduler.states if name in sources),
                self._job_fragment,
                *(part.refresh() if part.fragment is None else part.fragment for part in self._parts),
            ]
        )


def _same(readings: Any, shown: Any) -> bool:
    """Whether two samples' readings render the same families: equal values of one type."""
    if readings is None or shown is None:
        return readings is shown
    try:
        return type(readings) is type(shown) and bool(readings == shown)
    except Exception:  # noqa: BLE001 - readings whose comparison fails are shown anew
        return False


def _own_fragment(scheduler: Scheduler) -> Fragment:
    """The exporter's own series as the sources' states stand now, read now and built when first encoded."""
    rows = [
        (state.name, state.up, state.last_duration, state.last_success, sorted(state.errors.items()))
        for state in scheduler.states.values()
    ]
    return Fragment(lambda: _own_families(rows), sampled=True)


def _own_families(rows: list[tuple[str, bool, float | None, float | None, list[tuple[str, int]]]]) -> list[Metric]:
    build = InfoMetricFamily("mfu_exporter_build", "Version of mfu-exporter.")
    build.add_metric([], {"version": __version__})
    labels = ["source"]
    up = GaugeMetricFamily("mfu_exporter_source_up", "1 when the source's last sample succeeded.", labels=labels)
    duration = GaugeMetricFamily(
        "mfu_exporter_source_sample_duration_seconds", "Wall time of the source's last sample.", labels=labels
    )
    success = GaugeMetricFamily(
        "mfu_exporter_source_last_success_timestamp_seconds",
        "Unix time of the source's last good sample.",
        labels=labels,
    )
    errors = CounterMetricFamily(
        "mfu_exporter_source_errors",
        "Problems met while sampling, by source and reason.",
        labels=["source", "reason"],
    )
    for name, is_up, last_duration, last_success, counts in rows:
        up.add_metric([name], 1.0 if is_up else 0.0)
        if last_duration is not None:
            duration.add_metric([name], last_duration)
        if last_success is not None:
            success.add_metric([name], last_success)
        for reason, count in counts:
            errors.add_metric([name, reason], count)
    return [build, up, duration, success, errors]


def _job_fragment(views: list[JobView]) -> Fragment:
    """The jobs' families, built when first encoded: a view does not change once made."""
    return Fragment(lambda: [*job_families(views), *ledger_families(views)])
