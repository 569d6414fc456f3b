"""tests/support/timescale.py: the shipped rules and routing on a clock ``speed`` times faster change their
durations, per-second rates and ``time()`` only, and refuse what they cannot scale."""

from __future__ import annotations

from pathlib import Path

import promql_parser
import pytest
import yaml

from tests.support.timescale import scale_alertmanager, scale_duration, scale_expr, scale_rules, seconds

ROOT = Path(__file__).resolve().parents[2]
RULE_FILES = sorted((ROOT / "alerts").glob("mfu-exporter.*.yaml"))
ORIGIN = 1_800_000_000.0


def canonical(expr: str) -> str:
    return str(promql_parser.parse(expr))


def test_durations_divide_into_whole_milliseconds():
    assert seconds("1h30m") == 5400 and seconds("500ms") == 0.5
    assert scale_duration("5m", 60) == "5000ms"
    assert scale_duration("15s", 60) == "250ms"
    assert scale_duration("1h", 7) == "514286ms"
    assert scale_duration("1ms", 1000) == "1ms"  # never 0
    with pytest.raises(ValueError):
        seconds("5 minutes")


@pytest.mark.parametrize(
    "expr, expected",
    [
        ("rate(x_total[5m]) > 0.1", "(rate(x_total[5000ms]) / 60) > 0.1"),
        ("increase(x_total[10m]) > 0", "increase(x_total[10000ms]) > 0"),
        ("x unless x offset 10m", "x unless x offset 10000ms"),
        (
            "sum_over_time(r[1h:1m]) / count_over_time(vector(1)[1h:1m])",
            "sum_over_time(r[60000ms:1000ms]) / count_over_time(vector(1)[60000ms:1000ms])",
        ),
        ("max_over_time(c[5m:])", "max_over_time(c[5000ms:])"),
        ("time() - t < 3600", f"(60 * time() - 59 * {ORIGIN:.3f}) - t < 3600"),
        ('rate(x{counter=~"rate|[5m]"}[1m])', '(rate(x{counter=~"rate|[5m]"}[1000ms]) / 60)'),
        ("a:rate5m + irate(y[1m]) * deriv(g[5m])", "a:rate5m + (irate(y[1000ms]) / 60) * (deriv(g[5000ms]) / 60)"),
        ("sum by (rate) (rate(z[5m]))", "sum by (rate) ((rate(z[5000ms]) / 60))"),
    ],
)
def test_an_expression_changes_its_durations_rates_and_time_only(expr, expected):
    scaled = scale_expr(expr, 60, ORIGIN)
    assert canonical(scaled) == canonical(expected)


def test_rates_and_the_clock_read_in_demo_time():
    """A counter growing 2/s of demo time grows 120/s of wall time at speed 60: the scaled rate reads 2 again; the
    scaled time() is the demo's clock, 60 s ahead for each wall second after the origin."""
    assert "/ 60" in scale_expr("rate(c[5m])", 60, ORIGIN)
    demo_time = scale_expr("time()", 60, ORIGIN)
    assert eval(demo_time.replace("time()", str(ORIGIN + 10))) == pytest.approx(ORIGIN + 600)


@pytest.mark.parametrize(
    "expr", ["timestamp(x)", "predict_linear(x[1h], 3600)", "hour()", "x @ 1700000000", "day_of_week(x)"]
)
def test_a_wall_clock_function_is_refused(expr):
    with pytest.raises(ValueError):
        scale_expr(expr, 10, ORIGIN)


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.name)
def test_at_speed_one_every_shipped_rule_is_the_same_expression(path):
    document = yaml.safe_load(path.read_text())
    scaled = scale_rules(document, 1, ORIGIN)
    for group, same in zip(document["groups"], scaled["groups"]):
        for rule, copy in zip(group["rules"], same["rules"]):
            assert canonical(copy["expr"]) == canonical(rule["expr"]), rule.get("alert") or rule["record"]
            assert {k: v for k, v in copy.items() if k not in ("expr", "for")} == {
                k: v for k, v in rule.items() if k not in ("expr", "for")
            }
            if "for" in rule:
                assert seconds(copy["for"]) == seconds(rule["for"])


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.name)
def test_at_speed_sixty_every_shipped_rule_parses_with_its_for_and_interval_divided(path):
    document = yaml.safe_load(path.read_text())
    scaled = scale_rules(document, 60, ORIGIN)
    for group, fast in zip(document["groups"], scaled["groups"]):
        if "interval" in group:
            assert seconds(fast["interval"]) == pytest.approx(seconds(group["interval"]) / 60)
        for rule, copy in zip(group["rules"], fast["rules"]):
            promql_parser.parse(copy["expr"])
            assert copy.get("annotations") == rule.get("annotations") and copy.get("labels") == rule.get("labels")
            if "for" in rule:
                assert seconds(copy["for"]) == pytest.approx(seconds(rule["for"]) / 60, abs=0.001)


def test_alertmanager_keeps_its_routes_and_posts_each_receiver_to_the_webhook():
    config = yaml.safe_load((ROOT / "alerts" / "alertmanager.example.yaml").read_text())
    scaled = scale_alertmanager(config, 30, "http://127.0.0.1:1/")
    route = scaled["route"]
    assert (route["group_wait"], route["group_interval"], route["repeat_interval"]) == ("1000ms", "10000ms", "480000ms")
    assert [r["repeat_interval"] for r in route["routes"] if "repeat_interval" in r] == ["120000ms"]
    assert [(r["receiver"], r["matchers"]) for r in route["routes"]] == [
        (r["receiver"], r["matchers"]) for r in config["route"]["routes"]
    ]
    assert route["group_by"] == config["route"]["group_by"] and scaled["inhibit_rules"] == config["inhibit_rules"]
    hooks = {r["name"]: [h["url"] for h in r.get("webhook_configs", [])] for r in scaled["receivers"]}
    assert hooks == {
        "pager": ["http://127.0.0.1:1/pager"],
        "chat": ["http://127.0.0.1:1/chat"],
        "blackhole": [],
    }
    assert not any(key.endswith("_configs") and key != "webhook_configs" for r in scaled["receivers"] for key in r)
