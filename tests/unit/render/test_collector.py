"""mfu_exporter.render.collector: the jobs' families built one job at a time and joined are what the renderers make of
all the jobs at once, before and after one job changes; the kept ones are reused while their views are."""

from mfu_exporter.model.jobs import JobTracker
from mfu_exporter.model.progress import parse_progress
from mfu_exporter.render.collector import ExporterCollector
from mfu_exporter.render.jobs import job_families
from mfu_exporter.render.ledger import ledger_families
from mfu_exporter.scheduler import Scheduler

MODEL = {"model": {"params": "7B"}, "gpus": 8, "peak_tflops": 989.4}


class Clock:
    def __init__(self):
        self.now = 1_000_000.0

    def __call__(self):
        return self.now


def as_data(families):
    return [(f.name, f.type, f.documentation, f.unit, list(f.samples)) for f in families]


def test_the_jobs_families_joined_job_by_job_are_those_of_all_the_jobs_at_once():
    clock = Clock()
    jobs = JobTracker(clock=clock, monotonic=clock)
    collector = ExporterCollector(Scheduler([]), jobs, clock=clock)
    assert as_data(collector._job_families()) == as_data([*job_families([]), *ledger_families([])])
    for step in range(1, 4):
        for index, name in enumerate(("a", "b", "c")):
            body = {"job": name, "tokens_total": step * 1000 * (index + 1), "step": step, "time": clock.now, **MODEL}
            jobs.report(parse_progress({**body, "state": "finished"} if (name, step) == ("c", 3) else body, clock.now))
        clock.now += 5
        views = jobs.views()
        assert as_data(collector._job_families()) == as_data([*job_families(views), *ledger_families(views)])
    kept = collector._job_families()
    assert collector._job_families() is kept  # no job changed: the same families
    jobs.report(parse_progress({"job": "b", "tokens_total": 99_000, "time": clock.now, **MODEL}, clock.now))
    views = jobs.views()
    changed = collector._job_families()
    assert changed is not kept
    assert as_data(changed) == as_data([*job_families(views), *ledger_families(views)])
