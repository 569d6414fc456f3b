"""A fake of the ``pynvml`` module (nvidia-ml-py) backed by a table of GPUs that a test or simulation mutates.

It provides the NVML functions the GPU source calls, with the real module's return types (ctypes structs from
``pynvml``) and failures: every error is ``pynvml.NVMLError(code)`` with a real ``NVML_ERROR_*`` code, so the
source's ``except`` clauses see the same subclasses (``NVMLError_GpuIsLost``...) as on a real driver. Constants,
structs and error classes are the real module's; a function the fake does not implement raises AttributeError
rather than silently reaching the real library.

Behaviour worth knowing:
- ``nvmlInit``/``nvmlShutdown`` are reference-counted as nvml.h says: only the shutdown that brings the count to
  zero ends the session, and only an init from zero enumerates the GPUs anew. Handles from before the session's end
  stop working.
- A lost GPU (fallen off the bus) keeps its index, as in real NVML: ``nvmlDeviceGetCount`` still counts it and
  ``nvmlDeviceGetHandleByIndex`` and every call on its handle raise ``NVMLError_GpuIsLost``. A GPU ``unbound`` from
  the driver is not enumerated by the next session (the GPUs after it move up).
- ``fail_all``: every call for that GPU (its handle too) raises that code, as when a container lost access to it.
- In MIG mode utilization is not supported, as on a real GPU.
- GPM: ``nvmlGpmMetricsGet`` reports, for each requested ID, the value in ``FakeGpu.gpm`` when ``sample2`` was
  taken (a simulation sets the table each tick), or ``NOT_SUPPORTED`` for an ID the GPU lacks. PCIe and NVLink
  rates (IDs 20/21/60/61) come from the GPU's byte rates, so they agree with the byte counters.
- NVLink throughput fields answer per link (``scopeId`` = link) or summed over all links (``scopeId`` = UINT_MAX).
- Field values answer each requested ID with its own ``nvmlReturn``: the figures a call also gives (power, power
  limit, energy, volatile ECC counts), byte, throttle-time and NVLink counters, NOT_SUPPORTED for an ID outside
  ``FakeGpu.fields`` (an A100 lacks the averaged power, an L40S every field).
- Xid events: ``FakeNvml.xid(index, code)`` queues one on every event set registered for that GPU, as the driver
  does: an Xid raised while no set is registered reaches nobody, and ``nvmlEventSetFree`` drops what its set still
  holds. ``nvmlEventSetWait`` returns queued events and raises ``NVMLError_Timeout`` when none is left (it never
  sleeps).
- Health fields (recovery action, row remap pending and failed, pages pending retirement) answer ``FakeGpu.health``;
  ``reset(index)`` is an operator's GPU reset: they go back to 0.
- ``fail`` maps a function name to an error code raised for that GPU; ``field_errors`` and ``gpm_errors`` map a
  field or GPM metric ID to the code in its own ``nvmlReturn`` (the rest of the call succeeds); ``hang(name)`` makes
  that function block until the returned event is set.
"""

from __future__ import annotations

import ctypes
import threading
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Callable

import pynvml

from mfu_exporter.sim.nvml_fields import (
    FIGURE_FIELDS,
    HEALTH_FIELDS,
    MIB,
    NVLINK_ERROR_FIELDS,
    NVLINK_ERROR_FIELDS_NEWER,
    NVLINK_FIELDS,
    NVLINK_LINK_COUNT,
    PCIE_FIELDS,
    THROTTLE_FIELDS,
    field_values,
)
from mfu_exporter.sim.nvml_fields import RECOVERY_ACTION as RECOVERY_ACTION  # the demo and tests set health by these
from mfu_exporter.sim.nvml_fields import REMAP_FAILED as REMAP_FAILED
from mfu_exporter.sim.nvml_fields import REMAP_PENDING as REMAP_PENDING
from mfu_exporter.sim.nvml_fields import RETIRED_PENDING as RETIRED_PENDING
from mfu_exporter.sim.nvml_gpm import FakeGpm, GpmSample

HGX_BUS_IDS = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")


@dataclass(eq=False)
class FakeGpu:
    """One GPU and its current readings, in NVML's own units (percent, MHz, mW, mJ, KiB for NVLink fields)."""

    name: str
    uuid: str
    pci_bus_id: str
    memory_total: int = 80 * 1024**3
    memory_used: int = 0
    utilization: int = 0
    memory_utilization: int = 0
    sm_clock_mhz: int = 1980
    sm_clock_max_mhz: int = 1980
    power_mw: int = 70_000
    power_limit_mw: int = 700_000
    energy_mj: int = 0
    temperature_c: int = 35
    clocks_event_reasons: int = 0x1  # GPU idle
    ecc_corrected: int = 0
    ecc_uncorrected: int = 0
    nvlink_links: int = 18
    nvlink_tx_bytes: float = 0.0
    nvlink_rx_bytes: float = 0.0
    pcie_tx_bytes: float = 0.0
    pcie_rx_bytes: float = 0.0
    nvlink_tx_rate: float = 0.0  # bytes/s, integrated by FakeNvml.advance
    nvlink_rx_rate: float = 0.0
    pcie_tx_rate: float = 0.0
    pcie_rx_rate: float = 0.0
    fields: set[int] = field(
        default_factory=lambda: (
            set(FIGURE_FIELDS)
            | set(NVLINK_FIELDS)
            | set(THROTTLE_FIELDS)
            | {NVLINK_LINK_COUNT, *NVLINK_ERROR_FIELDS, *HEALTH_FIELDS}
        )
    )
    health: dict[int, int] = field(default_factory=dict)  # health field ID -> value (0 when absent)
    throttle_ns: dict[int, int] = field(default_factory=dict)  # throttle field ID -> ns, grown by advance
    nvlink_errors: dict[tuple[int, int], int] = field(default_factory=dict)  # (error field ID, link) -> count
    field_errors: dict[int, int] = field(default_factory=dict)  # field ID -> NVML_ERROR_* in that field's nvmlReturn
    # Field ID -> NVML_VALUE_TYPE_* it answers in (else unsigned long long); a 32-bit one wraps as on the H200, whose
    # PCIe byte fields 197/198 answer UNSIGNED_INT.
    field_value_types: dict[int, int] = field(default_factory=dict)
    memory_reserved: int = 0  # what the driver reserves: in v1's used, apart in v2's (615 MiB on an idle H200)
    gpm_supported: bool = True
    # GPM metric ID -> value in percent (graphics, SM, occupancy, any tensor, HMMA tensor, DRAM bandwidth)
    gpm: dict[int, float] = field(default_factory=lambda: {1: 0.0, 2: 0.0, 3: 0.0, 5: 0.0, 7: 0.0, 10: 0.0})
    mig_mode: int | None = 0  # None: the GPU has no MIG (NVML answers NOT_SUPPORTED)
    persistence_mode: bool = True  # on, as on a tuned training node
    fail: dict[str, int] = field(default_factory=dict)  # NVML function name -> NVML_ERROR_* raised for this GPU
    fail_all: int | None = None  # NVML_ERROR_* raised by every call for this GPU, its handle included
    gpm_errors: dict[int, int] = field(default_factory=dict)  # GPM metric ID -> NVML_ERROR_* in its nvmlReturn
    lost: bool = False
    unbound: bool = False  # unbound from the driver: the next session does not enumerate it
    minor: int | None = None  # /dev/nvidia<minor>; None: NVML answers NOT_SUPPORTED
    processes: list[int] = field(default_factory=list)  # host PIDs with a CUDA context on this GPU

    def set_activity(
        self, tensor: float, sm: float | None = None, occupancy: float | None = None, dram: float | None = None
    ) -> None:
        """GPM activity in percent, as NVML reports it; unspecified ones follow the tensor activity."""
        sm = tensor if sm is None else sm
        self.gpm.update(
            {
                pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: sm,
                pynvml.NVML_GPM_METRIC_SM_UTIL: sm,
                pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: sm / 2 if occupancy is None else occupancy,
                pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: tensor,
                pynvml.NVML_GPM_METRIC_HMMA_TENSOR_UTIL: tensor,
                pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: tensor / 2 if dram is None else dram,
            }
        )


def train_healthily(gpu: FakeGpu) -> None:
    """Readings of an H100 in steady training: busy, ~60% tensor active, full clocks, no throttling."""
    gpu.utilization, gpu.memory_utilization = 95, 40
    gpu.memory_used = 71 * 1024**3
    gpu.sm_clock_mhz, gpu.temperature_c, gpu.power_mw = 1980, 68, 640_000
    gpu.clocks_event_reasons = 0
    gpu.set_activity(tensor=60.0, sm=85.0, occupancy=40.0, dram=45.0)
    gpu.nvlink_tx_rate = gpu.nvlink_rx_rate = 120e9
    gpu.pcie_tx_rate = gpu.pcie_rx_rate = 6e9


def _uuid(model: int, index: int) -> str:
    return f"GPU-{model:08x}-{index:04x}-4{index:03x}-8000-{model * 1000 + index:012x}"


def h100(index: int, **overrides: Any) -> FakeGpu:
    """An H100 SXM5 as NVML names it: GPM, MIG-capable, NVLink 4 (PCIe byte fields not reported)."""
    return FakeGpu(
        **{
            "name": "NVIDIA H100 80GB HBM3",
            "uuid": _uuid(0x100, index),
            "pci_bus_id": f"00000000:{HGX_BUS_IDS[index % 8]}:00.0",
            **overrides,
        }
    )


def h200(index: int, **overrides: Any) -> FakeGpu:
    """An H200 SXM as a real one answered (driver 580.159.04; docs/benchmarks.md "On a real H200"): the PCIe byte
    fields 197/198 present but 32-bit (UNSIGNED_INT, wrapping every 4 GiB), 615 MiB reserved by the driver at idle."""
    return h100(
        index,
        **{
            "name": "NVIDIA H200",
            "uuid": _uuid(0x200, index),
            "memory_total": 143771 * MIB,
            "memory_reserved": 644_939_776,
            "fields": set(FIGURE_FIELDS)
            | set(NVLINK_FIELDS)
            | set(THROTTLE_FIELDS)
            | {NVLINK_LINK_COUNT, *NVLINK_ERROR_FIELDS}
            | set(PCIE_FIELDS),
            "field_value_types": {197: pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, 198: pynvml.NVML_VALUE_TYPE_UNSIGNED_INT},
            **overrides,
        },
    )


def a100(index: int, **overrides: Any) -> FakeGpu:
    """An A100 SXM4: MIG-capable, no GPM (Ampere), NVLink 3."""
    return FakeGpu(
        **{
            "name": "NVIDIA A100-SXM4-80GB",
            "uuid": _uuid(0xA100, index),
            "pci_bus_id": f"00000000:{HGX_BUS_IDS[index % 8]}:00.0",
            "sm_clock_max_mhz": 1410,
            "sm_clock_mhz": 1410,
            "power_limit_mw": 400_000,
            "nvlink_links": 12,
            "gpm_supported": False,
            # GA100 has no averaged power (NVML_FI_DEV_POWER_AVERAGE): the instant figure of the call instead.
            "fields": (set(FIGURE_FIELDS) - {185})
            | set(NVLINK_FIELDS)
            | set(THROTTLE_FIELDS)
            | {NVLINK_LINK_COUNT, *NVLINK_ERROR_FIELDS, *HEALTH_FIELDS},
            **overrides,
        }
    )


def l40s(index: int, **overrides: Any) -> FakeGpu:
    """An L40S: PCIe only, no MIG, no GPM, no NVLink."""
    return FakeGpu(
        **{
            "name": "NVIDIA L40S",
            "uuid": _uuid(0x4045, index),
            "pci_bus_id": f"00000000:{0x41 + index:02X}:00.0",
            "memory_total": 46068 * MIB,
            "sm_clock_max_mhz": 2520,
            "sm_clock_mhz": 2520,
            "power_limit_mw": 350_000,
            "nvlink_links": 0,
            "fields": set(),
            "gpm_supported": False,
            "mig_mode": None,
            **overrides,
        }
    )


def b200(index: int, **overrides: Any) -> FakeGpu:
    """A B200: GPM, NVLink 5, the PCIe byte counter fields and the newer NVLink error counters."""
    return FakeGpu(
        **{
            "name": "NVIDIA B200",
            "uuid": _uuid(0xB200, index),
            "pci_bus_id": f"00000000:{HGX_BUS_IDS[index % 8]}:00.0",
            "memory_total": 183359 * MIB,
            "power_limit_mw": 1_000_000,
            # The newer per-link NVLink error counters only (the older per-lane totals are not asked for there).
            "fields": set(FIGURE_FIELDS)
            | set(NVLINK_FIELDS)
            | set(PCIE_FIELDS)
            | set(THROTTLE_FIELDS)
            | {NVLINK_LINK_COUNT}
            | set(NVLINK_ERROR_FIELDS_NEWER),
            **overrides,
        }
    )


class _Handle:
    __slots__ = ("gpu", "session")

    def __init__(self, gpu: FakeGpu, session: int):
        self.gpu = gpu
        self.session = session


class _EventSet:
    def __init__(self) -> None:
        self.gpus: list[FakeGpu] = []
        self.xids: deque[int] = deque()  # delivered, not yet read
        self.freed = False


def _error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


class FakeNvml(FakeGpm):
    """Stands in for the ``pynvml`` module: pass it where the source takes its NVML module."""

    def __init__(
        self,
        gpus: list[FakeGpu],
        driver_version: str = "570.133.20",
        cuda_driver_version: int = 12080,
        library_present: bool = True,
        init_error: int | None = None,
    ):
        self.gpus = gpus
        self.driver_version = driver_version
        self.cuda_driver_version = cuda_driver_version
        self.library_present = library_present
        self.init_error = init_error
        self.calls: Counter = Counter()
        self.hangs: dict[str, threading.Event] = {}
        self._refcount = 0
        self._session = 0
        self._enumerated: list[FakeGpu] = []
        self._samples: dict[int, GpmSample] = {}
        self._event_sets: list[_EventSet] = []  # created and not freed: where the driver delivers events
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        # Constants, structs and error classes are the real module's; functions must be faked explicitly.
        value = getattr(pynvml, name)
        if callable(value) and not isinstance(value, type):
            raise AttributeError(f"the fake NVML does not implement {name}")
        # Kept on the instance, so the next lookup is a dict hit as on the real module, not this call again: the GPU
        # source reads constants per field, and the bench counts this fake's work as the daemon's.
        self.__dict__[name] = value
        return value

    # --- simulation -------------------------------------------------------------------------------------------

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` pass on every GPU still on the bus: energy and byte counters grow at the current rates."""
        for gpu in self.gpus:
            if gpu.lost:
                continue
            gpu.energy_mj += int(gpu.power_mw * seconds)
            gpu.nvlink_tx_bytes += gpu.nvlink_tx_rate * seconds
            gpu.nvlink_rx_bytes += gpu.nvlink_rx_rate * seconds
            gpu.pcie_tx_bytes += gpu.pcie_tx_rate * seconds
            gpu.pcie_rx_bytes += gpu.pcie_rx_rate * seconds
            for field_id, bit in THROTTLE_FIELDS.items():
                if gpu.clocks_event_reasons & bit:
                    gpu.throttle_ns[field_id] = gpu.throttle_ns.get(field_id, 0) + int(seconds * 1e9)

    def xid(self, index: int, code: int) -> None:
        """The driver reports Xid ``code`` on GPU ``index``: each event set registered for that GPU gets it."""
        gpu = self.gpus[index]
        with self._lock:
            for event_set in self._event_sets:
                if gpu in event_set.gpus:
                    event_set.xids.append(code)

    def lose(self, index: int) -> None:
        """The GPU falls off the bus: its calls fail from now on, and NVML reports Xid 79 as a real driver does."""
        self.xid(index, 79)
        self.gpus[index].lost = True

    def reset(self, index: int) -> None:
        """An operator resets the GPU: the recovery action is done, a pending row remap takes effect."""
        self.gpus[index].health.clear()

    def hang(self, function: str) -> threading.Event:
        """Make ``function`` block until the returned event is set."""
        event = threading.Event()
        self.hangs[function] = event
        return event

    @property
    def initialized(self) -> bool:
        return self._refcount > 0

    @property
    def live_gpm_samples(self) -> int:
        return len(self._samples)

    # --- plumbing ---------------------------------------------------------------------------------------------

    def _enter(self, function: str, handle: _Handle | None = None) -> FakeGpu | None:
        self.calls[function] += 1
        hang = self.hangs.get(function)
        if hang is not None:
            hang.wait()
        if not self.initialized:
            raise _error(pynvml.NVML_ERROR_UNINITIALIZED)
        if handle is None:
            return None
        if not isinstance(handle, _Handle) or handle.session != self._session:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = handle.gpu
        if gpu.lost:
            raise _error(pynvml.NVML_ERROR_GPU_IS_LOST)
        if gpu.fail_all is not None:
            raise _error(gpu.fail_all)
        code = gpu.fail.get(function)
        if code is not None:
            raise _error(code)
        return gpu

    # --- init and identity ------------------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.calls["nvmlInit"] += 1
        if not self.library_present:
            raise _error(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
        if self.init_error is not None:
            raise _error(self.init_error)
        if self._refcount == 0:
            self._session += 1
            self._enumerated = [g for g in self.gpus if not g.unbound]
        self._refcount += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self._refcount -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._enter("nvmlSystemGetCudaDriverVersion")
        return self.cuda_driver_version

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self._enumerated)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self._enumerated):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self._enumerated[index]
        if gpu.lost:
            raise _error(pynvml.NVML_ERROR_GPU_IS_LOST)
        if gpu.fail_all is not None:
            raise _error(gpu.fail_all)
        if "nvmlDeviceGetHandleByIndex" in gpu.fail:
            raise _error(gpu.fail["nvmlDeviceGetHandleByIndex"])
        return _Handle(gpu, self._session)

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        return self._enter("nvmlDeviceGetUUID", handle).uuid

    def nvmlDeviceGetMinorNumber(self, handle: _Handle) -> int:
        gpu = self._enter("nvmlDeviceGetMinorNumber", handle)
        if gpu.minor is None:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu.minor

    def nvmlDeviceGetComputeRunningProcesses(self, handle: _Handle) -> list:
        """The GPU's compute processes as pynvml returns them (``c_nvmlProcessInfo_t``, host PIDs)."""
        gpu = self._enter("nvmlDeviceGetComputeRunningProcesses", handle)
        found = []
        for pid in gpu.processes:
            info = pynvml.c_nvmlProcessInfo_t()
            info.pid = pid
            info.usedGpuMemory = 0
            found.append(info)
        return found

    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        return self._enter("nvmlDeviceGetName", handle).name

    def nvmlDeviceGetPciInfo(self, handle: _Handle) -> pynvml.nvmlPciInfo_t:
        gpu = self._enter("nvmlDeviceGetPciInfo", handle)
        info = pynvml.nvmlPciInfo_t()
        info.busId = gpu.pci_bus_id.encode()
        info.busIdLegacy = gpu.pci_bus_id.encode()
        return info

    def nvmlDeviceGetMigMode(self, handle: _Handle) -> list[int]:
        gpu = self._enter("nvmlDeviceGetMigMode", handle)
        if gpu.mig_mode is None:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [gpu.mig_mode, gpu.mig_mode]

    # --- readings ---------------------------------------------------------------------------------------------

    def nvmlDeviceGetUtilizationRates(self, handle: _Handle) -> pynvml.c_nvmlUtilization_t:
        gpu = self._enter("nvmlDeviceGetUtilizationRates", handle)
        if gpu.mig_mode:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return pynvml.c_nvmlUtilization_t(gpu=gpu.utilization, memory=gpu.memory_utilization)

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle, version: int | None = None) -> Any:
        """v1 (no version): ``used`` includes what the driver reserves; v2: ``used`` is what processes allocated."""
        gpu = self._enter("nvmlDeviceGetMemoryInfo", handle)
        free = gpu.memory_total - gpu.memory_used - gpu.memory_reserved
        if not version:
            return pynvml.c_nvmlMemory_t(total=gpu.memory_total, free=free, used=gpu.memory_used + gpu.memory_reserved)
        if version != pynvml.nvmlMemory_v2:
            raise _error(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        return pynvml.c_nvmlMemory_v2_t(
            version=version, total=gpu.memory_total, reserved=gpu.memory_reserved, free=free, used=gpu.memory_used
        )

    def nvmlDeviceGetClockInfo(self, handle: _Handle, clock_type: int) -> int:
        gpu = self._enter("nvmlDeviceGetClockInfo", handle)
        if clock_type != pynvml.NVML_CLOCK_SM:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu.sm_clock_mhz

    def nvmlDeviceGetMaxClockInfo(self, handle: _Handle, clock_type: int) -> int:
        gpu = self._enter("nvmlDeviceGetMaxClockInfo", handle)
        if clock_type != pynvml.NVML_CLOCK_SM:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu.sm_clock_max_mhz

    def nvmlDeviceGetPowerUsage(self, handle: _Handle) -> int:
        return self._enter("nvmlDeviceGetPowerUsage", handle).power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: _Handle) -> int:
        return self._enter("nvmlDeviceGetEnforcedPowerLimit", handle).power_limit_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: _Handle) -> int:
        return self._enter("nvmlDeviceGetTotalEnergyConsumption", handle).energy_mj

    def nvmlDeviceGetPersistenceMode(self, handle: _Handle) -> int:
        gpu = self._enter("nvmlDeviceGetPersistenceMode", handle)
        return pynvml.NVML_FEATURE_ENABLED if gpu.persistence_mode else pynvml.NVML_FEATURE_DISABLED

    def nvmlDeviceGetTemperature(self, handle: _Handle, sensor: int) -> int:
        gpu = self._enter("nvmlDeviceGetTemperature", handle)
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.temperature_c

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: _Handle) -> int:
        return self._enter("nvmlDeviceGetCurrentClocksEventReasons", handle).clocks_event_reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: _Handle) -> int:
        return self._enter("nvmlDeviceGetCurrentClocksThrottleReasons", handle).clocks_event_reasons

    def nvmlDeviceGetTotalEccErrors(self, handle: _Handle, error_type: int, counter_type: int) -> int:
        gpu = self._enter("nvmlDeviceGetTotalEccErrors", handle)
        if error_type == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED:
            return gpu.ecc_corrected
        if error_type == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED:
            return gpu.ecc_uncorrected
        raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetFieldValues(self, handle: _Handle, field_ids: list) -> ctypes.Array:
        gpu = self._enter("nvmlDeviceGetFieldValues", handle)
        return field_values(gpu, field_ids)

    # --- Xid events -------------------------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> _EventSet:
        self._enter("nvmlEventSetCreate")
        event_set = _EventSet()
        with self._lock:
            self._event_sets.append(event_set)
        return event_set

    def nvmlDeviceRegisterEvents(self, handle: _Handle, event_types: int, event_set: _EventSet) -> None:
        gpu = self._enter("nvmlDeviceRegisterEvents", handle)
        if event_types & ~pynvml.nvmlEventTypeXidCriticalError:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        event_set.gpus.append(gpu)

    def nvmlEventSetWait(self, event_set: _EventSet, timeout_ms: int) -> pynvml.c_nvmlEventData_t:
        self._enter("nvmlEventSetWait")
        if event_set.freed:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if event_set.xids:
            return pynvml.c_nvmlEventData_t(
                eventType=pynvml.nvmlEventTypeXidCriticalError,
                eventData=event_set.xids.popleft(),
                gpuInstanceId=0xFFFFFFFF,
                computeInstanceId=0xFFFFFFFF,
            )
        raise _error(pynvml.NVML_ERROR_TIMEOUT)

    def nvmlEventSetFree(self, event_set: _EventSet) -> None:
        self._enter("nvmlEventSetFree")
        if event_set.freed:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        with self._lock:
            self._event_sets.remove(event_set)
        event_set.freed = True
        event_set.xids.clear()


def node(*gpus: FakeGpu | Callable[[int], FakeGpu], count: int | None = None, **kwargs: Any) -> FakeNvml:
    """A fake NVML for one node: ``node(h100, count=8)`` or ``node(h100(0), h100(1), a100(2))``."""
    if count is not None:
        (make,) = gpus
        return FakeNvml([make(i) for i in range(count)], **kwargs)
    return FakeNvml(list(gpus), **kwargs)
