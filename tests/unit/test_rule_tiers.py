"""The rules in three tiers (docs/scaling.md "Rules in three tiers"), each reading only the tier below:

- node (alerts/mfu-exporter.node.yaml): a port's, interface's or GPU's own series, evaluated in the shard;
- shard (alerts/mfu-exporter.shard.yaml): the nodes' summaries and job series, never a device's own series; it
  reduces them to per-job partial aggregates (and fires the alerts about one node);
- global (mfu-exporter.rules.yaml, mfu-exporter.alerts.yaml): only the shard's partial aggregates and its own
  records, never a per-node series, so its cost is O(jobs × shards) whatever the number of nodes.

Every expression is parsed with promql-parser; a selector of the wrong tier fails with the rule's name."""

from __future__ import annotations

import promql_parser
import pytest
import yaml

from tests.support.prom_harness import (
    GLOBAL_RULE_FILES,
    NODE_RULE_FILE,
    SHARD_RULE_FILE,
    documented_metrics,
    promql_nodes,
)

# A family carrying one of these labels has a series per GPU, RDMA port or network interface.
PER_DEVICE_LABELS = {"gpu", "device", "port", "interface"}
# What a partial aggregate keeps: per job (and a label of the job's), one series per shard. `job` and `instance`
# only on the worst-node records, whose `instance` names the node (one series per job and cause).
PARTIAL_PREFIXES = ("training_job_shard:", "training_job_cause_shard:", "training_job_le_shard:")
PARTIAL_PREFIXES += ("training_job_kind_shard:", "training_job_found_by_shard:")


def rules(path) -> list[dict]:
    return [rule for group in yaml.safe_load(path.read_text())["groups"] for rule in group["rules"]]


def name(rule: dict) -> str:
    return rule.get("alert") or rule["record"]


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


def records(*paths) -> set[str]:
    return {rule["record"] for path in paths for rule in rules(path) if "record" in rule}


def test_the_raw_families_are_known():
    """The checks below have something to catch: the per-device families of every plane are documented as such."""
    raw = per_device_families()
    for family in ("mfu_gpu_up", "mfu_rdma_hw_counters_total", "mfu_nic_pfc_pause_duration_seconds_total"):
        assert family in raw, family
    assert not {family for family in raw if family.startswith("mfu_node_")}, "a node summary with a per-device label"


def test_the_shard_reads_no_per_device_series():
    raw = per_device_families() | records(NODE_RULE_FILE)
    offending = {name(rule): sorted(selected(rule["expr"]) & raw) for rule in rules(SHARD_RULE_FILE)}
    offending = {rule: names for rule, names in offending.items() if names}
    assert not offending, f"{SHARD_RULE_FILE.name} reads per-GPU/port/interface series (node tier): {offending}"


@pytest.mark.parametrize("path", GLOBAL_RULE_FILES, ids=lambda p: p.name)
def test_the_global_tier_reads_only_the_shards_partials(path):
    """No raw series at all (every node's series stays in its shard), no node-tier record: the shard's partial
    aggregates, the global tier's own records, and constants."""
    allowed = records(SHARD_RULE_FILE) | records(*GLOBAL_RULE_FILES)
    offending = {name(rule): sorted(selected(rule["expr"]) - allowed) for rule in rules(path)}
    offending = {rule: names for rule, names in offending.items() if names}
    assert not offending, f"{path.name} reads series that are not the shard's partial aggregates: {offending}"


def test_what_the_global_tier_reads_of_the_shard_is_partial_aggregates():
    """The shard records the global tier reads are named as partials (one series per job and shard), and each is
    an aggregation by training_job: nothing per node crosses, except the worst node's name as a label."""
    global_reads = {n for path in GLOBAL_RULE_FILES for rule in rules(path) for n in selected(rule["expr"])}
    crossing = global_reads & records(SHARD_RULE_FILE)
    assert crossing, "the global tier reads nothing of the shard"
    for record in crossing:
        assert record.startswith(PARTIAL_PREFIXES), record
    for rule in rules(SHARD_RULE_FILE):
        if rule.get("record") in crossing:
            tree = promql_parser.parse(rule["expr"])
            aggregations = [node for node, _ in promql_nodes(tree) if isinstance(node, promql_parser.AggregateExpr)]
            assert aggregations, f"{rule['record']}: not an aggregation"
            assert "training_job" in (aggregations[0].modifier.labels if aggregations[0].modifier else []), rule


def test_the_shard_records_partials_and_per_node_steps_that_stay_there():
    """Every record of the shard's file is a partial, or a per-node step of one (``training_job_instance:``, the
    straggler comparison) that no global rule reads and a shard's remote write filters out."""
    global_reads = {n for path in GLOBAL_RULE_FILES for rule in rules(path) for n in selected(rule["expr"])}
    for record in records(SHARD_RULE_FILE):
        assert record.startswith((*PARTIAL_PREFIXES, "training_job_instance:")), record
        if record.startswith("training_job_instance:"):
            assert record not in global_reads, record


def test_job_alerts_fire_in_the_global_tier_and_node_alerts_in_the_shard():
    """An alert by training_job (about a job, whose nodes span shards) is global; an alert on a node is not."""
    for rule in rules(SHARD_RULE_FILE):
        if "alert" in rule:
            assert "training_job" not in rule["expr"], f"{rule['alert']}: a job's alert fires once, globally"
    for path in GLOBAL_RULE_FILES:
        for rule in rules(path):
            if "alert" in rule:
                assert "training_job" in rule["expr"], f"{rule['alert']}: a node's alert fires in its shard"


def test_the_checks_catch_a_wrong_tier():
    """A shard rule reading a raw counter, and a global rule reading a node's series, are caught."""
    raw = per_device_families()
    assert selected('rate(mfu_rdma_hw_counters_total{counter="np_cnp_sent"}[5m]) > 0') & raw
    assert not selected("max by (job, instance) (mfu_node_gpus_lost)") & raw
    allowed = records(SHARD_RULE_FILE) | records(*GLOBAL_RULE_FILES)
    assert selected("sum by (training_job) (rate(mfu_job_model_flops_total[5m]))") - allowed
    assert not selected("sum by (training_job) (training_job_shard:mfu_job_gpus:sum)") - allowed


def test_the_node_tier_is_what_needs_raw_series():
    """Every rule of the node tier reads a per-device series (or a node-tier record of one): nothing there that the
    shard could evaluate as cheaply."""
    raw = per_device_families() | records(NODE_RULE_FILE)
    for rule in rules(NODE_RULE_FILE):
        assert selected(rule["expr"]) & raw, name(rule)


# Families with a series per job and cause on every node (eleven and ten per job): read by the shard, they make its
# cost nodes × jobs × causes. The node's own rates of them (one series per job) are what the shard reads instead.
PER_CAUSE_FAMILIES = {"mfu_job_bottleneck", "mfu_job_lost_gpu_seconds_total"}


def test_the_shard_reads_no_series_per_cause():
    """The shard's attribution reads one series per node and job: no rule of the shard's file selects a family with
    a series per cause (the node tier's file, evaluated there too, selects one cause of it by its label)."""
    offending = {name(rule): sorted(selected(rule["expr"]) & PER_CAUSE_FAMILIES) for rule in rules(SHARD_RULE_FILE)}
    offending = {rule: names for rule, names in offending.items() if names}
    assert not offending, f"{SHARD_RULE_FILE.name} reads a series per cause: {offending}"
    for rule in rules(NODE_RULE_FILE):
        for node, _ in promql_nodes(promql_parser.parse(rule["expr"])):
            if isinstance(node, promql_parser.VectorSelector) and node.name in PER_CAUSE_FAMILIES:
                assert 'cause="' in str(node), f"{name(rule)}: {node}"
