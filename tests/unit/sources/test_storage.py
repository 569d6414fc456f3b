"""The storage source (mfu_exporter.sources.storage) over procfs and sysfs trees holding the fixture files, rendered by
mfu_exporter.render.storage; and over this machine's own procfs, reading a real file (the end-to-end check)."""

from __future__ import annotations

import mmap
import os
import shutil
from pathlib import Path

import pytest

from mfu_exporter.config import ConfigError, Enabled, typed_config, validate
from mfu_exporter.node.storage import MIB, mount_of, parse_mountstats
from mfu_exporter.sources import SOURCES, SourceContext, build_sources
from mfu_exporter.sources.base import Paths, SourceUnavailable
from mfu_exporter.sources.storage import StorageReading, StorageSource
from tests.support.expo import snapshot_samples
from tests.support.sources import Clock

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "storage"
LLITE = "scratch-ffff8c2e4a0b1000"


def node(tmp_path: Path, gds: str | None = "nvidia-fs-stats") -> tuple[str, str]:
    procfs, sysfs = tmp_path / "proc", tmp_path / "sys"
    (procfs / "self").mkdir(parents=True)
    shutil.copy(FIXTURES / "mountstats", procfs / "self" / "mountstats")
    shutil.copy(FIXTURES / "diskstats", procfs / "diskstats")
    (procfs / "self" / "mountinfo").write_text("29 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw\n")
    if gds:
        (procfs / "driver" / "nvidia-fs").mkdir(parents=True)
        shutil.copy(FIXTURES / gds, procfs / "driver" / "nvidia-fs" / "stats")
    llite = sysfs / "kernel" / "debug" / "lustre" / "llite" / LLITE
    llite.mkdir(parents=True)
    shutil.copy(FIXTURES / "llite-stats", llite / "stats")
    return str(procfs), str(sysfs)


def source(tmp_path: Path, paths: dict, gds: str | None = "nvidia-fs-stats", **config) -> StorageSource:
    procfs, sysfs = node(tmp_path, gds)
    section = typed_config(validate({"sources": {"storage": config}})).sources.storage
    return StorageSource(section, procfs, sysfs, paths, monotonic=Clock(100.0))


PATHS = {
    ("llama", "data"): ("/mnt/datasets/tokens", "/lustre/scratch/shards"),
    ("llama", "checkpoint"): ("/raid/checkpoints/llama",),
    ("bert", "data"): ("/mnt/datasets/wiki",),
    ("", "configured"): ("/dev/shm",),
}


def test_each_mount_of_the_jobs_is_read_from_its_own_counters(tmp_path):
    snapshot = source(tmp_path, PATHS).sample()
    reading = snapshot.readings
    assert isinstance(reading, StorageReading)
    by_point = {m.mount_point: m for m in reading.mounts}
    assert set(by_point) == {"/mnt/datasets", "/lustre/scratch", "/raid", "/dev/shm"}
    nfs = by_point["/mnt/datasets"]
    assert (nfs.counters, nfs.fstype, nfs.device) == ("mountstats", "nfs4", "nfs-data.example.com:/datasets")
    assert (nfs.read_bytes, nfs.reads, nfs.read_seconds) == (398458880000, 380012, 3829.911)
    assert nfs.jobs == (("llama", "data"), ("bert", "data"))
    lustre = by_point["/lustre/scratch"]
    assert (lustre.counters, lustre.read_bytes, lustre.reads) == ("llite", 38981002240000, 9810022)
    raid = by_point["/raid"]
    assert (raid.counters, raid.read_bytes, raid.reads, raid.read_seconds) == (
        "diskstats",
        20931221504 * 512,
        10222311,
        0,
    )
    assert raid.jobs == (("llama", "checkpoint"),)
    shm = by_point["/dev/shm"]
    assert shm.counters == "" and shm.read_bytes is None and "tmpfs" in shm.detail and shm.jobs == ()
    assert [m.mount_point for m in reading.job_mounts("bert")] == ["/mnt/datasets"]
    assert [m.mount_point for m in reading.job_mounts("llama", role="data")] == ["/lustre/scratch", "/mnt/datasets"]
    assert [m.mount_point for m in reading.job_mounts("llama", role="checkpoint")] == ["/raid"]

    found = snapshot_samples(snapshot)
    labels = (("device", "nfs-data.example.com:/datasets"), ("fstype", "nfs4"), ("mountpoint", "/mnt/datasets"))
    assert found["mfu_storage_read_bytes_total", labels] == 398458880000
    assert found["mfu_storage_reads_total", labels] == 380012
    assert found["mfu_storage_read_seconds_total", labels] == 3829.911
    info = {labels for name, labels in found if name == "mfu_storage_job_mount_info"}
    assert (("mountpoint", "/raid"), ("role", "checkpoint"), ("training_job", "llama")) in info
    assert len(info) == 4
    assert not any(dict(labels).get("mountpoint") == "/dev/shm" for _, labels in found)  # no counters, no series
    assert found["mfu_gds_loaded", ()] == 1 and found["mfu_gds_io_stats_enabled", ()] == 1
    assert found["mfu_gds_read_bytes_total", ()] == 2201338 * MIB and found["mfu_gds_reads_total", ()] == 9012331
    assert found["mfu_gds_read_errors_total", ()] == 21 and found["mfu_gds_written_bytes_total", ()] == 160884 * MIB
    assert "mfu_gds_gpu_registered_bytes" not in {name for name, _ in found}  # series: full only


def test_series_levels_and_the_rate_between_samples(tmp_path):
    clock = Clock(100.0)
    procfs, sysfs = node(tmp_path)
    section = typed_config(validate({"sources": {"storage": {"series": "full"}}})).sources.storage
    storage = StorageSource(section, procfs, sysfs, {("llama", "data"): ("/mnt/datasets",)}, monotonic=clock)
    first = storage.sample()
    assert first.readings.mounts[0].read_bytes_per_second is None
    stats = Path(procfs) / "self" / "mountstats"
    stats.write_text(stats.read_text().replace("398458880000", str(398458880000 + 50 * MIB)))
    clock.now += 5
    second = storage.sample()
    assert second.readings.mounts[0].read_bytes_per_second == 10 * MIB
    names = {name for name, _ in snapshot_samples(second)}
    assert {"mfu_gds_gpu_registered_bytes", "mfu_gds_read_latency_seconds", "mfu_gds_batches_total"} <= names
    minimal = StorageSource(
        typed_config(validate({"sources": {"storage": {"series": "minimal"}}})).sources.storage,
        procfs,
        sysfs,
        {("llama", "data"): ("/mnt/datasets",)},
    )
    assert {name for name, _ in snapshot_samples(minimal.sample())} == {
        "mfu_storage_read_bytes_total",
        "mfu_storage_job_mount_info",
    }


def test_gds_absent_disabled_off_or_required(tmp_path):
    absent = source(tmp_path / "a", {}, gds=None).sample()
    assert absent.status["gds"].startswith("not loaded") and snapshot_samples(absent) == {("mfu_gds_loaded", ()): 0}
    off = source(tmp_path / "b", {}, gds="nvidia-fs-stats-disabled").sample()
    assert "rw_stats_enabled=1" in off.status["gds"]
    found = snapshot_samples(off)
    assert found["mfu_gds_io_stats_enabled", ()] == 0 and ("mfu_gds_reads_total", ()) not in found
    assert found["mfu_gds_read_errors_total", ()] == 0
    section = typed_config(validate({"sources": {"storage": {"gds": "false"}}})).sources.storage
    assert section.gds is Enabled.FALSE
    procfs, sysfs = node(tmp_path / "d")
    assert StorageSource(section, procfs, sysfs).sample().status["gds"].startswith("disabled")
    required = typed_config(validate({"sources": {"storage": {"gds": "true"}}})).sources.storage
    procfs, sysfs = node(tmp_path / "e", gds=None)
    with pytest.raises(SourceUnavailable, match="nvidia-fs"):
        StorageSource(required, procfs, sysfs).sample()


def test_a_path_on_no_mount_and_a_missing_mount_table(tmp_path):
    storage = source(tmp_path, {("llama", "data"): ("relative/path",)})
    snapshot = storage.sample()
    assert snapshot.errors["path_not_mounted"] == 1 and snapshot.status["unplaced_paths"] == ["relative/path"]
    (tmp_path / "proc" / "self" / "mountstats").unlink()
    with pytest.raises(SourceUnavailable, match="no_mountstats"):
        storage.sample()
    # With no paths to follow, the mount table is not even read: a default node pays nothing for it.
    assert source(tmp_path / "n", {}).sample().readings.mounts == ()


def test_the_mount_table_of_another_process(tmp_path):
    """In a container with the host's PID namespace, the host's mounts are init's: sources.storage.mount_table."""
    procfs, sysfs = node(tmp_path)
    (Path(procfs) / "1").mkdir()
    shutil.move(str(Path(procfs) / "self" / "mountstats"), str(Path(procfs) / "1" / "mountstats"))
    section = typed_config(validate({"sources": {"storage": {"mount_table": "1/mountstats"}}})).sources.storage
    storage = StorageSource(section, procfs, sysfs, {("llama", "data"): ("/mnt/datasets",)})
    assert storage.sample().readings.mounts[0].counters == "mountstats"


def test_config_keys_and_the_registered_factory(tmp_path):
    with pytest.raises(ConfigError, match="jobs.llama.data_paths"):
        validate({"jobs": {"llama": {"data_paths": "/mnt/datasets"}}}, "node.yaml")
    with pytest.raises(ConfigError, match="sources.storage.mounts"):
        validate({"sources": {"storage": {"mounts": [""]}}}, "node.yaml")
    procfs, sysfs = node(tmp_path)
    config = validate(
        {
            "jobs": {"llama": {"data_paths": ["/mnt/datasets/tokens"]}},
            "sources": {
                "checkpoint": {"watch": [{"path": "/raid/ckpt", "job": "llama"}]},
                "storage": {"mounts": ["/lustre/scratch"]},
                **{name: {"enabled": "false"} for name in ("gpu", "rdma", "ethtool", "logs", "preflight")},
            },
            "discovery": {"kubernetes": {"enabled": "false"}, "slurm": {"enabled": "false"}},
        }
    )
    assert "storage" in SOURCES
    storage = next(s for s in build_sources(config, SourceContext(config, Paths(sysfs, procfs))) if s.name == "storage")
    roles = {(m.mount_point, m.jobs) for m in storage.sample().readings.mounts}
    assert roles == {
        ("/mnt/datasets", (("llama", "data"),)),
        ("/raid", (("llama", "checkpoint"),)),
        ("/lustre/scratch", ()),
    }


def test_data_paths_are_config_only_not_a_progress_report_fact():
    from mfu_exporter.config import validate_job_facts

    with pytest.raises(ConfigError, match="data_paths"):
        validate_job_facts({"data_paths": ["/x"]}, "request")


# --- this machine: reads of a real file show in its mount's counters -------------------------------------------


def read_uncached(path: str, size: int) -> str:
    """Read ``path`` past the page cache: O_DIRECT where the file system takes it (aligned buffer from mmap), else
    after dropping its clean pages with posix_fadvise(DONTNEED). Returns which worked."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError:
        fd = None
    if fd is not None:
        buffer = mmap.mmap(-1, MIB)
        try:
            done = 0
            while done < size:
                got = os.readv(fd, [buffer])
                if got <= 0:
                    break
                done += got
            if done >= size:
                return "O_DIRECT"
        except OSError:
            pass  # EINVAL: this file system refuses O_DIRECT
        finally:
            os.close(fd)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        while os.read(fd, MIB):
            pass
    finally:
        os.close(fd)
    return "posix_fadvise(DONTNEED)"


@pytest.mark.skipif(not os.path.exists("/proc/self/mountstats"), reason="no /proc/self/mountstats here")
def test_reads_of_a_real_file_show_in_its_mounts_counters(tmp_path):
    with open("/proc/self/mountstats") as handle:
        mount = mount_of(str(tmp_path), parse_mountstats(handle.read()))
    assert mount is not None
    if not mount.device.startswith("/dev/") and mount.fstype not in ("nfs", "nfs4"):
        pytest.skip(f"{tmp_path} is on {mount.fstype} ({mount.device}): no device whose reads the kernel counts")
    size = 8 * MIB
    path = tmp_path / "shard.bin"
    with open(path, "wb") as out:
        out.write(os.urandom(size))
        out.flush()
        os.fsync(out.fileno())  # clean pages: DONTNEED can drop them
    section = typed_config(validate({})).sources.storage
    storage = StorageSource(section, "/proc", "/sys", {("e2e", "data"): (str(tmp_path),)})
    before = storage.sample().readings.mounts[0]
    assert before.mount_point == mount.mount_point and before.counters in ("diskstats", "mountstats"), before.detail
    how = read_uncached(str(path), size)
    after = storage.sample().readings.mounts[0]
    # Other readers of the device only add to the difference: at least the file's bytes and one read more.
    assert after.read_bytes - before.read_bytes >= size, how
    assert after.reads > before.reads
    print(f"\n{mount.mount_point} on {mount.device} ({mount.fstype}): {size} bytes read with {how}")


def test_a_reading_is_placed_at_the_wall_time_read_just_before_its_counters(tmp_path):
    procfs, sysfs = node(tmp_path)
    stats = Path(procfs) / "self" / "mountstats"
    section = typed_config(validate({})).sources.storage
    stamps: list[float] = []

    def wall() -> float:
        # Bytes that arrive after the stamp are read with it: a sample is never placed after what it read.
        stats.write_text(stats.read_text().replace("398458880000", str(398458880000 + 50 * MIB)))
        stamps.append(1_787_000_000.0 + len(stamps))
        return stamps[-1]

    storage = StorageSource(section, procfs, sysfs, {("llama", "checkpoint"): ("/mnt/datasets",)}, wall=wall)
    reading = storage.sample().readings
    assert reading.at == stamps[-1] == 1_787_000_000.0
    assert reading.mounts[0].read_bytes == 398458880000 + 50 * MIB
