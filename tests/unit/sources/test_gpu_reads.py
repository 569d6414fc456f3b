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
    counts, fields = {}, {}
    for series in ("minimal", "standard", "full"):
        nvml = fake.node(fake.h100, count=2)
        asked: list[list[int]] = []
        get_fields = nvml.nvmlDeviceGetFieldValues
        nvml.nvmlDeviceGetFieldValues = lambda handle, ids: asked.append([i for i, _ in ids]) or get_fields(handle, ids)
        now = [1000.0]
        source = GpuSource(nvml, series=series, monotonic=lambda: now[0])
        source.sample()
        nvml.calls.clear()
        asked.clear()
        now[0] += 1.0
        snapshot = source.sample()
        counts[series] = dict(nvml.calls)
        fields[series] = max(asked, key=len)
        exported = {name for name, _ in snapshot_samples(snapshot)}
        for families in FEEDS.values():
            for family in families:
                if exports(series, family_levels()[family]):  # every family the level exports still has its figure
                    assert any(name.startswith(family) for name in exported), (series, family)
    minimal, standard, full = (counts[s] for s in ("minimal", "standard", "full"))
    for call in ("nvmlDeviceGetMemoryInfo", "nvmlDeviceGetTemperature"):
        assert call not in minimal and standard[call] == 2
    # Power, its limit and energy are field values, asked only where their families are exported; the ECC counts
    # (the node totals) and the 4 throttle-time fields (the attribution reads their growth over each interval) at
    # every level; 18 NVLink links x 4 error counters where their family is.
    power, energy, ecc, throttle = {185, 190}, {83}, {3, 4}, {74, 269, 270, 271}
    assert not (power | energy) & set(fields["minimal"]) and (ecc | throttle) <= set(fields["minimal"])
    assert power <= set(fields["standard"]) and not energy & set(fields["standard"])
    assert energy <= set(fields["full"])
    assert len(fields["minimal"]) + 2 + 18 * 4 == len(fields["standard"]) == len(fields["full"]) - 1
    for level in (minimal, standard, full):
        assert level["nvmlDeviceGetFieldValues"] == 2  # one request per GPU and sample
        for call in ("nvmlDeviceGetPowerUsage", "nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetTotalEccErrors"):
            assert call not in level
    # What every level needs: the node summaries' figures, the attribution's throttle reasons, Xid events, GPM.
    for call in ("nvmlDeviceGetUtilizationRates", "nvmlDeviceGetCurrentClocksEventReasons", "nvmlGpmMetricsGet"):
        assert minimal[call] == 2
