"""The storage read plane: bytes and operations read per mount of the jobs' data, and GPUDirect Storage.

Which mounts: the ones holding each job's ``jobs.<name>.data_paths`` (role ``data``), its checkpoint watches
(``sources.checkpoint.watch``, role ``checkpoint``: what a restore reads) and ``sources.storage.mounts`` (no job).
So the series are bounded by the configuration: mounts, never files. Discovery does not yet tell a pod's volumes,
so a discovered job's mounts are the ones configured for its name.

Which counters, by the mount's type (``mfu_exporter.node.storage`` has the layouts):

* NFS (``nfs``, ``nfs4``): ``/proc/self/mountstats``: bytes from the server (the ``bytes:`` line's server read
  bytes), ``READ`` operations and their execution time. Per mount.
* Lustre: the client's ``llite.<fs>-<sb>/stats``: ``read_bytes`` (sum and samples) and ``read`` (usecs). Per mount;
  llite counts reads the client's cache served too.
* A block device (ext4, xfs on NVMe...): ``/proc/diskstats`` of the device the mount is on: sectors read × 512,
  reads completed, milliseconds reading. Per device: every mount and user of that device counts.

GPUDirect Storage: the nvidia-fs driver's ``/proc/driver/nvidia-fs/stats`` (absent: the module is not loaded, said
in the status). Its read and write counts stay at zero unless the module was loaded with ``rw_stats_enabled=1``.

The source returns typed readings only (``StorageReading`` in ``Snapshot.readings``); ``mfu_exporter.render.storage``
turns them into families.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Mapping

from mfu_exporter.config import Enabled, StorageConfig
from mfu_exporter.node.storage import (
    NFS_TYPES,
    DiskStats,
    LustreClient,
    Mount,
    NvfsStats,
    block_device,
    llite_roots,
    mount_of,
    parse_diskstats,
    parse_mountinfo,
    parse_mountstats,
    read_lustre_clients,
    read_nvfs_stats,
)
from mfu_exporter.sources.base import Snapshot, SourceContext, SourceUnavailable

ROLES = ("data", "checkpoint", "configured")


@dataclass(frozen=True)
class MountReading:
    """One mount in one sample. The counters are None when nothing on this node counts reads for it (tmpfs, a FUSE
    file system, a Lustre client whose llite directory is not readable): the mount is still listed, with why."""

    mount_point: str
    fstype: str
    device: str
    counters: str  # where the figures come from: "mountstats", "llite", "diskstats", or "" (none)
    read_bytes: int | None
    reads: int | None
    read_seconds: float | None
    read_bytes_per_second: float | None  # since the previous sample; None on the first or after a reset
    jobs: tuple[tuple[str, str], ...]  # (job, role) whose paths are on this mount
    detail: str = ""


@dataclass(frozen=True)
class StorageReading:
    """What the storage source saw: the mounts it follows and the GPUDirect Storage driver's counters."""

    mounts: tuple[MountReading, ...]
    gds: NvfsStats | None
    gds_status: str  # "loaded", "not loaded", "disabled" (sources.storage.gds: false), or a read problem
    series: str  # the source's series level, for the renderer
    # Unix time just before the counters were read: a restore's bytes are the growth between two samples around
    # it, so each sample is placed by when it read, not by when the daemon took its snapshot (later, under load).
    at: float | None = None

    def job_mounts(self, job: str, role: str | None = None) -> tuple[MountReading, ...]:
        """The mounts holding the job's paths (of ``role`` only, when given: ``data`` or ``checkpoint``)."""
        return tuple(
            mount for mount in self.mounts if any(name == job and role in (None, kind) for name, kind in mount.jobs)
        )


class StorageSource:
    name = "storage"

    def __init__(
        self,
        section: StorageConfig,
        procfs: str = "/proc",
        sysfs: str = "/sys",
        paths: Mapping[tuple[str, str], tuple[str, ...]] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ):
        """``paths``: (job, role) -> the paths whose mounts to follow (``""`` for the job of ``mounts``)."""
        self.interval = section.interval
        self.timeout = section.timeout
        self.series = section.series
        self._gds = section.gds
        self._procfs = procfs
        self._mount_table = section.mount_table
        self._llite_roots = llite_roots(procfs, sysfs)
        self._paths = dict(paths or {})
        self._monotonic = monotonic
        self._wall = wall
        self._previous: dict[str, tuple[float, int]] = {}  # mount point -> (when, read bytes) of the last sample

    def sample(self) -> Snapshot:
        errors: Counter = Counter()
        at = self._wall()
        mounts = self._mounts(errors) if self._paths else []
        followed: dict[str, tuple[Mount, list[tuple[str, str]]]] = {}
        unplaced = []
        for (job, role), paths in self._paths.items():
            for path in paths:
                mount = mount_of(path, mounts)
                if mount is None:
                    errors["path_not_mounted"] += 1
                    unplaced.append(path)
                    continue
                entry = followed.setdefault(mount.mount_point, (mount, []))
                if job and (job, role) not in entry[1]:
                    entry[1].append((job, role))
        readings = self._readings(followed, errors)
        gds, gds_status = self._gds_stats(errors)
        reading = StorageReading(readings, gds, gds_status, self.series, at=at)
        status = {
            "mounts": [
                {
                    "mount_point": m.mount_point,
                    "fstype": m.fstype,
                    "device": m.device,
                    "counters": m.counters or "none",
                    "read_bytes_per_second": m.read_bytes_per_second,
                    "jobs": [f"{job} ({role})" for job, role in m.jobs],
                    "detail": m.detail,
                }
                for m in readings
            ],
            "unplaced_paths": unplaced,
            "gds": gds_status,
        }
        return Snapshot(readings=reading, errors=errors, status=status)

    def close(self) -> None:
        pass

    # internals

    def _mounts(self, errors: Counter) -> list[Mount]:
        path = os.path.join(self._procfs, self._mount_table)
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                return parse_mountstats(handle.read(), errors)
        except OSError as exc:
            raise SourceUnavailable("no_mountstats", f"cannot read {path}: {exc.strerror}", retry_after=60.0) from exc

    def _readings(
        self, followed: dict[str, tuple[Mount, list[tuple[str, str]]]], errors: Counter
    ) -> tuple[MountReading, ...]:
        kinds = {_kind(mount) for mount, _ in followed.values()}
        disks: dict[str, DiskStats] = self._read("diskstats", parse_diskstats, errors) if "block" in kinds else {}
        mountinfo = os.path.join(os.path.dirname(self._mount_table), "mountinfo")
        numbers = self._read(mountinfo, parse_mountinfo, errors) if "block" in kinds else {}
        lustre = read_lustre_clients(self._llite_roots) if "lustre" in kinds else {}
        now = self._monotonic()
        readings = []
        for point, (mount, jobs) in sorted(followed.items()):
            kind = _kind(mount)
            counters, figures, detail = "", (None, None, None), ""
            if kind == "nfs" and mount.nfs is not None:
                read = mount.nfs.ops.get("READ")
                counters = "mountstats"
                figures = (
                    mount.nfs.server_read_bytes,
                    read.ops if read is not None else None,
                    read.execute_ms / 1000 if read is not None else None,
                )
            elif kind == "lustre":
                client = _lustre_client(mount, lustre)
                if isinstance(client, LustreClient):
                    counters = "llite"
                    figures = (client.read_bytes, client.reads, client.read_seconds)
                else:
                    detail = client
            elif kind == "block":
                disk = block_device(mount, disks, numbers)
                if disk is not None:
                    counters = "diskstats"
                    figures = (disk.read_bytes, disk.reads_completed, disk.read_ms / 1000)
                    detail = f"device {disk.name}: every reader of the device counts"
                else:
                    detail = f"{mount.device} not found in diskstats"
            else:
                detail = f"no read counters for {mount.fstype}"
            rate = self._rate(point, now, figures[0])
            readings.append(
                MountReading(
                    point,
                    mount.fstype,
                    mount.device,
                    counters,
                    *figures,
                    rate,
                    tuple(jobs),
                    detail,  # type: ignore[arg-type]
                )
            )
        self._previous = {
            reading.mount_point: (now, reading.read_bytes) for reading in readings if reading.read_bytes is not None
        }
        return tuple(readings)

    def _rate(self, point: str, now: float, read_bytes: int | None) -> float | None:
        previous = self._previous.get(point)
        if previous is None or read_bytes is None or now <= previous[0] or read_bytes < previous[1]:
            return None  # the first sample, or a counter reset (a remount): no rate this time
        return (read_bytes - previous[1]) / (now - previous[0])

    def _read(self, relative: str, parse: Callable, errors: Counter):
        try:
            with open(os.path.join(self._procfs, relative), encoding="utf-8", errors="replace") as handle:
                return parse(handle.read())
        except OSError:
            errors[f"no_{os.path.basename(relative)}"] += 1
            return {}

    def _gds_stats(self, errors: Counter) -> tuple[NvfsStats | None, str]:
        if self._gds is Enabled.FALSE:
            return None, "disabled (sources.storage.gds: false)"
        try:
            stats = read_nvfs_stats(self._procfs, errors)
        except (OSError, ValueError) as exc:
            errors["gds_unreadable"] += 1
            return None, f"unreadable: {exc}"
        if stats is None:
            if self._gds is Enabled.TRUE:
                raise SourceUnavailable(
                    "gds_not_loaded", "no /proc/driver/nvidia-fs/stats: the nvidia-fs module is not loaded"
                )
            return None, "not loaded (no /proc/driver/nvidia-fs/stats: the nvidia-fs module is not loaded)"
        if not stats.io_stats_enabled:
            return stats, "loaded; read/write counters off (load nvidia-fs with rw_stats_enabled=1)"
        return stats, "loaded"


def _kind(mount: Mount) -> str:
    if mount.fstype in NFS_TYPES:
        return "nfs"
    if mount.fstype == "lustre":
        return "lustre"
    if mount.device.startswith("/dev/"):
        return "block"
    return "other"


def _lustre_client(mount: Mount, clients: dict[str, LustreClient]) -> LustreClient | str:
    """The llite instance of a Lustre mount (``mgs@tcp:/fsname[/subdir]``), by its file system's name; a reason when
    none or several match (the same file system mounted twice: llite names them by superblock, not mount point)."""
    fsname = mount.device.rpartition(":/")[2].split("/")[0]
    matches = [client for client in clients.values() if client.fsname == fsname]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        return f"no llite stats for {fsname} (debugfs needs root on Lustre 2.12+)"
    return f"{len(matches)} llite instances of {fsname}: cannot tell which is this mount"


def storage_source(section: StorageConfig, ctx: SourceContext) -> StorageSource:
    """The ``mfu_exporter.sources.SOURCES`` factory: each job's data paths and checkpoint watches, and
    ``sources.storage.mounts``, under ``ctx``'s procfs and sysfs."""
    settings = ctx.settings
    paths: dict[tuple[str, str], tuple[str, ...]] = {}
    for name, job in settings.jobs.items():
        if job.data_paths:
            paths[name, "data"] = tuple(job.data_paths)
    for watch in settings.sources.checkpoint.watch:
        key = (watch.job, "checkpoint")
        paths[key] = paths.get(key, ()) + (watch.path,)
    if section.mounts:
        paths["", "configured"] = tuple(section.mounts)
    return StorageSource(section, ctx.paths.procfs, ctx.paths.sysfs, paths, monotonic=ctx.monotonic, wall=ctx.wall)
