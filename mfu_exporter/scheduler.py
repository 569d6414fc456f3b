"""The sampling scheduler: each source on its own interval, in its own worker thread, with a timeout.

One hung or failing source (NVML on a sick GPU blocks for minutes) never delays scrapes or the other sources:
the scheduler stops waiting after ``timeout``, marks the source down, and the scrape keeps answering from the
last good snapshot. A new sample of that source starts only once the hung call has returned.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from mfu_exporter.sources.base import Snapshot, Source, SourceUnavailable

log = logging.getLogger(__name__)

MIN_PAUSE = 0.05  # seconds between the end of a source's sample and the start of its next, at least


@dataclass
class SourceState:
    """What the daemon knows of one source, read by the collector and the status page."""

    name: str
    interval: float
    snapshot: Snapshot | None = None
    up: bool = False
    reason: str | None = "not sampled yet"
    detail: str = ""
    last_duration: float | None = None
    last_success: float | None = None
    cycles: int = 0
    errors: Counter = field(default_factory=Counter)

    def as_json(self, now: float) -> dict[str, Any]:
        return {
            "source": self.name,
            "up": self.up,
            "reason": self.reason,
            "detail": self.detail,
            "interval_seconds": self.interval,
            "last_sample_duration_seconds": self.last_duration,
            "last_success_timestamp_seconds": self.last_success,
            "sample_age_seconds": None if self.last_success is None else max(now - self.last_success, 0.0),
            "errors": dict(self.errors),
            "status": self.snapshot.status if self.snapshot else {},
        }


class _Worker:
    """A daemon thread that runs one source's calls, so a call that never returns cannot block interpreter exit."""

    def __init__(self, name: str):
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=f"source-{name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            call, loop, future = self._calls.get()
            if call is None:
                return
            try:
                result, error = call(), None
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
                result, error = None, exc
            try:
                loop.call_soon_threadsafe(_settle, future, result, error)
            except RuntimeError:
                return  # the loop closed while the call ran (shutdown): nothing awaits its answer

    def submit(self, call: Callable[[], Any]) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._calls.put((call, loop, future))
        return future

    def stop(self) -> None:
        self._calls.put((None, None, None))


def _settle(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if future.cancelled():
        return
    if error is not None:
        future.set_exception(error)
        # Marked as read here: an awaiter still gets the error, and a call whose awaiter left (the scheduler
        # stopped while it ran) is not logged with its traceback when the future is collected.
        future.exception()
    else:
        future.set_result(result)


def next_due(due: float, delay: float, now: float) -> float:
    """When a periodic cycle is due next: ``delay`` after the last one was due, so the event loop's late wake-ups do
    not add up and the cycle keeps its phase. A cycle already late by more than that (a slow or hung one) starts anew
    ``MIN_PAUSE`` from ``now``.

    >>> next_due(10.0, 1.0, now=10.3)
    11.0
    >>> next_due(10.0, 1.0, now=12.5)
    12.55
    """
    return max(due + delay, now + MIN_PAUSE)


class Scheduler:
    """Runs every source's sampling loop and keeps their latest snapshots."""

    def __init__(
        self,
        sources: list[Source],
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        speed: float = 1.0,
    ):
        self.sources = sources
        # Clock seconds per wall second: the demo's simulated clock runs ``--speed`` times faster, and its sources
        # sample once per interval of that clock, as a real node's do of the real one.
        self.speed = speed
        self.states = {s.name: SourceState(s.name, s.interval) for s in sources}
        self._clock = clock
        self._monotonic = monotonic
        self._workers: dict[str, _Worker] = {}
        self._tasks: list[asyncio.Task] = []
        self.first_cycle_done: asyncio.Event | None = None  # created in start(), inside the running loop
        self._listeners: list[Callable[[str, float], None]] = []
        self._feed: list[tuple[str, tuple]] = []  # (source, its snapshot's feed), not yet taken
        # The sources that hand over what they read between their samples too (``take_feed``: the logs). A log's
        # line then reaches the job model at the next tick, not at the tick after the source's next sample.
        self._between = [(s.name, take) for s in sources if (take := getattr(s, "take_feed", None)) is not None]

    def on_sample(self, listener: Callable[[str, float], None]) -> None:
        """Call ``listener(source_name, next_in)`` on the event loop after each sample cycle: ``next_in`` is the
        seconds of wall time until the source's next snapshot is expected (its interval at the scheduler's speed, or
        the last sample's duration when that is longer)."""
        self._listeners.append(listener)

    async def start(self) -> None:
        self.first_cycle_done = asyncio.Event()
        for source in self.sources:
            self._workers[source.name] = _Worker(source.name)
            self._tasks.append(asyncio.create_task(self._loop(source), name=f"sample-{source.name}"))
        if not self.sources:
            self.first_cycle_done.set()

    async def stop(self) -> None:
        # asyncio.wait_for can swallow a cancel that lands as the awaited sample completes (bpo-42130): cancel
        # again until every loop has really ended, or stop() would wait forever.
        pending = set(self._tasks)
        while pending:
            for task in pending:
                task.cancel()
            _, pending = await asyncio.wait(pending, timeout=0.1)
        closing = []
        for source in self.sources:
            worker = self._workers.get(source.name)
            if worker is not None:
                closing.append(asyncio.wait_for(worker.submit(source.close), 1.0))
                worker.stop()
        for result in await asyncio.gather(*closing, return_exceptions=True):
            if isinstance(result, BaseException) and not isinstance(result, asyncio.TimeoutError):
                log.warning("closing a source failed: %s", result)

    @property
    def ready(self) -> bool:
        return self.first_cycle_done is not None and self.first_cycle_done.is_set()

    async def sample_once(self, source: Source) -> float:
        """One cycle of ``source``; returns how long to wait before the next one."""
        state = self.states[source.name]
        worker = self._workers[source.name]
        started = self._monotonic()
        future = worker.submit(source.sample)
        delay = source.interval
        try:
            snapshot = await asyncio.wait_for(asyncio.shield(future), source.timeout)
        except asyncio.TimeoutError:
            self._fail(state, "timeout", f"sample took longer than {source.timeout:g}s")
            self._finish(state, started)
            # Wait for the hung call: never start a second call on a source that has not returned.
            try:
                late = await future
            except Exception:  # noqa: BLE001 - the timeout is already recorded
                pass
            else:
                self._keep_feed(source.name, late)  # what it read is true however late the sample ended
            return delay
        except SourceUnavailable as exc:
            self._fail(state, exc.reason, exc.detail)
            state.snapshot = None
            delay = exc.retry_after or delay
        except Exception as exc:
            log.exception("source %s failed", source.name)
            self._fail(state, "exception", f"{type(exc).__name__}: {exc}")
        else:
            self.keep(source.name, snapshot)
        self._finish(state, started)
        return delay

    def keep(self, name: str, snapshot: Snapshot) -> None:
        """A successful sample of source ``name``: its snapshot is the latest, its errors count, its feed waits for
        the service's next tick."""
        state = self.states[name]
        state.snapshot = snapshot
        state.up = True
        state.reason = None
        state.detail = ""
        state.last_success = self._clock()
        state.errors.update(snapshot.errors)
        self._keep_feed(name, snapshot)

    def _keep_feed(self, name: str, snapshot: Snapshot) -> None:
        feed = getattr(snapshot, "feed", ())  # a hung sample's late answer is whatever it returned
        if feed:
            self._feed.append((name, feed))

    def take_feed(self) -> list[tuple[str, tuple]]:
        """Each sample's feed since the last call, in the order sampled, with its source's name, then what the
        sources that hand it over between samples read since: once each."""
        feed, self._feed = self._feed, []
        for name, take in self._between:
            between = take()
            if between:
                feed.append((name, between))
        return feed

    def count_errors(self, name: str, errors: Counter) -> None:
        """Problems met with what source ``name`` read, found after its sample (applying its feed)."""
        self.states[name].errors.update(errors)

    def _fail(self, state: SourceState, reason: str, detail: str) -> None:
        if state.up or state.reason != reason:
            log.warning("source %s down: %s %s", state.name, reason, detail)
        state.up = False
        state.reason = reason
        state.detail = detail
        state.errors[reason] += 1

    def _finish(self, state: SourceState, started: float) -> None:
        state.last_duration = self._monotonic() - started
        state.cycles += 1
        if self.first_cycle_done is not None:
            self.first_cycle_done.set()
        # A sample slower than the interval delays the next one's end by as much: the next cycle starts at once.
        next_in = max(state.interval / self.speed, state.last_duration)
        for listener in self._listeners:
            listener(state.name, next_in)

    async def _loop(self, source: Source) -> None:
        # Each cycle is due one delay after the previous one was due, not after it started: the event loop wakes
        # a task a little late each time, and sources started together with the same interval would drift apart.
        # Kept together, the 1 s sources finish their samples within milliseconds of each other, so the work each
        # new snapshot brings (the loop's wake-ups, the encoding ahead of the next scrape) is done once for all.
        due = self._monotonic()
        while True:
            delay = await self.sample_once(source)
            now = self._monotonic()
            due = next_due(due, delay / self.speed, now)
            await asyncio.sleep(due - now)
