"""The nccl source (``sources.nccl``): NCCL's own reports of the node's jobs, NCCL Inspector's dump files
(``inspector_paths``, followed by ``mfu_exporter.sources.inspector``), and the node's last NCCL verification
(``tests_paths``, judged by ``mfu_exporter.sources.nccl_tests``).

It returns typed readings (``NcclSample``); ``mfu_exporter.render.collectives`` and ``mfu_exporter.render.nccl`` turn them
into families.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Mapping

from mfu_exporter.config import NcclConfig
from mfu_exporter.node.nvml import NvmlSession
from mfu_exporter.node.rdma import RdmaPort
from mfu_exporter.sources.base import ModelReads, Snapshot, SourceContext
from mfu_exporter.sources.inspector import GpuIndexByUuid, InspectorFiles, InspectorReading, JobsByGpu
from mfu_exporter.sources.nccl_tests import NcclTestReading, NcclTests, fabric_ports


@dataclass(frozen=True)
class NcclSample:
    inspector: Mapping[str, InspectorReading] = field(default_factory=dict)  # job -> its collectives here
    test: NcclTestReading | None = None  # the node's last verification (None: no tests_paths configured)


class NcclSource:
    name = "nccl"

    def __init__(
        self,
        section: NcclConfig,
        nvml_session: NvmlSession | None = None,
        clock: Callable[[], float] = time.monotonic,
        ports: Callable[[], list[RdmaPort]] = list,
    ):
        """``ports``: the node's RDMA ports, read on each new verification file for its expected figure."""
        self.interval = section.interval
        self.timeout = section.timeout
        self.inspector = InspectorFiles(section.inspector_paths, nvml_session, clock)
        self.tests = NcclTests(section, ports)

    @classmethod
    def from_config(cls, section: NcclConfig, ctx: SourceContext) -> NcclSource:
        """The ``mfu_exporter.sources.SOURCES`` factory: ``sources.nccl``, with ``ctx``'s NVML session for the GPUs of
        the processes that wrote Inspector's files, and its sysfs's RDMA ports for the verification's expected figure."""
        return cls(section, nvml_session=ctx.nvml_session, clock=ctx.monotonic, ports=fabric_ports(ctx))

    def bind(self, model: ModelReads) -> None:
        """Inspector's files go to the job holding the GPU that wrote them."""
        self.attach(model.jobs_by_gpu, model.gpu_index_by_uuid)

    def attach(self, jobs_by_gpu: JobsByGpu, gpu_by_uuid: GpuIndexByUuid) -> None:
        """Where a GPU's job (the job model) and a UUID's GPU index (the GPU source) come from."""
        self.inspector.attach(jobs_by_gpu, gpu_by_uuid)

    def sample(self) -> Snapshot:
        errors: Counter = Counter()
        readings, status = self.inspector.sample(errors)
        test, test_status = self.tests.sample(errors)
        return Snapshot(
            readings=NcclSample(readings, test), errors=errors, status={"inspector": status, "test": test_status}
        )

    def close(self) -> None:
        self.inspector.close()
