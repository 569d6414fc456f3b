"""The demo paging a webhook: ``mfu-exporter demo`` at ``--speed S``, Debian's Prometheus evaluating the shipped
rules and Debian's Alertmanager routing with ``alerts/alertmanager.example.yaml``, both on a clock S times faster
(``tests/support/timescale.py``), and a webhook receiver, a real HTTP server on loopback, that Alertmanager's
receivers post to. Prometheus scrapes the demo through a relay (tests/support/relay.py) that never makes it wait past
its scaled timeout. Every notification is kept with the wall time it arrived; ``DemoClock`` turns wall times into
demo times.

    with paging_stack(tmp_path, speed=60, demo_args=["--incident", "gpu-lost", "--warm-up", "5m"]) as stack:
        stack.wait_demo(lambda: stack.pages("MfuGpuLost"), until=start + 600, what="the page")
"""

from __future__ import annotations

import contextlib
import json
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import requests
import yaml

from tests.support.demo_harness import get_json, running_demo
from tests.support.net import free_port
from tests.support.prom_harness import RULE_FILES, SCRAPE_JOB, Prometheus, _start_on_free_port, stop_process
from tests.support.timescale import prometheus_timing, scale_alertmanager, scaled_rule_file
from tests.support.tools import require_tool
from tests.support.wait import wait_until

ROOT = Path(__file__).resolve().parents[2]
ALERTMANAGER_EXAMPLE = ROOT / "alerts" / "alertmanager.example.yaml"


def unix(stamp: str) -> float:
    """An RFC 3339 time from Prometheus or Alertmanager (nanoseconds cut to microseconds) in Unix seconds."""
    head, _, rest = stamp.partition(".")
    if rest:
        digits = "".join(c for c in rest if c.isdigit())
        zone = rest[len(digits) :]
        stamp = f"{head}.{digits[:6]}{zone}"
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


@dataclass(frozen=True)
class DemoClock:
    """The demo's clock: ``speed`` times the wall clock's pace, agreeing with it at ``origin`` (its start)."""

    speed: float
    origin: float

    def demo(self, wall: float) -> float:
        return self.origin + self.speed * (wall - self.origin)

    def wall(self, demo: float) -> float:
        return self.origin + (demo - self.origin) / self.speed


def demo_clock(base: str, samples: int = 5) -> DemoClock:
    """The demo's clock from its truth's ``time`` and ``speed``, each read halfway between two wall readings."""
    origins, speed = [], 1.0
    for _ in range(samples):
        before = time.time()
        truth = get_json(base + "api/v1/demo")
        after = time.time()
        speed = truth["speed"]
        origins.append((speed * (before + after) / 2 - truth["time"]) / (speed - 1))
    return DemoClock(speed, statistics.median(origins))


@dataclass(frozen=True)
class Notification:
    """One alert of one webhook post: the receiver it was routed to, when it arrived (wall), and the alert."""

    receiver: str
    arrived: float
    status: str  # firing or resolved
    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: float
    ends_at: float | None

    @property
    def name(self) -> str:
        return self.labels["alertname"]

    @property
    def key(self) -> tuple[tuple[str, str], ...]:
        return tuple(sorted(self.labels.items()))


class Webhook:
    """An HTTP server on a free loopback port that keeps every Alertmanager webhook post it receives."""

    def __init__(self) -> None:
        self.notifications: list[Notification] = []
        self.lock = threading.Lock()
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                arrived = time.time()
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                hook.received(self.path.strip("/"), arrived, body)
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/"

    def received(self, receiver: str, arrived: float, body: dict) -> None:
        with self.lock:
            for alert in body["alerts"]:
                ends = alert.get("endsAt")
                self.notifications.append(
                    Notification(
                        receiver,
                        arrived,
                        alert["status"],
                        alert["labels"],
                        alert.get("annotations", {}),
                        unix(alert["startsAt"]),
                        unix(ends) if ends and not ends.startswith("0001") else None,
                    )
                )

    def start(self) -> "Webhook":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def all(self) -> list[Notification]:
        with self.lock:
            return list(self.notifications)


class RelayProcess:
    """``tests/support/relay.py`` in a process of its own (so the test's own polling never holds it up), on a free
    loopback port: what Prometheus scrapes instead of the demo."""

    def __init__(self, target: str, patience: float):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.relay", target, str(patience)],
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            cwd=ROOT,
            text=True,
        )
        assert self.process.stdout is not None
        self.address = self.process.stdout.readline().strip()  # the relay prints its host:port once it listens
        if not self.address:
            raise AssertionError(f"the relay did not start (exit {self.process.poll()})")

    @property
    def late(self) -> int:
        """Answers it gave from the demo's previous exposition, the demo being slower than its patience."""
        return int(requests.get(f"http://{self.address}/late", timeout=5).text)

    def stop(self) -> None:
        stop_process(self.process)


class Alertmanager:
    """Debian's Alertmanager (``prometheus-alertmanager``) on a free loopback port, no cluster, its own storage."""

    def __init__(self, binary: str, workdir: Path, config: dict):
        self.binary = binary
        self.workdir = workdir
        self.config = config
        self.process: subprocess.Popen | None = None
        self.port: int | None = None
        self.log = workdir / "alertmanager.log"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> "Alertmanager":
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "alertmanager.yml"
        config.write_text(yaml.safe_dump(self.config, sort_keys=False))

        def launch(port: int) -> tuple[subprocess.Popen, str, Path]:
            with self.log.open("w") as log:
                process = subprocess.Popen(
                    [
                        self.binary,
                        f"--config.file={config}",
                        f"--storage.path={self.workdir / 'data'}",
                        f"--web.listen-address=127.0.0.1:{port}",
                        "--cluster.listen-address=",  # one Alertmanager: no gossip port, no wait for peers
                        "--log.level=warn",
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


@dataclass
class Pending:
    """When Prometheus saw each alert's condition begin to hold (its ``activeAt``), by the alert's labels: one time
    per episode, since an alert whose condition clears and holds again is a new episode with a new ``activeAt``."""

    active_at: dict[tuple[tuple[str, str], ...], list[float]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, key: tuple[tuple[str, str], ...], active_at: float) -> None:
        with self.lock:
            seen = self.active_at.setdefault(key, [])
            if active_at not in seen:
                seen.append(active_at)

    def get(self, key: tuple[tuple[str, str], ...], starts_at: float) -> float | None:
        """The ``activeAt`` of the episode an alert that fired at ``starts_at`` (Prometheus's ``FiredAt``) belongs to:
        the latest one not after it (within the two APIs' rounding)."""
        with self.lock:
            return max((t for t in self.active_at.get(key, ()) if t <= starts_at + 0.01), default=None)


@dataclass
class PagingStack:
    base: str  # the demo's URL
    node: str  # the host:port Prometheus scrapes it at (the relay's), the series' instance
    clock: DemoClock
    prometheus: Prometheus
    alertmanager: Alertmanager
    webhook: Webhook
    pending: Pending
    ready: float  # demo time when Prometheus had the rules and scraped the demo
    relay: RelayProcess  # what Prometheus scrapes: the demo's newest exposition (node is its address)

    def now(self) -> float:
        """The demo's time now."""
        return self.clock.demo(time.time())

    def truth(self) -> dict:
        return get_json(self.base + "api/v1/demo")

    def scrapes(self) -> tuple[int, int]:
        """(failed, all) scrapes of the demo so far: on a loaded machine some take longer than the scaled timeout."""
        span = f"{max(int(time.time() - self.clock.wall(self.ready)) + 60, 60)}s"
        total = self.prometheus.query(f'count_over_time(up{{job="{SCRAPE_JOB}"}}[{span}])')
        good = self.prometheus.query(f'sum_over_time(up{{job="{SCRAPE_JOB}"}}[{span}])')
        count = int(total[0]["value"]) if total else 0
        return count - (int(good[0]["value"]) if good else 0), count

    def wait_demo(self, predicate: Callable[[], Any], until: float, what: str, interval: float = 0.1) -> Any:
        """``predicate()``'s first truthy value, polled until the demo's clock passes ``until``."""
        while True:
            value = predicate()
            if value:
                return value
            if self.now() > until:
                raise AssertionError(f"{what}: not by demo time {until:.0f} (now {self.now():.0f})")
            time.sleep(interval)


def _watch_pending(prometheus: Prometheus, pending: Pending, stop: threading.Event) -> None:
    """Keep each alert's ``activeAt`` from Prometheus's alerts API, polled twice a wall second."""
    while not stop.wait(0.5):
        try:
            alerts = prometheus.alerts()
        except (requests.RequestException, AssertionError, ValueError):
            continue
        for alert in alerts:
            pending.add(tuple(sorted(alert["labels"].items())), unix(alert["activeAt"]))


@contextlib.contextmanager
def paging_stack(tmp_path: Path, speed: float, demo_args: Sequence[str] = ()) -> Iterator[PagingStack]:
    """The demo with ``demo_args`` at ``speed``, and Prometheus, Alertmanager and the webhook on its clock."""
    prometheus_binary = require_tool("prometheus", "prometheus")
    alertmanager_binary = require_tool("prometheus-alertmanager", "prometheus-alertmanager")
    with contextlib.ExitStack() as stack:
        webhook = Webhook().start()
        stack.callback(webhook.stop)
        config = scale_alertmanager(yaml.safe_load(ALERTMANAGER_EXAMPLE.read_text()), speed, webhook.url)
        alertmanager = Alertmanager(alertmanager_binary, tmp_path / "alertmanager", config).start()
        stack.callback(alertmanager.stop)
        # Prometheus first, scraping the port the demo will take and with no rules yet: it takes up to 5 s to begin
        # scraping a new target, minutes of demo time, so it begins while the demo starts; the rules come once
        # the demo's clock is known (time() reads it), before its first incident (demo_args' --warm-up).
        port = free_port()
        timing = prometheus_timing(speed)
        relay = RelayProcess(f"http://127.0.0.1:{port}/", patience=0.5 * 15.0 / speed)
        stack.callback(relay.stop)
        node = relay.address
        prometheus = Prometheus(
            prometheus_binary,
            tmp_path / "prometheus",
            scrape_jobs={SCRAPE_JOB: [node]},
            scrape_interval=timing["scrape_interval"],
            evaluation_interval=timing["evaluation_interval"],
            alertmanagers=[alertmanager.address],
            flags=timing["flags"],
        ).start()
        stack.callback(prometheus.stop)
        base = stack.enter_context(running_demo(*demo_args, speed=speed, port=port))
        # Scraping before the rules: MfuExporterDown would see no `up` series at all and count it as a target gone.
        wait_until(lambda: prometheus.query(f'up{{job="{SCRAPE_JOB}"}} == 1'), 60, "Prometheus to scrape the demo")
        clock = demo_clock(base)
        prometheus.reload([scaled_rule_file(path, tmp_path / path.name, speed, clock.origin) for path in RULE_FILES])
        pending, stop = Pending(), threading.Event()
        watcher = threading.Thread(target=_watch_pending, args=(prometheus, pending, stop), daemon=True)
        watcher.start()
        stack.callback(watcher.join, 5)
        stack.callback(stop.set)
        yield PagingStack(base, node, clock, prometheus, alertmanager, webhook, pending, clock.demo(time.time()), relay)
