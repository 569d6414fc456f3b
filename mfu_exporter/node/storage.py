"""The storage read plane of this node from the kernel's own counters: mounts, block devices, Lustre, GPUDirect Storage.

Files read, under the configurable procfs root (``--path.procfs``) and sysfs root (``--path.sysfs``)::

    self/mountstats                 every mount ("device D mounted on M with fstype T"), NFS ones with their counters
    self/mountinfo                  the mount's major:minor, for a block device that its name does not place
    diskstats                       reads completed, sectors read (512 bytes each), milliseconds reading, per device
    fs/lustre/llite/<fs>-<sb>/stats            the Lustre client's per-mount counters (Lustre before 2.12)
    <sysfs>/kernel/debug/lustre/llite/<fs>-<sb>/stats   the same in debugfs (Lustre 2.12 and later; root only)
    driver/nvidia-fs/stats          the nvidia-fs driver's GPUDirect Storage counters

Layouts, from the code that prints them:

* ``mountstats``: ``fs/proc_namespace.c`` ``show_vfsstat`` prints ``device %s mounted on %s with fstype %s`` for every
  mount (names escaped with ``\\ooo`` octal like ``/proc/self/mounts``), then the file system's ``show_stats``. NFS's
  (``fs/nfs/super.c`` ``nfs_show_stats``) prints ``statvers=1.1`` and tab-indented lines, among them
  ``bytes:`` with eight counters (normal read, normal written, direct read, direct written, server read, server
  written, read pages, write pages), then ``net/sunrpc/stats.c`` ``rpc_clnt_show_stats``: ``per-op statistics``
  and one ``%12s: `` line per operation with ``ops ntrans timeouts bytes_sent bytes_recv queue_ms rtt_ms
  execute_ms`` and, since Linux 5.7, ``errors``.
* ``diskstats``: ``block/genhd.c`` ``diskstats_show``: ``%4d %7d %s`` (major, minor, name) then reads completed,
  reads merged, sectors read, ms reading, the same four for writes, I/Os in flight, ms doing I/O, weighted ms, then
  discards (4.18+) and flushes (5.5+). A sector here is always 512 bytes, whatever the device's block size.
* Lustre ``llite.*.stats``: ``lustre/obdclass/lprocfs_status.c`` ``lprocfs_stats_seq_show``: ``snapshot_time``
  first, then ``%-25s %lld samples [%s]`` per counter with samples, followed by `` min max sum`` for averaged
  counters and `` sumsquare`` for those with a deviation (``read_bytes 57406355 samples [bytes] 1 4194304
  1496254921055 ...`` in a real Lustre 2.16 client's output).
* nvidia-fs ``stats``: NVIDIA/gds-nvidia-fs ``src/nvfs-stat.c`` ``nvfs_stats_show``, ``NVFS statistics(ver: 4.0)``.
  ``Reads`` and ``Writes`` carry ``n= ok= err= readMiB=`` and a second line with the driver's bandwidth (MiB/s)
  and average latency (usec) only while the module parameter ``rw_stats_enabled`` is 1 (then also ``Batches``);
  otherwise only their error counts. ``IO stats: Enabled|Disabled`` says which (since driver 2.7, 2021-07); the
  ``NVFS statistics(ver: 2.0)`` layout before it (driver 2.3, 46c5656) has no such line and prints the counts
  always, so there the counts' presence is the flag. Per GPU: ``GPU <pci> uuid:<uuid> : Registered_MiB= Cache_MiB=
  max_pinned_MiB=`` and, with ``peer_stats_enabled``, ``cross_root_port(%)=``.

Pure parsing plus plain reads: no Prometheus, no config.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Mapping

SECTOR_BYTES = 512  # diskstats counts 512-byte sectors on every device (Documentation/admin-guide/iostats.rst)
MIB = 1 << 20
NFS_TYPES = frozenset({"nfs", "nfs4"})
NFS_BYTES_FIELDS = (
    "normal_read",
    "normal_written",
    "direct_read",
    "direct_written",
    "server_read",
    "server_written",
    "read_pages",
    "write_pages",
)
NFS_OP_FIELDS = ("ops", "transmissions", "timeouts", "bytes_sent", "bytes_received", "queue_ms", "rtt_ms", "execute_ms")

_ESCAPE = re.compile(r"\\([0-7]{3})")
_MOUNT_LINE = re.compile(r"^device (\S+) mounted on (\S+) with fstype (\S+)(?: (.*))?$")


def unescape(text: str) -> str:
    """A name as the kernel's ``mangle`` escaped it (space, tab, newline, backslash as ``\\ooo``), restored."""
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), text)


# --- /proc/self/mountstats ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NfsOp:
    """One ``per-op statistics`` line of an NFS mount (``READ:``, ``WRITE:``, ...): counters since the mount."""

    ops: int
    transmissions: int
    timeouts: int
    bytes_sent: int
    bytes_received: int
    queue_ms: int
    rtt_ms: int
    execute_ms: int
    errors: int | None  # Linux 5.7 added it; None before


@dataclass(frozen=True)
class NfsStats:
    """An NFS mount's counters: its ``bytes:`` line by name (``NFS_BYTES_FIELDS``) and its per-op lines by op."""

    statvers: str
    bytes: Mapping[str, int]
    ops: Mapping[str, NfsOp]
    age_seconds: int | None = None

    @property
    def read_bytes(self) -> int:
        """Bytes the applications read through this mount, cached or not (normal plus O_DIRECT reads)."""
        return self.bytes.get("normal_read", 0) + self.bytes.get("direct_read", 0)

    @property
    def server_read_bytes(self) -> int:
        """Bytes the client read from the server (READ replies): what crossed the network."""
        return self.bytes.get("server_read", 0)


@dataclass(frozen=True)
class Mount:
    """One mount as ``/proc/self/mountstats`` lists it; ``nfs`` holds the counters of an NFS mount."""

    device: str
    mount_point: str
    fstype: str
    nfs: NfsStats | None = None


# The kernel's counters here are 64-bit: a figure past that is no counter of its, so its line is skipped rather
# than exported as an absurd value.
COUNTER_MAX = (1 << 64) - 1
MAX_DIGITS = 20  # COUNTER_MAX's digits: int() of a longer string is never done


_INTEGER = re.compile(r"-?[0-9]+\Z")


def _counter(text: str) -> int:
    """A kernel counter's decimal text; ValueError for anything else, a negative or one past ``COUNTER_MAX``."""
    digits = text[1:] if text.startswith("-") else text
    if not digits.isascii() or not digits.isdigit() or len(digits) > MAX_DIGITS:
        raise ValueError(f"not a counter: {text[:40]!r}")
    value = int(text)
    if not 0 <= value <= COUNTER_MAX:
        raise ValueError(f"a counter out of range: {text[:40]!r}")
    return value


def parse_mountstats(text: str, skipped: Counter | None = None) -> list[Mount]:
    """Every mount of ``text`` (the kernel's ``/proc/self/mountstats``), in its order. Each line is read on its own:
    one that breaks the parser is counted in ``skipped`` (as ``unreadable_line``) and the rest still read."""
    skipped = Counter() if skipped is None else skipped
    mounts: list[Mount] = []
    current: dict | None = None

    def finish() -> None:
        if current is None:
            return
        nfs = None
        if current["statvers"] is not None:
            nfs = NfsStats(current["statvers"], current["bytes"], current["ops"], current["age"])
        mounts.append(Mount(current["device"], current["mount_point"], current["fstype"], nfs))

    in_ops = False
    for line in text.splitlines():
        try:
            header = _mount_header(line)
            if header is not None:
                finish()
                current, in_ops = header, False
            elif current is not None and current["statvers"] is not None:
                in_ops = _nfs_line(line.strip(), current, in_ops)
        except Exception:  # noqa: BLE001 - one garbled line is skipped, never the mounts after it
            skipped["unreadable_line"] += 1
    finish()
    return mounts


def _mount_header(line: str) -> dict | None:
    """A ``device ... mounted on ...`` line as the mount it starts; None for any other line."""
    header = _MOUNT_LINE.match(line)
    if header is None:
        return None
    device, point, fstype, rest = header.groups()
    statvers = rest.split("=", 1)[1].strip() if rest and rest.startswith("statvers=") else None
    return {
        "device": unescape(device),
        "mount_point": unescape(point),
        "fstype": fstype,
        "statvers": statvers,
        "bytes": {},
        "ops": {},
        "age": None,
    }


def _nfs_line(stripped: str, current: dict, in_ops: bool) -> bool:
    """One line of an NFS mount's counters into ``current``; whether the per-op lines have begun."""
    if not stripped:
        return in_ops
    if stripped == "per-op statistics":
        return True
    name, _, values = stripped.partition(":")
    fields = values.split()
    if in_ops:
        numbers = _counters(fields)
        if numbers is not None and len(numbers) >= len(NFS_OP_FIELDS):
            errors = numbers[len(NFS_OP_FIELDS)] if len(numbers) > len(NFS_OP_FIELDS) else None
            current["ops"][name.strip()] = NfsOp(**dict(zip(NFS_OP_FIELDS, numbers)), errors=errors)
    elif name == "bytes":
        numbers = _counters(fields)
        if numbers is not None:
            current["bytes"] = dict(zip(NFS_BYTES_FIELDS, numbers))
    elif name == "age" and fields and fields[0].isascii() and fields[0].isdigit():
        current["age"] = _counter(fields[0])
    return in_ops


def _integers(fields: list[str]) -> list[int] | None:
    try:
        return [int(value) for value in fields]
    except ValueError:
        return None


def _counters(fields: list[str]) -> list[int] | None:
    """The line's counters; None for a line of other words (left alone, as the kernel adds lines), ValueError for
    digits past ``COUNTER_MAX``."""
    if not all(_INTEGER.match(value) for value in fields):
        return None
    return [_counter(value) for value in fields]


# --- /proc/self/mountinfo ----------------------------------------------------------------------------------------


def parse_mountinfo(text: str) -> dict[str, tuple[int, int]]:
    """Mount point -> (major, minor) of the device behind it, from ``/proc/self/mountinfo`` (the last mount of a
    point wins, as it hides the earlier ones)."""
    found: dict[str, tuple[int, int]] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 5 or ":" not in fields[2]:
            continue
        major, _, minor = fields[2].partition(":")
        if major.isdigit() and minor.isdigit():
            found[unescape(fields[4])] = (int(major), int(minor))
    return found


# --- /proc/diskstats ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DiskStats:
    """The read side of one ``/proc/diskstats`` line (and its writes, for completeness)."""

    major: int
    minor: int
    name: str
    reads_completed: int
    reads_merged: int
    sectors_read: int
    read_ms: int
    writes_completed: int
    sectors_written: int
    write_ms: int

    @property
    def read_bytes(self) -> int:
        return self.sectors_read * SECTOR_BYTES

    @property
    def written_bytes(self) -> int:
        return self.sectors_written * SECTOR_BYTES


def parse_diskstats(text: str) -> dict[str, DiskStats]:
    """Device name -> its counters; lines too short for the read and write counters are skipped."""
    disks: dict[str, DiskStats] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 11:
            continue
        numbers = _integers(fields[:2] + fields[3:11])
        if numbers is None:
            continue
        major, minor, reads, merged, sectors, read_ms, writes, _, written, write_ms = numbers
        disks[fields[2]] = DiskStats(
            major, minor, fields[2], reads, merged, sectors, read_ms, writes, written, write_ms
        )
    return disks


# --- Lustre llite stats ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LustreCounter:
    """One ``lprocfs`` counter line: how many samples, their unit, and min, max, sum where the counter keeps them."""

    samples: int
    unit: str
    minimum: int | None = None
    maximum: int | None = None
    total: int | None = None


_LPROCFS_LINE = re.compile(r"^(\S+)\s+(\d+) samples \[([^\]]*)\](?:\s+(-?\d+)\s+(-?\d+)\s+(-?\d+))?")


def parse_llite_stats(text: str) -> dict[str, LustreCounter]:
    """Counter name -> counter, from one ``llite.<fs>-<sb>.stats`` file (``lctl get_param`` output with its
    ``llite...stats=`` header line works too). A counter with no samples is not printed, so it is absent."""
    counters: dict[str, LustreCounter] = {}
    for line in text.splitlines():
        match = _LPROCFS_LINE.match(line.strip())
        if match is None:
            continue
        name, samples, unit, low, high, total = match.groups()
        counters[name] = LustreCounter(
            int(samples),
            unit,
            int(low) if low is not None else None,
            int(high) if high is not None else None,
            int(total) if total is not None else None,
        )
    return counters


@dataclass(frozen=True)
class LustreClient:
    """One Lustre client mount's llite counters (its directory is ``<fsname>-<superblock>``)."""

    instance: str
    read_bytes: int  # the sum of read_bytes' samples; 0 while it has none
    reads: int  # read calls (the ``read_bytes`` counter's samples)
    read_seconds: float | None  # the ``read`` counter's sum in usecs (Lustre 2.15+ times reads), as seconds

    @property
    def fsname(self) -> str:
        return self.instance.rsplit("-", 1)[0]


def lustre_client(instance: str, counters: Mapping[str, LustreCounter]) -> LustreClient:
    read = counters.get("read_bytes")
    timed = counters.get("read")
    seconds = None
    if timed is not None and timed.unit == "usecs" and timed.total is not None:
        seconds = timed.total / 1e6
    return LustreClient(
        instance,
        read_bytes=(read.total or 0) if read is not None else 0,
        reads=read.samples if read is not None else 0,
        read_seconds=seconds,
    )


def llite_roots(procfs: str, sysfs: str) -> tuple[str, ...]:
    """Where a Lustre client's llite directories are: debugfs (2.12 and later) first, then procfs (older)."""
    return (os.path.join(sysfs, "kernel", "debug", "lustre", "llite"), os.path.join(procfs, "fs", "lustre", "llite"))


def read_lustre_clients(roots: tuple[str, ...]) -> dict[str, LustreClient]:
    """Instance -> client, from the first root that has llite directories; empty without a Lustre client."""
    for root in roots:
        try:
            names = sorted(os.listdir(root))
        except OSError:
            continue
        clients = {}
        for name in names:
            try:
                with open(os.path.join(root, name, "stats"), encoding="ascii", errors="replace") as handle:
                    clients[name] = lustre_client(name, parse_llite_stats(handle.read()))
            except OSError:
                continue
        if clients:
            return clients
    return {}


# --- nvidia-fs (GPUDirect Storage) -------------------------------------------------------------------------------


@dataclass(frozen=True)
class NvfsDirection:
    """The ``Reads`` or ``Writes`` lines. Counts, MiB, bandwidth and latency are None while ``rw_stats_enabled`` is 0
    (the driver prints only the errors then)."""

    errors: int
    io_state_errors: int
    operations: int | None = None
    ok: int | None = None
    mebibytes: int | None = None
    bandwidth_mib_per_second: int | None = None
    average_latency_us: int | None = None

    @property
    def bytes(self) -> int | None:
        return None if self.mebibytes is None else self.mebibytes * MIB


@dataclass(frozen=True)
class NvfsGpu:
    """One GPU's line: its PCI address and UUID, BAR memory registered and cached for GDS, and its peak."""

    pci_address: str
    uuid: str
    registered_mib: int
    cache_mib: int
    max_pinned_mib: int
    cross_root_port_percent: int | None = None


@dataclass(frozen=True)
class NvfsStats:
    """``/proc/driver/nvidia-fs/stats``, in the ``NVFS statistics(ver: 4.0)`` layout."""

    version: str  # the stats layout, "4.0"
    driver_version: str | None
    io_stats_enabled: bool  # "IO stats: Enabled" (rw_stats_enabled=1): the read and write counters move
    reads: NvfsDirection
    writes: NvfsDirection
    batches: int | None = None
    batches_ok: int | None = None
    batch_errors: int | None = None
    batch_submit_latency_us: int | None = None
    active_processes: int | None = None
    errors: Mapping[str, int] = field(default_factory=dict)  # the ``Error`` line: cpu-gpu-pages, sg-ext, dma-map...
    gpus: tuple[NvfsGpu, ...] = ()


_KEY_VALUE = re.compile(r"([A-Za-z_\-()%/]+)=(-?[0-9]+)")
_GPU_LINE = re.compile(r"^GPU\s+([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\s+uuid:(\S+)\s*:\s*(.*)$")


def _pairs(text: str) -> dict[str, int]:
    pairs = {}
    for key, value in _KEY_VALUE.findall(text):
        if len(value.lstrip("-")) > MAX_DIGITS or abs(int(value)) > COUNTER_MAX:
            raise ValueError(f"{key} is out of range: {value[:40]}")
        pairs[key] = int(value)
    return pairs


def parse_nvfs_stats(text: str, skipped: Counter | None = None) -> NvfsStats | None:
    """The driver's statistics; None when ``text`` is not in the ``NVFS statistics`` layout. Each line is read on
    its own: one that breaks the parser is counted in ``skipped`` (as ``unreadable_line``) and the rest still read."""
    skipped = Counter() if skipped is None else skipped
    version = None
    driver = None
    enabled: bool | None = None  # None until an "IO stats:" line says
    lines: dict[str, list[dict[str, int]]] = {}
    gpus: list[NvfsGpu] = []
    scalars: dict[str, int] = {}
    for raw in text.splitlines():
        try:
            line = raw.strip()
            if line.startswith("NVFS statistics(ver:"):
                version = line[len("NVFS statistics(ver:") :].rstrip(")").strip()
            else:
                driver, enabled = _nvfs_line(line, driver, enabled, lines, gpus, scalars)
        except Exception:  # noqa: BLE001 - one garbled line is skipped, never the lines after it
            skipped["unreadable_line"] += 1
    if version is None:
        return None
    reads, writes = _merged(lines.get("Reads", [])), _merged(lines.get("Writes", []))
    if enabled is None:  # the layout before the flag (ver 2.0) counted always: the counts are there or not
        enabled = "n" in reads or "n" in writes
    batches = _merged(lines.get("Batches", []))
    errors = _merged(lines.get("Error", []))
    return NvfsStats(
        version=version,
        driver_version=driver,
        io_stats_enabled=enabled,
        reads=_direction(reads, "readMiB"),
        writes=_direction(writes, "writeMiB"),
        batches=batches.get("n"),
        batches_ok=batches.get("ok"),
        batch_errors=batches.get("err"),
        batch_submit_latency_us=batches.get("Avg-Submit-Latency(usec)"),
        active_processes=scalars.get("active_processes"),
        errors=errors,
        gpus=tuple(gpus),
    )


def _nvfs_line(
    line: str,
    driver: str | None,
    enabled: bool | None,
    lines: dict[str, list[dict[str, int]]],
    gpus: list[NvfsGpu],
    scalars: dict[str, int],
) -> tuple[str | None, bool | None]:
    """One stripped line of the statistics into ``lines``, ``gpus`` or ``scalars``; the driver and IO stats flag."""
    if line.startswith("NVFS Driver(version:"):
        driver = line[len("NVFS Driver(version:") :].rstrip(")").strip()
    elif line.startswith("IO stats:"):
        enabled = line[len("IO stats:") :].strip().lower().startswith("enabled")
    elif line.startswith("Active Process:"):
        value = line.split(":", 1)[1].strip()
        if value.isascii() and value.isdigit():
            scalars["active_processes"] = _counter(value)
    elif (gpu := _GPU_LINE.match(line)) is not None:
        values = _pairs(gpu.group(3))
        gpus.append(
            NvfsGpu(
                gpu.group(1).lower(),
                gpu.group(2),
                values.get("Registered_MiB", 0),
                values.get("Cache_MiB", 0),
                values.get("max_pinned_MiB", 0),
                values.get("cross_root_port(%)"),
            )
        )
    elif ":" in line:
        name, _, rest = line.partition(":")
        lines.setdefault(name.strip(), []).append(_pairs(rest))
    return driver, enabled


def _merged(parts: list[dict[str, int]]) -> dict[str, int]:
    merged: dict[str, int] = {}
    for part in parts:
        merged.update(part)
    return merged


def _direction(values: dict[str, int], mib_key: str) -> NvfsDirection:
    return NvfsDirection(
        errors=values.get("err", 0),
        io_state_errors=values.get("io_state_err", 0),
        operations=values.get("n"),
        ok=values.get("ok"),
        mebibytes=values.get(mib_key),
        bandwidth_mib_per_second=values.get("Bandwidth(MiB/s)"),
        average_latency_us=values.get("Avg-Latency(usec)"),
    )


NVFS_STATS = os.path.join("driver", "nvidia-fs", "stats")


def read_nvfs_stats(procfs: str, skipped: Counter | None = None) -> NvfsStats | None:
    """The driver's statistics; None when the nvidia-fs module is not loaded (no ``driver/nvidia-fs/stats``).

    Raises OSError for a file that exists but cannot be read, and ValueError for one in another layout."""
    path = os.path.join(procfs, NVFS_STATS)
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            text = handle.read()
    except FileNotFoundError:
        return None
    stats = parse_nvfs_stats(text, skipped)
    if stats is None:
        raise ValueError(f"{path} is not in the NVFS statistics layout")
    return stats


# --- placing paths on mounts -------------------------------------------------------------------------------------


def mount_of(path: str, mounts: list[Mount]) -> Mount | None:
    """The mount holding ``path``: the longest mount point that is ``path`` or a parent of it (the last mounted of
    equal ones, as it hides the others). ``path`` is resolved when it exists here, taken as written otherwise."""
    target = os.path.realpath(path) if os.path.exists(path) else os.path.normpath(path)
    best: Mount | None = None
    for mount in mounts:
        point = mount.mount_point
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best.mount_point)):
            best = mount
    return best


def block_device(
    mount: Mount, disks: Mapping[str, DiskStats], numbers: Mapping[str, tuple[int, int]]
) -> DiskStats | None:
    """The ``diskstats`` entry behind a mount of a block device: by the device's name (``/dev/nvme0n1p1``, a
    ``/dev/mapper`` or ``/dev/disk/by-*`` link resolved where it exists), else by the mount's major:minor."""
    if mount.device.startswith("/dev/"):
        name = os.path.basename(os.path.realpath(mount.device) if os.path.exists(mount.device) else mount.device)
        if name in disks:
            return disks[name]
    number = numbers.get(mount.mount_point)
    if number is not None:
        for disk in disks.values():
            if (disk.major, disk.minor) == number:
                return disk
    return None
