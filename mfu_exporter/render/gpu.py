"""The GPU source's sample (``mfu_exporter.sources.gpu.GpuSample``) as metric families: per GPU at the source's series
level, the node summaries at every level.

Table-driven: each per-GPU family is (name, help, reading key, the lowest series level it is on). A lost GPU keeps
only its identity, ``mfu_gpu_up`` 0, its health and its Xid counts.
"""

from __future__ import annotations

import operator
from typing import Callable, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.metrics_core import Metric

from mfu_exporter.config import SERIES_LEVELS, AttributionConfig
from mfu_exporter.model.evidence import POWER_REASONS, THERMAL_REASONS, throttled
from mfu_exporter.model.flops import gpu_model
from mfu_exporter.model.readings import GpuReading
from mfu_exporter.model.xid import HEALTH_STATES
from mfu_exporter.node.nvml_fields import THROTTLE_REASONS, THROTTLE_TIME
from mfu_exporter.sources.base import exports
from mfu_exporter.sources.gpu import GpuSample

# (family, help, reading key, the lowest series level it is on). standard keeps what a rule, dashboard panel or
# runbook step reads per GPU; the GPM activity figures, byte counters and ECC counts reach the dashboards as node
# summaries (NODE_MEANS, NODE_TOTALS) and are exported per GPU at full.
GAUGES = (
    (
        "mfu_gpu_utilization_ratio",
        "Share of the last NVML sample period (1/6 s to 1 s) in which a kernel ran; absent in MIG mode.",
        "utilization",
        "standard",
    ),
    (
        "mfu_gpu_memory_utilization_ratio",
        "Share of the last NVML sample period in which device memory was read or written.",
        "memory_utilization",
        "full",
    ),
    ("mfu_gpu_memory_used_bytes", "Device memory in use.", "memory_used_bytes", "standard"),
    ("mfu_gpu_memory_total_bytes", "Device memory installed.", "memory_total_bytes", "full"),
    ("mfu_gpu_sm_clock_hertz", "Current SM clock.", "sm_clock_hz", "standard"),
    ("mfu_gpu_sm_clock_max_hertz", "Maximum SM clock.", "sm_clock_max_hz", "standard"),
    ("mfu_gpu_power_watts", "Power draw.", "power_watts", "standard"),
    ("mfu_gpu_power_limit_watts", "Enforced power limit.", "power_limit_watts", "standard"),
    ("mfu_gpu_temperature_celsius", "GPU core temperature.", "temperature", "standard"),
    (
        "mfu_gpu_tensor_active_ratio",
        "Share of time the SMs issued any tensor-core instruction (NVML GPM ANY_TENSOR_UTIL; Hopper and newer).",
        "tensor_active",
        "standard",
    ),
    ("mfu_gpu_sm_active_ratio", "Share of SMs busy (NVML GPM SM_UTIL; Hopper and newer).", "sm_active", "full"),
    (
        "mfu_gpu_sm_occupancy_ratio",
        "Resident warps over the theoretical maximum (NVML GPM SM_OCCUPANCY; Hopper and newer).",
        "sm_occupancy",
        "full",
    ),
    (
        "mfu_gpu_dram_active_ratio",
        "Device memory bandwidth used over its maximum (NVML GPM DRAM_BW_UTIL; Hopper and newer).",
        "dram_active",
        "full",
    ),
    (
        "mfu_gpu_hardware_flops_utilization_ratio",
        "Estimate: tensor active × SM clock ÷ the SKU's reference tensor clock; a hardware cross-check of the formula MFU.",
        "hardware_flops_utilization",
        "full",
    ),
)
COUNTERS = (
    ("mfu_gpu_energy_joules", "Energy used by the GPU since the driver loaded.", "energy_joules", "full"),
    ("mfu_gpu_nvlink_transmit_bytes", "NVLink data bytes sent, all links.", "nvlink_transmit_bytes", "full"),
    ("mfu_gpu_nvlink_receive_bytes", "NVLink data bytes received, all links.", "nvlink_receive_bytes", "full"),
    ("mfu_gpu_pcie_transmit_bytes", "PCIe bytes sent by the GPU.", "pcie_transmit_bytes", "full"),
    ("mfu_gpu_pcie_receive_bytes", "PCIe bytes received by the GPU.", "pcie_receive_bytes", "full"),
    # Standard: one series per GPU (summed over links and kinds), read by MfuGpuNvlinkErrors in the node tier.
    (
        "mfu_gpu_nvlink_errors",
        "NVLink CRC (flit and data), replay and recovery errors, summed over the GPU's links (NVML's counters).",
        "nvlink_errors",
        "standard",
    ),
)
# The other per-GPU families and their levels (the throttle reasons reach rules and dashboards as the node's count
# of throttled GPUs by cause; the peak table is the same for every GPU of a model and is in mfu_job_peak_flops).
FAMILY_LEVELS = {
    "mfu_gpu": "minimal",
    "mfu_gpu_up": "minimal",
    # Five series a GPU, one per state: what a rule pages on (MfuGpuResetRequired...) at every level, as the loss.
    "mfu_gpu_health": "minimal",
    "mfu_gpu_xid_errors": "standard",
    "mfu_gpu_throttle_active": "full",
    "mfu_gpu_throttle_seconds": "standard",  # four reasons per GPU: how long each held the clock down
    "mfu_gpu_ecc_errors": "full",
    "mfu_gpu_peak_flops": "full",
    "mfu_exporter_driver": "minimal",
}

# Node summaries (derived: computed here from the readings above, at every level). Means over the GPUs that are up
# and report the figure; byte and ECC totals as counters kept monotonic while GPUs come and go (node.counters.Totals).
NODE_MEANS = (
    ("mfu_node_gpu_utilization_ratio", "Mean of mfu_gpu_utilization_ratio over the node's GPUs.", "utilization"),
    ("mfu_node_gpu_tensor_active_ratio", "Mean GPM tensor activity over the node's GPUs.", "tensor_active"),
    ("mfu_node_gpu_sm_active_ratio", "Mean GPM SM activity over the node's GPUs.", "sm_active"),
    ("mfu_node_gpu_sm_occupancy_ratio", "Mean GPM SM occupancy over the node's GPUs.", "sm_occupancy"),
    ("mfu_node_gpu_dram_active_ratio", "Mean GPM DRAM bandwidth use over the node's GPUs.", "dram_active"),
    (
        "mfu_node_gpu_hardware_flops_utilization_ratio",
        "Mean hardware FLOPs estimate over the node's GPUs.",
        "hardware_flops_utilization",
    ),
    # The central rules compare it across a job's nodes: a node clocked below its peers holds the job back.
    ("mfu_node_gpu_sm_clock_hertz", "Mean SM clock over the node's GPUs.", "sm_clock_hz"),
)
NODE_TOTALS = (
    ("mfu_node_gpu_nvlink_transmit_bytes", "NVLink bytes sent by the node's GPUs.", "nvlink_transmit_bytes"),
    ("mfu_node_gpu_nvlink_receive_bytes", "NVLink bytes received by the node's GPUs.", "nvlink_receive_bytes"),
    ("mfu_node_gpu_pcie_transmit_bytes", "PCIe bytes sent by the node's GPUs.", "pcie_transmit_bytes"),
    ("mfu_node_gpu_pcie_receive_bytes", "PCIe bytes received by the node's GPUs.", "pcie_receive_bytes"),
)
# GPUs count once per cause, whichever of its reasons hold them (as the attribution counts them).
THROTTLE_CAUSES = (("thermal", THERMAL_REASONS), ("power", POWER_REASONS))
# The share of a sample's interval a reason must hold a GPU down for the GPU to count in mfu_node_gpus_throttled: the
# attribution's default (attribution.throttle_ratio), so the cluster rules count the GPUs a node's attribution blames.
THROTTLE_SHARE = AttributionConfig().throttle_ratio


class _Labels:
    """The label tuples of one GPU's series: 3 to 8 µs to build, so a service's ``GpuRenderer`` keeps them per GPU."""

    def __init__(self, index: int, name: str):
        label = str(index)
        self.gpu = (label,)
        self.health = tuple((state, (label, state)) for state in HEALTH_STATES)
        self.throttle = tuple((label, reason) for reason, _ in THROTTLE_REASONS)
        self.throttle_time = {reason: (label, reason) for reason, _, _ in THROTTLE_TIME}
        self.ecc = ((label, "corrected"), (label, "uncorrected"))
        model = gpu_model(name)
        self.peak = tuple(((label, dtype), tflops * 1e12) for dtype, tflops in model.tflops.items()) if model else ()


_FIGURE = {key: operator.attrgetter(key) for _, _, key, _ in (*GAUGES, *COUNTERS)}


class _Tables:
    """The per-GPU families of one series level, chosen once per level."""

    def __init__(self, series: str):
        self.gauges = tuple((name, text, _FIGURE[key]) for name, text, key, level in GAUGES if exports(series, level))
        self.counters = tuple(
            (name, text, _FIGURE[key]) for name, text, key, level in COUNTERS if exports(series, level)
        )
        self.on = frozenset(name for name, level in FAMILY_LEVELS.items() if exports(series, level))


_TABLES = {series: _Tables(series) for series in SERIES_LEVELS}  # built at import, never changed


class GpuRenderer:
    """``gpu_families`` with each GPU's label tuples kept from one sample to the next, by its index and model: one
    per service (``render.snapshots.renderers``), bounded."""

    MAX_GPUS = 1024  # GPUs whose labels are kept; a node has at most a few dozen, MIG instances included

    def __init__(self) -> None:
        self._labels: dict[tuple[int, str], _Labels] = {}

    def families(self, sample: GpuSample) -> Iterable[Metric]:
        return gpu_families(sample, self._labels_of)

    def _labels_of(self, index: int, name: str) -> _Labels:
        labels = self._labels.get((index, name))
        if labels is None:
            if len(self._labels) >= self.MAX_GPUS:
                self._labels.clear()  # GPUs come and go rarely; starting over costs one render
            labels = self._labels[(index, name)] = _Labels(index, name)
        return labels


def gpu_families(sample: GpuSample, labels_of: Callable[[int, str], _Labels] = _Labels) -> Iterable[Metric]:
    """Metric families of one GPU sample; ``labels_of`` gives a GPU's label tuples (built afresh by default)."""
    tables = _TABLES[sample.series]
    on = tables.on
    gpu_label = ["gpu"]
    info = InfoMetricFamily("mfu_gpu", "Identity of each GPU NVML has shown this exporter.", labels=gpu_label)
    up = GaugeMetricFamily("mfu_gpu_up", "1 while the GPU answers NVML, 0 once it is lost.", labels=gpu_label)
    gauges = [(GaugeMetricFamily(name, text, labels=gpu_label), figure) for name, text, figure in tables.gauges]
    counters = [(CounterMetricFamily(name, text, labels=gpu_label), figure) for name, text, figure in tables.counters]
    health = GaugeMetricFamily(
        "mfu_gpu_health",
        "1 for the GPU's health state now, 0 for the others: what its Xids and NVML's conditions ask of a person "
        "(docs/metrics.md, GPU health).",
        labels=["gpu", "state"],
    )
    throttle = GaugeMetricFamily(
        "mfu_gpu_throttle_active", "1 while this clock-event reason holds the SM clock down.", labels=["gpu", "reason"]
    )
    throttle_time = CounterMetricFamily(
        "mfu_gpu_throttle_seconds",
        "Time this reason held the SM clock down: NVML's counter since the driver loaded where the driver has it, "
        "else the clock-event bit integrated over the exporter's samples since it started.",
        labels=["gpu", "reason"],
    )
    xid = CounterMetricFamily(
        "mfu_gpu_xid_errors", "Xid errors NVML reported for the GPU since the exporter started.", labels=["gpu", "xid"]
    )
    ecc = CounterMetricFamily(
        "mfu_gpu_ecc_errors", "ECC memory errors since the driver loaded.", labels=["gpu", "kind"]
    )
    peak = GaugeMetricFamily(
        "mfu_gpu_peak_flops",
        "Dense tensor peak FLOP/s of the GPU's model for each dtype (the peak table).",
        labels=["gpu", "dtype"],
    )
    with_throttle, with_xid = "mfu_gpu_throttle_active" in on, "mfu_gpu_xid_errors" in on
    with_ecc, with_peak = "mfu_gpu_ecc_errors" in on, "mfu_gpu_peak_flops" in on
    with_throttle_time = "mfu_gpu_throttle_seconds" in on
    for reading in sample.gpus.values():
        labels = labels_of(reading.index, reading.name)
        info.add_metric(labels.gpu, {"uuid": reading.uuid, "name": reading.name, "pci_bus_id": reading.pci_bus_id})
        up.add_metric(labels.gpu, 1.0 if reading.up else 0.0)
        for state, state_labels in labels.health:
            health.add_metric(state_labels, 1.0 if state == reading.health else 0.0)
        if with_xid:
            for code, count in reading.xids:
                xid.add_metric((labels.gpu[0], str(code)), float(count))
        if not reading.up:
            continue
        for family, figure in gauges:
            value = figure(reading)
            if value is not None:
                family.add_metric(labels.gpu, value)
        for family, figure in counters:
            value = figure(reading)
            if value is not None:
                family.add_metric(labels.gpu, value)
        mask = reading.clocks_event_reasons
        if with_throttle and mask is not None:
            for reason_labels, (_, bit) in zip(labels.throttle, THROTTLE_REASONS):
                throttle.add_metric(reason_labels, 1.0 if mask & bit else 0.0)
        if with_throttle_time:
            for reason, seconds in reading.throttle_seconds:
                throttle_time.add_metric(labels.throttle_time[reason], seconds)
        if with_ecc:
            for kind_labels, value in zip(labels.ecc, (reading.ecc_corrected, reading.ecc_uncorrected)):
                if value is not None:
                    ecc.add_metric(kind_labels, value)
        if with_peak:
            for dtype_labels, flops in labels.peak:
                peak.add_metric(dtype_labels, flops)
    yield info
    yield up
    yield health
    for family, _ in gauges:
        yield family
    for family, _ in counters:
        yield family
    for family in (throttle, throttle_time, xid, ecc, peak):
        if family.name in on:
            yield family
    yield from _summaries(sample)
    if sample.driver is not None:
        driver_info = InfoMetricFamily("mfu_exporter_driver", "NVIDIA driver and the CUDA version it supports.")
        driver_info.add_metric([], {"driver_version": sample.driver[0], "cuda_driver_version": sample.driver[1]})
        yield driver_info


def _summaries(sample: GpuSample) -> Iterable[Metric]:
    """The node summaries: GPUs lost and throttled, means over the GPUs up that report each figure, and the
    totals the source keeps monotonic while GPUs come and go."""
    readings = sample.gpus.values()
    up: list[GpuReading] = [reading for reading in readings if reading.up]
    lost = GaugeMetricFamily("mfu_node_gpus_lost", "GPUs of the node that stopped answering NVML.")
    lost.add_metric([], len(readings) - len(up))
    yield lost
    held = GaugeMetricFamily(
        "mfu_node_gpus_throttled",
        "GPUs of the node a thermal or power reason held down over the last sample interval (at least "
        f"{100 * THROTTLE_SHARE:g}% of it, from NVML's throttle-time counters; the clock-event state for a reason "
        "without one), by cause.",
        labels=["cause"],
    )
    for cause, reasons in THROTTLE_CAUSES:
        held.add_metric([cause], float(sum(1 for r in up if throttled(r, reasons, THROTTLE_SHARE))))
    yield held
    for name, text, key in NODE_MEANS:
        values = [value for r in up if (value := getattr(r, key)) is not None]
        if values:
            mean = GaugeMetricFamily(name, text)
            mean.add_metric([], sum(values) / len(values))
            yield mean
    totals = sample.totals
    for name, text, key in NODE_TOTALS:
        if key in totals:
            total = CounterMetricFamily(name, text)
            total.add_metric([], totals[key])
            yield total
    ecc_kinds = [kind for kind in ("corrected", "uncorrected") if f"ecc_{kind}" in totals]
    if ecc_kinds:
        ecc = CounterMetricFamily(
            "mfu_node_gpu_ecc_errors", "ECC memory errors of the node's GPUs, by kind.", labels=["kind"]
        )
        for kind in ecc_kinds:
            ecc.add_metric([kind], totals[f"ecc_{kind}"])
        yield ecc
