"""mfu_exporter.render.collector: the jobs' families published at a tick are what the renderers make of the tick's
views, all at once; a report changes nothing published until the next tick; a sample publishes its source's
snapshot and the exporter's own series, in the scheduler's order."""

from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily

from mfu_exporter.model.jobs import JobTracker
from mfu_exporter.model.progress import parse_progress
from mfu_exporter.render.collector import ExporterCollector
from mfu_exporter.render.jobs import job_families
from mfu_exporter.render.ledger import ledger_families
from mfu_exporter.render.snapshots import snapshot_families
from mfu_exporter.scheduler import Scheduler
from mfu_exporter.sources.base import Snapshot
from tests.support.sources import ScriptedSource
from tests.support.wait import wait_for

MODEL = {"model": {"params": "7B"}, "gpus": 8, "peak_tflops": 989.4}


class Clock:
    def __init__(self):
        self.now = 1_000_000.0

    def __call__(self):
        return self.now


def as_data(families):
    return [(f.name, f.type, f.documentation, f.unit, list(f.samples)) for f in families]


def job_part(collector):
    """The families of the page's jobs' fragment (after the exporter's own series: no source here)."""
    return collector.page.fragments[1].families()


def test_the_jobs_families_published_at_a_tick_are_the_renderers_of_its_views():
    clock = Clock()
    jobs = JobTracker(clock=clock, monotonic=clock)
    collector = ExporterCollector(Scheduler([]), jobs)
    assert as_data(job_part(collector)) == as_data([*job_families([]), *ledger_families([])])
    for step in range(1, 4):
        for index, name in enumerate(("a", "b", "c")):
            body = {"job": name, "tokens_total": step * 1000 * (index + 1), "step": step, "time": clock.now, **MODEL}
            jobs.report(parse_progress({**body, "state": "finished"} if (name, step) == ("c", 3) else body, clock.now))
        clock.now += 5
        views = jobs.tick()
        collector.tick(views)
        assert as_data(job_part(collector)) == as_data([*job_families(views), *ledger_families(views)])
    published = collector.page
    jobs.report(parse_progress({"job": "b", "tokens_total": 99_000, "time": clock.now, **MODEL}, clock.now))
    assert collector.page is published  # a report changes the job model only
    views = jobs.tick()
    collector.tick(views)
    assert collector.page is not published
    assert as_data(job_part(collector)) == as_data([*job_families(views), *ledger_families(views)])
    assert as_data(collector.collect()) == as_data(
        [*collector.page.fragments[0].families(), *job_families(views), *ledger_families(views)]
    )


async def test_a_sample_publishes_its_snapshot_in_the_schedulers_order():
    scheduler = Scheduler([ScriptedSource("first", interval=3600), ScriptedSource("second", interval=3600)])
    collector = ExporterCollector(scheduler, JobTracker())
    scheduler.on_sample(collector.sampled)
    await scheduler.start()
    try:
        await wait_for(lambda: all(state.cycles for state in scheduler.states.values()), 30, "both first samples")
        snapshots = [scheduler.states[name].snapshot for name in ("first", "second")]
        fragments = collector.page.fragments
        assert len(fragments) == 4  # the exporter's own series, the two sources, the jobs
        for fragment, snapshot in zip(fragments[1:3], snapshots):
            assert fragment.ahead and as_data(fragment.families()) == as_data(snapshot_families(snapshot))
        own = as_data(fragments[0].families())
        assert [sample.labels["source"] for sample in own[1][4]] == ["first", "second"]  # mfu_exporter_source_up
    finally:
        await scheduler.stop()


@dataclass(frozen=True)
class Level:
    """Readings of a type without a renderer of the table: they render themselves."""

    value: float

    def families(self):
        family = GaugeMetricFamily("mfu_test_level", "A level.")
        family.add_metric([], self.value)
        return [family]


def test_a_sample_that_read_what_the_last_one_did_keeps_its_fragment():
    scheduler = Scheduler([ScriptedSource("level", interval=3600)])
    collector = ExporterCollector(scheduler, JobTracker())

    def publish(value):
        scheduler.keep("level", Snapshot(Level(value)))
        collector.sampled("level")
        return collector.page.fragments[1]

    first = publish(1.0)
    assert publish(1.0) is first  # equal readings of a new sample: the encodings already made stand
    changed = publish(2.0)
    assert changed is not first and as_data(changed.families())[0][4][0].value == 2.0
    scheduler.states["level"].snapshot = None
    collector.sampled("level")
    assert len(collector.page.fragments) == 2  # the exporter's own series and the jobs: the source has nothing
    assert publish(2.0) is not changed
