"""Small helpers shared by the tests: parse an exposition into samples, and wait for a condition."""

from __future__ import annotations

import asyncio
import time

from prometheus_client.parser import text_string_to_metric_families


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """``{(name, sorted label pairs): value}`` for every sample of a text exposition."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def wait_until(predicate, timeout: float = 5.0, interval: float = 0.005) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(interval)


async def wait_for(predicate, timeout: float = 5.0) -> None:
    """``wait_until`` for tests running on the event loop: yields to it between checks."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.01)
