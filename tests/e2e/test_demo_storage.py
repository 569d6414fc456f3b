"""The demo's storage plane end to end (``mfu-exporter demo``, a real process): the dataset mount's reads and
GPUDirect Storage's advance while the job trains, and a crash's restart restores its checkpoint at the simulated
NVMe's read rate, measured from the ledger's load and the checkpoint mount's counters."""

import pytest

from mfu_exporter.sim.node import RESTORE_SECONDS
from mfu_exporter.sim.storage import DATASET_DEVICE, DATASET_MOUNT, RESTORE_READ_RATE
from tests.support.demo_harness import metric_samples, running_demo
from tests.support.wait import wait_until

JOB = (("training_job", "llama3-70b"),)
DATASET = (("device", DATASET_DEVICE), ("fstype", "nfs4"), ("mountpoint", DATASET_MOUNT))


def test_dataset_reads_gds_and_a_restore_in_the_demo():
    with running_demo("--incident", "crash-restart", speed=20) as base:
        wait_until(lambda: ("mfu_gds_reads_total", ()) in metric_samples(base), 30, "the storage source's sample")
        first = metric_samples(base)
        assert first[("mfu_gds_loaded", ())] == 1 and first[("mfu_gds_io_stats_enabled", ())] == 1
        mount = (("mountpoint", DATASET_MOUNT), ("role", "data"), *JOB)
        assert first[("mfu_storage_job_mount_info", tuple(sorted(mount)))] == 1
        wait_until(
            lambda: (
                metric_samples(base).get(("mfu_storage_read_bytes_total", DATASET), 0)
                > first.get(("mfu_storage_read_bytes_total", DATASET), 0)
            ),
            30,
            "the dataset mount's reads to advance",
        )
        wait_until(
            lambda: metric_samples(base)[("mfu_gds_reads_total", ())] > first[("mfu_gds_reads_total", ())],
            30,
            "GDS reads to advance",
        )
        wait_until(lambda: metric_samples(base).get(("mfu_checkpoint_loads_total", JOB), 0) >= 1, 60, "a restore")
        values = metric_samples(base)
        # 15 s of demo time; a loaded machine stretches it (the simulation's ticks run late), never shortens it.
        duration = values[("mfu_checkpoint_last_load_duration_seconds", JOB)]
        assert duration >= RESTORE_SECONDS - 1
        # The NVMe reads at the restore rate for the load's 15 s of demo time, and nothing else reads it: the bytes
        # counted are those, however late the load ends, which only lowers the rate.
        bandwidth = values[("mfu_checkpoint_last_load_read_bandwidth_bytes_per_second", JOB)]
        assert bandwidth * duration == pytest.approx(RESTORE_READ_RATE * RESTORE_SECONDS, rel=0.01)
        assert bandwidth <= RESTORE_READ_RATE * RESTORE_SECONDS / (RESTORE_SECONDS - 1)
