import asyncio

from mfu_exporter.scheduler import Scheduler
from mfu_exporter.sources.base import Snapshot


class InstantSource:
    name, interval, timeout = "instant", 0.0, 1.0

    def sample(self):
        return Snapshot()

    def close(self):
        pass


async def test_stop_ends_even_when_a_cancel_lands_as_a_sample_completes():
    # Samples finishing in microseconds make wait_for swallow the cancel now and then; stop() must still return.
    for cycle in range(200):
        scheduler = Scheduler([InstantSource()])
        await scheduler.start()
        await asyncio.sleep(0.001 * (cycle % 4))
        await asyncio.wait_for(scheduler.stop(), 5)


class SlowSource:
    """Samples once at start, then by hand; each sample moves the scheduler's clock by ``takes`` seconds."""

    name, interval, timeout = "slow", 3600.0, 10.0

    def __init__(self, clock: list[float], takes: float):
        self.clock, self.takes = clock, takes

    def sample(self):
        self.clock[0] += self.takes
        return Snapshot()

    def close(self):
        pass


async def test_listeners_hear_when_the_next_snapshot_is_expected():
    """The source's interval at the scheduler's speed, or the last sample's duration when that is longer: a sample
    slower than the interval is followed at once by the next, which ends as late again."""
    clock = [0.0]
    source = SlowSource(clock, 0.5)
    scheduler = Scheduler([source], monotonic=lambda: clock[0], speed=2.0)
    heard = []
    scheduler.on_sample(lambda name, next_in: heard.append((name, next_in)))
    await scheduler.start()
    try:
        await scheduler.first_cycle_done.wait()
        scheduler.states["slow"].interval = 1.0  # what the listener reads; the loop's next cycle stays an hour away
        await scheduler.sample_once(source)
        source.takes = 3.0
        await scheduler.sample_once(source)
        assert heard == [("slow", 1800.0), ("slow", 0.5), ("slow", 3.0)]
    finally:
        await scheduler.stop()
