"""Preflight: the guide's fabric verification before a distributed job, as read-only checks of one node.

Each check compares what the node has (socket buffers, RDMA ports, PFC/ECN, GPUDirect, PCIe topology, the job's
NCCL environment, the GPUs) with what a training job needs, and says how to fix a miss; none changes a setting.
A check that does not apply to this machine (no RDMA ports, no NVML) is SKIP with the reason. ``mfu-exporter
check`` prints the results; the daemon's ``preflight`` source exports them as ``mfu_preflight_check_ok``.

Files are read under configurable roots (``--path.sysfs``, ``--path.procfs``) so a container can check its host
and tests can check fixture trees. The PFC and global-pause queries go to the kernel (``exporter.node.nic_qos``).
"""

from __future__ import annotations

import re
import shlex
import textwrap
from collections import Counter
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import pynvml

from exporter.config import DEFAULTS, PreflightConfig
from exporter.node.nic_qos import KernelNicQos, NicQos
from exporter.node.nvml import NvmlSession, clock_event_reasons
from exporter.node.pci import Affinity, GdrLevel, PciTopology, acs_redirects, pci_address_from_nvml, read_attribute
from exporter.node.rdma import RdmaPort, discover_ports

MIB = 1024 * 1024
GUIDE_NCCL = {"NCCL_IB_DISABLE": "0", "NCCL_NET_GDR_LEVEL": "5"}  # the guide's all_reduce_perf command line
_DEFAULT = DEFAULTS.sources.preflight  # the defaults are the config table's (exporter/config.py), written once


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


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


# --- checks: socket buffers -------------------------------------------------------------------------------------


SOCKET_BUFFER_SYSCTLS = ("net.core.rmem_max", "net.core.wmem_max", "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem")


def check_socket_buffer(facts: NodeFacts, settings: PreflightSettings, name: str) -> CheckResult:
    minimum = settings.socket_buffer_bytes
    expected = f"max ≥ {minimum} ({minimum / MIB:g} MiB)"
    text = read_attribute(facts.procfs / "sys" / name.replace(".", "/"))
    if text is None:
        return CheckResult(name, Status.SKIP, f"{name} not present under {facts.procfs}/sys", expected)
    values = text.split()
    maximum = int(values[-1])
    observed = " ".join(values)
    if maximum >= minimum:
        return CheckResult(name, Status.PASS, observed, expected)
    if len(values) == 3:  # tcp_rmem/tcp_wmem: min default max; keep the first two, raise the max
        fix = f'sysctl -w {name}="{values[0]} {values[1]} {minimum}"'
    else:
        fix = f"sysctl -w {name}={minimum}"
    return CheckResult(name, Status.FAIL, f"{observed} ({maximum / MIB:g} MiB)", expected, fix)


# --- checks: RDMA ports -----------------------------------------------------------------------------------------


def _no_ports(facts: NodeFacts) -> str:
    return f"no RDMA devices under {facts.sysfs}/class/infiniband"


def _port_probe(port: RdmaPort) -> str:
    """The command that shows why a port is not what it should be."""
    if port.link_layer == "Ethernet" and port.netdev:
        return f"ethtool {port.netdev}"
    return f"ibstat {port.device} {port.port}"


def check_port_state(facts: NodeFacts, settings: PreflightSettings) -> CheckResult:
    expected = "every RDMA port ACTIVE"
    if not facts.ports:
        return CheckResult("rdma.port_state", Status.SKIP, _no_ports(facts), expected)
    down = [p for p in facts.ports if not p.active]
    if not down:
        return CheckResult("rdma.port_state", Status.PASS, f"{_plural(len(facts.ports), 'port')} ACTIVE", expected)
    fixes = []
    for port in down:
        if port.link_layer == "Ethernet" and port.netdev:
            fixes.append(f"ip link set dev {port.netdev} up")
        fixes.append(_port_probe(port))
    observed = ", ".join(f"{p.key} {p.state or 'state unknown'}" for p in down)
    return CheckResult(
        "rdma.port_state",
        Status.FAIL,
        observed,
        expected,
        "; ".join(fixes) + " (then check cable, switch port and, on InfiniBand, the subnet manager)",
    )


def check_port_rate(facts: NodeFacts, settings: PreflightSettings) -> CheckResult:
    active = facts.active_ports
    if not active:
        reason = _no_ports(facts) if not facts.ports else "no ACTIVE port to measure"
        return CheckResult("rdma.port_rate", Status.SKIP, reason, "each port at its expected rate")
    expected_gbps = settings.port_rate_gbps or max(p.rate_gbps or 0.0 for p in active)
    source = "sources.preflight.port_rate_gbps" if settings.port_rate_gbps else "the fastest port"
    expected = f"≥ {expected_gbps:g} Gb/s per port ({source})"
    slow = [p for p in active if (p.rate_gbps or 0.0) < expected_gbps]
    if not slow:
        return CheckResult(
            "rdma.port_rate", Status.PASS, f"{_plural(len(active), 'port')} at ≥ {expected_gbps:g} Gb/s", expected
        )
    observed = ", ".join(f"{p.key} {p.rate or 'rate unknown'}" for p in slow)
    fix = "; ".join(_port_probe(p) for p in slow) + " (a lower rate means a degraded cable, transceiver or switch port)"
    return CheckResult("rdma.port_rate", Status.FAIL, observed, expected, fix)


LINK_TYPE = {"InfiniBand": 1, "Ethernet": 2}  # mlxconfig LINK_TYPE_P<n> values


def check_link_layer(facts: NodeFacts, settings: PreflightSettings) -> CheckResult:
    wanted = settings.link_layer
    expected = (
        f"{wanted} on every port" if wanted else "one link layer on every port (sources.preflight.link_layer: any)"
    )
    if not facts.ports:
        return CheckResult("rdma.link_layer", Status.SKIP, _no_ports(facts), expected)
    layers = Counter(p.link_layer or "unknown" for p in facts.ports)
    observed = ", ".join(f"{layer} on {_plural(count, 'port')}" for layer, count in sorted(layers.items()))
    if wanted is None:
        return CheckResult("rdma.link_layer", Status.PASS if len(layers) == 1 else Status.WARN, observed, expected)
    wrong = [p for p in facts.ports if p.link_layer != wanted]
    if not wrong:
        return CheckResult("rdma.link_layer", Status.PASS, observed, expected)
    fixes = [f"mlxconfig -d {p.pci_address or p.device} set LINK_TYPE_P{p.port}={LINK_TYPE[wanted]}" for p in wrong]
    return CheckResult(
        "rdma.link_layer",
        Status.FAIL,
        observed,
        expected,
        "; ".join(fixes) + " (Mellanox/NVIDIA NICs; takes effect after a reboot)",
    )


def check_node_bandwidth(facts: NodeFacts, settings: PreflightSettings) -> CheckResult:
    expected = f"≥ {settings.min_node_gbps:g} Gb/s of ACTIVE RDMA ports per node"
    if not facts.ports:
        return CheckResult("rdma.node_bandwidth", Status.SKIP, _no_ports(facts), expected)
    active = facts.active_ports
    total = sum(p.rate_gbps or 0.0 for p in active)
    observed = f"{total:g} Gb/s over {_plural(len(active), 'ACTIVE port')}"
    if total >= settings.min_node_gbps:
        return CheckResult("rdma.node_bandwidth", Status.PASS, observed, expected)
    return CheckResult(
        "rdma.node_bandwidth",
        Status.FAIL,
        observed,
        expected,
        "bring every fabric port up at full rate (see rdma.port_state, rdma.port_rate); "
        "a node below this makes GPUs idle during gradient exchange",
    )


def check_nic_per_gpu(facts: NodeFacts, settings: PreflightSettings) -> CheckResult:
    expected = "at least one RDMA NIC per GPU (rail-optimized)"
    if not facts.ports:
        return CheckResult("rdma.nic_per_gpu", Status.SKIP, _no_ports(facts), expected)
    if facts.gpus.unavailable:
        return CheckResult("rdma.nic_per_gpu", Status.SKIP, facts.gpus.unavailable, expected)
    nics = len({p.pci_address or p.device for p in facts.ports})
    gpus = len(facts.gpus.devices)
    observed = f"{_plural(nics, 'NIC')} for {_plural(gpus, 'GPU')}"
    if nics >= gpus:
        return CheckResult("rdma.nic_per_gpu", Status.PASS, observed, expected)
    return CheckResult(
        "rdma.nic_per_gpu",
        Status.WARN,
        observed,
        expected,
        "GPUs share NICs, so inter-node bandwidth per GPU is lower than a rail-optimized node's",
    )


def nearest_nics(facts: NodeFacts) -> dict[GpuDevice, tuple[str, Affinity]]:
    """Each GPU (with a known PCI address) → its closest RDMA device and how close that is."""
    nics = facts.nic_addresses()
    nearest = {}
    for gpu in facts.gpus.devices:
        found = facts.topology.nearest(gpu.pci_address, nics) if gpu.pci_address else None
        if found:
            devices, affinity = found
            nearest[gpu] = (devices[0], affinity)
    return nearest


def check_gpu_nic_affinity(facts: NodeFacts, settings: PreflightSettings) -> CheckResult:
    expected = "each GPU's nearest NIC on the same PCIe switch or NUMA node"
    if not facts.ports:
        return CheckResult("rdma.gpu_nic_affinity", Status.SKIP, _no_ports(facts), expected)
    if facts.gpus.unavailable:
        return CheckResult("rdma.gpu_nic_affinity", Status.SKIP, facts.gpus.unavailable, expected)
    nearest = nearest_nics(facts)
    if not nearest:
        return CheckResult(
            "rdma.gpu_nic_affinity",
            Status.SKIP,
            f"PCI topology of the GPUs or NICs not found under {facts.sysfs}/bus/pci/devices",
            expected,
        )
    far = {gpu: found for gpu, found in nearest.items() if found[1].level == GdrLevel.SYS}
    if not far:
        places = Counter(affinity.where for _, affinity in nearest.values())
        observed = ", ".join(f"{count}× {where}" for where, count in sorted(places.items()))
        return CheckResult(
            "rdma.gpu_nic_affinity", Status.PASS, f"{_plural(len(nearest), 'GPU')}: {observed}", expected
        )
    observed = "nearest NIC across NUMA nodes for " + ", ".join(
        f"GPU {gpu.index} ({gpu.pci_address}) → {device}"
        for gpu, (device, _) in sorted(far.items(), key=lambda item: item[0].index)
    )
    return CheckResult(
        "rdma.gpu_nic_affinity",
        Status.WARN,
        observed,
        expected,
        "nvidia-smi topo -m (traffic crosses the CPU interconnect; place a NIC beside each GPU)",
    )


# --- checks: lossless Ethernet for RoCE -------------------------------------------------------------------------


def _no_roce(facts: NodeFacts) -> str | None:
    if not facts.ports:
        return _no_ports(facts)
    if not facts.roce_netdevs:
        return "no RoCE ports (InfiniBand uses credit-based flow control, not PFC)"
    return None


def _read_each(netdevs: list[str], read: Callable[[str], object]) -> tuple[dict[str, object], list[str]]:
    values, unreadable = {}, []
    for netdev in netdevs:
        try:
            values[netdev] = read(netdev)
        except OSError as exc:
            unreadable.append(f"{netdev}: {exc.strerror or exc}")
    return values, unreadable


def _pfc_settings(
    facts: NodeFacts, check: str, expected: str
) -> tuple[dict[str, frozenset], list[str], CheckResult | None]:
    """Each RoCE netdev's PFC priorities, the unreadable ones, or the SKIP result when there is nothing to judge."""
    reason = _no_roce(facts)
    if reason:
        return {}, [], CheckResult(check, Status.SKIP, reason, expected)
    enabled, unreadable = _read_each(facts.roce_netdevs, facts.qos.pfc_priorities)
    if not enabled:
        return (
            {},
            unreadable,
            CheckResult(check, Status.SKIP, "PFC settings not readable: " + "; ".join(unreadable), expected),
        )
    return enabled, unreadable, None


def _pfc_observed(enabled: dict[str, frozenset], netdevs: list[str], unreadable: list[str]) -> str:
    observed = ", ".join(f"{n}: {','.join(map(str, sorted(enabled[n]))) or 'none'}" for n in netdevs)
    return observed + (" (unreadable: " + "; ".join(unreadable) + ")" if unreadable else "")


def _pfc_fix(netdev: str, priority: int) -> str:
    return f"dcb pfc set dev {netdev} prio-pfc all:off {priority}:on"


def check_pfc(facts: NodeFacts, settings: PreflightSettings) -> CheckResult:
    """FAIL when a RoCE interface lacks PFC on the RoCE priority: RoCE traffic there is lossy."""
    priority = settings.roce_priority
    expected = f"PFC on priority {priority}"
    enabled, unreadable, skipped = _pfc_settings(facts, "roce.pfc", expected)
    if skipped:
        return skipped
    missing = [n for n, prios in enabled.items() if priority not in prios]
    if missing:
        fix = "; ".join(_pfc_fix(n, priority) for n in missing)
        return CheckResult("roce.pfc", Status.FAIL, _pfc_observed(enabled, missing, unreadable), expected, fix)
    observed = f"priority {priority} on {_plural(len(enabled), 'interface')}"
    return CheckResult("roce.pfc", Status.PASS, observed + _pfc_observed(enabled, [], unreadable), expected)


def check_pfc_other_priorities(facts: NodeFacts, settings: PreflightSettings) -> CheckResult:
    """WARN when PFC is on for priorities besides the RoCE one: a check of its own, so an alert can key on it
    (``mfu_preflight_check_warning{check="roce.pfc_other_priorities"}``) whatever ``roce.pfc`` says."""
    priority = settings.roce_priority
    expected = f"PFC on no priority but {priority}"
    enabled, unreadable, skipped = _pfc_settings(facts, "roce.pfc_other_priorities", expected)
    if skipped:
        return skipped
    extra = [n for n, prios in enabled.items() if prios - {priority}]
    if extra:
        fix = (
            "; ".join(_pfc_fix(n, priority) for n in extra)
            + " (PFC on other priorities spreads pauses to other traffic)"
        )
        return CheckResult(
            "roce.pfc_other_priorities", Status.WARN, _pfc_observed(enabled, extra, unreadable), expected, fix
        )
    observed = f"none on {_plural(len(enabled), 'interface')}" + _pfc_observed(enabled, [], unreadable)
    return CheckResult("roce.pfc_other_priorities", Status.PASS, observed, expected)


ECN_POINTS = ("roce_np", "roce_rp")  # notification point (sends CNPs) and reaction point (slows down on CNPs)


def check_ecn(facts: NodeFacts, settings: PreflightSettings) -> CheckResult:
    priority = settings.roce_priority
    expected = f"ECN/DCQCN enabled on priority {priority} (roce_np and roce_rp)"
    reason = _no_roce(facts)
    if reason:
        return CheckResult("roce.ecn", Status.SKIP, reason, expected)
    readable, disabled = set(), {}
    for netdev in facts.roce_netdevs:
        for point in ECN_POINTS:
            value = read_attribute(facts.sysfs / "class" / "net" / netdev / "ecn" / point / "enable" / str(priority))
            if value is None:
                continue
            readable.add(netdev)
            if value != "1":
                disabled[f"{netdev} {point}={value}"] = (
                    f"echo 1 > /sys/class/net/{netdev}/ecn/{point}/enable/{priority}"
                )
    if not readable:
        return CheckResult(
            "roce.ecn", Status.SKIP, "the driver does not expose /sys/class/net/<if>/ecn (MLNX_OFED does)", expected
        )
    if disabled:
        return CheckResult("roce.ecn", Status.FAIL, ", ".join(disabled), expected, "; ".join(disabled.values()))
    return CheckResult("roce.ecn", Status.PASS, f"enabled on {_plural(len(readable), 'interface')}", expected)


def check_global_pause(facts: NodeFacts, settings: PreflightSettings) -> CheckResult:
    expected = "802.3x global pause off (PFC replaces it)"
    reason = _no_roce(facts)
    if reason:
        return CheckResult("roce.global_pause", Status.SKIP, reason, expected)
    pauses, unreadable = _read_each(facts.roce_netdevs, facts.qos.global_pause)
    if not pauses:
        return CheckResult(
            "roce.global_pause", Status.SKIP, "pause settings not readable: " + "; ".join(unreadable), expected
        )
    on = [n for n, pause in pauses.items() if pause.enabled]
    if on:
        observed = ", ".join(
            f"{n}: rx {'on' if pauses[n].rx else 'off'} tx {'on' if pauses[n].tx else 'off'}" for n in on
        )
        return CheckResult(
            "roce.global_pause", Status.FAIL, observed, expected, "; ".join(f"ethtool -A {n} rx off tx off" for n in on)
        )
    return CheckResult("roce.global_pause", Status.PASS, f"off on {_plural(len(pauses), 'interface')}", expected)


# --- checks: GPUDirect RDMA and PCIe peer-to-peer ---------------------------------------------------------------


PEERMEM_MODULES = ("nvidia_peermem", "nv_peer_mem")
DMABUF_MIN_KERNEL = (5, 12)


def _loaded_modules(procfs: Path) -> set[str] | None:
    text = read_attribute(procfs / "modules")
    return None if text is None else {line.split()[0] for line in text.splitlines() if line.strip()}


def _kernel_version(procfs: Path) -> tuple[int, int] | None:
    match = re.match(r"(\d+)\.(\d+)", read_attribute(procfs / "sys" / "kernel" / "osrelease") or "")
    return (int(match[1]), int(match[2])) if match else None


def check_gpudirect(facts: NodeFacts, settings: PreflightSettings) -> CheckResult:
    expected = "nvidia_peermem (or nv_peer_mem) loaded, or DMA-BUF (open GPU kernel module, Linux ≥ 5.12)"
    if not facts.ports:
        return CheckResult("gpudirect.rdma", Status.SKIP, _no_ports(facts), expected)
    modules = _loaded_modules(facts.procfs)
    if modules is None:
        return CheckResult("gpudirect.rdma", Status.SKIP, f"{facts.procfs}/modules not readable", expected)
    if "nvidia" not in modules:
        return CheckResult("gpudirect.rdma", Status.SKIP, "no NVIDIA driver loaded (no nvidia module)", expected)
    loaded = [m for m in PEERMEM_MODULES if m in modules]
    if loaded:
        return CheckResult("gpudirect.rdma", Status.PASS, f"{loaded[0]} loaded", expected)
    driver = read_attribute(facts.procfs / "driver" / "nvidia" / "version") or ""
    kernel = _kernel_version(facts.procfs)
    if "Open Kernel Module" in driver and kernel is not None and kernel >= DMABUF_MIN_KERNEL:
        return CheckResult(
            "gpudirect.rdma", Status.PASS, f"DMA-BUF: open GPU kernel module on Linux {kernel[0]}.{kernel[1]}", expected
        )
    return CheckResult(
        "gpudirect.rdma",
        Status.FAIL,
        "no peer-memory module loaded and no DMA-BUF support",
        expected,
        "modprobe nvidia_peermem (and add it to /etc/modules-load.d/ to survive reboots)",
    )


def _gpu_and_nic_addresses(facts: NodeFacts) -> list[str]:
    gpus = [g.pci_address for g in facts.gpus.devices if g.pci_address]
    return gpus + sorted(set(facts.nic_addresses().values()))


def check_acs(facts: NodeFacts, settings: PreflightSettings) -> CheckResult:
    expected = "no ACS request/completion redirect on PCIe switch ports between GPUs and NICs"
    if not facts.ports:
        return CheckResult("pci.acs", Status.SKIP, _no_ports(facts), expected)
    if facts.gpus.unavailable:
        return CheckResult("pci.acs", Status.SKIP, facts.gpus.unavailable, expected)
    bridges = sorted(
        {b for address in _gpu_and_nic_addresses(facts) for b in facts.topology.bridges_below_root_port(address)}
    )
    if not bridges:
        return CheckResult("pci.acs", Status.PASS, "no PCIe switch between GPUs, NICs and their root ports", expected)
    redirecting, readable = {}, 0
    for bridge in bridges:
        config = facts.topology.config_space(bridge)
        found = None if config is None else acs_redirects(config)
        if found is None:
            continue
        readable += 1
        if found:
            redirecting[bridge] = found
    if not readable:
        return CheckResult("pci.acs", Status.SKIP, "extended PCI config space not readable (needs root)", expected)
    if not redirecting:
        return CheckResult("pci.acs", Status.PASS, f"{_plural(readable, 'switch port')} without redirect", expected)
    observed = ", ".join(f"{bridge} {'+ '.join(bits)}+" for bridge, bits in redirecting.items())
    fix = "; ".join(f"setpci -s {bridge} ECAP_ACS+6.w=0000" for bridge in redirecting)
    return CheckResult("pci.acs", Status.FAIL, observed, expected, fix + " (or disable ACS in the BIOS)")


def check_iommu(facts: NodeFacts, settings: PreflightSettings) -> CheckResult:
    expected = "IOMMU off or in passthrough (identity) mode for GPUs and NICs"
    if not facts.ports:
        return CheckResult("pci.iommu", Status.SKIP, _no_ports(facts), expected)
    if facts.gpus.unavailable:
        return CheckResult("pci.iommu", Status.SKIP, facts.gpus.unavailable, expected)
    translated = {}
    for address in _gpu_and_nic_addresses(facts):
        kind = facts.topology.iommu_type(address)
        if kind in TRANSLATED_IOMMU_TYPES:
            translated[address] = kind
    if not translated:
        return CheckResult("pci.iommu", Status.PASS, "no GPU or NIC behind a translating IOMMU", expected)
    observed = ", ".join(f"{address} {kind}" for address, kind in translated.items())
    return CheckResult(
        "pci.iommu",
        Status.FAIL,
        observed,
        expected,
        "add iommu=pt to the kernel command line (GRUB_CMDLINE_LINUX in /etc/default/grub), update-grub, reboot",
    )


# --- checks: the job's NCCL environment -------------------------------------------------------------------------


def read_env_file(path: str) -> dict[str, str]:
    """``KEY=VALUE`` lines as a shell, systemd or Docker env file writes them (``export``, quotes, comments).

    Raises OSError when unreadable and UnicodeDecodeError when not UTF-8; the file is decoded whole, so the
    error's ``start`` is the offending byte's offset in the file.
    """
    env = {}
    with open(path, "rb") as handle:
        text = handle.read().decode("utf-8")
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        line = line.removeprefix("export ").strip()
        key, sep, value = line.partition("=")
        if not sep:
            continue
        try:
            parts = shlex.split(value, comments=True)
        except ValueError:  # an unbalanced quote: keep the text as written
            parts = [value.strip()]
        env[key.strip()] = parts[0] if parts else ""
    return env


def _nccl_skip(facts: NodeFacts, name: str, expected: str) -> CheckResult | None:
    if facts.nccl_env is None:
        return CheckResult(
            f"nccl.{name}",
            Status.SKIP,
            "no job environment given (--env-file, or sources.preflight.nccl_env_file)",
            expected,
        )
    if not facts.ports:
        return CheckResult(f"nccl.{name}", Status.SKIP, _no_ports(facts) + "; NCCL uses sockets", expected)
    return None


def check_nccl_ib_disable(facts: NodeFacts, settings: PreflightSettings) -> CheckResult:
    expected = f"unset or {GUIDE_NCCL['NCCL_IB_DISABLE']} (the guide's value)"
    skipped = _nccl_skip(facts, "NCCL_IB_DISABLE", expected)
    if skipped:
        return skipped
    value = facts.nccl_env.get("NCCL_IB_DISABLE")
    if value is None or value.strip() == "0":
        return CheckResult("nccl.NCCL_IB_DISABLE", Status.PASS, "unset" if value is None else value, expected)
    return CheckResult(
        "nccl.NCCL_IB_DISABLE",
        Status.FAIL,
        f"{value}: NCCL ignores the RDMA ports and uses TCP sockets",
        expected,
        "export NCCL_IB_DISABLE=0 (in the job's environment)",
    )


NCCL_DEFAULT_GDR_LEVEL = GdrLevel.PXB  # NCCL's default when NCCL_NET_GDR_LEVEL is unset


def parse_gdr_level(value: str) -> GdrLevel | None:
    text = value.strip().upper()
    if text in GdrLevel.__members__:
        return GdrLevel[text]
    if text.isdigit():
        return GdrLevel(min(int(text), GdrLevel.SYS))
    return None


def farthest_gpu_nic_path(facts: NodeFacts) -> GdrLevel | None:
    """The longest of the GPU-to-nearest-NIC paths: the GDR level every GPU needs; None when the topology is unknown."""
    if facts.gpus.unavailable:
        return None
    return max((affinity.level for _, affinity in nearest_nics(facts).values()), default=None)


def check_nccl_gdr_level(facts: NodeFacts, settings: PreflightSettings) -> CheckResult:
    name = "NCCL_NET_GDR_LEVEL"
    check = f"nccl.{name}"
    guide = GUIDE_NCCL[name]
    guide_expected = f"{guide} (SYS), the guide's value"
    skipped = _nccl_skip(facts, name, guide_expected)
    if skipped:
        return skipped
    value = facts.nccl_env.get(name)
    level = NCCL_DEFAULT_GDR_LEVEL if value is None else parse_gdr_level(value)
    observed = f"unset (NCCL default {NCCL_DEFAULT_GDR_LEVEL.name})" if value is None else value
    fix = f"export {name}={guide} (in the job's environment)"
    if level is None:
        return CheckResult(
            check, Status.FAIL, f"{value}: not a level NCCL knows", "LOC, PIX, PXB, PHB, SYS or 0–5", fix
        )
    if level == GdrLevel.LOC:
        return CheckResult(check, Status.FAIL, f"{observed}: GPUDirect RDMA disabled", guide_expected, fix)
    needed = farthest_gpu_nic_path(facts)
    if needed is None:  # without the topology, hold the value to the guide's
        if level == GdrLevel.SYS:
            return CheckResult(check, Status.PASS, f"{observed} (GPU/NIC topology unknown)", guide_expected)
        return CheckResult(check, Status.WARN, f"{observed} (GPU/NIC topology unknown)", guide_expected, fix)
    expected = f"≥ {needed.name}, the farthest GPU-to-nearest-NIC path here (guide: {guide})"
    if level >= needed:
        return CheckResult(check, Status.PASS, observed, expected)
    return CheckResult(
        check, Status.FAIL, f"{observed}: GPUDirect RDMA off for GPUs whose NIC is {needed.name} away", expected, fix
    )


def hca_selection(spec: str, devices: Iterable[str]) -> tuple[set[str], list[str]]:
    """What NCCL_IB_HCA selects among ``devices``: (selected devices, entries that match none).

    Syntax (NCCL docs): a comma list of ``device[:port]``; a leading ``^`` excludes them instead, a leading ``=``
    (after any ``^``) asks for exact names instead of prefixes.
    """
    devices = sorted(set(devices))
    text = spec.strip()
    exclude = text.startswith("^")
    text = text.removeprefix("^")
    exact = text.startswith("=")
    text = text.removeprefix("=")
    names = [entry.split(":")[0].strip() for entry in text.split(",") if entry.strip()]
    matched, unmatched = set(), []
    for name in names:
        hits = {d for d in devices if (d == name if exact else d.startswith(name))}
        if not hits:
            unmatched.append(name)
        matched |= hits
    return (set(devices) - matched if exclude else matched), unmatched


def check_nccl_ib_hca(facts: NodeFacts, settings: PreflightSettings) -> CheckResult:
    name = "NCCL_IB_HCA"
    expected = "unset, or naming the RDMA devices found and all ACTIVE ones"
    skipped = _nccl_skip(facts, name, expected)
    if skipped:
        return skipped
    value = facts.nccl_env.get(name)
    active = sorted({p.device for p in facts.active_ports})
    fix = f"export {name}={','.join(active)} (in the job's environment)" if active else ""
    if value is None:
        return CheckResult(f"nccl.{name}", Status.PASS, "unset (NCCL uses every RDMA device)", expected)
    selected, unmatched = hca_selection(value, (p.device for p in facts.ports))
    if unmatched:
        return CheckResult(
            f"nccl.{name}", Status.FAIL, f"{value}: {', '.join(unmatched)} match no device here", expected, fix
        )
    unused = [d for d in active if d not in selected]
    if active and len(unused) == len(active):
        return CheckResult(
            f"nccl.{name}",
            Status.FAIL,
            f"{value}: selects no ACTIVE device, so NCCL falls back to sockets",
            expected,
            fix,
        )
    if unused:
        return CheckResult(
            f"nccl.{name}",
            Status.WARN,
            f"{value}: leaves {', '.join(unused)} unused ({len(active) - len(unused)} of {len(active)} ACTIVE)",
            expected,
            fix,
        )
    return CheckResult(f"nccl.{name}", Status.PASS, value, expected)


# --- checks: GPUs -----------------------------------------------------------------------------------------------


def check_gpu_inventory(facts: NodeFacts, settings: PreflightSettings) -> CheckResult:
    want = f"{settings.expected_gpus} " if settings.expected_gpus else ""
    expected = f"{want}GPUs of one model, all visible to NVML"
    if facts.gpus.unavailable:
        return CheckResult("gpu.inventory", Status.SKIP, facts.gpus.unavailable, expected)
    models = Counter(g.name for g in facts.gpus.devices if g.name)
    count = len(facts.gpus.devices)
    observed = ", ".join(f"{n}× {model}" for model, n in sorted(models.items())) or "no GPUs"
    on_bus = facts.topology.nvidia_gpus()
    problems = []
    if len(models) > 1:
        problems.append("mixed models")
    if on_bus and len(on_bus) != count:
        problems.append(f"NVML sees {count}, the PCI bus has {len(on_bus)}")
    if settings.expected_gpus and count != settings.expected_gpus:
        problems.append(f"{count} instead of {settings.expected_gpus}")
    if problems:
        return CheckResult(
            "gpu.inventory",
            Status.FAIL,
            f"{observed}: {'; '.join(problems)}",
            expected,
            "nvidia-smi -L; dmesg | grep -iE 'NVRM|Xid' (a GPU missing from NVML needs a reset or service)",
        )
    return CheckResult("gpu.inventory", Status.PASS, observed, expected)


def check_gpu_persistence(facts: NodeFacts, settings: PreflightSettings) -> CheckResult:
    expected = "persistence mode on for every GPU"
    if facts.gpus.unavailable:
        return CheckResult("gpu.persistence_mode", Status.SKIP, facts.gpus.unavailable, expected)
    answering = [g for g in facts.gpus.devices if g.lost is None and g.persistence_mode is not None]
    if not answering:
        return CheckResult("gpu.persistence_mode", Status.SKIP, "no GPU reports persistence mode", expected)
    off = [g.index for g in answering if not g.persistence_mode]
    if not off:
        return CheckResult("gpu.persistence_mode", Status.PASS, f"on for {_plural(len(answering), 'GPU')}", expected)
    return CheckResult(
        "gpu.persistence_mode",
        Status.WARN,
        f"off for GPU {', '.join(map(str, off))}",
        expected,
        "nvidia-smi -pm 1 (or run nvidia-persistenced)",
    )


def check_gpu_health(facts: NodeFacts, settings: PreflightSettings) -> CheckResult:
    expected = "every GPU answering, none held back by a hardware slowdown, thermal limit or power brake"
    if facts.gpus.unavailable:
        return CheckResult("gpu.health", Status.SKIP, facts.gpus.unavailable, expected)
    problems, fixes = [], []
    for gpu in facts.gpus.devices:
        if gpu.lost:
            problems.append(f"GPU {gpu.index} lost ({gpu.lost})")
            fixes.append(f"nvidia-smi -q -i {gpu.index}")
            continue
        faults = [name for bit, name in THROTTLE_FAULTS.items() if (gpu.clocks_event_reasons or 0) & bit]
        if faults:
            problems.append(f"GPU {gpu.index} {'+'.join(faults)}")
            fixes.append(f"nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER -i {gpu.index}")
    if problems:
        return CheckResult("gpu.health", Status.FAIL, ", ".join(problems), expected, "; ".join(fixes))
    return CheckResult("gpu.health", Status.PASS, f"{_plural(len(facts.gpus.devices), 'GPU')} healthy", expected)


CheckFunction = Callable[[NodeFacts, PreflightSettings], CheckResult]


def _socket_buffer_check(name: str) -> CheckFunction:
    return lambda facts, settings: check_socket_buffer(facts, settings, name)


CHECKS: tuple[CheckFunction, ...] = (
    *(_socket_buffer_check(name) for name in SOCKET_BUFFER_SYSCTLS),
    check_port_state,
    check_port_rate,
    check_link_layer,
    check_node_bandwidth,
    check_nic_per_gpu,
    check_gpu_nic_affinity,
    check_pfc,
    check_pfc_other_priorities,
    check_ecn,
    check_global_pause,
    check_gpudirect,
    check_acs,
    check_iommu,
    check_nccl_ib_disable,
    check_nccl_gdr_level,
    check_nccl_ib_hca,
    check_gpu_inventory,
    check_gpu_persistence,
    check_gpu_health,
)


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


def run_checks(facts: NodeFacts, settings: PreflightSettings) -> list[CheckResult]:
    return [check(facts, settings) for check in CHECKS]


# --- output -----------------------------------------------------------------------------------------------------


def summary(results: Iterable[CheckResult]) -> dict[str, int]:
    counts = Counter(r.status for r in results)
    return {status.value.lower(): counts.get(status, 0) for status in Status}


def results_json(results: list[CheckResult]) -> dict:
    return {
        "ok": all(r.status != Status.FAIL for r in results),
        "summary": summary(results),
        "results": [r.as_json() for r in results],
    }


TABLE_COLUMNS = ("CHECK", "STATUS", "OBSERVED", "EXPECTED", "FIX")
WRAP_WIDTHS = {"OBSERVED": 48, "EXPECTED": 40}  # the fix column is never wrapped, so it stays copy-pasteable


def render_table(results: list[CheckResult]) -> str:
    rows = [[r.check, r.status.value, r.observed, r.expected, r.fix] for r in results]
    cells = [
        [
            textwrap.wrap(value, WRAP_WIDTHS[column]) or [""] if column in WRAP_WIDTHS else [value]
            for column, value in zip(TABLE_COLUMNS, row)
        ]
        for row in rows
    ]
    widths = [
        max([len(column)] + [len(line) for row in cells for line in row[i]]) for i, column in enumerate(TABLE_COLUMNS)
    ]
    widths[-1] = 0  # last column unpadded

    def line(values: list[str]) -> str:
        return "  ".join(value.ljust(width) for value, width in zip(values, widths)).rstrip()

    out = [line(list(TABLE_COLUMNS))]
    for row in cells:
        for i in range(max(len(cell) for cell in row)):
            out.append(line([cell[i] if i < len(cell) else "" for cell in row]))
    counts = summary(results)
    out.append("")
    out.append(", ".join(f"{counts[s.value.lower()]} {s.value}" for s in Status))
    return "\n".join(out)


# --- command line -----------------------------------------------------------------------------------------------
