"""NVML Xid events (critical errors the driver reports per GPU): one event set per GPU, drained without waiting
every cycle; counted per Xid since the reader started."""

from __future__ import annotations

import logging

from mfu_exporter.node.nvml_calls import GpuState, NvmlCalls

log = logging.getLogger(__name__)

# Bounds the Xid drain per GPU and cycle; the rest stay queued in NVML for the next cycle.
MAX_XIDS_PER_CYCLE = 64


class XidEvents(NvmlCalls):
    """Registers each GPU for Xid events and drains them through the NVML gate."""

    def _open_events(self, gpu: GpuState) -> None:
        nvml = self._nvml
        event_set = self._call(gpu, "xid_events", nvml.nvmlEventSetCreate)
        if event_set is None:
            return
        try:
            nvml.nvmlDeviceRegisterEvents(gpu.handle, nvml.nvmlEventTypeXidCriticalError, event_set)
        except nvml.NVMLError as exc:
            self._quietly(nvml.nvmlEventSetFree, event_set)
            self._refused(gpu, "xid_events", exc)
            return
        gpu.event_set = event_set

    def _poll_xids(self, gpu: GpuState) -> None:
        """Drain queued Xid events without waiting. A lost GPU's set is still drained: its last Xid (79) matters."""
        if gpu.event_set is None:
            return
        nvml = self._nvml
        for _ in range(MAX_XIDS_PER_CYCLE):
            try:
                event = nvml.nvmlEventSetWait(gpu.event_set, 0)
            except nvml.NVMLError as exc:
                if exc.value != nvml.NVML_ERROR_TIMEOUT and gpu.up:  # TIMEOUT: nothing queued
                    self._errors[self._reason(exc)] += 1
                return
            if event.eventType & nvml.nvmlEventTypeXidCriticalError:
                self._count_xid(gpu, int(event.eventData))

    def _count_xid(self, gpu: GpuState, xid: int) -> None:
        gpu.xids[xid] = gpu.xids.get(xid, 0) + 1
        gpu.xid_total += 1
        gpu.recent_xids.append(xid)
        gpu.xid_counts = tuple(sorted(gpu.xids.items()))
        log.warning("GPU %d (%s): Xid %d", gpu.index, gpu.uuid, xid)
