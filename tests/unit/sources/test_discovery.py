"""The discovery source over a real pod-resources gRPC server, a loopback API server and Slurm fixtures."""

import os
import time

import pytest

from mfu_exporter.config import ConfigError, typed_config, validate
from mfu_exporter.sim.nvml import FakeNvml, h100
from mfu_exporter.sim.podresources import PodResourcesServer, SimPod
from mfu_exporter.sim.procfs import V1, V2, add_process, host_procfs
from mfu_exporter.sources.base import SourceUnavailable
from mfu_exporter.sources.discovery import DiscoverySource
from tests.unit.node.test_kubeapi import Api


@pytest.fixture
def sock():
    path = f"/tmp/disc-{os.getpid()}-{time.monotonic_ns()}.sock"
    yield path
    if os.path.exists(path):
        os.unlink(path)


@pytest.fixture
def nvml():
    return FakeNvml([h100(i) for i in range(8)])


def section(**discovery):
    return typed_config(validate({"discovery": discovery})).discovery


def k8s_only(sock, **kubernetes):
    return section(
        kubernetes={"enabled": "true", "socket": sock, "api_server": {"enabled": "false"}, **kubernetes},
        slurm={"enabled": "false"},
    )


def training_pods(nvml):
    uuids = [g.uuid for g in nvml.gpus]
    return [
        SimPod("llama-master-0", "team-a", {"pytorch": [("nvidia.com/gpu", uuids[0:2])]}),
        SimPod("llama-worker-0", "team-a", {"pytorch": [("nvidia.com/gpu", uuids[2:4])]}),
        SimPod(
            "bert-worker-3", "team-b", {"pytorch": [("nvidia.com/gpu", uuids[4:8])], "net": [("rdma/hca", ["mlx5_0"])]}
        ),
        SimPod(
            "mig-job-worker-0",
            "team-c",
            {"main": [("nvidia.com/mig-1g.10gb", ["MIG-5f6a2a4e-8b9c-4d1e-a2b3-c4d5e6f7a8b9"])]},
        ),
        SimPod("web", "default", {"app": [("cpu", [])]}),
    ]


def test_jobs_from_pod_resources_by_pod_name_pattern(sock, nvml):
    with PodResourcesServer(sock, training_pods(nvml)):
        source = DiscoverySource(k8s_only(sock), nvml=nvml)
        snapshot = source.sample()
        jobs = snapshot.readings.jobs
        assert sorted(jobs) == ["bert", "llama"]
        assert jobs["llama"].gpus == (0, 1, 2, 3) and jobs["bert"].gpus == (4, 5, 6, 7)
        assert [(p.namespace, p.pod) for p in jobs["llama"].pods] == [
            ("team-a", "llama-master-0"),
            ("team-a", "llama-worker-0"),
        ]
        assert snapshot.errors["kubernetes_device_unmatched"] == 1  # the MIG instance: reported, not attributed
        unsupported = snapshot.status["kubernetes"]["unsupported_devices"]
        assert any("MIG" in why for why in unsupported.values())
        source.close()


def test_allocatable_devices_are_summarised_where_the_kubelet_has_the_call(sock, nvml):
    uuids = [g.uuid for g in nvml.gpus]
    with PodResourcesServer(sock, training_pods(nvml), allocatable=[("nvidia.com/gpu", uuids + ["GPU-bogus"])]):
        status = DiscoverySource(k8s_only(sock), nvml=nvml).sample().status["kubernetes"]
        assert status["allocatable_gpus"] == {"devices": 9, "matched": 8}
    with PodResourcesServer(sock, training_pods(nvml)):  # an old kubelet: UNIMPLEMENTED, never asked again
        source = DiscoverySource(k8s_only(sock), nvml=nvml)
        assert source.sample().status["kubernetes"]["allocatable_gpus"] is None
        assert source.client.allocatable_supported is False


def test_time_sliced_gpu_is_marked_shared(sock, nvml):
    u = nvml.gpus[0].uuid
    pods = [
        SimPod("a-worker-0", containers={"c": [("nvidia.com/gpu.shared", [f"{u}::0"])]}),
        SimPod("b-worker-0", containers={"c": [("nvidia.com/gpu.shared", [f"{u}::1"])]}),
    ]
    with PodResourcesServer(sock, pods):
        jobs = DiscoverySource(k8s_only(sock), nvml=nvml).sample().readings.jobs
        assert jobs["a"].gpus == (0,) and jobs["a"].shared_gpus == (0,) and jobs["b"].shared_gpus == (0,)


def test_labels_from_the_api_server_and_degrading_to_the_pattern(sock, nvml, tmp_path):
    api = Api(tmp_path)
    uuids = [g.uuid for g in nvml.gpus]
    pods = [
        SimPod("llama-worker-0", "train", {"c": [("nvidia.com/gpu", uuids[:4])]}),
        SimPod("other-worker-1", "locked", {"c": [("nvidia.com/gpu", uuids[4:6])]}),  # 403
        SimPod("gone", "train", {"c": [("nvidia.com/gpu", uuids[6:7])]}),  # 404
        SimPod("slow", "train", {"c": [("nvidia.com/gpu", uuids[7:8])]}),
    ]  # never answers in time
    cfg = section(
        kubernetes={
            "enabled": "true",
            "socket": sock,
            "api_server": {
                "enabled": "true",
                "url": api.url,
                "token_path": str(api.token_path),
                "ca_path": str(api.ca_path),
                "timeout": "300ms",
            },
        },
        slurm={"enabled": "false"},
    )
    try:
        with PodResourcesServer(sock, pods):
            source = DiscoverySource(cfg, nvml=nvml)
            first = source.sample()  # returns while the slow pod's GET is still held: lookups run off this thread
            assert first.readings.jobs == {}  # every pod held back while its labels are on their way
            assert not api.release.is_set()
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                jobs = source.sample().readings.jobs
                if len(jobs) == 4:
                    break
                time.sleep(0.1)
            # The label names llama's job (Kubeflow's label: it is "llama" from the fixture API); 403 and 404 and
            # the slow one fall back to the pod-name pattern, and the sample never failed.
            assert sorted(jobs) == ["gone", "llama", "other", "slow"]
            assert jobs["llama"].pods[0].name_by == "label:training.kubeflow.org/job-name"
            assert jobs["other"].pods[0].name_by == "pod_name_pattern"
            source.close()
    finally:
        api.close()


def test_missing_socket_auto_is_down_with_a_reason(sock, nvml):
    cfg = section(kubernetes={"enabled": "auto", "socket": sock}, slurm={"enabled": "false"})
    with pytest.raises(SourceUnavailable) as caught:
        DiscoverySource(cfg, nvml=nvml).sample()
    assert caught.value.reason == "nothing_to_discover" and sock in caught.value.detail


def test_hanging_kubelet_fails_only_the_sample_within_its_timeout(sock, nvml):
    with PodResourcesServer(sock, training_pods(nvml)) as server:
        server.hang.set()
        source = DiscoverySource(k8s_only(sock, timeout="300ms"), nvml=nvml)
        started = time.monotonic()
        with pytest.raises(SourceUnavailable) as caught:
            source.sample()
        assert caught.value.reason == "kubernetes_timeout"
        assert time.monotonic() - started < 2


def test_slurm_processes_and_mapping_dir(tmp_path, nvml):
    procfs = host_procfs(tmp_path)
    add_process(procfs, 5000, V2)  # job 3385
    add_process(procfs, 5001, V1)  # job 31
    nvml.gpus[0].processes = [5000]
    nvml.gpus[1].processes = [5000, 5001]
    mapping = tmp_path / "map"
    mapping.mkdir()
    for gpu in (4, 5, 6, 7):
        (mapping / str(gpu)).write_text("777\n")
    cfg = section(
        kubernetes={"enabled": "false"},
        slurm={"enabled": "true", "job_mapping_dir": str(mapping), "cgroup_root": str(tmp_path / "cg")},
    )
    snapshot = DiscoverySource(cfg, procfs=str(procfs), nvml=nvml).sample()
    jobs = snapshot.readings.jobs
    assert {n: j.gpus for n, j in jobs.items()} == {"3385": (0, 1), "31": (1,), "777": (4, 5, 6, 7)}
    assert jobs["3385"].shared_gpus == (1,)
    assert jobs["31"].pods[0].user == "1000"


def test_slurm_job_held_back_while_its_name_is_on_its_way_then_named_or_given_its_id(tmp_path, nvml):
    """As a pod waits for its labels: a job is not first named by its ID and a sample later by its name."""
    mapping = tmp_path / "map"
    mapping.mkdir()
    (mapping / "0").write_text("41\n")
    (mapping / "1").write_text("42\n")
    gate = tmp_path / "answer"
    squeue = tmp_path / "squeue"
    # Job 41's name comes once the test lets it; job 42's lookup hangs until its timeout ends it.
    squeue.write_text(
        f'#!/bin/sh\n[ "$1" = 42 ] && exec sleep 60\nwhile [ ! -e {gate} ]; do sleep 0.02; done\necho llama-sft\n'
    )
    squeue.chmod(0o755)
    now = [100.0]
    cfg = section(
        kubernetes={"enabled": "false"},
        slurm={
            "enabled": "true",
            "job_mapping_dir": str(mapping),
            "processes": False,
            "name_command": [str(squeue), "{job}"],
            "name_timeout": "30s",  # far beyond the test's wall time: 42's lookup runs through every sample below
        },
    )
    source = DiscoverySource(cfg, nvml=nvml, clock=lambda: now[0])
    try:
        first = source.sample()
        assert first.readings.jobs == {} and first.status["slurm"]["names_pending"] == ["41", "42"]
        gate.touch()
        deadline = time.monotonic() + 5
        while source.names.pending("41") and time.monotonic() < deadline:
            time.sleep(0.01)
        now[0] += 1.0
        second = source.sample()
        named = second.readings.jobs
        assert list(named) == ["llama-sft"] and named["llama-sft"].pods[0].slurm_job_id == "41"
        assert second.status["slurm"]["names_pending"] == ["42"]
        now[0] += 58.0  # 59 s held: within twice 42's name_timeout, its lookup still running, still held
        assert list(source.sample().readings.jobs) == ["llama-sft"]
        now[0] += 2.0  # past twice the timeout with the lookup still running: named by its ID from now on
        assert sorted(source.sample().readings.jobs) == ["42", "llama-sft"]
    finally:
        source.close()


def test_slurm_processes_off_without_the_host_pid_namespace(tmp_path, nvml):
    procfs = tmp_path / "proc"
    add_process(procfs, 1, "0::/\n", comm="tini")
    add_process(procfs, 5000, V2)
    nvml.gpus[0].processes = [5000]
    cfg = section(kubernetes={"enabled": "false"}, slurm={"enabled": "true"})
    snapshot = DiscoverySource(cfg, procfs=str(procfs), nvml=nvml).sample()
    assert snapshot.readings.jobs == {}
    assert "hostPID" in snapshot.status["slurm"]["processes"]["why"]


def test_cap_on_discovered_jobs(sock, nvml):
    uuids = [g.uuid for g in nvml.gpus]
    pods = [SimPod(f"j{i}-worker-0", containers={"c": [("nvidia.com/gpu", [uuids[i]])]}) for i in range(8)]
    with PodResourcesServer(sock, pods):
        cfg = section(
            max_jobs=3,
            kubernetes={"enabled": "true", "socket": sock, "api_server": {"enabled": "false"}},
            slurm={"enabled": "false"},
        )
        snapshot = DiscoverySource(cfg, nvml=nvml).sample()
        assert sorted(snapshot.readings.jobs) == ["j0", "j1", "j2"]
        assert snapshot.errors["jobs_over_cap"] == 5


def test_config_errors_name_the_key():
    with pytest.raises(ConfigError) as caught:
        validate({"discovery": {"kubernetes": {"sockett": "/x"}}}, "c.yaml")
    assert "discovery.kubernetes.sockett" in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        validate({"discovery": {"kubernetes": {"pod_name_pattern": "^abc$"}}}, "c.yaml")
    assert "discovery.kubernetes.pod_name_pattern" in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        validate({"discovery": {"slurm": {"name_command": "squeue"}}}, "c.yaml")
    assert "discovery.slurm.name_command" in str(caught.value)


def test_ten_thousand_pods_degrade_nothing_and_the_cap_holds(sock, nvml):
    uuids = [g.uuid for g in nvml.gpus]
    pods = [
        SimPod(
            f"job{i:05d}-worker-{i % 4}",
            f"team-{i % 40}",
            {"c": [("nvidia.com/gpu", [uuids[i % 8]])], "n": [("rdma/hca", [f"mlx5_{i % 8}"])]},
        )
        for i in range(10_000)
    ]
    with PodResourcesServer(sock, pods):
        snapshot = DiscoverySource(k8s_only(sock, timeout="20s"), nvml=nvml).sample()
        assert len(snapshot.readings.jobs) == 64  # discovery.max_jobs
        assert snapshot.errors["jobs_over_cap"] == 10_000 - 64
        assert snapshot.status["kubernetes"]["pods_with_gpus"] == 10_000


def test_demo_config_applies_the_files_discovery_section(tmp_path):
    from mfu_exporter.sim.node import DemoNode, Schedule, SimClock, demo_config

    node = DemoNode(tmp_path / "node", SimClock(1.0), Schedule())
    mapping = tmp_path / "map"
    mapping.mkdir()
    file = tmp_path / "demo.yaml"
    file.write_text(f"discovery:\n  kubernetes: {{enabled: false}}\n  slurm: {{job_mapping_dir: {mapping}}}\n")
    config = demo_config(str(file), node, kubelet_socket="/tmp/demo-kubelet.sock")
    assert config["discovery"]["kubernetes"]["enabled"] == "false"
    assert config["discovery"]["slurm"]["job_mapping_dir"] == str(mapping)
    default = demo_config(None, node, kubelet_socket="/tmp/demo-kubelet.sock")
    assert default["discovery"]["kubernetes"]["socket"] == "/tmp/demo-kubelet.sock"


def test_a_lost_gpu_does_not_stop_discovery_for_the_others_nor_reinitialise_nvml(sock, nvml):
    # Real NVML keeps a GPU that fell off the bus at its index, and its handle call fails: the other seven are still
    # matched to their pods, and NVML is initialised once, not again every cycle.
    nvml.lose(5)
    with PodResourcesServer(sock, training_pods(nvml)):
        clock = [0.0]
        source = DiscoverySource(k8s_only(sock), nvml=nvml, clock=lambda: clock[0])
        snapshot = source.sample()
        assert snapshot.errors["nvml_gpu_NVMLError_GpuIsLost"] == 1
        jobs = snapshot.readings.jobs
        assert jobs["llama"].gpus == (0, 1, 2, 3) and jobs["bert"].gpus == (4, 6, 7)
        for _ in range(3):
            clock[0] += 61  # past the inventory's refresh
            source.sample()
        assert nvml.calls["nvmlInit"] == 1 and nvml.initialized
        source.close()
        assert not nvml.initialized
