"""What the tier benchmarks count (bench/fleet.py, bench/global_tier.py): a Prometheus group's iterations told apart
by their evaluation timestamps, older partials given the per-window denominators the global tier divides by, and
the global groups' expressions read from the rule files as the engines run them, and each group's share of its own
interval with each engine's slowest group (the growth table's columns)."""

from collections import defaultdict

from bench.fleet import group_intervals, growth_table, prometheus_iterations, shares, slowest
from bench.global_tier import rule_groups, with_window_denominators
from tests.support.prom_harness import GLOBAL_RULE_FILES, RULE_FILES


def own_metrics(started: float, seconds: float, first_started: float = 0.0) -> dict[str, float]:
    group = 'rule_group="/etc/rules/mfu-exporter.shard.yaml;mfu-exporter.shard"'
    fresh = 'rule_group="/etc/rules/mfu-exporter.rules.yaml;mfu-exporter.windows"'
    return {
        f"prometheus_rule_group_last_evaluation_timestamp_seconds{{{group}}}": started,
        f"prometheus_rule_group_last_duration_seconds{{{group}}}": seconds,
        f"prometheus_rule_group_last_evaluation_timestamp_seconds{{{fresh}}}": first_started,
        f"prometheus_rule_group_last_duration_seconds{{{fresh}}}": 0.0,
    }


def test_a_prometheus_iteration_polled_twice_counts_once():
    seen: dict[str, dict[float, float]] = defaultdict(dict)
    prometheus_iterations(own_metrics(100.0, 0.4), seen)
    prometheus_iterations(own_metrics(100.0, 0.4), seen)
    prometheus_iterations(own_metrics(115.0, 0.6), seen)
    assert seen == {"mfu-exporter.shard": {100.0: 0.4, 115.0: 0.6}}, "a group not yet evaluated counts no iteration"


def test_older_partials_get_the_per_window_denominators_from_the_peak_sum():
    peak = {"__name__": "training_job_shard:mfu_job_peak_flops:sum", "training_job": "llama"}
    rate = {"__name__": "training_job_shard:mfu_job_model_flops:sum_rate1m", "training_job": "llama"}
    derived = with_window_denominators([{"metric": peak, "value": 8e14}, {"metric": rate, "value": 2e14}])
    names = {item["metric"]["__name__"]: item["value"] for item in derived}
    assert names["training_job_shard:mfu_job_peak_flops:sum_where_rate1m"] == 8e14
    assert names["training_job_shard:mfu_job_peak_flops:sum_where_rate5m"] == 8e14
    assert len(with_window_denominators(derived)) == len(derived), "partials that have them are kept as they are"


def test_the_global_groups_are_timed_with_every_rule_of_their_files():
    groups = dict(rule_groups(list(GLOBAL_RULE_FILES)))
    assert {"mfu-exporter.rules", "mfu-exporter.attribution", "mfu-exporter.training"} <= set(groups)
    assert all(exprs for exprs in groups.values())
    assert any("peak_flops:sum_where_rate1m" in expr for expr in groups["mfu-exporter.rules"])


def test_each_group_is_measured_against_its_own_interval():
    """A group with ``interval: 1m`` has 6 s of its minute for 10 %; the others the evaluation interval's 1.5 s."""
    intervals = group_intervals(list(RULE_FILES), 15.0)
    assert intervals["mfu-exporter.node"] == 60.0 and intervals["mfu-exporter.shard.attribution"] == 15.0
    groups = {
        "mfu-exporter.node": {"mean": 3.0},
        "mfu-exporter.shard.attribution": {"mean": 1.2},
        "mfu-exporter.gpu": {"mean": 0.03},
    }
    share = shares(groups, intervals)
    assert share == {"mfu-exporter.node": 0.05, "mfu-exporter.shard.attribution": 0.08, "mfu-exporter.gpu": 0.002}
    assert slowest(groups, share) == {"group": "mfu-exporter.shard.attribution", "mean_seconds": 1.2, "share": 0.08}
    # A group that finished no evaluation while measured is the slowest: it missed its interval entirely.
    groups["mfu-exporter.fabric"] = {"mean": None}
    assert slowest(groups, shares(groups, intervals))["group"] == "mfu-exporter.fabric"


def test_the_growth_table_has_a_row_per_size_and_engine_with_the_machines_busy_share():
    result = {
        "nodes": 2048,
        "layout": "replay",
        "prometheus_mode": "scrape",
        "machine_busy_share": 0.4,
        "slowest_group": {
            "vmalert": {"group": "mfu-exporter.shard.attribution", "mean_seconds": 0.75, "share": 0.05},
            "prometheus": None,
        },
    }
    header, rule, row = growth_table([result])
    assert header.startswith("| nodes | fleet | engine | slowest group | mean (ms) | share of its interval |")
    assert (
        row
        == "| 2,048 | replayed node | VictoriaMetrics (vmalert) | `mfu-exporter.shard.attribution` | 750 | 5 % | 40 % |"
    )
