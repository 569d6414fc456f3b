"""Alert and recording rules: promtool's checks and unit tests, the mixin conventions, Alertmanager routing, and the
recorded MFU against the exporter's own through a real Prometheus."""

from __future__ import annotations

import re
import subprocess
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest
import yaml

from mfu_exporter.client import ProgressReporter
from tests.support.prom_harness import (  # noqa: F401 - start_exporter and start_prometheus are fixtures
    RULE_FILES,
    SCRAPE_JOB,
    derived_rules,
    documented_metrics,
    listening_addresses,
    metric_names,
    no_sources_config,
    start_exporter,
    start_prometheus,
)
from tests.support.tools import require_tool

ROOT = Path(__file__).resolve().parents[2]
ALERTS_DIR = ROOT / "alerts"
RULES_FILE, ALERTS_FILE, SHARD_FILE, NODE_FILE = RULE_FILES
RULE_TESTS = sorted((ALERTS_DIR / "tests").glob("*.yaml"))
ALERTMANAGER_EXAMPLE = ALERTS_DIR / "alertmanager.example.yaml"
RUNBOOK = ROOT / "docs" / "runbook.md"
SEVERITIES = {"critical", "warning", "info"}
EVALUATION_STEP = 60  # seconds; every file under alerts/tests evaluates once a minute


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def rules(path: Path) -> list[dict]:
    return [rule for group in load(path)["groups"] for rule in group["rules"]]


def alert_rules() -> list[dict]:
    return [rule for path in (ALERTS_FILE, SHARD_FILE, NODE_FILE) for rule in rules(path) if "alert" in rule]


def recorded_names() -> set[str]:
    return {rule["record"] for path in RULE_FILES for rule in rules(path) if "record" in rule}


def seconds(duration: str) -> int:
    """A Prometheus duration such as ``1h30m`` or ``90s`` in seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    parts = re.findall(r"(\d+)([smhd])", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, f"unsupported duration {duration!r}"
    return sum(int(n) * units[u] for n, u in parts)


def run(*command: str) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=ALERTS_DIR)


# --- promtool ---------------------------------------------------------------------------------------------------


def test_rule_files_pass_promtool_check():
    promtool = require_tool("promtool", "prometheus")
    result = run(promtool, "check", "rules", *map(str, RULE_FILES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(RULE_FILES)


def test_rule_unit_tests_pass_promtool():
    promtool = require_tool("promtool", "prometheus")
    assert RULE_TESTS
    result = run(promtool, "test", "rules", *map(str, RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(RULE_TESTS)


def test_promtool_unit_tests_catch_a_changed_threshold(tmp_path):
    """The unit tests depend on the thresholds they claim to check: moving MfuLow's line makes them fail."""
    promtool = require_tool("promtool", "prometheus")
    (tmp_path / "tests").mkdir()
    changed = RULES_FILE.read_text().replace("vector(0.25)", "vector(0.2)")
    assert changed != RULES_FILE.read_text()
    (tmp_path / RULES_FILE.name).write_text(changed)
    for other in (ALERTS_FILE, SHARD_FILE, NODE_FILE):
        (tmp_path / other.name).write_text(other.read_text())
    test_file = tmp_path / "tests" / "training-alerts.test.yaml"
    test_file.write_text((ALERTS_DIR / "tests" / "training-alerts.test.yaml").read_text())
    result = run(promtool, "test", "rules", str(test_file))
    assert result.returncode != 0
    assert "alertname: MfuLow" in result.stdout + result.stderr


# --- conventions ----------------------------------------------------------------------------------------------


def test_alerts_follow_the_mixin_conventions():
    # One PrometheusRule carries every file (scripts/gen-prometheusrule.py): group names are unique across them.
    every = [g["name"] for path in RULE_FILES for g in load(path)["groups"]]
    assert len(set(every)) == len(every), every
    groups = [group for path in RULE_FILES for group in load(path)["groups"]]
    for group in groups:
        assert group["name"].startswith("mfu-exporter."), group["name"]
        assert len(group["rules"]) <= 20, f"{group['name']}: more than 20 rules"
    for rule in alert_rules():
        name, annotations = rule["alert"], rule["annotations"]
        assert re.fullmatch(r"Mfu(?:[A-Z][a-z0-9]+)+", name) and len(name) <= 40, name
        assert rule["labels"]["severity"] in SEVERITIES, name
        summary, description = annotations["summary"], annotations["description"]
        assert "{{" not in summary and summary[0].isupper() and summary.endswith("."), f"{name}: summary {summary!r}"
        assert "{{" in description and description.endswith("."), f"{name}: description {description!r}"
        # Absolute, on the base scripts/gen-prometheusrule.py sets (tests/unit/test_runbook_links.py checks the heading).
        assert re.fullmatch(rf"https://\S+/runbook\.md#{name.lower()}", annotations["runbook_url"]), name


def test_recording_rules_are_named_level_metric_operation():
    for name in recorded_names():
        level, metric, operation = name.split(":")
        assert re.fullmatch(r"[a-z_]+", level) and re.fullmatch(r"[a-z0-9_]+", operation), name
        assert not metric.endswith("_total"), f"{name}: strip _total when taking a rate"


def test_every_alert_has_a_runbook_entry_and_every_entry_an_alert():
    headings = set(re.findall(r"^## (\S+)$", RUNBOOK.read_text(), re.MULTILINE))
    alerts = {rule["alert"] for rule in alert_rules()}
    assert alerts <= headings
    assert {h for h in headings if h.startswith("Mfu")} == alerts


def test_rules_read_only_recorded_or_documented_series():
    recorded, documented = recorded_names(), documented_metrics()
    for rule in [rule for path in RULE_FILES for rule in rules(path)]:
        for name in metric_names(rule["expr"]):
            if ":" in name:
                assert name in recorded, (
                    f"{rule.get('alert') or rule['record']}: {name} is not recorded by a file of alerts/"
                )
            else:
                assert name in documented or name == "up", (
                    f"{rule.get('alert') or rule['record']}: {name} is not in docs/metrics.md"
                )


# --- the unit tests cover every rule ---------------------------------------------------------------------------


def unit_tests() -> list[dict]:
    cases = []
    for path in RULE_TESTS:
        document = load(path)
        assert seconds(document["evaluation_interval"]) == EVALUATION_STEP, path.name
        cases += document["tests"]
    return cases


def test_every_recording_rule_has_its_value_tested():
    tested = set()
    for case in unit_tests():
        for check in case.get("promql_expr_test", []):
            if check["exp_samples"]:
                tested |= metric_names(check["expr"])
    assert recorded_names() <= tested, f"untested: {sorted(recorded_names() - tested)}"


def test_every_alert_is_tested_quiet_one_step_before_it_fires():
    """For each alert rule (name and severity): a test where it fires at t, with its labels and annotations, and is
    not firing at t minus one evaluation step: the edge of its ``for:`` (or of its condition, without one)."""
    covered = set()
    for case in unit_tests():
        firing_at: dict[str, dict[int, set[str]]] = defaultdict(dict)
        for check in case.get("alert_rule_test", []):
            expected = check["exp_alerts"]
            for alert in expected:
                assert alert.get("exp_annotations"), f"{check['alertname']}: annotations not checked"
            firing_at[check["alertname"]][seconds(check["eval_time"])] = {a["exp_labels"]["severity"] for a in expected}
        for name, times in firing_at.items():
            for at, severities in times.items():
                before = times.get(at - EVALUATION_STEP)
                if before is not None:
                    covered |= {(name, severity) for severity in severities - before}
    wanted = {(rule["alert"], rule["labels"]["severity"]) for rule in alert_rules()}
    assert wanted <= covered, f"not tested at the edge: {sorted(wanted - covered)}"


# --- Alertmanager ------------------------------------------------------------------------------------------------


def test_alertmanager_example_passes_amtool():
    amtool = require_tool("amtool", "prometheus-alertmanager")
    result = run(amtool, "check-config", str(ALERTMANAGER_EXAMPLE))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("severity, receiver", [("critical", "pager"), ("warning", "chat"), ("info", "blackhole")])
def test_alertmanager_example_routes_by_severity(severity, receiver):
    amtool = require_tool("amtool", "prometheus-alertmanager")
    result = run(
        amtool,
        "config",
        "routes",
        "test",
        f"--config.file={ALERTMANAGER_EXAMPLE}",
        "alertname=MfuLow",
        "training_job=llama",
        f"severity={severity}",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [receiver]


# --- a real Prometheus -----------------------------------------------------------------------------------------

PARAMS, GPUS, PEAK_TFLOPS, TOKENS_PER_SECOND = 7e9, 8, 100.0, 8000.0
EXPECTED_MFU = 6 * PARAMS * TOKENS_PER_SECOND / (GPUS * PEAK_TFLOPS * 1e12)  # 0.42
# Seconds of samples the test's copy of the rules rates over, instead of 1m and 5m. A scrape that lands within the
# tick's jitter reads the count one tick early or late: a rate over 29 s of 1 s ticks is then off by 1/29, under the
# 2 points of MFU the test allows (over 15 s it would be 1/14, or 3 points).
RATE_WINDOW = 30


def report_steadily(reporter: ProgressReporter, stop: threading.Event, every: float = 0.1) -> None:
    started = time.time()
    while not stop.wait(every):
        reporter.update(tokens_total=TOKENS_PER_SECOND * (time.time() - started))


@pytest.mark.slow
def test_recorded_mfu_matches_the_exporter_through_a_real_prometheus(start_exporter, start_prometheus, tmp_path):  # noqa: F811 - fixtures
    """The exporter, fed progress by the real client, scraped each second by Debian's Prometheus running the rules:
    the recorded job MFU (the global tier's, from the shard tier's partial sums) agrees with the exporter's own
    within 2 points. The rules run as a copy whose 1m and 5m windows are 30 s, so the test needs 30 s of samples,
    not five minutes."""
    exporter = start_exporter(no_sources_config())
    windows = {"1m": f"{RATE_WINDOW}s", "5m": f"{RATE_WINDOW}s"}
    copies = [derived_rules(path, tmp_path / path.name, ranges=windows) for path in (SHARD_FILE, RULES_FILE)]
    prometheus = start_prometheus(rule_files=[*copies, ALERTS_FILE], scrape_jobs={SCRAPE_JOB: [exporter.address]})

    reporter = ProgressReporter(exporter.url, "harness", model={"params": PARAMS}, gpus=GPUS, peak_tflops=PEAK_TFLOPS)
    stop = threading.Event()
    feeder = threading.Thread(target=report_steadily, args=(reporter, stop), daemon=True)
    feeder.start()
    try:
        selector = f'mfu_job_model_flops_total{{job="{SCRAPE_JOB}", training_job="harness"}}'
        prometheus.wait_for(
            f"count_over_time({selector}[{RATE_WINDOW + 5}s]) > {RATE_WINDOW + 1}", timeout=RATE_WINDOW + 30
        )
        recorded = prometheus.wait_for('training_job:mfu_model_flops_utilization:ratio_rate1m{training_job="harness"}')
        exporter_mfu = exporter.jobs()["harness"]["mfu"]
    finally:
        stop.set()
        feeder.join(5)
        reporter.close()

    assert exporter_mfu == pytest.approx(EXPECTED_MFU, abs=0.01)
    (series,) = recorded
    assert series["value"] == pytest.approx(exporter_mfu, abs=0.02)
    # The hour-long windows' groups run once a minute: they may not have run yet ("unknown"), but none fails.
    assert all(health != "err" for _, health, _ in prometheus.rule_health()), prometheus.rule_health()
    for process in (exporter.process, prometheus.process):
        addresses = listening_addresses(process.pid)
        assert addresses and all(a.startswith("127.0.0.1:") for a in addresses), addresses
