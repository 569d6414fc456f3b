"""Pure rules of job discovery: device IDs to this node's GPUs, pod labels and names to job names. No I/O.

Device IDs, as the kubelet's pod-resources API lists them (forms from dcgm-exporter's kubernetes.go and the NVIDIA
device plugin, see docs/metrics.md "Job discovery"):

- ``GPU-<uuid>``: the NVIDIA device plugin's default; matched to the NVML UUID.
- ``<id>::<n>``: the plugin's time-slicing / MPS replica ``n`` of device ``<id>``; the base ID is matched and the
  GPU is marked shared. ``nvidia0/vgpu1`` is GKE's form of the same.
- ``nvidia<N>``: GKE's device-plugin name, /dev/nvidia<N>; matched by the GPU's minor number when the GPU source
  knows it, never by NVML index (the two orders differ: Slurm's gres.shtml, "Mapping between these two is
  nondeterministic").
- ``MIG-<uuid>`` (``nvidia.com/mig-*`` resources) and GKE ``nvidia0/gi0``: a MIG instance. Not supported: the GPU
  source reads utilization and GPM per whole GPU, so an instance's job would get the figures of the other instances'
  jobs. Such devices are reported as unsupported and never attributed.

Any ``nvidia.com/`` resource is considered (``nvidia.com/gpu.shared`` from ``renameByDefault``, ``nvidia.com/a100``
from custom resource names); the device ID's shape decides. Other resources (NICs, FPGAs) are not GPUs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Mapping

from mfu_exporter.config import DISCOVERY_LABEL_KEYS
from mfu_exporter.jobname import sanitize_job_name

DEFAULT_LABEL_KEYS = DISCOVERY_LABEL_KEYS
_UUID_BODY = r"[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}"
_GPU_UUID = re.compile(rf"^GPU-{_UUID_BODY}$", re.IGNORECASE)
_BARE_UUID = re.compile(rf"^{_UUID_BODY}$")
_MIG = re.compile(rf"^MIG-(?:{_UUID_BODY}|GPU-{_UUID_BODY}/\d+/\d+)$")
_GKE_NAME = re.compile(r"^nvidia(\d+)$")
_GKE_MIG = re.compile(r"^nvidia\d+/gi\d+(?:/vgpu\d+)?$")
_GKE_SHARE = re.compile(r"^(nvidia\d+)/vgpu(\d+)$")
_REPLICA = re.compile(r"^(.+)::(\d+)$")

MIG_UNSUPPORTED = (
    "a MIG instance: the GPU source reads utilization and GPM per whole GPU, so per-instance jobs are not attributed"
)


@dataclass(frozen=True)
class NodeGpu:
    """What matching needs of one GPU of this node."""

    index: int
    uuid: str
    minor: int | None = None


@dataclass(frozen=True)
class DeviceMatch:
    """A device ID resolved to a GPU index, or why it was not."""

    device_id: str
    gpu: int | None
    replica: int | None = None  # time-slicing / MPS replica number when the ID carried one
    unsupported: str | None = None  # set when gpu is None


def is_gpu_resource(resource_name: str) -> bool:
    return resource_name.startswith("nvidia.com/")


def match_device(device_id: str, resource_name: str, gpus: Iterable[NodeGpu]) -> DeviceMatch:
    """Which GPU of this node ``device_id`` is; never a guess: an ID that does not name one GPU exactly is unmatched."""
    gpus = list(gpus)
    if resource_name.startswith("nvidia.com/mig-") or _MIG.match(device_id) or _GKE_MIG.match(device_id):
        return DeviceMatch(device_id, None, unsupported=MIG_UNSUPPORTED)
    base, replica = device_id, None
    if (m := _REPLICA.match(device_id)) or (m := _GKE_SHARE.match(device_id)):
        base, replica = m.group(1), int(m.group(2))
        if _MIG.match(base):
            return DeviceMatch(device_id, None, replica, MIG_UNSUPPORTED)
    if _GPU_UUID.match(base) or _BARE_UUID.match(base):
        wanted = base.lower() if _GPU_UUID.match(base) else f"gpu-{base.lower()}"
        for gpu in gpus:
            if gpu.uuid.lower() == wanted:
                return DeviceMatch(device_id, gpu.index, replica)
        return DeviceMatch(device_id, None, replica, f"no GPU with UUID {base} on this node")
    if m := _GKE_NAME.match(base):
        minor = int(m.group(1))
        if not any(g.minor is not None for g in gpus):
            return DeviceMatch(
                device_id,
                None,
                replica,
                f"{base} is a device minor number, and the GPU source gave no minor numbers to match",
            )
        for gpu in gpus:
            if gpu.minor == minor:
                return DeviceMatch(device_id, gpu.index, replica)
        return DeviceMatch(device_id, None, replica, f"no GPU with minor number {minor} on this node")
    return DeviceMatch(device_id, None, replica, "not a GPU UUID, nvidiaN name or replica of one")


def sanitize_label_value(value: str, limit: int = 253) -> str:
    """An info-series label value: printable, bounded (253 is a Kubernetes name's maximum), valid UTF-8."""
    text = value.encode("utf-8", "replace").decode("utf-8", "replace")
    return "".join(ch if ch.isprintable() else "_" for ch in text)[:limit]


@dataclass(frozen=True)
class JobName:
    name: str
    by: str  # "label:<key>", "pod_name_pattern" or "pod_name"


def job_name_for_pod(
    pod: str, labels: Mapping[str, str] | None, label_keys: Iterable[str], pattern: re.Pattern
) -> JobName:
    """The training_job of a pod: the first label key present, else the pod name through the pattern, else the
    pod name itself; sanitized, so it is a valid job name on every node alike."""
    for key in label_keys:
        value = (labels or {}).get(key)
        if value and (name := sanitize_job_name(value)):
            return JobName(name, f"label:{key}")
    m = pattern.match(pod)
    if m:
        group = m.group("job") if "job" in pattern.groupindex else m.group(1)
        if group and (name := sanitize_job_name(group)):
            return JobName(name, "pod_name_pattern")
    return JobName(sanitize_job_name(pod) or "unnamed", "pod_name")
