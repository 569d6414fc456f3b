"""mfu_exporter.node.counters: the increase of a hardware counter between two reads (32-bit wraps told from resets by
the rate they would imply), and the per-counter history the fabric sources keep."""

import pytest

from mfu_exporter.node.counters import CounterHistory, increase


@pytest.mark.parametrize(
    "previous, current, width, elapsed, expected",
    [
        (5, 9, 64, 1.0, 4),
        (2**32 - 1, 0, 32, 1.0, 1),  # wrapped by one
        (2**32 - 10**6, 10**6, 32, 1.0, 2 * 10**6),  # wrapped, plausible in a second
        (3_000_000_000, 5, 32, 1.0, None),  # would be 1.29e9 in a second: a reset
        (3_000_000_000, 5, 32, 3600.0, 1_294_967_301),  # the same is a plausible wrap over an hour
        (1_000_000_000, 5, 32, 3600.0, None),  # more than half the range: a reset whatever the interval
        (10**15, 3, 64, 1.0, None),  # 64-bit counters never wrap
        (2**40, 3, 32, 1.0, None),  # a "32-bit" counter that was wider is reset, not negative
    ],
)
def test_increase(previous, current, width, elapsed, expected):
    assert increase(previous, current, width, elapsed) == expected


def test_counter_history_forgets_counters_that_disappear():
    history = CounterHistory()
    assert history.update(0.0, {"a": 1, "b": 5}).elapsed is None
    assert history.update(1.0, {"a": 3}).deltas == {"a": 2}
    changes = history.update(2.0, {"a": 4, "b": 100})
    assert changes.deltas == {"a": 1} and changes.rate("a") == 1.0 and changes.rate("b") is None
    assert history.update(2.0, {"a": 9}).elapsed is None  # no time passed: no rate
