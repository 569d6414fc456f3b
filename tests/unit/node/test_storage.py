"""The storage read plane's parsers (mfu_exporter.node.storage): fixture files in the kernel's and the drivers' layouts
(tests/fixtures/storage, README there says where each layout comes from), and this machine's real procfs."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest

from mfu_exporter.node.storage import (
    MIB,
    block_device,
    lustre_client,
    mount_of,
    parse_diskstats,
    parse_llite_stats,
    parse_mountinfo,
    parse_mountstats,
    parse_nvfs_stats,
    read_lustre_clients,
    read_nvfs_stats,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "storage"


def text(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_mountstats_lists_every_mount_and_reads_the_nfs_counters():
    mounts = parse_mountstats(text("mountstats"))
    assert [(m.device, m.mount_point, m.fstype) for m in mounts] == [
        ("rootfs", "/", "rootfs"),
        ("proc", "/proc", "proc"),
        ("/dev/nvme0n1p2", "/", "ext4"),
        ("/dev/md0", "/raid", "xfs"),
        ("tmpfs", "/dev/shm", "tmpfs"),
        ("10.0.0.5@o2ib:/scratch", "/lustre/scratch", "lustre"),
        ("nfs-data.example.com:/datasets", "/mnt/datasets", "nfs4"),
        ("old-nfs:/home", "/home/with space", "nfs"),
    ]
    assert [m.nfs is not None for m in mounts] == [False] * 6 + [True, True]
    nfs = mounts[6].nfs
    assert nfs.statvers == "1.1" and nfs.age_seconds == 86412
    assert nfs.bytes == {
        "normal_read": 412316860416,
        "normal_written": 0,
        "direct_read": 0,
        "direct_written": 0,
        "server_read": 398458880000,
        "server_written": 0,
        "read_pages": 97344000,
        "write_pages": 0,
    }
    assert nfs.read_bytes == 412316860416 and nfs.server_read_bytes == 398458880000
    read = nfs.ops["READ"]
    assert (read.ops, read.transmissions, read.timeouts, read.bytes_sent, read.bytes_received) == (
        380012,
        380012,
        0,
        62701980,
        398507522048,
    )
    assert (read.queue_ms, read.rtt_ms, read.execute_ms, read.errors) == (1204, 3801220, 3829911, 0)
    assert set(nfs.ops) == {"NULL", "READ", "WRITE", "COMMIT", "OPEN", "GETATTR"}
    # Before Linux 5.7 a per-op line has eight fields, no error count.
    assert mounts[7].nfs.ops["READ"].errors is None and mounts[7].nfs.ops["READ"].execute_ms == 1


def test_diskstats_reads_counts_sectors_and_time_in_both_layouts():
    disks = parse_diskstats(text("diskstats"))
    assert set(disks) == {"loop0", "nvme0n1", "nvme0n1p1", "nvme0n1p2", "nvme1n1", "md0"}
    part = disks["nvme0n1p2"]
    assert (part.major, part.minor, part.reads_completed, part.reads_merged) == (259, 2, 2840701, 1201)
    assert part.sectors_read == 2930104178 and part.read_bytes == 2930104178 * 512 and part.read_ms == 1211340
    assert (part.writes_completed, part.sectors_written, part.write_ms) == (812342, 101281550, 930281)
    old = parse_diskstats(text("diskstats-4.x"))  # eleven fields: before discards (4.18) and flushes (5.5)
    assert old["sda1"].read_bytes == 3818 * 512 and old["sda1"].reads_completed == 90


def test_llite_stats_read_bytes_and_read_time():
    counters = parse_llite_stats(text("llite-stats"))
    assert counters["read_bytes"].samples == 9810022 and counters["read_bytes"].unit == "bytes"
    assert counters["read_bytes"].total == 38981002240000 and counters["read_bytes"].maximum == 16777216
    assert counters["getxattr_hits"].total is None  # a plain count: no min, max, sum
    client = lustre_client("scratch-ffff8c2e4a0b1000", counters)
    assert client.fsname == "scratch"
    assert (client.read_bytes, client.reads, client.read_seconds) == (38981002240000, 9810022, 4410225019 / 1e6)
    # Lustre 2.10: secs.usecs, no start and elapsed time, no read timer.
    old = lustre_client("home-ffff9a", parse_llite_stats(text("llite-stats-2.10")))
    assert (old.read_bytes, old.reads, old.read_seconds) == (2101248, 4, None)
    # lctl get_param prints the same lines under a "llite.<instance>.stats=" header.
    assert parse_llite_stats("llite.scratch-ffff.stats=\n" + text("llite-stats")) == counters


def test_lustre_clients_are_found_in_debugfs_or_procfs(tmp_path):
    instance = tmp_path / "proc" / "fs" / "lustre" / "llite" / "scratch-ffff8c2e4a0b1000"
    instance.mkdir(parents=True)
    (instance / "stats").write_text(text("llite-stats"))
    roots = (str(tmp_path / "sys" / "kernel" / "debug" / "lustre" / "llite"), str(tmp_path / "proc/fs/lustre/llite"))
    assert read_lustre_clients(roots)["scratch-ffff8c2e4a0b1000"].reads == 9810022
    assert read_lustre_clients(roots[:1]) == {}


def test_nvfs_stats_with_io_stats_enabled():
    stats = parse_nvfs_stats(text("nvidia-fs-stats"))
    assert stats is not None
    assert (stats.version, stats.driver_version, stats.io_stats_enabled) == ("4.0", "2.28.4", True)
    assert (stats.reads.operations, stats.reads.ok, stats.reads.errors, stats.reads.mebibytes) == (
        9012331,
        9012310,
        21,
        2201338,
    )
    assert stats.reads.bytes == 2201338 * MIB
    assert (stats.reads.bandwidth_mib_per_second, stats.reads.average_latency_us) == (11850, 1311)
    assert (stats.writes.operations, stats.writes.mebibytes, stats.writes.average_latency_us) == (40221, 160884, 2204)
    assert (stats.batches, stats.batches_ok, stats.batch_errors, stats.batch_submit_latency_us) == (1204, 1203, 1, 38)
    assert stats.active_processes == 2
    assert stats.errors == {"cpu-gpu-pages": 0, "sg-ext": 0, "dma-map": 0, "dma-ref": 0}
    assert [(g.pci_address, g.uuid, g.registered_mib, g.cache_mib, g.max_pinned_mib) for g in stats.gpus] == [
        ("0000:18:00.0", "4a1b229c-106e-427f-8b31-001122334400", 2048, 0, 4096),
        ("0000:2a:00.0", "4a1b229c-106e-427f-8b31-001122334401", 2048, 64, 2048),
    ]
    assert stats.gpus[0].cross_root_port_percent == 0


def test_nvfs_stats_with_io_stats_disabled_keep_only_the_errors():
    stats = parse_nvfs_stats(text("nvidia-fs-stats-disabled"))
    assert stats is not None and not stats.io_stats_enabled
    assert stats.reads.operations is None and stats.reads.bytes is None and stats.reads.errors == 0
    assert stats.writes.operations is None and stats.batches is None
    assert stats.gpus[0].cross_root_port_percent is None  # peer stats off: the GPU line ends after max_pinned_MiB


def test_nvfs_module_absent_or_in_another_layout(tmp_path):
    assert read_nvfs_stats(str(tmp_path)) is None
    path = tmp_path / "driver" / "nvidia-fs" / "stats"
    path.parent.mkdir(parents=True)
    path.write_text("something else\n")
    with pytest.raises(ValueError):
        read_nvfs_stats(str(tmp_path))
    path.write_text(text("nvidia-fs-stats"))
    assert read_nvfs_stats(str(tmp_path)).reads.mebibytes == 2201338
    assert parse_nvfs_stats("") is None


def test_paths_are_placed_on_the_longest_mount_point():
    mounts = parse_mountstats(text("mountstats"))
    assert mount_of("/mnt/datasets/imagenet/train", mounts).fstype == "nfs4"
    assert mount_of("/mnt/datasets", mounts).fstype == "nfs4"
    assert mount_of("/mnt/datasets-old/x", mounts).fstype == "ext4"  # a sibling, not inside
    assert mount_of("/raid/shards", mounts).device == "/dev/md0"
    disks = parse_diskstats(text("diskstats"))
    assert block_device(mount_of("/raid/x", mounts), disks, {}).name == "md0"
    root = mount_of("/srv/data", mounts)
    assert block_device(root, disks, {}).name == "nvme0n1p2"
    numbers = parse_mountinfo("29 1 259:2 / / rw,relatime shared:1 - ext4 /dev/root rw\n")
    assert numbers == {"/": (259, 2)}
    renamed = type(root)("/dev/root", "/", "ext4")  # a device name diskstats does not know: its major:minor does
    assert block_device(renamed, disks, numbers).name == "nvme0n1p2"


# --- this machine ----------------------------------------------------------------------------------------------


@pytest.mark.skipif(not os.path.exists("/proc/self/mountstats"), reason="no /proc/self/mountstats here")
def test_this_machines_mountstats_and_diskstats():
    with open("/proc/self/mountstats") as handle:
        mounts = parse_mountstats(handle.read())
    with open("/proc/self/mounts") as handle:
        listed = [line.split()[1] for line in handle if line.strip()]
    assert len(mounts) == len(listed)  # every mount, whatever its type
    assert any(m.mount_point == "/" for m in mounts)
    assert all(m.nfs is not None for m in mounts if m.fstype in ("nfs", "nfs4"))
    with open("/proc/diskstats") as handle:
        disks = parse_diskstats(handle.read())
    assert disks and all(d.read_bytes >= 0 and d.reads_completed >= 0 for d in disks.values())
    with open("/proc/self/mountinfo") as handle:
        numbers = parse_mountinfo(handle.read())
    assert "/" in numbers


def test_nvfs_stats_of_the_layout_before_the_io_stats_line_count_what_they_show():
    """``NVFS statistics(ver: 2.0)`` (nvidia-fs 2.3) has no "IO stats:" line and always counts reads and writes: NVIDIA's
    GDS Benchmarking and Configuration Guide prints one from an NFS client with 20 TiB read, kept verbatim (its tabs as
    the page renders them, its closing ". ." elision too):
    https://docs.nvidia.com/gpudirect-storage/configuration-guide/index.html, "cat /proc/driver/nvidia-fs/stats"."""
    skipped = Counter()
    stats = parse_nvfs_stats(text("nvidia-fs-stats-2.0"), skipped)
    assert stats is not None and skipped == Counter()
    assert (stats.version, stats.driver_version, stats.io_stats_enabled) == ("2.0", "2:3:1", True)
    assert (stats.reads.operations, stats.reads.ok, stats.reads.mebibytes) == (424436862, 424436734, 21518771)
    assert (stats.reads.bandwidth_mib_per_second, stats.reads.average_latency_us) == (13081, 9773)
    assert (stats.writes.operations, stats.writes.mebibytes, stats.writes.bandwidth_mib_per_second) == (
        309770912,
        9748727,
        6958,
    )
    assert stats.active_processes == 1 and stats.batches is None
    assert [g.pci_address for g in stats.gpus] == ["0000:be:00.0", "0000:e7:00.0"]
    # A layout with the line says so itself, whatever its counts show.
    assert not parse_nvfs_stats(text("nvidia-fs-stats-disabled")).io_stats_enabled
