"""Loss attribution driven through the real sources over the fakes, the way the daemon runs it.

Fake NVML under the GPU source, a simulated ConnectX node under the RDMA and ethtool sources, checkpoint files under
a polled watch, progress reports into the job tracker; each simulated second every source is sampled into the
daemon's states and ``Service.node_signals()`` goes into the Attributor, as ``Service.evaluate_jobs`` does.
"""

import os
from pathlib import Path

import pytest

from mfu_exporter.config import validate
from mfu_exporter.model.progress import parse_progress
from mfu_exporter.node.ethtool import EthtoolTextReader
from mfu_exporter.node.nvml_fields import THROTTLE_REASONS
from mfu_exporter.node.pci import pci_address_from_nvml
from mfu_exporter.render.attribution import attribution_families
from mfu_exporter.service import build_service
from mfu_exporter.sim import node as demo
from mfu_exporter.sim import nvml as fake_nvml
from mfu_exporter.sim.mlx5 import SimulatedNode
from mfu_exporter.sources import Paths, SourceContext, build_sources

ALL_GPUS = list(range(demo.GPUS))
SLOWED = 0.4  # share of the healthy token rate a degraded job keeps: MFU 18% against a 45% baseline
PAST_THE_WINDOW = 61  # seconds: more than the default 60 s MFU window, which then holds none of what came before
CLOCK_EVENT_BITS = dict(THROTTLE_REASONS)


class Node:
    """Eight H100s and eight RoCE NICs under the real sources, with a service built as the daemon builds it."""

    def __init__(self, root: Path, jobs: dict[str, list[int]]):
        self.now = 1_800_000_000.0
        self.nvml = fake_nvml.node(fake_nvml.h100, count=demo.GPUS)
        for gpu in self.nvml.gpus:
            demo.train_healthily(gpu)
        self.fabric = SimulatedNode(root / "fabric", nics=demo.GPUS)
        self.checkpoints = root / "checkpoints"
        config = validate(
            {
                "jobs": {
                    name: {**demo.MODEL, "gpus": gpus, "expected_mfu": demo.STEADY_MFU} for name, gpus in jobs.items()
                },
                # The sources the attribution reads, built as the daemon builds them; the others stay off.
                "discovery": {"kubernetes": {"enabled": False}, "slurm": {"enabled": False}},
                "sources": {
                    # Sampled every simulated second below, so their readings' shares are over 1 s.
                    "gpu": {"interval": "1s"},
                    "rdma": {"interval": "1s"},
                    "ethtool": {"interval": "1s"},
                    "preflight": {"enabled": False},
                    "logs": {"enabled": False},
                    "checkpoint": {
                        "watch": [
                            {
                                "path": str(self.checkpoints / name),
                                "job": name,
                                "poll": "true",
                                "done_marker": ".metadata",
                            }
                            for name in jobs
                        ]
                    },
                },
            }
        )
        for name in jobs:
            (self.checkpoints / name).mkdir(parents=True)
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
        self.jobs = jobs
        self.tokens = dict.fromkeys(jobs, 0.0)
        self.reporting = True
        self.data_wait_share = None  # the share of wall time the job's loader makes it wait, once starved
        self.data_wait = 0.0

    def clock(self) -> float:
        return self.now

    def run(self, seconds: int = 1, step: float = 1.0, speed: float = SLOWED) -> None:
        for _ in range(seconds):
            self.now += step
            self.nvml.advance(step)
            self.fabric.tick(step)
            for source in self.sources:
                self.service.scheduler.keep(source.name, source.sample())  # what a successful cycle keeps
            for name, gpus in self.jobs.items():
                if self.reporting:
                    self.tokens[name] += speed * demo.healthy_tokens_per_second(len(gpus)) * step
                    body = {"job": name, "tokens_total": self.tokens[name]}
                    if self.data_wait_share is not None:
                        self.data_wait += self.data_wait_share * step
                        body["data_wait_seconds"] = self.data_wait
                    self.service.jobs.report(parse_progress(body, self.now))
            self.service.apply_feed()  # what the tick applies: the logs' lines
            self.service.attribution.evaluate(self.now, self.service.jobs.views(), self.service.node_signals())

    def verdict(self, job: str = "llama"):
        return self.service.attribution.verdict(job)

    def place_gpus_beside_their_nics(self) -> None:
        """The PCI side of sysfs the fabric fake leaves out: ``bus/pci/devices`` links, and each GPU on its own root
        complex on the NUMA node of its HGX half, as the NICs are (mlx5_0–3 on node 0, mlx5_4–7 on node 1)."""
        sysfs = Path(self.fabric.sysfs_root)
        links = sysfs / "bus" / "pci" / "devices"
        links.mkdir(parents=True)
        for nic in self.fabric.nics:
            (links / nic.pci_address).symlink_to(
                os.path.relpath(sysfs / "devices" / "pci0000:00" / nic.pci_address, links)
            )
        for index, gpu in enumerate(self.nvml.gpus):
            address = pci_address_from_nvml(gpu.pci_bus_id)
            function = sysfs / "devices" / f"pci0000:{address.split(':')[1]}" / address
            function.mkdir(parents=True)
            (function / "numa_node").write_text(f"{0 if index < demo.GPUS // 2 else 1}\n")
            (links / address).symlink_to(os.path.relpath(function, links))


def lose_gpu_3(node):
    node.nvml.lose(3)


def write_a_checkpoint(node):
    step = node.checkpoints / "llama" / "step-0001000"
    step.mkdir()
    (step / "__0_0.distcp").write_bytes(b"\0" * 4096)


def pause_ens3np0(node):
    node.fabric.nics[2].rx_pause_ratio = 0.45


def heat_gpu_5(node):
    node.nvml.gpus[5].clocks_event_reasons = CLOCK_EVENT_BITS["hw_thermal_slowdown"]
    node.nvml.gpus[5].temperature_c = 91


def power_cap_gpu_1(node):
    node.nvml.gpus[1].clocks_event_reasons = CLOCK_EVENT_BITS["sw_power_cap"]


def stop_reporting(node):
    node.reporting = False


def starve_the_loader(node):
    """The job's client times its loader: 30% of each second waiting for the next batch, GPUs busy otherwise."""
    node.data_wait_share = 0.3


def idle_the_gpus(node):
    for gpu in node.nvml.gpus:
        gpu.utilization = 20


FAULTS = {  # in the order of precedence
    "gpu_lost": (lose_gpu_3, "GPU 3 (GPU-"),
    "checkpoint": (write_a_checkpoint, "checkpoint step-0001000 writing"),
    "network": (pause_ens3np0, "ens3np0 paused 45% of the time on priority 3 (the switch paused it)"),
    "thermal": (heat_gpu_5, "GPU 5 throttled: hw_thermal_slowdown 100% of the time at 91 °C"),
    "power": (power_cap_gpu_1, "GPU 1 throttled: sw_power_cap 100% of the time"),
    "stalled": (stop_reporting, "no token progress"),
    "input": (starve_the_loader, "waiting for its next batch 30% of wall time (its client's data_wait_seconds)"),
    "idle": (idle_the_gpus, "GPUs 20% busy on average, no sampled signal explains it"),
}


def degraded_node(tmp_path, *faults) -> Node:
    """A node whose one job runs slowed from the start, sampled a while, then with ``faults`` applied."""
    node = Node(tmp_path, {"llama": ALL_GPUS})
    node.run(2)
    for cause in faults:
        FAULTS[cause][0](node)
    node.run(2)
    if "stalled" in faults:
        node.run(step=PAST_THE_WINDOW)  # no report for a whole window: a rate of 0
    return node


def lost_gpu_seconds(node, job="llama"):
    return {
        s.labels["cause"]: s.value
        for family in attribution_families(node.service.attribution.standings())
        for s in family.samples
        if s.name == "mfu_job_lost_gpu_seconds_total" and s.labels["training_job"] == job
    }


@pytest.mark.parametrize("cause", list(FAULTS))
def test_each_cause_from_the_sources(tmp_path, cause):
    found = degraded_node(tmp_path, cause).verdict()
    assert (found.cause, found.baseline) == (cause, demo.STEADY_MFU)
    assert FAULTS[cause][1] in found.evidence
    assert found.lost_fraction == pytest.approx(1.0 if cause == "stalled" else 1 - SLOWED, abs=0.02)


def test_no_fault_is_unknown_and_a_healthy_job_is_none(tmp_path):
    node = degraded_node(tmp_path)
    assert node.verdict().cause == "unknown"
    node.run(PAST_THE_WINDOW, speed=1.0)
    pause_ens3np0(node)
    node.run(2, speed=1.0)
    assert node.verdict().cause == "none"


@pytest.mark.parametrize("first", range(len(FAULTS)))
def test_overlapping_causes_resolve_by_precedence(tmp_path, first):
    present = list(FAULTS)[first:]  # this cause and every one below it, all at once
    assert degraded_node(tmp_path, *present).verdict().cause == present[0]


def test_lost_gpu_seconds_go_to_the_cause_of_each_second(tmp_path):
    node = degraded_node(tmp_path, "thermal")
    before = lost_gpu_seconds(node)
    node.nvml.gpus[5].clocks_event_reasons = 0
    pause_ens3np0(node)
    node.run(3)
    after = lost_gpu_seconds(node)
    assert after["thermal"] == before["thermal"] > 0
    assert after["network"] - before["network"] == pytest.approx(3 * demo.GPUS * (1 - SLOWED), rel=0.05)


SPLIT = {"a": ALL_GPUS[:4], "b": ALL_GPUS[4:]}


def test_a_paused_nic_blames_only_the_job_whose_gpus_it_serves(tmp_path):
    node = Node(tmp_path, SPLIT)
    node.place_gpus_beside_their_nics()
    node.run(2)
    node.fabric.nics[1].rx_pause_ratio = 0.45  # mlx5_1 (ens2np0), on NUMA node 0 with GPUs 0–3
    node.run(2)
    a, b = node.verdict("a"), node.verdict("b")
    assert a.cause == "network"
    assert a.evidence == (
        "ens2np0 paused 45% of the time on priority 3 (the switch paused it); nearest NIC of the job's GPU 0, 1, 2, 3"
    )
    assert b.cause == "unknown"


def test_without_pci_topology_every_nic_counts_and_the_evidence_says_so(tmp_path):
    node = Node(tmp_path, SPLIT)
    node.run(2)
    node.fabric.nics[1].rx_pause_ratio = 0.45
    node.run(2)
    for job, gpus in SPLIT.items():
        found = node.verdict(job)
        assert found.cause == "network"
        assert found.evidence.endswith(
            f"every NIC counts: no PCI topology places GPU {', '.join(map(str, gpus))} near an RDMA NIC"
        )


def test_a_job_with_every_gpu_counts_every_nic(tmp_path):
    node = degraded_node(tmp_path, "network")
    node.place_gpus_beside_their_nics()
    node.run(1)
    assert node.verdict().evidence.endswith("; every NIC counts: the job has all the node's GPUs")
