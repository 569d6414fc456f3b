"""mfu_exporter.service: what the tick publishes to /metrics (the service's API is driven through the server in
tests/unit/web)."""

import time

from mfu_exporter import service as service_module
from mfu_exporter.config import validate
from mfu_exporter.render import process
from mfu_exporter.service import build_service
from tests.support.expo import samples
from tests.support.sources import ScriptedSource
from tests.support.wait import wait_for

KEY = (("training_job", "llama"),)


def report(service, tokens):
    service.ingest_progress({"job": "llama", "tokens_total": tokens, "time": time.time()})


async def served(service):
    return samples((await service.metrics(None, None))[0].decode())


async def test_a_report_changes_the_job_model_and_shows_in_metrics_from_the_next_tick():
    service = build_service(validate({}), [])
    report(service, 100)
    assert ("mfu_job_tokens_total", KEY) not in await served(service)
    assert service.job("llama")["tokens_total"] == 100  # the model has it: the API reads the model
    service.evaluate_once()
    report(service, 250)
    assert (await served(service))[("mfu_job_tokens_total", KEY)] == 0  # its first count, as of the tick
    service.evaluate_once()
    assert (await served(service))[("mfu_job_tokens_total", KEY)] == 150


async def test_a_failing_pass_of_the_tick_still_publishes_the_jobs(monkeypatch):
    service = build_service(validate({}), [])
    report(service, 100)

    def failing(*_):
        raise RuntimeError("a bug in one figure")

    monkeypatch.setattr(service.attribution, "evaluate", failing)
    try:
        service.evaluate_once()
    except RuntimeError:
        pass
    else:
        raise AssertionError("the pass's error reaches evaluate_jobs, which logs it")
    assert (await served(service))[("mfu_job_tokens_total", KEY)] == 0


async def test_the_process_read_is_made_once_a_second_at_the_tick(monkeypatch):
    reads, now = [], [100.2]
    collect = process.DaemonProcessCollector.collect

    def counting(self):
        reads.append(now[0])
        return collect(self)

    monkeypatch.setattr(process.DaemonProcessCollector, "collect", counting)
    service = build_service(validate({}), [])
    service.export_process_metrics(monotonic=lambda: now[0])
    assert reads == [100.2] and ("process_max_fds", ()) in await served(service)
    now[0] = 100.9
    service.evaluate_once()
    assert reads == [100.2]  # the same second: the same fragment, whose encoding is kept
    now[0] = 101.0
    service.evaluate_once()
    assert reads == [100.2, 101.0]


async def test_the_collectives_are_collected_again_only_after_a_joined_source_sampled(monkeypatch):
    calls = []
    join = service_module.collective_families
    monkeypatch.setattr(service_module, "collective_families", lambda *args: calls.append(1) or join(*args))
    service = build_service(validate({}), [ScriptedSource("rdma", interval=3600)])
    assert len(calls) == 1  # collected when added
    service.evaluate_once()
    assert len(calls) == 1  # no source sampled since
    await service.scheduler.start()
    try:
        await wait_for(lambda: service.scheduler.states["rdma"].cycles, 30, "the rdma source's first sample")
    finally:
        await service.scheduler.stop()
    service.evaluate_once()
    service.evaluate_once()
    assert len(calls) == 2  # once after the sample, at the tick that followed it


class _Stop(Exception):
    pass


async def test_the_tick_keeps_its_phase_when_each_pass_takes_time(monkeypatch):
    """Each tick is due one interval after the last was due, not one interval after it ended: a pass's own time and
    the loop's late wake-ups do not add up, so the tick stays in phase with a scraper's fixed grid."""
    service = build_service(validate({"mfu": {"interval": "1s"}}), [])
    wall, starts, costs = [1000.0], [], iter([0.3, 0.2, 1.6, 0.1, 0.1])
    service.wall = lambda: wall[0]

    def evaluate_once():
        starts.append(round(wall[0], 6))
        wall[0] += next(costs)

    async def sleep(seconds):
        if len(starts) == 5:
            raise _Stop
        wall[0] += seconds + 0.01  # each wake-up a little late

    monkeypatch.setattr(service, "evaluate_once", evaluate_once)
    monkeypatch.setattr(service_module.asyncio, "sleep", sleep)
    try:
        await service.evaluate_jobs()
    except _Stop:
        pass
    # The third pass took longer than the interval: the next starts at once (after MIN_PAUSE) and keeps that phase.
    assert starts == [1000.0, 1001.01, 1002.01, 1003.67, 1004.67]
