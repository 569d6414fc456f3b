"""Benchmark the exporter on a simulated full node and compare its scrapes with node_exporter's.

    python -m bench.run [--quick] [--json FILE]

What it measures, in order (docs/benchmarks.md explains the method and the targets):

1. in-process, on fresh sources: CPU of each source's ``sample()`` (thread and process CPU), and the CPU of
   rendering a whole node per format;
2. a real exporter process (``bench.node``) and ``prometheus-node-exporter`` (infiniband collector only) on the
   same sysfs tree: series per source in the exporter's scrape, then both scraped the same ways: back to back
   and after every state change (as a 15 s Prometheus scrape always finds it), by 1 and by 16 scrapers, in both
   formats (OpenMetrics, text) with gzip and without;
3. the daemon's CPU over a window of 1 s sampling while scraped and reported to every second, from /proc;
4. scrapes while the GPU source's sample hangs (``bench.fixture.Hangable``): before and after the daemon's
   timeout marks it down;
5. progress ingest by 32 concurrent reporters;
6. the daemon's RSS after warm-up (four jobs), once all 32 jobs exist (after the first ingest repetition: growth is
   judged from there) and after all of the above (at least 10,000 scrapes and 100,000 reports);
7. ``mfu-exporter demo --speed 1``'s CPU after its warm-up, its status page open (polled as the page polls).

Figures are medians, minima and maxima over repetitions. ``--quick`` runs every step with tiny counts: it checks
the bench works, its numbers mean little. A full run exits 1 when a target is missed. Seconds spent in each step
are in the JSON's ``machine.phase_seconds``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gzip
import json
import logging
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from prometheus_client.exposition import choose_encoder
from prometheus_client.parser import text_string_to_metric_families

from bench import fixture, loadgen
from mfu_exporter.config import DEFAULT_INTERVAL
from mfu_exporter.model.checkpoints import parse_checkpoint_event
from mfu_exporter.model.progress import parse_progress
from mfu_exporter.node.ethtool import EthtoolTextReader
from mfu_exporter.render.encode import Encoder, encode
from mfu_exporter.render.snapshots import snapshot_families
from mfu_exporter.service import build_service
from mfu_exporter.sim.mlx5 import SimulatedNode

REPOSITORY = Path(__file__).resolve().parent.parent
SCRAPERS = 16
# Seconds asleep before each fresh scrape (after a report, for the exporter): the scraper and the process wake cold.
IDLE_WAIT = 1.05
REPORTERS = 32
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
READY_TIMEOUT = 30.0
SAMPLE_INTERVAL = DEFAULT_INTERVAL  # the longest default interval of the sources the window measures but preflight
NODE_EXPORTER_NAMES = ("prometheus-node-exporter", "node_exporter")
HUNG_SOURCE = "gpu"  # NVML is the call that hangs on a sick GPU
STATUS_REFRESH = 2.0  # seconds between the status page's polls of /api/v1/status (REFRESH_MS in status.js)
# The series the remote_write example of docs/scaling.md keeps (its write_relabel_configs regex): what a global store gets
# per node. The instance: series are recorded by the shard's Prometheus, so not in a scrape: about 25 more per node.
REMOTE_WRITE_KEEP = (
    "instance:mfu_.*|mfu_node_.*|mfu_job_.*|mfu_model_flops_utilization_ratio|mfu_checkpoint_.*"
    "|mfu_exporter_source_up|mfu_preflight_check_ok"
)


@dataclass(frozen=True)
class Plan:
    repetitions: int
    sample_cycles: int  # per repetition, after one warm-up cycle
    render_times: int
    single_scrapes: int  # back to back, one scraper
    concurrent_scrapes: int  # back to back, per scraper
    fresh_scrapes: int  # one scraper, of a body published since the last (node_exporter's: every scrape)
    fresh_rounds: int  # 16 scrapers at once, the same
    cpu_seconds: int
    cpu_window: int  # seconds per CPU sub-window
    hung_repetitions: int
    hung_seconds: float  # scraping while the source hangs: past its timeout (5 s) in a full run
    ingest_reports: int  # per reporter per repetition
    demo_warmup: float  # seconds after the demo is ready
    demo_seconds: float
    # The daemon's mfu.interval (None: its 5 s default): a fresh scrape waits for a tick, so a quick run ticks often.
    mfu_interval: float | None = None


FULL = Plan(
    repetitions=5,
    sample_cycles=40,
    render_times=20,
    single_scrapes=500,
    concurrent_scrapes=50,
    fresh_scrapes=5,
    fresh_rounds=1,
    cpu_seconds=60,
    cpu_window=10,
    hung_repetitions=3,
    hung_seconds=6.0,
    ingest_reports=625,
    demo_warmup=10.0,
    demo_seconds=30.0,
)
QUICK = Plan(
    repetitions=2,
    sample_cycles=2,
    render_times=2,
    single_scrapes=20,
    concurrent_scrapes=2,
    fresh_scrapes=2,
    fresh_rounds=1,
    cpu_seconds=2,
    cpu_window=1,
    hung_repetitions=1,
    hung_seconds=0.5,
    ingest_reports=5,
    demo_warmup=0.0,
    demo_seconds=2.0,
    mfu_interval=1.0,
)

# (figure, comparison, limit): a full run judges the median of each. Where node_exporter runs beside the exporter,
# the target is the ratio of the two in the same window: a loaded machine slows both alike.
TARGETS = [
    *((f"scrape.{mode}.single.p99_ms", "<=", 2.0) for mode in loadgen.SCRAPE_MODES),
    *((f"scrape.{mode}.concurrent.p99_ms", "<=", 10.0) for mode in loadgen.SCRAPE_MODES),
    *(
        (f"ratio.{mode}.{kind}.p99", "<=", 1.0)
        for mode in loadgen.SCRAPE_MODES
        for kind in ("single", "concurrent", "fresh_concurrent")
    ),
    *((f"ratio.{mode}.fresh_single.p99", "<=", 0.5) for mode in loadgen.SCRAPE_MODES),  # what a 15 s scrape gets
    ("hung.scrape.p99_ms", "<=", 50.0),
    ("ratio.cpu", "<=", 1.5),  # the daemon's CPU over node_exporter's, the same 60 s
    ("ratio.cpu_per_series", "<=", 0.8),  # the same per series each exports
    ("demo.cpu_percent", "<", 5.0),
    ("sample.gpu.cpu_ms", "<", 20.0),
    ("sample.fabric.cpu_ms", "<", 15.0),
    ("rss.final_mb", "<=", 60.0),
    ("rss.growth_percent", "<", 5.0),
    ("ingest.reports_per_second", ">=", 5000.0),  # ingest.max_jobs reporters, each as fast as it is answered
    ("ingest.p99_ms", "<=", 25.0),
]
# Judged only on a quiet machine: the 1-minute load average when the CPU window starts at most QUIET_LOAD (the bench
# itself keeps about one core busy); on a loaded one the ratios above are the verdict.
QUIET_TARGETS = [("cpu.daemon_percent", "<=", 0.6)]
QUIET_LOAD = 1.5


def stats(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": len(values)}


class Figures:
    """Named figures; one measured per repetition becomes median/min/max over the repetitions."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self._repeated: dict[str, list[float]] = {}

    def set(self, name: str, value: Any) -> None:
        self.values[name] = value

    def add(self, name: str, value: float) -> None:
        self._repeated.setdefault(name, []).append(value)
        self.values[name] = stats(self._repeated[name])

    def latest(self, name: str) -> float:
        """The value of the latest repetition of a repeated figure."""
        return self._repeated[name][-1]

    def median(self, name: str) -> float:
        value = self.values[name]
        return value["median"] if isinstance(value, dict) else value


# --- processes ----------------------------------------------------------------------------------------------


def positive_seconds(value: str) -> float:
    """An argparse type: a number of seconds above 0 (``--interval``)."""
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not seconds > 0 or seconds == float("inf"):
        raise argparse.ArgumentTypeError(f"{value!r}: expected a number of seconds above 0, such as 5")
    return seconds


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def node_exporter_binary() -> str:
    for name in NODE_EXPORTER_NAMES:
        path = shutil.which(name)
        if path:
            return path
    raise SystemExit("bench: prometheus-node-exporter not found; `make bench` installs Debian's package (as root)")


class Process:
    """A child process the bench measures through /proc; its log goes to ``log``."""

    def __init__(self, name: str, argv: list[str], address: str, log: Path):
        self.name = name
        self.address = address
        self.log = log
        with open(log, "wb") as output:
            self.popen = subprocess.Popen(
                argv, cwd=REPOSITORY, stdout=subprocess.DEVNULL, stderr=output, start_new_session=True
            )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def cpu_seconds(self) -> float:
        """User plus system CPU so far (/proc/<pid>/stat fields 14 and 15)."""
        with open(f"/proc/{self.pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS

    def rss_mb(self) -> float:
        with open(f"/proc/{self.pid}/status") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        raise RuntimeError(f"no VmRSS for {self.name}")

    def fail(self, why: str) -> None:
        self.stop()
        raise SystemExit(f"bench: {self.name} {why}: {self.log.read_text(errors='replace')[-2000:]}")

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()


@contextlib.contextmanager
def scratch(prefix: str) -> Iterator[tuple[Path, list[Process]]]:
    """A folder for a fixture and the list of processes started on it: at exit each process still running is
    stopped and the folder removed."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    processes: list[Process] = []
    try:
        yield root, processes
    finally:
        for process in processes:
            process.stop()
        shutil.rmtree(root, ignore_errors=True)


def start_exporter(root: Path, command: list[str] | None = None, extra: list[str] | None = None) -> Process:
    """``bench.node`` (or ``command``, a wrapper of it, after the interpreter) on the fixture under ``root``, on a free
    loopback port, with ``extra`` arguments."""
    address = f"127.0.0.1:{free_port()}"
    argv = [sys.executable, *(command or ["-m", "bench.node"]), "--fixture", str(root), "--web.listen-address", address]
    return Process("exporter", [*argv, *(extra or [])], address, root / "exporter.log")


async def wait_until(process: Process, path: str, ok: Callable[[loadgen.Response], bool]) -> None:
    deadline = time.monotonic() + READY_TIMEOUT
    request = loadgen.get_request(process.address, path, {})
    while time.monotonic() < deadline:
        if process.popen.poll() is not None:
            process.fail("exited")
        connection = loadgen.Connection(process.address)
        try:
            response = await connection.exchange(request)
            if ok(response):
                return
        except OSError:
            pass
        finally:
            await connection.close()
        await asyncio.sleep(0.1)
    process.fail(f"not ready on {path} within {READY_TIMEOUT:g} s")


def all_sources_sampled(response: loadgen.Response) -> bool:
    return response.status == 200 and all(
        s["last_sample_duration_seconds"] is not None for s in json.loads(response.body)["sources"]
    )


# --- in-process measurements --------------------------------------------------------------------------------


def measure_samples(plan: Plan, fabric: SimulatedNode, root: Path, figures: Figures) -> None:
    """CPU of each source's sample() on fresh sources, with the fabric and GPUs moving between cycles."""
    for _ in range(plan.repetitions):
        nvml = fixture.build_gpus()
        sources = fixture.node_sources(fixture.node_config(), root, nvml)
        thread_cpu: dict[str, list[float]] = {s.name: [] for s in sources}
        process_cpu: dict[str, list[float]] = {s.name: [] for s in sources}
        try:
            for cycle in range(plan.sample_cycles + 1):
                fabric.tick(1.0)
                nvml.advance(1.0)
                for source in sources:
                    thread_started, process_started = time.thread_time(), time.process_time()
                    source.sample()
                    if cycle:  # the first cycle opens files and NVML: not the steady cost
                        thread_cpu[source.name].append(time.thread_time() - thread_started)
                        process_cpu[source.name].append(time.process_time() - process_started)
        finally:
            for source in sources:
                source.close()
        for name in thread_cpu:
            figures.add(f"sample.{name}.cpu_ms", statistics.median(thread_cpu[name]) * 1e3)
            figures.add(f"sample.{name}.process_cpu_ms", statistics.median(process_cpu[name]) * 1e3)
        fabric_cycles = [r + e for r, e in zip(thread_cpu["rdma"], thread_cpu["ethtool"])]
        figures.add("sample.fabric.cpu_ms", statistics.median(fabric_cycles) * 1e3)
        figures.add("sample.ethtool.fixture_reader_cpu_ms", text_reader_cpu(fabric, root) * 1e3)


def text_reader_cpu(fabric: SimulatedNode, root: Path, cycles: int = 20) -> float:
    """Thread CPU per cycle of parsing the fixture's ``ethtool -S`` texts: part of the ethtool source's figure
    here, spent by no real node, whose ioctl reader gets the numbers from the kernel as numbers."""
    reader = EthtoolTextReader.from_directory(str(root / "ethtool"))
    times = []
    for _ in range(cycles):
        started = time.thread_time()
        for nic in fabric.nics:
            reader.read(nic.netdev)
        times.append(time.thread_time() - started)
    return statistics.median(times)


async def measure_rendering(plan: Plan, root: Path, figures: Figures) -> dict[str, str]:
    """The CPU of one full render per format, on a service whose daemon sampled once, with the jobs reported and
    attributed; returns which source each family comes from (by its name in the text format)."""
    config = fixture.node_config()
    service = build_service(config, fixture.node_sources(config, root, fixture.build_gpus()))
    if service.checkpoints is not None:
        for job in fixture.JOBS:
            service.checkpoints.record(parse_checkpoint_event(fixture.checkpoint_event(job), time.time()))
    scheduler = service.scheduler
    await scheduler.start()
    try:
        while not all(state.cycles for state in scheduler.states.values()):
            await asyncio.sleep(0.05)
    finally:
        await scheduler.stop()
    for index, job in enumerate(fixture.JOBS):
        for step in (1, 2):
            service.jobs.report(
                parse_progress(fixture.progress_report(index, job, step * fixture.TOKENS_PER_REPORT, step), time.time())
            )
    service.evaluate_once()  # the 1 s tick: the jobs attributed, and their families published
    source_of = {}
    for name, state in scheduler.states.items():
        for family in snapshot_families(state.snapshot) if state.snapshot else ():
            source_of[family.name + "_info" if family.type == "info" else family.name] = name
    for label, accept in (("text", ""), ("openmetrics", loadgen.PROMETHEUS_ACCEPT)):
        encoder, content_type = choose_encoder(accept)
        kept = Encoder()  # one encoder across the renders, as the daemon's: its kept lines are warm
        renders = {
            "cpu_ms": lambda: encode(service.registry, encoder, content_type, kept),  # what a scrape waits for
            "library_cpu_ms": lambda: encoder(service.registry),
        }  # prometheus_client's own, for comparison
        for _ in range(plan.repetitions):
            for figure, render in renders.items():
                times = []
                for _ in range(plan.render_times):
                    started = time.thread_time()
                    body = render()
                    times.append(time.thread_time() - started)
                figures.add(f"render.{label}.{figure}", statistics.median(times) * 1e3)
            started = time.thread_time()
            gzip.compress(body, compresslevel=1)
            figures.add(f"render.{label}.gzip_cpu_ms", (time.thread_time() - started) * 1e3)
    return source_of


# --- the exporter process and node_exporter -----------------------------------------------------------------


class Reporters:
    """Running token totals per job, so every report continues its job's total as a real reporter does."""

    def __init__(self, address: str):
        self.address = address
        self.tokens: dict[str, int] = {}
        self.sent = 0
        self.refused = 0  # answered 503 and sent again

    def maker(self, index: int, job: str) -> Callable[[], bytes]:
        def next_request() -> bytes:
            tokens = self.tokens.get(job, 0) + fixture.TOKENS_PER_REPORT
            self.tokens[job] = tokens
            self.sent += 1
            body = fixture.progress_report(index, job, tokens, tokens // fixture.TOKENS_PER_REPORT)
            return loadgen.post_json_request(self.address, "/api/v1/progress", body)

        return next_request

    async def report_jobs(self, connection: loadgen.Connection) -> None:
        for index, job in enumerate(fixture.JOBS):
            await connection.timed(self.maker(index, job)())


def count_series(text: str, source_of: dict[str, str]) -> dict[str, int]:
    """Series in a text exposition by where they come from: a source, else per job (a training_job label), else
    the exporter itself."""
    counts = dict.fromkeys([*dict.fromkeys(source_of.values()), "jobs", "exporter"], 0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            group = source_of.get(family.name) or ("jobs" if "training_job" in sample.labels else "exporter")
            counts[group] += 1
    return counts


def count_kept(text: str, keep: str) -> int:
    """Series of a text exposition whose name a relabel ``keep`` rule with regex ``keep`` keeps (anchored)."""
    pattern = re.compile(keep)
    return sum(
        1
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if pattern.fullmatch(sample.name)
    )


def start_node_exporter(binary: str, root: Path) -> Process:
    """node_exporter with its infiniband collector only, on the fixture's sysfs tree under ``root``."""
    address = f"127.0.0.1:{free_port()}"
    return Process(
        "node_exporter",
        [
            binary,
            f"--path.sysfs={root / 'sys'}",
            "--collector.disable-defaults",
            "--collector.infiniband",
            f"--web.listen-address={address}",
        ],
        address,
        root / "node_exporter.log",
    )


async def warm_up(exporter: Process, reporters: Reporters) -> int:
    """Two reports per job (every job has an MFU), a checkpoint event each and 20 scrapes each way, then two sample
    intervals (every source but preflight has sampled twice: rates, the reports and writes); returns the scrapes."""
    warm = loadgen.Connection(exporter.address)
    scrapes = 0
    try:
        for _ in range(2):
            await reporters.report_jobs(warm)
        for job in fixture.JOBS:
            await warm.timed(
                loadgen.post_json_request(exporter.address, "/api/v1/checkpoints", fixture.checkpoint_event(job))
            )
        for headers in loadgen.SCRAPE_MODES.values():
            for _ in range(20):
                await warm.timed(loadgen.get_request(exporter.address, "/metrics", headers))
                scrapes += 1
    finally:
        await warm.close()
    await asyncio.sleep(2 * SAMPLE_INTERVAL)
    return scrapes


async def measure_bodies(
    exporter: Process, node_exporter: Process, source_of: dict[str, str], figures: Figures
) -> None:
    for process in (exporter, node_exporter):
        connection = loadgen.Connection(process.address)
        bodies = {}
        try:
            for mode, headers in loadgen.SCRAPE_MODES.items():
                bodies[mode] = await connection.exchange(loadgen.get_request(process.address, "/metrics", headers))
        finally:
            await connection.close()
        prefix = "body" if process is exporter else "node_exporter.body"
        for mode, response in bodies.items():
            gzipped = response.headers.get(b"content-encoding", b"") == b"gzip"
            if gzipped != ("gzip" in loadgen.SCRAPE_MODES[mode].get("Accept-Encoding", "")):
                raise SystemExit(
                    f"bench: {process.name} answered the {mode} scrape {'with' if gzipped else 'without'} gzip"
                )
            figures.set(f"{prefix}.{mode}_bytes", len(response.body))
            figures.set(f"{prefix}.{mode}_content_type", response.headers.get(b"content-type", b"").decode())
        text = bodies["text"]
        if process is exporter:
            counts = count_series(text.body.decode(), source_of)
            for group, series in counts.items():
                figures.set(f"series.{group}", series)
            figures.set("series.total", sum(counts.values()))
            figures.set("series.remote_write", count_kept(text.body.decode(), REMOTE_WRITE_KEEP))
        else:
            figures.set(
                "node_exporter.series", sum(len(f.samples) for f in text_string_to_metric_families(text.body.decode()))
            )


async def measure_scrapes(
    plan: Plan, exporter: Process, node_exporter: Process, reporters: Reporters, figures: Figures
) -> int:
    """Latency of scrapes, ours against node_exporter's, pair by pair; returns how many scrapes hit the exporter."""
    post = loadgen.Connection(exporter.address)
    await post.open()
    next_report = reporters.maker(0, fixture.JOBS[0])

    async def change_state() -> None:
        # A job's new total, published to /metrics by the service's next tick (every mfu.interval): the rounds
        # counted fresh are those whose body changed since the last.
        await post.timed(next_report())
        await asyncio.sleep(IDLE_WAIT)

    async def idle() -> None:
        # node_exporter collects on every scrape: nothing to change, but the same idle second before its scrape. A
        # process (and its scraper) woken after a second asleep pays the machine's wake-up, which on a VM can be
        # milliseconds; back to back, node_exporter's scrapes would not.
        await asyncio.sleep(IDLE_WAIT)

    scrapes = 0
    try:
        for _ in range(plan.repetitions):
            for mode, headers in loadgen.SCRAPE_MODES.items():
                for process in (exporter, node_exporter):
                    request = loadgen.get_request(process.address, "/metrics", headers)
                    before = change_state if process is exporter else idle
                    runs = {
                        "single": await loadgen.back_to_back(process.address, request, 1, plan.single_scrapes),
                        "concurrent": await loadgen.back_to_back(
                            process.address, request, SCRAPERS, plan.concurrent_scrapes
                        ),
                        "fresh_single": await loadgen.in_fresh_rounds(
                            process.address, request, 1, plan.fresh_scrapes, before, process is exporter
                        ),
                        "fresh_concurrent": await loadgen.in_fresh_rounds(
                            process.address, request, SCRAPERS, plan.fresh_rounds, before, process is exporter
                        ),
                    }
                    prefix = "scrape" if process is exporter else "node_exporter.scrape"
                    for kind, latencies in runs.items():
                        figures.add(f"{prefix}.{mode}.{kind}.p50_ms", loadgen.percentile(latencies, 0.50) * 1e3)
                        figures.add(f"{prefix}.{mode}.{kind}.p99_ms", loadgen.percentile(latencies, 0.99) * 1e3)
                        figures.add(f"{prefix}.{mode}.{kind}.max_ms", max(latencies) * 1e3)
                        if process is exporter:
                            scrapes += len(latencies)
                for kind in runs:
                    for quantile in ("p50", "p99"):
                        figures.add(
                            f"ratio.{mode}.{kind}.{quantile}",
                            figures.latest(f"scrape.{mode}.{kind}.{quantile}_ms")
                            / figures.latest(f"node_exporter.scrape.{mode}.{kind}.{quantile}_ms"),
                        )
    finally:
        await post.close()
    return scrapes


async def measure_cpu(
    plan: Plan, exporter: Process, node_exporter: Process, fabric: SimulatedNode, reporters: Reporters, figures: Figures
) -> int:
    """Both processes' CPU while the fabric moves, the jobs report and each is scraped every second; returns
    the exporter's scrapes."""
    scrape = {p: loadgen.Connection(p.address) for p in (exporter, node_exporter)}
    requests = {p: loadgen.get_request(p.address, "/metrics", loadgen.SCRAPE_MODES["openmetrics_gzip"]) for p in scrape}
    post = loadgen.Connection(exporter.address)
    windows: dict[Process, list[float]] = {p: [] for p in scrape}
    figures.set("cpu.loadavg_1m_at_start", os.getloadavg()[0])
    started = time.monotonic()
    cpu_at_start = {p: p.cpu_seconds() for p in scrape}
    cpu_at_window = dict(cpu_at_start)
    try:
        for second in range(1, plan.cpu_seconds + 1):
            fabric.tick(1.0)
            await reporters.report_jobs(post)
            for process, connection in scrape.items():
                await connection.timed(requests[process])
            await asyncio.sleep(max(started + second - time.monotonic(), 0.0))
            if second % plan.cpu_window == 0:
                for process in scrape:
                    now = process.cpu_seconds()
                    windows[process].append((now - cpu_at_window[process]) / plan.cpu_window * 100)
                    cpu_at_window[process] = now
    finally:
        for connection in (*scrape.values(), post):
            await connection.close()
    elapsed = time.monotonic() - started
    for process, prefix in ((exporter, "cpu.daemon"), (node_exporter, "node_exporter.cpu")):
        figures.set(f"{prefix}_percent", (process.cpu_seconds() - cpu_at_start[process]) / elapsed * 100)
        figures.set(f"{prefix}_window_percent", stats(windows[process]))
    figures.set("cpu.loadavg_1m_at_end", os.getloadavg()[0])
    # The two processes over the same seconds, so what the machine's load does to one it does to the other.
    ours, theirs = figures.median("cpu.daemon_percent"), figures.median("node_exporter.cpu_percent")
    ratios = [a / b for a, b in zip(windows[exporter], windows[node_exporter]) if b > 0]
    figures.set("ratio.cpu", ours / theirs if theirs > 0 else float("inf"))
    if ratios:
        figures.set("ratio.cpu_window", stats(ratios))
    per_series = figures.median("node_exporter.series") / figures.median("series.total")
    figures.set("ratio.cpu_per_series", figures.median("ratio.cpu") * per_series)
    return plan.cpu_seconds


async def source_state(process: Process, name: str) -> dict[str, Any]:
    """The source ``name`` as ``/api/v1/status`` reports it."""
    connection = loadgen.Connection(process.address)
    try:
        response = await connection.exchange(loadgen.get_request(process.address, "/api/v1/status", {}))
    finally:
        await connection.close()
    return next(source for source in json.loads(response.body)["sources"] if source["source"] == name)


async def measure_hung(plan: Plan, exporter: Process, switch: Path, reporters: Reporters, figures: Figures) -> int:
    """Scrapes while the GPU source's sample hangs: from the moment it blocks, for ``plan.hung_seconds`` (past its
    5 s timeout in a full run: first while the daemon still waits for it, then once it is down), one scraper back
    to back, each scrape after a progress report (the tick publishes the jobs each second). Then the hang ends and
    the source must come back. Returns the scrapes made."""
    blocked = Path(str(switch) + ".blocked")
    request = loadgen.get_request(exporter.address, "/metrics", loadgen.SCRAPE_MODES["openmetrics_gzip"])
    next_report = reporters.maker(0, fixture.JOBS[0])
    post, scraper = loadgen.Connection(exporter.address), loadgen.Connection(exporter.address)
    scrapes = timed_out = 0
    try:
        for _ in range(plan.hung_repetitions):
            switch.touch()
            deadline = time.monotonic() + READY_TIMEOUT
            while not blocked.exists():  # the source's next sample has begun, and blocks
                if time.monotonic() > deadline:
                    exporter.fail(f"{HUNG_SOURCE} source never blocked on {switch}")
                await asyncio.sleep(0.01)
            latencies = []
            ends = time.monotonic() + plan.hung_seconds
            while time.monotonic() < ends:
                await post.timed(next_report())
                latencies.append(await scraper.timed(request))
            state = await source_state(exporter, HUNG_SOURCE)
            timed_out += not state["up"] and state["reason"] == "timeout"
            switch.unlink()
            deadline = time.monotonic() + READY_TIMEOUT
            while not (await source_state(exporter, HUNG_SOURCE))["up"]:
                if time.monotonic() > deadline:
                    exporter.fail(f"{HUNG_SOURCE} source not back up after its hang ended")
                await asyncio.sleep(0.05)
            figures.add("hung.scrape.p50_ms", loadgen.percentile(latencies, 0.50) * 1e3)
            figures.add("hung.scrape.p99_ms", loadgen.percentile(latencies, 0.99) * 1e3)
            figures.add("hung.scrape.max_ms", max(latencies) * 1e3)
            figures.add("hung.scrapes", len(latencies))
            scrapes += len(latencies)
    finally:
        switch.unlink(missing_ok=True)
        for connection in (post, scraper):
            await connection.close()
    figures.set("hung.timed_out_repetitions", timed_out)  # the source was down (timeout) when the window ended
    return scrapes


async def measure_ingest(plan: Plan, exporter: Process, reporters: Reporters, figures: Figures) -> None:
    """32 reporters (the 4 fixture jobs and 28 more, ingest.max_jobs in all) posting as fast as they are answered."""
    jobs = list(fixture.JOBS) + [f"bench-ingest-{index}" for index in range(len(fixture.JOBS), REPORTERS)]
    makers = [reporters.maker(index, job) for index, job in enumerate(jobs)]
    reporters.refused += (await loadgen.post_many(exporter.address, makers, 1)).refused  # every job exists first
    for repetition in range(plan.repetitions):
        if repetition == 1:  # every job of the soak exists and every code path has run: what growth is judged from
            figures.set("rss.steady_mb", exporter.rss_mb())
        posted = await loadgen.post_many(exporter.address, makers, plan.ingest_reports)
        figures.add("ingest.reports_per_second", len(posted.latencies) / posted.elapsed)
        figures.add("ingest.p50_ms", loadgen.percentile(posted.latencies, 0.50) * 1e3)
        figures.add("ingest.p99_ms", loadgen.percentile(posted.latencies, 0.99) * 1e3)
        figures.add("ingest.refused_percent", posted.refused / (posted.refused + len(posted.latencies)) * 100)
        reporters.refused += posted.refused


async def measure_demo(plan: Plan, root: Path, figures: Figures) -> None:
    """``mfu-exporter demo --speed 1`` on its own, after its warm-up: its CPU (user + system, /proc) over
    ``plan.demo_seconds`` while its status page is open (``/api/v1/status`` fetched every 2 s, as the page does)."""
    address = f"127.0.0.1:{free_port()}"
    demo = Process(
        "demo",
        [
            sys.executable,
            "-m",
            "mfu_exporter",
            "demo",
            "--speed",
            "1",
            "--web.listen-address",
            address,
            "--log.level",
            "warning",
        ],
        address,
        root / "demo.log",
    )
    try:
        await wait_until(demo, "/readyz", lambda response: response.status == 200)
        await asyncio.sleep(plan.demo_warmup)
        page = loadgen.Connection(address)
        request = loadgen.get_request(address, "/api/v1/status", {"Accept": "*/*", "Cache-Control": "no-store"})
        started, cpu_at_start = time.monotonic(), demo.cpu_seconds()
        try:
            polls = 0
            while (now := time.monotonic()) < started + plan.demo_seconds:
                if now >= started + polls * STATUS_REFRESH:
                    await page.timed(request)
                    polls += 1
                await asyncio.sleep(
                    min(started + polls * STATUS_REFRESH, started + plan.demo_seconds) - time.monotonic()
                )
        finally:
            await page.close()
        elapsed = time.monotonic() - started
        figures.set("demo.cpu_percent", (demo.cpu_seconds() - cpu_at_start) / elapsed * 100)
        figures.set("demo.rss_mb", demo.rss_mb())
        if demo.popen.poll() is not None:
            demo.fail("exited during the bench")
    finally:
        demo.stop()


def machine() -> dict[str, Any]:
    model = ""
    try:
        with open("/proc/cpuinfo") as handle:
            model = next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), "")
    except OSError:
        pass
    return {
        "cpus": len(os.sched_getaffinity(0)),
        "cpu_model": model,
        "python": platform.python_version(),
        "kernel": platform.release(),
        "loadavg_1m_start": os.getloadavg()[0],
        "loadavg_5m_start": os.getloadavg()[1],
    }


def node_exporter_version(binary: str) -> str:
    output = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10)
    return (output.stdout or output.stderr).splitlines()[0]


class Phases:
    """Wall-clock seconds of each step, for the JSON (what makes ``make bench`` as long as it is)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._last = time.monotonic()

    def done(self, name: str) -> None:
        now = time.monotonic()
        self.seconds[name] = round(now - self._last, 1)
        self._last = now


async def run(plan: Plan) -> dict[str, Any]:
    figures = Figures()
    phases = Phases()
    binary = node_exporter_binary()
    info = {**machine(), "node_exporter": node_exporter_version(binary), "plan": asdict(plan)}
    with scratch("mfu-bench-") as (root, processes):
        fabric = fixture.build_fabric(root)
        figures.set("fixture.gpus", fixture.GPUS)
        figures.set("fixture.rdma_ports", len(fabric.nics))
        figures.set("fixture.ethtool_interfaces", len(fabric.nics))
        figures.set("fixture.ethtool_stats_per_interface", min(len(nic.stats) for nic in fabric.nics))
        figures.set("fixture.jobs", len(fixture.JOBS))
        phases.done("fixture")

        measure_samples(plan, fabric, root, figures)
        phases.done("samples")
        source_of = await measure_rendering(plan, root, figures)
        phases.done("rendering")

        hang_switch = root / f"hang-{HUNG_SOURCE}"
        tick = [] if plan.mfu_interval is None else ["--mfu-interval", f"{plan.mfu_interval:g}"]
        exporter = start_exporter(root, extra=["--hang-switch", str(hang_switch), *tick])
        processes.append(exporter)
        node_exporter = start_node_exporter(binary, root)
        processes.append(node_exporter)
        await wait_until(exporter, "/api/v1/status", all_sources_sampled)
        await wait_until(node_exporter, "/metrics", lambda response: response.status == 200)

        reporters = Reporters(exporter.address)
        scrapes = await warm_up(exporter, reporters)
        figures.set("rss.warm_mb", exporter.rss_mb())
        figures.set("node_exporter.rss_mb", node_exporter.rss_mb())
        phases.done("start")

        await measure_bodies(exporter, node_exporter, source_of, figures)
        scrapes += len(loadgen.SCRAPE_MODES)
        scrapes += await measure_scrapes(plan, exporter, node_exporter, reporters, figures)
        phases.done("scrapes")
        scrapes += await measure_cpu(plan, exporter, node_exporter, fabric, reporters, figures)
        phases.done("cpu")
        scrapes += await measure_hung(plan, exporter, hang_switch, reporters, figures)
        phases.done("hung")
        await measure_ingest(plan, exporter, reporters, figures)
        phases.done("ingest")

        figures.set("rss.final_mb", exporter.rss_mb())
        figures.set("rss.growth_percent", (figures.median("rss.final_mb") / figures.median("rss.steady_mb") - 1) * 100)
        figures.set(
            "rss.growth_from_warm_percent", (figures.median("rss.final_mb") / figures.median("rss.warm_mb") - 1) * 100
        )
        figures.set("rss.scrapes", scrapes)
        figures.set("rss.reports", reporters.sent - reporters.refused)
        for process in processes:
            if process.popen.poll() is not None:
                process.fail("exited during the bench")
        for process in processes:
            process.stop()
        processes.clear()

        await measure_demo(plan, root, figures)
        phases.done("demo")
    info["loadavg_1m_end"], info["loadavg_5m_end"] = os.getloadavg()[:2]
    info["phase_seconds"] = phases.seconds
    figures.set("series.per_1000_nodes", figures.median("series.total") * 1000)
    figures.set("series.per_10000_nodes", figures.median("series.total") * 10000)
    figures.set("series.remote_write_per_10000_nodes", figures.median("series.remote_write") * 10000)
    return {"machine": info, "figures": figures.values, "targets": judge(figures)}


def judge(figures: Figures) -> list[dict[str, Any]]:
    verdicts = []
    quiet = figures.median("cpu.loadavg_1m_at_start") <= QUIET_LOAD
    for name, comparison, limit in TARGETS + QUIET_TARGETS:
        value = figures.median(name)
        met: bool | None = {"<=": value <= limit, "<": value < limit, ">=": value >= limit}[comparison]
        if (name, comparison, limit) in QUIET_TARGETS and not quiet:
            met = None  # not judged: the machine was loaded
        verdicts.append({"figure": name, "target": f"{comparison} {limit:g}", "median": value, "met": met})
    return verdicts


def same_window(figures: dict[str, Any]) -> list[str]:
    """Ours and node_exporter's figures of one window side by side, with their ratio."""

    def median(name: str) -> float:
        value = figures[name]
        return value["median"] if isinstance(value, dict) else value

    rows = [
        ("CPU, % of a core over the same 60 s", "cpu.daemon_percent", "node_exporter.cpu_percent", "ratio.cpu"),
        ("series", "series.total", "node_exporter.series", None),
        ("RSS at warm-up, MB", "rss.warm_mb", "node_exporter.rss_mb", None),
        *(
            (
                f"scrape p99 {mode}, fresh, 1 scraper, ms",
                f"scrape.{mode}.fresh_single.p99_ms",
                f"node_exporter.scrape.{mode}.fresh_single.p99_ms",
                f"ratio.{mode}.fresh_single.p99",
            )
            for mode in loadgen.SCRAPE_MODES
        ),
    ]
    lines = [
        f"same window (load {median('cpu.loadavg_1m_at_start'):.2f} → {median('cpu.loadavg_1m_at_end'):.2f}): "
        "ours / node_exporter's = ratio"
    ]
    for label, ours, theirs, ratio in rows:
        value = median(ratio) if ratio else median(ours) / median(theirs)
        lines.append(f"  {label:52} {median(ours):10.3f} / {median(theirs):10.3f} = {value:.2f}")
    lines.append(f"  {'CPU per series':52} {'':10}   {'':10} = {median('ratio.cpu_per_series'):.2f}")
    return lines


def show(result: dict[str, Any]) -> str:
    lines = [
        "machine: " + ", ".join(f"{k} {v}" for k, v in result["machine"].items() if k not in ("plan", "phase_seconds")),
        "seconds: " + ", ".join(f"{k} {v:g}" for k, v in result["machine"]["phase_seconds"].items()),
    ]
    for name, value in result["figures"].items():
        if isinstance(value, dict):
            lines.append(
                f"{name:58} {value['median']:12.3f}  (min {value['min']:.3f}, max {value['max']:.3f}, n={value['runs']})"
            )
        elif isinstance(value, float):
            lines.append(f"{name:58} {value:12.3f}")
        else:
            lines.append(f"{name:58} {value!s:>12}")
    lines += same_window(result["figures"])
    for verdict in result["targets"]:
        word = {True: "met ", False: "MISSED", None: "not judged (loaded machine)"}[verdict["met"]]
        lines.append(f"{word} {verdict['figure']} {verdict['target']}: {verdict['median']:.3f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="every step with tiny counts (seconds): checks the bench works"
    )
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the figures as JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)  # the in-process service's notes (a job's first report) are expected
    result = asyncio.run(run(QUICK if args.quick else FULL))
    print(show(result), flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    missed = [v["figure"] for v in result["targets"] if v["met"] is False]
    return 1 if missed and not args.quick else 0


if __name__ == "__main__":
    raise SystemExit(main())
