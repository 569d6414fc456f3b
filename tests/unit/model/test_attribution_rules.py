"""The cluster's loss attribution (group mfu-exporter.attribution) and the exporter's own
(mfu_exporter/model/attribution.py) agree: each node attributes its own jobs' gap (mfu_job_bottleneck), and the global
rules pick, of the causes a job's nodes blame, the first in the exporter's precedence, with the exporter's
tolerance. Their values are tested by promtool (alerts/tests/attribution.test.yaml); this ties them to the node
side's constants."""

from __future__ import annotations

import re
from dataclasses import fields

import yaml

from mfu_exporter.model import attribution
from tests.support.prom_harness import GLOBAL_RULE_FILES

RULES_FILE = GLOBAL_RULE_FILES[0]
THRESHOLD_RULES = {  # recorded constant -> the attribution.Thresholds field it repeats
    "mfu:threshold_bottleneck_tolerance:ratio": "tolerance",
    "mfu:threshold_pause:ratio": "pause_ratio",
    "mfu:threshold_cnp:rate": "cnp_per_second",
    "mfu:threshold_idle_gpu_utilization:ratio": "idle_utilization",
    "mfu:threshold_input_wait:ratio": "input_wait_ratio",
}


def recorded() -> dict[str, str]:
    document = yaml.safe_load(RULES_FILE.read_text())
    return {rule["record"]: rule["expr"] for group in document["groups"] for rule in group["rules"] if "record" in rule}


def test_thresholds_are_the_exporters_defaults():
    defaults = {f.name: f.default for f in fields(attribution.Thresholds)}
    rules = recorded()
    for name, field in THRESHOLD_RULES.items():
        (value,) = re.fullmatch(r"vector\(([0-9.]+)\)", rules[name].strip()).groups()
        assert float(value) == defaults[field], f"{name} is {value}, the exporter's {field} is {defaults[field]}"


def test_causes_and_their_precedence_are_the_exporters():
    """The ranks are the exporter's order of causes, none and unknown apart (no candidates: a node with no gap, or
    a gap and no signal, explains nothing), and the classification falls back to unknown, then none."""
    ranked = re.findall(
        r'label_replace\(vector\((\d+)\), "cause", "([a-z_]+)"', recorded()["mfu:bottleneck_precedence:rank"]
    )
    ranks = [int(rank) for rank, _ in ranked]
    assert ranks == sorted(ranks) and len(set(ranks)) == len(ranks), ranked
    causes = [cause for _, cause in ranked]
    assert [c for c in causes if c in attribution.CAUSES] == [
        c for c in attribution.CAUSES if c not in ("none", "unknown")
    ]
    assert set(causes) == set(attribution.CAUSES) - {"none", "unknown"}
    fallbacks = re.findall(r'"cause", "([a-z_]+)"', recorded()["training_job:mfu_bottleneck:cause"])
    assert fallbacks == ["unknown", "none"]
