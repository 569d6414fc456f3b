"""The series budget (docs/scaling.md "Series budget"): a default 8-GPU, 8-NIC node running one job exports at most
500 series, counted from a real exposition of the fixture node; and whatever a rule, dashboard panel or runbook step
reads is among them, so the default level (``series: standard``) cuts nothing anyone looks at."""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from pathlib import Path

import pytest
import yaml

from mfu_exporter.render import gpu
from tests.support.dashboards import queries
from tests.support.expo import samples, snapshot_samples
from tests.support.golden import render_one_job_node
from tests.support.prom_harness import RULE_FILES

ROOT = Path(__file__).resolve().parents[2]
RUNBOOK = ROOT / "docs" / "runbook.md"
BUDGET = 500  # series per default 8-GPU, 8-NIC node with one job
# The node today (478 with goodput's 27 per job, the GPU plane's 40, the GPU health state set's 40: 5 states per
# GPU, and the blamed cause's loss rate: 1 per job) plus a margin: a change that adds more than this fails here
# first and says so, before the budget itself is at stake.
GROWTH_GUARD = 490
NAME = re.compile(r"(?<![A-Za-z0-9_:])mfu_[a-z0-9_]+(?![A-Za-z0-9_:])")
SELECTOR = re.compile(r"(mfu_[a-z0-9_]+)\{([^}]*)\}")
COUNTER_MATCHER = re.compile(r'counter=~?"([^"]+)"')
# Families a reader names that a healthy node's first minutes cannot show, each with the event that makes it and the
# level its source exports it at (the check that it is not cut at standard).
ON_AN_EVENT = {
    "mfu_gpu_xid_errors_total": "the GPU's first Xid",  # gpu.FAMILY_LEVELS: standard
    "mfu_exporter_source_errors_total": "a source's first error",
    "mfu_job_eta_seconds": "a job with target_tokens",
    "mfu_job_baseline_mfu_ratio": "a learnt baseline (30 samples 10 s apart)",
    # One series per cause that lost some in the last 5 minutes: none on a healthy node.
    "mfu_job_lost_gpu_seconds_per_second": "a job below its baseline within the last 5 minutes",
    "mfu_job_data_wait_seconds_total": "a job that gives its data wait (client data_wait_seconds or a log's timer)",
    # render/collectives.py, always on: a job's log with NCCL INFO lines, NCCL Inspector's dumps, a slow rank named.
    "mfu_job_nccl_transport_info": "a job's log showing NCCL's transport",
    "mfu_job_nccl_socket_fallback": "a job's log showing NCCL's transport",
    "mfu_job_straggler": "a slow rank named by the job or NCCL Inspector",
    "mfu_job_nccl_collective_duration_seconds": "NCCL Inspector's dumps of a job",
    "mfu_job_nccl_bus_bandwidth_bytes_per_second": "NCCL Inspector's dumps of a job",
    # storage.FAMILY_LEVELS (render/storage.py): minimal and standard; a default node names no data path or mount.
    "mfu_storage_read_bytes_total": "a job with jobs.<name>.data_paths, a checkpoint watch or sources.storage.mounts",
    "mfu_storage_reads_total": "the same",
    "mfu_storage_read_seconds_total": "the same",
    "mfu_storage_job_mount_info": "a job with jobs.<name>.data_paths or a checkpoint watch",
    "mfu_gds_io_stats_enabled": "the nvidia-fs module loaded (render/storage.py: standard)",
    "mfu_gds_read_bytes_total": "the nvidia-fs module loaded with rw_stats_enabled=1",
    "mfu_gds_read_errors_total": "the nvidia-fs module loaded",
    "mfu_checkpoint_last_load_duration_seconds": "a job's first checkpoint load (render/restore.py, always on)",
    "mfu_checkpoint_last_load_read_bandwidth_bytes_per_second": "a load of a job with a checkpoint watch",
    # nccl.FAMILY_LEVELS (render/nccl.py): minimal and standard; a default node has no sources.nccl.tests_paths file.
    "mfu_nccl_test_passed": "a verification file under sources.nccl.tests_paths",
    "mfu_nccl_test_busbw_bytes_per_second": "the same",
    "mfu_nccl_test_timestamp_seconds": "the same",
    "mfu_nccl_test_expected_busbw_bytes_per_second": "the same, and an ACTIVE RDMA port or expect_busbw",
    "mfu_nccl_test_wrong_values": "the same, from a test that checked its values",
}


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    text, service = asyncio.run(render_one_job_node(tmp_path_factory.mktemp("budget-node")))
    return samples(text), service


def read_texts() -> list[tuple[str, str]]:
    """(where, text) of every rule expression, dashboard query and the runbook."""
    texts = [
        (f"{path.name}: {rule.get('alert') or rule.get('record')}", rule["expr"])
        for path in RULE_FILES
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
    ]
    texts += queries()
    texts.append((RUNBOOK.name, RUNBOOK.read_text()))
    return texts


def test_series_per_node_are_within_the_budget(node):
    found, service = node
    by_family = Counter(name for name, _ in found)
    per_source = {}
    for name, state in service.scheduler.states.items():
        if state.snapshot is not None:
            per_source[name] = len(snapshot_samples(state.snapshot))
    per_source["jobs and the exporter's own"] = len(found) - sum(per_source.values())
    print(f"\nseries of a default 8-GPU, 8-NIC node with one job: {len(found)}")
    for source, count in sorted(per_source.items(), key=lambda kv: -kv[1]):
        print(f"  {source:28} {count}")
    assert by_family["mfu_job_gpus"] == 1 and by_family["mfu_gpu_up"] == 8 and by_family["mfu_rdma_port_up"] == 8
    # What the shard's attribution reads of a job: one series (its blamed cause), not one per cause.
    assert by_family["mfu_job_blamed_lost_gpu_seconds_per_second"] == 1
    assert len(found) <= BUDGET, per_source
    assert len(found) <= GROWTH_GUARD, f"{len(found)} series: more than the node grew by in review; recount the budget"


def test_everything_a_rule_dashboard_or_runbook_reads_is_exported_by_default(node):
    found, _ = node
    exported = {name for name, _ in found}
    counters: dict[str, set[str]] = {}
    for name, labels in found:
        for key, value in labels:
            if key == "counter":
                counters.setdefault(name, set()).add(value)
    assert gpu.FAMILY_LEVELS["mfu_gpu_xid_errors"] == "standard"
    missing, missing_counters = {}, {}
    for where, text in read_texts():
        for name in NAME.findall(text):
            if name not in exported and name not in ON_AN_EVENT:
                missing.setdefault(name, where)
        for name, matchers in SELECTOR.findall(text):
            for alternatives in COUNTER_MATCHER.findall(matchers):
                for counter in alternatives.split("|"):
                    if counter not in counters.get(name, set()):
                        missing_counters.setdefault(f"{name}{{counter={counter!r}}}", where)
    assert not missing, f"read but not exported at series: standard: {missing}"
    assert not missing_counters, f"counters read but not exported at series: standard: {missing_counters}"
