"""Simulated machines for tests, written the way the kernel lays them out. For preflight and attribution: a PCI and
procfs node (``Node``, ``hgx_node``) and the NICs' QoS answers (``FakeQos``). For the fabric sources: mlx5 sysfs
layouts (``representors``)."""

from __future__ import annotations

import errno
import os
import struct
from pathlib import Path

from mfu_exporter.sim.mlx5 import hw_counters, port_counters
from mfu_exporter.sim.sysfs import FakeSysfs

GPU_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)  # the fake's HGX bus numbers


class FakeQos:
    """PFC priorities and global pause per interface; an interface missing from ``pfc`` answers EOPNOTSUPP."""

    def __init__(self, pfc=None, pause=None):
        self.pfc = dict(pfc or {})
        self.pause = dict(pause or {})

    def pfc_priorities(self, interface):
        if interface not in self.pfc:
            raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))
        return frozenset(self.pfc[interface])

    def global_pause(self, interface):
        if interface not in self.pause:
            raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))
        return self.pause[interface]


def acs_config(control=0):
    """A bridge's config space: 256 bytes of header, then the ACS extended capability with ``control``."""
    header = bytearray(256)
    return bytes(header) + struct.pack("<IHH", 0x000D | (1 << 16), 0x5F, control)


class Node:
    """A fixture /sys and /proc in the real layout, written the way the kernel lays them out."""

    def __init__(self, root: Path):
        self.sys = root / "sys"
        self.proc = root / "proc"
        self.sys.mkdir(parents=True)
        self.proc.mkdir(parents=True)

    def write(self, path: Path, text: str | bytes) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text) if isinstance(text, bytes) else path.write_text(text + "\n")

    def sysctl(self, name: str, value: str) -> None:
        self.write(self.proc / "sys" / name.replace(".", "/"), value)

    def pci(
        self,
        root: str,
        chain: list[str],
        numa: int = 0,
        vendor: str = "0x15b3",
        pci_class: str = "0x020700",
        iommu: str | None = None,
        bridge_config: bytes | None = None,
    ) -> str:
        """PCI functions from the root port down to the device under ``devices/<root>``, each linked from bus/pci."""
        directory = self.sys / "devices" / root
        for index, address in enumerate(chain):
            directory = directory / address
            directory.mkdir(parents=True, exist_ok=True)
            link = self.sys / "bus" / "pci" / "devices" / address
            if not link.is_symlink():
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to(os.path.relpath(directory, link.parent))
            self.write(directory / "numa_node", str(numa))
            if index < len(chain) - 1 and bridge_config is not None:
                self.write(directory / "config", bridge_config)
        self.write(directory / "vendor", vendor)
        self.write(directory / "class", pci_class)
        if iommu:
            group = self.sys / "kernel" / "iommu_groups" / address
            self.write(group / "type", iommu)
            (directory / "iommu_group").symlink_to(os.path.relpath(group, directory))
        return chain[-1]

    def rdma(
        self,
        device: str,
        address: str | None,
        netdev: str | None = None,
        state: str = "4: ACTIVE",
        rate: str = "400 Gb/sec (4X NDR)",
        link_layer: str = "Ethernet",
    ) -> None:
        base = self.sys / "class" / "infiniband" / device
        port = base / "ports" / "1"
        self.write(port / "state", state)
        self.write(port / "phys_state", "5: LinkUp" if "ACTIVE" in state else "3: Disabled")
        self.write(port / "rate", rate)
        self.write(port / "link_layer", link_layer)
        if netdev:
            self.write(port / "gid_attrs" / "ndevs" / "0", netdev)
        if address:
            (base / "device").symlink_to(
                os.path.relpath(os.path.realpath(self.sys / "bus" / "pci" / "devices" / address), base)
            )

    def ecn(self, netdev: str, priority: int, np: str = "1", rp: str = "1") -> None:
        self.write(self.sys / "class" / "net" / netdev / "ecn" / "roce_np" / "enable" / str(priority), np)
        self.write(self.sys / "class" / "net" / netdev / "ecn" / "roce_rp" / "enable" / str(priority), rp)

    def modules(self, *names: str) -> None:
        self.write(self.proc / "modules", "\n".join(f"{n} 16384 0 - Live 0x0000000000000000" for n in names))


def hgx_node(
    root: Path, *, nics: int = 8, acs: int = 0, gpu_iommu: str | None = None, nics_on_socket: int | None = None
) -> Node:
    """An 8-GPU HGX node done right: each GPU and its RoCE NIC under one PCIe switch, four per NUMA node.

    ``nics_on_socket`` instead hangs every NIC off its own root complex on that NUMA node (a node built wrong).
    """
    node = Node(root)
    for name in ("net.core.rmem_max", "net.core.wmem_max"):
        node.sysctl(name, "67108864")
    node.sysctl("net.ipv4.tcp_rmem", "4096\t87380\t67108864")
    node.sysctl("net.ipv4.tcp_wmem", "4096\t65536\t67108864")
    node.sysctl("kernel.osrelease", "6.8.0-45-generic")
    node.modules("nvidia_peermem", "nvidia_uvm", "nvidia", "mlx5_ib", "mlx5_core")
    for i, bus in enumerate(GPU_BUSES):
        numa = 0 if i < 4 else 1
        root_complex, root_port = f"pci0000:{bus - 3:02x}", f"0000:{bus - 3:02x}:01.0"
        upstream, down_gpu, down_nic = (
            f"0000:{bus - 2:02x}:00.0",
            f"0000:{bus - 1:02x}:00.0",
            f"0000:{bus - 1:02x}:01.0",
        )
        node.pci(
            root_complex,
            [root_port, upstream, down_gpu, f"0000:{bus:02x}:00.0"],
            numa,
            vendor="0x10de",
            pci_class="0x030200",
            iommu=gpu_iommu,
            bridge_config=acs_config(acs),
        )
        if i < nics:
            if nics_on_socket is not None:
                nic = node.pci(
                    f"pci0000:{bus + 1:02x}", [f"0000:{bus + 1:02x}:01.0", f"0000:{bus + 2:02x}:00.0"], nics_on_socket
                )
            else:
                nic = node.pci(
                    root_complex,
                    [root_port, upstream, down_nic, f"0000:{bus + 1:02x}:00.0"],
                    numa,
                    bridge_config=acs_config(acs),
                )
            node.rdma(f"mlx5_{i}", nic, netdev=f"eth{i}")
            node.ecn(f"eth{i}", 3)
    return node


def representors(sysfs: FakeSysfs) -> None:
    """mlx5_0 in switchdev mode: port 1 is the uplink (phys_port_name p0), ports 2 and 3 represent VF 0 and SF 88."""
    sysfs.add_rdma_device("mlx5_0", "0000:0c:00.0")
    for port, netdev, port_name in (
        (1, "ens1f0np0", "p0"),
        (2, "ens1f0pf0vf0", "pf0vf0"),
        (3, "ens1f0pf0sf88", "pf0sf88"),
    ):
        sysfs.add_rdma_port("mlx5_0", port, netdev=netdev, counters=port_counters(), hw_counters=hw_counters())
        sysfs.add_netdev(netdev, "0000:0c:00.0", ifindex=port + 1, phys_port_name=port_name)
