"""The evidence the attribution reads from the node's signals: which NICs count against a job, a paused or
retransmitting fabric, NCCL on sockets beside an RDMA port, the reasons a GPU's clock was held down. Pure: the
signals are the sources' typed readings, handed in by the service."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable

from mfu_exporter.config import AttributionConfig
from mfu_exporter.model.readings import GpuReading, InterfaceSignal, JobCollectives, MountSignal, PortSignal

SOCKET_FALLBACK = "NCCL uses sockets, not RDMA"
THERMAL_REASONS = frozenset({"hw_thermal_slowdown", "sw_thermal_slowdown"})
POWER_REASONS = frozenset({"sw_power_cap", "hw_power_brake", "hw_slowdown"})
# hw_counters that mean the transport retransmitted or timed out: traffic the collective waited for.
RETRANSMIT_COUNTERS = frozenset(
    {
        "out_of_sequence",
        "packet_seq_err",
        "implied_nak_seq_err",
        "local_ack_timeout_err",
        "rnr_nak_retry_err",
        "req_transport_retries_exceeded",
        "roce_adp_retrans",
        "roce_adp_retrans_to",
    }
)


@dataclass
class NodeSignals:
    """What this node's sources last saw, in the shapes their snapshots' typed readings carry."""

    gpus: dict[int, GpuReading] = field(default_factory=dict)  # GPU source: index -> reading (with its PCI bus ID)
    interfaces: dict[str, InterfaceSignal] = field(default_factory=dict)  # ethtool source: name -> InterfaceReading
    ports: dict[str, PortSignal] = field(default_factory=dict)  # rdma source: "mlx5_0/1" -> PortReading
    checkpoint: Callable[[str], dict | None] = lambda job: None  # the tracker's view of a job's writes
    # The mounts the storage source reads (MountReading), for the evidence of "input": the job's dataset mounts'
    # read throughput. Empty where no storage source runs.
    mounts: tuple[MountSignal, ...] = ()
    # (GPU's NVML bus ID, ((RDMA device, PCI address), ...)) -> the devices on the shortest PCIe path from the GPU.
    # The service binds it to the node's sysfs (``mfu_exporter.node.pci.nearest_devices``); the default places nothing.
    nearest_nics: Callable[[str, tuple[tuple[str, str], ...]], tuple[str, ...]] = lambda bus_id, nics: ()
    # Each job's collectives as its log and NCCL Inspector show them (the logs and nccl sources): job -> reading.
    collectives: dict[str, JobCollectives] = field(default_factory=dict)
    # The longest sampling interval of the sources above (sources.gpu, .rdma, .ethtool: 5 s by default): each
    # reading's shares are over its interval, so a cause holds that long more.
    interval: float = 1.0


@dataclass(frozen=True)
class JobNics:
    """The NICs whose trouble counts against a job: its GPUs' nearest RDMA devices, or (``nearest_to`` None) every NIC."""

    nearest_to: dict[str, tuple[int, ...]] | None  # RDMA device -> the job's GPUs it is nearest to
    every_nic_reason: str = ""

    def why(self, devices: Iterable[str]) -> str | None:
        """Why trouble on a NIC carrying these RDMA devices is the job's, for the evidence; None when it is not."""
        if self.nearest_to is None:
            return self.every_nic_reason
        gpus = sorted({gpu for device in devices for gpu in self.nearest_to.get(device, ())})
        return f"nearest NIC of the job's GPU {', '.join(map(str, gpus))}" if gpus else None


def job_nics(job_gpus: list[int], signals: NodeSignals) -> JobNics:
    """For each of the job's GPUs, the RDMA devices on the shortest PCIe path from it (preflight's GPU/NIC affinity);
    every NIC when the job has all the node's GPUs, or when its GPUs or their place in the topology are unknown."""
    if not job_gpus:
        return JobNics(None, "every NIC counts: the job's GPUs are unknown")
    if not set(signals.gpus) - set(job_gpus):
        return JobNics(None, "every NIC counts: the job has all the node's GPUs")
    nics = tuple(sorted({(r.port.device, r.port.pci_address) for r in signals.ports.values() if r.port.pci_address}))
    nearest_to: dict[str, list[int]] = {}
    unplaced = []
    for index in job_gpus:
        gpu = signals.gpus.get(index)
        bus_id = gpu.pci_bus_id if gpu is not None else None
        devices = signals.nearest_nics(bus_id, nics) if bus_id and nics else ()
        if not devices:
            unplaced.append(index)
        for device in devices:
            nearest_to.setdefault(device, []).append(index)
    if unplaced:
        return JobNics(
            None, f"every NIC counts: no PCI topology places GPU {', '.join(map(str, unplaced))} near an RDMA NIC"
        )
    return JobNics({device: tuple(gpus) for device, gpus in nearest_to.items()})


def network_evidence(signals: NodeSignals, limits: AttributionConfig, nics: JobNics) -> str | None:
    for name, nic in sorted(signals.interfaces.items()):
        why = nics.why({key.split("/")[0] for key in nic.rdma_ports})
        if why is None:
            continue
        paused = {
            key: ratio for key, ratio in nic.pause_ratio.items() if ratio is not None and ratio >= limits.pause_ratio
        }
        if paused:
            (direction, priority), ratio = max(paused.items(), key=lambda kv: kv[1])
            who = "the switch paused it" if direction == "rx" else "it paused the switch"
            return f"{name} paused {100 * ratio:.0f}% of the time on priority {priority} ({who}); {why}"
        storms = {level: n for level, n in nic.storm_event_deltas.items() if n}
        if storms:
            return f"{name}: pause storm events ({', '.join(f'{level} {n}' for level, n in sorted(storms.items()))}); {why}"
    for key, port in sorted(signals.ports.items()):
        why = nics.why([port.port.device])
        if why is None:
            continue
        retransmits = {n: d for n, d in port.error_deltas.items() if n in RETRANSMIT_COUNTERS}
        if retransmits:
            return (
                f"{key} ({port.port.netdev or 'no netdev'}): "
                + ", ".join(f"{n} +{d}" for n, d in sorted(retransmits.items()))
                + f"; {why}"
            )
        cnps = sum(
            rate for name, rate in port.congestion_rates.items() if name in ("np_cnp_sent", "rp_cnp_handled") and rate
        )
        if cnps >= limits.cnp_per_second:
            return f"{key} ({port.port.netdev or 'no netdev'}): {cnps:,.0f} CNPs/s (DCQCN throttling senders); {why}"
    return None


def socket_fallback(collectives: JobCollectives, signals: NodeSignals) -> str | None:
    """NCCL on TCP sockets between nodes while this node has an RDMA port up: the fabric is there, NCCL did not use
    it (NCCL_IB_DISABLE, NCCL_NET, an HCA name NCCL_IB_HCA does not match, no /dev/infiniband in the container)."""
    if not collectives.socket_fallback:
        return None
    active = sorted(key for key, port in signals.ports.items() if port.port.active)
    if not active:
        return None  # no RDMA port up here: sockets are all the node has, not a fallback NCCL chose
    shown = ", ".join(active[:4]) + (f" and {len(active) - 4} more" if len(active) > 4 else "")
    evidence = f"; {collectives.transport_evidence}" if collectives.transport_evidence else ""
    verb = "is" if len(active) == 1 else "are"
    return f"{SOCKET_FALLBACK}: the job's inter-node traffic is on TCP while {shown} {verb} active{evidence}"


def throttled(gpu: GpuReading, reasons: frozenset[str], share: float) -> list[str]:
    """The reasons that held the GPU's SM clock down, for the evidence: a reason with a throttle-time counter when it
    grew by at least ``share`` of the interval since the previous sample (an episode between two samples counts in
    full, whatever the state at either); a reason without one (``hw_slowdown``; every reason on a GPU whose driver
    has no counter and on the first sample) when its clock-event bit is set at the sample."""
    ratios = dict(gpu.throttle_ratio)
    out = []
    for reason in sorted(reasons):
        ratio = ratios.get(reason)
        if ratio is None:
            if reason in gpu.throttle_reasons:
                out.append(reason)
        elif ratio >= share:
            out.append(f"{reason} {100 * ratio:.0f}% of the time")
    return out
