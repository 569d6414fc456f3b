"""Write a sysfs tree laid out as the kernel lays it out, for the RDMA and ethtool sources to read.

Only the files the sources read, with the kernel's formats and links::

    devices/pci0000:00/<pci>/{numa_node,physfn}
    devices/pci0000:00/<pci>/infiniband/<device>/{fw_ver,board_id,hca_type,device -> ../../../<pci>}
    devices/pci0000:00/<pci>/infiniband/<device>/ports/<n>/{state,phys_state,rate,link_layer}
    devices/pci0000:00/<pci>/infiniband/<device>/ports/<n>/{counters,hw_counters}/*
    devices/pci0000:00/<pci>/infiniband/<device>/ports/<n>/gid_attrs/{ndevs,types}/<index>
    devices/pci0000:00/<pci>/net/<netdev>/{operstate,ifindex,address,mtu,phys_port_name,device -> ../../../<pci>}
    class/infiniband/<device> -> ../../devices/pci0000:00/<pci>/infiniband/<device>
    class/net/<netdev> -> ../../devices/pci0000:00/<pci>/net/<netdev>

Counter files are rewritten in place (same inode), because the RDMA source keeps them open and re-reads with
pread, as it does on the real sysfs. A removed file differs: a plain file system keeps serving its old content
through descriptors still open, where the kernel's fails the read; ``KernfsOs`` gives a reader the kernel's
behaviour.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from typing import Mapping

PORT_STATES = {"DOWN": 1, "INIT": 2, "ARMED": 3, "ACTIVE": 4, "ACTIVE_DEFER": 5}
PHYSICAL_STATES = {
    "Sleep": 1,
    "Polling": 2,
    "Disabled": 3,
    "PortConfigurationTraining": 4,
    "LinkUp": 5,
    "LinkErrorRecovery": 6,
    "Phy Test": 7,
}
# Unpopulated GID entries exist as files but fail to read; a fake can only leave them out.
ROCE_GID_TYPES = ("IB/RoCE v1", "RoCE v2")


def write_in_place(path: Path, text: str) -> None:
    """Replace the content of ``path`` keeping its inode, so descriptors kept open see the new value."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        data = text.encode()
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)


class KernfsOs:
    """The ``os`` module as a sysfs reader sees it on the kernel: ``pread`` on a descriptor of a removed file
    fails with ENODEV (kernfs deactivates the node of a removed attribute) instead of returning the old content.

    Install it as the reader module's ``os`` (``monkeypatch.setattr(mfu_exporter.sources.rdma, "os", KernfsOs())``)
    so a device unplugged while its files are open is seen as the kernel shows it. Everything else is ``os``.
    """

    def __getattr__(self, name: str):
        return getattr(os, name)

    @staticmethod
    def pread(fd: int, length: int, offset: int) -> bytes:
        if os.fstat(fd).st_nlink == 0:
            raise OSError(errno.ENODEV, os.strerror(errno.ENODEV))
        return os.pread(fd, length, offset)


class FakeSysfs:
    """A sysfs tree under ``root``; pass ``root`` as the sources' sysfs root (``--path.sysfs``)."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        (self.root / "class" / "infiniband").mkdir(parents=True, exist_ok=True)
        (self.root / "class" / "net").mkdir(parents=True, exist_ok=True)
        self._devices: dict[str, Path] = {}

    def pci_function(self, address: str, numa_node: int | None = 0, physfn: str | None = None) -> Path:
        """The PCI function's directory, created on first use. ``physfn`` makes it a VF of that address."""
        path = self.root / "devices" / "pci0000:00" / address
        if not path.exists():
            path.mkdir(parents=True)
            (path / "numa_node").write_text(f"{-1 if numa_node is None else numa_node}\n")
            if physfn is not None:
                os.symlink(f"../{physfn}", path / "physfn")
        return path

    def add_rdma_device(
        self,
        device: str,
        pci_address: str,
        *,
        numa_node: int | None = 0,
        physfn: str | None = None,
        fw_ver: str = "28.39.1002",
        board_id: str = "MT_0000000838",
        hca_type: str = "MT4129",
    ) -> Path:
        function = self.pci_function(pci_address, numa_node, physfn)
        path = function / "infiniband" / device
        (path / "ports").mkdir(parents=True)
        for name, value in (("fw_ver", fw_ver), ("board_id", board_id), ("hca_type", hca_type), ("node_type", "1: CA")):
            (path / name).write_text(value + "\n")
        os.symlink(f"../../../{pci_address}", path / "device")
        os.symlink(
            os.path.relpath(path, self.root / "class" / "infiniband"), self.root / "class" / "infiniband" / device
        )
        self._devices[device] = path
        return path

    def port_path(self, device: str, port: int) -> Path:
        return self._devices[device] / "ports" / str(port)

    def add_rdma_port(
        self,
        device: str,
        port: int = 1,
        *,
        link_layer: str = "Ethernet",
        netdev: str | None = None,
        state: str = "ACTIVE",
        physical_state: str = "LinkUp",
        rate: str = "400 Gb/sec (4X NDR)",
        counters: Mapping[str, int | str] | None = None,
        hw_counters: Mapping[str, int | str] | None = None,
    ) -> Path:
        """A port. ``counters``/``hw_counters`` None leaves that directory out (bnxt_re has no counters/)."""
        path = self.port_path(device, port)
        path.mkdir(parents=True)
        self.set_port_state(device, port, state, physical_state)
        (path / "rate").write_text(rate + "\n")
        (path / "link_layer").write_text(link_layer + "\n")
        (path / "lid").write_text("0x0\n" if link_layer == "Ethernet" else f"0x{port:x}\n")
        ndevs, types = path / "gid_attrs" / "ndevs", path / "gid_attrs" / "types"
        ndevs.mkdir(parents=True)
        types.mkdir()
        if netdev is not None:
            for index, gid_type in enumerate(ROCE_GID_TYPES):
                (ndevs / str(index)).write_text(netdev + "\n")
                (types / str(index)).write_text(gid_type + "\n")
        if counters is not None:
            (path / "counters").mkdir()
            self.write_counters(device, port, counters)
        if hw_counters is not None:
            (path / "hw_counters").mkdir()
            self.write_counters(device, port, hw_counters, directory="hw_counters")
        return path

    def set_port_state(self, device: str, port: int, state: str, physical_state: str = "LinkUp") -> None:
        path = self.port_path(device, port)
        write_in_place(path / "state", f"{PORT_STATES[state]}: {state}\n")
        write_in_place(path / "phys_state", f"{PHYSICAL_STATES[physical_state]}: {physical_state}\n")

    def write_counters(
        self, device: str, port: int, values: Mapping[str, int | str], directory: str = "counters"
    ) -> None:
        """Set counter files (ints, or text such as ``N/A (no PMA)``); files not named keep their value."""
        folder = self.port_path(device, port) / directory
        for name, value in values.items():
            write_in_place(folder / name, f"{value}\n")

    def remove_rdma_device(self, device: str) -> None:
        """Hot unplug: the class link and the device directory disappear."""
        os.unlink(self.root / "class" / "infiniband" / device)
        shutil.rmtree(self._devices.pop(device))

    def add_netdev(
        self,
        name: str,
        pci_address: str | None = None,
        *,
        ifindex: int = 2,
        mac: str = "b8:3f:d2:00:00:00",
        mtu: int = 4200,
        operstate: str = "up",
        phys_port_name: str | None = None,
    ) -> Path:
        """A network interface; without a PCI address it is virtual (devices/virtual/net).

        ``phys_port_name`` is set on switchdev netdevs only: ``p0`` on the uplink, ``pf0vf1`` or ``pf0sf88`` on a
        representor. Without it the file is left out; the kernel's read fails (EOPNOTSUPP) and that reads the same.
        """
        if pci_address is None:
            path = self.root / "devices" / "virtual" / "net" / name
        else:
            path = self.pci_function(pci_address) / "net" / name
        path.mkdir(parents=True)
        for attribute, value in (
            ("ifindex", ifindex),
            ("address", mac),
            ("mtu", mtu),
            ("operstate", operstate),
            ("phys_port_name", phys_port_name),
        ):
            if value is not None:
                (path / attribute).write_text(f"{value}\n")
        if pci_address is not None:
            os.symlink(f"../../../{pci_address}", path / "device")
        os.symlink(os.path.relpath(path, self.root / "class" / "net"), self.root / "class" / "net" / name)
        return path
