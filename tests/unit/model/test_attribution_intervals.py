"""The loss attribution at the sources' 5 s default interval: it reads time shares from the counters over each
interval, so what happened between two samples counts in full, whatever the state at either sample; and a cause
holds for intervals of its sources, not a fixed second.

The real GPU source over the fake NVML and the real ethtool source over a simulated ConnectX node, each sampled every
5 s on a simulated clock; the Attributor evaluated each second on their latest readings, as the daemon's tick does.
"""

from pathlib import Path

import pytest

from mfu_exporter.model.attribution import Attributor, NodeSignals
from mfu_exporter.model.job_view import JobView
from mfu_exporter.node.ethtool import EthtoolTextReader
from mfu_exporter.node.nvml_fields import THROTTLE_REASONS
from mfu_exporter.sim import node as demo
from mfu_exporter.sim import nvml as fake_nvml
from mfu_exporter.sim.mlx5 import SimulatedNode
from mfu_exporter.sources.ethtool import EthtoolSample, EthtoolSource
from mfu_exporter.sources.gpu import GpuSample, GpuSource

INTERVAL = 5.0  # sources.gpu/.rdma/.ethtool's default
WINDOW = 15.0  # the job's MFU window
CLOCK_EVENT_BITS = dict(THROTTLE_REASONS)


def slowed_job() -> JobView:
    """A job reporting every second at 20% MFU against its expected 45%: a gap the attribution must explain."""
    return JobView(
        name="llama",
        tokens_total=1e6,
        step=1,
        last_report_time=0,
        tokens_per_second=1000.0,
        flops_per_token=1e12,
        gpus=8,
        peak_flops=8e15,
        mfu=0.2,
        eta_seconds=None,
        reason=None,
        facts={"expected_mfu": 0.45},
        restarts=0,
        gpu_indices=list(range(8)),
        cadence_seconds=1.0,
        window_seconds=WINDOW,
        stall_after_seconds=3.0,
    )


class Node:
    """Eight fake H100s and eight simulated RoCE NICs, their sources sampled every ``INTERVAL`` seconds."""

    def __init__(self, root: Path, interval: float = INTERVAL):
        self.now = 1_800_000_000.0
        self.interval = interval
        self.nvml = fake_nvml.node(fake_nvml.h100, count=8)
        for gpu in self.nvml.gpus:
            demo.train_healthily(gpu)
        self.fabric = SimulatedNode(root / "fabric", nics=8)
        self.gpu = GpuSource(self.nvml, interval=interval, monotonic=self.clock)
        reader = EthtoolTextReader.from_directory(str(self.fabric.ethtool_directory))
        self.ethtool = EthtoolSource(self.fabric.sysfs_root, reader=reader, interval=interval, clock=self.clock)
        self.attributor = Attributor()
        self.readings: tuple[GpuSample, EthtoolSample] | None = None
        self.sampled_at = self.now
        self.sample()

    def clock(self) -> float:
        return self.now

    def sample(self) -> None:
        self.readings = (self.gpu.sample().readings, self.ethtool.sample().readings)
        self.sampled_at = self.now

    def second(self) -> None:
        """One second passes: the hardware's counters grow, the sources sample when their interval is up, and the
        attribution evaluates on their latest readings."""
        self.now += 1.0
        self.nvml.advance(1.0)
        self.fabric.tick(1.0)
        if self.now - self.sampled_at >= self.interval:
            self.sample()
        assert self.readings is not None
        gpus, nics = self.readings
        signals = NodeSignals(gpus=gpus.gpus, interfaces=dict(nics.interfaces), interval=self.interval)
        self.attributor.evaluate(self.now, [slowed_job()], signals)

    def run(self, seconds: int) -> None:
        for _ in range(seconds):
            self.second()

    def verdict(self):
        return self.attributor.verdict("llama")


def test_a_2_s_full_pause_inside_a_5_s_interval_is_network(tmp_path):
    node = Node(tmp_path)
    nic = node.fabric.nics[2]  # ens3np0
    nic.rx_pause_ratio = 1.0  # the switch pauses it fully for 2 s, then not at all: no pause at either sample
    node.run(2)
    nic.rx_pause_ratio = 0.0
    node.run(3)
    assert node.sampled_at == node.now  # the ethtool source's second sample, 5 s after its first
    found = node.verdict()
    assert found.cause == "network"
    assert found.evidence.startswith("ens3np0 paused 40% of the time on priority 3 (the switch paused it)")


def test_a_throttle_episode_between_two_samples_is_counted_in_full(tmp_path):
    node = Node(tmp_path)
    gpu = node.nvml.gpus[5]
    node.run(1)
    # 3 s held down for heat between the samples, hot then cool again by the second sample.
    gpu.clocks_event_reasons, gpu.temperature_c = CLOCK_EVENT_BITS["hw_thermal_slowdown"], 91
    node.run(3)
    gpu.clocks_event_reasons, gpu.temperature_c = 0, 68
    node.run(1)
    assert node.sampled_at == node.now
    gpus, _ = node.readings
    reading = gpus.gpus[5]
    assert reading.throttle_reasons == ()  # neither sample saw the state
    assert dict(reading.throttle_seconds)["hw_thermal_slowdown"] == pytest.approx(3.0)
    assert dict(reading.throttle_ratio)["hw_thermal_slowdown"] == pytest.approx(0.6)
    found = node.verdict()
    assert found.cause == "thermal"
    assert found.evidence == "GPU 5 throttled: hw_thermal_slowdown 60% of the time at 68 °C"  # the temperature now


def test_a_short_throttle_under_the_threshold_is_not_a_cause(tmp_path):
    """Under ``attribution.throttle_ratio`` (5 %) of the interval, a reason is noise, as a short pause is."""
    node = Node(tmp_path, interval=30.0)
    gpu = node.nvml.gpus[1]
    node.run(1)
    gpu.clocks_event_reasons = CLOCK_EVENT_BITS["sw_power_cap"]  # 1 s of a 30 s interval: 3 %
    node.run(1)
    gpu.clocks_event_reasons = 0
    node.run(28)
    assert node.sampled_at == node.now
    assert dict(node.readings[0].gpus[1].throttle_ratio)["sw_power_cap"] == pytest.approx(1 / 30)
    assert node.verdict().cause == "unknown"


@pytest.mark.parametrize("interval", [1.0, INTERVAL])
def test_a_cleared_cause_holds_for_the_window_and_two_sampling_intervals(tmp_path, interval):
    """A cause is seen until the next sample, up to an interval after the seconds it slowed: it holds one MFU
    window and two of its sources' intervals after its signal was last seen, then the gap is unknown."""
    node = Node(tmp_path, interval=interval)
    node.nvml.gpus[5].clocks_event_reasons = CLOCK_EVENT_BITS["hw_thermal_slowdown"]
    node.run(int(interval))
    node.nvml.gpus[5].clocks_event_reasons = 0
    node.run(int(interval) - 1)
    assert node.verdict().cause == "thermal"
    last_seen = node.now
    node.run(1)  # the next sample: no throttle time grew
    assert "cleared" in node.verdict().evidence
    hold = WINDOW + 2 * interval
    node.run(int(last_seen + hold - node.now))
    assert node.verdict().cause == "thermal"
    node.run(1)
    assert node.verdict().cause == "unknown"
