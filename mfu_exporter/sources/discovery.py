"""Discovery source: every job holding GPUs on this node, from the kubelet's pod-resources API and from Slurm.

One sample lists the kubelet's pods (one gRPC call), reads the Slurm mapping directory and the GPU processes'
cgroups, and names each job; the result (``DiscoverySample.jobs``) is what the job model merges with reporting jobs. API-
server lookups and Slurm name lookups run on background threads: a pod whose lookup is still in flight is held back
for at most the lookup's timeout, then named by the pod-name pattern, so a slow API server never holds a sample.

What the pod-resources answer cannot say, and what this source does about it:

- pods without a GPU limit never appear (the kubelet lists allocated devices only): such GPU use is unattributed;
  the Slurm process path is the one that sees processes, not allocations.
- pods that have finished may still be listed (kubernetes/kubernetes #119423): with the API server, a pod whose
  phase is Succeeded or Failed is dropped; without it, the pod counts until the kubelet stops listing it.
"""

from __future__ import annotations

import glob
import logging
import os
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

from mfu_exporter.config import DiscoveryConfig, Enabled
from mfu_exporter.jobname import compile_pod_name_pattern, sanitize_job_name
from mfu_exporter.model.discovery import (
    NodeGpu,
    is_gpu_resource,
    job_name_for_pod,
    match_device,
    sanitize_label_value,
)
from mfu_exporter.model.discovery_jobs import DiscoveredJob, DiscoveredPod, merge_found
from mfu_exporter.node import kubeapi, slurm
from mfu_exporter.node.nvml import NvmlSession
from mfu_exporter.node.podresources import DEFAULT_SOCKET, PodResourcesClient, PodResourcesError
from mfu_exporter.sources.base import Snapshot, SourceContext, SourceUnavailable

log = logging.getLogger(__name__)

MAX_LISTED = 20  # unsupported devices and held-back pods shown in the status, per kind
NAME_HOLD_TIMEOUTS = 2.0  # a Slurm job waits for its name at most this many name_timeouts


def _node_gpus(nvml: Any) -> tuple[list[NodeGpu], Counter]:
    """This node's GPUs with UUIDs and minor numbers, from NVML (initialised by the caller), and the errors of those
    that did not answer. A GPU that fell off the bus keeps its NVML index and fails alone: the others are still
    listed (their device IDs still match their jobs)."""
    gpus, errors = [], Counter()
    for index in range(nvml.nvmlDeviceGetCount()):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = nvml.nvmlDeviceGetUUID(handle)
        except nvml.NVMLError as error:
            errors[f"nvml_gpu_{type(error).__name__}"] += 1
            continue
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        try:
            minor = int(nvml.nvmlDeviceGetMinorNumber(handle))
        except Exception:  # noqa: BLE001 - older fakes and drivers lack it; nvidiaN IDs then stay unmatched
            minor = None
        gpus.append(NodeGpu(index, uuid, minor))
    return gpus, errors


@dataclass(frozen=True)
class DiscoverySample:
    """The jobs holding GPUs on this node, by name: what the job model merges and ``mfu_exporter.render.discovery``
    counts."""

    jobs: dict[str, DiscoveredJob]


class DiscoverySource:
    name = "discovery"

    def __init__(
        self,
        section: DiscoveryConfig,
        procfs: str = "/proc",
        sysfs: str = "/sys",
        nvml: Any = None,
        environ: dict[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        nvml_session: NvmlSession | None = None,
    ):
        self.interval = section.interval
        self.timeout = section.timeout
        self.max_jobs = section.max_jobs
        self._clock = clock
        self._nvml = nvml
        # Borrowed from the process's one NVML session (mfu_exporter.node.nvml), held from the first answer until close:
        # never an nvmlInit of its own, so the GPU source's re-initialisation enumerates the GPUs anew.
        self._session = nvml_session or (NvmlSession(nvml) if nvml is not None else None)
        self._nvml_held = False
        self._gpus: list[NodeGpu] = []
        self._gpus_at = float("-inf")
        k8s, sl = section.kubernetes, section.slurm
        self.k8s_enabled = k8s.enabled
        self.client = PodResourcesClient(
            k8s.socket or DEFAULT_SOCKET, timeout=k8s.timeout, max_message_bytes=k8s.max_message_bytes
        )
        self.label_keys = tuple(k8s.label_keys)
        self.pattern = compile_pod_name_pattern(k8s.pod_name_pattern)
        self.lookup: kubeapi.PodLookup | None = None
        self.lookup_note = "off (discovery.kubernetes.api_server.enabled is false)"
        api = k8s.api_server
        if api.enabled is not Enabled.FALSE:
            url = api.url or kubeapi.in_cluster_url(environ)
            if url:
                self.lookup = kubeapi.PodLookup(
                    url,
                    api.token_path,
                    api.ca_path or None,
                    timeout=api.timeout,
                    retry_after=api.retry_after,
                )
                self.lookup_note = f"pod labels from {url}"
            else:
                self.lookup_note = (
                    "no API server (not in a cluster and discovery.kubernetes.api_server.url unset): "
                    "jobs named by the pod-name pattern"
                )
        self._pending_since: dict[tuple[str, str], float] = {}
        self._allocatable_at = float("-inf")
        self._allocatable_summary: dict | None = None
        self.slurm_enabled = sl.enabled
        self.mapping = slurm.MappingDir(sl.job_mapping_dir) if sl.job_mapping_dir else None
        self.processes_enabled = sl.processes
        self.procfs = procfs
        self.cgroup_root = sl.cgroup_root or os.path.join(sysfs, "fs", "cgroup")
        self.resolver = slurm.ProcessJobs(procfs, self.cgroup_root)
        self.names = slurm.JobNames(sl.name_command, timeout=sl.name_timeout) if sl.name_command else None
        self._name_pending_since: dict[str, float] = {}

    @classmethod
    def from_config(cls, section: DiscoveryConfig, ctx: SourceContext) -> DiscoverySource:
        """The ``mfu_exporter.sources.SOURCES`` factory: the top-level ``discovery`` section over ``ctx``'s procfs (the
        processes holding GPUs), sysfs (the cgroup tree) and NVML module (the GPUs to match)."""
        environ = dict(ctx.environ) if ctx.environ is not None else None
        return cls(
            section,
            ctx.paths.procfs,
            ctx.paths.sysfs,
            ctx.nvml,
            environ=environ,
            clock=ctx.monotonic,
            nvml_session=ctx.nvml_session,
        )

    # --- GPUs -------------------------------------------------------------------------------------------------

    def _inventory(self, errors: Counter) -> list[NodeGpu]:
        if self._session is None:
            return []
        now = self._clock()
        if now - self._gpus_at < 60.0 and self._gpus:
            return self._gpus
        with self._session.lock:  # the GPU source's re-initialisation waits for this read
            try:
                if not self._nvml_held:
                    self._session.acquire()  # a failure takes no reference: the next cycle tries again
                    self._nvml_held = True
                self._gpus, failed = _node_gpus(self._nvml)
                errors.update(failed)
                self._gpus_at = now
            except Exception as error:  # noqa: BLE001 - no driver, or NVML failing: device IDs stay unmatched
                errors[f"nvml_{type(error).__name__}"] += 1
        return self._gpus

    # --- Kubernetes -------------------------------------------------------------------------------------------

    def _kubernetes(self, gpus: list[NodeGpu], status: dict, errors: Counter) -> list[DiscoveredJob]:
        if self.k8s_enabled is Enabled.FALSE:
            status["kubernetes"] = {"active": False, "why": "off (discovery.kubernetes.enabled is false)"}
            return []
        if self.k8s_enabled is Enabled.AUTO and not self.client.socket_exists():
            status["kubernetes"] = {
                "active": False,
                "why": f"no pod-resources socket at {self.client.socket} (auto: used once it appears)",
            }
            return []
        try:
            pods = self.client.list()
        except PodResourcesError as error:
            errors[f"kubernetes_{error.reason}"] += 1
            status["kubernetes"] = {"active": False, "why": str(error)}
            if self.k8s_enabled is Enabled.TRUE or not self._slurm_possible():
                raise SourceUnavailable(f"kubernetes_{error.reason}", error.detail) from None
            return []
        now = self._clock()
        unsupported: dict[str, str] = {}
        held: list[str] = []
        finished = 0
        found: list[DiscoveredJob] = []
        listed: set[tuple[str, str]] = set()
        for pod in pods:
            indices: set[int] = set()
            for _container, resource, device_id in pod.device_ids():
                if not is_gpu_resource(resource):
                    continue
                match = match_device(device_id, resource, gpus)
                if match.gpu is None:
                    errors["kubernetes_device_unmatched"] += 1
                    if len(unsupported) < MAX_LISTED:
                        unsupported[f"{pod.namespace}/{pod.name}: {sanitize_label_value(device_id, 80)}"] = (
                            match.unsupported
                        )
                    continue
                indices.add(match.gpu)
            if not indices:
                continue
            key = (pod.namespace, pod.name)
            listed.add(key)
            labels = None
            if self.lookup is not None:
                meta = self.lookup.lookup(*key)
                if meta is kubeapi.PENDING:
                    since = self._pending_since.setdefault(key, now)
                    if now - since <= self.lookup.timeout + 1.0:
                        if len(held) < MAX_LISTED:
                            held.append(f"{pod.namespace}/{pod.name}")
                        continue  # named once its labels are in, so the job has one name from the start
                elif isinstance(meta, kubeapi.PodMeta):
                    if meta.finished:
                        finished += 1
                        continue
                    labels = meta.labels
                else:
                    errors[f"kubernetes_api_{meta.reason}"] += 1
            self._pending_since.pop(key, None)
            name = job_name_for_pod(pod.name, labels, self.label_keys, self.pattern)
            found.append(
                DiscoveredJob(
                    name.name,
                    "kubernetes",
                    tuple(sorted(indices)),
                    (
                        DiscoveredPod(
                            "kubernetes",
                            sanitize_label_value(pod.namespace),
                            sanitize_label_value(pod.name),
                            name_by=name.by,
                        ),
                    ),
                )
            )
        if self.lookup is not None:
            self.lookup.forget(listed)
        self._pending_since = {k: v for k, v in self._pending_since.items() if k in listed}
        status["kubernetes"] = {
            "active": True,
            "socket": self.client.socket,
            "pods_listed": len(pods),
            "pods_with_gpus": len(listed),
            "finished_pods_dropped": finished,
            "names": self.lookup_note,
            "lookups_pending": held,
            "last_lookup_failure": (
                vars(self.lookup.last_failure) if self.lookup and self.lookup.last_failure else None
            ),
            "unsupported_devices": unsupported,
            "allocatable_supported": self.client.allocatable_supported,
            "allocatable_gpus": self._allocatable(gpus, now, errors),
        }
        return found

    def _allocatable(self, gpus: list[NodeGpu], now: float, errors: Counter) -> dict | None:
        """What the kubelet can allocate, once a minute (GetAllocatableResources, Kubernetes 1.21+; None where it
        lacks the call): GPU devices it offers that match no GPU here are a sign the device IDs cannot be matched."""
        if now - self._allocatable_at >= 60.0 and self.client.allocatable_supported is not False:
            self._allocatable_at = now
            try:
                devices = self.client.allocatable()
            except PodResourcesError as error:
                errors[f"kubernetes_allocatable_{error.reason}"] += 1
                devices = None
            if devices is not None:
                ids = [(d.resource_name, i) for d in devices if is_gpu_resource(d.resource_name) for i in d.device_ids]
                matched = sum(1 for resource, i in ids if match_device(i, resource, gpus).gpu is not None)
                self._allocatable_summary = {"devices": len(ids), "matched": matched}
        return self._allocatable_summary

    # --- Slurm ------------------------------------------------------------------------------------------------

    def _slurm_possible(self) -> bool:
        if self.slurm_enabled is Enabled.FALSE:
            return False
        if self.slurm_enabled is Enabled.TRUE:
            return True
        return bool(self.mapping and os.path.isdir(self.mapping.path)) or self._slurm_cgroups_present()

    def _slurm_cgroups_present(self) -> bool:
        root = self.cgroup_root
        return bool(
            glob.glob(os.path.join(root, "*", "*slurmstepd.scope"))
            or glob.glob(os.path.join(root, "*", "slurm"))
            or glob.glob(os.path.join(root, "*", "slurm_*"))
        )

    def _slurm(self, gpus: list[NodeGpu], status: dict, errors: Counter) -> list[DiscoveredJob]:
        if not self._slurm_possible():
            why = (
                "off (discovery.slurm.enabled is false)"
                if self.slurm_enabled is Enabled.FALSE
                else "no Slurm here (auto: no job_mapping_dir and no slurmstepd cgroups)"
            )
            status["slurm"] = {"active": False, "why": why}
            return []
        per_gpu: dict[int, set[str]] = {}
        info: dict[str, dict] = {}
        detail: dict[str, Any] = {"active": True}
        if self.mapping is not None:
            read = self.mapping.read()
            errors.update({f"slurm_{k}": v for k, v in read.errors.items()})
            for gpu, jobs in read.gpus.items():
                per_gpu.setdefault(gpu, set()).update(jobs)
            detail["job_mapping_dir"] = {
                "path": self.mapping.path,
                "gpus": len(read.gpus),
                "unsupported": dict(list(read.unsupported.items())[:MAX_LISTED]),
            }
        if self.processes_enabled:
            detail["processes"] = self._processes(gpus, per_gpu, info, errors)
        found = []
        names_seen = set()
        held: list[str] = []
        now = self._clock()
        indices = {g.index for g in gpus}
        for job_id in sorted({j for jobs in per_gpu.values() for j in jobs}):
            job_gpus = tuple(
                sorted(g for g, jobs in per_gpu.items() if job_id in jobs and (not indices or g in indices))
            )
            if not job_gpus:
                continue
            name, by = job_id, "job_id"
            if self.names is not None and job_id.isdigit():
                names_seen.add(job_id)
                looked = self.names.name(job_id)
                if looked is None and self.names.pending(job_id):
                    # Held back while its name is on its way, as a pod is for its labels: a job named by its ID
                    # first and by its name a sample later would be two jobs, the first ending at once (seen with
                    # the real squeue, tests/e2e/test_slurm.py). The lookup's timeout ends the wait. The bound is
                    # twice that timeout: on a loaded node the thread and the command's start add seconds to it,
                    # and a lookup that lands within the bound must land before the job shows.
                    since = self._name_pending_since.setdefault(job_id, now)
                    if now - since <= NAME_HOLD_TIMEOUTS * self.names.timeout:
                        if len(held) < MAX_LISTED:
                            held.append(job_id)
                        continue
                self._name_pending_since.pop(job_id, None)
                if looked and (clean := sanitize_job_name(looked)):
                    name, by = clean, "name_command"
            extra = info.get(job_id, {})
            found.append(
                DiscoveredJob(
                    name,
                    "slurm",
                    job_gpus,
                    (
                        DiscoveredPod(
                            "slurm",
                            slurm_job_id=job_id,
                            user=str(extra["uid"]) if extra.get("uid") is not None else "",
                            slurm_steps=",".join(extra.get("steps", ())),
                            name_by=extra.get("by", by) if by == "job_id" else by,
                        ),
                    ),
                )
            )
        if self.names is not None:
            self.names.forget(names_seen)
            detail["names_pending"] = held
        self._name_pending_since = {k: v for k, v in self._name_pending_since.items() if k in names_seen}
        status["slurm"] = detail
        return found

    def _processes(self, gpus: list[NodeGpu], per_gpu: dict[int, set[str]], info: dict, errors: Counter) -> dict:
        ok, why = slurm.host_pid_namespace(self.procfs)
        if not ok:
            return {"active": False, "why": why}
        if self._session is None or not self._nvml_held or not gpus:
            return {"active": False, "why": "NVML is not available: no GPU processes to follow"}
        with self._session.lock:
            pids, nvml_errors = slurm.nvml_compute_pids(self._nvml, [g.index for g in gpus])
        errors.update({f"slurm_{k}": v for k, v in nvml_errors.items()})
        result = slurm.jobs_of_processes(pids, self.resolver)
        errors.update(
            {f"slurm_pid_{k}": v for k, v in result.skipped.items() if k not in ("not_slurm", "own_container")}
        )
        for gpu, jobs in result.gpus.items():
            per_gpu.setdefault(gpu, set()).update(jobs)
        info.update(result.jobs)
        return {"active": True, "gpu_processes": sum(len(p) for p in pids.values()), "skipped": dict(result.skipped)}

    # --- the sample -------------------------------------------------------------------------------------------

    def sample(self) -> Snapshot:
        errors: Counter = Counter()
        status: dict[str, Any] = {}
        gpus = self._inventory(errors)
        found = self._kubernetes(gpus, status, errors) + self._slurm(gpus, status, errors)
        if not status.get("kubernetes", {}).get("active") and not status.get("slurm", {}).get("active"):
            why = "; ".join(f"{k}: {v.get('why')}" for k, v in status.items())
            raise SourceUnavailable("nothing_to_discover", why, retry_after=self.interval)
        jobs, left_out = merge_found(found, self.max_jobs)
        if left_out:
            errors["jobs_over_cap"] += left_out
        status["jobs"] = {name: job.as_json() for name, job in jobs.items()}
        status["jobs_over_cap"] = left_out
        return Snapshot(readings=DiscoverySample(jobs), errors=errors, status=status)

    def close(self) -> None:
        self.client.close()
        if self.lookup is not None:
            self.lookup.close()
        if self._session is not None and self._nvml_held:
            self._nvml_held = False
            self._session.release()
