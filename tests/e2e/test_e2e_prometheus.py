"""End to end: demo nodes (`mfu-exporter demo`, one healthy, one per incident) scraped each second by Debian's
Prometheus running the real rules and alerts; the dashboards' queries, the recorded MFU, the alerts and the loss
attribution are checked against what the demos serve.

Why ``--speed 1``: Prometheus stamps every scrape with its own wall-clock time while a demo's counters advance at
``--speed`` × wall time, so at ``--speed N`` every ``rate()`` (FLOPs, tokens, pause seconds) reads N times the
simulated rate: the recorded MFU, a rate over a peak gauge, would be N × 45%, and the pause ratio N × its value. Only
the exporter's own figures, computed on the simulated clock, survive compression. So the demos run in real time and
the test shortens the rules instead: a copy made by ``derived_rules`` from the real files, with every ``for:`` at
3 s and the windows as short as 1 s scrapes allow: 1m → 30s for the MFU comparison (30 samples: one demo tick more or
less in the window moves a 45% MFU by under 1.5 points, and the healthy demo's own MFU window is 30 s too, so both
cover the same stretch) and 5m → 10s for alerts and attribution, which must react within seconds of an incident.

Each demo is its own training job to the rules: the scrape renames the incident demos' ``llama3-70b`` to
``llama3-70b-<incident>`` (metric relabelling), so the healthy job's MFU is not averaged with the broken ones.
Timeline, in demo seconds: incidents start at 10 s; every demo but gpu-lost writes its first checkpoint from 20 s to
60 s, and checkpoint outranks network and thermal, so those causes show from ~13 s to 20 s and again after 60 s.
In the first seconds every job reads slow, since rate() over a window its series does not fill yet extrapolates less
than the window (MfuLow may go pending, even fire, for the healthy job): the checks look at what follows. They wait
for what they need, up to ``DEADLINE`` after the start; the whole module takes about 70 s.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, Callable
from urllib.parse import urlsplit

import pytest

from mfu_exporter.sim.node import DISCOVERED_JOB, JOB
from tests.support.dashboards import LABEL_VALUES, dashboards, queries
from tests.support.demo_harness import get_json, running_demo
from tests.support.prom_harness import RULE_FILES, SCRAPE_JOB, Prometheus, derived_rules, listening_addresses
from tests.support.tools import require_tool

pytestmark = pytest.mark.slow

INCIDENT_CAUSES = {
    "pfc-storm": "network",
    "thermal": "thermal",
    "gpu-lost": "gpu_lost",
    "checkpoint-stall": "checkpoint",
}
WINDOWS = {"1m": "30s", "5m": "10s"}
STEPS = {"1m": "1s", "5m": "5s"}  # the hour-long windows' subqueries: a point a second, not a minute
FOR_SECONDS = 3
FOR = f"{FOR_SECONDS}s"
DEADLINE = 90.0  # seconds after the demos are up: the first healthy checkpoint ends at 60 s of demo time
GRAFANA = {"$__rate_interval": "15s", "$__interval": "2s"}  # what Grafana would put there, near enough for 1 s scrapes


def incident_job(incident: str) -> str:
    return f"{JOB}-{incident}"


class RenamingPrometheus(Prometheus):
    """A Prometheus whose scrape renames each incident demo's training job, so each demo is a job of its own."""

    def __init__(self, *args: Any, renames: dict[str, str], **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.renames = renames  # target address -> training_job its series get

    def config(self) -> dict:
        config = super().config()
        (scrape,) = config["scrape_configs"]
        scrape["metric_relabel_configs"] = [
            {
                "source_labels": ["instance", "training_job"],
                "regex": f"{re.escape(target)};{re.escape(JOB)}",
                "target_label": "training_job",
                "replacement": name,
            }
            for target, name in self.renames.items()
        ]
        return config


@dataclass
class Cluster:
    prometheus: Prometheus
    healthy: str  # the healthy demo's base URL
    incidents: dict[str, str]  # incident -> its demo's base URL
    started: float  # wall time the demos were all up

    @property
    def bases(self) -> list[str]:
        return [self.healthy, *self.incidents.values()]

    def wait(self, predicate: Callable[[], Any], what: str, interval: float = 0.5) -> Any:
        """``predicate()``'s first truthy value, polling until ``DEADLINE`` after the start."""
        while True:
            value = predicate()
            if value:
                return value
            if time.time() > self.started + DEADLINE:
                raise AssertionError(f"timed out waiting for {what}")
            time.sleep(interval)

    def ever(self, expr: str) -> list[dict]:
        """Series ``expr`` returned at any second since the demos came up (a range query, as Grafana's panels make)."""
        return self.prometheus.api("query_range", query=expr, start=self.started, end=time.time(), step="1s")["result"]

    def alerts(self, name: str, **labels: str) -> list[dict]:
        return [
            a
            for a in self.prometheus.alerts()
            if a["labels"]["alertname"] == name and all(a["labels"].get(k) == v for k, v in labels.items())
        ]

    def alert_history(self, name: str, **labels: str) -> dict[str, list[float]]:
        """The times one alert was pending and firing, from the ALERTS series Prometheus writes as it evaluates."""
        selector = ", ".join([f'alertname="{name}"', *(f'{k}="{v}"' for k, v in labels.items())])
        history = defaultdict(list)
        for series in self.ever(f"ALERTS{{{selector}}}"):
            history[series["metric"]["alertstate"]] += [float(at) for at, _ in series["values"]]
        return history


def address(base: str) -> str:
    return urlsplit(base).netloc


def promql_regex(value: str) -> str:
    """``value`` matched literally by ``=~"..."``, escaped as Grafana does (backslashes doubled for the string)."""
    return re.escape(value).replace("\\", "\\\\")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    binary = require_tool("prometheus", "prometheus")
    workdir = tmp_path_factory.mktemp("e2e")
    rules = [derived_rules(path, workdir / path.name, ranges=WINDOWS, for_=FOR, steps=STEPS) for path in RULE_FILES]
    demos = {None: ["--mfu.window", WINDOWS["1m"]]}
    demos |= {incident: ["--incident", incident, "--mfu.window", WINDOWS["5m"]] for incident in INCIDENT_CAUSES}
    with ExitStack() as stack:
        # Started side by side, each demo's context entered on the stack from a worker thread: each takes a second or
        # two to import and come up.
        with ThreadPoolExecutor(len(demos)) as pool:
            bases = dict(
                zip(demos, pool.map(lambda args: stack.enter_context(running_demo(*args, speed=1)), demos.values()))
            )
        started = time.time()
        incidents = {incident: base for incident, base in bases.items() if incident}
        prometheus = RenamingPrometheus(
            binary,
            workdir / "prometheus",
            rule_files=rules,
            scrape_jobs={SCRAPE_JOB: [address(base) for base in bases.values()]},
            renames={address(base): incident_job(incident) for incident, base in incidents.items()},
        )
        stack.callback(prometheus.stop)
        prometheus.start()
        yield Cluster(prometheus, bases[None], incidents, started)


def test_recorded_mfu_matches_the_demos_own(cluster):
    """The healthy demo's MFU recorded over 30 s of scrapes agrees with the MFU it serves over its own 30 s window."""
    # rate() over a window the series does not fill yet extrapolates less than the window and reads low: wait for
    # samples older than the window (33 in the last 35 s) first.
    selector = f'mfu_job_model_flops_total{{training_job="{JOB}"}}'
    cluster.wait(lambda: cluster.prometheus.query(f"count_over_time({selector}[35s]) >= 33"), "35 s of scrapes")
    (recorded,) = cluster.prometheus.query(
        f'training_job:mfu_model_flops_utilization:ratio_rate1m{{training_job="{JOB}"}}'
    )
    (job,) = [j for j in get_json(cluster.healthy + "api/v1/jobs")["jobs"] if j["job"] == JOB]
    assert 0.40 <= job["mfu"] <= 0.47  # 45%, or 5% less while the demo writes a checkpoint
    assert recorded["value"] == pytest.approx(job["mfu"], abs=0.02)


def test_pfc_storm_fires_the_mfu_and_pause_alerts_naming_the_network_and_the_node(cluster):
    job, node = incident_job("pfc-storm"), address(cluster.incidents["pfc-storm"])

    def firing() -> bool:
        alerts = cluster.alerts("MfuLow", training_job=job) + cluster.alerts(
            "MfuPfcPauseStorm", instance=node, severity="warning"
        )
        return {"MfuLow", "MfuPfcPauseStorm"} <= {a["labels"]["alertname"] for a in alerts if a["state"] == "firing"}

    cluster.wait(firing, "MfuLow and MfuPfcPauseStorm to fire")
    # Each alert was pending in the seconds (its shortened `for:`) just before it fired.
    for name, labels in (
        ("MfuLow", {"training_job": job}),
        ("MfuPfcPauseStorm", {"instance": node, "interface": "ens3np0", "direction": "rx"}),
    ):
        history = cluster.alert_history(name, **labels)
        fired = min(history["firing"])
        assert [at for at in history["pending"] if fired - 1 - FOR_SECONDS <= at < fired], (name, history)
    paused = {
        (a["labels"]["interface"], a["labels"]["direction"])
        for a in cluster.alerts("MfuPfcPauseStorm", instance=node, severity="warning")
    }
    assert paused == {(nic, direction) for nic in ("ens3np0", "ens6np0") for direction in ("rx", "tx")}

    # The description's cause follows the job's: checkpoint while the demo writes one, network before and after.
    def described() -> str | None:
        (alert,) = cluster.alerts("MfuLow", training_job=job)
        description = alert["annotations"]["description"]
        return description if description.endswith(f"; likely cause: network (worst node {node}).") else None

    description = cluster.wait(described, "MfuLow to name the network and the storm's node")
    mfu = re.match(
        rf"Job {job} has run at ([0-9.]+)% MFU \(over 5 minutes, all its nodes\) below the 25% line", description
    )
    assert mfu and 15 < float(mfu.group(1)) < 25  # 18%: 40% of the healthy token rate
    assert not cluster.alerts("MfuCritical", training_job=job)  # 18%: above the critical line
    assert not cluster.alerts("MfuLow", training_job=JOB) and not cluster.alerts(
        "MfuPfcPauseStorm", instance=address(cluster.healthy)
    )


@pytest.mark.parametrize("incident, cause", INCIDENT_CAUSES.items())
def test_each_incident_is_attributed_to_its_cause_on_the_node_and_across_the_job(cluster, incident, cause):
    """The demo's own verdict (scraped mfu_job_bottleneck, its job JSON) and the recorded classification name the
    incident's cause, the latter with the demo as the worst node; lost capacity is counted under that cause."""
    job, node = incident_job(incident), address(cluster.incidents[incident])
    assert cluster.wait(
        lambda: cluster.ever(f'mfu_job_bottleneck{{training_job="{job}", cause="{cause}"}} == 1'),
        f"the node to attribute {incident} to {cause}",
    )
    recorded = cluster.wait(
        lambda: cluster.ever(f'training_job:mfu_bottleneck:cause{{training_job="{job}", cause="{cause}"}}'),
        f"the rules to attribute {incident} to {cause}",
    )
    assert {series["metric"].get("instance") for series in recorded} == {node}
    assert cluster.wait(
        lambda: cluster.ever(f'rate(mfu_job_lost_gpu_seconds_total{{training_job="{job}", cause="{cause}"}}[10s]) > 0'),
        f"GPU-seconds lost to {cause}",
    )

    def verdict() -> dict | None:
        # The demo calls its job JOB; only the scrape relabels it per incident.
        (state,) = [j for j in get_json(cluster.incidents[incident] + "api/v1/jobs")["jobs"] if j["job"] == JOB]
        return state["bottleneck"] if state["bottleneck"] and state["bottleneck"]["cause"] == cause else None

    assert cluster.wait(verdict, f"the job JSON to show {cause}")["evidence"]


def test_every_dashboard_query_returns_series(cluster):
    """Each panel and annotation query, variables filled in as Grafana would for the healthy job on all the demos,
    returns series over the run (a range query, as the panels make): names, labels and joins match what the demos
    serve and what the rules record. Waits for the healthy demo's first finished checkpoint (60 s of demo time)."""
    cluster.wait(
        lambda: cluster.ever(f'mfu_checkpoint_last_success_timestamp_seconds{{training_job="{JOB}"}}'),
        "the healthy demo's first checkpoint to finish",
    )
    range_seconds = int(time.time() - cluster.started)
    variables = {
        **GRAFANA,
        "$__range_s": str(range_seconds),
        "$__range": f"{range_seconds}s",
        "$training_job": promql_regex(JOB),
        "$job": promql_regex(SCRAPE_JOB),
        "$instance": "(" + "|".join(promql_regex(address(base)) for base in cluster.bases) + ")",
    }
    empty = []
    for where, expr in queries():
        for variable, value in variables.items():  # longest first: $__range_s before $__range
            expr = expr.replace(variable, value)
        assert "$" not in expr, f"{where}: a variable left in {expr}"
        if not cluster.ever(expr):
            empty.append(where)
    assert not empty, f"no series: {empty}"


def label_values(cluster: Cluster, query: str, chosen: dict[str, str]) -> set[str]:
    """What Grafana's ``label_values(selector, label)`` gives for a variable over the run: Prometheus's label values
    API with the selector as ``match[]``, after the variables it uses are replaced by ``chosen``."""
    match = LABEL_VALUES.match(query)
    assert match, f"not a label_values() query: {query}"
    selector = match["selector"]
    for name, value in sorted(chosen.items(), key=lambda item: -len(item[0])):
        selector = selector.replace(f"${name}", value)
    assert "$" not in selector, f"a variable left in {selector}"
    values = cluster.prometheus.api(
        f"label/{match['label']}/values", **{"match[]": selector}, start=cluster.started, end=time.time()
    )
    return set(values)


def test_every_dashboard_variable_query_runs_against_prometheus(cluster):
    """Each dashboard's query variables, in their order (instance uses $job, training_job both), as Grafana runs them:
    with All selected (the allValue regex) every demo and every job shows; with one node selected, only its jobs."""
    cluster.wait(lambda: cluster.ever(f'mfu_job_info{{training_job="{JOB}"}}'), "the healthy job's info")
    nodes = {address(base) for base in cluster.bases}
    # Every demo node also holds the job that discovery finds on its GPUs 4-7, under one name on every node.
    jobs = {JOB, DISCOVERED_JOB} | {incident_job(incident) for incident in cluster.incidents}
    wanted = {"job": {SCRAPE_JOB}, "instance": nodes, "training_job": jobs}
    for name, dashboard in dashboards():
        variables = [v for v in dashboard["templating"]["list"] if v["type"] == "query"]
        assert [v["name"] for v in variables] == ["job", "instance", "training_job"], name
        chosen: dict[str, str] = {}
        for variable in variables:
            found = label_values(cluster, variable["query"], chosen)
            assert found == wanted[variable["name"]], f"{name}: ${variable['name']} offers {sorted(found)}"
            chosen[variable["name"]] = variable["allValue"]
        one_node = {"job": promql_regex(SCRAPE_JOB), "instance": promql_regex(address(cluster.healthy))}
        assert label_values(cluster, variables[-1]["query"], one_node) == {JOB, DISCOVERED_JOB}, name


def test_every_rule_evaluates_and_nothing_listens_off_loopback(cluster):
    health = cluster.prometheus.rule_health()
    assert health and all(state == "ok" for _, state, _ in health), [h for h in health if h[1] != "ok"]
    ss = require_tool("ss", "iproute2")
    sockets = subprocess.run([ss, "-Hltnp"], capture_output=True, text=True, timeout=10, check=True).stdout.splitlines()
    for server in [address(base) for base in cluster.bases] + [f"127.0.0.1:{cluster.prometheus.port}"]:
        (pid,) = {int(re.search(r"pid=(\d+),", line).group(1)) for line in sockets if line.split()[3] == server}
        addresses = listening_addresses(pid)
        assert addresses and all(a.startswith("127.0.0.1:") for a in addresses), (server, addresses)
