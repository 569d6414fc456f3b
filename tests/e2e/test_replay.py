"""End to end: a real node replayed by the target server (``mfu_exporter.sim.targets --exposition``, what ``make
bench-fleet-replay`` measures) through both distributed paths, with the rules of alerts/ unchanged.

The node replayed is the incident node of a simulated pfc-storm (two captures 60 s apart, rendered by the real
collector): it blames the network and loses GPU-seconds to it. Served on 8 nodes, each with its own ``instance``, every
node of the fleet is that node, so the shard's attribution, which reads only each node's blamed cause and its loss
rates, must sum the network's loss over the 8 nodes, name a node of them, and the job's cause must be the network; the
job's cluster MFU must be the node's own, as its served counters make it."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from mfu_exporter.sim.targets import INCIDENT, _capture_fleet
from tests.support.fleet_harness import FleetStack, recent, wait

pytestmark = pytest.mark.slow

NODES = 8
PATHS = ("victoria-metrics", "prometheus")


@pytest.fixture(scope="module")
def capture(tmp_path_factory):
    """The node's two expositions as files, the second's modification time its capture time; its job's name."""
    root = tmp_path_factory.mktemp("replayed")
    rendering = asyncio.run(_capture_fleet(root / "fleet", "pfc-storm", {INCIDENT: 16}, 60.0))[INCIDENT]
    first, second = root / "first.txt", root / "second.txt"
    first.write_text(rendering.first)
    second.write_text(rendering.second)
    os.utime(second, (rendering.at, rendering.at))
    values = {}
    for line in rendering.second.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            values[key] = float(value)
    return first, second, rendering.job, values


@pytest.fixture(scope="module")
def stack(tmp_path_factory, capture):
    first, second, _, _ = capture
    stack = FleetStack(
        tmp_path_factory.mktemp("replay"),
        nodes=NODES,
        incident=None,
        source="targets",
        prometheus_mode="scrape",
        fleet_args=("--exposition", str(first), "--exposition", str(second), "--exposition-apart", "60s"),
    ).start()
    yield stack
    stack.stop()


@pytest.mark.parametrize("path", PATHS)
def test_the_replayed_nodes_job_has_the_nodes_mfu(stack, capture, path):
    _, _, job, _ = capture
    store = stack.stores[path]
    (truth,) = stack.fleet_json()["jobs"]
    assert truth["name"] == job and truth["nodes"] == list(range(NODES)) and truth["mfu_1m"] > 0

    def recorded():
        # Once the 1-minute rate's window holds no start-up (a window the counters did not cover reads low).
        if time.time() < stack.started + 62.0:
            return None
        found = recent(store, f'training_job:mfu_model_flops_utilization:ratio_rate1m{{training_job="{job}"}}')
        return found[0]["value"] if found else None

    mfu = wait(stack, recorded, f"{path}: the job's cluster MFU recorded")
    assert abs(mfu - truth["mfu_1m"]) <= 0.02, (mfu, truth["mfu_1m"])


@pytest.mark.parametrize("path", PATHS)
def test_the_shard_sums_and_names_the_nodes_blamed_loss_and_the_job_is_the_networks(stack, capture, path):
    _, _, job, values = capture
    store = stack.stores[path]
    rate = values[f'mfu_job_lost_gpu_seconds_per_second{{cause="network",training_job="{job}"}}']
    blamed = values[f'mfu_job_blamed_lost_gpu_seconds_per_second{{cause="network",training_job="{job}"}}']
    assert rate > 0 and blamed == rate, "the captured node blames the network and loses to it"
    instances = set(stack.targets)

    def answers():
        summed = recent(store, 'training_job_cause_shard:mfu_job_lost_gpu_seconds:sum_rate5m{cause="network"}')
        named = recent(store, 'training_job_cause_shard:mfu_job_lost_gpu_seconds:max_rate5m{cause="network"}')
        cause = recent(store, f'training_job:mfu_bottleneck:cause{{training_job="{job}"}}')
        if summed and named and cause and cause[0]["metric"].get("cause") == "network":
            return summed, named, cause
        return None

    summed, named, cause = wait(stack, answers, f"{path}: the network's loss summed, its node named, the job's cause")
    assert [s["value"] for s in summed] == pytest.approx([NODES * rate])
    # Every node loses alike, so the evaluations may name different ones (ties): each a node of the fleet, with its
    # blamed rate.
    assert all(s["metric"]["instance"] in instances and s["value"] == pytest.approx(blamed) for s in named), named
    assert cause[0]["metric"]["instance"] in instances
