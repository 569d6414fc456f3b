"""``mfu-exporter demo``: a simulated 8-GPU training node that drives the real code paths.

The simulation feeds inputs, never metrics: GPU readings go into the fake NVML module the real GPU source reads;
NIC counters are rewritten in a real sysfs-layout tree and ``ethtool -S`` texts that the real fabric sources
read; the synthetic job reports progress through the real ``ProgressReporter`` over HTTP and writes real
checkpoint files into a directory the real checkpoint watcher watches. Everything runs on one simulated clock,
so ``--speed N`` compresses time for all of it alike.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterable, Iterator

from mfu_exporter.client import ProgressReporter
from mfu_exporter.config import read_yaml, typed_config, validate
from mfu_exporter.model import flops as mfu_math
from mfu_exporter.node.ethtool import EthtoolTextReader
from mfu_exporter.node.nic_qos import GlobalPause
from mfu_exporter.preflight.facts import PreflightSettings
from mfu_exporter.quantities import format_duration
from mfu_exporter.service import Service, build_service
from mfu_exporter.sim import nvml as fake_nvml
from mfu_exporter.sim.mlx5 import PFC_PREVENTION_TIMEOUT, SimulatedNic, SimulatedNode
from mfu_exporter.sim.nccl import InspectorDump, NcclDebugFile, NcclTestsOutput
from mfu_exporter.sim.nvml import train_healthily  # here too: the demo's callers and tests use it from the node
from mfu_exporter.sim.podresources import PodResourcesServer, SimPod
from mfu_exporter.sim.storage import DATASET_MOUNT, DATASET_READ_RATE, SimulatedStorage
from mfu_exporter.sources import Paths, SourceContext, build_sources, require_sources
from mfu_exporter.sources.base import Snapshot, Source

log = logging.getLogger(__name__)

JOB = "llama3-70b"
JOB_GPUS = (0, 1, 2, 3)  # the reporting job's half of the node
# The other half runs a job that reports nothing: the demo's kubelet (a real pod-resources gRPC server on a unix
# socket) lists its two pods, and discovery names it by the pod-name pattern (<job>-worker-<n>).
DISCOVERED_JOB = "bert-pretrain"
DISCOVERED_GPUS = (4, 5, 6, 7)
DISCOVERED_TENSOR_ACTIVE = 50.0  # percent, healthy
MODEL = {"params": 70.6e9, "layers": 80, "heads": 64, "head_dim": 128, "seq_len": 8192}
GPUS = 8
GPU_NAME = "NVIDIA H100 80GB HBM3"
STEADY_MFU = 0.45
WORLD_GPUS = 1024  # the simulated job's size; this node reports its share of the tokens
TOKENS_PER_STEP = 16 * 8192  # this node's share of a global batch
NODE_TARGET_TOKENS = 15e12 * len(JOB_GPUS) / WORLD_GPUS  # Llama 3's 15T tokens, this node's share
WARMUP = 10.0  # healthy seconds before a forced incident
HEALTHY_BETWEEN = 180.0  # scheduled mode: healthy time between incidents
CHECKPOINT_SECONDS = 40.0  # the guide's good storage: under 45 s
STALLED_CHECKPOINT_SECONDS = 900.0  # the guide's slow storage: fifteen minutes
# crash-restart: the job's process dies (its pod goes away), is gone a minute, then a new one loads the last
# checkpoint (15 s) and redoes the steps since: the time ledger's down, checkpoint_load and wasted.
RESTORE_SECONDS = 15.0
CHECKPOINT_EVERY = 600.0
FIRST_CHECKPOINT = 20.0
# The job's loader, as its client times it (ProgressReporter's data_wait_seconds): healthy, it keeps the GPUs fed
# and the step waits 1% of wall time for its next batch.
DATA_WAIT_SHARE = 0.01
# input-stall: the dataset mount slows (its reads flatten at SLOW_MOUNT_READ_FACTOR of what the loader wants), the
# loader cannot keep up and each step waits 40% of wall time for its batch; the GPUs are busy between waits.
INPUT_STALL_WAIT_SHARE = 0.4
SLOW_MOUNT_READ_FACTOR = 0.5
COUNTER_SOURCES = frozenset({"rdma", "ethtool", "gpu"})  # the sources that read the simulated counters (ReadsNow)
STORM_NICS = (2, 5)  # NIC i is the nearest of GPU i: NIC 2 is the reporting job's, NIC 5 the discovered job's
HOT_GPU = 1  # one of the reporting job's GPUs
LOST_GPU = 3  # one of the reporting job's GPUs
ECC_GPU = 0  # one of the reporting job's GPUs: an uncontained uncorrectable memory error (Xid 95)
SLOW_GPU = 2  # the straggler: a GPU of the reporting job clocked low with no throttle reason (a degraded part)
SLOW_CLOCK_MHZ = 1200
HOST = "demo-node-0"  # the hostname the job's NCCL prints and names its Inspector files with
PEER_HOST = "demo-node-1"  # the other node of the demo's pre-job NCCL verification
NCCL_TEST_BUSBW_GBPS = 362.0  # the verification's bus bandwidth toward 1 GiB: 0.9 x 8 ports x 400 Gb/s
RANK_PIDS = {gpu: 4100 + gpu for gpu in JOB_GPUS}  # the job's processes, one per GPU (NVML's compute processes)
INSPECTOR_EVERY = 2.0  # seconds between NCCL Inspector's dumps (NCCL_INSPECTOR_DUMP_THREAD_INTERVAL_MICROSECONDS)
# All-reduces each rank completes between two dumps: a data-parallel job reduces its gradients in buckets, several
# a second, so a dump holds a few of each rank's collectives, not one.
ALLREDUCES_PER_DUMP = 4
ALLREDUCE_US = 2400.0  # a healthy rank's 256 MiB all-reduce
# A tick this many simulated seconds after the last is late: the job sent nothing meanwhile, as a real job's process
# descheduled on a loaded machine would not. The truth lists such spans (``late``), the most recent ``LATE_KEPT``.
LATE_AFTER = 2.0
LATE_KEPT = 1000


@dataclass(frozen=True)
class Incident:
    """One incident of the demo, and the truth about it that a test or a user compares the exporter with.

    ``apply`` sets the node's readings for it (over healthy ones, ``DemoNode._apply``); ``rate_factor`` is how much of
    the healthy token rate the reporting job keeps (it runs at its slowest rank's pace); ``progress`` is False when
    its steps stop completing (no report is sent); ``cause`` is the cause the attribution should give the jobs it
    ``touches``; every other job must carry on untouched."""

    name: str
    seconds: float  # how long it lasts in the rotation
    rate_factor: float
    cause: str
    touches: tuple[str, ...]
    apply: Callable[[DemoNode], None]
    progress: bool = True
    summary: str = ""
    # The GPU whose health the incident changes, the Xids it raises, and the state the exporter should show for it
    # (mfu_gpu_health, the status's health) while it lasts; every other GPU stays healthy.
    gpu: int | None = None
    xids: tuple[int, ...] = ()
    health: str = "healthy"

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "cause": self.cause,
            "touches": list(self.touches),
            "seconds": self.seconds,
            "rate_factor": self.rate_factor,
            "summary": self.summary,
            "gpu_health": {"gpu": self.gpu, "xids": list(self.xids), "state": self.health}
            if self.gpu is not None
            else None,
        }


def storm(nic: SimulatedNic) -> None:
    """A NIC in a PFC storm: paused by the switch 45% of the time and pausing it 60%, its receive path backed up.
    Every ten seconds a stall holds the pause past mlx5's storm-prevention timeout (100 ms): the NIC counts a
    warning and an error storm event and stops pausing for a moment, as a ConnectX does in a real storm."""
    nic.rx_pause_ratio, nic.tx_pause_ratio, nic.cnp_per_second = 0.45, 0.6, 40_000.0
    nic.stall_seconds, nic.stalls_per_second = PFC_PREVENTION_TIMEOUT, 0.1


def _pfc_storm(node: DemoNode) -> None:
    # The storm pauses two NICs, one nearest each job's GPUs: both jobs wait on their collectives.
    for gpu in node.nvml.gpus:
        gpu.set_activity(tensor=24.0, sm=40.0)
        gpu.utilization = 90  # NCCL kernels spin while waiting: utilization hides the stall
    for nic in node.fabric.nics:
        nic.utilization, nic.cnp_per_second = 0.14, 2_000.0
    for index in STORM_NICS:
        storm(node.fabric.nics[index])


def _checkpoint_stall(node: DemoNode) -> None:
    for index in JOB_GPUS:  # the reporting job's checkpoint; the other job does not wait on it
        gpu = node.nvml.gpus[index]
        gpu.set_activity(tensor=30.0, sm=45.0)
        gpu.utilization = 55


def _thermal(node: DemoNode) -> None:
    hot = node.nvml.gpus[HOT_GPU]
    hot.temperature_c, hot.sm_clock_mhz, hot.power_mw = 91, 1155, 520_000
    hot.clocks_event_reasons = 0x40 | 0x20  # HW and SW thermal slowdown
    for index in JOB_GPUS:  # the reporting job runs at its hot rank's pace; the other job is unaffected
        node.nvml.gpus[index].set_activity(tensor=40.0, sm=60.0)


def _gpu_lost(node: DemoNode) -> None:
    if not node.lost:
        node.nvml.lose(LOST_GPU)
        node.lost = True
    stop_training(node.nvml, node.fabric, JOB_GPUS)  # the job that has the GPU waits for it; the other carries on


def _uncorrectable_ecc(node: DemoNode) -> None:
    # An uncontained uncorrectable memory error (Xid 95): the driver ends every process on the GPU, sets its recovery
    # action to GPU_RESET (Xid 154 says it changed) and marks the faulty row for remapping at the reset. The job whose
    # rank died waits for it; the other job carries on. The incident's end is the operator's reset (DemoNode._apply).
    if not node.ecc:
        gpu = node.nvml.gpus[ECC_GPU]
        gpu.health.update({fake_nvml.RECOVERY_ACTION: 1, fake_nvml.REMAP_PENDING: 1})
        gpu.ecc_uncorrected += 1
        for code in INCIDENT_BY_NAME["uncorrectable-ecc"].xids:
            node.nvml.xid(ECC_GPU, code)
        node.ecc = True
    stop_training(node.nvml, node.fabric, JOB_GPUS)


def _crash_restart(node: DemoNode) -> None:
    stop_training(node.nvml, node.fabric, JOB_GPUS)  # its process is gone; the other job's GPUs carry on


def _straggler(node: DemoNode) -> None:
    for index in JOB_GPUS:  # the other ranks idle in each collective, waiting for the slow one
        node.nvml.gpus[index].set_activity(tensor=35.0, sm=50.0)
    slow = node.nvml.gpus[SLOW_GPU]
    slow.sm_clock_mhz = SLOW_CLOCK_MHZ  # no clock-event reason: not heat or power, a slow part
    slow.set_activity(tensor=60.0, sm=85.0)


def _nccl_socket_fallback(node: DemoNode) -> None:
    for index in JOB_GPUS:  # NCCL kernels spin on TCP transfers; the job's RDMA ports carry almost nothing
        gpu = node.nvml.gpus[index]
        gpu.set_activity(tensor=18.0, sm=30.0)
        gpu.utilization = 90
        node.fabric.nics[index].utilization = 0.02


def _input_stall(node: DemoNode) -> None:
    # The dataset mount (NFS, sim/storage.py's dataset_read_rate) reads slower; the job's client times 40% of each
    # second in the wait for its next batch. Between waits the GPUs compute as before: busy, tensor cores less so
    # overall.
    node.storage.dataset_read_rate = DATASET_READ_RATE * SLOW_MOUNT_READ_FACTOR
    node.data_wait_share = INPUT_STALL_WAIT_SHARE
    for index in JOB_GPUS:
        gpu = node.nvml.gpus[index]
        gpu.set_activity(tensor=36.0, sm=51.0)
        gpu.utilization = 62  # idle while waiting, busy between: over the idle line, so not "idle"


# The demo's incidents, in the order the rotation brings them: one row each, the truth included (Incident).
INCIDENT_TABLE: tuple[Incident, ...] = (
    Incident(
        "pfc-storm",
        120.0,
        0.40,
        "network",
        (JOB, DISCOVERED_JOB),
        _pfc_storm,
        summary=f"NICs {', '.join(map(str, STORM_NICS))} paused by a PFC storm: both jobs' collectives wait",
    ),
    Incident(
        "checkpoint-stall",
        STALLED_CHECKPOINT_SECONDS,  # as long as its stalled write
        0.5,
        "checkpoint",
        (JOB,),
        _checkpoint_stall,
        summary=f"storage gone slow: one checkpoint write of {JOB} takes fifteen minutes",
    ),
    Incident(
        "thermal",
        120.0,
        0.667,
        "thermal",
        (JOB,),
        _thermal,
        summary=f"GPU {HOT_GPU} throttles for heat: {JOB} runs at its pace",
    ),
    Incident(
        "gpu-lost",
        120.0,
        0.0,
        "gpu_lost",
        (JOB,),
        _gpu_lost,
        progress=False,
        summary=f"GPU {LOST_GPU} falls off the bus: {JOB} stops, {DISCOVERED_JOB} carries on",
        gpu=LOST_GPU,
        xids=(79,),
        health="reboot_required",
    ),
    Incident(
        "uncorrectable-ecc",
        120.0,
        0.0,
        "stalled",  # the job's rank on the GPU was ended by the driver: its steps stop, its GPUs go idle
        (JOB,),
        _uncorrectable_ecc,
        progress=False,
        summary=f"GPU {ECC_GPU} takes an uncontained memory error (Xid 95): {JOB} stops until the GPU is reset",
        gpu=ECC_GPU,
        xids=(95, 154),
        health="reset_required",
    ),
    Incident(
        "crash-restart",
        60.0,
        0.0,
        "stalled",
        (JOB,),
        _crash_restart,
        progress=False,
        summary=f"{JOB}'s process dies, is gone a minute, then restarts from its last checkpoint",
    ),
    Incident(
        "straggler",
        120.0,
        0.6,  # every rank waits for the slow GPU in each collective
        "straggler",
        (JOB,),
        _straggler,
        summary=f"GPU {SLOW_GPU} runs at {SLOW_CLOCK_MHZ} MHz with no throttle reason: NCCL Inspector names its rank",
    ),
    Incident(
        "nccl-socket-fallback",
        120.0,
        0.3,  # collectives over TCP: a fraction of the fabric's bandwidth
        "network",
        (JOB,),
        _nccl_socket_fallback,
        summary=f"{JOB}'s NCCL re-initialises over TCP sockets (no IB device found) and back once fixed; one run, no restart",
    ),
    Incident(
        "input-stall",
        120.0,
        1 - INPUT_STALL_WAIT_SHARE,  # each step waits for its batch, then computes at full speed
        "input",
        (JOB,),
        _input_stall,
        summary=f"the dataset mount slows: {JOB}'s loader waits {100 * INPUT_STALL_WAIT_SHARE:.0f}% of each second",
    ),
)
INCIDENT_BY_NAME = {incident.name: incident for incident in INCIDENT_TABLE}
INCIDENTS = tuple(INCIDENT_BY_NAME)
# Scheduled mode: how long each incident lasts; a checkpoint stall lasts as long as its stalled write.
INCIDENT_SECONDS = {incident.name: incident.seconds for incident in INCIDENT_TABLE}
# How much of the healthy token rate each incident leaves (the job runs at its slowest rank's pace).
RATE_FACTOR: dict[str | None, float] = {None: 1.0, **{i.name: i.rate_factor for i in INCIDENT_TABLE}}
ROTATION_SECONDS = sum(HEALTHY_BETWEEN + INCIDENT_SECONDS[name] for name in INCIDENTS)


class SimClock:
    """Simulated time running ``speed`` times faster than the wall clock, from now."""

    def __init__(
        self, speed: float, wall: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic
    ):
        self.speed = speed
        self._monotonic = monotonic
        self._wall0 = wall()
        self._mono0 = monotonic()
        self._pinned = threading.local()

    def elapsed(self) -> float:
        pinned = getattr(self._pinned, "at", None)
        return pinned if pinned is not None else (self._monotonic() - self._mono0) * self.speed

    @contextlib.contextmanager
    def pinned(self) -> Iterator[None]:
        """Simulated time stands still in this thread meanwhile: a source reads its clock at the instant the
        simulated counters were brought to. At speed, a few wall milliseconds between the two are a fair part of a
        simulated second, and a rate over a sample would be off by as much."""
        self._pinned.at = self.elapsed()
        try:
            yield
        finally:
            self._pinned.at = None

    def time(self) -> float:
        return self.wall_at(self.elapsed())

    def wall_at(self, elapsed: float) -> float:
        """The simulated Unix time at an ``elapsed()`` reading."""
        return self._wall0 + elapsed

    def monotonic(self) -> float:
        return self._mono0 + self.elapsed()


@dataclass
class Schedule:
    """Which incident is active at a simulated elapsed time: one forced after a warm-up, or a rotation of
    ``incidents``, each after ``healthy`` seconds of healthy training (``--incident-gap``).

    ``lengths`` (``--for``) says how long an incident lasts, by name. Without one, a rotation's incident lasts its
    row's ``seconds``, and a forced one lasts until the demo stops, except crash-restart, whose process comes back
    after its minute (a crash that never restarts is ``--for`` a longer time). ``warmup`` (``--warm-up``) is the
    healthy time before the first incident: 10 s before a forced one, ``healthy`` before a rotation's (the first
    rotation starts later by the difference; the next ones follow it)."""

    forced: str | None = None
    healthy: float = HEALTHY_BETWEEN
    lengths: dict[str, float] = field(default_factory=dict)
    warmup: float | None = None
    incidents: ClassVar[tuple[str, ...]] = INCIDENTS

    @classmethod
    def from_flags(
        cls,
        forced: str | None,
        healthy: float | None = None,
        lengths: float | dict[str, float] | None = None,
        warmup: float | None = None,
    ) -> Schedule:
        """The schedule ``--incident``, ``--incident-gap``, ``--for`` (one duration: the forced incident's, or
        every incident's of the rotation; or lengths by name) and ``--warm-up`` ask for."""
        if lengths is None:
            by_name: dict[str, float] = {}
        elif isinstance(lengths, dict):
            by_name = dict(lengths)
        else:
            by_name = {name: lengths for name in ((forced,) if forced else cls.incidents)}
        return cls(forced, healthy=healthy or HEALTHY_BETWEEN, lengths=by_name, warmup=warmup)

    @property
    def first_start(self) -> float:
        """When the first incident begins, in elapsed seconds."""
        if self.warmup is not None:
            return self.warmup
        return WARMUP if self.forced else self.healthy

    def seconds(self, name: str) -> float:
        """How long incident ``name`` lasts in this schedule (infinity: until the demo stops)."""
        if name in self.lengths:
            return self.lengths[name]
        if name == self.forced and name != "crash-restart":
            return math.inf
        return INCIDENT_SECONDS[name]

    @property
    def rotation_seconds(self) -> float:
        return sum(self.healthy + self.seconds(name) for name in self.incidents)

    def incident(self, elapsed: float) -> str | None:
        return next((name for name, start, end in self.spans(elapsed, elapsed) if start <= elapsed < end), None)

    def spans(self, begin: float, end: float) -> list[tuple[str, float, float]]:
        """The incidents (name, start, end in elapsed seconds) that overlap ``[begin, end]``, in order."""
        if self.forced:
            spans = [(self.forced, self.first_start, self.first_start + self.seconds(self.forced))]
        else:
            spans = []
            rotation, lead = self.rotation_seconds, self.first_start - self.healthy
            at = math.floor(max(begin - lead, 0.0) / rotation) * rotation + lead
            while at <= end:
                for name in self.incidents:
                    at += self.healthy
                    spans.append((name, at, at + self.seconds(name)))
                    at += self.seconds(name)
        return [span for span in spans if span[2] > begin and span[1] <= end]

    def next_start(self, elapsed: float) -> float:
        """When the next incident after ``elapsed`` begins (infinity when none will)."""
        horizon = elapsed + (self.rotation_seconds if not self.forced else 0.0) + self.first_start + 1.0
        return min((start for _, start, _ in self.spans(elapsed, horizon) if start > elapsed), default=math.inf)

    def describe(self, speed: float) -> str:
        if self.forced:
            seconds = self.seconds(self.forced)
            if self.forced == "crash-restart":
                return (
                    f"the job crashes after {self.first_start:g} s of healthy training and restarts "
                    f"{format_duration(seconds)} later"
                )
            lasts = (
                "until the demo stops"
                if math.isinf(seconds)
                else f"{format_duration(seconds)}, then training is healthy"
            )
            return f"incident {self.forced} starts after {self.first_start:g} s of healthy training and lasts {lasts}"
        lengths = ", ".join(f"{name} {format_duration(self.seconds(name))}" for name in self.incidents)
        return (
            f"incidents rotate ({lengths}), each after {format_duration(self.healthy)} healthy: the rotation "
            f"takes {format_duration(self.rotation_seconds / speed)} of wall time at --speed {speed:g}"
        )


def stop_training(nvml: fake_nvml.FakeNvml, fabric: SimulatedNode, gpus: Iterable[int] | None = None) -> None:
    """A job whose rank is gone: NCCL waits for it on every node, so its GPUs (``gpus``, default every GPU of the
    node) and their nearest NICs (NIC i is GPU i's) go idle. Another job on the node carries on."""
    indices = range(len(nvml.gpus)) if gpus is None else gpus
    for index in indices:
        gpu = nvml.gpus[index]
        gpu.utilization = 0
        gpu.set_activity(tensor=0.0, sm=0.0)
        if index < len(fabric.nics):
            fabric.nics[index].utilization = 0.0


def healthy_tokens_per_second(gpus: int = len(JOB_GPUS)) -> float:
    """The token rate that gives the steady MFU on ``gpus`` H100s (the reporting job's four), from the formula."""
    per_token = mfu_math.flops_per_token(mfu_math.ModelShape(**MODEL))
    return STEADY_MFU * gpus * mfu_math.peak_flops(GPU_NAME, "bf16") / per_token


class CheckpointWriter:
    """Writes a DCP-like checkpoint over a duration: one shard per rank, then ``.metadata`` last."""

    def __init__(self, root: Path, shard_bytes: int = 256 * 1024):
        self.root = root
        self.shard_bytes = shard_bytes
        self.current: Path | None = None
        self.started = 0.0
        self.duration = 0.0
        self.shards_written = 0

    @property
    def writing(self) -> bool:
        return self.current is not None

    def start(self, step: int, now: float, duration: float) -> None:
        self.current = self.root / f"step-{step:07d}"
        self.current.mkdir(parents=True, exist_ok=True)
        self.started, self.duration, self.shards_written = now, duration, 0

    def advance(self, now: float) -> None:
        if self.current is None:
            return
        due = min(GPUS, int(GPUS * (now - self.started) / self.duration) + 1)
        while self.shards_written < due:
            (self.current / f"__{self.shards_written}_0.distcp").write_bytes(b"\0" * self.shard_bytes)
            self.shards_written += 1
        if now - self.started >= self.duration:
            (self.current / ".metadata").write_bytes(b"\0" * 4096)
            self.current = None


class SimulatedQos:
    """The node's PFC and 802.3x pause as preflight wants them: PFC on the RoCE priority only, global pause off (the
    kernel's dcbnl and ethtool ioctl have nothing to simulate them with)."""

    def __init__(self, priority: int = PreflightSettings().roce_priority):
        self.priority = priority

    def pfc_priorities(self, interface: str) -> frozenset[int]:
        return frozenset({self.priority})

    def global_pause(self, interface: str) -> GlobalPause:
        return GlobalPause(autoneg=False, rx=False, tx=False)


# A procfs with what preflight reads, set as the guide wants: 64 MiB socket buffers, nvidia_peermem loaded.
PROCFS = {
    "sys/net/core/rmem_max": "67108864\n",
    "sys/net/core/wmem_max": "67108864\n",
    "sys/net/ipv4/tcp_rmem": "4096\t87380\t67108864\n",
    "sys/net/ipv4/tcp_wmem": "4096\t65536\t67108864\n",
    "sys/kernel/osrelease": "6.8.0-demo\n",
    "modules": "nvidia_peermem 16384 0 - Live 0x0000000000000000\nnvidia 54063104 1 nvidia_peermem, Live 0x0000000000000000\n",
}


def write_procfs(root: Path) -> Path:
    for name, text in PROCFS.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


class TrainingLog:
    """``--progress logs``: the job prints torchtitan's lines (its format strings, ``mfu_exporter/logs/torchtitan.py``)
    to a file instead of reporting, and the logs source follows it: MFU from a log alone."""

    EVERY_STEPS = 1  # log_freq 1 (torchtitan's default is 10): the demo's steps are ~18 s, MFU shows sooner

    def __init__(self, path: Path):
        self.path = path
        self._last: tuple[float, float] | None = None  # (time, tokens) of the last step line
        self._step = 0

    @staticmethod
    def _prefix(now: float) -> str:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)) + f",{int(now * 1000) % 1000:03d}"
        return f"[rank0]:[titan] {stamp} - root - INFO - "

    def restart(self, now: float, step: int) -> None:
        """A new process: its start-up lines and the load of the checkpoint at ``step`` (torchtitan's lines)."""
        self._write(
            [
                self._prefix(now) + line
                for line in (
                    "Trainer is initialized with local batch size 2, global batch size 2048, gradient accumulation "
                    f"steps 1, sequence length {MODEL['seq_len']}, total steps 1000000 (warmup 2000)",
                    f"Loading the checkpoint from ./outputs/checkpoint/step-{step}.",
                )
            ]
        )
        self._step, self._last = step, None

    def restored(self, now: float, step: int, seconds: float) -> None:
        self._write(
            [
                self._prefix(now) + f"Finished loading the checkpoint in {seconds:.2f} seconds.",
                self._prefix(now) + f"Training starts at step {step + 1}",
            ]
        )

    def start(self, now: float) -> None:
        lines = [
            f"\033[34mModel llama3 70B \033[31msize: {int(MODEL['params']):,} total parameters\033[39m",
            f"Peak FLOPS used for computing MFU: {989e12:.3e}",
            "Trainer is initialized with local batch size 2, global batch size 2048, gradient accumulation steps 1, "
            f"sequence length {MODEL['seq_len']}, total steps 1000000 (warmup 2000)",
            "Training starts at step 1",
        ]
        self._write([self._prefix(now) + line for line in lines])

    def progress(self, now: float, tokens: float) -> None:
        step = int(tokens // TOKENS_PER_STEP)
        if step < self._step + self.EVERY_STEPS:
            return
        self._step = step
        if self._last is not None and now > self._last[0]:
            tps = (tokens - self._last[1]) / ((now - self._last[0]) * len(JOB_GPUS))  # tokens/s per GPU, as torchtitan
            per_token = mfu_math.flops_per_token(mfu_math.ModelShape(**MODEL))
            tflops = per_token * tps / 1e12
            mfu = 100 * per_token * tps / 989e12
            self._write(
                [
                    self._prefix(now)
                    + f"\033[31mstep: {step:2}  \033[32mloss: {2.1:8.5f}  \033[34mtps: {round(tps):,}  "
                    f"\033[36mtflops: {tflops:,.2f}  \033[35mmfu: {mfu:.2f}%\033[39m"
                ]
            )
        self._last = (now, tokens)

    def _write(self, lines: list[str]) -> None:
        with open(self.path, "a") as out:
            out.write("".join(line + "\n" for line in lines))


class DemoNode:
    """One simulated training node. ``tick`` advances it to the clock's current time."""

    def __init__(self, root: Path, clock: SimClock, schedule: Schedule, seed: int = 0, progress: str = "api"):
        self.clock = clock
        self.schedule = schedule
        self.random = random.Random(seed)
        self.nvml = fake_nvml.node(fake_nvml.h100, count=GPUS)
        self.fabric = SimulatedNode(root / "fabric", nics=GPUS)
        self.procfs = write_procfs(root / "proc")
        # The dataset mount and nvidia-fs the loader reads through; storage.dataset_read_rate is the knob.
        self.storage = SimulatedStorage(self.procfs, tuple(self.nvml.gpus[i].pci_bus_id[4:].lower() for i in JOB_GPUS))
        self.checkpoints = CheckpointWriter(root / "checkpoints" / JOB)
        self.checkpoints.root.mkdir(parents=True)
        self.tokens = 0.0
        self.incident: str | None = None
        self.reporter: ProgressReporter | None = None
        self.data_wait = 0.0  # seconds the job's loop waited for its next batch, as its client sums them
        self.data_wait_share = DATA_WAIT_SHARE  # of wall time, while it trains; an input incident raises it
        self.new_reporter: Callable[[], ProgressReporter] | None = None  # a new process's reporter (a new run)
        self._checkpointed = (0.0, None)  # (tokens, tokens of the write under way): a restart resumes at the first
        # (when the load began and ends, the reporter's open load)
        self._restoring: tuple[float, float, Any] | None = None
        self.training_log = TrainingLog(root / "train.log") if progress == "logs" else None
        # The job's NCCL_DEBUG_FILE and NCCL Inspector's dumps, from its processes on GPUs 0-3.
        for gpu, pid in RANK_PIDS.items():
            self.nvml.gpus[gpu].processes = [pid]
        self.nccl_log = NcclDebugFile(root / "nccl" / f"{JOB}.nccl.log", HOST, RANK_PIDS[JOB_GPUS[0]], JOB_GPUS)
        self.nccl_log.run_starts(sockets=False)
        self.inspector = InspectorDump(root / "nccl-inspector", HOST, RANK_PIDS)
        # The guide's fabric check before the job: an all-reduce across this node and a peer, at 0.9 of the eight
        # 400 Gb/s ports' line rate (a pass against 0.8 of it, the nccl source's expected figure).
        self.nccl_tests = NcclTestsOutput(root / "nccl-tests", (HOST, PEER_HOST))
        self.nccl_tests.write("all_reduce_perf.txt", NCCL_TEST_BUSBW_GBPS)
        self._next_dump = 0.0
        self.kubelet: PodResourcesServer | None = None  # the demo's pod-resources server, when discovery uses it
        self._origin: float | None = None
        self._last = 0.0
        self.stamp = clock.time()  # the simulated time the token count is of (see tick)
        self._next_checkpoint = FIRST_CHECKPOINT
        self.lost = False  # GPU LOST_GPU is off the bus (gpu-lost): a reset brings it back when the incident ends
        self.ecc = False  # GPU ECC_GPU needs a reset (uncorrectable-ecc): the operator resets it when the incident ends
        self._stall_pending = False
        # The incidents as they happened, on the simulated clock: the truth of GET /api/v1/demo.
        self.timeline: list[dict[str, Any]] = []
        self.late: list[dict[str, float]] = []  # spans with no tick: the simulation fell behind its clock
        # The NICs' and GPUs' counters advance when a source reads them (sync_counters), under this lock.
        self._counters_lock = threading.Lock()
        self._counters_at = clock.monotonic()
        self._apply(None)

    def context(self, config: dict) -> SourceContext:
        """What the real sources read on this node: its sysfs and procfs trees, the fake NVML, the ``ethtool -S``
        texts, the simulated PFC settings, and the simulated clock."""
        return SourceContext(
            config,
            Paths(self.fabric.sysfs_root, str(self.procfs)),
            nvml=self.nvml,
            ethtool_reader=EthtoolTextReader.from_directory(str(self.fabric.ethtool_directory)),
            nic_qos=SimulatedQos(),
            wall=self.clock.time,
            monotonic=self.clock.monotonic,
        )

    def tick(self) -> None:
        if self._origin is None:
            self._origin = self.clock.elapsed()  # the schedule starts with the first tick, not with process start-up
            if self.training_log is not None:
                self.training_log.start(self.clock.time())
        # One reading of the clock for the tokens and the time they are reported with: the clock moves on (× speed)
        # while the tick writes files, and a loaded machine can hold the thread for seconds of simulated time.
        elapsed = self.clock.elapsed()
        now = elapsed - self._origin
        stamp = self.stamp = self.clock.wall_at(elapsed)
        dt = max(now - self._last, 0.0)
        if dt > LATE_AFTER and self._last > 0.0:
            self.late.append({"start": stamp - dt, "end": stamp})
            del self.late[:-LATE_KEPT]
        self._last = now
        incident = self.schedule.incident(now)
        if incident != self.incident:
            log.info("demo: %s", f"incident {incident} begins" if incident else f"incident {self.incident} ends")
            self._record(incident, now, stamp)
            if incident == "crash-restart":
                self._crash()
            elif self.incident == "crash-restart":
                self._restart(now, stamp)
            if self.incident == "checkpoint-stall" and self.checkpoints.writing:
                self._stall_ends(stamp)
            if "nccl-socket-fallback" in (incident, self.incident):
                # NCCL re-initialises into the fallback (no IB device found) and out of it once fixed. The demo's
                # process and its reporter's run go on: the ledger shows one run, not a restart.
                self.nccl_log.run_starts(sockets=incident == "nccl-socket-fallback")
            self.incident = incident
            self._stall_pending = incident == "checkpoint-stall"
            with self._counters_lock:
                self._advance_counters()  # the counts so far at the old rates, then the incident's
                self._apply(incident)
        if self._restoring is not None:
            began, ends, _ = self._restoring
            # The disk reads only while the load lasts: a late tick's span reaches before its start or past its end.
            self.storage.tick(max(min(now, ends) - max(now - dt, began), 0.0), 0.0, restoring=True)
            if now < ends:
                self.sync_counters()
                return  # loading the checkpoint: no steps yet
            self._restored(stamp)
        self._checkpoint(now)
        factor = RATE_FACTOR[self.incident]
        if self.checkpoints.writing and self.incident != "checkpoint-stall":
            factor *= 0.95  # staging a checkpoint costs a little even on good storage
        rate = healthy_tokens_per_second() * factor * (1 + self.random.uniform(-0.02, 0.02))
        self.tokens += rate * dt
        self.sync_counters()
        self.storage.tick(dt, rate / healthy_tokens_per_second(), restoring=False)  # the loader reads as it trains
        self.data_wait += self.data_wait_share * dt
        if self.progressing and self.reporter is not None:
            self.reporter.update(
                tokens_total=int(self.tokens),
                step=int(self.tokens // TOKENS_PER_STEP),
                data_wait_seconds=self.data_wait,
            )
        if self.progressing and self.training_log is not None:
            self.training_log.progress(stamp, self.tokens)
        if now >= self._next_dump and self.progressing:
            self._next_dump = now + INSPECTOR_EVERY
            for _ in range(ALLREDUCES_PER_DUMP):
                self.inspector.dump(stamp, self._allreduce_times())

    def _allreduce_times(self) -> dict[int, float]:
        """Each rank's all-reduce time: the straggler's is the shortest, since its peers wait in it for it."""
        if self.incident == "straggler":
            return {gpu: ALLREDUCE_US * (0.25 if gpu == SLOW_GPU else 1.7) for gpu in JOB_GPUS}
        slow = 1 / RATE_FACTOR[self.incident]
        return {gpu: ALLREDUCE_US * min(slow, 10.0) * (1 + self.random.uniform(-0.03, 0.03)) for gpu in JOB_GPUS}

    def sync_counters(self) -> None:
        """Advance the NICs' and GPUs' counters to the simulated now: a source about to read them calls this
        (``ReadsNow``), and so does each tick."""
        with self._counters_lock:
            self._advance_counters()

    def _advance_counters(self) -> None:
        now = self.clock.monotonic()
        # Two sources reading at once (RDMA, ethtool) share one write: a few simulated milliseconds are no traffic.
        if now - self._counters_at >= 0.01:
            self.fabric.tick(now - self._counters_at)
            self.nvml.advance(now - self._counters_at)
            self._counters_at = now

    @property
    def progressing(self) -> bool:
        """Whether the job's steps complete now: not while its rank is gone (gpu-lost) or its process (a crash)."""
        return self.incident is None or INCIDENT_BY_NAME[self.incident].progress

    def _record(self, incident: str | None, now: float, stamp: float) -> None:
        if self.timeline and self.timeline[-1]["end"] is None:
            self.timeline[-1].update(end=stamp, end_elapsed=round(now, 3))
        if incident is not None:
            row = INCIDENT_BY_NAME[incident].as_json()
            self.timeline.append(
                {**row, "start": stamp, "start_elapsed": round(now, 3), "end": None, "end_elapsed": None}
            )

    def truth(self) -> dict[str, Any]:
        """What the simulation knows, for ``GET /api/v1/demo``: the incident table (each one's cause and the jobs it
        touches), the jobs and their GPUs, and the incidents so far with their start and end on the demo clock
        (simulated Unix time, as the status API's ``time``; ``*_elapsed``: seconds since the schedule began), and
        the spans in which the simulation fell behind its clock (``late``: the job was silent there, truly)."""
        now = self.clock.time()
        names = (self.schedule.forced,) if self.schedule.forced else self.schedule.incidents
        lengths = {name: self.schedule.seconds(name) for name in names}
        return {
            "time": now,
            "speed": self.clock.speed,
            "jobs": {
                JOB: {"gpus": list(JOB_GPUS), "reports": True},
                DISCOVERED_JOB: {"gpus": list(DISCOVERED_GPUS), "reports": False},
            },
            "schedule": {
                "forced": self.schedule.forced,
                "healthy_seconds": self.schedule.healthy,
                "rotation_seconds": self.schedule.rotation_seconds,
                "incidents": list(self.schedule.incidents),
                # How long each incident lasts here (--for, else its row's seconds); null: until the demo stops.
                "incident_seconds": {
                    name: None if math.isinf(seconds) else seconds for name, seconds in lengths.items()
                },
            },
            "incident_table": [incident.as_json() for incident in INCIDENT_TABLE],
            "incident": self.incident,
            "incidents": [dict(row) for row in self.timeline],
            "late": [dict(span) for span in self.late],
        }

    def _checkpoint(self, now: float) -> None:
        # A stall is storage gone slow for as long as the stall lasts: the write under way, or one started now, takes
        # fifteen minutes, and the job writes again while it lasts (a rotation's stall lasts as long as one write).
        # When it ends the storage is fast again and the write under way completes (_stall_ends).
        if self.incident == "checkpoint-stall" and (self._stall_pending or not self.checkpoints.writing):
            self._stall_pending = False
            if self.checkpoints.writing:
                self.checkpoints.duration = STALLED_CHECKPOINT_SECONDS
            else:
                self._start_checkpoint(now, STALLED_CHECKPOINT_SECONDS)
        if (
            not self.checkpoints.writing
            and now >= self._next_checkpoint
            and self.incident is None
            # A routine write ends before the next incident begins: the demo's incidents each have one cause, and
            # the checkpoint would outrank it while both were on (the write waits for the incident to pass).
            and self.schedule.next_start(now) - now > CHECKPOINT_SECONDS + 1.0
        ):
            self._start_checkpoint(now, CHECKPOINT_SECONDS)
        self.checkpoints.advance(self.clock.time())
        if not self.checkpoints.writing and self._checkpointed[1] is not None:
            self._checkpointed = (self._checkpointed[1], None)  # the write completed: a restart resumes from it
        if self.incident == "checkpoint-stall" and not self.checkpoints.writing:
            self._start_checkpoint(now, STALLED_CHECKPOINT_SECONDS)  # the next write, on the storage still slow

    def _stall_ends(self, stamp: float) -> None:
        """The storage is fast again: the write the stall held completes at once."""
        self.checkpoints.duration = max(stamp - self.checkpoints.started, 0.0)
        self.checkpoints.advance(stamp)
        if self._checkpointed[1] is not None:
            self._checkpointed = (self._checkpointed[1], None)

    def _start_checkpoint(self, now: float, duration: float) -> None:
        self.checkpoints.start(int(self.tokens // TOKENS_PER_STEP), self.clock.time(), duration)
        self._checkpointed = (self._checkpointed[0], self.tokens)
        self._next_checkpoint = now + CHECKPOINT_EVERY

    def _crash(self) -> None:
        """The job's process dies: its reporter sends nothing more, its pod goes away, a write under way is lost."""
        if self.reporter is not None:
            self.reporter.abandon()
            self.reporter = None
        if self.kubelet is not None:
            self.kubelet.set_pods([p for p in discovered_pods(self.nvml) if not p.name.startswith(JOB)])
        self.checkpoints.current = None
        self._checkpointed = (self._checkpointed[0], None)

    def _restart(self, now: float, stamp: float) -> None:
        """A new process (a new pod): it loads the last checkpoint, then redoes the steps since."""
        if self.kubelet is not None:
            self.kubelet.set_pods(discovered_pods(self.nvml))
        self.tokens = self._checkpointed[0]
        step = int(self.tokens // TOKENS_PER_STEP)
        load = None
        if self.new_reporter is not None:
            self.reporter = self.new_reporter()
            load = self.reporter.checkpoint_load(step=step)
            load.__enter__()  # the load spans ticks: ended in _restored
        if self.training_log is not None:
            self.training_log.restart(stamp, step)
        self._restoring = (now, now + RESTORE_SECONDS, load)
        self._next_checkpoint = now + RESTORE_SECONDS + CHECKPOINT_EVERY

    def _restored(self, stamp: float) -> None:
        assert self._restoring is not None
        _, _, load = self._restoring
        self._restoring = None
        if load is not None:
            load.__exit__(None, None, None)
        if self.training_log is not None:
            self.training_log.restored(stamp, int(self.tokens // TOKENS_PER_STEP), RESTORE_SECONDS)

    def _apply(self, incident: str | None) -> None:
        """Set GPU and NIC readings for the incident (or for healthy training)."""
        for gpu in self.nvml.gpus:
            train_healthily(gpu)
        for index in DISCOVERED_GPUS:
            self.nvml.gpus[index].set_activity(tensor=DISCOVERED_TENSOR_ACTIVE, sm=80.0, occupancy=35.0, dram=40.0)
        for nic in self.fabric.nics:
            nic.utilization, nic.rx_pause_ratio, nic.tx_pause_ratio, nic.cnp_per_second = 0.35, 0.0, 0.0, 20.0
            nic.stalls_per_second = 0.0
        self.data_wait_share = DATA_WAIT_SHARE
        self.storage.dataset_read_rate = DATASET_READ_RATE
        if incident is not None:
            INCIDENT_BY_NAME[incident].apply(self)
        if self.lost and incident != "gpu-lost":
            self.nvml.gpus[LOST_GPU].lost = False  # a reset brings it back; NVML re-init picks it up
            self.lost = False
        if self.ecc and incident != "uncorrectable-ecc":
            self.nvml.reset(ECC_GPU)  # the recovery action done, the row remapped: the exporter sees the reset
            self.ecc = False


def demo_defaults(node: DemoNode, kubelet_socket: str | None = None) -> dict:
    """The demo's own config, as a YAML file would say it: its job, its checkpoint directory and training log, its
    kubelet for discovery, and settings that make changes show within seconds rather than minutes."""
    # From a log, the parameters and sequence length are what the log prints. Its shape (layers, heads, head size)
    # torchtitan's lines leave out, though its own MFU counts the attention's FLOPs with it: configured, so both
    # count the same FLOPs per token.
    shape = {key: MODEL[key] for key in ("layers", "heads", "head_dim")}
    model = MODEL if node.training_log is None else {**shape, "target_tokens": NODE_TARGET_TOKENS}
    watch = {"path": str(node.checkpoints.root), "job": JOB, "done_marker": ".metadata"}
    # The job's NCCL_DEBUG_FILE: the transport NCCL chose. It reports progress through its ProgressReporter, or
    # (--progress logs) through its training log too.
    files = [{"path": str(node.nccl_log.path), "job": JOB}]
    if node.training_log is not None:
        files.append({"path": str(node.training_log.path), "job": JOB, "format": "torchtitan"})
    logs = {"files": files, "discovered_pods": False, "interval": "1s"}
    defaults: dict = {
        # Evaluated every second, as the hardware is sampled: each incident's cause shows within a second of it.
        "mfu": {"window": "15s", "interval": "1s"},
        "sources": {
            # Every second, not the 5 s default, here and for the checkpoints: the demo's incidents are a few
            # seconds long, and its viewer sees each one's cause within a second of it.
            "gpu": {"interval": "1s", "retry_interval": "30s"},
            "rdma": {"interval": "1s"},
            "ethtool": {"interval": "1s"},
            "checkpoint": {"watch": [watch], "interval": "1s"},
            "logs": logs,
            "nccl": {
                "inspector_paths": [str(node.inspector.directory)],
                "tests_paths": [str(node.nccl_tests.directory / "*.txt")],
                "interval": "2s",
            },
            "storage": {"interval": "1s"},  # a restore (15 s of demo time) spans a few storage samples
        },
        # The discovered job has no expected_mfu: learn its healthy hardware figure in ten simulated seconds
        # rather than the default five minutes, so its cause shows soon after start.
        "attribution": {"baseline_interval": "1s", "baseline_min_samples": 10},
        "jobs": {
            JOB: {
                **model,
                "dtype": "bf16",
                "gpus": list(JOB_GPUS),
                "expected_mfu": STEADY_MFU,
                "data_paths": [f"{DATASET_MOUNT}/{JOB}"],
            }
        },
    }
    if kubelet_socket:
        defaults["discovery"] = {
            "interval": "2s",
            "kubernetes": {"enabled": "true", "socket": kubelet_socket, "api_server": {"enabled": "false"}},
            "slurm": {"enabled": "false"},
        }
    return defaults


def merged(base: Any, over: Any) -> Any:
    """``over`` merged over ``base``: mappings key by key, anything else (a list, a value) replaced; an empty
    section (``sources:`` with nothing under it) keeps the base's."""
    if isinstance(base, dict) and over is None:
        return base
    if isinstance(base, dict) and isinstance(over, dict):
        return {**base, **{key: merged(base.get(key), value) for key, value in over.items()}}
    return over


def demo_config(config_path: str | None, node: DemoNode, kubelet_socket: str | None = None) -> dict:
    """The demo's config: ``demo_defaults`` with the file's keys merged over them, validated as the daemon
    validates a file (errors name the file and key). A ``discovery`` section in the file replaces the demo's whole
    (a real pod-resources socket or Slurm mapping directory, matched against the simulated GPUs), so the demo's
    kubelet does not mix into it."""
    raw = read_yaml(config_path) if config_path else None
    file = config_path or "<config>"
    if raw is not None and not isinstance(raw, dict):
        validate(raw, file)  # the daemon's error for a file that is not a mapping
    config = merged(demo_defaults(node, kubelet_socket), raw)
    if isinstance(raw, dict) and "discovery" in raw:
        config["discovery"] = raw["discovery"]
    return validate(config, file)


class ReadsNow:
    """A source that reads the simulated counters (RDMA's sysfs counters, the ethtool texts, NVML's energy and
    throttle times): before each sample they advance to the simulated now, as real counters run on between a
    simulation's ticks. Stepped with the simulation
    instead, a source sampling about as often would see one tick's counts, or none, or two (a pause ratio of 0 or
    twice the truth). Everything else is the real source's."""

    def __init__(self, source: Source, node: DemoNode):
        self.source = source
        self.node = node
        self.name, self.interval, self.timeout = source.name, source.interval, source.timeout

    def sample(self) -> Snapshot:
        with self.node.clock.pinned():
            self.node.sync_counters()
            return self.source.sample()

    def close(self) -> None:
        self.source.close()


class Simulation:
    """Runs ``DemoNode.tick`` in a thread (file writes must not stall the event loop) until stopped."""

    def __init__(self, node: DemoNode, period: float):
        self.node = node
        self.period = period
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="demo-simulation", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            try:
                self.node.tick()
            except Exception:
                log.exception("demo tick failed")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def discovered_pods(nvml: fake_nvml.FakeNvml) -> list[SimPod]:
    """The pods the demo's kubelet lists, with the NVIDIA device plugin's GPU UUIDs: the reporting job's, and the
    uninstrumented job's two."""
    uuids = [nvml.gpus[i].uuid for i in DISCOVERED_GPUS]
    return [
        # The reporting job's own pod too: discovery and its reports are one job (found_by lists both).
        SimPod(f"{JOB}-master-0", "research", {"pytorch": [("nvidia.com/gpu", [nvml.gpus[i].uuid for i in JOB_GPUS])]}),
        SimPod(f"{DISCOVERED_JOB}-worker-0", "research", {"trainer": [("nvidia.com/gpu", uuids[:2])]}),
        SimPod(f"{DISCOVERED_JOB}-worker-1", "research", {"trainer": [("nvidia.com/gpu", uuids[2:])]}),
    ]


def build_demo(
    args: argparse.Namespace, root: Path, flags: Callable[[dict], Any] | None = None
) -> tuple[Service, DemoNode, Simulation]:
    """The demo's service, node and simulation; ``flags`` applies the command line over the config (flags win)."""
    clock = SimClock(args.speed)
    progress = getattr(args, "progress", "api")
    schedule = Schedule.from_flags(
        args.incident,
        getattr(args, "incident_gap", None),
        getattr(args, "incident_for", None),
        getattr(args, "warmup", None),
    )
    node = DemoNode(root, clock, schedule, seed=args.seed, progress=progress)
    socket = str(root / "kubelet.sock")
    config = demo_config(args.config, node, kubelet_socket=socket)
    if flags is not None:
        flags(config)
    if typed_config(config).discovery.kubernetes.socket == socket:
        node.kubelet = PodResourcesServer(socket, discovered_pods(node.nvml)).start()
    if node.training_log is not None:
        node.training_log.path.touch()  # the logs source follows it from the start
    ctx = node.context(config)
    sources = [
        ReadsNow(source, node) if source.name in COUNTER_SOURCES else source for source in build_sources(config, ctx)
    ]
    require_sources(config, sources, args.config)
    service = build_service(
        config, sources, clock=clock.time, paths=ctx.paths, monotonic=clock.monotonic, speed=args.speed
    )
    # A tick (and the job's progress report) about once a simulated second, as the sources sample and the exporter
    # evaluates: a stop shows one report interval after it. At most 20 a wall second however fast the clock.
    return service, node, Simulation(node, period=min(1.0, max(1.0 / args.speed, 0.05)))
