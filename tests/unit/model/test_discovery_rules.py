"""Device IDs to GPUs and pods to job names: every device-ID form the kubelet lists, never a wrong GPU."""

import pytest

from mfu_exporter.jobname import DEFAULT_POD_NAME_PATTERN, compile_pod_name_pattern, sanitize_job_name
from mfu_exporter.model.discovery import (
    DEFAULT_LABEL_KEYS,
    NodeGpu,
    is_gpu_resource,
    job_name_for_pod,
    match_device,
    sanitize_label_value,
)

U0 = "GPU-b8ea3855-276c-c9cb-b366-c6fa655957c5"
U1 = "GPU-0d9a7e51-4b0c-4a43-9a61-2b1f3c4d5e6f"
GPUS = [NodeGpu(0, U0, minor=1), NodeGpu(1, U1, minor=0)]
PATTERN = compile_pod_name_pattern(DEFAULT_POD_NAME_PATTERN)


@pytest.mark.parametrize(
    "device_id, resource, gpu, replica",
    [
        (U0, "nvidia.com/gpu", 0, None),
        (U1.lower(), "nvidia.com/gpu", 1, None),
        (U0[4:], "nvidia.com/gpu", 0, None),  # a bare UUID
        (f"{U1}::3", "nvidia.com/gpu.shared", 1, 3),  # time-slicing replica under renameByDefault
        ("nvidia0", "nvidia.com/gpu", 1, None),  # GKE: /dev/nvidia0 is minor 0, NVML index 1 here
        ("nvidia1/vgpu2", "nvidia.com/gpu", 0, 2),  # GKE time-sharing
    ],
)
def test_matched(device_id, resource, gpu, replica):
    match = match_device(device_id, resource, GPUS)
    assert (match.gpu, match.replica, match.unsupported) == (gpu, replica, None)


@pytest.mark.parametrize(
    "device_id, resource, why",
    [
        ("MIG-5f6a2a4e-8b9c-4d1e-a2b3-c4d5e6f7a8b9", "nvidia.com/mig-1g.10gb", "MIG"),
        ("MIG-5f6a2a4e-8b9c-4d1e-a2b3-c4d5e6f7a8b9::1", "nvidia.com/gpu", "MIG"),
        (U0, "nvidia.com/mig-3g.40gb", "MIG"),  # the resource name alone says MIG
        ("nvidia0/gi1", "nvidia.com/gpu", "MIG"),
        ("nvidia0/gi1/vgpu0", "nvidia.com/gpu", "MIG"),
        ("GPU-ffffffff-276c-c9cb-b366-c6fa655957c5", "nvidia.com/gpu", "no GPU with UUID"),
        ("nvidia7", "nvidia.com/gpu", "minor number 7"),
        ("gpu-3", "nvidia.com/gpu", "not a GPU UUID"),
    ],
)
def test_unsupported_or_unknown_is_never_a_gpu(device_id, resource, why):
    match = match_device(device_id, resource, GPUS)
    assert match.gpu is None and why in match.unsupported


def test_nvidia_n_without_minor_numbers_is_not_guessed_from_the_index():
    match = match_device("nvidia0", "nvidia.com/gpu", [NodeGpu(0, U0), NodeGpu(1, U1)])
    assert match.gpu is None and "minor" in match.unsupported


def test_gpu_resources():
    assert is_gpu_resource("nvidia.com/gpu") and is_gpu_resource("nvidia.com/gpu.shared")
    assert is_gpu_resource("nvidia.com/a100")
    assert not is_gpu_resource("rdma/hca") and not is_gpu_resource("amd.com/gpu")


@pytest.mark.parametrize(
    "pod, labels, name, by",
    [
        (
            "llama-worker-3",
            {"training.kubeflow.org/job-name": "llama", "batch.kubernetes.io/job-name": "x"},
            "llama",
            "label:training.kubeflow.org/job-name",
        ),
        (
            "tj-node-0-1-abcde",
            {"jobset.sigs.k8s.io/jobset-name": "tj", "batch.kubernetes.io/job-name": "tj-node-0"},
            "tj",
            "label:jobset.sigs.k8s.io/jobset-name",
        ),
        ("vc-task-0", {"volcano.sh/job-name": "vc"}, "vc", "label:volcano.sh/job-name"),
        (
            "pi-0-xk2f9",
            {"batch.kubernetes.io/job-name": "pi", "job-name": "pi"},
            "pi",
            "label:batch.kubernetes.io/job-name",
        ),
        ("old-abcde", {"job-name": "old"}, "old", "label:job-name"),
        ("gpt-master-0", None, "gpt", "pod_name_pattern"),
        ("gpt-worker-15", {}, "gpt", "pod_name_pattern"),
        ("mpi-run-launcher-0", {"app": "x"}, "mpi-run", "pod_name_pattern"),
        ("notebook-7f9c", None, "notebook-7f9c", "pod_name"),
    ],
)
def test_job_names(pod, labels, name, by):
    found = job_name_for_pod(pod, labels, DEFAULT_LABEL_KEYS, PATTERN)
    assert (found.name, found.by) == (name, by)


def test_every_worker_of_a_job_gets_the_same_name_on_every_node():
    names = {
        job_name_for_pod(f"llama-{role}-{i}", None, DEFAULT_LABEL_KEYS, PATTERN).name
        for role in ("master", "worker")
        for i in range(64)
    }
    assert names == {"llama"}


def test_label_values_that_are_not_job_names():
    assert sanitize_job_name("team/llama 70b") == "team_llama_70b"
    assert sanitize_job_name("__x") == "x"
    assert sanitize_job_name("é" * 300) is None  # nothing usable is left: the caller falls back
    assert sanitize_job_name("a" * 300) == "a" * 128
    assert sanitize_job_name("///") is None
    labels = {"training.kubeflow.org/job-name": "////", "volcano.sh/job-name": "vc job"}
    assert job_name_for_pod("p", labels, DEFAULT_LABEL_KEYS, PATTERN).name == "vc_job"
    assert sanitize_label_value("a\nb\x00c") == "a_b_c"
    assert len(sanitize_label_value("x" * 1000)) == 253


def test_pod_name_pattern_validation():
    assert compile_pod_name_pattern(r"^(.+)-\d+$").match("a-1")
    with pytest.raises(ValueError, match="group"):
        compile_pod_name_pattern(r"^a$")
    with pytest.raises(ValueError, match="regular expression"):
        compile_pod_name_pattern(r"(")
    pattern = compile_pod_name_pattern(r"^(?P<job>[a-z]+)-\d+$")
    assert job_name_for_pod("abc-12", None, (), pattern).name == "abc"
