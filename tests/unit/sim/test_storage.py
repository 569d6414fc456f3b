"""The demo's storage (mfu_exporter.sim.storage): its files parse as the storage source reads them, the dataset mount's
counters and nvidia-fs's advance as the demo job trains, and the read-rate knob flattens them."""

from __future__ import annotations

from mfu_exporter.config import typed_config
from mfu_exporter.sim.node import JOB, DemoNode, Schedule, SimClock, demo_config
from mfu_exporter.sim.storage import DATASET_MOUNT
from mfu_exporter.sources import SOURCES


def storage_of(node: DemoNode):
    config = demo_config(None, node)
    assert typed_config(config).jobs[JOB].data_paths == (f"{DATASET_MOUNT}/{JOB}",)
    return SOURCES["storage"](typed_config(config).sources.storage, node.context(config))


def test_the_demo_loader_reads_the_dataset_mount_and_gds_as_it_trains(tmp_path):
    monotonic = [0.0]
    clock = SimClock(1.0, wall=lambda: 1_800_000_000.0, monotonic=lambda: monotonic[0])
    node = DemoNode(tmp_path, clock, Schedule())
    storage = storage_of(node)

    def step(seconds: float):
        monotonic[0] += seconds
        node.tick()
        reading = storage.sample().readings
        mounts = {m.mount_point: m for m in reading.mounts}
        return mounts[DATASET_MOUNT], mounts["/"], reading.gds

    node.tick()
    dataset, root, gds = step(0.0)
    assert (dataset.fstype, dataset.counters, dataset.jobs) == ("nfs4", "mountstats", ((JOB, "data"),))
    assert (root.counters, root.jobs) == ("diskstats", ((JOB, "checkpoint"),))  # the checkpoint watch's mount
    assert gds is not None and gds.io_stats_enabled and len(gds.gpus) == 4
    before, gds_before = dataset.read_bytes, gds.reads.operations
    dataset, _, gds = step(10.0)
    assert dataset.read_bytes - before > 10 * 1e9  # ~2 GB/s at the healthy pace
    assert dataset.reads > 0 and dataset.read_seconds > 0
    assert gds.reads.operations > gds_before and gds.reads.bytes > 0
    # The knob: a starved loader reads (almost) nothing; the mount's counters flatten.
    node.storage.dataset_read_rate = 0.0
    flat, _, _ = step(10.0)
    again, _, _ = step(10.0)
    assert again.read_bytes == flat.read_bytes and again.read_bytes_per_second == 0.0


def test_the_attribution_sees_the_jobs_data_mounts_through_the_service(tmp_path):
    """NodeSignals.mounts: the storage source's mounts with their jobs and read rate, for the input evidence."""
    import asyncio

    from mfu_exporter.service import build_service

    monotonic = [0.0]
    clock = SimClock(1.0, wall=lambda: 1_800_000_000.0, monotonic=lambda: monotonic[0])
    node = DemoNode(tmp_path, clock, Schedule())
    config = demo_config(None, node)
    storage = SOURCES["storage"](typed_config(config).sources.storage, node.context(config))
    service = build_service(config, [storage], clock=clock.time, monotonic=clock.monotonic)

    async def sample_twice():
        await service.scheduler.start()
        try:
            for _ in range(2):
                cycles = service.scheduler.states["storage"].cycles
                monotonic[0] += 5.0
                node.tick()
                while service.scheduler.states["storage"].cycles == cycles:
                    await asyncio.sleep(0.01)
        finally:
            await service.scheduler.stop()

    storage.interval = 0.05
    asyncio.run(sample_twice())
    (mount,) = [m for m in service.node_signals().mounts if (JOB, "data") in m.jobs]
    assert (mount.mount_point, mount.fstype) == (DATASET_MOUNT, "nfs4")
