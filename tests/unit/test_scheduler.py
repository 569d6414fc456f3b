import asyncio
import contextlib
import gc
import threading

from mfu_exporter.model.feed import Progress
from mfu_exporter.scheduler import Scheduler, _Worker
from mfu_exporter.sources.base import Snapshot, SourceUnavailable
from tests.support.wait import wait_for


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


async def test_a_call_that_fails_after_its_awaiter_left_is_not_logged_as_never_retrieved():
    loop = asyncio.get_running_loop()
    reported: list[dict] = []
    loop.set_exception_handler(lambda _, context: reported.append(context))
    worker = _Worker("leaving")

    def fails():
        raise SourceUnavailable("nothing_to_discover", "no pods here")

    future = worker.submit(fails)
    while not future.done():
        await asyncio.sleep(0.01)
    worker.stop()
    del future
    gc.collect()
    await asyncio.sleep(0)
    assert reported == []


async def test_an_awaiter_still_gets_the_call_s_error():
    worker = _Worker("failing")

    def fails():
        raise SourceUnavailable("nothing_to_discover", "no pods here")

    try:
        await worker.submit(fails)
    except SourceUnavailable as exc:
        assert exc.reason == "nothing_to_discover"
    else:
        raise AssertionError("the call's error was lost")
    finally:
        worker.stop()


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


class FeedingSource:
    """Each sample's feed: one progress item of job ``llm``, its token total one higher than the last; a sample may be
    made to hang until released, past the scheduler's timeout."""

    name, interval, timeout = "feeding", 3600.0, 0.05

    def __init__(self):
        self.tokens = 0.0
        self.release = None

    def sample(self):
        if self.release is not None:
            self.release.wait()
        self.tokens += 1.0
        return Snapshot(feed=(Progress("llm", 1_000.0 + self.tokens, tokens=self.tokens),))

    def close(self):
        pass


@contextlib.asynccontextmanager
async def sampled_once(source):
    """A running scheduler over ``source`` once its first sample is done; stopped on the way out."""
    scheduler = Scheduler([source])
    await scheduler.start()
    try:
        await scheduler.first_cycle_done.wait()
        yield scheduler
    finally:
        await scheduler.stop()


def taken_tokens(scheduler):
    """What ``take_feed`` hands over: each feed's source and its items' token totals."""
    return [(name, [item.tokens for item in feed]) for name, feed in scheduler.take_feed()]


async def test_each_sample_s_feed_is_taken_once_in_order_and_a_hung_sample_s_when_it_ends():
    source = FeedingSource()
    async with sampled_once(source) as scheduler:
        await scheduler.sample_once(source)
        assert taken_tokens(scheduler) == [("feeding", [1.0]), ("feeding", [2.0])]
        assert scheduler.take_feed() == []
        source.release = threading.Event()
        hung = asyncio.create_task(scheduler.sample_once(source))
        await wait_for(lambda: scheduler.states["feeding"].reason == "timeout", 10, "the sample's timeout")
        source.release.set()  # what it read is kept however late it returns
        await hung
        assert taken_tokens(scheduler) == [("feeding", [3.0])]


class ReadingSource(FeedingSource):
    """A FeedingSource whose own thread also reads between samples: ``between`` is what it read since."""

    def __init__(self):
        super().__init__()
        self.between = []

    def take_feed(self):
        taken, self.between = tuple(self.between), []
        return taken


async def test_what_a_source_read_between_samples_is_taken_at_each_call_after_its_samples_feeds():
    source = ReadingSource()
    async with sampled_once(source) as scheduler:
        source.between.append(Progress("llm", 1_010.0, tokens=5.0))
        assert taken_tokens(scheduler) == [("feeding", [1.0]), ("feeding", [5.0])]  # the sample's, read first
        assert scheduler.take_feed() == []  # nothing read since: no sample, and nothing between
