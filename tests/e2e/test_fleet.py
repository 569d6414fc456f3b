"""End to end: a fleet of 32 simulated nodes (``mfu-exporter demo --nodes 32``, jobs of 16, 8 and 8 nodes) on two
real distributed paths at once, with the rules of alerts/ unchanged (tests/support/fleet_harness.py):

- two vmagent shards → VictoriaMetrics, vmalert evaluating the rules and writing back;
- Prometheus in agent mode → a Prometheus remote-write receiver evaluating the rules.

Node 17 (in the 8-node job llama3-70b-01) carries a pfc-storm from 10 s; its whole job slows (synchronous training),
only node 17 shows the pause and CNP signals. Checked on both paths: the recorded cluster MFU of every job matches
the simulator's own over the same minute within 2 points; the attribution names the network and node 17 (the
recorded cause, and MfuLow's description once MfuLow is pending: its ``for:`` is 15 minutes, unchanged); the pause
alert names node 17 and no other; each vmagent shard scraped half of the nodes; every rule evaluates; and every
dashboard query returns data.

The rules are unchanged, so their windows are too: MFU over 1m, attribution over 5m. The startup counts in those
windows (the first scrapes, the first checkpoint from 1 s to 7 s), so the checks poll until what they want shows,
up to ``DEADLINE`` after the fleet is up. The stores answer instant queries differently for series that stop (a
recorded series that vanishes stays visible in VictoriaMetrics for a while, vmalert writes no staleness marker), so
recorded series are read as ``last_over_time(...[5s])`` on both paths: the last few evaluations only.
"""

from __future__ import annotations

import time

import pytest
import requests

from tests.support.dashboards import queries
from tests.support.fleet_harness import (
    COMPARE_SECONDS,
    SCRAPE_JOB,
    FleetStack,
    incident_job,
    recent,
    true_mfu,
    wait,
    wait_for_network_on_the_incident_node,
)

pytestmark = pytest.mark.slow

NODES = 32
INCIDENT_NODE = 17
GRAFANA = {"$__rate_interval": "30s", "$__interval": "2s"}  # what Grafana would put there for 2 s scrapes
PATHS = ("victoria-metrics", "prometheus")
WINDOWS_DEADLINE = 200.0  # seconds after the fleet is up: the 1-minute groups' first results (two runs at most)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    stack = FleetStack(tmp_path_factory.mktemp("fleet"), nodes=NODES, incident_node=INCIDENT_NODE).start()
    yield stack
    stack.stop()


@pytest.mark.parametrize("path", PATHS)
def test_cluster_mfu_of_every_job_matches_the_simulators_within_2_points(stack, path):
    """The recorded ``training_job:mfu_model_flops_utilization:ratio_rate1m`` of each job against the simulator's
    MFU over the same minute, once the minute holds no start-up: the slowed job too, whose window may hold the drop.
    Both are averaged over the last ``COMPARE_SECONDS`` of evaluations: the fleet's reports come in bursts when the
    machine is busy (a late tick reports two seconds at once), which moves a single 1m rate by a point or more."""
    store = stack.stores[path]
    wait(stack, lambda: time.time() > stack.started + 62 + COMPARE_SECONDS, "a minute of data past the start-up")
    end = time.time() - 3.0  # evaluated, written back and readable
    series = store.query_range(
        "training_job:mfu_model_flops_utilization:ratio_rate1m", end - COMPARE_SECONDS, end, step=2.0
    )
    truth = {job["name"]: job for job in stack.fleet_json()["jobs"]}
    recorded = {s["metric"]["training_job"]: [(float(t), float(v)) for t, v in s["values"]] for s in series}
    assert set(recorded) == set(truth), f"{path}: jobs recorded {sorted(recorded)}, simulated {sorted(truth)}"
    means = {}
    for name, points in recorded.items():
        evaluated = sum(v for _, v in points) / len(points)
        expected = sum(true_mfu(truth[name], t - 60.0, t) for t, _ in points) / len(points)
        means[name] = evaluated
        assert abs(evaluated - expected) <= 0.02, (
            f"{path}: {name} recorded MFU {evaluated:.3f}, the simulator's {expected:.3f} (mean of {len(points)})"
        )
    slowed = incident_job(stack)
    assert means[slowed] < 0.35 < min(v for name, v in means.items() if name != slowed), means


@pytest.mark.parametrize("path", PATHS)
def test_pfc_storm_on_one_node_is_attributed_to_the_network_on_that_node(stack, path):
    """The recorded cause of the slowed job is network on node 17, and no other job's cause is network; MfuLow,
    pending for its 15 minutes, says so in its description. (The other jobs' first checkpoint, from 1 s to 7 s, may
    still show as their cause for a while on VictoriaMetrics: see the module's docstring.)"""
    store = stack.stores[path]
    job = incident_job(stack)
    wait_for_network_on_the_incident_node(stack, store, path, INCIDENT_NODE)
    others = recent(store, f'training_job:mfu_bottleneck:cause{{training_job!="{job}"}}')
    assert "network" not in {s["metric"]["cause"] for s in others}, others


@pytest.mark.parametrize("path", PATHS)
def test_the_pause_alerts_name_the_incident_node_and_no_other(stack, path):
    store = stack.stores[path]
    node = stack.instance(INCIDENT_NODE)

    def pausing() -> set[str] | None:
        found = recent(store, 'ALERTS{alertname=~"MfuPfcPauseStorm|MfuRoceCongestion"}')
        instances = {s["metric"]["instance"] for s in found}
        return (
            instances
            if {s["metric"]["alertname"] for s in found}
            == {
                "MfuPfcPauseStorm",
                "MfuRoceCongestion",
            }
            else None
        )

    assert wait(stack, pausing, f"{path}: pause and congestion alerts") == {node}


def test_each_vmagent_shard_scrapes_half_of_the_nodes(stack):
    seen = []
    for member in (0, 1):
        url = stack.servers[f"vmagent-{member}"].url
        targets = requests.get(f"{url}/api/v1/targets", timeout=10).json()["data"]["activeTargets"]
        seen.append({t["labels"]["instance"] for t in targets})
    assert not seen[0] & seen[1], "a node scraped by both shards"
    assert seen[0] | seen[1] == set(stack.targets)
    # vmagent splits by a hash of each target's labels, and the nodes' ports differ from run to run: a fair split of
    # 32 leaves a member under a quarter about once in 500 runs, under an eighth about once in 400,000.
    assert all(NODES / 8 <= len(s) <= 7 * NODES / 8 for s in seen), [len(s) for s in seen]


@pytest.mark.parametrize("path", PATHS)
def test_every_rule_evaluates_without_error(stack, path):
    def groups() -> list[dict]:
        if path == "prometheus":
            return requests.get(f"{stack.stores[path].url}/api/v1/rules", timeout=10).json()["data"]["groups"]
        return requests.get(f"{stack.servers['vmalert'].url}/api/v1/rules", timeout=10).json()["data"]["groups"]

    wait(stack, lambda: time.time() > stack.started + 20, "a few evaluations")
    failing = [
        (group["name"], rule["name"], rule.get("lastError"))
        for group in groups()
        for rule in group["rules"]
        if rule.get("lastError") or rule.get("health") == "err"
    ]
    assert not failing
    names = {group["name"] for group in groups()}
    assert {"mfu-exporter.rules", "mfu-exporter.attribution", "mfu-exporter.fleet"} <= names


@pytest.mark.parametrize("path", PATHS)
def test_every_dashboard_query_returns_data(stack, path):
    """Each panel and annotation query, variables as Grafana fills them for the incident's job over every node,
    returns series over the run (a range query, as the panels make)."""
    store = stack.stores[path]
    job = incident_job(stack)
    wait(
        stack,
        lambda: recent(store, f'training_job:mfu_bottleneck:cause{{training_job="{job}",cause="network"}}'),
        "the attribution",
    )

    def panel_queries() -> list[tuple[str, str]]:
        """Every panel query, variables filled as Grafana fills them for a range from the start to now."""
        range_seconds = int(time.time() - stack.started)
        variables = {
            **GRAFANA,
            "$__range_s": str(range_seconds),
            "$__range": f"{range_seconds}s",
            "$training_job": "llama3-70b-.*",  # All: the incident's job writes no checkpoint in the first 10 minutes
            "$job": SCRAPE_JOB,
            "$instance": "127\\\\.0\\\\.0\\\\.1:[0-9]+",
        }
        filled = []
        for where, expr in queries():
            for variable, value in variables.items():  # longest first: $__range_s before $__range
                expr = expr.replace(variable, value)
            assert "$" not in expr, f"{where}: a variable left in {expr}"
            filled.append((where, expr))
        return filled

    def in_range(expr: str) -> bool:
        return bool(store.query_range(expr, stack.started, time.time(), step=2.0))

    # The hour-long windows run once a minute over the shards' 5-minute rates sampled at whole minutes: the first
    # checkpoint quantile needs a minute boundary with a write in its rate and the group's next run after it. The
    # wait reads them as the panels do (a range query): an instant query sees a sample up to one step before the
    # range's last point does, and the CI run that read the instant answer found the range empty.
    wait(
        stack,
        lambda: all(in_range(expr) for _, expr in panel_queries() if "_1h" in expr),
        "the checkpoint quantiles in the panels' range",
        deadline=WINDOWS_DEADLINE,
    )
    empty = [where for where, expr in panel_queries() if not in_range(expr)]
    assert not empty, f"{path}: no series for {empty}"
