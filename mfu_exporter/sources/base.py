"""The interface every source implements, and the snapshot it hands the daemon.

A source is sampled in its own worker thread by the scheduler (``mfu_exporter.scheduler``); a scrape never calls it.
``sample()`` may block or hang (NVML on a sick GPU does); the scheduler's timeout protects everything else.
"""

from __future__ import annotations

import functools
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol

import pynvml

from mfu_exporter.config import SERIES_LEVELS, Config, typed_config
from mfu_exporter.node.ethtool import StatsReader
from mfu_exporter.node.nic_qos import NicQos
from mfu_exporter.node.nvml import NvmlSession


class SourceUnavailable(Exception):
    """The source cannot sample on this machine right now (no NVML library, no RDMA devices...).

    ``reason`` becomes the ``reason`` label of ``mfu_exporter_source_errors_total`` and is shown on the status
    page; ``retry_after`` tells the scheduler to wait that long before trying again.
    """

    def __init__(self, reason: str, detail: str = "", retry_after: float | None = None):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail
        self.retry_after = retry_after


class Snapshot:
    """What one sample cycle produced.

    ``readings`` is the source's typed sample (a dataclass of its own: ``GpuSample``, ``RdmaSample``...), which
    ``mfu_exporter.render`` turns into metric families and the service hands the job model and the attribution; None
    for a source that exports nothing of its own. ``errors`` counts problems met during this cycle by reason (a
    missing counter file, one lost GPU) that did not fail the whole source; ``status`` is a JSON-able summary for
    the status page and APIs, for people, never read by code. ``feed`` is what the sample read that changes the
    job model (``mfu_exporter.model.feed``: a log's progress lines, its checkpoint saves), in the order read: the
    scheduler hands each snapshot's feed to the service once, which applies it on its tick, so a source's
    threads never write into the model.

    ``status`` may be given as a call that builds it from this sample's readings: it is then built when first read,
    at most once. A source samples every second and the status page asks every 2 s at most, usually never, so a
    source whose summary costs a fair part of its sample (ethtool's, per interface) builds it on demand. The call
    must read only what this sample made and nothing changes after it: it may run on another thread, during a
    later sample.
    """

    __slots__ = ("readings", "errors", "_status", "feed", "__weakref__")

    def __init__(
        self,
        readings: Any = None,
        errors: Counter | None = None,
        status: dict[str, Any] | Callable[[], dict[str, Any]] | None = None,
        feed: tuple = (),
    ):
        self.readings = readings
        self.errors = Counter() if errors is None else errors
        self._status = {} if status is None else status
        self.feed = feed

    @property
    def status(self) -> dict[str, Any]:
        status = self._status
        if callable(status):
            status = self._status = status()  # two threads may both build it: the same summary either way
        return status

    def __repr__(self) -> str:
        return f"Snapshot(readings={self.readings!r}, errors={self.errors!r})"


class Source(Protocol):
    """A source samples in its worker thread, every ``interval`` seconds. Two methods are optional: ``bind(reads)``
    for a source that reads the job model (``ModelReads``), and ``take_feed()`` for one whose own thread reads
    between samples (the logs): the service's tick takes that feed, on the event loop, as it is read."""

    name: str
    interval: float
    timeout: float

    def sample(self) -> Snapshot:
        """Take one sample (blocking). Raise SourceUnavailable when the source cannot work here."""

    def close(self) -> None:
        """Release handles; called once at shutdown from the source's worker thread."""


@dataclass(frozen=True)
class ModelReads:
    """What a source may read of the service's job model, given to every source with a ``bind(reads)`` method once
    the service has built the model (``mfu_exporter.service.build_service``). A source reads through these calls
    from its own threads and changes the model only through its snapshot's ``feed``.

    ``jobs_by_gpu``: each GPU index of this node with the job holding it. ``gpu_index_by_uuid``: each GPU's index by
    UUID (the GPU source's inventory). ``gpu_count(job)``: the GPUs the job's MFU counts on this node.
    ``is_discovered(job)``: whether the model holds the job as discovery found it. ``job_names``: the jobs known.
    ``discovered_pods``: ``{job: [(namespace, pod)]}`` of the Kubernetes pods discovery found holding GPUs.
    """

    jobs_by_gpu: Callable[[], dict[int, str]] = dict
    gpu_index_by_uuid: Callable[[], dict[str, int]] = dict
    gpu_count: Callable[[str], int | None] = lambda job: None
    is_discovered: Callable[[str], bool] = lambda job: False
    job_names: Callable[[], list[str]] = list
    discovered_pods: Callable[[], dict[str, list[tuple[str, str]]]] = dict


_LEVEL_RANK = {level: rank for rank, level in enumerate(SERIES_LEVELS)}


def exports(level: str, family_level: str) -> bool:
    """Whether a source set to ``series: level`` exports a family tagged ``family_level`` (the lowest level it is on)."""
    return _LEVEL_RANK[family_level] <= _LEVEL_RANK[level]


@dataclass
class Paths:
    sysfs: str = "/sys"
    procfs: str = "/proc"


@dataclass(frozen=True)
class SourceContext:
    """Everything a source's factory gets besides its own config section.

    Every factory has one signature, ``factory(section, ctx)``. Production, the demo, the benchmarks and the tests
    build their sources through the same ``mfu_exporter.sources.build_sources`` and differ only in the context: where
    the kernel's trees are, which NVML module, ethtool reader and NIC QoS reader stand behind the hardware, and
    which clocks the sources keep time with. ``config`` is the whole validated config, for what one section needs
    of another (the ethtool source reads the RDMA device lists, the logs source the ``jobs`` facts); ``settings``
    is the same config typed (``mfu_exporter.config.Config``).
    """

    config: dict
    paths: Paths = field(default_factory=Paths)
    nvml: Any = pynvml  # importing pynvml needs no driver; nvmlInit finds out
    ethtool_reader: StatsReader | None = None  # None: the ethtool stats ioctl
    nic_qos: NicQos | None = None  # None: the kernel's dcbnl and the ethtool pause ioctl
    wall: Callable[[], float] = time.time  # timestamps: checkpoint writes, log lines
    monotonic: Callable[[], float] = time.monotonic  # rates and retry timers
    environ: Mapping[str, str] | None = None  # where discovery looks for the in-cluster API server; None: os.environ

    @functools.cached_property
    def settings(self) -> Config:
        return typed_config(self.config)

    @functools.cached_property
    def nvml_session(self) -> NvmlSession:
        """The one NVML session of the sources built on this context: the GPU source, discovery and preflight
        borrow it, so NVML's reference count never keeps a re-initialisation from enumerating the GPUs anew."""
        return NvmlSession(self.nvml)
