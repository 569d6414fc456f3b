"""The node's loss rates (model/loss_window.py, render/attribution.py): what the shard's attribution reads instead of
every cause's counter. At every second of a run through heat, then a power cap, then health, the rates are the
counters' own 5-minute increase ÷ 300 s, only the causes that lost some have one, and the blamed series is one per
job: the bottleneck's cause with its rate."""

import pytest

from mfu_exporter.model.attribution import Attributor, NodeSignals
from mfu_exporter.model.loss_window import WINDOW_SECONDS, LossWindow
from mfu_exporter.render.attribution import attribution_families
from tests.unit.model.test_attribution import healthy_gpus, job

HOT = NodeSignals(gpus=healthy_gpus(**{"5": {"throttle_reasons": ["hw_thermal_slowdown"]}}))
CAPPED = NodeSignals(gpus=healthy_gpus(**{"2": {"throttle_reasons": ["sw_power_cap"]}}))
COOL = NodeSignals(gpus=healthy_gpus())


def exported(attributor):
    families = {m.name: m for m in attribution_families(attributor.standings())}

    def by_cause(name, suffix=""):
        return {s.labels["cause"]: s.value for s in families[name].samples if s.name == name + suffix}

    return (
        by_cause("mfu_job_lost_gpu_seconds", "_total"),
        by_cause("mfu_job_lost_gpu_seconds_per_second"),
        by_cause("mfu_job_blamed_lost_gpu_seconds_per_second"),
        by_cause("mfu_job_bottleneck"),
    )


def test_the_rates_are_the_counters_five_minute_increase_and_the_blamed_one_is_the_bottlenecks():
    attributor = Attributor(window=15.0)
    phases = [(HOT, 0.30, 400), (CAPPED, 0.20, 400), (COOL, 0.45, 400)]
    counters_at: dict[float, dict[str, float]] = {}
    now, causes_seen = 1000.0, set()
    for signals, mfu, seconds in phases:
        for _ in range(seconds):
            attributor.evaluate(now, [job(mfu=mfu)], signals)
            counters, rates, blamed, bottleneck = exported(attributor)
            counters_at[now] = counters
            before = counters_at.get(now - WINDOW_SECONDS, dict.fromkeys(counters, 0.0))
            expected = {c: (counters[c] - before[c]) / WINDOW_SECONDS for c in counters}
            assert rates == pytest.approx({c: v for c, v in expected.items() if v > 0}), now
            (cause,) = [c for c, v in bottleneck.items() if v == 1]
            assert blamed == pytest.approx({cause: expected.get(cause, 0.0)}), now
            causes_seen |= set(rates)
            now += 1.0
    # The run did what it is meant to exercise: both causes lost at a steady rate, and both rates went again.
    assert {"thermal", "power"} <= causes_seen
    assert rates == {} and blamed == {"none": 0.0}


def test_a_job_younger_than_the_window_reads_its_increase_over_the_window():
    window = LossWindow()
    window.remember(0.0, {"thermal": 0.0, "power": 0.0})
    window.remember(60.0, {"thermal": 120.0, "power": 0.0})
    assert dict(window.rates) == {"thermal": 120.0 / WINDOW_SECONDS, "power": 0.0}


def test_a_snapshot_older_than_the_windows_start_divides_by_its_own_age():
    """Evaluations 7 s apart: the newest snapshot at or before the window's start (98 s for 399 s) is older than it,
    and the rate is the increase over its own age (a steady 2 GPU-seconds a second), not over the window."""
    window = LossWindow()
    times = range(0, 400, 7)
    for t in times:
        window.remember(float(t), {"thermal": 2.0 * t})
    assert dict(window.rates)["thermal"] == pytest.approx(2.0)
    assert window.history[0][0] == 98.0 and len(window.history) == len([t for t in times if t >= 98])
