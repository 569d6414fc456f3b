"""The storage source's readings (``mfu_exporter.sources.storage.StorageReading``) as metric families.

Per mount: bytes, operations and seconds read (counters, as the kernel counts them since the mount or boot), and
which job's data or checkpoints it holds. GPUDirect Storage: the nvidia-fs driver's counters, only while the module
is loaded; ``mfu_gds_loaded`` says whether it is.
"""

from __future__ import annotations

from typing import Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from mfu_exporter.node.storage import MIB
from mfu_exporter.render.common import levelled
from mfu_exporter.sources.storage import StorageReading

# The lowest series level (sources.storage.series) at which each family is on. minimal: what the node rules read.
FAMILY_LEVELS = {
    "mfu_storage_read_bytes": "minimal",
    "mfu_storage_reads": "standard",
    "mfu_storage_read_seconds": "standard",
    "mfu_storage_job_mount_info": "minimal",
    "mfu_gds_loaded": "standard",
    "mfu_gds_io_stats_enabled": "standard",
    "mfu_gds_read_bytes": "standard",
    "mfu_gds_reads": "standard",
    "mfu_gds_read_errors": "standard",
    "mfu_gds_written_bytes": "standard",
    "mfu_gds_writes": "standard",
    "mfu_gds_write_errors": "standard",
    "mfu_gds_read_bandwidth_bytes_per_second": "full",
    "mfu_gds_read_latency_seconds": "full",
    "mfu_gds_write_bandwidth_bytes_per_second": "full",
    "mfu_gds_write_latency_seconds": "full",
    "mfu_gds_batches": "full",
    "mfu_gds_batch_errors": "full",
    "mfu_gds_gpu_registered_bytes": "full",
}
MOUNT_LABELS = ("mountpoint", "fstype", "device")


def storage_families(reading: StorageReading) -> Iterable[Metric]:
    return levelled(_families(reading), FAMILY_LEVELS, reading.series)


def _families(reading: StorageReading) -> Iterator[Metric]:
    read_bytes = CounterMetricFamily(
        "mfu_storage_read_bytes",
        "Bytes read from the storage behind a mount the node's jobs use: an NFS mount's bytes from the server, a "
        "Lustre mount's llite read_bytes, a block device's sectors read × 512 (every reader of the device).",
        labels=MOUNT_LABELS,
    )
    reads = CounterMetricFamily(
        "mfu_storage_reads",
        "Read operations on the mount: NFS READ calls, Lustre read calls, the block device's reads completed.",
        labels=MOUNT_LABELS,
    )
    seconds = CounterMetricFamily(
        "mfu_storage_read_seconds",
        "Seconds spent reading: NFS READ execution time, Lustre read time, the block device's time reading "
        "(÷ reads: the mean read latency).",
        labels=MOUNT_LABELS,
    )
    jobs = GaugeMetricFamily(
        "mfu_storage_job_mount_info",
        "1 for each job and mount holding its data (role data) or its checkpoints (role checkpoint).",
        labels=["training_job", "mountpoint", "role"],
    )
    for mount in reading.mounts:
        key = [mount.mount_point, mount.fstype, mount.device]
        if mount.read_bytes is not None:
            read_bytes.add_metric(key, mount.read_bytes)
        if mount.reads is not None:
            reads.add_metric(key, mount.reads)
        if mount.read_seconds is not None:
            seconds.add_metric(key, mount.read_seconds)
        for job, role in mount.jobs:
            jobs.add_metric([job, mount.mount_point, role], 1.0)
    yield from (family for family in (read_bytes, reads, seconds, jobs) if family.samples)
    yield from _gds_families(reading)


def _gds_families(reading: StorageReading) -> Iterator[Metric]:
    loaded = GaugeMetricFamily(
        "mfu_gds_loaded", "1 when the nvidia-fs (GPUDirect Storage) driver's statistics are readable, else 0."
    )
    stats = reading.gds
    loaded.add_metric([], 0.0 if stats is None else 1.0)
    yield loaded
    if stats is None:
        return
    enabled = GaugeMetricFamily(
        "mfu_gds_io_stats_enabled",
        "1 when nvidia-fs counts reads and writes (module parameter rw_stats_enabled=1); at 0 they stay unexported.",
    )
    enabled.add_metric([], 1.0 if stats.io_stats_enabled else 0.0)
    yield enabled
    for direction, name, past in ((stats.reads, "read", "read"), (stats.writes, "write", "written")):
        if direction.bytes is not None:
            family = CounterMetricFamily(
                f"mfu_gds_{past}_bytes", f"Bytes {past} through GPUDirect Storage (the driver counts whole MiB)."
            )
            family.add_metric([], direction.bytes)
            yield family
        if direction.operations is not None:
            family = CounterMetricFamily(f"mfu_gds_{name}s", f"GPUDirect Storage {name} operations.")
            family.add_metric([], direction.operations)
            yield family
        errors = CounterMetricFamily(
            f"mfu_gds_{name}_errors", f"GPUDirect Storage {name} errors (including I/O state errors)."
        )
        errors.add_metric([], direction.errors + direction.io_state_errors)
        yield errors
        if direction.bandwidth_mib_per_second is not None:
            family = GaugeMetricFamily(
                f"mfu_gds_{name}_bandwidth_bytes_per_second",
                f"The driver's own {name} bandwidth figure (its last measurement).",
            )
            family.add_metric([], direction.bandwidth_mib_per_second * MIB)
            yield family
        if direction.average_latency_us is not None:
            family = GaugeMetricFamily(
                f"mfu_gds_{name}_latency_seconds", f"The driver's average {name} latency (its last measurement)."
            )
            family.add_metric([], direction.average_latency_us / 1e6)
            yield family
    if stats.batches is not None:
        batches = CounterMetricFamily("mfu_gds_batches", "GPUDirect Storage batch I/O submissions.")
        batches.add_metric([], stats.batches)
        yield batches
        batch_errors = CounterMetricFamily("mfu_gds_batch_errors", "GPUDirect Storage batch I/O errors.")
        batch_errors.add_metric([], stats.batch_errors or 0)
        yield batch_errors
    registered = GaugeMetricFamily(
        "mfu_gds_gpu_registered_bytes",
        "GPU memory registered (BAR-pinned) for GPUDirect Storage, per GPU by PCI address.",
        labels=["pci_bus_id"],
    )
    for gpu in stats.gpus:
        registered.add_metric([gpu.pci_address], gpu.registered_mib * MIB)
    if registered.samples:
        yield registered
