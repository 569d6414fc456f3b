"""Wires config, sources, jobs and the registry together: the objects one exporter process runs with."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Iterable

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.metrics_core import Metric

from exporter import __version__
from exporter.config import CONFIG_ONLY_JOB_KEYS, Config, typed_config
from exporter.model.attribution import Attributor, NodeSignals
from exporter.model.checkpoints import CheckpointTracker
from exporter.model.history import MfuHistory
from exporter.model.job_view import GpuInfo, JobView
from exporter.model.jobs import JobTracker
from exporter.model.readings import GpuReading, JobCollectives
from exporter.node.pci import nearest_devices
from exporter.render.collector import ExporterCollector
from exporter.render.encode import MetricsCache
from exporter.render.nccl import collective_families
from exporter.scheduler import Scheduler
from exporter.sources.base import Paths, Source
from exporter.sources.checkpoint import CheckpointSource
from exporter.sources.logs import LogCollectives, LogsSource, discovered_pods_from
from exporter.sources.nccl import InspectorReading, NcclSource

log = logging.getLogger(__name__)


@dataclass
class Service:
    config: dict
    daemon: Scheduler
    jobs: JobTracker
    registry: CollectorRegistry
    cache: MetricsCache
    clock: Callable[[], float] = time.time
    history: MfuHistory = field(default_factory=MfuHistory)
    checkpoints: CheckpointTracker | None = None  # the checkpoint source's, fed by POST /api/v1/checkpoints
    attribution: Attributor = field(default_factory=Attributor)
    paths: Paths = field(default_factory=Paths)  # where attribution finds the PCIe topology of GPUs and NICs
    collector: ExporterCollector | None = None  # the registry's one collector, for parts added later
    settings: Config = field(default_factory=Config)  # ``config`` typed (exporter.config.typed_config)
    _ticking: asyncio.Task | None = field(default=None, init=False, repr=False)
    _process_metrics: bool = field(default=False, init=False, repr=False)

    async def start(self) -> None:
        """Start sampling every source and the 1 s tick of the job model (``evaluate_jobs``), on the running loop."""
        await self.daemon.start()
        self._ticking = asyncio.create_task(self.evaluate_jobs(), name="evaluate-jobs")

    async def stop(self) -> None:
        """Stop the tick, then the sources (each closed in its own worker thread)."""
        if self._ticking is not None:
            self._ticking.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticking
            self._ticking = None
        await self.daemon.stop()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Service]:
        """``start`` on entry and ``stop`` on exit: the service's lifespan, whoever hosts it (the web app's
        ``cleanup_ctx``, a test, a benchmark)."""
        await self.start()
        try:
            yield self
        finally:
            await self.stop()

    def export_process_metrics(self) -> None:
        """Add client_python's ProcessCollector to /metrics: the daemon's own CPU seconds, resident and virtual
        memory, open and maximum file descriptors and start time, under its standard ``process_`` names. The daemon
        calls this (``web.app.serve``); build_service does not, so the golden rendering of the fixture node stays
        the same from run to run. It reads this process's own /proc/self, never ``--path.procfs`` (the host's)."""
        if self.collector is not None and not self._process_metrics:
            self.collector.add(ProcessCollector(registry=None).collect)
            self._process_metrics = True

    def checkpoint_overlap(self, job: str) -> dict[str, Any] | None:
        return self.checkpoints.overlap(job, self.settings.mfu.window) if self.checkpoints else None

    def job_json(self, view: JobView) -> dict[str, Any]:
        """A job's JSON with what explains a dip in its MFU: checkpoint writes overlapping the window, and the
        cause its gap is attributed to, with the evidence."""
        verdict = self.attribution.verdict(view.name)
        return {
            **view.as_json(),
            "checkpoint": self.checkpoint_overlap(view.name),
            "bottleneck": verdict.as_json() if verdict else None,
        }

    def node_signals(self) -> NodeSignals:
        """The latest data of the sources the attribution reads; a source that is absent or down adds nothing."""

        def data(name: str, key: str) -> dict:
            state = self.daemon.states.get(name)
            return state.snapshot.data.get(key, {}) if state is not None and state.snapshot is not None else {}

        return NodeSignals(
            gpus=data("gpu", "gpus"),  # GpuReadings, with the PCI bus ID that places each GPU near its NICs
            interfaces=data("ethtool", "interfaces"),
            ports=data("rdma", "ports"),
            checkpoint=self.checkpoint_overlap,
            nearest_nics=functools.partial(nearest_devices, self.paths.sysfs),
            collectives=job_collectives(data("logs", "collectives"), data("nccl", "inspector")),
        )

    def collective_families(self) -> Iterable[Metric]:
        """Each job's NCCL transport and named straggler (render/nccl.py), from the logs and nccl sources' latest
        data; whether sockets are a fallback needs the RDMA source's ports."""

        def data(name: str, key: str) -> dict:
            state = self.daemon.states.get(name)
            return state.snapshot.data.get(key, {}) if state is not None and state.snapshot is not None else {}

        rdma_active = any(port.port.active for port in data("rdma", "ports").values())
        return collective_families(data("logs", "collectives"), data("nccl", "inspector"), rdma_active)

    def apply_discovery(self) -> None:
        """Hand the job model what discovery found last. While the source is down its last good answer stands, so
        a kubelet restart does not end every job; jobs end only when an answer no longer lists them."""
        state = self.daemon.states.get("discovery")
        if state is not None and state.snapshot is not None:
            self.jobs.set_discovered(state.snapshot.data.get("jobs", {}))

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
        """Once a second, the job model's tick (expiry, its log lines), then each job's MFU gap attributed and the
        status page history kept (cancelled at shutdown). The only writer besides ingest: reads change nothing."""
        while True:
            try:
                self.evaluate_once()
            except Exception:
                # Jobs expire here only: one bad pass (a bug in a figure) must not end expiry for good.
                log.exception("the 1 s job evaluation failed; trying again in a second")
            await asyncio.sleep(1.0)

    def evaluate_once(self) -> None:
        """One tick of ``evaluate_jobs``."""
        self.apply_discovery()
        now, views = self.clock(), self.jobs.tick()
        self.attribution.evaluate(now, views, self.node_signals())
        self.history.record(now, views)


def job_collectives(
    logs: dict[str, LogCollectives], inspector: dict[str, InspectorReading]
) -> dict[str, JobCollectives]:
    """What the attribution reads of each job's collectives: the transport its log shows, and the slow rank the job
    names (its own log first: it sees every rank) or NCCL Inspector finds among this node's ranks."""
    result = {}
    for job in sorted(set(logs) | set(inspector)):
        log_found, measured = logs.get(job, LogCollectives()), inspector.get(job)
        transport = log_found.transport
        straggler = log_found.straggler.evidence if log_found.straggler is not None else None
        result[job] = JobCollectives(
            transport=transport.transport if transport is not None else None,
            socket_fallback=bool(transport is not None and transport.fell_back_to_socket),
            transport_evidence=transport.evidence if transport is not None else "",
            straggler=straggler or (measured.straggler if measured is not None else None),
        )
    return result


def gpu_inventory_from(daemon: Scheduler, source_name: str = "gpu") -> Callable[[], list[GpuInfo] | None]:
    """This node's GPUs as the GPU source last saw them; None while it is down or absent."""

    def inventory() -> list[GpuInfo] | None:
        state = daemon.states.get(source_name)
        if state is None or state.snapshot is None:
            return None
        return state.snapshot.data.get("inventory")

    return inventory


def gpu_readings_from(daemon: Scheduler, source_name: str = "gpu") -> Callable[[], dict[int, GpuReading] | None]:
    """The GPU source's latest readings by GPU index; None while it is down or absent."""

    def readings() -> dict[int, GpuReading] | None:
        state = daemon.states.get(source_name)
        if state is None or state.snapshot is None or not state.up:
            return None
        return state.snapshot.data.get("gpus")

    return readings


def build_service(
    config: dict,
    sources: list[Source],
    clock: Callable[[], float] = time.time,
    paths: Paths | None = None,
    monotonic: Callable[[], float] = time.monotonic,
) -> Service:
    typed = typed_config(config)
    daemon = Scheduler(sources, clock=clock)
    jobs = JobTracker(
        # The facts stay dicts (the progress API's reports merge into them), without the node's keys (data_paths).
        configured={
            name: {key: value for key, value in facts.items() if key not in CONFIG_ONLY_JOB_KEYS}
            for name, facts in config["jobs"].items()
        },
        window=typed.mfu.window,
        max_jobs=typed.ingest.max_jobs,
        job_ttl=typed.ingest.job_ttl,
        gpu_inventory=gpu_inventory_from(daemon),
        clock=clock,
        gpu_readings=gpu_readings_from(daemon),
        monotonic=monotonic,
    )
    attribution = Attributor(typed.attribution)
    registry = CollectorRegistry(auto_describe=False)
    collector = ExporterCollector(daemon, jobs, extra=[attribution.families], clock=clock)
    registry.register(collector)
    cache = MetricsCache(registry, lambda: daemon.generation + jobs.generation, parts=collector.parts)
    daemon.on_sample(cache.sampled)
    checkpoints = next((s.tracker for s in sources if isinstance(s, CheckpointSource)), None)
    if checkpoints is not None:
        checkpoints.listeners.append(jobs.checkpoint_event)  # every feed's saves reach the jobs' time ledgers
    for source in sources:
        if isinstance(source, LogsSource):  # log lines feed the same job model and checkpoint tracker as the APIs
            source.attach(jobs, checkpoints, discovered_pods_from(lambda: daemon.states))
        elif isinstance(source, NcclSource):  # Inspector's files go to the job holding the GPU that wrote them
            source.attach(functools.partial(jobs_by_gpu, jobs), gpu_index_by_uuid(daemon))
    service = Service(
        config,
        daemon,
        jobs,
        registry,
        cache,
        clock,
        checkpoints=checkpoints,
        attribution=attribution,
        paths=paths or Paths(),
        collector=collector,
        settings=typed,
    )
    collector.add(service.collective_families)
    return service


def jobs_by_gpu(jobs: JobTracker) -> dict[int, str]:
    """Each GPU index of this node with the job holding it (discovery's GPUs, or ``jobs.<job>.gpus``)."""
    return {index: view.name for view in jobs.views() for index in view.gpu_indices or ()}


def gpu_index_by_uuid(daemon: Scheduler, source_name: str = "gpu") -> Callable[[], dict[str, int]]:
    inventory = gpu_inventory_from(daemon, source_name)
    return lambda: {gpu.uuid: gpu.index for gpu in inventory() or ()}
