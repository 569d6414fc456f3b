"""A source's snapshot to metric families: its typed readings go to the renderer of their type.

Every source's sample type has one renderer here (readings in, families out); a snapshot without readings (the logs
source's before it is attached) exports nothing of its own. A service holds its own table of renderers
(``renderers``), so what a renderer keeps between samples (the GPU renderer's label tuples) is that service's. A
readings type defined outside ``mfu_exporter.sources`` (a test's source) renders itself: its ``families()`` method.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

from prometheus_client.metrics_core import Metric

from mfu_exporter.render.checkpoint import checkpoint_sample_families
from mfu_exporter.render.collectives import log_families, nccl_families
from mfu_exporter.render.discovery import discovery_families
from mfu_exporter.render.ethtool import ethtool_families
from mfu_exporter.render.gpu import GpuRenderer
from mfu_exporter.render.preflight import preflight_families
from mfu_exporter.render.rdma import rdma_families
from mfu_exporter.render.storage import storage_families
from mfu_exporter.sources.base import Snapshot
from mfu_exporter.sources.checkpoint import CheckpointSample
from mfu_exporter.sources.discovery import DiscoverySample
from mfu_exporter.sources.ethtool import EthtoolSample
from mfu_exporter.sources.gpu import GpuSample
from mfu_exporter.sources.logs import LogsSample
from mfu_exporter.sources.nccl import NcclSample
from mfu_exporter.sources.preflight import PreflightSample
from mfu_exporter.sources.rdma import RdmaSample
from mfu_exporter.sources.storage import StorageReading

Renderer = Callable[[Any], Iterable[Metric]]


def renderers() -> dict[type, Renderer]:
    """A fresh table of each readings type's renderer, for one service."""
    return {
        GpuSample: GpuRenderer().families,
        RdmaSample: rdma_families,
        EthtoolSample: ethtool_families,
        CheckpointSample: checkpoint_sample_families,
        PreflightSample: preflight_families,
        DiscoverySample: discovery_families,
        StorageReading: storage_families,
        LogsSample: log_families,
        NcclSample: nccl_families,
    }


def snapshot_families(snapshot: Snapshot, table: Mapping[type, Renderer] | None = None) -> Iterable[Metric]:
    """Fresh metric families of a snapshot's readings, by ``table``'s renderers (a fresh table's without it)."""
    readings = snapshot.readings
    if readings is None:
        return ()
    renderer = (renderers() if table is None else table).get(type(readings))
    if renderer is None:
        return readings.families()  # a readings type defined outside mfu_exporter.sources renders itself
    return renderer(readings)
