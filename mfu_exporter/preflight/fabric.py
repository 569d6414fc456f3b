"""Preflight checks of the fabric: socket buffers, RDMA ports, lossless Ethernet for RoCE, GPUDirect RDMA and
PCIe peer-to-peer (ACS, IOMMU). Read-only: each says how to fix a miss."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Callable

from mfu_exporter.node.pci import Affinity, GdrLevel, acs_redirects, read_attribute
from mfu_exporter.node.rdma import RdmaPort
from mfu_exporter.preflight.facts import (
    MIB,
    TRANSLATED_IOMMU_TYPES,
    CheckResult,
    GpuDevice,
    NodeFacts,
    PreflightSettings,
    Status,
    plural,
)

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


def no_ports(facts: NodeFacts) -> str:
    return f"no RDMA devices under {facts.sysfs}/class/infiniband"


def _port_probe(port: RdmaPort) -> str:
    """The command that shows why a port is not what it should be."""
    if port.link_layer == "Ethernet" and port.netdev:
        return f"ethtool {port.netdev}"
    return f"ibstat {port.device} {port.port}"


def check_port_state(facts: NodeFacts, settings: PreflightSettings) -> CheckResult:
    expected = "every RDMA port ACTIVE"
    if not facts.ports:
        return CheckResult("rdma.port_state", Status.SKIP, no_ports(facts), expected)
    down = [p for p in facts.ports if not p.active]
    if not down:
        return CheckResult("rdma.port_state", Status.PASS, f"{plural(len(facts.ports), 'port')} ACTIVE", expected)
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
        reason = no_ports(facts) if not facts.ports else "no ACTIVE port to measure"
        return CheckResult("rdma.port_rate", Status.SKIP, reason, "each port at its expected rate")
    expected_gbps = settings.port_rate_gbps or max(p.rate_gbps or 0.0 for p in active)
    source = "sources.preflight.port_rate_gbps" if settings.port_rate_gbps else "the fastest port"
    expected = f"≥ {expected_gbps:g} Gb/s per port ({source})"
    slow = [p for p in active if (p.rate_gbps or 0.0) < expected_gbps]
    if not slow:
        return CheckResult(
            "rdma.port_rate", Status.PASS, f"{plural(len(active), 'port')} at ≥ {expected_gbps:g} Gb/s", expected
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
        return CheckResult("rdma.link_layer", Status.SKIP, no_ports(facts), expected)
    layers = Counter(p.link_layer or "unknown" for p in facts.ports)
    observed = ", ".join(f"{layer} on {plural(count, 'port')}" for layer, count in sorted(layers.items()))
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
        return CheckResult("rdma.node_bandwidth", Status.SKIP, no_ports(facts), expected)
    active = facts.active_ports
    total = sum(p.rate_gbps or 0.0 for p in active)
    observed = f"{total:g} Gb/s over {plural(len(active), 'ACTIVE port')}"
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
        return CheckResult("rdma.nic_per_gpu", Status.SKIP, no_ports(facts), expected)
    if facts.gpus.unavailable:
        return CheckResult("rdma.nic_per_gpu", Status.SKIP, facts.gpus.unavailable, expected)
    nics = len({p.pci_address or p.device for p in facts.ports})
    gpus = len(facts.gpus.devices)
    observed = f"{plural(nics, 'NIC')} for {plural(gpus, 'GPU')}"
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
        return CheckResult("rdma.gpu_nic_affinity", Status.SKIP, no_ports(facts), expected)
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
        return CheckResult("rdma.gpu_nic_affinity", Status.PASS, f"{plural(len(nearest), 'GPU')}: {observed}", expected)
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
        return no_ports(facts)
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
    observed = f"priority {priority} on {plural(len(enabled), 'interface')}"
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
    observed = f"none on {plural(len(enabled), 'interface')}" + _pfc_observed(enabled, [], unreadable)
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
    return CheckResult("roce.ecn", Status.PASS, f"enabled on {plural(len(readable), 'interface')}", expected)


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
    return CheckResult("roce.global_pause", Status.PASS, f"off on {plural(len(pauses), 'interface')}", expected)


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
        return CheckResult("gpudirect.rdma", Status.SKIP, no_ports(facts), expected)
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
        return CheckResult("pci.acs", Status.SKIP, no_ports(facts), expected)
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
        return CheckResult("pci.acs", Status.PASS, f"{plural(readable, 'switch port')} without redirect", expected)
    observed = ", ".join(f"{bridge} {'+ '.join(bits)}+" for bridge, bits in redirecting.items())
    fix = "; ".join(f"setpci -s {bridge} ECAP_ACS+6.w=0000" for bridge in redirecting)
    return CheckResult("pci.acs", Status.FAIL, observed, expected, fix + " (or disable ACS in the BIOS)")


def check_iommu(facts: NodeFacts, settings: PreflightSettings) -> CheckResult:
    expected = "IOMMU off or in passthrough (identity) mode for GPUs and NICs"
    if not facts.ports:
        return CheckResult("pci.iommu", Status.SKIP, no_ports(facts), expected)
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
