"""Each job's collectives as families: the NCCL transport its log shows, NCCL Inspector's bus bandwidth and
execution time by collective and message-size class, and whether a slow rank is named (docs/metrics.md).

Reads the logs source's ``LogsSample`` and the nccl source's ``NcclSample``: each snapshot's own families through
render/snapshots.py (``log_families``: the transport; ``nccl_families``: Inspector's summaries), what joins two
sources once per render (``collective_families``, a part the service adds: the socket fallback needs the RDMA
ports, the straggler comes from either source). Job-level series only, a handful per job and
collective, never per communicator, rank or host."""

from __future__ import annotations

import re
from typing import Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from mfu_exporter.render.nccl import nccl_test_families
from mfu_exporter.sources.inspector import InspectorReading
from mfu_exporter.sources.logs import LogCollectives, LogsSample
from mfu_exporter.sources.nccl import NcclSample

MAX_COLLECTIVES = 8  # kinds of collective per job: NCCL has seven; a stranger name past them is left out
COLLECTIVE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9]{0,31}\Z")


def nccl_families(sample: NcclSample) -> Iterator[Metric]:
    """The nccl source's snapshot: NCCL Inspector's summaries of each job, and the node's last verification."""
    yield from inspector_families(sample.inspector)
    if sample.test is not None:
        yield from nccl_test_families(sample.test)


def log_families(sample: LogsSample) -> Iterator[Metric]:
    """The logs source's snapshot: the transport each job's NCCL uses, as its log shows it."""
    transport = GaugeMetricFamily(
        "mfu_job_nccl_transport_info",
        "1 for the transport NCCL uses between nodes as the job's log shows it (ib, roce, socket, ofi, mixed), and "
        "whether GPUDirect RDMA is on (true, false, unknown).",
        labels=["training_job", "transport", "gdr"],
    )
    for job, found in sorted(sample.collectives.items()):
        if found.transport is not None and found.transport.transport is not None:
            gdr = "unknown" if found.transport.gdr is None else str(found.transport.gdr).lower()
            transport.add_metric([job, found.transport.transport, gdr], 1.0)
    if transport.samples:
        yield transport


def inspector_families(inspector: Mapping[str, InspectorReading]) -> Iterator[Metric]:
    """Bus bandwidth, execution time, counts and time by job, collective and message-size class."""
    bandwidth = GaugeMetricFamily(
        "mfu_job_nccl_bus_bandwidth_bytes_per_second",
        "NCCL Inspector's bus bandwidth of the job's recent collectives on this node (geometric mean), by collective "
        "and message-size class (small < 1 MiB, medium < 128 MiB, large).",
        labels=["training_job", "collective", "size_class"],
    )
    exec_time = GaugeMetricFamily(
        "mfu_job_nccl_collective_duration_seconds",
        "Mean execution time of the job's recent collectives on this node (NCCL Inspector), by collective and "
        "message-size class.",
        labels=["training_job", "collective", "size_class"],
    )
    count = CounterMetricFamily(
        "mfu_job_nccl_collectives",
        "Collectives of the job's ranks on this node that NCCL Inspector recorded (JSON mode), by collective and "
        "message-size class.",
        labels=["training_job", "collective", "size_class"],
    )
    seconds = CounterMetricFamily(
        "mfu_job_nccl_collective_seconds",
        "Time the job's ranks on this node spent in those collectives (NCCL Inspector, JSON mode).",
        labels=["training_job", "collective", "size_class"],
    )
    for job, reading in sorted(inspector.items()):
        kinds: set[str] = set()
        for summary in reading.summaries:
            if not COLLECTIVE_NAME.match(summary.collective):
                continue
            if summary.collective not in kinds and len(kinds) >= MAX_COLLECTIVES:
                continue
            kinds.add(summary.collective)
            labels = [job, summary.collective, summary.size_class]
            if summary.busbw_bytes_per_second is not None:
                bandwidth.add_metric(labels, summary.busbw_bytes_per_second)
            if summary.exec_time_seconds is not None:
                exec_time.add_metric(labels, summary.exec_time_seconds)
            if summary.count:
                count.add_metric(labels, summary.count)
                seconds.add_metric(labels, summary.exec_seconds)
    yield from (f for f in (bandwidth, exec_time, count, seconds) if f.samples)


def collective_families(
    logs: Mapping[str, LogCollectives], inspector: Mapping[str, InspectorReading], rdma_active: bool
) -> Iterator[Metric]:
    """What needs two sources: whether sockets are a fallback (the logs source's transport, the RDMA source's
    ports: ``rdma_active``, an RDMA port is up here), the straggler the log or Inspector names."""
    fallback = GaugeMetricFamily(
        "mfu_job_nccl_socket_fallback",
        "1 when the job's NCCL carries inter-node traffic over TCP sockets on a node with an active RDMA port.",
        labels=["training_job"],
    )
    straggler = GaugeMetricFamily(
        "mfu_job_straggler",
        "1 when a slow rank of the job is named, by source (megatron, nvidia_resiliency_ext, composer, flagscale, "
        "inspector); the job's JSON (/api/v1/jobs bottleneck) names the rank, GPU and node.",
        labels=["training_job", "source"],
    )
    for job, found in sorted(logs.items()):
        if found.transport is not None and found.transport.transport is not None:
            fallback.add_metric([job], 1.0 if found.transport.fell_back_to_socket and rdma_active else 0.0)
        if found.straggler is not None:
            straggler.add_metric([job, found.straggler.source.replace("-", "_")], 1.0)
    for job, reading in sorted(inspector.items()):
        if reading.straggler is not None:
            straggler.add_metric([job, "inspector"], 1.0)
    # A family with no series is left out: a node whose jobs print no NCCL lines and run no Inspector adds nothing.
    yield from (f for f in (fallback, straggler) if f.samples)
