"""A real Prometheus and a real exporter process for end-to-end tests, both on free loopback ports.

    def test_something(start_exporter, start_prometheus):
        exporter = start_exporter(no_sources_config())
        prometheus = start_prometheus(rule_files=[RULES], scrape_jobs={"mfu-exporter": [exporter.address]})
        prometheus.wait_for('up{job="mfu-exporter"} == 1')
        prometheus.query("training_job:mfu_model_flops_utilization:ratio_rate1m")

Prometheus is Debian's (``/usr/bin/prometheus``, package ``prometheus``), started with a temp config (1 s scrape and
evaluation interval by default), its own temp storage and ``--web.listen-address=127.0.0.1:PORT``. Both processes
are stopped by PID when the test ends. Import the fixtures into a test module to use them:
``from tests.support.prom_harness import start_exporter, start_prometheus``.
"""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence
from urllib.parse import urlsplit

import promql_parser
import pytest
import requests
import yaml

from mfu_exporter.config import SCHEMA
from tests.support.demo_harness import running_demo
from tests.support.net import free_port
from tests.support.tools import require_tool

ROOT = Path(__file__).resolve().parents[2]
# The rules in three tiers (docs/scaling.md "Rules in three tiers"): the global files read only the shard file's partial
# aggregates; the shard file reads the nodes' summaries and job series; the node file a device's own series.
GLOBAL_RULE_FILES = (ROOT / "alerts" / "mfu-exporter.rules.yaml", ROOT / "alerts" / "mfu-exporter.alerts.yaml")
SHARD_RULE_FILE = ROOT / "alerts" / "mfu-exporter.shard.yaml"
NODE_RULE_FILE = ROOT / "alerts" / "mfu-exporter.node.yaml"
SHARD_RULE_FILES = (SHARD_RULE_FILE, NODE_RULE_FILE)  # what a shard's evaluator loads
RULE_FILES = (*GLOBAL_RULE_FILES, SHARD_RULE_FILE, NODE_RULE_FILE)  # one evaluator for the whole fleet: all four
METRICS_DOC = ROOT / "docs" / "metrics.md"
SCRAPE_JOB = "mfu-exporter"  # the name the alerts select on (MfuExporterDown)
START_ATTEMPTS = 3  # a free port can be taken between finding it and binding it


class ProcessFailed(Exception):
    pass


def listening_addresses(pid: int) -> list[str]:
    """Local addresses the process ``pid`` listens on for TCP (from ``ss``), such as ``127.0.0.1:9090``."""
    ss = require_tool("ss", "iproute2")
    output = subprocess.run([ss, "-Hltnp"], capture_output=True, text=True, timeout=10, check=True).stdout
    return [line.split()[3] for line in output.splitlines() if f"pid={pid}," in line]


def log_tail(path: Path, lines: int = 30) -> str:
    """The last lines of a server's log, for the error that says why it did not start."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def wait_ready(process: subprocess.Popen, url: str, log: Path, timeout: float, name: str | None = None) -> None:
    """Until ``url`` answers 200; ProcessFailed with the log's tail when the process exits or the time runs out."""
    deadline = time.monotonic() + timeout
    name = name or str(process.args[0])
    while True:
        if process.poll() is not None:
            raise ProcessFailed(f"{name} exited with {process.returncode}:\n{log_tail(log)}")
        try:
            if requests.get(url, timeout=1).status_code == 200:
                return
        except requests.RequestException:
            pass
        if time.monotonic() > deadline:
            raise ProcessFailed(f"{name}: {url} not ready after {timeout:g}s:\n{log_tail(log)}")
        time.sleep(0.1)


def stop_process(process: subprocess.Popen | None) -> None:
    """SIGTERM, then SIGKILL after 10 s; nothing for a process that is gone already."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


def _start_on_free_port(
    launch: Callable[[int], tuple[subprocess.Popen, str, Path]], timeout: float
) -> tuple[subprocess.Popen, int]:
    """Start a server with ``launch(port)``; on a port taken meanwhile, try again on another."""
    attempts_left = START_ATTEMPTS
    while True:
        port = free_port()
        process, ready_url, log = launch(port)
        try:
            wait_ready(process, ready_url, log, timeout)
            return process, port
        except ProcessFailed:
            stop_process(process)
            attempts_left -= 1
            if attempts_left == 0 or "address already in use" not in log_tail(log):
                raise


class Prometheus:
    """One Prometheus server; ``start()`` returns it once ``/-/ready`` answers."""

    def __init__(
        self,
        binary: str,
        workdir: Path,
        rule_files: Sequence[Path] = (),
        scrape_jobs: dict[str, list[str]] | None = None,
        scrape_interval: str = "1s",
        evaluation_interval: str = "1s",
        alertmanagers: Sequence[str] = (),
        flags: Sequence[str] = (),
    ):
        self.binary = binary
        self.workdir = workdir
        self.rule_files = [Path(p).resolve() for p in rule_files]
        self.scrape_jobs = scrape_jobs or {}
        self.scrape_interval = scrape_interval
        self.evaluation_interval = evaluation_interval
        self.alertmanagers = list(alertmanagers)  # host:port of each Alertmanager the alerts go to
        self.flags = list(flags)
        self.process: subprocess.Popen | None = None
        self.port: int | None = None
        self.log = workdir / "prometheus.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> dict:
        config = {
            "global": {
                "scrape_interval": self.scrape_interval,
                "scrape_timeout": self.scrape_interval,
                "evaluation_interval": self.evaluation_interval,
            },
            "rule_files": [str(p) for p in self.rule_files],
            "scrape_configs": [
                {"job_name": name, "static_configs": [{"targets": list(targets)}]}
                for name, targets in self.scrape_jobs.items()
            ],
        }
        if self.alertmanagers:
            config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": self.alertmanagers}]}]}
        return config

    def start(self, timeout: float = 30.0) -> "Prometheus":
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "prometheus.yml"
        config.write_text(yaml.safe_dump(self.config(), sort_keys=False))
        self.config_file = config

        def launch(port: int) -> tuple[subprocess.Popen, str, Path]:
            with self.log.open("w") as log:
                process = subprocess.Popen(
                    [
                        self.binary,
                        f"--config.file={config}",
                        f"--storage.tsdb.path={self.workdir / 'data'}",
                        f"--web.listen-address=127.0.0.1:{port}",
                        "--log.level=warn",
                        *self.flags,
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    cwd=self.workdir,
                )
            return process, f"http://127.0.0.1:{port}/-/ready", self.log

        self.process, self.port = _start_on_free_port(launch, timeout)
        return self

    def stop(self) -> None:
        stop_process(self.process)

    def reload(self, rule_files: Sequence[Path]) -> None:
        """Load ``rule_files`` instead (the config rewritten, then SIGHUP); returns once every group is loaded."""
        self.rule_files = [Path(p).resolve() for p in rule_files]
        self.config_file.write_text(yaml.safe_dump(self.config(), sort_keys=False))
        assert self.process is not None
        self.process.send_signal(signal.SIGHUP)
        wanted = {group["name"] for path in self.rule_files for group in yaml.safe_load(path.read_text())["groups"]}
        deadline = time.monotonic() + 30
        while {group["name"] for group in self.api("rules")["groups"]} != wanted:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise ProcessFailed(f"prometheus did not load {len(wanted)} rule groups:\n{log_tail(self.log)}")
            time.sleep(0.05)

    def api(self, path: str, **params: Any) -> Any:
        """``GET /api/v1/<path>``'s ``data``; an API error raises with Prometheus's message."""
        response = requests.get(f"{self.url}/api/v1/{path}", params=params, timeout=10)
        body = response.json()
        if body.get("status") != "success":
            raise AssertionError(f"/api/v1/{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        """The instant vector ``expr`` gives now (or at ``at``): a list of ``{"metric": {...}, "value": float}``."""
        params = {"query": expr} if at is None else {"query": expr, "time": at}
        data = self.api("query", **params)
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": float(data["result"][1])}]
        return [{"metric": item["metric"], "value": float(item["value"][1])} for item in data["result"]]

    def wait_for(self, expr: str, timeout: float = 30.0, interval: float = 0.5) -> list[dict]:
        """Poll until ``expr`` returns at least one series; returns them."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(expr)
            if result:
                return result
            if time.monotonic() > deadline:
                raise AssertionError(f"no series for {expr!r} after {timeout:g}s; targets: {self.target_health()}")
            time.sleep(interval)

    def target_health(self) -> list[tuple[str, str, str]]:
        return [
            (t["labels"].get("job", ""), t["health"], t.get("lastError", ""))
            for t in self.api("targets")["activeTargets"]
        ]

    def rule_health(self) -> list[tuple[str, str, str]]:
        """(rule name, health, last error) of every loaded rule."""
        return [
            (rule["name"], rule["health"], rule.get("lastError", ""))
            for group in self.api("rules")["groups"]
            for rule in group["rules"]
        ]

    def alerts(self) -> list[dict]:
        return self.api("alerts")["alerts"]


class Exporter:
    """``python -m mfu_exporter run`` as a process on a free loopback port; ``start()`` returns it once ``/readyz`` answers."""

    def __init__(self, workdir: Path, config: dict, extra_args: Sequence[str] = ()):
        self.workdir = workdir
        self.config = config
        self.extra_args = list(extra_args)
        self.process: subprocess.Popen | None = None
        self.port: int | None = None
        self.log = workdir / "exporter.log"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def start(self, timeout: float = 30.0) -> "Exporter":
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "config.yaml"
        config.write_text(yaml.safe_dump(self.config, sort_keys=False))

        def launch(port: int) -> tuple[subprocess.Popen, str, Path]:
            with self.log.open("w") as log:
                process = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "mfu_exporter",
                        "run",
                        "--config",
                        str(config),
                        "--web.listen-address",
                        f"127.0.0.1:{port}",
                        *self.extra_args,
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    cwd=ROOT,
                )
            return process, f"http://127.0.0.1:{port}/readyz", self.log

        self.process, self.port = _start_on_free_port(launch, timeout)
        return self

    def stop(self) -> None:
        stop_process(self.process)

    def jobs(self) -> dict[str, dict]:
        response = requests.get(f"{self.url}/api/v1/jobs", timeout=5)
        response.raise_for_status()
        return {job["job"]: job for job in response.json()["jobs"]}


def no_sources_config(**sections: Any) -> dict:
    """An exporter config with every source switched off (nothing touches this machine's hardware), plus ``sections``."""
    source_names = SCHEMA.fields["sources"][0].fields
    # Evaluated every second, as Prometheus here scrapes it: the rules' windows are cut to seconds.
    return {"sources": {name: {"enabled": False} for name in source_names}, "mfu": {"interval": "1s"}, **sections}


RANGE = re.compile(r"\[(\d+[smhdwy])\]")
SUBQUERY = re.compile(r"\[(\d+[smhdwy]):(\d+[smhdwy])\]")


def derived_rules(
    source: Path,
    dest: Path,
    *,
    ranges: dict[str, str] | None = None,
    for_: str | None = None,
    steps: dict[str, str] | None = None,
) -> Path:
    """A copy of the rule file ``source`` with range selectors (``{"5m": "15s"}``) and every ``for:`` replaced.

    End-to-end tests cannot wait five minutes for a rate window or fifteen for an alert; they run the real rules
    with shorter windows, derived here from the real file rather than written a second time by hand. With ``steps``,
    the subqueries' resolutions (``[1h:1m]``) are replaced too, and every group runs at the evaluator's interval
    (the hour-long windows' groups run once a minute otherwise: a test of a minute or two may see none of them).
    """
    ranges = ranges or {}
    document = yaml.safe_load(source.read_text())
    for group in document["groups"]:
        if steps is not None:
            group.pop("interval", None)
        for rule in group["rules"]:
            rule["expr"] = RANGE.sub(lambda m: f"[{ranges.get(m.group(1), m.group(1))}]", rule["expr"])
            if steps is not None:
                rule["expr"] = SUBQUERY.sub(
                    lambda m: f"[{m.group(1)}:{steps.get(m.group(2), m.group(2))}]", rule["expr"]
                )
            if for_ is not None and "for" in rule:
                rule["for"] = for_
    dest.write_text(yaml.safe_dump(document, sort_keys=False))
    return dest


def promql_nodes(node: Any, calls: tuple[str, ...] = ()) -> Iterable[tuple[Any, tuple[str, ...]]]:
    """Every node of a parsed PromQL expression with the functions it is an argument of, outermost first."""
    yield node, calls
    if isinstance(node, promql_parser.Call):
        for arg in node.args:
            yield from promql_nodes(arg, calls + (node.func.name,))
    elif isinstance(node, promql_parser.BinaryExpr):
        yield from promql_nodes(node.lhs, calls)
        yield from promql_nodes(node.rhs, calls)
    elif isinstance(node, promql_parser.AggregateExpr):
        if node.param is not None:
            yield from promql_nodes(node.param, calls)
        yield from promql_nodes(node.expr, calls)
    elif isinstance(node, (promql_parser.ParenExpr, promql_parser.UnaryExpr, promql_parser.SubqueryExpr)):
        yield from promql_nodes(node.expr, calls)
    elif isinstance(node, promql_parser.MatrixSelector):
        yield from promql_nodes(node.vector_selector, calls)


def metric_names(expr: str) -> set[str]:
    """Names of the series an expression selects."""
    return {
        node.name
        for node, _ in promql_nodes(promql_parser.parse(expr))
        if isinstance(node, promql_parser.VectorSelector) and node.name
    }


DOC_ROW = re.compile(r"^\|\s*`((?:mfu|process)_[a-z0-9_]+)`\s*\|\s*([^|]*?)\s*\|\s*([^|]*?)\s*\|")
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def documented_metrics() -> dict[str, set[str]]:
    """Every series name docs/metrics.md documents, with its labels (histograms with their three series)."""
    documented: dict[str, set[str]] = {}
    for line in METRICS_DOC.read_text().splitlines():
        row = DOC_ROW.match(line)
        if not row:
            continue
        name, kind, labels = row.groups()
        label_set = set(re.findall(r"`([a-z_]+)`", labels))
        documented[name] = label_set
        if "histogram" in kind:
            for suffix in HISTOGRAM_SUFFIXES:
                documented[name + suffix] = label_set | ({"le"} if suffix == "_bucket" else set())
    return documented


def _stop_all(servers: Iterable[Prometheus | Exporter]) -> None:
    for server in servers:
        server.stop()


@pytest.fixture
def start_prometheus(tmp_path: Path):
    """``start_prometheus(rule_files=..., scrape_jobs={"job": ["127.0.0.1:PORT"]}, ...)`` -> a running Prometheus."""
    binary = require_tool("prometheus", "prometheus")
    started: list[Prometheus] = []

    def start(**options: Any) -> Prometheus:
        server = Prometheus(binary, tmp_path / f"prometheus-{len(started)}", **options)
        started.append(server)
        return server.start()

    yield start
    _stop_all(started)


@pytest.fixture
def start_exporter(tmp_path: Path):
    """``start_exporter(config_dict, extra_args=[...])`` -> a running exporter process."""
    started: list[Exporter] = []

    def start(config: dict, extra_args: Sequence[str] = ()) -> Exporter:
        server = Exporter(tmp_path / f"exporter-{len(started)}", config, extra_args)
        started.append(server)
        return server.start()

    yield start
    _stop_all(started)


@dataclass
class DemoUnderRules:
    """A demo with one forced incident, scraped each second by Debian's Prometheus with the real rules of every
    tier (windows and ``for:`` shortened): its base URL, its ``host:port`` (the series' ``instance``), the server."""

    base: str
    node: str
    prometheus: Prometheus
    started: float

    def ever(self, expr: str) -> list[dict]:
        """The series ``expr`` gave at any second since the start (a range query, one step a second)."""
        return self.prometheus.api("query_range", query=expr, start=self.started, end=time.time(), step="1s")["result"]

    def firing(self, alertname: str) -> list[dict]:
        return [a for a in self.prometheus.alerts() if a["labels"]["alertname"] == alertname and a["state"] == "firing"]


@contextlib.contextmanager
def demo_under_rules(tmp_path: Path, incident: str, windows: dict[str, str], for_: str) -> Iterator[DemoUnderRules]:
    """The demo at ``--speed 1`` (Prometheus stamps scrapes with its own clock, so rates are right only when the
    demo's clock is the wall clock), its MFU window the rules' shortened 5-minute one."""
    binary = require_tool("prometheus", "prometheus")
    rules = [derived_rules(path, tmp_path / path.name, ranges=windows, for_=for_) for path in RULE_FILES]
    with running_demo("--incident", incident, "--mfu.window", windows["5m"], speed=1) as base:
        node = urlsplit(base).netloc
        prometheus = Prometheus(binary, tmp_path / "prometheus", rule_files=rules, scrape_jobs={SCRAPE_JOB: [node]})
        prometheus.start()
        try:
            yield DemoUnderRules(base, node, prometheus, time.time())
        finally:
            prometheus.stop()
