"""The demo node's storage, as the storage source reads it: an NFS dataset mount, a local NVMe, and nvidia-fs.

Written in the simulated procfs in the kernel's and the driver's layouts (``mfu_exporter.node.storage`` cites them):
``self/mountstats`` (the NFS dataset mount with its ``bytes:`` and ``READ:`` counters, the NVMe root), ``diskstats``
(the NVMe the checkpoints are on) and ``driver/nvidia-fs/stats`` (``NVFS statistics(ver: 4.0)``, IO stats enabled:
the loader reads the dataset through cuFile, GPUDirect Storage over NFS/RDMA, and a restore reads its checkpoint the
same way). Each file is replaced whole (write and rename), so a reader never sees half of one.

The knob: ``dataset_read_rate``, bytes/s the job's loader reads from the dataset mount while it trains at its healthy
pace (the reads follow the token rate). An incident that starves the loader sets it low: the mount's counters flatten.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

DATASET_MOUNT = "/mnt/datasets"
DATASET_DEVICE = "nfs-data.demo:/datasets"
ROOT_DEVICE = "/dev/nvme0n1p1"
DISK = "nvme0n1p1"
DATASET_READ_RATE = 2.0e9  # bytes/s: a streaming loader feeding four H100s (multimodal shards)
RESTORE_READ_RATE = 4.0e9  # bytes/s: a checkpoint restore from local NVMe
READ_SIZE = 1 << 20  # bytes per NFS READ and per NVMe read (rsize=1048576)
NFS_READ_SECONDS = 0.0015  # execution time of one 1 MiB READ
DISK_READ_SECONDS = 0.0002
MIB = 1 << 20
GPU_PCI = ("0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0")  # the reporting job's four GPUs


@dataclass
class Counter:
    """Bytes, operations and seconds read, as floats between ticks (the files print integers)."""

    bytes: float = 0.0
    ops: float = 0.0
    seconds: float = 0.0

    def read(self, amount: float, op_seconds: float) -> None:
        self.bytes += amount
        self.ops += amount / READ_SIZE
        self.seconds += amount / READ_SIZE * op_seconds


class SimulatedStorage:
    def __init__(self, procfs: Path, gpu_pci: tuple[str, ...] = GPU_PCI):
        self.procfs = Path(procfs)
        self.dataset_read_rate = DATASET_READ_RATE
        self.dataset = Counter()
        self.disk = Counter(bytes=512 * 40_000_000, ops=300_000, seconds=90.0)  # the boot and earlier runs
        self.gds = Counter()
        self.gpu_pci = gpu_pci
        self.write()

    def tick(self, dt: float, pace: float, restoring: bool) -> None:
        """``dt`` seconds of the job at ``pace`` (its token rate ÷ the healthy one), or of a checkpoint restore."""
        if restoring:
            amount = RESTORE_READ_RATE * dt
            self.disk.read(amount, DISK_READ_SECONDS)
            self.gds.read(amount, DISK_READ_SECONDS)
        elif pace > 0:
            amount = self.dataset_read_rate * pace * dt
            self.dataset.read(amount, NFS_READ_SECONDS)
            self.gds.read(amount, NFS_READ_SECONDS)
        self.write()

    def write(self) -> None:
        _replace(self.procfs / "self" / "mountstats", self.mountstats())
        _replace(self.procfs / "diskstats", self.diskstats())
        _replace(self.procfs / "driver" / "nvidia-fs" / "stats", self.nvfs_stats())

    def mountstats(self) -> str:
        read = self.dataset
        nbytes, ops, ms = int(read.bytes), int(read.ops), int(read.seconds * 1000)
        return (
            f"device {ROOT_DEVICE} mounted on / with fstype ext4\n"
            "device proc mounted on /proc with fstype proc\n"
            f"device {DATASET_DEVICE} mounted on {DATASET_MOUNT} with fstype nfs4 statvers=1.1\n"
            "\topts:\tro,vers=4.2,rsize=1048576,wsize=1048576,namlen=255,hard,nconnect=8,proto=rdma,port=20049,"
            "timeo=600,retrans=2,sec=sys,clientaddr=10.0.0.21,local_lock=none\n"
            "\tage:\t3600\n"
            "\tsec:\tflavor=1,pseudoflavor=1\n"
            f"\tevents:\t{ops // 64} {ops // 8} 0 0 {ops // 64} 0 {ops * 256} 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 \n"
            f"\tbytes:\t{nbytes} 0 0 0 {nbytes} 0 {nbytes // 4096} 0 \n"
            "\tRPC iostats version: 1.1  p/v: 100003/4 (nfs)\n"
            "\tper-op statistics\n"
            "\t        NULL: 1 1 0 44 24 0 0 0 0\n"
            f"\t        READ: {ops} {ops} 0 {ops * 164} {nbytes + ops * 116} {ops // 1000} {ms} {ms + ops // 1000} 0\n"
            "\t       WRITE: 0 0 0 0 0 0 0 0 0\n"
            "\n"
        )

    def diskstats(self) -> str:
        disk = self.disk
        sectors, reads, ms = int(disk.bytes) // 512, int(disk.ops), int(disk.seconds * 1000)
        return (
            f" 259       0 nvme0n1 {reads} 0 {sectors} {ms} 0 0 0 0 0 {ms} {ms} 0 0 0 0 0 0\n"
            f" 259       1 {DISK} {reads} 0 {sectors} {ms} 0 0 0 0 0 {ms} {ms} 0 0 0 0 0 0\n"
        )

    def nvfs_stats(self) -> str:
        """In NVIDIA/gds-nvidia-fs ``src/nvfs-stat.c``'s format strings (``rw_stats_enabled=1``)."""
        gds = self.gds
        ops = int(gds.ops)
        latency_us = int(gds.seconds / ops * 1e6) if ops else 0
        lines = [
            "GDS Version: 1.17.1.22 ",
            "NVFS statistics(ver: 4.0)",
            "NVFS Driver(version: 2.28.4)",
            "Mellanox PeerDirect Supported: True",
            "IO stats: Enabled, peer IO stats: Disabled",
            "Logging level: info",
            "",
            "Active Shadow-Buffer (MiB): 0",
            f"Active Process: {1 if ops else 0}",
            "Batches\t\t\t\t: n=0 ok=0 err=0 Avg-Submit-Latency(usec)=0",
            f"Reads\t\t\t\t: n={ops} ok={ops} err=0 readMiB={int(gds.bytes) // MIB} io_state_err=0",
            f"Reads\t\t\t\t: Bandwidth(MiB/s)={int(self.dataset_read_rate) // MIB} Avg-Latency(usec)={latency_us}",
            "Sparse Reads\t\t        : n=0 io=0 holes=0 pages=0 ",
            "Writes\t\t\t\t: n=0 ok=0 err=0 writeMiB=0 io_state_err=0 pg-cache=0 pg-cache-fail=0 pg-cache-eio=0",
            "Writes\t\t\t\t: Bandwidth(MiB/s)=0 Avg-Latency(usec)=0",
            f"Mmap\t\t\t\t: n={len(self.gpu_pci)} ok={len(self.gpu_pci)} err=0 munmap=0",
            f"Bar1-map\t\t\t: n={len(self.gpu_pci)} ok={len(self.gpu_pci)} err=0 free=0 callbacks=0 "
            f"active={len(self.gpu_pci)} delay-frees=0",
            "Error\t\t\t\t: cpu-gpu-pages=0 sg-ext=0 dma-map=0 dma-ref=0",
            f"Ops\t\t\t\t: Read={1 if ops else 0} Write=0 BatchIO=0",
        ]
        for index, pci in enumerate(self.gpu_pci):
            uuid = f"4a1b229c-106e-427f-8b31-0011223344{index:02x}"
            lines.append(f"GPU {pci}  uuid:{uuid} : Registered_MiB=1024 Cache_MiB=0 max_pinned_MiB=1024 ")
        return "\n".join(lines) + "\n"


def _replace(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)
