"""Discovered jobs: what discovery found on this node, and the per-job hardware figures over a job's GPUs. No I/O."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from mfu_exporter.model.readings import GpuReading

FOUND_BY = ("reported", "config", "kubernetes", "slurm")


@dataclass(frozen=True)
class DiscoveredPod:
    """One pod (Kubernetes) or one Slurm job's presence on this node: what ``mfu_job_info`` carries for joins."""

    scheduler: str  # "kubernetes" or "slurm"
    namespace: str = ""
    pod: str = ""
    slurm_job_id: str = ""
    user: str = ""
    name_by: str = ""  # how the job name was found: label:<key>, pod_name_pattern, pod_name, job_id, squeue
    slurm_steps: str = ""  # the Slurm steps running on the job's GPUs here (from their processes' cgroups), "0,1"


@dataclass(frozen=True)
class DiscoveredJob:
    name: str
    scheduler: str
    gpus: tuple[int, ...]
    pods: tuple[DiscoveredPod, ...] = ()
    shared_gpus: tuple[int, ...] = ()  # GPUs that another discovered job holds too (time-slicing, MPS)

    def as_json(self) -> dict[str, Any]:
        return {
            "scheduler": self.scheduler,
            "gpus": list(self.gpus),
            "shared_gpus": list(self.shared_gpus),
            "pods": [{k: v for k, v in vars(p).items() if v} for p in self.pods],
        }


def merge_found(jobs: Iterable[DiscoveredJob], cap: int) -> tuple[dict[str, DiscoveredJob], int]:
    """One entry per job name (a Kubernetes job and a Slurm job of one name are one job: GPUs and pods united), the
    GPUs that two jobs hold marked shared on both, at most ``cap`` jobs (by name, so every cycle keeps the same ones).
    Returns the jobs and how many were left out by the cap."""
    merged: dict[str, DiscoveredJob] = {}
    for job in jobs:
        if (old := merged.get(job.name)) is not None:
            job = DiscoveredJob(
                job.name,
                old.scheduler if old.scheduler == job.scheduler else "mixed",
                tuple(sorted(set(old.gpus) | set(job.gpus))),
                old.pods + job.pods,
            )
        merged[job.name] = job
    holders: dict[int, int] = {}
    for job in merged.values():
        for gpu in job.gpus:
            holders[gpu] = holders.get(gpu, 0) + 1
    names = sorted(merged)
    kept = {}
    for name in names[:cap]:
        job = merged[name]
        shared = tuple(g for g in job.gpus if holders[g] > 1)
        kept[name] = DiscoveredJob(job.name, job.scheduler, job.gpus, job.pods, shared)
    return kept, max(len(names) - cap, 0)


@dataclass(frozen=True)
class HardwareFigures:
    """Means over a job's GPUs of what the GPU source reads: the figure and cause every job gets, reported or not."""

    gpu_utilization: float | None = None
    tensor_active: float | None = None
    hardware_flops_utilization: float | None = None
    gpus_read: int = 0
    reason: str | None = None

    def headline(self) -> float | None:
        """The hardware-side figure attribution follows when a job reports no MFU: GPM's FLOPs estimate, else
        tensor activity, else GPU utilization (what the GPUs have)."""
        for value in (self.hardware_flops_utilization, self.tensor_active, self.gpu_utilization):
            if value is not None:
                return value
        return None

    def as_json(self) -> dict[str, Any]:
        return {
            "gpu_utilization": self.gpu_utilization,
            "tensor_active": self.tensor_active,
            "hardware_flops_utilization": self.hardware_flops_utilization,
            "headline": self.headline(),
            "gpus_read": self.gpus_read,
            "reason": self.reason,
        }


def _mean(values: list[float | None]) -> float | None:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return None
    return min(max(sum(finite) / len(finite), 0.0), 1.0)


def hardware_figures(
    gpus: Iterable[int] | None, readings: Mapping[int, GpuReading] | None, shared: Iterable[int] = ()
) -> HardwareFigures:
    """The job's figures over its GPUs that are up and not shared with another job; with the reason when none is."""
    if readings is None:
        return HardwareFigures(reason="the GPU source is down or absent")
    if not gpus:
        return HardwareFigures(reason="the job's GPUs on this node are unknown")
    shared = set(shared)
    own = [i for i in gpus if i not in shared]
    if not own:
        return HardwareFigures(
            reason="every GPU of the job is shared with another job (time-slicing or MPS): "
            "device figures cannot be split between them"
        )
    rows = [readings[i] for i in own if i in readings and readings[i].up]
    if not rows:
        return HardwareFigures(reason="none of the job's GPUs is answering NVML")
    figures = HardwareFigures(
        _mean([r.utilization for r in rows]),
        _mean([r.tensor_active for r in rows]),
        _mean([r.hardware_flops_utilization for r in rows]),
        len(rows),
    )
    if figures.headline() is None:
        return HardwareFigures(gpus_read=len(rows), reason="the job's GPUs report no utilization (MIG mode?)")
    return figures
