"""The one prometheus_client Collector: fresh metric families from the latest snapshots, never calling a source."""

from __future__ import annotations

import operator
import time
from typing import Callable, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from mfu_exporter import __version__
from mfu_exporter.model.job_view import JobView
from mfu_exporter.model.jobs import JobTracker
from mfu_exporter.render.jobs import job_families
from mfu_exporter.render.ledger import ledger_families
from mfu_exporter.render.snapshots import snapshot_families
from mfu_exporter.scheduler import Scheduler
from mfu_exporter.sources.base import Snapshot


class ExporterCollector(Collector):
    def __init__(
        self,
        scheduler: Scheduler,
        jobs: JobTracker,
        extra: Iterable[Callable[[], Iterable[Metric]]] = (),
        clock: Callable[[], float] = time.time,
    ):
        self._scheduler = scheduler
        self._jobs = jobs
        self._extra = list(extra)
        self._clock = clock
        # The jobs' families with the views they were built from: the job model keeps a view until its job changes
        # or a tick passes, so while the views are the same objects their families are too.
        self._job_parts: tuple[list, list[Metric]] | None = None
        self._self_parts: tuple[int, list[Metric]] | None = None  # (the scheduler's generation, the families then)
        self._per_view: dict[int, tuple[JobView, list[Metric]]] = {}  # id(view) -> (the view, its own families)

    def add(self, part: Callable[[], Iterable[Metric]]) -> None:
        """Families to yield after the others, from a call that may give new ones each time."""
        self._extra.append(part)

    def describe(self) -> list:
        # Registration must not touch any source (NVML could hang); an empty description skips the collision check.
        return []

    def collect(self) -> Iterable[Metric]:
        for part in self.parts():
            yield from snapshot_families(part) if isinstance(part, Snapshot) else part()

    def parts(self) -> list[Snapshot | Callable[[], Iterable[Metric]]]:
        """What ``collect`` yields, in order and in parts: the sources' latest snapshots, whose families are the same
        for as long as the snapshot is the latest (so their encoding can be kept), and calls whose families may
        change at any time (jobs, the exporter's own series)."""
        snapshots = [state.snapshot for state in self._scheduler.states.values() if state.snapshot is not None]
        return [self._self_metrics, *snapshots, self._job_families, *self._extra]

    def _job_families(self) -> Iterable[Metric]:
        views = self._jobs.views()
        kept = self._job_parts
        if kept is not None and len(kept[0]) == len(views) and all(map(operator.is_, kept[0], views)):
            return kept[1]
        # Both renderers return the same families whatever the views, each view adding its samples in turn: a job's
        # families are built alone and kept with its view, and one changed job costs its own families only.
        built = self._per_view
        per_view = [
            known[1] if (known := built.get(id(view))) is not None and known[0] is view else _view_families(view)
            for view in views
        ]
        self._per_view = {id(view): (view, own) for view, own in zip(views, per_view)}
        families = _joined(per_view) if per_view else _view_families(None)
        self._job_parts = (views, families)
        return families

    def _self_metrics(self) -> list[Metric]:
        """The exporter's own series, the same list while no source finished a sample (the scheduler's generation
        moves after each), so a render after a report reuses their encoding."""
        generation = self._scheduler.generation  # read first: a sample ending meanwhile moves it past these families
        kept = self._self_parts
        if kept is not None and kept[0] == generation:
            return kept[1]
        families = list(self._source_families())
        self._self_parts = (generation, families)
        return families

    def _source_families(self) -> Iterable[Metric]:
        build = InfoMetricFamily("mfu_exporter_build", "Version of mfu-exporter.")
        build.add_metric([], {"version": __version__})
        yield build
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
        for state in self._scheduler.states.values():
            up.add_metric([state.name], 1.0 if state.up else 0.0)
            if state.last_duration is not None:
                duration.add_metric([state.name], state.last_duration)
            if state.last_success is not None:
                success.add_metric([state.name], state.last_success)
            for reason, count in sorted(state.errors.items()):
                errors.add_metric([state.name, reason], count)
        yield from (up, duration, success, errors)


def _view_families(view: JobView | None) -> list[Metric]:
    """One job's families (the families without samples for None)."""
    views = [view] if view is not None else []
    return [*job_families(views), *ledger_families(views)]


def _joined(per_view: list[list[Metric]]) -> list[Metric]:
    """The jobs' own families joined family by family, their samples in the views' order: what the renderers make
    of all the views at once."""
    joined = []
    for own in zip(*per_view):
        first = own[0]
        family = first.__class__.__new__(first.__class__)  # a shallow copy, without copy.copy's generic reduce
        family.__dict__.update(first.__dict__)
        family.samples = [sample for one in own for sample in one.samples]
        joined.append(family)
    return joined
