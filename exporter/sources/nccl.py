"""The nccl source (``sources.nccl``): NCCL's own reports of the node's jobs, NCCL Inspector's dump files
(``inspector_paths``, followed by ``exporter.sources.inspector``).

It returns typed readings (``NcclSample``); ``exporter.render.collectives`` turns them into families.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Mapping

from exporter.config import NcclConfig
from exporter.node.nvml import NvmlSession
from exporter.sources.base import Snapshot, SourceContext
from exporter.sources.inspector import GpuIndexByUuid, InspectorFiles, InspectorReading, JobsByGpu


@dataclass(frozen=True)
class NcclSample:
    inspector: Mapping[str, InspectorReading] = field(default_factory=dict)  # job -> its collectives here


class NcclSource:
    name = "nccl"

    def __init__(
        self,
        section: NcclConfig,
        nvml_session: NvmlSession | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.interval = section.interval
        self.timeout = section.timeout
        self.inspector = InspectorFiles(section.inspector_paths, nvml_session, clock)

    @classmethod
    def from_config(cls, section: NcclConfig, ctx: SourceContext) -> NcclSource:
        """The ``exporter.sources.SOURCES`` factory: ``sources.nccl``, with ``ctx``'s NVML session for the GPUs of
        the processes that wrote Inspector's files."""
        return cls(section, nvml_session=ctx.nvml_session, clock=ctx.monotonic)

    def attach(self, jobs_by_gpu: JobsByGpu, gpu_by_uuid: GpuIndexByUuid) -> None:
        """Where a GPU's job (the job model) and a UUID's GPU index (the GPU source) come from."""
        self.inspector.attach(jobs_by_gpu, gpu_by_uuid)

    def sample(self) -> Snapshot:
        errors: Counter = Counter()
        readings, status = self.inspector.sample(errors)
        return Snapshot(readings=NcclSample(readings), errors=errors, status={"inspector": status})

    def close(self) -> None:
        self.inspector.close()
