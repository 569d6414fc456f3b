"""``make bench-global``: what the global tier of the rules costs when S shards of N nodes feed it (README "Rules in
three tiers"), on VictoriaMetrics (vmagent → VictoriaMetrics → vmalert) and on Prometheus.

The global tier reads only the shards' per-job partial aggregates, so it is fed those and nothing else: the partials
one real shard recorded (``--partials``, a JSON list of ``{"metric": labels, "value": v}``, from ``bench.fleet
--partials-out``: a shard of 2,048 nodes with one job on every node, its incident on node 17), replayed as S shards:
each copy carries its own ``shard`` label and its nodes' own ``instance`` (node i of shard s is node s·N + i), and
only shard 0 keeps the incident (the other copies' network blame is dropped: their nodes only wait on it). A
loopback server serves them as an exposition; the engine scrapes it with ``honor_labels`` every interval, as a
global store receives remote-written partials, and evaluates ``mfu-exporter.rules.yaml`` and
``mfu-exporter.alerts.yaml``.

Measured per S (``--shards``, default 2, 4, 8), after ``--warmup``: each global rule group's mean iteration
(vmalert's ``vmalert_iteration_duration_seconds``; Prometheus' ``prometheus_rule_group_last_duration_seconds``, the
mean of the values seen), the series the store holds, the load average; and the job's cluster MFU and cause (the
replay's truth: the shard's own MFU, network on node 17 of shard 0).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from bench.fleet import label, loadavg, scrape_metrics
from exporter.quantities import parse_duration
from tests.support.fleet_harness import DEPLOY, FleetStack, Server, Store, _copy_config
from tests.support.prom_harness import GLOBAL_RULE_FILES
from tests.support.tools import require_tool

NODE = re.compile(r"/node/(\d+)$")


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
        seen: dict[str, list[float]] = {}
        t0 = time.monotonic()
        while time.monotonic() - t0 < args.seconds:
            time.sleep(parse_duration(args.interval))
            for key, value in scrape_metrics(evaluator.url).items():
                if key.startswith("prometheus_rule_group_last_duration_seconds{"):
                    seen.setdefault((label(key, "rule_group") or "").split(";")[-1], []).append(value)
        after = scrape_metrics(evaluator.url)
        groups = {}
        if path == "victoria-metrics":
            for key, total in after.items():
                if key.startswith("vmalert_iteration_duration_seconds_sum{"):
                    count_key = key.replace("_sum{", "_count{")
                    count = after.get(count_key, 0.0) - before.get(count_key, 0.0)
                    groups[label(key, "group") or ""] = (total - before.get(key, 0.0)) / count if count else None
        else:
            groups = {group: sum(values) / len(values) for group, values in seen.items()}
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
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    partials = json.loads(args.partials.read_text())
    results = []
    with tempfile.TemporaryDirectory(prefix="mfu-bench-global-") as tmp:
        for path in args.paths.split(","):
            for shards in (int(s) for s in args.shards.split(",")):
                print(f"bench-global: {path}, {shards} shards ...", file=sys.stderr, flush=True)
                results.append(measure(path, shards, args.nodes_per_shard, partials, args, Path(tmp)))
                print(json.dumps(results[-1], indent=1), file=sys.stderr, flush=True)
                if args.json:
                    args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
