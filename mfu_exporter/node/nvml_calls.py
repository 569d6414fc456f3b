"""The per-GPU state an NVML reader keeps, and its gate for NVML calls (what nvitop calls ``nvmlQuery``).

Every call goes through ``_call``: a call NVML answers NOT_SUPPORTED, FUNCTION_NOT_FOUND or NO_PERMISSION is
remembered per GPU and not made again; an error that means the GPU is lost is raised for the reader to mark it down;
any other error is counted by a bounded reason and costs that one figure this cycle.
"""

from __future__ import annotations

import re
from collections import Counter, deque
from typing import Any, Callable

from mfu_exporter.node.gpm import Gpm

# How many of a GPU's latest Xids are kept in order, for a reader that samples less often than they are drained.
RECENT_XIDS = 256


class NvmlUnavailable(Exception):
    """NVML cannot be used here now (no library, no driver, no GPU): ``reason`` is a bounded label."""

    def __init__(self, reason: str, detail: str, retry_after: float):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        self.retry_after = retry_after


class GpuState:
    """What the reader keeps of one GPU across cycles and NVML sessions."""

    def __init__(self, index: int, uuid: str, name: str, pci_bus_id: str):
        self.index = index
        self.uuid = uuid
        self.name = name
        self.pci_bus_id = pci_bus_id
        self.peak_clock_hz: float | None = None  # the model's reference tensor clock, for the FLOPs estimate
        self.handle: Any = None
        self.lost_reason: str | None = None
        self.lost_code: int | None = None  # the NVML error that marked it lost (None: not lost, or not an error)
        self.mig = False
        self.mig_read_at: float | None = None  # monotonic time MIG mode was last read (nvml_gpus.MIG_READ_INTERVAL)
        self.sm_clock_max_hz: float | None = None
        self.unsupported: dict[str, str] = {}  # call or field key -> why NVML refused it
        self.event_set: Any = None
        self.memory_reserved: float | None = None  # what the driver reserves (v2 memory call), for the status
        self.xids: dict[int, int] = {}  # Xid -> count
        self.xid_counts: tuple[tuple[int, int], ...] = ()  # (Xid, count) by Xid, replaced on change
        self.xid_total = 0
        # The latest Xids in the order they came: a reader that remembers xid_total takes the ones it has not seen.
        self.recent_xids: deque[int] = deque(maxlen=RECENT_XIDS)
        self.health_fields: dict[str, float] = {}  # health field key -> last value (mfu_exporter.node.nvml_fields)
        self.gpm: Gpm | None = None
        self.gpm_note = "not opened"
        self.integrated: dict[str, float] = {}  # byte counters integrated from GPM rates
        self.field_specs: tuple[tuple[str, str, int, int, float], ...] = ()  # (tag, key, field ID, scope, scale)
        self.field_request: list[tuple[int, int]] = []
        # The same with the NVLink error fields after them: the request of a cycle that reads those too.
        self.field_specs_nvlink: tuple[tuple[str, str, int, int, float], ...] = ()
        self.field_request_nvlink: list[tuple[int, int]] = []
        self.nvlink_read_at: float | None = None  # monotonic time NVLink errors were last read (NVLINK_READ_INTERVAL)
        self.planned = False
        # Throttle time: each reason's counter from its field (seconds), or its bit integrated over samples.
        self.throttle_field: dict[str, float] = {}
        self.throttle_integrated: dict[str, float] = {}
        self.mask_at: float | None = None  # when the clock-event bitmask was last read (the integration's step)
        # Each reason's throttle seconds at the previous sample, and when: the share of the interval is their growth.
        self.throttle_last: dict[str, float] = {}
        self.throttle_last_at: float | None = None
        self.fields_at: float | None = None  # when the field values were last read (their request answered)
        # NVLink errors: the links NVML reports, the counters asked for, and each (field, link)'s last value.
        self.nvlink_links: int | None = None
        self.nvlink_kinds: tuple[tuple[str, int], ...] = ()  # set at each open (mfu_exporter.node.nvml_fields)
        self.nvlink_absent: set[tuple[int, int]] = set()
        self.nvlink_values: dict[tuple[int, int], float] = {}

    @property
    def up(self) -> bool:
        return self.handle is not None


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


class NvmlCalls:
    """NVML's error codes sorted once, the errors of the cycle, and the calls made through them."""

    def __init__(self, nvml: Any):
        self._nvml = nvml
        self._absent_codes = frozenset(
            {nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_FUNCTION_NOT_FOUND, nvml.NVML_ERROR_NO_PERMISSION}
        )
        # A field or GPM metric ID newer than the driver comes back INVALID_ARGUMENT: as absent as NOT_SUPPORTED.
        self._absent_id_codes = self._absent_codes | {nvml.NVML_ERROR_INVALID_ARGUMENT}
        self._lost_codes = frozenset(
            {nvml.NVML_ERROR_GPU_IS_LOST, nvml.NVML_ERROR_RESET_REQUIRED, nvml.NVML_ERROR_UNKNOWN}
        )
        self._errors: Counter[str] = Counter()  # this cycle's, by reason

    def _call(self, gpu: GpuState, key: str, function: Callable, *args: Any) -> Any:
        """``function(*args)``, or None when NVML cannot answer it for this GPU (remembered) or failed this once."""
        if key in gpu.unsupported:
            return None
        try:
            return function(*args)
        except self._nvml.NVMLError as exc:
            self._refused(gpu, key, exc)
            return None

    def _refused(self, gpu: GpuState, key: str, exc: Any, absent: frozenset[int] | None = None) -> None:
        """File an NVML error on ``key``: remember it as unsupported, count it, or raise it when the GPU is lost.
        UNKNOWN ("on any unexpected error", nvml.h) means lost only when the GPU fails a cheap call too: an unknown
        error on one call, field, GPM metric or the Xid registration degrades that series alone. ``exc`` is an
        ``NVMLError`` of the module in use (pynvml's or the fake's), its code in ``value``."""
        if exc.value in self._lost_codes:
            if exc.value == self._nvml.NVML_ERROR_UNKNOWN and self._answers(gpu):
                self._errors[self._reason(exc)] += 1
                return
            raise exc
        if exc.value in (absent or self._absent_codes):
            gpu.unsupported[key] = str(exc)
            gpu.planned = False
        else:
            self._errors[self._reason(exc)] += 1

    def _answers(self, gpu: GpuState) -> bool:
        """Whether the GPU still answers NVML at all (its UUID, the cheapest call)."""
        try:
            self._nvml.nvmlDeviceGetUUID(gpu.handle)
        except self._nvml.NVMLError:
            return False
        return True

    def _reason(self, exc: Any) -> str:
        """A bounded error label from the NVML error class: NVMLError_Timeout -> nvml_timeout."""
        name = type(exc).__name__
        if name.startswith("NVMLError_"):
            return "nvml_" + _snake(name[len("NVMLError_") :])
        return f"nvml_error_{exc.value}"

    def _quietly(self, function: Callable, *args: Any) -> None:
        """Release calls during cleanup: a GPU that is gone may refuse them, which changes nothing for us."""
        try:
            function(*args)
        except self._nvml.NVMLError:
            pass
