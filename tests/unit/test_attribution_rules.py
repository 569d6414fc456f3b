"""The cluster's loss attribution rules (group mfu-exporter.attribution)
and the exporter's own (exporter/model/attribution.py)
blame the same cause for the same signals: same thresholds, same counters and throttle reasons, same precedence. Their
values are tested by promtool (alerts/tests/attribution.test.yaml); this ties them to the node side's constants."""

from __future__ import annotations

import re
from dataclasses import fields

import yaml

from exporter.model import attribution
from exporter.render import gpu
from exporter.sources import rdma
from tests.support.prom_harness import RULE_FILES

RULES_FILE = RULE_FILES[0]
THRESHOLD_RULES = {  # recorded constant -> the attribution.Thresholds field it repeats
    "mfu:threshold_bottleneck_tolerance:ratio": "tolerance",
    "mfu:threshold_pause:ratio": "pause_ratio",
    "mfu:threshold_cnp:rate": "cnp_per_second",
    "mfu:threshold_idle_gpu_utilization:ratio": "idle_utilization",
}


def recorded() -> dict[str, str]:
    document = yaml.safe_load(RULES_FILE.read_text())
    return {rule["record"]: rule["expr"] for group in document["groups"] for rule in group["rules"] if "record" in rule}


def regex_alternatives(expr: str, label: str) -> set[str]:
    (alternatives,) = re.findall(rf'{label}=~"([^"]+)"', expr)
    return set(alternatives.split("|"))


def test_thresholds_are_the_exporters_defaults():
    defaults = {f.name: f.default for f in fields(attribution.Thresholds)}
    rules = recorded()
    for name, field in THRESHOLD_RULES.items():
        (value,) = re.fullmatch(r"vector\(([0-9.]+)\)", rules[name].strip()).groups()
        assert float(value) == defaults[field], f"{name} is {value}, the exporter's {field} is {defaults[field]}"


def test_counters_and_throttle_reasons_are_the_exporters():
    rules = recorded()
    assert (
        regex_alternatives(rules["instance:mfu_rdma_retransmits:rate5m"], "counter") == attribution.RETRANSMIT_COUNTERS
    )
    # The node sums the counters the rule selects: every retransmit counter is among them.
    assert attribution.RETRANSMIT_COUNTERS <= set(rdma.NODE_ERROR_COUNTERS)
    # The throttle causes are counted by the exporter (mfu_node_gpus_throttled) with the attribution's reasons.
    assert dict(gpu.THROTTLE_CAUSES) == {"thermal": attribution.THERMAL_REASONS, "power": attribution.POWER_REASONS}
    assert 'cause="thermal"' in rules["instance:mfu_gpus_thermal_throttled:count"]
    assert 'cause="power"' in rules["instance:mfu_gpus_power_throttled:count"]


def test_causes_and_their_precedence_are_the_exporters():
    """The classification tries the candidates in the exporter's order, then unknown, and falls back to none."""
    rules = recorded()
    order = re.findall(
        r'(?:candidates|seen)\{cause="([a-z_]+)"\}|"cause", "([a-z_]+)"', rules["training_job:mfu_bottleneck:cause"]
    )
    causes = [a or b for a, b in order]
    assert causes == [*attribution.CAUSES[1:], "none"]
    candidates = {b for _, b in re.findall(r'()"cause", "([a-z_]+)"', rules["training_job:mfu_bottleneck:candidates"])}
    assert candidates == set(attribution.CAUSES) - {"none", "unknown"}
    # The causes with a signal of their own hold while the job recovers, on both sides; the rest are read now only.
    held = {
        cause
        for found in re.findall(r'cause=~"([^"]+)"', rules["training_job:mfu_bottleneck:seen"])
        for cause in found.split("|")
    }
    assert held == attribution.SIGNAL_CAUSES
    for cause in attribution.CAUSES[1:-1]:
        kind = "seen" if cause in held else "candidates"
        assert f'{kind}{{cause="{cause}"}}' in rules["training_job:mfu_bottleneck:cause"], cause
