"""The series levels (``sources.<name>.series``, ``sources.rdma.hw_counters``) and the node summaries the sources
derive from their own readings (``mfu_node_*``): what each level exports, and that the summaries add up, survive a
lost device and a counter reset, and take the busiest port's rate over their window."""

from __future__ import annotations

import pytest

from mfu_exporter.config import ConfigError, validate
from mfu_exporter.node.counters import Totals, WindowedRates
from mfu_exporter.sim import nvml as fake
from mfu_exporter.sim.mlx5 import hw_counters, port_counters
from mfu_exporter.sim.sysfs import FakeSysfs
from mfu_exporter.sources.gpu import GpuSource
from mfu_exporter.sources.rdma import RdmaSource
from tests.support.expo import snapshot_samples, snapshot_value
from tests.support.sources import Clock


def names(snapshot) -> set[str]:
    return {name for name, _ in snapshot_samples(snapshot)}


# --- the counters behind the summaries ---------------------------------------------------------------------------


def test_totals_add_increases_and_keep_counting_across_a_reset_and_a_lost_device():
    totals = Totals()
    totals.add_reading("gpu0", "bytes", 100)
    totals.add_reading("gpu1", "bytes", 500)
    assert totals.totals["bytes"] == 0  # first readings: counted from the exporter's start
    totals.add_reading("gpu0", "bytes", 130)
    totals.add_reading("gpu1", "bytes", 520)
    assert totals.totals["bytes"] == 50
    totals.add_reading("gpu0", "bytes", 10)  # reset (driver reload): counted from 0 again
    assert totals.totals["bytes"] == 60
    # gpu1 lost: no reading, and the total does not drop (a plain sum would fall by 520)
    totals.add_reading("gpu0", "bytes", 15)
    assert totals.totals["bytes"] == 65


def test_windowed_rates_give_the_busiest_counter_over_the_window_only():
    window = WindowedRates(window=10.0)
    assert window.max_rate() is None
    window.add(0.0, {})
    window.add(1.0, {"a": 5, "b": 1})
    assert window.max_rate() == 5.0
    for second in range(2, 31):
        window.add(float(second), {"a": 0, "b": 2})  # a goes quiet, b keeps 2/s
    assert window.max_rate() == pytest.approx(2.0)  # a's burst left the window


# --- the GPU source ----------------------------------------------------------------------------------------------


def gpu_node(series: str) -> tuple[fake.FakeNvml, GpuSource, Clock]:
    nvml = fake.node(fake.h100, count=4)
    clock = Clock(1000.0)
    return nvml, GpuSource(nvml, monotonic=clock, series=series), clock


def tick(nvml, source, clock):
    nvml.advance(1.0)
    clock.now += 1.0
    return source.sample()


def test_gpu_node_summaries_count_lost_and_throttled_gpus_by_cause():
    nvml, source, clock = gpu_node("standard")
    tick(nvml, source, clock)
    nvml.gpus[0].clocks_event_reasons = 0x40 | 0x20  # both thermal slowdowns: one GPU
    nvml.gpus[1].clocks_event_reasons = 0x4  # power cap
    nvml.lose(3)
    snapshot = tick(nvml, source, clock)
    assert snapshot_value(snapshot, "mfu_node_gpus_lost") == 1
    assert snapshot_value(snapshot, "mfu_node_gpus_throttled", cause="thermal") == 1
    assert snapshot_value(snapshot, "mfu_node_gpus_throttled", cause="power") == 1
    utilizations = [snapshot_value(snapshot, "mfu_gpu_utilization_ratio", gpu=str(i)) for i in range(3)]
    assert snapshot_value(snapshot, "mfu_node_gpu_utilization_ratio") == pytest.approx(sum(utilizations) / 3)


def test_a_gpu_held_down_between_two_samples_counts_as_throttled():
    """At 5 s sampling, a 2 s thermal episode that ended before the sample is 40% of the interval: the GPU counts,
    as the attribution blames it. A GPU whose driver lacks the throttle-time fields counts by its state only."""
    nvml, source, clock = gpu_node("standard")
    nvml.gpus[1].fields -= set(fake.THROTTLE_FIELDS)
    source.sample()
    for gpu in nvml.gpus[:2]:
        gpu.clocks_event_reasons = 0x40
    nvml.advance(2.0)
    for gpu in nvml.gpus[:2]:
        gpu.clocks_event_reasons = 0
    nvml.advance(3.0)
    clock.now += 5.0
    snapshot = source.sample()
    assert snapshot_value(snapshot, "mfu_node_gpus_throttled", cause="thermal") == 1  # GPU 0: its counter grew
    nvml.gpus[1].clocks_event_reasons = 0x40
    nvml.advance(5.0)
    clock.now += 5.0
    snapshot = source.sample()
    assert snapshot_value(snapshot, "mfu_node_gpus_throttled", cause="thermal") == 1  # GPU 1: its state now


def test_gpu_byte_totals_do_not_drop_when_a_gpu_is_lost():
    nvml, source, clock = gpu_node("standard")
    for gpu in nvml.gpus:
        gpu.nvlink_tx_rate = 100e9
    for _ in range(3):
        before = snapshot_value(tick(nvml, source, clock), "mfu_node_gpu_nvlink_transmit_bytes_total")
    nvml.lose(0)
    after = snapshot_value(tick(nvml, source, clock), "mfu_node_gpu_nvlink_transmit_bytes_total")
    assert before > 0 and after >= before


@pytest.mark.parametrize(
    "series, present, absent",
    [
        ("minimal", {"mfu_gpu_up", "mfu_node_gpus_lost"}, {"mfu_gpu_utilization_ratio", "mfu_gpu_throttle_active"}),
        (
            "standard",
            {"mfu_gpu_utilization_ratio", "mfu_gpu_temperature_celsius", "mfu_node_gpu_sm_active_ratio"},
            {"mfu_gpu_sm_active_ratio", "mfu_gpu_throttle_active", "mfu_gpu_peak_flops", "mfu_gpu_ecc_errors_total"},
        ),
        ("full", {"mfu_gpu_sm_active_ratio", "mfu_gpu_throttle_active", "mfu_gpu_peak_flops"}, set()),
    ],
)
def test_gpu_families_follow_the_series_level(series, present, absent):
    nvml, source, clock = gpu_node(series)
    tick(nvml, source, clock)
    exported = names(tick(nvml, source, clock))
    assert present <= exported, present - exported
    assert not absent & exported, absent & exported


# --- the RDMA source ---------------------------------------------------------------------------------------------


def rdma_node(tmp_path, **source_kwargs):
    sysfs = FakeSysfs(tmp_path / "sys")
    for index in range(2):
        sysfs.add_rdma_device(f"mlx5_{index}", f"0000:0{index}:00.0")
        sysfs.add_rdma_port(
            f"mlx5_{index}", 1, netdev=f"ens{index}np0", counters=port_counters(), hw_counters=hw_counters()
        )
    clock = Clock(0.0)
    return sysfs, RdmaSource(str(tmp_path / "sys"), clock=clock, **source_kwargs), clock


def test_rdma_errors_are_summed_over_ports_and_the_busiest_ports_cnps_taken(tmp_path):
    sysfs, source, clock = rdma_node(tmp_path, series="standard", hw_counters=["rp_cnp_ignored"])
    first = source.sample()
    assert snapshot_value(first, "mfu_node_rdma_errors_total", counter="link_downed") == 0
    assert snapshot_value(first, "mfu_node_rdma_max_cnps_per_second") is None  # no window yet
    sysfs.write_counters("mlx5_0", 1, {"link_downed": 1})
    sysfs.write_counters("mlx5_1", 1, {"link_downed": 2})
    sysfs.write_counters("mlx5_0", 1, {"np_cnp_sent": 300, "rp_cnp_handled": 100}, directory="hw_counters")
    sysfs.write_counters("mlx5_1", 1, {"np_cnp_sent": 50}, directory="hw_counters")
    clock.now = 2.0
    second = source.sample()
    assert snapshot_value(second, "mfu_node_rdma_errors_total", counter="link_downed") == 3
    assert snapshot_value(second, "mfu_node_rdma_max_cnps_per_second") == 200.0  # (300 + 100) / 2 s on mlx5_0
    # Per port at standard: only the allow-listed hw_counters file; the PMA counters at full.
    hw = {dict(labels)["counter"] for name, labels in snapshot_samples(second) if name == "mfu_rdma_hw_counters_total"}
    assert hw == {"rp_cnp_ignored"}
    assert "mfu_rdma_port_counters_total" not in names(second)


def test_rdma_full_exports_every_file_whatever_the_allow_list(tmp_path):
    _, source, _ = rdma_node(tmp_path, series="full", hw_counters=["rp_cnp_ignored"])
    snapshot = source.sample()
    hw = {
        dict(labels)["counter"] for name, labels in snapshot_samples(snapshot) if name == "mfu_rdma_hw_counters_total"
    }
    assert hw == set(hw_counters()) - {"lifespan"}
    assert "mfu_rdma_port_counters_total" in names(snapshot)


def test_rdma_minimal_keeps_port_state_and_the_summaries(tmp_path):
    _, source, _ = rdma_node(tmp_path, series="minimal", hw_counters=["rp_cnp_ignored"])
    exported = names(source.sample())
    assert exported == {"mfu_rdma_port_up", "mfu_node_rdma_errors_total"}


# --- the config --------------------------------------------------------------------------------------------------


def test_series_is_a_key_of_every_source_defaulting_to_standard():
    config = validate({})
    for name in ("gpu", "rdma", "ethtool", "checkpoint", "logs", "preflight"):
        assert config["sources"][name]["series"] == "standard", name
    assert "rp_cnp_ignored" in config["sources"]["rdma"]["hw_counters"]


@pytest.mark.parametrize(
    "raw, key, expected",
    [
        (
            {"sources": {"ethtool": {"series": "everything"}}},
            "sources.ethtool.series",
            "one of minimal, standard, full",
        ),
        ({"sources": {"rdma": {"hw_counters": "np_cnp_sent"}}}, "sources.rdma.hw_counters", "a list of non-empty"),
    ],
)
def test_a_bad_series_key_names_file_key_and_form(raw, key, expected):
    with pytest.raises(ConfigError) as caught:
        validate(raw, "node.yaml")
    assert str(caught.value).startswith(f"node.yaml: {key}: expected {expected}")
