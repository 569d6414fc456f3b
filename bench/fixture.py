"""The full-node fixture the benchmarks run on.

Eight H100s through the fake NVML, eight ConnectX-7 RoCE ports with every ``counters/`` and ``hw_counters/`` file,
their eight netdevs with at least 300 ``ethtool -S`` statistics each, and four jobs of two GPUs each reporting
progress and one checkpoint write each. Only the inputs are simulated: the daemon runs the real sources on them (the GPU source on the fake
NVML module, the RDMA source on the sysfs tree, the ethtool source on ``ethtool -S`` texts) and every other source
the service registers, as a real node's daemon does.

The fabric files are written by the bench driver (``SimulatedNode.tick``), not by the daemon, so the daemon's CPU
is the exporter's own. ``Hangable`` wraps a source so the driver can make its sample hang, as NVML's calls do on a
sick GPU.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from mfu_exporter.config import validate
from mfu_exporter.node.ethtool import EthtoolTextReader
from mfu_exporter.node.nic_qos import NicQos
from mfu_exporter.sim import nvml as fake_nvml
from mfu_exporter.sim.mlx5 import SimulatedNode, ethtool_stat_names
from mfu_exporter.sources import Paths, SourceContext, build_sources
from mfu_exporter.sources.base import Source

GPUS = 8
NICS = 8
MIN_ETHTOOL_STATS = 300
GPUS_PER_JOB = 2
JOBS = tuple(f"bench-job-{index}" for index in range(GPUS // GPUS_PER_JOB))
MODEL = {"params": 8.03e9, "layers": 32, "heads": 32, "head_dim": 128, "seq_len": 8192}
TOKENS_PER_REPORT = 4 * 8192


def ethtool_channels(minimum: int = MIN_ETHTOOL_STATS) -> int:
    """Channels a ConnectX-7 netdev needs to show at least ``minimum`` stats (each channel adds 60)."""
    channels = 1
    while len(ethtool_stat_names(channels=channels)) < minimum:
        channels += 1
    return channels


def build_fabric(root: Path) -> SimulatedNode:
    """The NICs' sysfs tree (``root/sys``) and ``ethtool -S`` texts (``root/ethtool``), loaded as in training."""
    fabric = SimulatedNode(root, nics=NICS, channels=ethtool_channels())
    for nic in fabric.nics:
        nic.utilization, nic.cnp_per_second, nic.rx_pause_ratio = 0.35, 20.0, 0.001
    fabric.tick(1.0)
    return fabric


def build_gpus() -> fake_nvml.FakeNvml:
    """Eight H100s in steady training, as the demo's healthy node has them."""
    nvml = fake_nvml.FakeNvml([fake_nvml.h100(index) for index in range(GPUS)])
    for gpu in nvml.gpus:
        fake_nvml.train_healthily(gpu)
    return nvml


# The sources whose interval sets most of the daemon's CPU (5 s by default): what ``node_config(interval=...)`` sets.
HARDWARE_SOURCES = ("gpu", "rdma", "ethtool")


def node_config(
    listen_address: str = "127.0.0.1:9495", interval: float | None = None, mfu_interval: float | None = None
) -> dict:
    """Every default, as a node runs with an empty config file, on a loopback address, except job discovery: the
    fixture has no kubelet and no Slurm, and discovery would read this machine's (its socket, its processes).
    ``interval`` (seconds) replaces the 5 s default of the GPU, RDMA and ethtool sources (``HARDWARE_SOURCES``);
    ``mfu_interval`` that of the job model's tick (``mfu.interval``)."""
    off = {"enabled": False}
    document: dict[str, Any] = {
        "web": {"listen_address": listen_address},
        "discovery": {"kubernetes": off, "slurm": off},
    }
    if interval is not None:
        document["sources"] = {name: {"interval": f"{interval:g}s"} for name in HARDWARE_SOURCES}
    if mfu_interval is not None:
        document["mfu"] = {"interval": f"{mfu_interval:g}s"}
    return validate(document)


def node_context(
    config: dict, fixture_root: Path, nvml: Any, procfs: str = "/proc", qos: NicQos | None = None
) -> SourceContext:
    """The fixture as the sources see it: the sysfs tree under ``fixture_root``, NVML is ``nvml``, and the ethtool
    source reads the fixture's ``ethtool -S`` texts instead of the ioctl; ``procfs`` and ``qos`` for preflight."""
    return SourceContext(
        config,
        Paths(sysfs=str(fixture_root / "sys"), procfs=procfs),
        nvml=nvml,
        ethtool_reader=EthtoolTextReader.from_directory(str(fixture_root / "ethtool")),
        nic_qos=qos,
    )


def node_sources(config: dict, fixture_root: Path, nvml: Any) -> list[Source]:
    """Every source the config enables, built by ``build_sources`` as a node's daemon builds them, on the fixture."""
    return build_sources(config, node_context(config, fixture_root, nvml))


def progress_report(job_index: int, job: str, tokens_total: int, step: int) -> dict[str, Any]:
    """The body ``ProgressReporter.update`` posts: the totals plus the model facts every report carries."""
    first_gpu = (job_index % len(JOBS)) * GPUS_PER_JOB
    return {
        "job": job,
        "run": f"{job}-run",  # the reporter's run id: one process per job
        "tokens_total": tokens_total,
        "time": time.time(),
        "step": step,
        "model": MODEL,
        "dtype": "bf16",
        "gpus": list(range(first_gpu, first_gpu + GPUS_PER_JOB)),
    }


def checkpoint_event(job: str) -> dict[str, Any]:
    """One checkpoint write the job timed itself (``POST /api/v1/checkpoints``): its series exist from then on."""
    return {"job": job, "checkpoint": "step-1000", "duration_seconds": 38.2, "bytes": 1.6e10}


class Hangable:
    """``source``, except that while the file ``switch`` exists its ``sample()`` blocks until the file is gone, as a
    call into NVML blocks on a GPU that stopped answering: the thread waits without the GIL (sleeping here, in a C
    call there). ``switch`` + ``.blocked`` exists while a sample is blocked, so the driver knows the hang began."""

    HANG_POLL = 0.01

    def __init__(self, source: Source, switch: Path):
        self.source = source
        self.switch = str(switch)
        self.blocked = str(switch) + ".blocked"

    def __getattr__(self, name: str) -> Any:  # name, interval, timeout and whatever else the service reads
        return getattr(self.source, name)

    def sample(self):
        if os.path.exists(self.switch):
            Path(self.blocked).touch()
            try:
                while os.path.exists(self.switch):
                    time.sleep(self.HANG_POLL)
            finally:
                os.unlink(self.blocked)
        return self.source.sample()

    def close(self) -> None:
        self.source.close()
