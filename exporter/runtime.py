"""Wires config, sources, jobs and the registry together: the objects one exporter process runs with."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import pynvml
from prometheus_client import CollectorRegistry

from exporter import __version__
from exporter.collector import ExporterCollector
from exporter.daemon import Daemon
from exporter.exposition import MetricsCache
from exporter.history import MfuHistory
from exporter.jobs import GpuInfo, JobTracker, JobView
from exporter.sources.base import Source
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

    def job_json(self, view: JobView) -> dict[str, Any]:
        """A job's JSON with its checkpoint writes that overlap the MFU window, so a dip in MFU is explained."""
        checkpoint = self.checkpoints.overlap(view.name, self.config["mfu"]["window"]) if self.checkpoints else None
        return {**view.as_json(), "checkpoint": checkpoint}

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

    async def record_history(self) -> None:
        """Sample every job's MFU into the status page history, forever (cancelled at shutdown)."""
        while True:
            self.history.record(self.clock(), self.jobs.views())
            await asyncio.sleep(self.history.step)


def gpu_inventory_from(daemon: Daemon, source_name: str = "gpu") -> Callable[[], list[GpuInfo] | None]:
    """This node's GPUs as the GPU source last saw them; None while it is down or absent."""

    def inventory() -> list[GpuInfo] | None:
        state = daemon.states.get(source_name)
        if state is None or state.snapshot is None:
            return None
        return state.snapshot.data.get("inventory")

    return inventory


def build_sources(config: dict, paths: Paths) -> list[Source]:
    """Every source enabled in the config (``auto`` and ``true`` both try; a source that cannot work reports down)."""
    sources: list[Source] = []
    for name, factory in SOURCE_FACTORIES.items():
        section = config["sources"][name]
        if section["enabled"] == "false":
            continue
        sources.append(factory(section, paths))
    return sources


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
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ExporterCollector(daemon, jobs, clock=clock))
    cache = MetricsCache(registry, lambda: daemon.generation + jobs.generation)
    checkpoints = next((s.tracker for s in sources if isinstance(s, CheckpointSource)), None)
    return Runtime(config, daemon, jobs, registry, cache, clock, checkpoints=checkpoints)
