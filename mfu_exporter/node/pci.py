"""PCI topology from sysfs: where GPUs and NICs sit, the path between them, ACS and IOMMU settings.

Read under a configurable sysfs root (``<sysfs>/bus/pci/devices/<address>``, links into ``<sysfs>/devices/pci…``),
so a container can read its host's and tests can read fixture trees.
"""

from __future__ import annotations

import functools
import os
import re
import struct
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Mapping

NVIDIA_PCI_VENDOR = "0x10de"


GPU_PCI_CLASSES = ("0x0300", "0x0302")  # VGA and 3D controllers; NVSwitches are bridges (0x0680) and do not count


PCI_ADDRESS = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


PCI_ROOT = re.compile(r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")


# PCIe ACS: extended capability 0x000D, control register at +6. Request and completion redirect send peer-to-peer
# traffic up to the root complex, which breaks or slows GPUDirect RDMA (what `lspci -vvv` shows as
# ReqRedir+/CmpltRedir+).
PCI_EXT_CAP_START = 0x100


PCI_EXT_CAP_ACS = 0x000D


ACS_REDIRECT_BITS = {0x04: "ReqRedir", 0x08: "CmpltRedir"}


def pci_address_from_nvml(bus_id: str | bytes) -> str:
    """NVML's ``00000000:1A:00.0`` as sysfs names it: ``0000:1a:00.0``."""
    text = bus_id.decode() if isinstance(bus_id, bytes) else bus_id
    domain, bus, function = text.strip().lower().split(":")
    return f"{int(domain, 16):04x}:{bus}:{function}"


def read_attribute(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (FileNotFoundError, NotADirectoryError):
        return None


class GdrLevel(int, Enum):
    """NCCL's path types for GPUDirect RDMA, in its legacy numbering (NCCL_NET_GDR_LEVEL=0..4; above 4 means SYS)."""

    LOC = 0
    PIX = 1
    PXB = 2
    PHB = 3
    SYS = 4


@dataclass(frozen=True)
class Affinity:
    level: GdrLevel
    where: str  # in words, for the table


class PciTopology:
    """Where PCI devices sit, from ``<sysfs>/bus/pci/devices/<address>`` (links into ``<sysfs>/devices/pci…``)."""

    def __init__(self, sysfs: Path):
        self.sysfs = sysfs
        self._chains: dict[str, tuple[str, tuple[str, ...]] | None] = {}  # one run asks for each device many times

    def device_dir(self, address: str) -> Path:
        return self.sysfs / "bus" / "pci" / "devices" / address

    def chain(self, address: str) -> tuple[str, tuple[str, ...]] | None:
        """The root complex (``pci0000:17``) and the PCI functions from its root port down to the device."""
        if address not in self._chains:
            self._chains[address] = self._resolve_chain(address)
        return self._chains[address]

    def _resolve_chain(self, address: str) -> tuple[str, tuple[str, ...]] | None:
        try:
            real = Path(os.path.realpath(self.device_dir(address)))
        except OSError:
            return None
        parts = real.parts
        roots = [i for i, part in enumerate(parts) if PCI_ROOT.match(part)]
        if not roots or not real.exists():
            return None
        functions = tuple(p for p in parts[roots[-1] + 1 :] if PCI_ADDRESS.match(p))
        return parts[roots[-1]], functions

    def numa_node(self, address: str) -> int | None:
        """None when sysfs does not know (-1: a single-node machine, or firmware that does not say)."""
        value = read_attribute(self.device_dir(address) / "numa_node")
        try:
            node = int(value) if value is not None else -1
        except ValueError:
            return None
        return node if node >= 0 else None

    def affinity(self, first: str, second: str) -> Affinity | None:
        a, b = self.chain(first), self.chain(second)
        if a is None or b is None:
            return None
        if a[0] == b[0]:
            bridges_a, bridges_b = a[1][:-1], b[1][:-1]
            shared = 0
            while shared < min(len(bridges_a), len(bridges_b)) and bridges_a[shared] == bridges_b[shared]:
                shared += 1
            if shared >= 2:  # a root port and a switch's upstream port in common: under one PCIe switch tree
                one_switch = len(bridges_a) - shared <= 1 and len(bridges_b) - shared <= 1
                return Affinity(GdrLevel.PIX if one_switch else GdrLevel.PXB, "same PCIe switch")
            return Affinity(GdrLevel.PHB, "same PCIe host bridge")
        if self.numa_node(first) == self.numa_node(second):
            return Affinity(GdrLevel.PHB, "same NUMA node")
        return Affinity(GdrLevel.SYS, "across NUMA nodes")

    def nearest(self, address: str, candidates: Mapping[str, str]) -> tuple[list[str], Affinity] | None:
        """The candidates (name → PCI address) on the shortest path from ``address``, in name order, and that path;
        None when the topology of the device, or of every candidate, is unknown."""
        known = [
            (affinity, name)
            for name, candidate in sorted(candidates.items())
            if (affinity := self.affinity(address, candidate)) is not None
        ]
        if not known:
            return None
        level = min(affinity.level for affinity, _ in known)
        closest = [(affinity, name) for affinity, name in known if affinity.level == level]
        return [name for _, name in closest], closest[0][0]

    def bridges_below_root_port(self, address: str) -> tuple[str, ...]:
        found = self.chain(address)
        return found[1][1:-1] if found else ()

    def config_space(self, address: str) -> bytes | None:
        try:
            return (self.device_dir(address) / "config").read_bytes()
        except OSError:
            return None

    def iommu_type(self, address: str) -> str | None:
        """The IOMMU domain type of the device's group; None when the device has no IOMMU group (IOMMU off)."""
        return read_attribute(self.device_dir(address) / "iommu_group" / "type")

    def nvidia_gpus(self) -> list[str]:
        """NVIDIA display/3D controllers on the PCI bus, whatever NVML thinks of them."""
        found = []
        devices = self.sysfs / "bus" / "pci" / "devices"
        for entry in sorted(devices.iterdir()) if devices.is_dir() else ():
            if read_attribute(entry / "vendor") == NVIDIA_PCI_VENDOR and (
                read_attribute(entry / "class") or ""
            ).startswith(GPU_PCI_CLASSES):
                found.append(entry.name)
        return found


def acs_redirects(config: bytes) -> list[str] | None:
    """The ACS redirect bits set in a PCI config space dump; None when it holds no extended capabilities to read."""
    if len(config) < PCI_EXT_CAP_START + 4:
        return None
    offset, seen = PCI_EXT_CAP_START, set()
    while offset and offset not in seen and offset + 8 <= len(config):
        seen.add(offset)
        (header,) = struct.unpack_from("<I", config, offset)
        if header in (0, 0xFFFFFFFF):
            break
        if header & 0xFFFF == PCI_EXT_CAP_ACS:
            (control,) = struct.unpack_from("<H", config, offset + 6)
            return [name for bit, name in ACS_REDIRECT_BITS.items() if control & bit]
        offset = header >> 20
    return []


@functools.lru_cache(maxsize=1024)
def nearest_devices(sysfs_root: str, nvml_bus_id: str, nics: tuple[tuple[str, str], ...]) -> tuple[str, ...]:
    """The RDMA devices of ``nics`` ((device, PCI address), ...) on the shortest PCIe path from the GPU at NVML bus ID
    ``nvml_bus_id``; () when the topology places it nowhere.

    Cached because the PCIe topology stays put while the GPU and the NIC set do (a replugged NIC changes ``nics``).
    Uncached, each degraded second would re-read every GPU/NIC pair's NUMA node.
    """
    found = PciTopology(Path(sysfs_root)).nearest(pci_address_from_nvml(nvml_bus_id), dict(nics))
    return tuple(found[0]) if found else ()
