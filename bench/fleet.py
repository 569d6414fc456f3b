"""``make bench-fleet``: what the fleet costs at 64, 256 and 1,024 nodes, on both distributed paths at once.

For each size, the stack of tests/support/fleet_harness.py (``demo --nodes N``; two vmagent shards → VictoriaMetrics
+ vmalert; Prometheus agent → remote-write receiver running the rules), at production intervals (15 s scrape,
sample and evaluation unless ``--interval`` says otherwise), measured after a warm-up:

- series per node by source (from one healthy node's exposition; the scrape adds ``up`` and four ``scrape_*``),
- series in each store, samples/s ingested (VictoriaMetrics ``vm_rows_inserted_total``, the receiver's
  ``prometheus_tsdb_head_samples_appended_total``),
- each rule group's evaluation time: ``prometheus_rule_group_last_duration_seconds`` (max over the measurement) and
  vmalert's ``vmalert_iteration_duration_seconds`` (the mean of the iterations in the measurement, and its 0.99
  quantile), against the target of 10 % of the interval,
- failed scrapes, and the simulator's CPU (share of one core) and RSS; each engine's CPU and RSS too.

Results go to ``--json`` and a markdown table to stdout (docs/benchmarks.md, "Issue 18: fleet").
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import requests

from exporter.quantities import parse_duration
from tests.support.fleet_harness import FleetStack

TARGET_SHARE = 0.10  # every rule group under 10 % of its interval
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
    for line in requests.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            try:
                found[key] = float(value)
            except ValueError:
                pass
    return found


def total(metrics: dict[str, float], name: str) -> float:
    return sum(v for k, v in metrics.items() if k == name or k.startswith(name + "{"))


def series_by_source(body: str) -> dict[str, int]:
    counts: Counter = Counter()
    for line in body.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        counts[next((source for prefix, source in SOURCES if name.startswith(prefix)), "other")] += 1
    return dict(sorted(counts.items()))


def label(key: str, name: str) -> str | None:
    match = re.search(rf'{name}="([^"]*)"', key)
    return match.group(1) if match else None


def measure(nodes: int, interval: str, warmup: float, seconds: float, workdir: Path) -> dict[str, Any]:
    started = time.monotonic()
    stack = FleetStack(workdir / f"n{nodes}", nodes=nodes, incident_node=min(17, nodes - 1), interval=interval)
    stack.start()
    try:
        up_after = time.monotonic() - started
        time.sleep(warmup)
        servers = stack.servers
        pids = {name: server.pid for name, server in servers.items()}
        body = requests.get(f"http://127.0.0.1:{stack.base_port + 1}/metrics", timeout=30).text
        per_node = series_by_source(body)
        cpu0 = {name: cpu_seconds(pid) for name, pid in pids.items()}
        vm0 = scrape_metrics(servers["victoria-metrics"].url)
        prom0 = scrape_metrics(servers["prometheus-receiver"].url)
        alert0 = scrape_metrics(servers["vmalert"].url)
        t0 = time.monotonic()
        prom_groups: dict[str, float] = defaultdict(float)
        while time.monotonic() - t0 < seconds:
            time.sleep(min(5.0, seconds))
            for key, value in scrape_metrics(servers["prometheus-receiver"].url).items():
                if key.startswith("prometheus_rule_group_last_duration_seconds{"):
                    group = (label(key, "rule_group") or "").split(";")[-1]
                    prom_groups[group] = max(prom_groups[group], value)
        elapsed = time.monotonic() - t0
        cpu1 = {name: cpu_seconds(pid) for name, pid in pids.items()}
        vm1 = scrape_metrics(servers["victoria-metrics"].url)
        prom1 = scrape_metrics(servers["prometheus-receiver"].url)
        alert1 = scrape_metrics(servers["vmalert"].url)
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
        failed = sum(
            total(scrape_metrics(servers[f"vmagent-{m}"].url), "vm_promscrape_scrapes_failed_total") for m in (0, 1)
        )
        scrapes = sum(total(scrape_metrics(servers[f"vmagent-{m}"].url), "vm_promscrape_scrapes_total") for m in (0, 1))
        result = {
            "nodes": nodes,
            "interval_seconds": parse_duration(interval),
            "stack_up_seconds": round(up_after, 1),
            "series_per_node": per_node,
            "series_per_node_total": sum(per_node.values()),
            "series": {
                # VictoriaMetrics' own count: a count({job=...}) over 1.2 million series takes over 30 s here.
                "victoria-metrics": total(vm1, "vm_new_timeseries_created_total"),
                "prometheus": total(prom1, "prometheus_tsdb_head_series"),
            },
            "samples_per_second": {
                "victoria-metrics": (total(vm1, "vm_rows_inserted_total") - total(vm0, "vm_rows_inserted_total"))
                / elapsed,
                "prometheus": (
                    total(prom1, "prometheus_tsdb_head_samples_appended_total")
                    - total(prom0, "prometheus_tsdb_head_samples_appended_total")
                )
                / elapsed,
            },
            "rule_group_seconds": {"prometheus": dict(prom_groups), "vmalert": vmalert_groups},
            "targets_up": {path: (found[0]["value"] if found else 0) for path, found in up.items()},
            "vmagent_scrapes_failed": failed,
            "vmagent_scrapes": scrapes,
            "cpu_share": {name: (cpu1[name] - cpu0[name]) / elapsed for name in pids},
            "rss_bytes": {name: rss_bytes(pid) for name, pid in pids.items()},
            "measured_seconds": round(elapsed, 1),
        }
        return result
    finally:
        stack.stop()


def table(results: list[dict]) -> str:
    lines = [
        "| nodes | series/node | series (VM / Prom) | samples/s (VM / Prom) | slowest group, Prometheus | "
        "slowest group, vmalert (mean / p99) | targets up (VM / Prom) | fleet CPU | fleet RSS |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        prom = max(r["rule_group_seconds"]["prometheus"].items(), key=lambda kv: kv[1], default=("-", 0.0))
        vma = max(r["rule_group_seconds"]["vmalert"].items(), key=lambda kv: kv[1]["mean"] or 0.0, default=("-", {}))
        vm_mean = vma[1].get("mean") if vma[1] else None
        vm_p99 = vma[1].get("p99") if vma[1] else None
        lines.append(
            f"| {r['nodes']:,} | {r['series_per_node_total']:,} | {r['series']['victoria-metrics']:,.0f} / "
            f"{r['series']['prometheus']:,.0f} | {r['samples_per_second']['victoria-metrics']:,.0f} / "
            f"{r['samples_per_second']['prometheus']:,.0f} | {prom[0]} {prom[1] * 1000:,.0f} ms | "
            f"{vma[0]} {(vm_mean or 0) * 1000:,.0f} / {(vm_p99 or 0) * 1000:,.0f} ms | "
            f"{r['targets_up']['victoria-metrics']:.0f} / {r['targets_up']['prometheus']:.0f} | "
            f"{r['cpu_share']['fleet'] * 100:.0f} % | {r['rss_bytes']['fleet'] / 2**20:,.0f} MiB |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fleet", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="64,256,1024", help="comma-separated fleet sizes")
    parser.add_argument("--interval", default="15s", help="scrape, sample and evaluation interval")
    parser.add_argument("--warmup", type=float, default=60.0, help="seconds before measuring")
    parser.add_argument("--seconds", type=float, default=60.0, help="seconds measured")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="mfu-bench-fleet-") as tmp:
        for nodes in (int(n) for n in args.nodes.split(",")):
            print(f"bench-fleet: {nodes} nodes ...", file=sys.stderr, flush=True)
            result = measure(nodes, args.interval, args.warmup, args.seconds, Path(tmp))
            results.append(result)
            print(json.dumps(result, indent=1), file=sys.stderr, flush=True)
            if args.json:
                args.json.parent.mkdir(parents=True, exist_ok=True)
                args.json.write_text(json.dumps(results, indent=1))
    print(table(results))
    budget = parse_duration(args.interval) * TARGET_SHARE
    missed = [
        (r["nodes"], engine, group, seconds)
        for r in results
        for engine, groups in (
            ("prometheus", r["rule_group_seconds"]["prometheus"]),
            ("vmalert", {g: v["mean"] or 0.0 for g, v in r["rule_group_seconds"]["vmalert"].items()}),
        )
        for group, seconds in groups.items()
        if seconds > budget
    ]
    for nodes, engine, group, seconds in missed:
        print(f"target missed: {engine} {group} at {nodes} nodes: {seconds:.2f} s > {budget:.2f} s", file=sys.stderr)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
