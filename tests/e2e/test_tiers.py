"""End to end: the rules in three tiers (docs/scaling.md "Rules in three tiers") on both real distributed paths at once, the
same simulated fleet as tests/e2e/test_fleet.py (32 nodes, jobs of 16, 8 and 8 nodes, a pfc-storm on node 17 from
10 s), split over two shards:

- VictoriaMetrics: per shard a VictoriaMetrics, a vmagent scraping its half (cluster membership) and a vmalert
  evaluating the node and shard tiers, writing through that vmagent, which forwards only the partial aggregates to
  the global VictoriaMetrics; a global vmalert evaluates the global tier there (deploy/fleet/vmalert-shard.flags,
  vmalert-global.flags, vmagent-shard-partials.yaml);
- Prometheus: per shard a Prometheus scraping its half (hashmod) and evaluating the node and shard tiers,
  remote-writing only the partials to a global Prometheus that evaluates the global tier
  (deploy/fleet/prometheus-shard.yaml, prometheus-global.yaml).

The files of alerts/ are the ones test_fleet.py runs in one evaluator, unchanged; both layouts are checked against
the same truth (the simulator's MFU, the incident's cause and node), so they give the same answers. Here also: the
global stores hold nothing per node (no node series, only the shards' partials, with each shard's label, and the
global records), the job's cause names node 17 through all three tiers, and the alerts about node 17 fire in its
shard only.
"""

from __future__ import annotations

import re
import time

import pytest
import requests

from tests.support.fleet_harness import (
    COMPARE_SECONDS,
    FleetStack,
    Store,
    recent,
    true_mfu,
    wait,
    wait_for_network_on_the_incident_node,
)

pytestmark = pytest.mark.slow

NODES = 32
SHARDS = 2
INCIDENT_NODE = 17
PATHS = ("victoria-metrics", "prometheus")
TIER_LAG = 10.0  # seconds
# What the global stores may hold: the shards' partial aggregates, the global tier's records, alert state.
GLOBAL_NAMES = re.compile(r"training_job[a-z_]*_shard:.+|training_job[a-z_]*:.+|mfu:.+|ALERTS|ALERTS_FOR_STATE")


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    stack = FleetStack(
        tmp_path_factory.mktemp("tiers"), nodes=NODES, incident_node=INCIDENT_NODE, shards=SHARDS
    ).start()
    yield stack
    stack.stop()


@pytest.mark.parametrize("path", PATHS)
def test_cluster_mfu_of_every_job_through_the_tiers_matches_the_simulators_within_2_points(stack, path):
    """The global tier's ``training_job:mfu_model_flops_utilization:ratio_rate1m`` of each job, from both shards'
    partial sums, against the simulator's MFU over the same minute (as test_fleet.py checks one evaluator)."""
    store = stack.stores[path]
    # Two evaluations and a remote write between a scrape and the global record (a few seconds, more on a loaded
    # machine): the minute compared starts TIER_LAG later than test_fleet.py's, clear of the start-up's checkpoint.
    past_startup = 62 + TIER_LAG + COMPARE_SECONDS
    wait(stack, lambda: time.time() > stack.started + past_startup, "a minute of data past the start-up")
    end = time.time() - 3.0
    series = store.query_range(
        "training_job:mfu_model_flops_utilization:ratio_rate1m", end - COMPARE_SECONDS, end, step=2.0
    )
    truth = {job["name"]: job for job in stack.fleet_json()["jobs"]}
    recorded = {s["metric"]["training_job"]: [(float(t), float(v)) for t, v in s["values"]] for s in series}
    assert set(recorded) == set(truth), f"{path}: jobs recorded {sorted(recorded)}, simulated {sorted(truth)}"
    for name, points in recorded.items():
        evaluated = sum(v for _, v in points) / len(points)
        expected = sum(true_mfu(truth[name], t - 60.0, t) for t, _ in points) / len(points)
        assert abs(evaluated - expected) <= 0.02, f"{path}: {name} {evaluated:.3f}, simulator {expected:.3f}"


@pytest.mark.parametrize("path", PATHS)
def test_the_incident_is_attributed_to_the_network_on_its_node_through_three_tiers(stack, path):
    """Node 17 blames the network (node tier), its shard carries it as the job's worst node for the network
    (shard tier), and the global tier names network and node 17 as the job's cause, and MfuLow (pending) says so."""
    wait_for_network_on_the_incident_node(stack, stack.stores[path], path, INCIDENT_NODE)


@pytest.mark.parametrize("path", PATHS)
def test_the_global_store_holds_no_series_of_a_node(stack, path):
    """Only partial aggregates cross: every name in the global store is a partial, a global record or alert
    state, and each partial carries the shard it came from, both shards present."""
    store = stack.stores[path]
    wait(stack, lambda: recent(store, "training_job:mfu_bottleneck:cause"), f"{path}: the global records")
    names = set(store.api("label/__name__/values"))
    assert names and all(GLOBAL_NAMES.fullmatch(name) for name in names), sorted(
        name for name in names if not GLOBAL_NAMES.fullmatch(name)
    )
    shards = {f"shard-{i}" for i in range(SHARDS)}

    def from_every_shard() -> list[dict] | None:
        # Over the last minute: on a loaded machine one shard's evaluator may be a few evaluations behind.
        found = store.query('last_over_time({__name__="training_job_shard:mfu_job_gpus:sum"}[1m])')
        return found if {s["metric"].get("shard") for s in found} == shards else None

    wait(stack, from_every_shard, f"{path}: partials from both shards")
    # The sums of the shards' partial sums are the jobs' GPUs: 8 per node. A scrape that fails on a loaded machine
    # marks its node's series stale until the next one, so an evaluation may lack a node: the highest sum of the
    # last minute is compared, and more than 8 per node would still be caught.
    seen: dict = {}

    def every_gpu() -> bool:
        found = store.query("max_over_time(training_job:mfu_gpus:sum[1m])")
        seen.clear()
        seen.update({s["metric"]["training_job"]: s["value"] for s in found})
        return sum(seen.values()) == 8 * NODES

    try:
        wait(stack, every_gpu, f"{path}: 8 GPUs per node", deadline=time.time() - stack.started + 60)
    except AssertionError:
        pass  # what was last seen is compared below, and named
    assert sum(seen.values()) == 8 * NODES, seen


@pytest.mark.parametrize("path", PATHS)
def test_the_alerts_about_the_incident_node_fire_in_its_shard_only(stack, path):
    node = stack.instance(INCIDENT_NODE)

    def firing(store: Store) -> set[str]:
        found = recent(store, 'ALERTS{alertname=~"MfuPfcPauseStorm|MfuRoceCongestion"}')
        return {s["metric"]["instance"] for s in found}

    def pausing() -> list[set[str]] | None:
        seen = [firing(store) for store in stack.shard_stores[path]]
        return seen if set().union(*seen) else None

    seen = wait(stack, pausing, f"{path}: pause and congestion alerts in a shard")
    assert sorted(map(sorted, seen)) == [[], [node]], seen
    assert not recent(stack.stores[path], 'ALERTS{alertname=~"MfuPfcPauseStorm|MfuRoceCongestion"}')


@pytest.mark.parametrize("path", PATHS)
def test_every_rule_of_every_tier_evaluates_without_error(stack, path):
    def groups(url: str) -> list[dict]:
        return requests.get(f"{url}/api/v1/rules", timeout=10).json()["data"]["groups"]

    wait(stack, lambda: time.time() > stack.started + 20, "a few evaluations")
    evaluators = [stack.stores[path].alerts_url, *(store.alerts_url for store in stack.shard_stores[path])]
    failing = [
        (url, group["name"], rule["name"], rule.get("lastError"))
        for url in evaluators
        for group in groups(url)
        for rule in group["rules"]
        if rule.get("lastError") or rule.get("health") == "err"
    ]
    assert not failing
    assert {g["name"] for g in groups(evaluators[0])} >= {"mfu-exporter.attribution", "mfu-exporter.training"}
    assert {g["name"] for g in groups(evaluators[1])} >= {"mfu-exporter.shard", "mfu-exporter.node-tier.fabric"}
