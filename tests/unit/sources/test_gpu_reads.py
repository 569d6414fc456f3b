"""The GPU source makes the optional NVML calls only at the series levels whose families use their figures
(``READ_LEVELS``): held to mfu_exporter.render.gpu's tables, and counted on the fake NVML."""

from __future__ import annotations

from mfu_exporter.render import gpu as render_gpu
from mfu_exporter.sim import nvml as fake
from mfu_exporter.sources.base import exports
from mfu_exporter.sources.gpu import READ_LEVELS, GpuSource
from tests.support.expo import snapshot_samples

# What each optional call feeds: the per-GPU families of render/gpu.py, by family name.
FEEDS = {
    "memory": ("mfu_gpu_memory_used_bytes", "mfu_gpu_memory_total_bytes", "mfu_gpu_memory_utilization_ratio"),
    "power": ("mfu_gpu_power_watts", "mfu_gpu_power_limit_watts"),
    "temperature": ("mfu_gpu_temperature_celsius",),
    "energy": ("mfu_gpu_energy_joules",),
    "nvlink_errors": ("mfu_gpu_nvlink_errors",),
}
# The memory utilization comes with the utilization call, not the memory one: made at every level.
FED_BY_OTHER_CALLS = {"mfu_gpu_memory_utilization_ratio"}


def family_levels() -> dict[str, str]:
    levels = {name: level for name, _, _, level in (*render_gpu.GAUGES, *render_gpu.COUNTERS)}
    return {**levels, **render_gpu.FAMILY_LEVELS}


def test_each_optional_call_is_made_from_the_lowest_level_that_exports_its_figures():
    levels = family_levels()
    for call, families in FEEDS.items():
        fed = [levels[name] for name in families if name not in FED_BY_OTHER_CALLS]
        lowest = min(fed, key=lambda level: ("minimal", "standard", "full").index(level))
        assert READ_LEVELS[call] == lowest, call


def test_minimal_skips_the_calls_and_fields_of_families_it_does_not_export():
    counts = {}
    for series in ("minimal", "standard", "full"):
        nvml = fake.node(fake.h100, count=2)
        asked = []
        get_fields = nvml.nvmlDeviceGetFieldValues
        nvml.nvmlDeviceGetFieldValues = lambda handle, ids: asked.append(len(ids)) or get_fields(handle, ids)
        now = [1000.0]
        source = GpuSource(nvml, series=series, monotonic=lambda: now[0])
        source.sample()
        nvml.calls.clear()
        asked.clear()
        now[0] += 1.0
        snapshot = source.sample()
        counts[series] = (dict(nvml.calls), max(asked))
        exported = {name for name, _ in snapshot_samples(snapshot)}
        for families in FEEDS.values():
            for family in families:
                if exports(series, family_levels()[family]):  # every family the level exports still has its figure
                    assert any(name.startswith(family) for name in exported), (series, family)
    minimal, standard, full = (counts[s][0] for s in ("minimal", "standard", "full"))
    for call in ("nvmlDeviceGetMemoryInfo", "nvmlDeviceGetPowerUsage", "nvmlDeviceGetTemperature"):
        assert call not in minimal and standard[call] == 2
    assert "nvmlDeviceGetTotalEnergyConsumption" not in standard and full["nvmlDeviceGetTotalEnergyConsumption"] == 2
    # 18 NVLink links x 4 error counters are asked only where they are exported; the 4 throttle-time fields at every
    # level, since the attribution reads their growth over each interval.
    assert counts["minimal"][1] + 18 * 4 == counts["standard"][1] == counts["full"][1]
    # What every level needs: the node summaries' figures, the attribution's throttle reasons, Xid events, GPM.
    for call in ("nvmlDeviceGetUtilizationRates", "nvmlDeviceGetCurrentClocksEventReasons", "nvmlGpmMetricsGet"):
        assert minimal[call] == 2
