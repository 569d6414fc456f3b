"""``make bench-fleet``: what the fleet costs at 256, 1,024, 2,048 and 4,096 nodes, on both distributed paths at once.

For each size, the stack of tests/support/fleet_harness.py (two vmagent shards → VictoriaMetrics + vmalert; on the
Prometheus path, ``--prometheus-mode scrape`` (the default) one Prometheus scraping the nodes itself and running the
rules as a shard is deployed (deploy/fleet/prometheus-shard.yaml), or ``agent``, an agent remote-writing every sample
into a receiver running the rules) over a simulated fleet: ``demo --nodes N`` (whole
exporters) up to ``--targets-above`` nodes, the target server of mfu_exporter/sim/targets.py (the project's own
expositions, captured at its start, served per node) above; the Prometheus path up to ``--prometheus-up-to`` nodes.
At production intervals (15 s scrape, sample and evaluation unless ``--interval`` says otherwise), measured after a
warm-up:

- series per node by source (from one healthy node's exposition; the scrape adds ``up`` and four ``scrape_*``),
- series in each store, samples/s ingested (VictoriaMetrics ``vm_rows_inserted_total``, the evaluating
  Prometheus' ``prometheus_tsdb_head_samples_appended_total``),
- each rule group's evaluation time: Prometheus' ``prometheus_rule_group_last_duration_seconds`` of each iteration
  in the measurement (told apart by ``prometheus_rule_group_last_evaluation_timestamp_seconds``: their mean and max)
  and vmalert's ``vmalert_iteration_duration_seconds`` (the mean of the iterations in the measurement, and its 0.99
  quantile), the mean against the target of 10 % of the interval,
- failed scrapes, and the simulator's CPU (share of one core) and RSS; each engine's CPU and RSS too,
- each store's disk growth over the measurement, as bytes per series per day,
- whether the rules got it right: each job's recorded cluster MFU (``ratio_rate1m``) against the simulator's truth
  (target: within 2 points), and the incident job's recorded cause naming the network on the incident node,
- the machine's load average (/proc/loadavg) before and after, and its busy share over the measurement
  (/proc/stat: every core's non-idle time): the figures are only as quiet as the machine.

Each group's mean is also given as its share of its own interval (``rule_group_share``, the rule: under 10 %), with
each engine's slowest group (``slowest_group``): the growth table's columns (docs/benchmarks.md).

``--exposition`` replays a real node instead of the target server's simulated ones, at every size (the target server's
``--exposition``: every job of that node on every node, counters at its captured rates): two captures (files) taken
``--exposition-apart`` apart, a node's ``/metrics`` URL read twice, or ``demo``, a ``mfu-exporter demo`` started here
and read after ``--exposition-warmup``; the captures are kept beside ``--json``. The truth has no incident then: the
check is each job's cluster MFU, and the cause named per job is reported as found.

Results go to ``--json`` and a markdown table to stdout (docs/benchmarks.md, "The fleet").
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import requests
import yaml

from mfu_exporter.quantities import parse_duration
from mfu_exporter.sim.targets import LAYOUTS
from tests.support.fleet_harness import RULE_FILES, FleetStack

TARGET_SHARE = 0.10  # every rule group under 10 % of its interval
MFU_TOLERANCE = 0.02  # each job's recorded cluster MFU within 2 points of the truth
NODE_TIER = "mfu-exporter.node.yaml"  # the rules that read a device's own series (docs/scaling.md, rule tiers)
SOURCES = (
    ("mfu_gpu_", "gpu"),
    ("mfu_rdma_", "rdma"),
    ("mfu_nic_", "ethtool"),
    # The node summaries, by the source that computes them.
    ("mfu_node_gpu", "gpu"),
    ("mfu_node_rdma_", "rdma"),
    ("mfu_node_nic_", "ethtool"),
    ("mfu_checkpoint_", "checkpoint"),
    ("mfu_preflight_", "preflight"),
    ("mfu_job_", "jobs"),
    ("mfu_model_", "jobs"),
    ("mfu_exporter_", "exporter"),
)
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def scrape_metrics(url: str) -> dict[str, float]:
    """A server's own /metrics as {"name{labels}": value}."""
    found = {}
    for line in requests.get(f"{url}/metrics", timeout=60).text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            try:
                found[key] = float(value)
            except ValueError:
                pass
    return found


def total(metrics: dict[str, float], name: str) -> float:
    return sum(v for k, v in metrics.items() if k == name or k.startswith(name + "{"))


def total_prefix(metrics: dict[str, float], prefix: str) -> float:
    return sum(v for k, v in metrics.items() if k.startswith(prefix))


def _ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def series_by_source(body: str) -> dict[str, int]:
    counts: Counter = Counter()
    for line in body.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        counts[next((source for prefix, source in SOURCES if name.startswith(prefix)), "other")] += 1
    return dict(sorted(counts.items()))


def node_body(stack: FleetStack, attempts: int = 3) -> str:
    """Node 1's exposition; on a machine loaded past its cores a scrape can wait its turn for a while."""
    for attempt in range(attempts):
        try:
            return requests.get(stack.metrics_url(1), timeout=60).text
        except requests.RequestException:
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


def disk_bytes(path: Path) -> int:
    total_bytes = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total_bytes += (Path(root) / name).stat().st_size
            except OSError:
                pass  # a part merged away while walking
    return total_bytes


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def cpu_times() -> tuple[float, float]:
    """The machine's (busy, total) CPU time over every core since boot, from /proc/stat's first line."""
    fields = [float(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    idle = fields[3] + fields[4]  # idle and iowait
    return sum(fields) - idle, sum(fields)


def group_intervals(rule_files: list[Path], interval: float) -> dict[str, float]:
    """Each rule group's own interval in seconds: its ``interval:``, else the evaluation interval."""
    found = {}
    for path in rule_files:
        for group in yaml.safe_load(path.read_text())["groups"]:
            found[group["name"]] = parse_duration(group["interval"]) if "interval" in group else interval
    return found


def shares(groups: dict[str, dict[str, Any]], intervals: dict[str, float]) -> dict[str, float | None]:
    """Each group's mean evaluation as a share of its own interval."""
    return {
        group: (found["mean"] / intervals[group] if found["mean"] is not None and group in intervals else None)
        for group, found in groups.items()
    }


def slowest(groups: dict[str, dict[str, Any]], share: dict[str, float | None]) -> dict[str, Any] | None:
    """The group with the highest share of its interval (a group with no evaluation measured first)."""
    if not groups:
        return None
    group = max(groups, key=lambda g: share[g] if share[g] is not None else float("inf"))
    return {"group": group, "mean_seconds": groups[group]["mean"], "share": share[group]}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def capture_demo(out: Path, warmup: float, apart: float) -> list[str]:
    """Start ``mfu-exporter demo`` on a free loopback port, read its /metrics after ``warmup`` seconds and again
    ``apart`` seconds later into two files under ``out``, stop it; the files' paths."""
    port = free_port()
    out.mkdir(parents=True, exist_ok=True)
    log = (out / "demo.log").open("w")
    demo = subprocess.Popen(
        [sys.executable, "-m", "mfu_exporter", "demo", "--web.listen-address", f"127.0.0.1:{port}"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        time.sleep(warmup)
        files = []
        for index in (1, 2):
            if index == 2:
                time.sleep(apart)
            body = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=60).text
            path = out / f"exposition-{index}.txt"
            path.write_text(body)
            files.append(str(path.resolve()))  # the target server runs in a directory of its own
        return files
    finally:
        demo.terminate()
        demo.wait(timeout=60)
        log.close()


def correctness(stack: FleetStack) -> dict[str, Any]:
    """Per path: each job's recorded cluster MFU against the truth, and the incident job's recorded cause (a replayed
    node's fleet has no incident: its first job's cause, as found)."""
    truth = stack.fleet_json()
    expected = {job["name"]: job["mfu_1m"] for job in truth["jobs"] if job.get("mfu_1m") is not None}
    incident = truth["incident"]
    job = incident["job"] if incident else truth["jobs"][0]["name"]
    node = stack.instance(incident["node"]) if incident else None
    found: dict[str, Any] = {}
    recent = f"{int(2500 * parse_duration(stack.interval))}ms"
    for path, store in stack.stores.items():
        try:
            found[path] = _correctness(store, recent, expected, job, node)
        except (requests.RequestException, ValueError, AssertionError) as exc:
            # An engine too loaded to answer within 30 s answers nothing right either: recorded as such.
            found[path] = {
                "jobs": len(expected),
                "jobs_recorded": 0,
                "mfu_max_error": None,
                "jobs_within_2_points": 0,
                "worst_job": None,
                "incident_cause": [],
                "incident_named": False,
                "error": f"{type(exc).__name__}: {exc}"[:300],
            }
    return found


def _correctness(store: Any, recent: str, expected: dict[str, float], job: str, node: str | None) -> dict[str, Any]:
    recorded = {
        s["metric"].get("training_job"): s["value"]
        for s in store.query(f"last_over_time(training_job:mfu_model_flops_utilization:ratio_rate1m[{recent}])")
    }
    errors = {name: abs(recorded[name] - mfu) for name, mfu in expected.items() if name in recorded}
    causes = store.query(f'last_over_time(training_job:mfu_bottleneck:cause{{training_job="{job}"}}[{recent}])')
    named = [(s["metric"].get("cause"), s["metric"].get("instance")) for s in causes]
    return {
        "jobs": len(expected),
        "jobs_recorded": len(errors),
        "mfu_max_error": max(errors.values(), default=None),
        "jobs_within_2_points": sum(e <= MFU_TOLERANCE for e in errors.values()),
        "worst_job": max(errors, key=errors.__getitem__, default=None),
        "incident_cause": named,
        # The latest evaluation's cause; one that just ended may still show in VictoriaMetrics' look-back.
        "incident_named": ("network", node) in named if node is not None else None,
    }


def partial_series(stack: FleetStack, out: Path | None) -> dict[str, int]:
    """How many per-job partial aggregates each store holds now (what a shard would send the global tier: docs/scaling.md
    "Rules in three tiers"); with ``out``, the first store's written there for bench.global_tier to replay."""
    counts = {}
    for path, store in stack.stores.items():
        found = store.query('{__name__=~"training_job[a-z_]*_shard:.+"}')
        counts[path] = len(found)
        if out is not None and not out.exists():
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps([{"metric": s["metric"], "value": s["value"]} for s in found], indent=1))
    return counts


def label(key: str, name: str) -> str | None:
    match = re.search(rf'{name}="([^"]*)"', key)
    return match.group(1) if match else None


def measure(
    nodes: int,
    interval: str,
    warmup: float,
    seconds: float,
    workdir: Path,
    source: str,
    paths: tuple[str, ...],
    node_tier: bool = True,
    layout: str = "small",
    partials_out: Path | None = None,
    prometheus_mode: str = "scrape",
    exposition: tuple[str, ...] = (),
) -> dict[str, Any]:
    started = time.monotonic()
    load0 = loadavg()
    fleet_args: tuple[str, ...] = ("--layout", layout) if source == "targets" else ()
    if exposition:
        fleet_args = exposition
    stack = FleetStack(
        workdir / f"n{nodes}",
        nodes=nodes,
        incident=None if exposition else "pfc-storm",
        incident_node=min(17, nodes - 1),
        interval=interval,
        source=source,
        paths=paths,
        rule_files=[f for f in RULE_FILES if node_tier or f.name != NODE_TIER],
        fleet_args=fleet_args,
        prometheus_mode=prometheus_mode,
    )
    stack.start()
    prometheus, vm = "prometheus" in paths, "victoria-metrics" in paths
    data = {
        "victoria-metrics": stack.workdir / "vm" / "data",
        "prometheus": stack.workdir / "prom" / ("shard-data" if prometheus_mode == "scrape" else "receiver-data"),
    }
    evaluator = stack.prometheus_evaluator
    try:
        up_after = time.monotonic() - started
        time.sleep(warmup)
        servers = stack.servers
        pids = {name: server.pid for name, server in servers.items()}

        def own(name: str) -> dict[str, float]:
            return scrape_metrics(servers[name].url) if name in servers else {}

        per_node = series_by_source(node_body(stack))
        cpu0 = {name: cpu_seconds(pid) for name, pid in pids.items()}
        machine0 = cpu_times()
        disk0 = {path: disk_bytes(data[path]) for path in paths}
        vm0, prom0, alert0 = own("victoria-metrics"), own(evaluator), own("vmalert")
        t0 = time.monotonic()
        # Per group, each iteration's duration by the time it started (polled every 5 s, a third of an interval).
        iterations: dict[str, dict[float, float]] = defaultdict(dict)
        # Per engine and rule, each evaluation's duration by its time: which rule makes a slow group slow.
        evaluations: dict[str, dict[str, dict[str, float]]] = {
            "prometheus": defaultdict(dict),
            "vmalert": defaultdict(dict),
        }
        while time.monotonic() - t0 < seconds:
            time.sleep(min(5.0, seconds))
            if prometheus:
                prometheus_iterations(scrape_metrics(servers[evaluator].url), iterations)
            for engine, name in (("prometheus", evaluator), ("vmalert", "vmalert")):
                if name in servers:
                    rule_evaluations(servers[name].url, evaluations[engine])
        elapsed = time.monotonic() - t0
        cpu1 = {name: cpu_seconds(pid) for name, pid in pids.items()}
        machine1 = cpu_times()
        disk1 = {path: disk_bytes(data[path]) for path in paths}
        vm1, prom1, alert1 = own("victoria-metrics"), own(evaluator), own("vmalert")
        prom_groups = {
            group: {
                "mean": sum(seen.values()) / len(seen),
                "max": max(seen.values()),
                "iterations": len(seen),
            }
            for group, seen in iterations.items()
        }
        vmalert_groups = {}
        for key in alert1:
            if key.startswith("vmalert_iteration_duration_seconds_sum{"):
                group = label(key, "group") or ""
                count_key = key.replace("_sum{", "_count{")
                count = alert1.get(count_key, 0.0) - alert0.get(count_key, 0.0)
                mean = (alert1[key] - alert0.get(key, 0.0)) / count if count else None
                quantile = next(
                    (
                        v
                        for k, v in alert1.items()
                        if k.startswith("vmalert_iteration_duration_seconds{")
                        and label(k, "group") == group
                        and label(k, "quantile") == "0.99"
                    ),
                    None,
                )
                vmalert_groups[group] = {"mean": mean, "p99": quantile, "iterations": count}
        up = {path: store.query('count(up{job="mfu-exporter"} == 1)') for path, store in stack.stores.items()}
        shards = (0, 1) if vm else ()
        agents = [own(f"vmagent-{m}") for m in shards]
        failed = sum(total(agent, "vm_promscrape_scrapes_failed_total") for agent in agents)
        scrapes = sum(total(agent, "vm_promscrape_scrapes_total") for agent in agents)
        per_shard = [
            sum(
                target["health"] == "up"
                for target in requests.get(f"{servers[f'vmagent-{m}'].url}/api/v1/targets", timeout=30).json()["data"][
                    "activeTargets"
                ]
            )
            for m in shards
        ]
        series = {
            # VictoriaMetrics' own count: a count({job=...}) over 1.2 million series takes over 30 s here.
            "victoria-metrics": total(vm1, "vm_new_timeseries_created_total") if vm else None,
            "prometheus": total(prom1, "prometheus_tsdb_head_series") if prometheus else None,
        }
        intervals = group_intervals(list(stack.rule_files), parse_duration(interval))
        share = {"prometheus": shares(prom_groups, intervals), "vmalert": shares(vmalert_groups, intervals)}
        result = {
            "nodes": nodes,
            "fleet": source,
            "layout": "replay" if exposition else layout,
            "exposition": [exposition[i + 1] for i in range(0, len(exposition), 2) if exposition[i] == "--exposition"],
            "paths": list(paths),
            "prometheus_mode": prometheus_mode if prometheus else None,
            "rule_files": [f.name for f in stack.rule_files],
            "interval_seconds": parse_duration(interval),
            "stack_up_seconds": round(up_after, 1),
            "series_per_node": per_node,
            "series_per_node_total": sum(per_node.values()),
            "series": series,
            "samples_per_second": {
                "victoria-metrics": (total(vm1, "vm_rows_inserted_total") - total(vm0, "vm_rows_inserted_total"))
                / elapsed
                if vm
                else None,
                "prometheus": (
                    total(prom1, "prometheus_tsdb_head_samples_appended_total")
                    - total(prom0, "prometheus_tsdb_head_samples_appended_total")
                )
                / elapsed
                if prometheus
                else None,
            },
            # What a series costs on disk per day at this interval: VictoriaMetrics' stored bytes per stored sample
            # (its parts, from its own vm_data_size_bytes and vm_rows; recent parts are small and compress less
            # than merged ones, so this is an upper bound); the receiver's growth per appended sample, which over a
            # short run is its write-ahead log (blocks, cut every two hours, compress further).
            "disk_bytes_per_series_per_day": {
                **(
                    {
                        "victoria-metrics": _ratio(
                            total_prefix(vm1, 'vm_data_size_bytes{type="storage/'),
                            total_prefix(vm1, 'vm_rows{type="storage/'),
                        )
                        * 86400
                        / parse_duration(interval)
                    }
                    if vm
                    else {}
                ),
                **(
                    {
                        "prometheus": _ratio(
                            disk1["prometheus"] - disk0["prometheus"],
                            total(prom1, "prometheus_tsdb_head_samples_appended_total")
                            - total(prom0, "prometheus_tsdb_head_samples_appended_total"),
                        )
                        * 86400
                        / parse_duration(interval)
                    }
                    if prometheus
                    else {}
                ),
            },
            "correctness": correctness(stack),
            "partial_series": partial_series(stack, partials_out),
            "loadavg": {"before": load0, "after": loadavg()},
            "rule_group_seconds": {"prometheus": dict(prom_groups), "vmalert": vmalert_groups},
            "rule_group_interval_seconds": intervals,
            "rule_seconds": {
                engine: {rule: sum(seen.values()) / len(seen) for rule, seen in sorted(found.items())}
                for engine, found in evaluations.items()
                if found
            },
            # Each group's mean over its own interval, and each engine's slowest group by that share.
            "rule_group_share": share,
            "slowest_group": {
                "prometheus": slowest(prom_groups, share["prometheus"]),
                "vmalert": slowest(vmalert_groups, share["vmalert"]),
            },
            # Every core's non-idle share over the measurement: what else ran is in it.
            "machine_busy_share": _ratio(machine1[0] - machine0[0], machine1[1] - machine0[1]),
            "targets_up": {path: (found[0]["value"] if found else 0) for path, found in up.items()},
            "vmagent_scrapes_failed": failed,
            "vmagent_scrapes": scrapes,
            "vmagent_targets_up_per_shard": per_shard,
            "cpu_share": {name: (cpu1[name] - cpu0[name]) / elapsed for name in pids},
            "rss_bytes": {name: rss_bytes(pid) for name, pid in pids.items()},
            "measured_seconds": round(elapsed, 1),
        }
        return result
    finally:
        stack.stop()


def prometheus_iterations(metrics: dict[str, float], into: dict[str, dict[float, float]]) -> None:
    """Add each rule group's last iteration (its duration, keyed by its evaluation's timestamp) to ``into``."""
    started = {
        (label(key, "rule_group") or ""): value
        for key, value in metrics.items()
        if key.startswith("prometheus_rule_group_last_evaluation_timestamp_seconds{")
    }
    for key, value in metrics.items():
        if key.startswith("prometheus_rule_group_last_duration_seconds{"):
            full = label(key, "rule_group") or ""
            if started.get(full, 0) > 0:  # 0 until the group's first evaluation ends
                into[full.split(";")[-1]][started[full]] = value


def rule_evaluations(url: str, into: dict[str, dict[str, float]]) -> None:
    """Add each rule's last evaluation (its duration, keyed by when it ran) to ``into``, keyed ``group/rule``: the
    rules API of Prometheus and of vmalert both give ``evaluationTime`` and ``lastEvaluation`` per rule."""
    try:
        groups = requests.get(f"{url}/api/v1/rules", timeout=30).json()["data"]["groups"]
    except (requests.RequestException, ValueError, KeyError):
        return
    for group in groups:
        for rule in group.get("rules", []):
            when, took = rule.get("lastEvaluation"), rule.get("evaluationTime")
            if when and took is not None and not str(when).startswith("0001-"):
                into[f"{_group(group['name'])}/{rule['name']}"][when] = float(took)


def _num(value: float | None, scale: float = 1.0, digits: int = 0) -> str:
    return "–" if value is None else f"{value * scale:,.{digits}f}"


def _group(name: str) -> str:
    return name.removeprefix("mfu-exporter.")


def growth_table(results: list[dict]) -> list[str]:
    """The growth table of docs/benchmarks.md: per size and engine, the slowest group, its mean, its share of its
    interval, and the machine's busy share while measured."""
    lines = [
        "| nodes | fleet | engine | slowest group | mean (ms) | share of its interval | machine busy |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        fleet = "replayed node" if r.get("layout") == "replay" else f"{r.get('fleet', 'demo')} ({r.get('layout')})"
        for engine, name in (("vmalert", "VictoriaMetrics (vmalert)"), ("prometheus", "Prometheus")):
            found = (r.get("slowest_group") or {}).get(engine)
            if not found:
                continue
            if engine == "prometheus":
                name += f" ({r.get('prometheus_mode')})"
            lines.append(
                f"| {r['nodes']:,} | {fleet} | {name} | `{found['group']}` | {_num(found['mean_seconds'], 1000)} | "
                f"{_num(found['share'], 100)} % | {_num(r.get('machine_busy_share'), 100)} % |"
            )
    return lines


def table(results: list[dict]) -> str:
    """Four markdown tables: the growth table (each engine's slowest group), the stores, each rule group's evaluation
    time with its share of its interval, and what the rules got right."""
    lines = [*growth_table(results), ""]
    lines += [
        "| nodes | fleet | series/node | series (VM / Prom) | samples/s (VM / Prom) | disk B/series/day (VM / Prom) | "
        "CPU: VM, vmagents, vmalert / Prometheus (agent, receiver) | RSS MiB: VM, vmagents, vmalert / Prometheus | "
        "targets up (VM / Prom) | fleet CPU, RSS | load before → after |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        cpu, rss, paths = r["cpu_share"], r["rss_bytes"], r["paths"]
        vm_cpu = vm_rss = "–"
        if "victoria-metrics" in paths:
            vm_cpu = f"{_num(cpu['victoria-metrics'], 100)}, {_num(cpu['vmagent-0'] + cpu['vmagent-1'], 100)}, " + (
                f"{_num(cpu['vmalert'], 100)} %"
            )
            vm_rss = (
                f"{_num(rss['victoria-metrics'], 2**-20)}, {_num(rss['vmagent-0'] + rss['vmagent-1'], 2**-20)}, "
                + (f"{_num(rss['vmalert'], 2**-20)}")
            )
        if "prometheus-shard" in cpu:  # one Prometheus scraping and evaluating
            vm_cpu += f" / {_num(cpu['prometheus-shard'], 100)} %"
            vm_rss += f" / {_num(rss['prometheus-shard'], 2**-20)}"
        elif "prometheus" in paths:
            vm_cpu += f" / {_num(cpu['prometheus-agent'], 100)}, {_num(cpu['prometheus-receiver'], 100)} %"
            vm_rss += f" / {_num(rss['prometheus-agent'], 2**-20)}, {_num(rss['prometheus-receiver'], 2**-20)}"
        disk = r.get("disk_bytes_per_series_per_day", {})
        load = r.get("loadavg", {})
        lines.append(
            f"| {r['nodes']:,} | {r.get('fleet', 'demo')} | {r['series_per_node_total']:,} | "
            f"{_num(r['series']['victoria-metrics'])} / {_num(r['series']['prometheus'])} | "
            f"{_num(r['samples_per_second']['victoria-metrics'])} / {_num(r['samples_per_second']['prometheus'])} | "
            f"{_num(disk.get('victoria-metrics'))} / {_num(disk.get('prometheus'))} | {vm_cpu} | {vm_rss} | "
            f"{_num(r['targets_up'].get('victoria-metrics'))} / {_num(r['targets_up'].get('prometheus'))} | "
            f"{_num(cpu['fleet'], 100)} %, {_num(rss['fleet'], 2**-20)} MiB | "
            f"{_num((load.get('before') or [None])[0], 1, 1)} → {_num((load.get('after') or [None])[0], 1, 1)} |"
        )
    groups = sorted({_group(g) for r in results for engine in r["rule_group_seconds"].values() for g in engine})
    lines += ["", "| nodes | engine | " + " | ".join(f"{g} (ms; share)" for g in groups) + " |"]
    lines.append("|---|---|" + "---|" * len(groups))
    for r in results:
        share = {
            engine: {_group(g): v for g, v in found.items()} for engine, found in r.get("rule_group_share", {}).items()
        }

        def pct(engine: str, group: str) -> str:
            return f"; {_num(share.get(engine, {}).get(group), 100)} %" if share else ""

        vmalert = {_group(g): v for g, v in r["rule_group_seconds"]["vmalert"].items()}
        if vmalert:
            lines.append(
                f"| {r['nodes']:,} | vmalert mean / p99 | "
                + " | ".join(
                    f"{_num(vmalert[g]['mean'], 1000)} / {_num(vmalert[g]['p99'], 1000)}{pct('vmalert', g)}"
                    if g in vmalert
                    else "–"
                    for g in groups
                )
                + " |"
            )
        prom = {_group(g): v for g, v in r["rule_group_seconds"]["prometheus"].items()}
        if prom:
            lines.append(
                f"| {r['nodes']:,} | Prometheus ({r.get('prometheus_mode')}) mean / max | "
                + " | ".join(
                    f"{_num(prom[g]['mean'], 1000)} / {_num(prom[g]['max'], 1000)}{pct('prometheus', g)}"
                    if g in prom
                    else "–"
                    for g in groups
                )
                + " |"
            )
    lines += [
        "",
        "| nodes | path | jobs recorded / simulated | within 2 points | max error (points) | incident job's cause |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        for path, found in r.get("correctness", {}).items():
            causes = ", ".join(f"{cause} on {node}" for cause, node in found["incident_cause"]) or "none"
            named = {True: "named", False: "NOT named", None: "no incident"}[found["incident_named"]]
            lines.append(
                f"| {r['nodes']:,} | {path} | {found['jobs_recorded']} / {found['jobs']} | "
                f"{found['jobs_within_2_points']} | {_num(found['mfu_max_error'], 100, 1)} | {named}: {causes} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fleet", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="256,1024,2048,4096", help="comma-separated fleet sizes")
    parser.add_argument("--interval", default="15s", help="scrape, sample and evaluation interval")
    # 90 s: on VictoriaMetrics the attribution's chain of recorded series (instance:, then training_job:, then the
    # candidates and the cause, each read back from the store) takes ~80 s at 15 s intervals to name a cause.
    parser.add_argument("--warmup", type=float, default=90.0, help="seconds before measuring")
    parser.add_argument("--seconds", type=float, default=60.0, help="seconds measured")
    parser.add_argument(
        "--targets-above",
        type=int,
        default=256,
        help="fleets larger than this are served by mfu_exporter/sim/targets.py",
    )
    parser.add_argument(
        "--prometheus-up-to", type=int, default=2048, help="the Prometheus path runs up to this many nodes"
    )
    parser.add_argument(
        "--node-tier-up-to",
        type=int,
        default=1 << 30,
        help="the central engines evaluate the node tier (alerts/mfu-exporter.node.yaml) up to this many nodes; "
        "above, only the central tier, as when each shard of a fleet evaluates its own node tier",
    )
    parser.add_argument(
        "--paths",
        default="victoria-metrics,prometheus",
        help="the paths to run (comma-separated), each where its size allows",
    )
    parser.add_argument(
        "--paths-apart",
        action="store_true",
        help="run each path in its own stack (on 2 cores, two paths at once share the CPU: at 2,048 nodes neither "
        "keeps up)",
    )
    parser.add_argument(
        "--layout",
        choices=LAYOUTS,
        default="small",
        help="the target server's jobs: many small ones, one on every node, or half and half (mfu_exporter/sim/targets.py)",
    )
    parser.add_argument(
        "--prometheus-mode",
        choices=("scrape", "agent"),
        default="scrape",
        help="the Prometheus path: one Prometheus scraping the nodes and evaluating, as a shard is deployed "
        "(deploy/fleet/prometheus-shard.yaml), or an agent remote-writing every sample into a receiver that evaluates",
    )
    parser.add_argument(
        "--partials-out",
        type=Path,
        help="write the shard's per-job partial aggregates here at the end (bench.global_tier replays them)",
    )
    parser.add_argument(
        "--exposition",
        action="append",
        metavar="FILE_OR_URL",
        help="replay this node at every size (the target server's --exposition): twice for two captured files, once "
        "for a node's /metrics URL, or `demo` to start mfu-exporter demo and capture it",
    )
    parser.add_argument("--exposition-apart", default="60s", help="the time between the two captures (60s)")
    parser.add_argument(
        "--exposition-warmup",
        type=float,
        default=420.0,
        help="with --exposition demo: seconds the demo runs before its first capture (its jobs' MFU, and their "
        "baselines: 30 samples 10 s apart)",
    )
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="mfu-bench-fleet-") as tmp:
        exposition: tuple[str, ...] = ()
        if args.exposition:
            # Files as absolute paths: the target server runs in a directory of its own.
            sources = [s if s in ("demo",) or "://" in s else str(Path(s).resolve()) for s in args.exposition]
            if sources == ["demo"]:
                kept = args.json.with_suffix("") if args.json else Path(tmp) / "demo"
                print(f"bench-fleet: capturing mfu-exporter demo into {kept} ...", file=sys.stderr, flush=True)
                sources = capture_demo(kept, args.exposition_warmup, parse_duration(args.exposition_apart))
            exposition = (
                *(arg for source in sources for arg in ("--exposition", source)),
                "--exposition-apart",
                args.exposition_apart,
            )
        for nodes in (int(n) for n in args.nodes.split(",")):
            source = "targets" if nodes > args.targets_above or exposition else "demo"
            sized = ("victoria-metrics", "prometheus") if nodes <= args.prometheus_up_to else ("victoria-metrics",)
            paths = tuple(path for path in sized if path in args.paths.split(","))
            # Apart: each path in its own stack, one after the other, so that neither engine's time is the other's.
            for run in [(path,) for path in paths] if args.paths_apart else [paths]:
                print(f"bench-fleet: {nodes} nodes ({source}; {', '.join(run)}) ...", file=sys.stderr, flush=True)
                node_tier = nodes <= args.node_tier_up_to
                result = measure(
                    nodes,
                    args.interval,
                    args.warmup,
                    args.seconds,
                    Path(tmp),
                    source,
                    run,
                    node_tier,
                    args.layout,
                    args.partials_out,
                    args.prometheus_mode,
                    exposition,
                )
                results.append(result)
                print(json.dumps(result, indent=1), file=sys.stderr, flush=True)
                if args.json:
                    args.json.parent.mkdir(parents=True, exist_ok=True)
                    args.json.write_text(json.dumps(results, indent=1))
    print(table(results))
    # Each group against its own interval: a group evaluated once a minute has six seconds, not a second and a half.
    missed = [
        f"{engine} {group} at {r['nodes']} nodes: "
        + (
            f"{share:.0%} of its {r['rule_group_interval_seconds'][group]:g} s interval > {TARGET_SHARE:.0%}"
            if share is not None
            else "no evaluation finished while measured"
        )
        for r in results
        for engine, groups in r["rule_group_share"].items()
        for group, share in groups.items()
        if share is None or share > TARGET_SHARE
    ]
    for r in results:
        for path, found in r["correctness"].items():
            if found["jobs_within_2_points"] < found["jobs"]:
                missed.append(
                    f"{path} at {r['nodes']} nodes: {found['jobs'] - found['jobs_within_2_points']} of "
                    f"{found['jobs']} jobs' cluster MFU not within 2 points of the truth (worst {found['worst_job']})"
                )
            if r["nodes"] >= 1024 and found["incident_named"] is False:
                missed.append(
                    f"{path} at {r['nodes']} nodes: the incident node is not named ({found['incident_cause']})"
                )
    for line in missed:
        print(f"target missed: {line}", file=sys.stderr)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
