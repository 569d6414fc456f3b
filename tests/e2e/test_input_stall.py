"""The demo's ``input-stall`` incident end to end: the job's loader waits on a slowed dataset mount. Its
client times the wait (data wait up), the mount's counters flatten (the storage source reads them), the GPUs stay
busy between waits; the node attributes the gap to ``input`` with the wait and the mount's reads as evidence, and
Debian's Prometheus, scraping the demo each second with the real rules of every tier (``demo_under_rules``), does too
and fires MfuInputBound. The incident starts at 10 s; the demo's first checkpoint (a cause of higher precedence, 40 s
from 20 s) comes and goes meanwhile."""

from __future__ import annotations

import pytest

from mfu_exporter.sim import node as demo
from mfu_exporter.sim.storage import DATASET_MOUNT
from tests.support.demo_harness import get_json, metric_samples
from tests.support.prom_harness import demo_under_rules
from tests.support.wait import wait_until

pytestmark = pytest.mark.slow

WINDOWS = {"1m": "30s", "5m": "10s"}
FOR = "3s"
DEADLINE = 120.0


def job_state(base: str) -> dict:
    (job,) = [j for j in get_json(base + "api/v1/jobs")["jobs"] if j["job"] == demo.JOB]
    return job


def test_input_stall_is_attributed_input_with_the_wait_and_the_mount_on_the_node_and_by_the_rules(tmp_path):
    with demo_under_rules(tmp_path, "input-stall", WINDOWS, FOR) as run:
        base, node = run.base, run.node
        # The node: input, from the client's data wait, naming the wait and the dataset mount's reads.
        verdict = wait_until(
            lambda: (b := job_state(base)["bottleneck"]) and b["cause"] == "input" and b, DEADLINE, "input on the node"
        )
        assert verdict["evidence"].startswith("waiting for its next batch ")
        assert "its client's data_wait_seconds" in verdict["evidence"]
        assert f"dataset mount {DATASET_MOUNT} (nfs4 " in verdict["evidence"] and " MB/s" in verdict["evidence"]
        # The share over the MFU window, once the window holds the stall alone.
        job = wait_until(
            lambda: (j := job_state(base))["data_wait"]["ratio"] > demo.INPUT_STALL_WAIT_SHARE - 0.05 and j,
            DEADLINE,
            "the window to hold the stall alone",
        )
        assert job["data_wait"]["source"] == "client" and job["bottleneck"]["cause"] == "input"
        assert job["data_wait"]["ratio"] == pytest.approx(demo.INPUT_STALL_WAIT_SHARE, abs=0.05)
        assert job["hardware"]["gpu_utilization"] > 0.5  # busy between waits: over the idle line
        key = (("training_job", demo.JOB),)

        def served_share() -> dict | None:
            # /metrics shows the job as of the demo's last tick, which may precede the read above.
            values = metric_samples(base)
            share = values.get(("mfu_job_data_wait_ratio", key))
            return values if share is not None and abs(share - demo.INPUT_STALL_WAIT_SHARE) <= 0.05 else None

        values = wait_until(served_share, DEADLINE, "the stall's share on /metrics")
        assert values[("mfu_job_data_wait_ratio", key)] == pytest.approx(demo.INPUT_STALL_WAIT_SHARE, abs=0.05)
        assert values[("mfu_job_bottleneck", (("cause", "input"), *key))] == 1
        # Data wait up, mount reads flat: the mount reads at half the loader's healthy pace x the job's pace.
        # Waits on the rate itself: a 10 s window that still holds a healthy step (the simulated counters advance in
        # steps, and a loaded machine scrapes late) reads high until the window holds the stall alone.
        slowed = demo.DATASET_READ_RATE * demo.SLOW_MOUNT_READ_FACTOR * 1.2

        def reads_slowed() -> bool:
            reads = run.ever(f'rate(mfu_storage_read_bytes_total{{mountpoint="{DATASET_MOUNT}"}}[10s])')
            return bool(reads) and 0 < float(reads[0]["values"][-1][1]) < slowed

        wait_until(reads_slowed, DEADLINE, "the dataset mount's reads to flatten to the slowed rate")
        # The rules: the job's cause is input, on this node; the wait's share and MfuInputBound, both tiers.
        recorded = wait_until(
            lambda: run.ever(f'training_job:mfu_bottleneck:cause{{training_job="{demo.JOB}", cause="input"}}'),
            DEADLINE,
            "the rules to attribute the stall to input",
        )
        assert {series["metric"].get("instance") for series in recorded} == {node}
        assert wait_until(
            lambda: run.ever(f'training_job:mfu_job_data_wait:ratio_rate5m{{training_job="{demo.JOB}"}} > 0.3'),
            DEADLINE,
            "the job's data-wait share over the rules",
        )
        firing = wait_until(lambda: run.firing("MfuInputBound"), DEADLINE, "MfuInputBound to fire")
        assert {a["labels"]["training_job"] for a in firing} == {demo.JOB}
        assert any(node in a["annotations"]["description"] for a in firing)
