"""RDMA devices and ports from sysfs: which exist, their state, rate, link layer, netdev and PCI place.

Layout read, under the configurable sysfs root (``--path.sysfs``)::

    class/infiniband/<device>/device            -> the PCI function (its name is the PCI address)
    class/infiniband/<device>/device/numa_node
    class/infiniband/<device>/device/physfn     (present on SR-IOV virtual functions)
    class/infiniband/<device>/ports/<n>/{state,phys_state,rate,link_layer}
    class/infiniband/<device>/ports/<n>/gid_attrs/ndevs/<index>   (the netdev of a RoCE port)

Shared by the RDMA and ethtool sources, preflight and attribution. The counters are read by ``mfu_exporter.sources.rdma``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Iterable, Pattern

STATE_ACTIVE = "ACTIVE"


_RATE_GBPS = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*Gb/sec")


_PCI_ADDRESS = re.compile(r"^[0-9a-fA-F]{4,}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")


_DIGITS = re.compile(r"(\d+)")


# phys_port_name of an eswitch representor: PF number then VF or SF number. The uplink's is "p0", and netdevs of
# drivers without switchdev fail the read (EOPNOTSUPP).
_REPRESENTOR_PORT_NAME = re.compile(r"^pf\d+(?:vf|sf)\d+$")


@dataclass(frozen=True)
class RdmaPort:
    """One port of an RDMA device as sysfs describes it. Fields sysfs lacks are None."""

    device: str  # IB device name, e.g. mlx5_0
    port: int
    link_layer: str | None  # "InfiniBand" or "Ethernet" (RoCE)
    netdev: str | None  # the RoCE port's network interface, from gid_attrs/ndevs
    state: str | None  # "ACTIVE", "DOWN", "INIT", "ARMED"...
    physical_state: str | None  # "LinkUp", "Disabled", "Polling"...
    rate: str | None  # as sysfs writes it: "400 Gb/sec (4X NDR)"
    rate_gbps: float | None
    pci_address: str | None  # of the device's PCI function, e.g. 0000:3b:00.0
    numa_node: int | None
    virtual_function: bool  # an SR-IOV VF seen from the host (its PCI function has physfn)
    path: str  # the port directory

    @property
    def active(self) -> bool:
        return self.state == STATE_ACTIVE

    @property
    def key(self) -> str:
        return f"{self.device}/{self.port}"


class NameFilter:
    """Include/exclude regex lists on names; a name passes when an include pattern and no exclude pattern matches.

    Patterns are searched (``re.search``), so ``^lo$`` and ``.*vf.*`` both mean what they say.
    """

    def __init__(self, include: Iterable[str | Pattern], exclude: Iterable[str | Pattern] = ()):
        self._include = _any_of(include)
        self._exclude = _any_of(exclude)

    def __call__(self, name: str) -> bool:
        if self._include is None or not self._include.search(name):
            return False
        return self._exclude is None or not self._exclude.search(name)


def _any_of(patterns: Iterable[str | Pattern]) -> Pattern | None:
    sources = [p.pattern if isinstance(p, re.Pattern) else p for p in patterns]
    return re.compile("|".join(f"(?:{s})" for s in sources)) if sources else None


def natural_key(name: str) -> tuple:
    """mlx5_2 before mlx5_10."""
    return tuple(int(part) if part.isdigit() else part for part in _DIGITS.split(name))


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read().strip()
    except OSError:
        return None


def state_name(text: str | None) -> str | None:
    """``4: ACTIVE`` -> ``ACTIVE``."""
    if not text:
        return None
    return text.split(":", 1)[1].strip() if ":" in text else text


def parse_rate_gbps(rate: str | None) -> float | None:
    match = _RATE_GBPS.match(rate) if rate else None
    return float(match.group(1)) if match else None


def _port_netdev(port_path: str) -> str | None:
    """The netdev of the port's first populated GID entry (RoCE). Unpopulated entries fail to read."""
    ndevs = os.path.join(port_path, "gid_attrs", "ndevs")
    try:
        indices = sorted((name for name in os.listdir(ndevs) if name.isdigit()), key=int)
    except OSError:
        return None
    for index in indices:
        name = _read_text(os.path.join(ndevs, index))
        if name:
            return name
    return None


def is_representor(sysfs_root: str, netdev: str) -> bool:
    """Whether ``netdev`` is a switchdev representor, from ``class/net/<netdev>/phys_port_name``."""
    name = _read_text(os.path.join(sysfs_root, "class", "net", netdev, "phys_port_name"))
    return bool(name and _REPRESENTOR_PORT_NAME.match(name))


def _pci_function(device_path: str) -> tuple[str | None, int | None, bool]:
    """PCI address, NUMA node and whether it is a virtual function, from the device's ``device`` link."""
    link = os.path.join(device_path, "device")
    try:
        address = os.path.basename(os.readlink(link))
    except OSError:
        address = None
    if address is not None and not _PCI_ADDRESS.match(address):
        address = None
    numa_text = _read_text(os.path.join(link, "numa_node"))
    try:
        numa_node = int(numa_text) if numa_text is not None else None
    except ValueError:
        numa_node = None
    if numa_node is not None and numa_node < 0:
        numa_node = None
    return address, numa_node, os.path.lexists(os.path.join(link, "physfn"))


def list_devices(sysfs_root: str) -> list[str] | None:
    """Names under ``class/infiniband`` in natural order; None when the directory does not exist."""
    try:
        return sorted(os.listdir(os.path.join(sysfs_root, "class", "infiniband")), key=natural_key)
    except OSError:
        return None


def discover_ports(
    sysfs_root: str,
    include: Iterable[str | Pattern] = (".*",),
    exclude: Iterable[str | Pattern] = (),
    *,
    virtual_functions: bool = False,
    representors: bool = False,
) -> list[RdmaPort]:
    """Every port of the RDMA devices under ``<sysfs_root>/class/infiniband`` whose device name passes the filters.

    ``include``/``exclude`` are regexes searched in the device name. Virtual functions seen from the host are
    left out unless ``virtual_functions`` (inside a guest a passed-through VF looks like any device and stays).
    Ports whose netdev is a switchdev representor (``is_representor``) are left out unless ``representors``:
    they carry a VF's traffic as the eswitch sees it, not the node's fabric.
    Never raises: a device or file sysfs lacks yields fewer ports or None fields.
    """
    accept = NameFilter(include, exclude)
    ports: list[RdmaPort] = []
    for device in list_devices(sysfs_root) or []:
        if not accept(device):
            continue
        device_path = os.path.join(sysfs_root, "class", "infiniband", device)
        pci_address, numa_node, virtual_function = _pci_function(device_path)
        if virtual_function and not virtual_functions:
            continue
        ports_path = os.path.join(device_path, "ports")
        try:
            numbers = sorted(int(name) for name in os.listdir(ports_path) if name.isdigit())
        except OSError:
            continue
        for number in numbers:
            path = os.path.join(ports_path, str(number))
            link_layer = _read_text(os.path.join(path, "link_layer")) or None
            netdev = _port_netdev(path) if link_layer != "InfiniBand" else None
            if netdev is not None and not representors and is_representor(sysfs_root, netdev):
                continue
            rate = _read_text(os.path.join(path, "rate")) or None
            ports.append(
                RdmaPort(
                    device=device,
                    port=number,
                    link_layer=link_layer,
                    netdev=netdev,
                    state=state_name(_read_text(os.path.join(path, "state"))),
                    physical_state=state_name(_read_text(os.path.join(path, "phys_state"))),
                    rate=rate,
                    rate_gbps=parse_rate_gbps(rate),
                    pci_address=pci_address,
                    numa_node=numa_node,
                    virtual_function=virtual_function,
                    path=path,
                )
            )
    return ports
