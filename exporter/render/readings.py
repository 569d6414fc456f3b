"""A source snapshot's families: the ones its own ``render`` gives, then those of the typed readings it carries.

New sources hand typed readings (``Snapshot.data``) and no families; the renderers here turn them into families, so
``prometheus_client`` stays in ``render/``. Both the collector and the encoder's per-snapshot cache go through here.
"""

from __future__ import annotations

from typing import Iterator

from prometheus_client.metrics_core import Metric

from exporter.render import nccl, storage
from exporter.sources.base import Snapshot


def snapshot_families(snapshot: Snapshot) -> Iterator[Metric]:
    yield from snapshot.render()
    yield from storage.snapshot_families(snapshot.data)
    yield from nccl.snapshot_families(snapshot.data)
