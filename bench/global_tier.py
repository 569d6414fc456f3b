"""``make bench-global``: what the global tier of the rules costs when S shards of N nodes feed it (docs/scaling.md "Rules in
three tiers"), on VictoriaMetrics (vmagent → VictoriaMetrics → vmalert) and on Prometheus.

The global tier reads only the shards' per-job partial aggregates, so it is fed those and nothing else: the partials
one real shard recorded (``--partials``, a JSON list of ``{"metric": labels, "value": v}``, from ``bench.fleet
--partials-out``: a shard of 2,048 nodes with one job on every node, its incident on node 17), replayed as S shards:
each copy carries its own ``shard`` label and its nodes' own ``instance`` (node i of shard s is node s·N + i), and
only shard 0 keeps the incident (the other copies' network blame is dropped: their nodes only wait on it). A
loopback server serves them as an exposition; the engine scrapes it with ``honor_labels`` every interval, as a
global store receives remote-written partials, and evaluates ``mfu-exporter.rules.yaml`` and
``mfu-exporter.alerts.yaml``.

Measured per S (``--shards``, default 2, 4, 8), after ``--warmup``: each global rule group's mean iteration as the
engine saw it (vmalert's ``vmalert_iteration_duration_seconds``; Prometheus' ``prometheus_rule_group_last_duration_seconds``,
the mean over its iterations), the series the store holds, the load average; and the job's cluster MFU and cause (the
replay's truth: the shard's own MFU, network on node 17 of shard 0).

An engine's iteration of a global group is a few milliseconds, about the noise of one scheduling delay on a busy
machine, and a minute holds four of them: too few to tell 2 shards from 8 to within 20 %. So each group's queries are
also timed directly (``--query-repeats`` times, default 200): every rule's expression of the group, one after the
other as the engine runs them, through the store's HTTP query API at one fixed evaluation time, the groups
interleaved so that a change in the machine's load falls on all of them alike. Per group: the median, the 10th and
90th percentile and the minimum of those repetitions, and the median of a query that reads nothing (``vector(1)``),
the HTTP round trip every query pays; and the time the server itself spent on each query, without the round trip,
which is most of a query this small (Prometheus' ``stats=all``: ``execTotalTime``; VictoriaMetrics' ``trace=1``:
the trace's ``duration_msec``).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Sequence

import requests
import yaml

from bench.fleet import label, loadavg, prometheus_iterations, scrape_metrics
from mfu_exporter.quantities import parse_duration
from tests.support.fleet_harness import DEPLOY, FleetStack, Server, Store, _copy_config
from tests.support.prom_harness import GLOBAL_RULE_FILES
from tests.support.tools import require_tool

NODE = re.compile(r"/node/(\d+)$")


def with_window_denominators(partials: list[dict]) -> list[dict]:
    """Partials recorded before the per-window denominators (``..._peak_flops:sum_where_rate5m``, ``..._rate1m``)
    existed: those taken from the peak sum, which they equal while every node has a rate in the window."""
    names = {item["metric"]["__name__"] for item in partials}
    out = list(partials)
    for item in partials:
        if item["metric"]["__name__"] == "training_job_shard:mfu_job_peak_flops:sum":
            for window in ("rate5m", "rate1m"):
                name = f"training_job_shard:mfu_job_peak_flops:sum_where_{window}"
                if name not in names:
                    out.append({"metric": {**item["metric"], "__name__": name}, "value": item["value"]})
    return out


def rule_groups(files: Sequence[Path]) -> list[tuple[str, list[str]]]:
    """Every group of ``files``: its name and its rules' expressions, in order."""
    return [
        (group["name"], [rule["expr"] for rule in group["rules"]])
        for path in files
        for group in yaml.safe_load(path.read_text())["groups"]
    ]


def time_queries(url: str, groups: list[tuple[str, list[str]]], repeats: int, at: float) -> dict[str, Any]:
    """Each group's expressions run one after the other through ``url``'s query API, ``repeats`` times, the
    groups interleaved; per group the median, p10, p90 and minimum of its repetitions (seconds), as the client saw
    them and as the server spent them (Prometheus' ``stats=all``: ``execTotalTime``; VictoriaMetrics' ``trace=1``:
    its ``duration_msec``)."""
    session = requests.Session()

    def once(expr: str) -> tuple[float, float | None]:
        started = time.perf_counter()
        params = {"query": expr, "time": str(at), "stats": "all", "trace": "1"}
        response = session.get(f"{url}/api/v1/query", params=params, timeout=60)
        elapsed = time.perf_counter() - started
        body = response.json()
        if body.get("status") != "success":
            raise AssertionError(f"{url}: {expr}: {body.get('error')}")
        if "trace" in body:  # VictoriaMetrics
            return elapsed, body["trace"]["duration_msec"] / 1000
        timings = (body["data"].get("stats") or {}).get("timings") or {}
        return elapsed, timings.get("execTotalTime")

    floor = [once("vector(1)")[0] for _ in range(repeats)]
    seen: dict[str, list[float]] = {name: [] for name, _ in groups}
    spent: dict[str, list[float]] = {name: [] for name, _ in groups}
    for _ in range(repeats):
        for name, exprs in groups:
            times = [once(expr) for expr in exprs]
            seen[name].append(sum(client for client, _ in times))
            if all(server is not None for _, server in times):
                spent[name].append(sum(server or 0.0 for _, server in times))

    def summary(values: list[float]) -> dict[str, float]:
        deciles = statistics.quantiles(values, n=10)
        return {"median": statistics.median(values), "p10": deciles[0], "p90": deciles[-1], "min": min(values)}

    def total(by_group: dict[str, list[float]]) -> float:
        return statistics.median([sum(by_group[name][i] for name, _ in groups) for i in range(repeats)])

    served = all(len(values) == repeats for values in spent.values())
    return {
        "repeats": repeats,
        "round_trip_median": statistics.median(floor),
        "groups": {name: {"rules": len(exprs), **summary(seen[name])} for name, exprs in groups},
        "all_groups_median": total(seen),
        "server_groups": {name: summary(spent[name]) for name, _ in groups} if served else None,
        "server_all_groups_median": total(spent) if served else None,
    }


def replicate(partials: list[dict], shards: int, nodes: int) -> list[tuple[dict[str, str], float]]:
    """The partials of one shard as those of ``shards`` shards of ``nodes`` nodes each."""
    out = []
    for shard in range(shards):
        for item in partials:
            metric = dict(item["metric"])
            if shard and metric.get("cause") == "network":
                continue
            metric["shard"] = f"shard-{shard}"
            if "instance" in metric:
                metric["instance"] = NODE.sub(lambda m: f"/node/{int(m.group(1)) + shard * nodes}", metric["instance"])
            out.append((metric, float(item["value"])))
    return out


def exposition(series: list[tuple[dict[str, str], float]]) -> bytes:
    lines = []
    for metric, value in series:
        labels = ",".join(f'{k}="{v}"' for k, v in sorted(metric.items()) if k != "__name__")
        lines.append(f"{metric['__name__']}{{{labels}}} {value!r}")
    return ("\n".join(lines) + "\n").encode()


class PartialsServer:
    """Serves one exposition at /metrics on loopback."""

    def __init__(self, body: bytes) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def scrape_config(address: str, interval: str) -> dict:
    return {
        "global": {"scrape_interval": interval, "scrape_timeout": interval},
        "scrape_configs": [{"job_name": "shards", "honor_labels": True, "static_configs": [{"targets": [address]}]}],
    }


def measure(path: str, shards: int, nodes: int, partials: list[dict], args: argparse.Namespace, work: Path) -> dict:
    series = replicate(partials, shards, nodes)
    server = PartialsServer(exposition(series))
    stack = FleetStack(work / f"{path}-{shards}", nodes=0, interval=args.interval, paths=())
    stack.workdir.mkdir(parents=True, exist_ok=True)
    load0 = loadavg()
    try:
        config = scrape_config(server.address, args.interval)
        (stack.workdir / "scrape.yml").write_text(yaml.safe_dump(config))
        if path == "victoria-metrics":
            vm = stack._victoria_metrics("victoria-metrics", stack.workdir, data="data")
            vmagent = require_tool("vmagent", "victoria-metrics")
            stack._add(
                Server(
                    "vmagent",
                    stack.workdir,
                    lambda port: [
                        vmagent,
                        f"-promscrape.config={stack.workdir / 'scrape.yml'}",
                        f"-remoteWrite.url={vm.url}/api/v1/write",
                        f"-remoteWrite.tmpDataPath={stack.workdir / 'vmagent'}",
                        f"-httpListenAddr=127.0.0.1:{port}",
                        "-loggerLevel=WARN",
                    ],
                    "/health",
                )
            )
            values = {
                "-datasource.url": vm.url,
                "-remoteWrite.url": vm.url,
                "-remoteRead.url": vm.url,
                "-notifier.url": "http://127.0.0.1:1",
                "-evaluationInterval": args.interval,
                "-datasource.queryStep": f"{2.5 * parse_duration(args.interval):g}s",
            }
            alert = stack._vmalert("vmalert", stack.workdir, "vmalert-global.flags", values, GLOBAL_RULE_FILES)
            store, evaluator = Store(path, vm.url, alert.url), alert
        else:
            prometheus = require_tool("prometheus", "prometheus")

            def global_config(config: dict) -> None:
                config.update(scrape_config(server.address, args.interval))
                config["global"]["evaluation_interval"] = args.interval
                config["rule_files"] = [str(f) for f in GLOBAL_RULE_FILES]
                config.pop("alerting", None)

            config_file = _copy_config(DEPLOY / "prometheus-global.yaml", stack.workdir / "global.yml", global_config)
            evaluator = stack._add(
                Server(
                    "prometheus-global",
                    stack.workdir,
                    lambda port: [
                        prometheus,
                        f"--config.file={config_file}",
                        f"--storage.tsdb.path={stack.workdir / 'data'}",
                        f"--web.listen-address=127.0.0.1:{port}",
                        "--log.level=warn",
                    ],
                    "/-/ready",
                )
            )
            store = Store(path, evaluator.url, evaluator.url)
        time.sleep(args.warmup)
        before = scrape_metrics(evaluator.url)
        iterations: dict[str, dict[float, float]] = defaultdict(dict)
        t0 = time.monotonic()
        while time.monotonic() - t0 < args.seconds:
            time.sleep(parse_duration(args.interval) / 3)
            if path == "prometheus":
                prometheus_iterations(scrape_metrics(evaluator.url), iterations)
        after = scrape_metrics(evaluator.url)
        groups = {}
        if path == "victoria-metrics":
            for key, total in after.items():
                if key.startswith("vmalert_iteration_duration_seconds_sum{"):
                    count_key = key.replace("_sum{", "_count{")
                    count = after.get(count_key, 0.0) - before.get(count_key, 0.0)
                    groups[label(key, "group") or ""] = (total - before.get(key, 0.0)) / count if count else None
        else:
            groups = {group: sum(seen.values()) / len(seen) for group, seen in iterations.items()}
        timed = time_queries(store.url, rule_groups(GLOBAL_RULE_FILES), args.query_repeats, time.time())
        cause = store.query("training_job:mfu_bottleneck:cause")
        mfu = store.query("training_job:mfu_model_flops_utilization:ratio_rate1m")
        return {
            "path": path,
            "shards": shards,
            "nodes_per_shard": nodes,
            "nodes": shards * nodes,
            "partial_series_served": len(series),
            "stored_series": len(store.api("series", **{"match[]": '{__name__=~".+"}'})),
            "rule_group_mean_seconds": groups,
            "queries_timed": timed,
            "cluster_mfu": {s["metric"]["training_job"]: s["value"] for s in mfu},
            "cause": [s["metric"] for s in cause],
            "loadavg": {"before": load0, "after": loadavg()},
        }
    finally:
        stack.stop()
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.global_tier", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--partials", type=Path, required=True, help="one shard's partials (bench.fleet --partials-out)"
    )
    parser.add_argument("--nodes-per-shard", type=int, default=2048)
    parser.add_argument("--shards", default="2,4,8")
    parser.add_argument("--paths", default="victoria-metrics,prometheus")
    parser.add_argument("--interval", default="15s")
    parser.add_argument("--warmup", type=float, default=60.0)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument(
        "--query-repeats", type=int, default=200, help="times each group's queries are timed through the query API"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    partials = with_window_denominators(json.loads(args.partials.read_text()))
    results = []
    with tempfile.TemporaryDirectory(prefix="mfu-bench-global-") as tmp:
        for path in args.paths.split(","):
            for shards in (int(s) for s in args.shards.split(",")):
                print(f"bench-global: {path}, {shards} shards ...", file=sys.stderr, flush=True)
                results.append(measure(path, shards, args.nodes_per_shard, partials, args, Path(tmp)))
                print(json.dumps(results[-1], indent=1), file=sys.stderr, flush=True)
                if args.json:
                    args.json.write_text(json.dumps(results, indent=1))
    print(table(results))
    return 0


def table(results: list[dict]) -> str:
    """Per engine and shard count, each group's median query time (ms), and each group's 8-to-2-shard ratio."""
    groups = sorted({g for r in results for g in r["queries_timed"]["groups"]})
    short = [g.removeprefix("mfu-exporter.") for g in groups]
    lines = [
        "| engine | shards (nodes) | round trip | " + " | ".join(short) + " | all groups | load before → after |",
        "|---|---|---|" + "---|" * len(groups) + "---|---|",
    ]
    # The client's times through HTTP, and (Prometheus) the server's own: the same columns, ms.
    for kind, key, all_key in (
        ("client", "groups", "all_groups_median"),
        ("server", "server_groups", "server_all_groups_median"),
    ):
        rows = [r for r in results if r["queries_timed"].get(key)]
        for r in rows:
            timed = r["queries_timed"]
            cells = [f"{timed[key][g]['median'] * 1000:.2f}" if g in timed[key] else "–" for g in groups]
            lines.append(
                f"| {r['path']} ({kind}) | {r['shards']} ({r['nodes']:,}) | {timed['round_trip_median'] * 1000:.2f} | "
                + " | ".join(cells)
                + f" | {timed[all_key] * 1000:.2f} | {r['loadavg']['before'][0]:.1f} → "
                f"{r['loadavg']['after'][0]:.1f} |"
            )
        for path in sorted({r["path"] for r in rows}):
            by_shards = {r["shards"]: r["queries_timed"] for r in rows if r["path"] == path}
            if len(by_shards) < 2:
                continue
            low, high = min(by_shards), max(by_shards)
            ratios = [
                by_shards[high][key][g]["median"] / by_shards[low][key][g]["median"]
                if g in by_shards[high][key] and g in by_shards[low][key] and by_shards[low][key][g]["median"]
                else float("nan")
                for g in groups
            ]
            total = by_shards[high][all_key] / by_shards[low][all_key]
            lines.append(
                f"| {path} ({kind}) | {high} ÷ {low} shards | | "
                + " | ".join(f"{x:.2f}" for x in ratios)
                + f" | {total:.2f} | |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
