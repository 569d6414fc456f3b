"""``mfu-exporter demo --nodes N``: a fleet of simulated 8-GPU training nodes in one process, node ``i`` on port
``P + i``.

Every node is a whole exporter: its own scheduler, job model, attribution, collector, body cache and web app (status
page, ``/metrics``, the APIs), built by ``build_service`` and ``create_app`` as a real node's are. What nodes share is
the simulated hardware under them, because training is synchronous: the nodes of a job run the same step at the same
pace, so a healthy node looks like every other healthy node. The fleet keeps three simulated machines (fake NVML, a
mlx5 sysfs tree, ``ethtool -S`` texts), one per state a node can be in:

- ``healthy``: a node of a job with no incident,
- ``waiting``: a node of the incident's job that is itself fine but waits on the broken rank (NCCL spins: busy GPUs,
  low tensor activity, quiet NICs),
- ``incident``: the one node that carries the incident (``--incident-node``, node 0 by default).

The real sources (GPU, RDMA, ethtool, preflight) sample each machine at most once per interval, and every node of
that state gets the snapshot through its own scheduler (``SharedSample``), so sampling costs three machines, not N.
Each job has its own checkpoint directory and source, shared by its nodes. A node's state never changes (the
machines all run healthy until the incident begins), so no counter jumps when an incident starts or ends.

Each node reports its share of its job's tokens to its own job model every tick, on the event loop, as the
``POST /api/v1/progress`` handler does (``parse_progress`` then ``JobTracker.report``), without an HTTP round trip
per node per second. ``GET /api/v1/fleet`` on every node says what the simulation knows: the jobs, their nodes and
their tokens over time, and the incident, so a test can compare the cluster rules with the truth.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import logging
import math
import random
import signal
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from aiohttp import web

from mfu_exporter.config import load_config, read_yaml, typed_config, validate
from mfu_exporter.model import flops as mfu_math
from mfu_exporter.model.checkpoints import CheckpointTracker
from mfu_exporter.model.errors import ValidationError
from mfu_exporter.model.progress import parse_progress
from mfu_exporter.node.ethtool import EthtoolTextReader
from mfu_exporter.quantities import parse_duration
from mfu_exporter.service import Service, build_service
from mfu_exporter.sim import nvml as fake_nvml
from mfu_exporter.sim.mlx5 import SimulatedNode
from mfu_exporter.sim.nccl import InspectorDump, NcclTestsOutput
from mfu_exporter.sim.node import (
    ALLREDUCE_US,
    DATA_WAIT_SHARE,
    GPU_NAME,
    GPUS,
    HOT_GPU,
    INCIDENT_BY_NAME,
    LOST_GPU,
    MODEL,
    RATE_FACTOR,
    SLOW_CLOCK_MHZ,
    STEADY_MFU,
    STORM_NICS,
    TOKENS_PER_STEP,
    CheckpointWriter,
    Schedule,
    SimClock,
    SimulatedQos,
    stop_training,
    storm,
    train_healthily,
    write_procfs,
)
from mfu_exporter.sim.storage import DATASET_MOUNT, SimulatedStorage
from mfu_exporter.sources import SOURCES, build_sources
from mfu_exporter.sources.base import Paths, Snapshot, Source, SourceContext
from mfu_exporter.sources.checkpoint import CheckpointSource
from mfu_exporter.sources.nccl import NcclSource
from mfu_exporter.web.app import create_app
from mfu_exporter.web.security import HTTP_LIMITS

log = logging.getLogger(__name__)

# A checkpoint stall is one node's storage, not a fleet state. straggler: the incident node's GPUs clocked low with no
# throttle reason; the central rules find it against its job's other nodes (median ± 3 MAD).
FLEET_INCIDENTS = ("pfc-storm", "thermal", "gpu-lost", "straggler")
JOB_SIZES = (16, 8, 32)  # nodes per job, in turn: jobs of 8-32 nodes, the remainder a smaller last job
JOB_PREFIX = "llama3-70b"
HEALTHY, WAITING, INCIDENT = "healthy", "waiting", "incident"
# Checkpoints of the fleet's jobs: the first right after start (so the storage series exist within seconds) and over
# before a forced incident begins (10 s), then every 10 minutes, 40 s each as on the guide's good storage.
FIRST_CHECKPOINT = 1.0
FIRST_CHECKPOINT_SECONDS = 6.0
CHECKPOINT_SECONDS = 40.0
CHECKPOINT_EVERY = 600.0
RANK_PIDS_FLEET = {gpu: 4100 + gpu for gpu in range(GPUS)}  # a node's ranks, as its Inspector files name them
# Each job's NCCL verification before it starts, across its nodes, against the demo node's fabric (8 x 400 Gb/s).
NCCL_TEST_BUSBW_GBPS = 362.0
NCCL_TEST_EXPECTED_GBPS = 320.0  # 0.8 x the line rate: what the nccl source derives from a node's ACTIVE ports
FLEET_INSPECTOR_EVERY = 10.0  # seconds between a job's Inspector dumps: a fleet's files grow slowly
HISTORY_SECONDS = 900.0  # how far back /api/v1/fleet gives each job's tokens
XID_AT_START = 13
THREAD_STACK = 512 * 1024  # 5 source threads per node: 1,024 nodes would reserve 40 GiB of 8 MiB stacks


class FleetSchedule(Schedule):
    """The demo's schedule over the incidents a fleet simulates (pfc-storm, thermal, gpu-lost, straggler)."""

    incidents = FLEET_INCIDENTS


@dataclass
class FleetJob:
    """A training job over ``nodes`` (fleet indices); every node holds all 8 of its GPUs."""

    name: str
    nodes: list[int]
    random: random.Random
    tokens: float = 0.0  # node-local tokens (each node's share: the job is data-parallel over its nodes)
    data_wait: float = 0.0  # seconds its loop waited for the next batch (DATA_WAIT_SHARE of its training time)
    checkpoints: CheckpointWriter | None = None
    source: CheckpointSource | None = None
    tracker: CheckpointTracker | None = None
    shared: SharedSample | None = None  # the checkpoint source as the job's nodes read it
    inspector: InspectorDump | None = None  # NCCL Inspector's dumps of the job's ranks (one node's, alike on all)
    nccl: SharedSample | None = None  # the nccl source reading them, as the job's nodes read it
    next_checkpoint: float = FIRST_CHECKPOINT
    next_dump: float = 0.0
    history: deque = field(default_factory=deque)  # (unix time, node-local tokens) per tick

    @property
    def gpus(self) -> int:
        return len(self.nodes) * GPUS


def layout_jobs(nodes: int, sizes: tuple[int, ...] = JOB_SIZES, seed: int = 0) -> list[FleetJob]:
    """Nodes 0..N-1 in consecutive jobs of ``sizes`` nodes in turn; the last job takes what is left."""
    jobs: list[FleetJob] = []
    start = 0
    while start < nodes:
        size = min(sizes[len(jobs) % len(sizes)], nodes - start)
        name = f"{JOB_PREFIX}-{len(jobs):02d}"
        jobs.append(FleetJob(name, list(range(start, start + size)), random.Random(f"{seed}:{name}")))
        start += size
    return jobs


def require_node(flag: str, node: int | None, nodes: int) -> None:
    """A node named on the command line (``flag``) is one of the fleet's, or none."""
    if node is not None and not 0 <= node < nodes:
        raise ValueError(f"{flag} must be a node of the fleet: 0 to {nodes - 1}")


def node_tokens_per_second() -> float:
    """A node's healthy token rate: the steady MFU on its 8 H100s, from the formula."""
    per_token = mfu_math.flops_per_token(mfu_math.ModelShape(**MODEL))
    return STEADY_MFU * GPUS * mfu_math.peak_flops(GPU_NAME, "bf16") / per_token


class SharedSample:
    """One real source, sampled at most once per interval however many nodes ask: every node of a state gets the
    same snapshot (or the same SourceUnavailable) until it is an interval old."""

    def __init__(self, source: Source, monotonic: Callable[[], float] = time.monotonic):
        self.source = source
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._taken: float | None = None
        self._snapshot: Snapshot | None = None
        self._error: BaseException | None = None
        self.samples = 0  # real samples taken, for the benchmark

    def sample(self) -> Snapshot:
        with self._lock:
            now = self._monotonic()
            # 0.9: a node whose cycle comes a little early must still get a fresh sample, never the one it had.
            if self._taken is None or now - self._taken >= 0.9 * self.source.interval:
                self._taken = now
                self.samples += 1
                try:
                    self._snapshot, self._error = self.source.sample(), None
                except Exception as exc:  # noqa: BLE001 - every node of the state sees the same failure
                    self._snapshot, self._error = None, exc
            snapshot, error = self._snapshot, self._error
        if error is not None:
            raise error
        assert snapshot is not None
        return snapshot

    def close(self) -> None:
        self.source.close()


class NodeSource:
    """A node's view of a shared source: the name, interval and timeout of the real one, for the node's scheduler."""

    def __init__(self, shared: SharedSample):
        self.shared = shared
        self.name = shared.source.name
        self.interval = shared.source.interval
        self.timeout = shared.source.timeout

    def sample(self) -> Snapshot:
        return self.shared.sample()

    def close(self) -> None:
        pass  # the fleet closes the real source once


class Machine:
    """The simulated hardware of one node state: 8 H100s in a fake NVML, 8 RoCE ports in a sysfs tree with their
    ethtool texts, a procfs for preflight; and the real sources that read them."""

    def __init__(self, kind: str, root: Path, clock: SimClock, interval: float):
        self.kind = kind
        self.nvml = fake_nvml.node(fake_nvml.h100, count=GPUS)
        self.fabric = SimulatedNode(root / "fabric", nics=GPUS)
        self.procfs = write_procfs(root / "proc")
        self.storage = SimulatedStorage(self.procfs)  # the dataset mount the node's loader reads, and nvidia-fs
        self.state: str | None = None
        self._lost = False
        self.apply(None)
        # The machine's planes, built as every node builds them (mfu_exporter.sources.build_sources), over its trees.
        every = f"{interval:g}s"
        config = validate(
            {
                "sources": {
                    "gpu": {"interval": every, "retry_interval": "30s"},
                    "rdma": {"interval": every},
                    "ethtool": {"interval": every},
                    "checkpoint": {"enabled": False},  # per job, not per machine: Fleet._checkpoints
                    "logs": {"enabled": False},
                    "storage": {"interval": every, "mounts": [DATASET_MOUNT]},
                },
                "discovery": {"kubernetes": {"enabled": False}, "slurm": {"enabled": False}},
            }
        )
        ctx = SourceContext(
            config,
            Paths(self.fabric.sysfs_root, str(self.procfs)),
            nvml=self.nvml,
            ethtool_reader=EthtoolTextReader.from_directory(str(self.fabric.ethtool_directory)),
            nic_qos=SimulatedQos(),
            wall=clock.time,
            monotonic=clock.monotonic,
        )
        sources = build_sources(config, ctx)
        # Gated on the simulated clock: a fleet stepped faster than real time still samples once per step.
        self.shared = [SharedSample(source, clock.monotonic) for source in sources]

    @property
    def paths(self) -> Paths:
        return Paths(self.fabric.sysfs_root)

    def tick(self, seconds: float) -> None:
        self.nvml.advance(seconds)
        self.fabric.tick(seconds)
        # The loader reads while the job trains; a job stopped by a lost GPU reads nothing.
        self.storage.tick(seconds, 0.0 if self.state == "gpu-lost" else 1.0, restoring=False)

    def apply(self, incident: str | None) -> None:
        """The readings of this state while ``incident`` is on somewhere in the fleet (None: all healthy)."""
        state = incident if self.kind != HEALTHY else None
        if state == self.state and state is not None:
            return
        self.state = state
        for gpu in self.nvml.gpus:
            train_healthily(gpu)
        for nic in self.fabric.nics:
            nic.utilization, nic.rx_pause_ratio, nic.tx_pause_ratio, nic.cnp_per_second = 0.35, 0.0, 0.0, 20.0
            nic.stalls_per_second = 0.0
        if self._lost and state != "gpu-lost":
            self.nvml.gpus[LOST_GPU].lost = False  # a reset brings it back; NVML re-init picks it up
            self._lost = False
        if state is None:
            return
        if state == "gpu-lost":
            # The job stops on every node: NCCL waits for a rank that is gone.
            if self.kind == INCIDENT:
                self.nvml.lose(LOST_GPU)
                self._lost = True
            stop_training(self.nvml, self.fabric)
            return
        # pfc-storm and thermal: every rank waits on the slow one. NCCL kernels spin while waiting, so GPU
        # utilization stays high and hides the stall; tensor activity shows it.
        tensor = 24.0 if state == "pfc-storm" else 40.0
        for gpu in self.nvml.gpus:
            gpu.set_activity(tensor=tensor, sm=40.0 if state == "pfc-storm" else 60.0)
            gpu.utilization = 90
        for nic in self.fabric.nics:
            nic.utilization = 0.14 if state == "pfc-storm" else 0.25
        if self.kind != INCIDENT:
            return
        if state == "pfc-storm":
            for nic in self.fabric.nics:
                nic.cnp_per_second = 2_000.0
            for index in STORM_NICS:
                storm(self.fabric.nics[index])
        elif state == "thermal":
            hot = self.nvml.gpus[HOT_GPU]
            hot.temperature_c, hot.sm_clock_mhz, hot.power_mw = 91, 1155, 520_000
            hot.clocks_event_reasons = 0x40 | 0x20  # HW and SW thermal slowdown
        elif state == "straggler":
            for gpu in self.nvml.gpus:  # the slow node computes all the time, at a low clock; its peers wait for it
                gpu.sm_clock_mhz = SLOW_CLOCK_MHZ
                gpu.set_activity(tensor=60.0, sm=85.0)

    def close(self) -> None:
        for shared in self.shared:
            try:
                shared.close()
            except Exception:
                log.debug("closing %s failed", shared.source.name, exc_info=True)


@dataclass
class FleetNode:
    index: int
    port: int
    job: FleetJob
    machine: Machine
    service: Service


class Fleet:
    """N simulated nodes, their jobs and machines, and the tick that advances them all on one clock."""

    def __init__(
        self,
        root: Path,
        nodes: int,
        base_port: int,
        clock: SimClock,
        schedule: Schedule,
        incident_node: int = 0,
        interval: float = 5.0,
        window: float | None = None,
        config_path: str | None = None,
        host: str | None = None,
        seed: int = 0,
    ):
        require_node("--incident-node", incident_node, nodes)
        self.root = root
        self.clock = clock
        self.schedule = schedule
        self.incident_node = incident_node
        self.base_port = base_port
        self.host = host
        self.interval = interval
        self.incident: str | None = None
        self.incident_since: float | None = None
        self.timeline: list[dict[str, Any]] = []  # the incidents as they happened, for GET /api/v1/fleet
        self.jobs = layout_jobs(nodes, seed=seed)
        incident_job = next(job for job in self.jobs if incident_node in job.nodes)
        self.machines = {kind: Machine(kind, root / kind, clock, interval) for kind in (HEALTHY, WAITING, INCIDENT)}
        base = load_config(config_path)
        # As for one demo node: --mfu.window over the file's mfu.window over the demo's 15 s.
        raw = read_yaml(config_path) if config_path else None
        in_file = isinstance(raw, dict) and isinstance(raw.get("mfu"), dict) and "window" in raw["mfu"]
        if window is not None or not in_file:
            base["mfu"]["window"] = window if window is not None else 15.0
        self.nodes: list[FleetNode] = []
        for job in self.jobs:
            self._checkpoints(job, root, base)
            self._inspector(job, root)
        # The incident's job writes its first checkpoint only after CHECKPOINT_EVERY: checkpoint outranks network
        # and thermal in the attribution, so a first checkpoint would hide a forced incident's cause while it runs.
        incident_job.next_checkpoint = CHECKPOINT_EVERY
        for job in self.jobs:
            facts = validate(
                {
                    "jobs": {
                        job.name: {
                            **MODEL,
                            "dtype": "bf16",
                            "gpus": list(range(GPUS)),
                            "expected_mfu": STEADY_MFU,
                            "target_tokens": 15e12 * GPUS / job.gpus,  # Llama 3's 15T tokens, a node's share
                        }
                    }
                }
            )["jobs"][job.name]
            for index in job.nodes:
                kind = INCIDENT if index == incident_node else WAITING if job is incident_job else HEALTHY
                self.nodes.append(self._node(index, job, self.machines[kind], base, facts))
        self._origin: float | None = None
        self._last = 0.0
        self._xid_sent = False

    def _checkpoints(self, job: FleetJob, root: Path, base: dict) -> None:
        job.checkpoints = CheckpointWriter(root / "checkpoints" / job.name)
        job.checkpoints.root.mkdir(parents=True)
        watch = {"path": str(job.checkpoints.root), "job": job.name, "done_marker": ".metadata"}
        # Only the job's checkpoint source: the machines' sources are the rest of each node.
        # Every other source of the registry off, so a source added later does not join the job's shared one.
        only = {name: {"enabled": False} for name in SOURCES if name not in ("checkpoint", "discovery")}
        checkpoint = {"watch": [watch], "interval": f"{self.interval:g}s"}
        section_config = validate(
            {
                "sources": {**only, "checkpoint": checkpoint},
                "discovery": {"kubernetes": {"enabled": False}, "slurm": {"enabled": False}},
            }
        )
        (source,) = build_sources(section_config, SourceContext(section_config, wall=self.clock.time))
        assert isinstance(source, CheckpointSource)
        job.source, job.tracker = source, source.tracker
        job.shared = SharedSample(job.source, self.clock.monotonic)

    def _inspector(self, job: FleetJob, root: Path) -> None:
        """The job's NCCL Inspector dumps, its NCCL verification and the nccl source reading them, shared by its nodes
        as the checkpoint source is: every node of a job holds all 8 GPUs for it, so every file is the job's."""
        job.inspector = InspectorDump(root / "nccl-inspector" / job.name, f"{job.name}-node", RANK_PIDS_FLEET)
        tests = NcclTestsOutput(root / "nccl-tests" / job.name, tuple(f"{job.name}-node-{i}" for i in job.nodes))
        tests.write("all_reduce_perf.txt", NCCL_TEST_BUSBW_GBPS)
        nccl = {
            "inspector_paths": [str(job.inspector.directory)],
            "tests_paths": [str(tests.directory / "*.txt")],
            "expect_busbw": NCCL_TEST_EXPECTED_GBPS,  # the fleet's nodes share one source, with no sysfs of its own
        }
        section = typed_config(validate({"sources": {"nccl": nccl}}))
        source = NcclSource(section.sources.nccl, clock=self.clock.monotonic)
        source.attach(lambda name=job.name: dict.fromkeys(range(GPUS), name), dict)
        job.nccl = SharedSample(source, self.clock.monotonic)

    def _node(self, index: int, job: FleetJob, machine: Machine, base: dict, facts: dict) -> FleetNode:
        config = copy.deepcopy(base)
        config["jobs"] = {job.name: facts}
        port = self.base_port + index
        config["web"]["listen_address"] = f"{self.host or ''}:{port}"
        assert job.source is not None
        sources: list[Source] = [NodeSource(shared) for shared in machine.shared]
        assert job.shared is not None
        sources.insert(1, NodeSource(job.shared))  # where the registry puts the checkpoint source
        assert job.nccl is not None
        sources.append(NodeSource(job.nccl))
        service = build_service(
            config, sources, clock=self.clock.time, paths=machine.paths, monotonic=self.clock.monotonic
        )
        service.checkpoints = job.tracker  # the job's tracker: POST /api/v1/checkpoints and the attribution use it
        return FleetNode(index, port, job, machine, service)

    def incident_job(self) -> FleetJob:
        return next(job for job in self.jobs if self.incident_node in job.nodes)

    def tick(self) -> None:
        """Advance the machines and the jobs to the clock's time (in a thread: it writes files)."""
        if self._origin is None:
            self._origin = self.clock.elapsed()
        now = self.clock.elapsed() - self._origin
        stamp = self.clock.time()
        dt = max(now - self._last, 0.0)
        self._last = now
        incident = self.schedule.incident(now)
        if incident != self.incident:
            log.info(
                "fleet: %s",
                f"incident {incident} begins on node {self.incident_node}"
                if incident
                else f"incident {self.incident} ends",
            )
            self.incident = incident
            self.incident_since = stamp if incident else None
            if self.timeline and self.timeline[-1]["end"] is None:
                self.timeline[-1]["end"] = stamp
            if incident:
                self.timeline.append({**self._truth_of(incident), "start": stamp, "end": None})
        for machine in self.machines.values():
            machine.apply(incident)
            machine.tick(dt)
        incident_machine = self.machines[INCIDENT]
        if not self._xid_sent and incident_machine.shared[0].samples:
            # One application Xid (13, graphics engine exception) on the incident node once its GPU source listens
            # for events, so the Xid series and the GPU dashboard's Xid panel exist in a fleet as on a real one.
            incident_machine.nvml.xid(0, XID_AT_START)
            self._xid_sent = True
        slowed = self.incident_job()
        for job in self.jobs:
            factor = RATE_FACTOR[incident] if job is slowed else 1.0
            writer = job.checkpoints
            assert writer is not None
            if not writer.writing and now >= job.next_checkpoint and factor > 0:
                first = job.next_checkpoint == FIRST_CHECKPOINT
                duration = FIRST_CHECKPOINT_SECONDS if first else CHECKPOINT_SECONDS
                writer.start(int(job.tokens // TOKENS_PER_STEP), stamp, duration)
                job.next_checkpoint = (0.0 if first else now) + CHECKPOINT_EVERY
            if writer.writing:
                factor *= 0.95  # staging a checkpoint costs a little even on good storage
            writer.advance(stamp)
            # One noise draw per job: its nodes run in lockstep.
            job.tokens += node_tokens_per_second() * factor * (1 + job.random.uniform(-0.02, 0.02)) * dt
            job.data_wait += DATA_WAIT_SHARE * dt if factor > 0 else 0.0
            job.history.append((stamp, job.tokens))
            if factor > 0 and now >= job.next_dump:
                job.next_dump = now + FLEET_INSPECTOR_EVERY
                slow = min(1 / factor, 10.0)
                assert job.inspector is not None
                job.inspector.dump(stamp, {gpu: ALLREDUCE_US * slow for gpu in range(GPUS)})
            while job.history and job.history[0][0] < stamp - HISTORY_SECONDS:
                job.history.popleft()

    def report(self) -> None:
        """Each node reports its job's node-local tokens to its own job model (on the event loop, as the API does).
        A job whose GPU is lost reports nothing: the rank is gone and the step never completes."""
        lost = self.incident == "gpu-lost"
        now = self.clock.time()
        for node in self.nodes:
            if lost and node.job is self.incident_job():
                continue
            tokens = node.job.tokens
            body = {
                "job": node.job.name,
                "tokens_total": int(tokens),
                "step": int(tokens // TOKENS_PER_STEP),
                "data_wait_seconds": node.job.data_wait,
            }
            try:
                node.service.jobs.report(parse_progress(body, now), view=False)
            except ValidationError as exc:  # never expected: the body is ours
                log.warning("fleet: node %d: %s", node.index, exc.message)

    def _truth_of(self, incident: str) -> dict[str, Any]:
        """The cause an incident should yield (the demo's incident table) and the job it touches: every node of the
        incident node's job waits on it; the other jobs carry on."""
        return {"name": incident, "cause": INCIDENT_BY_NAME[incident].cause, "touches": [self.incident_job().name]}

    def truth(self) -> dict[str, Any]:
        """What the simulation knows, for ``GET /api/v1/fleet``."""
        per_token = mfu_math.flops_per_token(mfu_math.ModelShape(**MODEL))
        peak = mfu_math.peak_flops(GPU_NAME, "bf16")
        jobs = []
        for job in self.jobs:
            history = list(job.history)
            mfu = None
            recent = [point for point in history if point[0] >= history[-1][0] - 60.0] if history else []
            if len(recent) >= 2 and recent[-1][0] > recent[0][0]:
                rate = (recent[-1][1] - recent[0][1]) / (recent[-1][0] - recent[0][0])
                mfu = per_token * rate / (GPUS * peak)
            jobs.append(
                {
                    "name": job.name,
                    "nodes": job.nodes,
                    "ports": [self.base_port + i for i in job.nodes],
                    "gpus_per_node": GPUS,
                    "flops_per_token": per_token,
                    "peak_flops_per_gpu": peak,
                    "mfu_1m": mfu if mfu is None or math.isfinite(mfu) else None,
                    "tokens": [[t, tokens] for t, tokens in history],  # node-local tokens over time
                }
            )
        return {
            "nodes": len(self.nodes),
            "base_port": self.base_port,
            "interval_seconds": self.interval,
            "incident": {
                "name": self.incident,
                "forced": self.schedule.forced,
                "node": self.incident_node,
                "port": self.base_port + self.incident_node,
                "job": self.incident_job().name,
                "since": self.incident_since,
                **({"cause": None, "touches": []} if self.incident is None else self._truth_of(self.incident)),
            },
            "incidents": [dict(row) for row in self.timeline],
            "jobs": jobs,
        }

    def close(self) -> None:
        for machine in self.machines.values():
            machine.close()
        for job in self.jobs:
            if job.nccl is not None:
                job.nccl.close()


async def _tick_forever(fleet: Fleet, period: float) -> None:
    while True:
        try:
            await asyncio.to_thread(fleet.tick)
            fleet.report()
        except Exception:
            log.exception("fleet tick failed")
        await asyncio.sleep(period)


async def serve_fleet(
    fleet: Fleet,
    on_started: Callable[[list[str]], None] | None = None,
    stop: asyncio.Event | None = None,
    period: float = 1.0,
) -> None:
    """Serve every node on its own port, with its own app (status page, /metrics, APIs), until SIGTERM/SIGINT."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    runners: list[web.AppRunner] = []

    ticker: asyncio.Task | None = None
    try:
        for node in fleet.nodes:
            app = create_app(node.service, documents={"/api/v1/fleet": fleet.truth})
            runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=1.0, access_log=None, **HTTP_LIMITS)
            await runner.setup()
            runners.append(runner)
            site = web.TCPSite(runner, fleet.host, node.port, reuse_address=True)
            try:
                await site.start()
            except OSError as exc:
                raise SystemExit(f"mfu-exporter demo: cannot listen on port {node.port}: {exc.strerror}") from None
        # Reports start once every node has sampled its GPUs (whose models give the peak), so the job models do
        # not each log that the peak is unknown yet.
        deadline = loop.time() + 30.0
        while loop.time() < deadline and any(n.service.scheduler.states["gpu"].snapshot is None for n in fleet.nodes):
            await asyncio.sleep(0.1)
        ticker = asyncio.create_task(_tick_forever(fleet, period))
        host = fleet.host if fleet.host not in (None, "", "0.0.0.0", "::") else "localhost"
        if on_started:
            on_started([f"http://{host}:{node.port}/" for node in fleet.nodes])
        await stop.wait()
    finally:
        if ticker is not None:
            ticker.cancel()
        await asyncio.gather(*(runner.cleanup() for runner in runners), return_exceptions=True)


class OncePerFleet(logging.Filter):
    """Passes each distinct message once: the nodes of a job log the same line (no MFU yet: waiting for a second
    report), and a fleet of 1,024 would log it 1,024 times."""

    def __init__(self, limit: int = 10_000):
        super().__init__()
        self._seen: set[str] = set()
        self._limit = limit

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message in self._seen:
            return False
        if len(self._seen) < self._limit:
            self._seen.add(message)
        return True


def build_fleet(args: argparse.Namespace, root: Path) -> Fleet:
    """The fleet of ``demo --nodes N``: node i on the --web.listen-address port + i."""
    threading.stack_size(THREAD_STACK)
    for name in ("mfu_exporter.model.jobs", "mfu_exporter.scheduler", "mfu_exporter.model.attribution"):
        logging.getLogger(name).addFilter(OncePerFleet())
    address = args.listen_address or ":9495"
    host, port = address.rsplit(":", 1)
    return Fleet(
        root,
        args.nodes,
        int(port),
        SimClock(args.speed),
        FleetSchedule.from_flags(
            args.incident, lengths=getattr(args, "incident_for", None), warmup=getattr(args, "warmup", None)
        ),
        incident_node=args.incident_node or 0,
        interval=parse_duration(args.fleet_interval),
        window=args.mfu_window,  # parsed by the flag
        config_path=args.config,
        host=host.strip("[]") or None,
        seed=args.seed,
    )
