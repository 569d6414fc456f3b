"""Wires config, sources, jobs and the registry together: the objects one exporter process runs with."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import pynvml
from prometheus_client import CollectorRegistry

from exporter import __version__
from exporter.attribution import Attributor, NodeSignals, Thresholds
from exporter.collector import ExporterCollector
from exporter.daemon import Daemon
from exporter.exposition import MetricsCache
from exporter.history import MfuHistory
from exporter.jobs import GpuInfo, JobTracker, JobView
from exporter.config import ConfigError
from exporter.sources.base import Source, SourceUnavailable
from exporter.sources.checkpoint import CheckpointSource, CheckpointTracker, checkpoint_source
from exporter.sources.ethtool import build_ethtool_source
from exporter.sources.rdma import build_rdma_source
from exporter.sources.gpu import GpuSource
from exporter.sources.preflight import PreflightSource


@dataclass
class Paths:
    sysfs: str = "/sys"
    procfs: str = "/proc"


@dataclass
class Runtime:
    config: dict
    daemon: Daemon
    jobs: JobTracker
    registry: CollectorRegistry
    cache: MetricsCache
    clock: Callable[[], float] = time.time
    history: MfuHistory = field(default_factory=MfuHistory)
    checkpoints: CheckpointTracker | None = None  # the checkpoint source's, fed by POST /api/v1/checkpoints
    attribution: Attributor = field(default_factory=Attributor)

    def checkpoint_overlap(self, job: str) -> dict[str, Any] | None:
        return self.checkpoints.overlap(job, self.config["mfu"]["window"]) if self.checkpoints else None

    def job_json(self, view: JobView) -> dict[str, Any]:
        """A job's JSON with what explains a dip in its MFU: checkpoint writes overlapping the window, and the
        cause its gap is attributed to, with the evidence."""
        verdict = self.attribution.verdict(view.name)
        return {**view.as_json(), "checkpoint": self.checkpoint_overlap(view.name),
                "bottleneck": verdict.as_json() if verdict else None}

    def node_signals(self) -> NodeSignals:
        """The latest data of the sources the attribution reads; a source that is absent or down adds nothing."""
        def data(name: str, key: str) -> dict:
            state = self.daemon.states.get(name)
            return state.snapshot.data.get(key, {}) if state is not None and state.snapshot is not None else {}

        gpu = self.daemon.states.get("gpu")
        # The GPU readings carry no PCI address; the GPU source's status lists each GPU's, to find its nearest NICs.
        gpu_status = gpu.snapshot.status.get("gpus", []) if gpu is not None and gpu.snapshot is not None else []
        return NodeSignals(gpus=data("gpu", "gpus"), interfaces=data("ethtool", "interfaces"),
                           ports=data("rdma", "ports"), gpu_pci_bus_ids={g["index"]: g["pci_bus_id"] for g in gpu_status},
                           checkpoint=self.checkpoint_overlap)

    def status(self) -> dict[str, Any]:
        now = self.clock()
        views = self.jobs.views()
        return {
            "version": __version__,
            "time": now,
            "ready": self.daemon.ready,
            "sources": [s.as_json(now) for s in self.daemon.states.values()],
            "jobs": [self.job_json(v) for v in views],
            "history": {v.name: self.history.of(v.name) for v in views},
        }

    async def evaluate_jobs(self) -> None:
        """Once a second, attribute each job's MFU gap and keep the status page history (cancelled at shutdown)."""
        while True:
            now, views = self.clock(), self.jobs.views()
            self.attribution.evaluate(now, views, self.node_signals())
            self.history.record(now, views)
            await asyncio.sleep(1.0)


def gpu_inventory_from(daemon: Daemon, source_name: str = "gpu") -> Callable[[], list[GpuInfo] | None]:
    """This node's GPUs as the GPU source last saw them; None while it is down or absent."""

    def inventory() -> list[GpuInfo] | None:
        state = daemon.states.get(source_name)
        if state is None or state.snapshot is None:
            return None
        return state.snapshot.data.get("inventory")

    return inventory


def build_sources(config: dict, paths: Paths) -> list[Source]:
    """Every source not disabled in the config. ``auto`` and ``true`` both build it; ``require_sources`` is what
    makes ``true`` stop the start when the source cannot work here."""
    sources: list[Source] = []
    for name, factory in SOURCE_FACTORIES.items():
        section = config["sources"][name]
        if section["enabled"] == "false":
            continue
        if name == "ethtool":  # it reads the RDMA ports' netdevs: only those of the devices sources.rdma selects
            sources.append(factory(section, paths, rdma=config["sources"]["rdma"]))
        else:
            sources.append(factory(section, paths))
    return sources


def require_sources(config: dict, sources: list[Source], file: str | None) -> None:
    """Sample once, before the daemon starts, each source the config sets to ``enabled: true``; raise ConfigError
    (exit 2) when one cannot work here, so a node meant to export it does not serve without it unnoticed.

    ``auto`` is for sources that may be absent (it reports them down and serves the rest); ``true`` says the source
    is required. Only the start is checked: a required source that fails later (a GPU falling off the bus) reports
    down like any other, since stopping the exporter then would hide everything else it shows. The samples run
    together, each in its own thread bounded by the source's timeout, as the daemon would run them.
    """
    required = [s for s in sources if config["sources"][s.name]["enabled"] == "true"]
    outcomes: dict[str, Exception | None] = {}

    def probe(source: Source) -> None:
        try:
            source.sample()
        except Exception as exc:  # noqa: BLE001 - reported below as why the source cannot start
            outcomes[source.name] = exc
        else:
            outcomes[source.name] = None

    threads = [threading.Thread(target=probe, args=(s,), name=f"require-{s.name}", daemon=True) for s in required]
    for thread in threads:
        thread.start()
    started = time.monotonic()
    for source, thread in zip(required, threads):
        thread.join(max(source.timeout - (time.monotonic() - started), 0.0))
    for source in required:
        if source.name not in outcomes:
            why = f"its first sample took longer than its timeout of {source.timeout:g}s"
        elif (error := outcomes[source.name]) is None:
            continue
        else:
            why = str(error) if isinstance(error, SourceUnavailable) else f"{type(error).__name__}: {error}"
        raise ConfigError(file or "<config>", f"sources.{source.name}.enabled", "a node where it works, or auto to serve without it",
                          problem=f"true requires this source, but it cannot start here ({why}); ")


def _gpu_source(section: dict, paths: Paths) -> Source:
    return GpuSource.from_config(section, pynvml)  # importing pynvml needs no driver; nvmlInit finds out


def _preflight_source(section: dict, paths: Paths) -> Source:
    return PreflightSource.from_config(section, paths.sysfs, paths.procfs, pynvml)


SOURCE_FACTORIES: dict[str, Callable[[dict, Paths], Source]] = {
    "gpu": _gpu_source,
    "checkpoint": checkpoint_source,
    "preflight": _preflight_source,
    "rdma": build_rdma_source,
    "ethtool": build_ethtool_source,
}


def build_runtime(config: dict, sources: list[Source], clock: Callable[[], float] = time.time) -> Runtime:
    daemon = Daemon(sources, clock=clock)
    jobs = JobTracker(
        configured=config["jobs"],
        window=config["mfu"]["window"],
        max_jobs=config["ingest"]["max_jobs"],
        job_ttl=config["ingest"]["job_ttl"],
        gpu_inventory=gpu_inventory_from(daemon),
        clock=clock,
    )
    attribution = Attributor(Thresholds.from_config(config["attribution"]))
    registry = CollectorRegistry(auto_describe=False)
    collector = ExporterCollector(daemon, jobs, extra=[attribution.families], clock=clock)
    registry.register(collector)
    cache = MetricsCache(registry, lambda: daemon.generation + jobs.generation, parts=collector.parts)
    daemon.on_sample(cache.sampled)
    checkpoints = next((s.tracker for s in sources if isinstance(s, CheckpointSource)), None)
    return Runtime(config, daemon, jobs, registry, cache, clock, checkpoints=checkpoints, attribution=attribution)
