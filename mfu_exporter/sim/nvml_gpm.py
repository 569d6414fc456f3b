"""The fake NVML's GPM (``nvmlGpm*``): samples allocated and freed, each taken from its GPU's ``FakeGpu.gpm`` table
and byte rates, and the metrics of two samples of one GPU; ``NOT_SUPPORTED`` for a metric the GPU lacks, the code in
``FakeGpu.gpm_errors`` for one that fails. A mixin of ``mfu_exporter.sim.nvml.FakeNvml``."""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import pynvml
from pynvml import NVMLError

from mfu_exporter.sim.nvml_fields import MIB

if TYPE_CHECKING:
    from mfu_exporter.sim.nvml import FakeGpu

# GPM rate metrics in MiB/s, derived from the GPU's byte rates.
GPM_RATES = {20: "pcie_tx_rate", 21: "pcie_rx_rate", 60: "nvlink_rx_rate", 61: "nvlink_tx_rate"}


@dataclass
class GpmSample:
    buffer: Any  # keeps the memory the sample pointer points at alive
    gpu: FakeGpu | None = None
    values: dict[int, float] | None = None


class FakeGpm:
    """The GPM functions of the fake NVML, on its GPU table, its call gate and its lock."""

    _samples: dict[int, GpmSample]
    _lock: threading.Lock

    # FakeNvml's call gate: counts the call, applies hangs and failures, returns the handle's GPU.
    _enter: Callable[..., Any]

    def nvmlGpmQueryDeviceSupport(self, handle: Any) -> pynvml.c_nvmlGpmSupport_t:
        gpu = self._enter("nvmlGpmQueryDeviceSupport", handle)
        return pynvml.c_nvmlGpmSupport_t(
            version=pynvml.NVML_GPM_SUPPORT_VERSION, isSupportedDevice=int(gpu.gpm_supported)
        )

    def nvmlGpmSampleAlloc(self) -> Any:
        self._enter("nvmlGpmSampleAlloc")
        buffer = ctypes.create_string_buffer(8)
        pointer = ctypes.cast(buffer, pynvml.c_nvmlGpmSample_t)
        with self._lock:
            self._samples[ctypes.addressof(buffer)] = GpmSample(buffer)
        return pointer

    def _sample(self, pointer: Any) -> GpmSample:
        sample = self._samples.get(ctypes.cast(pointer, ctypes.c_void_p).value or 0)
        if sample is None:
            raise NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return sample

    def nvmlGpmSampleFree(self, pointer: Any) -> None:
        self._enter("nvmlGpmSampleFree")
        self._sample(pointer)
        with self._lock:
            del self._samples[ctypes.cast(pointer, ctypes.c_void_p).value]

    def nvmlGpmSampleGet(self, handle: Any, pointer: Any) -> Any:
        gpu = self._enter("nvmlGpmSampleGet", handle)
        if not gpu.gpm_supported or gpu.mig_mode:
            raise NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        sample = self._sample(pointer)
        sample.gpu = gpu
        sample.values = dict(gpu.gpm)
        for metric_id, attribute in GPM_RATES.items():
            sample.values[metric_id] = getattr(gpu, attribute) / MIB
        return pointer

    def nvmlGpmMetricsGet(self, request: Any) -> Any:
        self._enter("nvmlGpmMetricsGet")
        if request.version != pynvml.NVML_GPM_METRICS_GET_VERSION:
            raise NVMLError(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        if not 0 < request.numMetrics <= pynvml.NVML_GPM_METRIC_MAX:
            raise NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        first, second = self._sample(request.sample1), self._sample(request.sample2)
        if first is second or first.gpu is None or first.gpu is not second.gpu:
            raise NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        for j in range(request.numMetrics):
            metric = request.metrics[j]
            if metric.metricId in second.gpu.gpm_errors:
                metric.value = 0.0
                metric.nvmlReturn = second.gpu.gpm_errors[metric.metricId]
            elif metric.metricId in second.values:
                metric.value = second.values[metric.metricId]
                metric.nvmlReturn = pynvml.NVML_SUCCESS
            else:
                metric.value = 0.0
                metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return request
