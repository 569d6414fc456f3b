"""NVML GPU Performance Monitoring (GPM, Hopper and newer): the metrics read and one GPU's sample state.

A GPM metric is the difference of two samples taken more than ``MIN_GPM_INTERVAL`` apart; the reader keeps two
samples per GPU, swapped each cycle, and one request struct, all allocated once.
"""

from __future__ import annotations

from typing import Any

MIB = 1024 * 1024
# NVML docs: two GPM samples must be more than 100 ms apart, the hardware's internal refresh period.
MIN_GPM_INTERVAL = 0.1
# GPM metrics (nvml.h nvmlGpmMetricId_t), in percent: ANY_TENSOR_UTIL, SM_UTIL, SM_OCCUPANCY, DRAM_BW_UTIL.
GPM_ACTIVITY = (("tensor_active", 5), ("sm_active", 2), ("sm_occupancy", 3), ("dram_active", 10))
# GPM rates in MiB/s (PCIE_TX/RX_PER_SEC, NVLINK_TOTAL_TX/RX_PER_SEC), integrated into byte counters on GPUs
# whose NVML field values lack that counter or give it in 32 bits (the H200 answers 197/198 as UNSIGNED_INT).
GPM_RATES = {
    "pcie_transmit_bytes": 20,
    "pcie_receive_bytes": 21,
    "nvlink_transmit_bytes": 61,
    "nvlink_receive_bytes": 60,
}

GPM_NOT_SUPPORTED = "not supported by this GPU (NVML GPM needs Hopper or newer)"
GPM_MIG = "not read in MIG mode (GPM is per GPU instance there; per-instance metrics are not implemented)"
GPM_OFF = "off (sources.gpu.gpm is false)"


class Gpm:
    """One GPU's GPM state: two samples swapped each cycle and one request struct, all allocated once."""

    def __init__(self, nvml: Any, previous: Any, current: Any, taken_at: float):
        self.previous = previous
        self.current = current
        self.taken_at = taken_at
        self.request = nvml.c_nvmlGpmMetricsGet_t()
        self.request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        self.keys: tuple[str, ...] = ()
        self.ratios: dict[str, float] = {}

    def request_metrics(self, metrics: list[tuple[str, int]]) -> None:
        # Only the IDs wanted: numMetrics is the count requested, never NVML_GPM_METRIC_MAX (older drivers reject it).
        self.keys = tuple(key for key, _ in metrics)
        self.request.numMetrics = len(metrics)
        for slot, (_, metric_id) in enumerate(metrics):
            self.request.metrics[slot].metricId = metric_id
        self.ratios = {k: v for k, v in self.ratios.items() if k in self.keys}
