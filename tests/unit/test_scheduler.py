import asyncio

from exporter.scheduler import Scheduler
from exporter.sources.base import Snapshot


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
