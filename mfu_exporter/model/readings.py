"""What the sources' snapshots carry for the model to read: typed readings, not the status page's JSON.

The GPU source builds a ``GpuReading`` per GPU and sample (its ``GpuSample.gpus``, by index); the renderer, the job
model's hardware figures and the attribution read them. The RDMA and ethtool sources build their own dataclasses
(``mfu_exporter.sources.rdma.PortReading``, ``mfu_exporter.sources.ethtool.InterfaceReading``) on top of node/ counters the
model may not import; ``PortSignal`` and ``InterfaceSignal`` are the parts of them the attribution reads, so the type
checker holds both sides to one shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class GpuInfo:
    """One GPU of this node as the GPU source sees it; all that jobs need to know to find their peak."""

    index: int
    uuid: str
    name: str


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU in one sample, in base units and ratios 0–1. A figure is None when NVML did not give it this time
    (MIG mode, a call this GPU does not support, a passing error); a GPU that is down (``up`` False) keeps only its
    identity, MIG mode, Xid count and health."""

    index: int  # the ``gpu`` label: NVML's index when the exporter first saw the GPU
    uuid: str
    name: str
    pci_bus_id: str = ""  # NVML's bus ID ("00000000:1B:00.0"), to place the GPU in the PCIe topology
    up: bool = True
    mig: bool = False
    throttle_reasons: tuple[str, ...] = ()  # the clock-event reasons set at the sample's instant, by name
    # Cumulative seconds the SM clock was held down, per reason: (reason, seconds) pairs, in THROTTLE_TIME order.
    throttle_seconds: tuple[tuple[str, float], ...] = ()
    # The share of the time since the previous sample each reason held the SM clock down (0–1), from the growth of
    # ``throttle_seconds``: an episode that began and ended between two samples counts in full. Empty on the first
    # sample and for a reason without a counter; the attribution reads the state bits for those.
    throttle_ratio: tuple[tuple[str, float], ...] = ()
    xid_count: int = 0  # Xid errors since the exporter started
    xids: tuple[tuple[int, int], ...] = ()  # (Xid, count) since the exporter started, by Xid
    health: str = "healthy"  # one of mfu_exporter.model.xid.HEALTH_STATES: what the GPU's Xids and NVML ask for
    utilization: float | None = None
    memory_utilization: float | None = None
    memory_used_bytes: float | None = None
    memory_total_bytes: float | None = None
    sm_clock_hz: float | None = None
    sm_clock_max_hz: float | None = None
    power_watts: float | None = None
    power_limit_watts: float | None = None
    temperature: float | None = None  # °C
    tensor_active: float | None = None
    sm_active: float | None = None
    sm_occupancy: float | None = None
    dram_active: float | None = None
    hardware_flops_utilization: float | None = None
    energy_joules: float | None = None
    nvlink_transmit_bytes: float | None = None
    nvlink_receive_bytes: float | None = None
    pcie_transmit_bytes: float | None = None
    pcie_receive_bytes: float | None = None
    ecc_corrected: float | None = None
    ecc_uncorrected: float | None = None
    nvlink_errors: float | None = None  # CRC, replay and recovery errors summed over the GPU's links
    clocks_event_reasons: int | None = None  # NVML's bitmask, of which ``throttle_reasons`` names the bits


class RdmaPortFacts(Protocol):
    """What the attribution reads of an RDMA port's identity (``mfu_exporter.node.rdma.RdmaPort``)."""

    @property
    def device(self) -> str: ...

    @property
    def netdev(self) -> str | None: ...

    @property
    def pci_address(self) -> str | None: ...

    @property
    def active(self) -> bool: ...


class PortSignal(Protocol):
    """What the attribution reads of one RDMA port's sample (``mfu_exporter.sources.rdma.PortReading``)."""

    @property
    def port(self) -> RdmaPortFacts: ...

    @property
    def error_deltas(self) -> dict[str, int]: ...

    @property
    def congestion_rates(self) -> dict[str, float]: ...


class InterfaceSignal(Protocol):
    """What the attribution reads of one interface's ethtool sample (``mfu_exporter.sources.ethtool.InterfaceReading``)."""

    @property
    def rdma_ports(self) -> tuple[str, ...]: ...

    @property
    def pause_ratio(self) -> dict[tuple[str, int | str], float]: ...

    @property
    def storm_event_deltas(self) -> dict[str, int]: ...


class MountSignal(Protocol):
    """What the attribution reads of one mount's storage sample (``mfu_exporter.sources.storage.MountReading``): the
    evidence of the cause ``input`` names the read throughput of the job's dataset mounts."""

    @property
    def mount_point(self) -> str: ...

    @property
    def fstype(self) -> str: ...

    @property
    def device(self) -> str: ...

    @property
    def read_bytes_per_second(self) -> float | None: ...

    @property
    def jobs(self) -> tuple[tuple[str, str], ...]: ...


@dataclass(frozen=True, slots=True)
class JobCollectives:
    """What a job's collectives say on this node, for the attribution: the NCCL transport its log shows
    (``mfu_exporter.nccl.debug``) and the slow rank that the job, NCCL Inspector or the node's own GPUs name. The
    sources fill it; the model never parses NCCL's or a framework's text."""

    transport: str | None = None  # "ib", "roce", "socket", "ofi", "mixed"; None while the log has not said
    socket_fallback: bool = False  # inter-node traffic went over TCP sockets
    transport_evidence: str = ""  # the NCCL line(s) that show it
    straggler: str | None = None  # who holds the job back, with the evidence; None when nobody is named
