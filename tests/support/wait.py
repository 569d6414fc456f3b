"""Waiting for a condition in tests: one signature for threads (``wait_until``) and the event loop (``wait_for``)."""

from __future__ import annotations

import asyncio
import inspect
import time
from typing import Awaitable, Callable, TypeVar

T = TypeVar("T")

FIRST_DELAY = 0.005  # the first re-check: most conditions hold within milliseconds


def _delays(interval: float):
    # Quick re-checks first, then every ``interval`` at most: a fast condition is seen fast, and a slow one is not
    # polled in a busy loop (a poll may be a scrape of a process the test shares two cores with).
    delay = min(FIRST_DELAY, interval)
    while True:
        yield delay
        delay = min(delay * 2, interval)


def _timed_out(what: str, timeout: float, last: object) -> AssertionError:
    return AssertionError(f"timed out after {timeout:g}s waiting for {what} (last: {last!r})")


def wait_until(
    predicate: Callable[[], T],
    timeout: float = 5.0,
    what: str = "the condition",
    interval: float = 0.2,
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """Call ``predicate`` until it returns something truthy, and return that. After ``timeout`` seconds an
    AssertionError names ``what`` and the last answer. An exception in ``ignore`` counts as a falsy answer (a
    server that is not listening yet); any other propagates."""
    deadline = time.monotonic() + timeout
    last = None
    for delay in _delays(interval):
        try:
            last = predicate()
        except ignore as exc:
            last = exc
        else:
            if last:
                return last
        if time.monotonic() >= deadline:
            raise _timed_out(what, timeout, last)
        time.sleep(delay)
    raise AssertionError("unreachable")


async def wait_for(
    predicate: Callable[[], T | Awaitable[T]],
    timeout: float = 5.0,
    what: str = "the condition",
    interval: float = 0.2,
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """``wait_until`` for tests on the event loop: it yields to the loop between checks, so the servers and
    samplers running there make progress. ``predicate`` may be a coroutine function (a request to the server under
    test): its answer is awaited."""
    deadline = time.monotonic() + timeout
    last = None
    for delay in _delays(interval):
        try:
            last = predicate()
            if inspect.isawaitable(last):
                last = await last
        except ignore as exc:
            last = exc
        else:
            if last:
                return last
        if time.monotonic() >= deadline:
            raise _timed_out(what, timeout, last)
        await asyncio.sleep(delay)
    raise AssertionError("unreachable")


TICK_TIMEOUT = 30.0  # a 1 s tick on a busy machine


async def next_tick(service, timeout: float = TICK_TIMEOUT) -> None:
    """Wait for the service's next 1 s tick to have run: it publishes the job model's state to /metrics, so a report
    made before this call shows in a scrape after it."""
    ticks = service.ticks
    await wait_for(lambda: service.ticks > ticks, timeout, "the service's next tick")
