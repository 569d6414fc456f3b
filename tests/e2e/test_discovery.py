"""Discovery end to end: a real pod-resources gRPC server, the real GPU, RDMA, ethtool and discovery sources over
the fakes, and the service as the daemon builds it. One job reports (llama, GPUs 0–3, also listed by the kubelet),
one reports nothing (bert, GPUs 4–7): both are jobs with their GPUs, figures and causes, and an incident on one's
GPUs or NICs is attributed to it and not to the other."""

import json
import os
import time

import pytest
from prometheus_client import generate_latest

from mfu_exporter.config import validate
from mfu_exporter.model.progress import parse_progress
from mfu_exporter.node.ethtool import EthtoolTextReader
from mfu_exporter.node.nvml_fields import THROTTLE_REASONS
from mfu_exporter.service import build_service
from mfu_exporter.sim import node as demo
from mfu_exporter.sim import nvml as fake_nvml
from mfu_exporter.sim.mlx5 import SimulatedNode
from mfu_exporter.sim.podresources import PodResourcesServer, SimPod
from mfu_exporter.sources import Paths, SourceContext, build_sources
from tests.support.expo import samples as parse_exposition


class Node:
    def __init__(self, root, socket):
        self.now = 1_800_000_000.0
        self.nvml = fake_nvml.node(fake_nvml.h100, count=8)
        for gpu in self.nvml.gpus:
            demo.train_healthily(gpu)
        self.fabric = SimulatedNode(root / "fabric", nics=8)
        uuids = [g.uuid for g in self.nvml.gpus]
        self.kubelet = PodResourcesServer(
            socket,
            [
                SimPod("llama-master-0", "train", {"pytorch": [("nvidia.com/gpu", uuids[0:4])]}),
                SimPod("bert-worker-0", "research", {"pytorch": [("nvidia.com/gpu", uuids[4:6])]}),
                SimPod("bert-worker-1", "research", {"pytorch": [("nvidia.com/gpu", uuids[6:8])]}),
            ],
        ).start()
        config = validate(
            {
                "jobs": {"llama": {**demo.MODEL, "gpus": [0, 1, 2, 3], "expected_mfu": demo.STEADY_MFU}},
                "attribution": {"baseline_min_samples": 5, "baseline_interval": "1s"},
                # The sources discovery and attribution read, built as the daemon builds them; the others off.
                "sources": {
                    **{name: {"enabled": False} for name in ("checkpoint", "preflight", "logs")},
                    # Sampled every simulated second below, so their readings' shares are over 1 s.
                    **{name: {"interval": "1s"} for name in ("gpu", "rdma", "ethtool")},
                },
                "discovery": {
                    "kubernetes": {"enabled": "true", "socket": socket, "api_server": {"enabled": "false"}},
                    "slurm": {"enabled": "false"},
                },
            }
        )
        ctx = SourceContext(
            config,
            Paths(self.fabric.sysfs_root),
            nvml=self.nvml,
            ethtool_reader=EthtoolTextReader.from_directory(str(self.fabric.ethtool_directory)),
            wall=self.clock,
            monotonic=self.clock,
        )
        self.sources = build_sources(config, ctx)
        self.service = build_service(config, self.sources, clock=self.clock, paths=ctx.paths)
        self.tokens = 0.0
        self.llama_speed = 1.0

    def clock(self):
        return self.now

    def run(self, seconds=1):
        for _ in range(seconds):
            self.now += 1.0
            self.nvml.advance(1.0)
            self.fabric.tick(1.0)
            for source in self.sources:
                self.service.scheduler.keep(source.name, source.sample())  # what a successful cycle keeps
                self.service.collector.sampled(source.name)  # and publishes, as the scheduler's listener does
            self.tokens += self.llama_speed * demo.healthy_tokens_per_second()
            self.service.jobs.report(parse_progress({"job": "llama", "tokens_total": self.tokens}, self.now))
            self.service.apply_discovery()
            self.service.apply_feed()
            views = self.service.jobs.views()
            self.service.attribution.evaluate(self.now, views, self.service.node_signals())
            self.service.collector.tick(views)  # /metrics shows the jobs as the tick publishes them

    def jobs(self):
        # What GET /api/v1/jobs answers, through JSON as a client sees it.
        return {
            j["job"]: j for j in json.loads(json.dumps([self.service.job_json(v) for v in self.service.jobs.views()]))
        }

    def metrics(self):
        return parse_exposition(generate_latest(self.service.registry).decode())

    def close(self):
        for source in self.sources:
            source.close()
        self.kubelet.stop()


@pytest.fixture
def node(tmp_path):
    socket = f"/tmp/e2e-disc-{os.getpid()}-{time.monotonic_ns()}.sock"
    built = Node(tmp_path, socket)
    yield built
    built.close()
    if os.path.exists(socket):
        os.unlink(socket)


def cause(node, job):
    verdict = node.service.attribution.verdict(job)
    return verdict.cause if verdict else None


def test_every_job_with_its_gpus_figures_and_cause_and_one_job_per_name(node):
    node.run(8)
    jobs = node.jobs()
    assert sorted(jobs) == ["bert", "llama"]  # llama reports and is listed by the kubelet: one job, not two
    assert jobs["llama"]["found_by"] == ["reported", "config", "kubernetes"]
    assert jobs["bert"]["found_by"] == ["kubernetes"]
    assert jobs["bert"]["gpu_indices"] == [4, 5, 6, 7] and jobs["llama"]["gpu_indices"] == [0, 1, 2, 3]
    assert jobs["bert"]["mfu"] is None and jobs["llama"]["mfu"] == pytest.approx(0.45, abs=0.02)
    assert jobs["bert"]["hardware"]["tensor_active"] == pytest.approx(0.60)
    assert jobs["bert"]["bottleneck"]["cause"] == "none"
    assert jobs["bert"]["bottleneck"]["signal"] == "hardware_flops_utilization"
    assert [p["pod"] for p in jobs["bert"]["discovered"]["pods"]] == ["bert-worker-0", "bert-worker-1"]
    metrics = node.metrics()
    bert = (("training_job", "bert"),)
    assert 0.3 < metrics[("mfu_job_hardware_flops_utilization_ratio", bert)] <= 1
    assert metrics[("mfu_job_gpu_utilization_ratio", bert)] == pytest.approx(0.95)
    assert metrics[("mfu_job_bottleneck", (("cause", "none"), ("training_job", "bert")))] == 1
    info = [labels for (name, labels) in metrics if name == "mfu_job_info" and dict(labels)["training_job"] == "bert"]
    assert sorted(dict(labels)["pod"] for labels in info) == ["bert-worker-0", "bert-worker-1"]
    assert all(dict(labels)["namespace"] == "research" for labels in info)
    # Pod and namespace ride only on the info series, never on GPU series.
    assert not any("pod" in dict(labels) for (name, labels) in metrics if name.startswith("mfu_gpu_"))


def test_a_thermal_incident_on_the_discovered_jobs_gpu_is_its_own(node):
    node.run(8)  # healthy: both learn their baselines
    hot = node.nvml.gpus[6]
    hot.clocks_event_reasons = dict(THROTTLE_REASONS)["hw_thermal_slowdown"]
    hot.temperature_c, hot.sm_clock_mhz = 91, 990
    for index in (4, 5, 6, 7):
        node.nvml.gpus[index].set_activity(tensor=30.0, sm=45.0)  # the job slows to its slowest rank
    node.run(3)
    assert cause(node, "bert") == "thermal"
    assert "GPU 6 throttled" in node.service.attribution.verdict("bert").evidence
    assert cause(node, "llama") == "none"


def test_a_job_that_vanishes_from_discovery_ends(node):
    node.run(3)
    node.kubelet.set_pods([SimPod("llama-master-0", "train", {"p": [("nvidia.com/gpu", [node.nvml.gpus[0].uuid])]})])
    node.run(2)
    jobs = node.jobs()
    assert sorted(jobs) == ["llama"]
    assert ("mfu_job_gpu_utilization_ratio", (("training_job", "bert"),)) not in node.metrics()
    node.kubelet.set_pods([])
    node.run(2)
    assert node.jobs()["llama"]["found_by"] == ["reported", "config"]  # it still reports: only discovery's facts go


def test_a_hung_kubelet_keeps_the_last_answer_and_degrades_only_discovery(node):
    node.run(3)
    node.kubelet.hang.set()
    source = node.sources[-1]
    source.client.timeout = 0.2
    state = node.service.scheduler.states["discovery"]
    with pytest.raises(Exception) as caught:
        source.sample()
    assert getattr(caught.value, "reason", "") == "kubernetes_timeout"
    node.service.apply_discovery()  # the scheduler keeps the last good snapshot: the jobs stand
    assert sorted(node.jobs()) == ["bert", "llama"]
    assert state.snapshot.readings.jobs
    node.kubelet.hang.clear()
