"""Preflight's facts of one node (its RDMA ports, GPUs, kernel trees, NIC QoS and the job's NCCL environment, read
once per run by ``gather``) and what a check gives back (``CheckResult``, ``Status``); the checks themselves are
``mfu_exporter.preflight.fabric`` and ``mfu_exporter.preflight.checks``."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Mapping

import pynvml

from mfu_exporter.config import DEFAULTS, PreflightConfig
from mfu_exporter.node.nic_qos import KernelNicQos, NicQos
from mfu_exporter.node.nvml import NvmlSession, clock_event_reasons
from mfu_exporter.node.pci import PciTopology, pci_address_from_nvml
from mfu_exporter.node.rdma import RdmaPort, discover_ports

MIB = 1024 * 1024
GUIDE_NCCL = {"NCCL_IB_DISABLE": "0", "NCCL_NET_GDR_LEVEL": "5"}  # the guide's all_reduce_perf command line
_DEFAULT = DEFAULTS.sources.preflight  # the defaults are the config table's (mfu_exporter/config/), written once


TRANSLATED_IOMMU_TYPES = ("DMA", "DMA-FQ")

# NVML clocks-event reasons that mean the GPU is being held back by a fault, not by load or settings.
THROTTLE_FAULTS = {
    0x08: "hw_slowdown",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake",
}


class Status(str, Enum):
    PASS = "PASS"
    WARN = "WARN"
    FAIL = "FAIL"
    SKIP = "SKIP"


@dataclass(frozen=True)
class CheckResult:
    check: str
    status: Status
    observed: str
    expected: str
    fix: str = ""

    def as_json(self) -> dict[str, str]:
        return {
            "check": self.check,
            "status": self.status.value,
            "observed": self.observed,
            "expected": self.expected,
            "fix": self.fix,
        }


@dataclass(frozen=True)
class PreflightSettings:
    """What this node should look like: the checks' part of ``sources.preflight`` (``PreflightConfig``)."""

    roce_priority: int = _DEFAULT.roce_priority
    link_layer: str | None = _DEFAULT.link_layer  # "Ethernet" or "InfiniBand"; None: any, as long as all ports agree
    port_rate_gbps: float | None = _DEFAULT.port_rate_gbps  # None: the fastest active port sets the expectation
    min_node_gbps: float = _DEFAULT.min_node_gbps
    socket_buffer_bytes: int = _DEFAULT.socket_buffer_bytes
    expected_gpus: int | None = _DEFAULT.expected_gpus
    devices_include: tuple[str, ...] = _DEFAULT.devices_include
    devices_exclude: tuple[str, ...] = _DEFAULT.devices_exclude

    @classmethod
    def from_config(cls, section: PreflightConfig) -> PreflightSettings:
        return cls(**{name: getattr(section, name) for name in cls.__dataclass_fields__})


# --- facts ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuDevice:
    index: int
    name: str | None = None
    pci_address: str | None = None
    persistence_mode: bool | None = None  # None: not supported on this GPU
    clocks_event_reasons: int | None = None
    lost: str | None = None  # the NVML error when the GPU does not answer


@dataclass(frozen=True)
class GpuFacts:
    devices: tuple[GpuDevice, ...] = ()
    unavailable: str | None = None  # why NVML could not be asked; the GPU checks SKIP with it


def read_gpus(nvml: Any, session: NvmlSession | None = None) -> GpuFacts:
    """Every GPU NVML enumerates, with what the checks need (``nvml``: ``pynvml`` or a fake of it), borrowing the
    process's NVML ``session`` (the daemon's, shared with the GPU source; ``mfu-exporter check``: one of its own)."""
    session = session or NvmlSession(nvml)
    with session.lock:  # the GPU source's re-initialisation waits for this read
        try:
            session.acquire()
        except nvml.NVMLError as exc:
            return GpuFacts(unavailable=f"NVML unavailable: {exc}")
        try:
            try:
                count = nvml.nvmlDeviceGetCount()
            except nvml.NVMLError as exc:  # a driver in a bad state can init and still fail to enumerate
                return GpuFacts(unavailable=f"NVML could not count the GPUs: {exc}")
            return GpuFacts(tuple(_read_gpu(nvml, index) for index in range(count)))
        finally:
            session.release()


def _read_gpu(nvml: Any, index: int) -> GpuDevice:
    def optional(call: Callable, *args):
        try:
            return call(*args)
        except nvml.NVMLError as exc:
            if exc.value == nvml.NVML_ERROR_NOT_SUPPORTED:
                return None
            raise

    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        name = nvml.nvmlDeviceGetName(handle)
        address = pci_address_from_nvml(nvml.nvmlDeviceGetPciInfo(handle).busId)
        persistence = optional(nvml.nvmlDeviceGetPersistenceMode, handle)
        reasons = optional(clock_event_reasons, nvml, handle)
    except nvml.NVMLError as exc:
        return GpuDevice(index, lost=str(exc))
    return GpuDevice(
        index,
        name.decode() if isinstance(name, bytes) else name,
        address,
        None if persistence is None else persistence == nvml.NVML_FEATURE_ENABLED,
        reasons,
    )


@dataclass
class NodeFacts:
    """What the checks read, gathered once per run."""

    sysfs: Path
    procfs: Path
    ports: list[RdmaPort]
    gpus: GpuFacts
    qos: NicQos
    nccl_env: Mapping[str, str] | None  # None: no job environment was given
    topology: PciTopology = field(init=False)

    def __post_init__(self):
        self.topology = PciTopology(self.sysfs)

    @property
    def active_ports(self) -> list[RdmaPort]:
        return [p for p in self.ports if p.active]

    @property
    def roce_netdevs(self) -> list[str]:
        return sorted({p.netdev for p in self.ports if p.link_layer == "Ethernet" and p.netdev})

    def nic_addresses(self) -> dict[str, str]:
        """RDMA device → PCI address, for the devices whose address is known."""
        return {p.device: p.pci_address for p in self.ports if p.pci_address}


def plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def gather(
    settings: PreflightSettings,
    sysfs: str | Path = "/sys",
    procfs: str | Path = "/proc",
    nvml: Any = pynvml,
    qos: NicQos | None = None,
    nccl_env: Mapping[str, str] | None = None,
    nvml_session: NvmlSession | None = None,
) -> NodeFacts:
    ports = discover_ports(str(sysfs), list(settings.devices_include), list(settings.devices_exclude))
    gpus = read_gpus(nvml, nvml_session)
    return NodeFacts(Path(sysfs), Path(procfs), ports, gpus, qos or KernelNicQos(), nccl_env)
