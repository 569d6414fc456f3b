"""A simulated fleet on two real distributed metrics paths, all on loopback, in temp directories.

- The fleet: ``mfu-exporter demo --nodes N`` as a subprocess, node i on 127.0.0.1:(base + i) (``source="demo"``,
  whole exporters, up to a few hundred nodes); or, for thousands, the target server of mfu_exporter/sim/targets.py
  (``source="targets"``): one port, node i at ``/node/<i>/metrics``, its ``instance`` set in the target list.
- The VictoriaMetrics path: two ``vmagent`` shards (``-promscrape.cluster.membersCount=2``, ``memberNum`` 0 and 1)
  scrape the nodes (deploy/fleet/vmagent-static.yaml) and remote-write to ``victoria-metrics``; ``vmalert``
  evaluates alerts/*.yaml unchanged against it and writes the recorded series and ALERTS back
  (deploy/fleet/vmalert.flags).
- The Prometheus path: ``prometheus --enable-feature=agent`` scrapes the same nodes (deploy/fleet/prometheus-agent.yaml) and
  remote-writes to a ``prometheus --web.enable-remote-write-receiver`` that evaluates the same rules
  (deploy/fleet/prometheus-receiver.yaml); or, with ``prometheus_mode="scrape"``, the deployed shard's shape: one
  Prometheus scrapes the nodes itself and evaluates the rules (deploy/fleet/prometheus-shard.yaml, one shard of one).
- Both send their alerts to a small loopback sink that keeps what it was sent, in place of an Alertmanager.

The deploy/fleet files are used as they are, copied with only the intervals, the rule paths and the addresses set to
the test's. ``python -m tests.support.fleet_harness --nodes 64`` (``make fleet``) starts it all and prints the UIs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import webbrowser
from contextlib import ExitStack
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Sequence

import requests
import yaml

from mfu_exporter.quantities import parse_duration
from mfu_exporter.sim.targets import TARGET_INCIDENTS, file_sd
from mfu_exporter.sim.targets import instance as target_instance
from tests.support.net import free_port
from tests.support.prom_harness import (
    GLOBAL_RULE_FILES,
    RULE_FILES,
    SHARD_RULE_FILES,
    ProcessFailed,
    log_tail,
    stop_process,
    wait_ready,
)
from tests.support.tools import require_tool

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "fleet"
SCRAPE_JOB = "mfu-exporter"
START_ATTEMPTS = 3


def free_port_range(count: int, low: int = 20000, high: int = 60000) -> int:
    """A base port with ``count`` consecutive ports free on 127.0.0.1 now (bound and released, one by one)."""
    span = high - low - count
    start = low + (os.getpid() * 7919 + int(time.time() * 1000)) % span
    for attempt in range(200):
        base = low + (start - low + attempt * 997) % span
        sockets = []
        try:
            for port in range(base, base + count):
                sock = socket.socket()
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sockets.append(sock)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise RuntimeError(f"no {count} consecutive free ports between {low} and {high}")


@dataclass
class Server:
    """One process of the stack, started on a free loopback port; ready once ``ready_path`` answers 200."""

    name: str
    workdir: Path
    command: Callable[[int], list[str]]
    ready_path: str
    process: subprocess.Popen | None = None
    port: int | None = None

    @property
    def log(self) -> Path:
        return self.workdir / f"{self.name}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0, port: int | None = None) -> "Server":
        self.workdir.mkdir(parents=True, exist_ok=True)
        for attempt in range(START_ATTEMPTS):
            self.port = port or free_port()
            with self.log.open("w") as log:
                self.process = subprocess.Popen(
                    self.command(self.port),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    cwd=self.workdir,
                )
            try:
                self._wait_ready(timeout)
                return self
            except ProcessFailed:
                self.stop()
                if attempt == START_ATTEMPTS - 1 or port or "address already in use" not in log_tail(self.log):
                    raise
        raise AssertionError("unreachable")

    def _wait_ready(self, timeout: float) -> None:
        assert self.process is not None
        wait_ready(self.process, self.url + self.ready_path, self.log, timeout, self.name)

    def stop(self) -> None:
        stop_process(self.process)

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid


class Store:
    """The Prometheus query API of one path's store (VictoriaMetrics or the receiving Prometheus)."""

    def __init__(self, name: str, url: str, alerts_url: str):
        self.name = name
        self.url = url
        self.alerts_url = alerts_url  # the rule evaluator's /api/v1/alerts (vmalert or the receiver)

    def api(self, path: str, **params: Any) -> Any:
        response = requests.get(f"{self.url}/api/v1/{path}", params=params, timeout=30)
        body = response.json()
        if body.get("status") != "success":
            raise AssertionError(f"{self.name} /api/v1/{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        params: dict[str, Any] = {"query": expr}
        if at is not None:
            params["time"] = at
        data = self.api("query", **params)
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": float(data["result"][1])}]
        return [{"metric": item["metric"], "value": float(item["value"][1])} for item in data["result"]]

    def query_range(self, expr: str, start: float, end: float, step: float = 2.0) -> list[dict]:
        return self.api("query_range", query=expr, start=start, end=end, step=step)["result"]

    def alerts(self) -> list[dict]:
        response = requests.get(f"{self.alerts_url}/api/v1/alerts", timeout=10)
        # vmalert answers null, not an empty list, while no alert is pending or firing.
        return response.json()["data"]["alerts"] or []


class AlertSink:
    """A loopback stand-in for Alertmanager: keeps every alert POSTed to /api/v1/alerts or /api/v2/alerts."""

    def __init__(self) -> None:
        self.received: list[dict] = []
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    sink.received.extend(json.loads(self.rfile.read(length) or b"[]"))
                except ValueError:
                    pass
                self.send_response(200)
                self.end_headers()

            def do_GET(self) -> None:
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _copy_config(source: Path, dest: Path, change: Callable[[dict], None]) -> Path:
    config = yaml.safe_load(source.read_text())
    change(config)
    dest.write_text(yaml.safe_dump(config, sort_keys=False))
    return dest


@dataclass
class FleetStack:
    """The fleet and both paths; ``start()`` returns once every process answers and the fleet is scraped."""

    workdir: Path
    nodes: int = 32
    incident: str | None = "pfc-storm"
    incident_node: int = 0
    interval: str = "2s"
    paths: Sequence[str] = ("victoria-metrics", "prometheus")
    fleet_args: Sequence[str] = ()
    source: str = "demo"  # or "targets": mfu_exporter/sim/targets.py serves the nodes
    rule_files: Sequence[Path] = RULE_FILES  # what vmalert and the receiver evaluate (one evaluator)
    # 0: one evaluator holds the fleet (every tier at once). N: three tiers, N shards each evaluating the node and
    # shard tiers over its share of the nodes, a global evaluator the global tier over their partial aggregates.
    shards: int = 0
    shard_rule_files: Sequence[Path] = SHARD_RULE_FILES
    # With one evaluator, the Prometheus path's shape: "agent" (an agent remote-writing every sample into a receiver
    # that evaluates) or "scrape" (one Prometheus scraping the nodes and evaluating, as a shard is deployed).
    prometheus_mode: str = "agent"
    global_rule_files: Sequence[Path] = GLOBAL_RULE_FILES
    servers: dict[str, Server] = field(default_factory=dict)
    stores: dict[str, Store] = field(default_factory=dict)  # per path: the global store (or the one store)
    shard_stores: dict[str, list[Store]] = field(default_factory=dict)  # per path, in tiers: each shard's
    base_port: int = 0
    started: float = 0.0
    sink: AlertSink | None = None
    _stack: ExitStack = field(default_factory=ExitStack)

    @property
    def targets(self) -> list[str]:
        """Every node's ``instance``, as the scrapers label its series."""
        if self.source == "targets":
            return [target_instance(i, f"127.0.0.1:{self.base_port}") for i in range(self.nodes)]
        return [f"127.0.0.1:{self.base_port + i}" for i in range(self.nodes)]

    def instance(self, node: int) -> str:
        return self.targets[node] if self.source == "targets" else f"127.0.0.1:{self.base_port + node}"

    def metrics_url(self, node: int) -> str:
        if self.source == "targets":
            return f"http://127.0.0.1:{self.base_port}/node/{node}/metrics"
        return f"http://127.0.0.1:{self.base_port + node}/metrics"

    def fleet_json(self) -> dict:
        return requests.get(f"http://127.0.0.1:{self.base_port}/api/v1/fleet", timeout=10).json()

    def _target_list(self) -> list[dict]:
        if self.source == "targets":
            return file_sd(self.nodes, f"127.0.0.1:{self.base_port}")
        return [{"targets": self.targets}]

    def _add(self, server: Server, timeout: float = 60.0, port: int | None = None) -> Server:
        self.servers[server.name] = server
        self._stack.callback(server.stop)
        return server.start(timeout, port)

    def start(self) -> "FleetStack":
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.sink = AlertSink()
        self._stack.callback(self.sink.stop)
        if self.source == "targets":
            self._start_targets()
        else:
            self._start_fleet()
        (self.workdir / "nodes.json").write_text(json.dumps(self._target_list()))
        if "victoria-metrics" in self.paths:
            self._start_victoria_metrics_tiers() if self.shards else self._start_victoria_metrics()
        if "prometheus" in self.paths:
            if self.shards:
                self._start_prometheus_tiers()
            elif self.prometheus_mode == "scrape":
                self._start_prometheus_scraping()
            else:
                self._start_prometheus()

    @property
    def prometheus_evaluator(self) -> str:
        """The name of the server that evaluates the rules on the Prometheus path (one evaluator)."""
        return "prometheus-shard" if self.prometheus_mode == "scrape" else "prometheus-receiver"

    def _start_fleet(self) -> None:
        incident = ["--incident", self.incident, "--incident-node", str(self.incident_node)] if self.incident else []
        for attempt in range(START_ATTEMPTS):
            self.base_port = free_port_range(self.nodes)

            def command(port: int) -> list[str]:
                return [
                    sys.executable,
                    "-m",
                    "mfu_exporter",
                    "demo",
                    "--nodes",
                    str(self.nodes),
                    "--web.listen-address",
                    f"127.0.0.1:{port}",
                    "--fleet.interval",
                    self.interval,
                    "--log.level",
                    "warning",
                    *incident,
                    *self.fleet_args,
                ]

            # Ready when the last node answers /api/v1/fleet: every site starts before the fleet says so.
            server = Server("fleet", self.workdir, command, "/readyz")
            try:
                self._add(server, timeout=120.0, port=self.base_port)
                last = f"http://127.0.0.1:{self.base_port + self.nodes - 1}/readyz"
                deadline = time.monotonic() + 60.0
                while time.monotonic() < deadline:
                    try:
                        if requests.get(last, timeout=1).status_code == 200:
                            break
                    except requests.RequestException:
                        pass
                    time.sleep(0.2)
                self.started = time.time()
                return
            except ProcessFailed:
                if attempt == START_ATTEMPTS - 1 or "cannot listen" not in log_tail(server.log):
                    raise

    def _start_targets(self) -> None:
        """The target server: it captures its nodes' expositions first (seconds), then listens."""
        if self.incident not in (None, *TARGET_INCIDENTS):
            raise ValueError(f"the target server serves {', '.join(TARGET_INCIDENTS)} only, not {self.incident}")
        incident = str(self.incident_node) if self.incident else "none"
        which = ["--incident", self.incident] if self.incident else []

        def command(port: int) -> list[str]:
            return [
                sys.executable,
                "-m",
                "mfu_exporter.sim.targets",
                "--nodes",
                str(self.nodes),
                "--listen",
                f"127.0.0.1:{port}",
                "--interval",
                self.interval,
                "--incident-node",
                incident,
                *which,
                *self.fleet_args,
            ]

        server = self._add(Server("fleet", self.workdir, command, "/healthz"), timeout=180.0)
        assert server.port is not None
        self.base_port = server.port
        self.started = time.time()

    def _start_victoria_metrics(self) -> None:
        vmagent = require_tool("vmagent", "victoria-metrics")
        vmalert = require_tool("vmalert", "victoria-metrics")
        work = self.workdir / "vm"
        work.mkdir(parents=True, exist_ok=True)
        vm = self._victoria_metrics("victoria-metrics", work, data="data")

        def interval(config: dict) -> None:
            config["global"]["scrape_interval"] = self.interval
            config["global"]["scrape_timeout"] = self.interval
            shutil.copy(self.workdir / "nodes.json", work / "nodes.json")

        scrape = _copy_config(DEPLOY / "vmagent-static.yaml", work / "vmagent.yaml", interval)
        for member in (0, 1):
            self._add(
                Server(
                    f"vmagent-{member}",
                    work,
                    lambda port, member=member: [
                        vmagent,
                        f"-promscrape.config={scrape}",
                        "-promscrape.cluster.membersCount=2",
                        f"-promscrape.cluster.memberNum={member}",
                        f"-remoteWrite.url={vm.url}/api/v1/write",
                        f"-remoteWrite.tmpDataPath={work / f'vmagent-{member}'}",
                        "-remoteWrite.flushInterval=1s",
                        f"-httpListenAddr=127.0.0.1:{port}",
                        "-loggerLevel=WARN",
                    ],
                    "/health",
                )
            )
        flags = [line for line in (DEPLOY / "vmalert.flags").read_text().splitlines() if line.startswith("-")]
        assert [f.split("=")[0] for f in flags] == [
            "-rule",
            "-rule",
            "-rule",
            "-rule",
            "-datasource.url",
            "-remoteWrite.url",
            "-remoteRead.url",
            "-notifier.url",
            "-evaluationInterval",
            "-datasource.queryStep",
        ], "deploy/fleet/vmalert.flags changed: update the harness"
        assert self.sink is not None
        sink = f"http://127.0.0.1:{self.sink.port}"
        alert = self._add(
            Server(
                "vmalert",
                work,
                lambda port: [
                    vmalert,
                    *(f"-rule={path}" for path in self.rule_files),
                    f"-datasource.url={vm.url}",
                    f"-remoteWrite.url={vm.url}",
                    f"-remoteRead.url={vm.url}",
                    f"-notifier.url={sink}",
                    f"-evaluationInterval={self.interval}",
                    f"-datasource.queryStep={2.5 * parse_duration(self.interval):g}s",
                    "-remoteWrite.flushInterval=1s",
                    f"-httpListenAddr=127.0.0.1:{port}",
                    "-loggerLevel=WARN",
                ],
                "/health",
            )
        )
        self.stores["victoria-metrics"] = Store("victoria-metrics", vm.url, alert.url)

    def _prometheus(
        self, name: str, work: Path, deploy_file: str, change: Callable[[dict], None], *flags: str
    ) -> Server:
        """A Prometheus from deploy/fleet/``deploy_file`` changed by ``change``; its data in ``<name without
        prometheus->-data``."""
        prometheus = require_tool("prometheus", "prometheus")
        short = name.removeprefix("prometheus-")
        config_file = _copy_config(DEPLOY / deploy_file, work / f"{short}.yml", change)
        return self._add(
            Server(
                name,
                work,
                lambda port: [
                    prometheus,
                    f"--config.file={config_file}",
                    *flags,
                    f"--storage.tsdb.path={work / f'{short}-data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--log.level=warn",
                ],
                "/-/ready",
            )
        )

    def _evaluating(self, config: dict, rule_files: Sequence[Path]) -> None:
        """A Prometheus config evaluating ``rule_files`` at the test's interval, its alerts to the sink."""
        assert self.sink is not None
        config["global"]["evaluation_interval"] = self.interval
        config["rule_files"] = [str(path) for path in rule_files]
        config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] = [f"127.0.0.1:{self.sink.port}"]

    def _prometheus_receiver(self, name: str, work: Path, deploy_file: str, rule_files: Sequence[Path]) -> Server:
        """A Prometheus taking remote writes and evaluating ``rule_files``, from deploy/fleet/``deploy_file`` with the
        test's interval, rule paths and alert sink."""
        return self._prometheus(
            name,
            work,
            deploy_file,
            lambda config: self._evaluating(config, rule_files),
            "--web.enable-remote-write-receiver",
        )

    def _start_prometheus(self) -> None:
        prometheus = require_tool("prometheus", "prometheus")
        work = self._prometheus_work()
        receiver = self._prometheus_receiver("prometheus-receiver", work, "prometheus-receiver.yaml", self.rule_files)

        def agent_config(config: dict) -> None:
            config["global"]["scrape_interval"] = self.interval
            config["global"]["scrape_timeout"] = self.interval
            config["remote_write"][0]["url"] = f"{receiver.url}/api/v1/write"
            config["remote_write"][0]["queue_config"]["batch_send_deadline"] = "250ms"

        agent_file = _copy_config(DEPLOY / "prometheus-agent.yaml", work / "agent.yml", agent_config)
        self._add(
            Server(
                "prometheus-agent",
                work,
                lambda port: [
                    prometheus,
                    "--enable-feature=agent",  # Prometheus 2.x; 3.x spells it --agent
                    f"--config.file={agent_file}",
                    f"--storage.agent.path={work / 'agent-data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--log.level=warn",
                ],
                "/-/ready",
            )
        )
        self.stores["prometheus"] = Store("prometheus", receiver.url, receiver.url)

    def _prometheus_work(self) -> Path:
        """The Prometheus path's folder, with the target list its scrape configs read."""
        work = self.workdir / "prom"
        work.mkdir(parents=True, exist_ok=True)
        shutil.copy(self.workdir / "nodes.json", work / "nodes.json")
        return work

    def _prometheus_shard(
        self, name: str, work: Path, rule_files: Sequence[Path], change: Callable[[dict], None]
    ) -> Server:
        """A Prometheus scraping nodes and evaluating ``rule_files`` from deploy/fleet/prometheus-shard.yaml, with the
        test's intervals (its scrape timeout no longer than the interval), rule paths and alert sink, then
        ``change``."""

        def shard_config(config: dict) -> None:
            timeout = min(parse_duration(config["global"]["scrape_timeout"]), parse_duration(self.interval))
            config["global"].update(scrape_interval=self.interval, scrape_timeout=f"{timeout:g}s")
            self._evaluating(config, rule_files)
            change(config)

        return self._prometheus(name, work, "prometheus-shard.yaml", shard_config)

    def _start_prometheus_scraping(self) -> None:
        """One Prometheus that scrapes every node itself and evaluates ``rule_files``: deploy/fleet/prometheus-shard.yaml
        as the one shard there is (modulus 1); nothing is remote-written, since the global files it evaluates read its
        own partials."""

        def alone(config: dict) -> None:
            del config["remote_write"]

        server = self._prometheus_shard("prometheus-shard", self._prometheus_work(), self.rule_files, alone)
        self.stores["prometheus"] = Store("prometheus", server.url, server.url)

    def _victoria_metrics(self, name: str, work: Path, data: str | None = None) -> Server:
        """A VictoriaMetrics whose queries see samples at once (the default hides the last 30 s, for late-arriving
        data) and are not cached: the tests ask about the last few seconds. -search.maxUniqueTimeseries is 300,000
        by default: 256 nodes of ~1,200 series already exceed it in one query."""
        vm_binary = require_tool("victoria-metrics", "victoria-metrics")
        return self._add(
            Server(
                name,
                work,
                lambda port: [
                    vm_binary,
                    f"-storageDataPath={work / (data or name + '-data')}",
                    f"-httpListenAddr=127.0.0.1:{port}",
                    "-retentionPeriod=1d",
                    "-search.latencyOffset=0s",
                    "-search.disableCache",
                    "-search.maxUniqueTimeseries=20000000",
                    "-loggerLevel=WARN",
                ],
                "/health",
            )
        )

    def _vmalert(self, name: str, work: Path, flags_file: str, values: dict[str, str], rules: Sequence[Path]) -> Server:
        """vmalert with the flags of deploy/fleet/``flags_file``, each address and interval set to the test's."""
        vmalert = require_tool("vmalert", "victoria-metrics")
        flags = [line for line in (DEPLOY / flags_file).read_text().splitlines() if line.startswith("-")]
        names = [flag.split("=")[0] for flag in flags]
        assert set(names) - {"-rule"} == set(values), f"deploy/fleet/{flags_file} changed: update the harness"
        return self._add(
            Server(
                name,
                work,
                lambda port: [
                    vmalert,
                    *(f"-rule={path}" for path in rules),
                    *(f"{flag}={value}" for flag, value in values.items()),
                    "-remoteWrite.flushInterval=1s",
                    f"-httpListenAddr=127.0.0.1:{port}",
                    "-loggerLevel=WARN",
                ],
                "/health",
            )
        )

    def _start_victoria_metrics_tiers(self) -> None:
        """Per shard a VictoriaMetrics, a vmagent scraping its share (cluster membership) and writing everything
        there and the partials to the global VictoriaMetrics, and a vmalert (node and shard tiers) writing through
        that vmagent; a global vmalert (global tier). deploy/fleet/vmalert-shard.flags and vmalert-global.flags."""
        vmagent = require_tool("vmagent", "victoria-metrics")
        work = self.workdir / "vm"
        work.mkdir(parents=True, exist_ok=True)
        shutil.copy(self.workdir / "nodes.json", work / "nodes.json")
        assert self.sink is not None
        sink = f"http://127.0.0.1:{self.sink.port}"
        step = f"{2.5 * parse_duration(self.interval):g}s"
        vm_global = self._victoria_metrics("vm-global", work)

        def interval(config: dict) -> None:
            config["global"]["scrape_interval"] = self.interval
            config["global"]["scrape_timeout"] = self.interval

        scrape = _copy_config(DEPLOY / "vmagent-static.yaml", work / "vmagent.yaml", interval)
        partials = DEPLOY / "vmagent-shard-partials.yaml"
        self.shard_stores["victoria-metrics"] = []
        for shard in range(self.shards):
            vm = self._victoria_metrics(f"vm-shard-{shard}", work)
            agent = self._add(
                Server(
                    f"vmagent-{shard}",
                    work,
                    lambda port, shard=shard, vm=vm: [
                        vmagent,
                        f"-promscrape.config={scrape}",
                        f"-promscrape.cluster.membersCount={self.shards}",
                        f"-promscrape.cluster.memberNum={shard}",
                        # The global store first: a relabel config applies to the -remoteWrite.url of its rank, and
                        # an empty one for the shard's own store would be dropped from the list.
                        f"-remoteWrite.url={vm_global.url}/api/v1/write",
                        f"-remoteWrite.urlRelabelConfig={partials}",
                        f"-remoteWrite.url={vm.url}/api/v1/write",
                        f"-remoteWrite.tmpDataPath={work / f'vmagent-{shard}'}",
                        "-remoteWrite.flushInterval=1s",
                        f"-httpListenAddr=127.0.0.1:{port}",
                        "-loggerLevel=WARN",
                    ],
                    "/health",
                )
            )
            values = {
                "-datasource.url": vm.url,
                "-remoteWrite.url": agent.url,
                "-remoteRead.url": vm.url,
                "-notifier.url": sink,
                "-external.label": f"shard=shard-{shard}",
                "-evaluationInterval": self.interval,
                "-datasource.queryStep": step,
            }
            alert = self._vmalert(f"vmalert-shard-{shard}", work, "vmalert-shard.flags", values, self.shard_rule_files)
            self.shard_stores["victoria-metrics"].append(Store(f"victoria-metrics shard {shard}", vm.url, alert.url))
        values = {
            "-datasource.url": vm_global.url,
            "-remoteWrite.url": vm_global.url,
            "-remoteRead.url": vm_global.url,
            "-notifier.url": sink,
            "-evaluationInterval": self.interval,
            "-datasource.queryStep": step,
        }
        alert = self._vmalert("vmalert", work, "vmalert-global.flags", values, self.global_rule_files)
        self.stores["victoria-metrics"] = Store("victoria-metrics", vm_global.url, alert.url)

    def _start_prometheus_tiers(self) -> None:
        """A Prometheus per shard (its share of the nodes by hashmod, node and shard tiers, the partials
        remote-written) and a global receiver (global tier): deploy/fleet/prometheus-shard.yaml and
        prometheus-global.yaml."""
        work = self._prometheus_work()
        receiver = self._prometheus_receiver(
            "prometheus-global", work, "prometheus-global.yaml", self.global_rule_files
        )
        self.shard_stores["prometheus"] = []
        for shard in range(self.shards):

            def share(config: dict, shard: int = shard) -> None:
                config["global"]["external_labels"]["shard"] = f"shard-{shard}"
                relabel = config["scrape_configs"][0]["relabel_configs"]
                relabel[0]["modulus"], relabel[1]["regex"] = self.shards, str(shard)
                config["remote_write"][0]["url"] = f"{receiver.url}/api/v1/write"
                config["remote_write"][0]["queue_config"] = {"batch_send_deadline": "250ms"}

            server = self._prometheus_shard(f"prometheus-shard-{shard}", work, self.shard_rule_files, share)
            self.shard_stores["prometheus"].append(Store(f"prometheus shard {shard}", server.url, server.url))
        self.stores["prometheus"] = Store("prometheus", receiver.url, receiver.url)

    def stop(self) -> None:
        self._stack.close()


# The checks the fleet's end-to-end tests share (tests/e2e/test_fleet.py, one evaluator; test_tiers.py, three tiers).
DEADLINE = 120.0  # seconds after the fleet is up; on an idle machine everything shows within ~60 s
RECENT = "5s"  # a little over two 2 s evaluations
# The stretch over which recorded and simulated MFU are averaged: on a busy machine one burst of late reports moves a
# 1-minute rate by a point or more, which twenty evaluations 2 s apart average out better than ten.
COMPARE_SECONDS = 40.0


def wait(
    stack: FleetStack, predicate: Callable[[], Any], what: str, interval: float = 1.0, deadline: float = DEADLINE
) -> Any:
    """Until ``predicate`` answers something, up to ``deadline`` seconds after the fleet came up."""
    last = None
    while True:
        try:
            last = predicate()
        except requests.RequestException as exc:
            last = exc
        if last and not isinstance(last, Exception):
            return last
        if time.time() > stack.started + deadline:
            raise AssertionError(f"timed out waiting for {what}; last answer: {last!r}")
        time.sleep(interval)


def recent(store: Store, selector: str) -> list[dict]:
    return store.query(f"last_over_time({selector}[{RECENT}])")


def wait_for_network_on_the_incident_node(stack: FleetStack, store: Store, path: str, incident_node: int) -> None:
    """Until the incident job's recorded cause is network on the incident node, and MfuLow (pending) says so."""
    job = incident_job(stack)
    node = stack.instance(incident_node)
    seen: list = []

    def cause() -> bool:
        found = recent(store, f'training_job:mfu_bottleneck:cause{{training_job="{job}"}}')
        seen[:] = [(s["metric"].get("cause"), s["metric"].get("instance")) for s in found]
        return seen == [("network", node)]

    wait(stack, cause, f"{path}: cause network on {node} for {job} (last seen: {seen})")

    def described() -> str | None:
        for alert in store.alerts():
            if alert["labels"].get("alertname") == "MfuLow" and alert["labels"].get("training_job") == job:
                text = alert["annotations"]["description"]
                if f"likely cause: network (worst node {node})" in text:
                    return text
        return None

    wait(stack, described, f"{path}: MfuLow for {job} naming the network and {node}")


def incident_job(stack: FleetStack) -> str:
    return stack.fleet_json()["incident"]["job"]


def true_mfu(job: dict, start: float, end: float) -> float:
    """The simulator's MFU of ``job`` over [start, end], from its tokens (node-local, every node alike)."""
    points = [(t, tokens) for t, tokens in job["tokens"] if start <= t <= end]
    (t0, k0), (t1, k1) = points[0], points[-1]
    return job["flops_per_token"] * (k1 - k0) / (t1 - t0) / (job["gpus_per_node"] * job["peak_flops_per_gpu"])


def _serves(url: str) -> bool:
    """Whether a GET of ``url`` answers 200 (the fleet's servers are all on loopback)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status == 200
    except (OSError, ValueError):
        return False


def main(argv: Sequence[str] | None = None) -> int:
    """``make fleet``: the fleet, both paths, their UIs printed (and opened where a browser is), until Ctrl-C."""
    parser = argparse.ArgumentParser(prog="python -m tests.support.fleet_harness", description=main.__doc__)
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--incident", default="pfc-storm")
    parser.add_argument("--incident-node", type=int, default=0)
    parser.add_argument("--interval", default="5s", help="scrape, sample and rule evaluation interval")
    parser.add_argument("--path", choices=("victoria-metrics", "prometheus", "both"), default="both")
    parser.add_argument("--no-browser", action="store_true")
    args = parser.parse_args(argv)
    paths = ("victoria-metrics", "prometheus") if args.path == "both" else (args.path,)
    workdir = Path(tempfile.mkdtemp(prefix="mfu-fleet-stack-"))
    stack = FleetStack(
        workdir,
        nodes=args.nodes,
        incident=args.incident or None,
        incident_node=args.incident_node,
        interval=args.interval,
        paths=paths,
    )
    try:
        stack.start()
        first = f"http://127.0.0.1:{stack.base_port}/"
        print(f"fleet: {args.nodes} nodes, {first} ... port {stack.base_port + args.nodes - 1}", flush=True)
        print(f"  truth              {first}api/v1/fleet", flush=True)
        ui = None
        if "victoria-metrics" in stack.servers:
            base = stack.servers["victoria-metrics"].url
            if _serves(f"{base}/vmui/"):
                ui = f"{base}/vmui/"
                print(f"  VictoriaMetrics    {ui}", flush=True)
            else:  # Debian's package is built without vmui's assets: its API and status pages only
                print(f"  VictoriaMetrics    {base}/ (API and status pages; this build has no vmui)", flush=True)
            print(f"  vmalert            {stack.servers['vmalert'].url}/", flush=True)
            for member in (0, 1):
                print(f"  vmagent shard {member}    {stack.servers[f'vmagent-{member}'].url}/targets", flush=True)
        if "prometheus-receiver" in stack.servers:
            url = f"{stack.servers['prometheus-receiver'].url}/graph"
            ui = ui or url
            print(f"  Prometheus         {url} and /alerts (receiver, runs the rules)", flush=True)
            print(f"  Prometheus agent   {stack.servers['prometheus-agent'].url}/targets", flush=True)
        print(f"  files              {workdir}", flush=True)
        print("  try: training_job:mfu_model_flops_utilization:ratio_rate1m, training_job:mfu_bottleneck:cause")
        print("  Ctrl-C stops it all.", flush=True)
        if ui and not args.no_browser and os.environ.get("DISPLAY"):
            webbrowser.open(ui)
        while all(s.process is not None and s.process.poll() is None for s in stack.servers.values()):
            time.sleep(1.0)
        print("a process of the stack exited; see its log in", workdir, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        stack.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
