"""The rules in two tiers (README "Rules in two tiers"): the central files read only job-level and per-node summary
series, never a port's, an interface's or a GPU's own series, so their cost grows with nodes and jobs, not with
ports and GPUs; whatever must read those is in the node tier's file, evaluated next to the raw data."""

from __future__ import annotations

import promql_parser
import pytest
import yaml

from tests.support.prom_harness import CENTRAL_RULE_FILES, NODE_RULE_FILE, documented_metrics, promql_nodes

# A family carrying one of these labels has a series per GPU, RDMA port or network interface.
PER_DEVICE_LABELS = {"gpu", "device", "port", "interface"}


def rules(path) -> list[dict]:
    return [rule for group in yaml.safe_load(path.read_text())["groups"] for rule in group["rules"]]


def selected(expr: str) -> set[str]:
    """Every series name a rule's expression selects (its vector and matrix selectors), parsed by promql-parser."""
    return {
        node.name
        for node, _ in promql_nodes(promql_parser.parse(expr))
        if isinstance(node, promql_parser.VectorSelector) and node.name
    }


def per_device_families() -> set[str]:
    """The families docs/metrics.md documents with a per-GPU, per-port or per-interface label."""
    return {name for name, labels in documented_metrics().items() if labels & PER_DEVICE_LABELS}


def node_tier_records() -> set[str]:
    return {rule["record"] for rule in rules(NODE_RULE_FILE) if "record" in rule}


def test_the_raw_families_are_known():
    """The check below has something to catch: the per-device families of every plane are documented as such."""
    raw = per_device_families()
    for name in ("mfu_gpu_up", "mfu_rdma_hw_counters_total", "mfu_nic_pfc_pause_duration_seconds_total"):
        assert name in raw, name
    assert not {name for name in raw if name.startswith("mfu_node_")}, "a node summary with a per-device label"


@pytest.mark.parametrize("path", CENTRAL_RULE_FILES, ids=lambda p: p.name)
def test_central_rules_read_no_per_device_series(path):
    raw = per_device_families() | node_tier_records()
    offending = {}
    for rule in rules(path):
        names = selected(rule["expr"]) & raw
        if names:
            offending[rule.get("alert") or rule["record"]] = sorted(names)
    assert not offending, (
        f"{path.name} reads per-GPU/port/interface series (move to {NODE_RULE_FILE.name}): {offending}"
    )


def test_the_check_catches_a_raw_selector():
    """A central rule that reads a raw counter again is caught: the same check on such an expression."""
    raw = per_device_families()
    assert selected('rate(mfu_rdma_hw_counters_total{counter="np_cnp_sent"}[5m]) > 0') & raw
    assert not selected("max by (job, instance) (mfu_node_gpus_lost)") & raw


def test_the_node_tier_is_what_needs_raw_series():
    """Every rule of the node tier reads a per-device series (or a node-tier record of one): nothing there that the
    central tier could evaluate as cheaply."""
    raw = per_device_families() | node_tier_records()
    for rule in rules(NODE_RULE_FILE):
        assert selected(rule["expr"]) & raw, rule.get("alert") or rule["record"]
