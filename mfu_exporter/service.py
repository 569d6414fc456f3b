"""Wires config, sources, jobs and the registry together: the objects one exporter process runs with."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import time
from dataclasses import dataclass, field, replace
from typing import Any, AsyncIterator, Callable, Iterable, TypeVar

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric

from mfu_exporter import __version__
from mfu_exporter.config import Config, model_facts, typed_config
from mfu_exporter.model.attribution import Attributor, NodeSignals
from mfu_exporter.model.checkpoints import CheckpointTracker, parse_checkpoint_event
from mfu_exporter.model.errors import IngestError, NotFound, ValidationError
from mfu_exporter.model.feed import apply_feed
from mfu_exporter.model.history import MfuHistory
from mfu_exporter.model.job_view import JobView
from mfu_exporter.model.jobs import JobTracker
from mfu_exporter.model.progress import parse_progress
from mfu_exporter.model.readings import GpuInfo, GpuReading, JobCollectives
from mfu_exporter.model.restore import RestoreMeter
from mfu_exporter.model.resume import SavedCounters
from mfu_exporter.node.pci import nearest_devices
from mfu_exporter.render.attribution import attribution_families
from mfu_exporter.render.collectives import collective_families
from mfu_exporter.render.collector import ExporterCollector
from mfu_exporter.render.exposition import Exposition
from mfu_exporter.render.process import DaemonProcessCollector
from mfu_exporter.render.restore import restore_families
from mfu_exporter.scheduler import MIN_PAUSE, Scheduler, next_due
from mfu_exporter.sources.base import ModelReads, Paths, Source
from mfu_exporter.sources.discovery import DiscoverySample
from mfu_exporter.sources.ethtool import EthtoolSample
from mfu_exporter.sources.gpu import GpuSample
from mfu_exporter.sources.inspector import InspectorReading
from mfu_exporter.sources.logs import LogCollectives, LogsSample
from mfu_exporter.sources.nccl import NcclSample
from mfu_exporter.sources.rdma import RdmaSample
from mfu_exporter.sources.storage import StorageReading
from mfu_exporter.statefile import read_json, write_json

log = logging.getLogger(__name__)

STATE_FILE = "jobs.json"  # the job counters under state.dir
STATE_VERSION = 1
CHECKPOINTS_OFF = "checkpoint events are off: the checkpoint source is disabled (sources.checkpoint.enabled: false)"
# The service API's refusals, for the server to answer: each carries its HTTP status and the field at fault.
__all__ = ["IngestError", "NotFound", "Service", "ValidationError", "build_service"]

T = TypeVar("T")


@dataclass
class Service:
    scheduler: Scheduler
    jobs: JobTracker
    registry: CollectorRegistry
    collector: ExporterCollector  # the registry's one collector: publishes /metrics' fragments
    exposition: Exposition  # /metrics bodies from the collector's latest page
    clock: Callable[[], float] = time.time
    history: MfuHistory = field(default_factory=MfuHistory)
    checkpoints: CheckpointTracker | None = None  # the checkpoint source's, fed by POST /api/v1/checkpoints
    attribution: Attributor = field(default_factory=Attributor)
    paths: Paths = field(default_factory=Paths)  # where attribution finds the PCIe topology of GPUs and NICs
    settings: Config = field(default_factory=Config)  # the config file, typed (mfu_exporter.config.typed_config)
    restores: RestoreMeter = field(default_factory=RestoreMeter)  # checkpoint loads: ledger times, mount reads
    speed: float = 1.0  # clock seconds per wall second (the demo's --speed): the tick runs once a clock second
    wall: Callable[[], float] = time.monotonic  # the seconds asyncio.sleep waits, which the tick keeps its phase on
    ticks: int = 0  # ticks done: the restores (checkpoint loads) change only with it
    saved_at: float = float("-inf")  # when the job counters were last written to state.dir
    save_failures: int = 0
    saved_jobs: dict = field(default_factory=dict)  # the last save's jobs: their counted and their own totals
    _ticking: asyncio.Task | None = field(default=None, init=False, repr=False)
    _process_metrics: bool = field(default=False, init=False, repr=False)
    # The sources whose readings collective_families joins.
    _JOINED = (("logs", LogsSample), ("nccl", NcclSample), ("rdma", RdmaSample))

    async def start(self) -> None:
        """Start sampling every source and the job model's tick (``evaluate_jobs``, every ``mfu.interval``), on the
        running loop. The counters an earlier exporter saved come back first, before a source feeds a job a count."""
        self.load_counters()
        await self.scheduler.start()
        self._ticking = asyncio.create_task(self.evaluate_jobs(), name="evaluate-jobs")

    async def stop(self) -> None:
        """Stop the tick, then the sources (each closed in its own worker thread)."""
        if self._ticking is not None:
            self._ticking.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticking
            self._ticking = None
        await self.scheduler.stop()
        self.save_counters(final=True)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Service]:
        """``start`` on entry and ``stop`` on exit: the service's lifespan, whoever hosts it (the web app's
        ``cleanup_ctx``, a test, a benchmark)."""
        await self.start()
        try:
            yield self
        finally:
            await self.stop()

    # --- the API the server calls (web/ never reaches the model or the sources) ----------------------------

    @property
    def ready(self) -> bool:
        """Whether every source has finished its first sample cycle (``/readyz``)."""
        return self.scheduler.ready

    async def metrics(self, accept: str | None, accept_encoding: str | None) -> tuple[bytes, dict[str, str]]:
        """The /metrics body in the format and encoding asked for, with its headers: the latest page published
        (the sources' snapshots as sampled, the jobs as of the last tick), made once per page and format."""
        return await self.exposition.render(accept, accept_encoding)

    def ingest_progress(self, body: Any) -> dict[str, Any]:
        """A progress report (the decoded JSON body) validated and merged into its job: validation and a state
        update only. The answer says it was accepted, with the job's state, run and version after it; the job's view
        (MFU, checkpoint, bottleneck) is ``job(name)``'s, computed once per tick or change rather than per report.
        Raises an ``IngestError`` naming the field at fault."""
        accepted = self.jobs.accept(parse_progress(body, self.clock()))
        return {
            "accepted": True,
            "job": accepted.job,
            "state": accepted.state,
            "run": accepted.run,
            "version": accepted.version,
        }

    @property
    def accepts_checkpoints(self) -> bool:
        """Whether checkpoint events are taken: the checkpoint source (and its tracker) is on."""
        return self.checkpoints is not None

    def ingest_checkpoint(self, body: Any) -> dict[str, Any]:
        """A checkpoint event (the decoded JSON body) recorded; the job's checkpoint JSON after it. A job known only
        from its checkpoints counts against ingest.max_jobs too. Raises an ``IngestError`` naming the field."""
        if self.checkpoints is None:
            raise NotFound("", CHECKPOINTS_OFF)
        event = parse_checkpoint_event(body, self.clock())
        return self.checkpoints.record(event, admit=self.jobs.touch)

    def jobs_json(self) -> list[dict[str, Any]]:
        """Every job's JSON (``GET /api/v1/jobs``)."""
        return [self.job_json(view) for view in self.jobs.views()]

    def job(self, name: str) -> dict[str, Any]:
        """Job ``name``'s JSON (``GET /api/v1/jobs/<job>``); ``NotFound`` for a job this node does not have."""
        return self.job_json(self._view_named(name))

    def _view_named(self, name: str) -> JobView:
        view = next((v for v in self.jobs.views() if v.name == name), None)
        if view is None:
            raise NotFound("job", f"no job {name!r} on this node")
        return view

    def ledger_json(self, name: str) -> dict[str, Any]:
        """Where job ``name``'s time on this node went (``GET /api/v1/jobs/<job>/ledger``); ``NotFound`` for a job
        this node does not have, or one without a ledger yet."""
        view = self._view_named(name)
        if view.ledger is None:
            raise NotFound(
                "job",
                f"job {name!r} has no ledger yet: it starts with the job's first progress (a report, a log's step "
                "line) or its client's start event",
            )
        return {"job": name, **view.ledger.as_json(), "data_wait": data_wait_beside_kinds(view)}

    def export_process_metrics(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        """Add client_python's ProcessCollector families to /metrics (``DaemonProcessCollector``): the daemon's own
        CPU seconds, resident and virtual memory, open and maximum file descriptors and start time, under their
        standard ``process_`` names. The daemon calls this (``web.app.serve``); build_service does not, so the golden
        rendering of the fixture node stays the same from run to run. It reads this process's own /proc/self, never
        ``--path.procfs`` (the host's), at the tick, once a second of ``monotonic`` at most."""
        if not self._process_metrics:
            self.collector.add(DaemonProcessCollector().collect, key=lambda: int(monotonic()))
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

    def readings(self, name: str, kind: type[T]) -> T | None:
        """The latest typed readings of source ``name`` (None while it is absent or has no snapshot yet)."""
        return latest_readings(self.scheduler, name, kind)

    def node_signals(self) -> NodeSignals:
        """The latest readings of the sources the attribution reads; a source that is absent or down adds nothing."""
        gpu = self.readings("gpu", GpuSample)
        ethtool = self.readings("ethtool", EthtoolSample)
        rdma = self.readings("rdma", RdmaSample)
        storage = self.readings("storage", StorageReading)
        return NodeSignals(
            gpus=gpu.gpus if gpu else {},  # GpuReadings, with the PCI bus ID that places each GPU near its NICs
            interfaces=dict(ethtool.interfaces) if ethtool else {},
            ports=dict(rdma.ports) if rdma else {},
            checkpoint=self.checkpoint_overlap,
            mounts=storage.mounts if storage else (),
            nearest_nics=functools.partial(nearest_devices, self.paths.sysfs),
            collectives=job_collectives(*self._collectives()),
            interval=max(
                (
                    state.interval
                    for name, state in self.scheduler.states.items()
                    if name in ("gpu", "ethtool", "rdma") and state.snapshot is not None
                ),
                default=1.0,
            ),
        )

    def _collectives(self) -> tuple[dict[str, LogCollectives], dict[str, InspectorReading]]:
        logs = self.readings("logs", LogsSample)
        nccl = self.readings("nccl", NcclSample)
        return (dict(logs.collectives) if logs else {}), (dict(nccl.inspector) if nccl else {})

    def collective_families(self) -> Iterable[Metric]:
        """What joins two sources (render/collectives.py): whether a job's NCCL fell back to sockets (the logs source's
        transport, the RDMA source's ports) and the slow rank its log or NCCL Inspector names."""
        rdma = self.readings("rdma", RdmaSample)
        rdma_active = any(port.port.active for port in rdma.ports.values()) if rdma else False
        return collective_families(*self._collectives(), rdma_active)

    def joined_samples(self) -> tuple[int, ...]:
        """The sample cycles of the sources ``collective_families`` joins: its families change only with them."""
        states = self.scheduler.states
        return tuple(states[name].cycles if name in states else 0 for name, _ in self._JOINED)

    def apply_discovery(self) -> None:
        """Hand the job model what discovery found last. While the source is down its last good answer stands, so
        a kubelet restart does not end every job; jobs end only when an answer no longer lists them."""
        discovery = self.readings("discovery", DiscoverySample)
        if discovery is not None:
            self.jobs.set_discovered(discovery.jobs)

    def apply_feed(self) -> None:
        """Apply what the sources read since the last tick (a log's progress lines, its checkpoint saves), in the
        order read; what could not be applied counts against its source."""
        for name, feed in self.scheduler.take_feed():
            errors = apply_feed(feed, self.jobs, self.checkpoints)
            if errors:
                self.scheduler.count_errors(name, errors)

    def status(self) -> dict[str, Any]:
        now = self.clock()
        views = self.jobs.views()
        return {
            "version": __version__,
            "time": now,
            "ready": self.scheduler.ready,
            "sources": [s.as_json(now) for s in self.scheduler.states.values()],
            "jobs": [self.job_json(v) for v in views],
            "history": {v.name: self.history.of(v.name) for v in views},
        }

    async def evaluate_jobs(self) -> None:
        """Every ``mfu.interval`` of the clock, the job model's tick (expiry, its log lines), then each job's MFU gap
        attributed, the status page history kept and the jobs published to /metrics (cancelled at shutdown). The only
        writer besides ingest: reads change nothing."""
        due = self.wall()
        while True:
            period = max(self.settings.mfu.interval / self.speed, MIN_PAUSE)
            try:
                self.evaluate_once()
            except Exception:
                # Jobs expire here only: one bad pass (a bug in a figure) must not end expiry for good.
                log.exception("the job evaluation failed; trying again at the next tick")
            # The tick keeps its phase to Prometheus's scrapes, which keep theirs. A tick that slipped a little each
            # time would now and then publish no new count between two scrapes, and a rate over a few samples would
            # show a job a tick slower than it is.
            now = self.wall()
            due = next_due(due, period, now)
            self.exposition.ticked(next_in=due - now)
            await asyncio.sleep(due - now)

    def state_path(self) -> str | None:
        directory = self.settings.state.dir
        return os.path.join(directory, STATE_FILE) if directory else None

    def load_counters(self) -> None:
        """The job counters an earlier exporter saved under ``state.dir``: each job's resume at its first count. A
        file that cannot be read is left for the next save to replace; the counters then begin at 0."""
        path = self.state_path()
        if path is None:
            return
        try:
            data = read_json(path)
        except (OSError, ValueError) as error:
            log.warning("state.dir: cannot read %s (%s): job counters begin at 0", path, error)
            return
        jobs = data.get("jobs") if isinstance(data, dict) and data.get("version") == STATE_VERSION else None
        if data is not None and not isinstance(jobs, dict):
            log.warning("state.dir: %s is not a job counters file of this version: job counters begin at 0", path)
            return
        saved = {name: SavedCounters.from_json(value) for name, value in (jobs or {}).items()}
        final = isinstance(data, dict) and data.get("final") is True  # written as its exporter stopped
        self.jobs.restore({name: replace(c, final=final) for name, c in saved.items() if c is not None})
        log.info("state.dir: %d jobs' counters resume from %s", len(saved), path)

    def save_counters(self, due: bool = True, final: bool = False) -> None:
        """The job counters to ``state.dir``, atomically (mfu_exporter.statefile); a failure keeps the last file. When
        not ``due``, only if a job counted since the last save (each tick calls it): a killed exporter's next one
        resumes the counters from the job's total at its last tick. An older total could resume them below the
        value exported since: the job may have restarted meanwhile, its new total between the saved one and the
        last one counted. ``final``: the exporter stops, nothing is counted after this save, so a job whose total
        does not continue across the restart may resume from it."""
        path = self.state_path()
        if path is None:
            return
        saved = self.jobs.counters()
        counted = {name: (counters.tokens, counters.raw_tokens) for name, counters in saved.items()}
        if not due and counted.items() <= self.saved_jobs.items():
            return
        self.saved_jobs = counted
        counters = {name: counters.as_json() for name, counters in saved.items()}
        # A killed exporter's periodic save, read here and passed on uncounted, stays what it was.
        final = final and all(counters.final for counters in saved.values())
        try:
            write_json(path, {"version": STATE_VERSION, "saved": self.clock(), "final": final, "jobs": counters})
        except (OSError, ValueError) as error:
            self.save_failures += 1
            if self.save_failures == 1 or self.save_failures % 100 == 0:
                log.warning("state.dir: cannot write %s (%s); %d failed saves", path, error, self.save_failures)
            return
        self.saved_at = self.clock()

    def evaluate_once(self) -> None:
        """One tick of ``evaluate_jobs``."""
        self.apply_discovery()
        self.apply_feed()
        now, views = self.clock(), self.jobs.tick()
        try:
            self.attribution.evaluate(now, views, self.node_signals())
            self.history.record(now, views)
            self.observe_restores(now, views)
        finally:
            # The jobs' views are published even when a figure of this pass fails; the attribution and the restores
            # are collected again once they moved. /metrics shows the jobs as of this tick.
            self.ticks += 1
            self.collector.tick(views)
        if self.settings.state.dir:
            self.save_counters(due=not 0 <= now - self.saved_at < self.settings.state.save_interval)

    def observe_restores(self, now: float, views: list[JobView]) -> None:
        """Each job's finished checkpoint loads (its ledger's bands) with the reads of its checkpoint mounts."""
        storage = self.readings("storage", StorageReading)
        state = self.scheduler.states.get("storage")
        mounts: dict[str, list[str]] = {}
        if storage is not None and state is not None and state.last_success is not None:
            counters = {}
            for mount in storage.mounts:
                jobs = [job for job, role in mount.jobs if role == "checkpoint"]
                if jobs and mount.read_bytes is not None:
                    counters[mount.mount_point] = float(mount.read_bytes)
                    for job in jobs:
                        mounts.setdefault(job, []).append(mount.mount_point)
            at = storage.at if storage.at is not None else state.last_success
            self.restores.observe_mounts(at, counters)
        for view in views:
            if view.ledger is not None:
                self.restores.observe_job(view.name, view.ledger.loads, tuple(mounts.get(view.name, ())), now)
        self.restores.forget(set(self.restores.totals()) - {view.name for view in views})


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


def latest_readings(scheduler: Scheduler, name: str, kind: type[T]) -> T | None:
    """The typed readings of source ``name``'s latest snapshot, when it has them of ``kind``."""
    state = scheduler.states.get(name)
    readings = state.snapshot.readings if state is not None and state.snapshot is not None else None
    return readings if isinstance(readings, kind) else None


def gpu_inventory_from(scheduler: Scheduler, source_name: str = "gpu") -> Callable[[], list[GpuInfo] | None]:
    """This node's GPUs as the GPU source last saw them; None while it is down or absent."""

    def inventory() -> list[GpuInfo] | None:
        sample = latest_readings(scheduler, source_name, GpuSample)
        return sample.inventory if sample is not None else None

    return inventory


def gpu_readings_from(scheduler: Scheduler, source_name: str = "gpu") -> Callable[[], dict[int, GpuReading] | None]:
    """The GPU source's latest readings by GPU index; None while it is down or absent."""

    def readings() -> dict[int, GpuReading] | None:
        state = scheduler.states.get(source_name)
        if state is None or not state.up:
            return None
        sample = latest_readings(scheduler, source_name, GpuSample)
        return sample.gpus if sample is not None else None

    return readings


def data_wait_beside_kinds(view: JobView) -> dict[str, Any] | None:
    """The job's wait for input beside its ledger's kinds, as the goodput library shows data-loading badput: inside
    ``productive`` (a step still advances while its loader is waited for), so not a kind of its own."""
    wait, ledger = view.data_wait, view.ledger
    if wait is None or ledger is None:
        return None
    productive = ledger.gpu_seconds.get("productive", 0.0)
    return {
        "gpu_seconds": wait.gpu_seconds,
        "within": "productive",
        "share_of_productive": min(wait.gpu_seconds / productive, 1.0) if productive > 0 else None,
        "ratio": wait.ratio,
        "source": wait.source,
    }


def build_service(
    config: dict,
    sources: list[Source],
    clock: Callable[[], float] = time.time,
    paths: Paths | None = None,
    monotonic: Callable[[], float] = time.monotonic,
    speed: float = 1.0,
) -> Service:
    """The service over ``sources``. ``clock`` and ``monotonic`` are the node's clocks; ``speed`` says how many of
    their seconds pass per wall second (the demo's ``--speed``), so sampling and the tick keep to them."""
    typed = typed_config(config)
    scheduler = Scheduler(sources, clock=clock, speed=speed)
    jobs = JobTracker(
        # The facts stay dicts (the progress API's reports merge into them), without the node's keys (data_paths).
        configured={name: model_facts(facts) for name, facts in config["jobs"].items()},
        window=typed.mfu.window,
        max_jobs=typed.ingest.max_jobs,
        job_ttl=typed.ingest.job_ttl,
        gpu_inventory=gpu_inventory_from(scheduler),
        clock=clock,
        gpu_readings=gpu_readings_from(scheduler),
        monotonic=monotonic,
        interval=typed.mfu.interval,
    )
    attribution = Attributor(typed.attribution, window=typed.mfu.window, interval=typed.mfu.interval)
    registry = CollectorRegistry(auto_describe=False)
    collector = ExporterCollector(scheduler, jobs)
    # The attribution changes only when it evaluates (each tick), the restores only at the tick: collected again only
    # then. The attribution's standings are read at the tick and their families built when first scraped.
    collector.add(
        lambda: (attribution.standings(), attribution.unobserved_seconds),
        key=lambda: attribution.evaluations,
        render=lambda read: attribution_families(*read),
    )
    registry.register(collector)
    exposition = Exposition(lambda: collector.page)
    scheduler.on_sample(collector.sampled)  # publishes the new snapshot, which the exposition then encodes ahead
    scheduler.on_sample(exposition.sampled)
    # The checkpoint source's tracker: the ingest API and the logs' feed change it too.
    checkpoints = next((tracker for s in sources if (tracker := getattr(s, "tracker", None)) is not None), None)
    if checkpoints is not None:
        checkpoints.listeners.append(jobs.checkpoint_event)  # every feed's saves reach the jobs' time ledgers
    model = ModelReads(
        jobs_by_gpu=functools.partial(jobs_by_gpu, jobs),
        gpu_index_by_uuid=gpu_index_by_uuid(scheduler),
        gpu_count=jobs.gpu_count,
        is_discovered=jobs.is_discovered,
        job_names=jobs.names,
        discovered_pods=discovered_pods_from(scheduler),
    )
    for source in sources:
        bind = getattr(source, "bind", None)  # a source that reads the job model: the logs, NCCL Inspector's files
        if bind is not None:
            bind(model)
    restores = RestoreMeter()
    service = Service(
        scheduler,
        jobs,
        registry,
        collector,
        exposition,
        clock,
        checkpoints=checkpoints,
        attribution=attribution,
        paths=paths or Paths(),
        settings=typed,
        restores=restores,
        speed=speed,
    )
    collector.add(lambda: restore_families(restores.totals()), key=lambda: service.ticks)
    collector.add(service.collective_families, key=service.joined_samples)
    return service


def jobs_by_gpu(jobs: JobTracker) -> dict[int, str]:
    """Each GPU index of this node with the job holding it (discovery's GPUs, or ``jobs.<job>.gpus``)."""
    return {index: view.name for view in jobs.views() for index in view.gpu_indices or ()}


def discovered_pods_from(scheduler: Scheduler, source_name: str = "discovery") -> Callable[[], dict[str, list]]:
    """``{job: [(namespace, pod)]}``: the Kubernetes pods of each job in discovery's latest snapshot; empty while
    there is no discovery source or it has not sampled."""

    def pods() -> dict[str, list[tuple[str, str]]]:
        sample = latest_readings(scheduler, source_name, DiscoverySample)
        found: dict[str, list[tuple[str, str]]] = {}
        for job in sample.jobs.values() if sample is not None else ():
            refs = [(p.namespace, p.pod) for p in job.pods if p.scheduler == "kubernetes" and p.namespace and p.pod]
            if refs:
                found.setdefault(job.name, []).extend(refs)
        return found

    return pods


def gpu_index_by_uuid(scheduler: Scheduler, source_name: str = "gpu") -> Callable[[], dict[str, int]]:
    inventory = gpu_inventory_from(scheduler, source_name)
    return lambda: {gpu.uuid: gpu.index for gpu in inventory() or ()}
