"""GPU source: NVML through pynvml (nvidia-ml-py), with GPM tensor activity, throttling, Xid errors and ECC.

The NVML module is injected: production passes ``pynvml``, tests and the demo pass ``exporter.sim.nvml``.

Cheap by construction: NVML is initialised once; handles, Xid event sets, GPM samples and the GPM request struct
are opened once per GPU and reused; a call NVML answers NOT_SUPPORTED, FUNCTION_NOT_FOUND or NO_PERMISSION is
remembered per GPU and not made again. The sample is typed readings (``GpuSample``); ``exporter.render.gpu`` turns it
into metric families.

Faults stay local to one GPU: a GPU that answers GPU_IS_LOST or RESET_REQUIRED, or UNKNOWN and then fails its UUID
too, is marked down (its readings disappear, ``mfu_gpu_up`` is 0, a ``gpu_lost`` error is counted once) while the
others keep reporting; an UNKNOWN from a GPU that still answers degrades only that call, field, GPM metric or Xid
registration. Every ``retry_interval`` while a GPU is missing, NVML is shut down and initialised again to find it (a
new session enumerates the GPUs anew, which finds one that was reset or re-bound to the driver). NVML counts its inits
(nvml.h), so the session is the process's one (``exporter.node.nvml.NvmlSession``), borrowed by discovery and
preflight too: the restart really ends it. Real NVML keeps a GPU that fell off the bus at its index, so the failing
index is that same lost GPU, never a second one. A GPU this process may not open (NO_PERMISSION) is listed once and
not re-initialised for. The re-initialisation costs the healthy GPUs nothing: the old session's queued Xid events
and GPM interval are read before it closes (``_reopen``). GPUs are keyed by UUID, so a GPU keeps its ``gpu`` label
(the index NVML gave it when first seen) across re-initialisations.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
import time
from collections import Counter
from typing import Any, Callable

from exporter.config import GpuConfig
from exporter.model.flops import gpu_model
from exporter.model.job_view import GpuInfo
from exporter.model.readings import GpuReading
from exporter.node.counters import Totals
from exporter.node.nvml import NvmlSession, clock_event_reasons
from exporter.sources.base import Snapshot, SourceContext, SourceUnavailable, exports

log = logging.getLogger(__name__)

MIB = 1024 * 1024
# NVML docs: two GPM samples must be more than 100 ms apart, the hardware's internal refresh period.
MIN_GPM_INTERVAL = 0.1
# Bounds the Xid drain per GPU and cycle; the rest stay queued in NVML for the next cycle.
MAX_XIDS_PER_CYCLE = 64

# Clock-event reason bits of nvml.h (nvmlClocksEventReason*, formerly nvmlClocksThrottleReason*).
THROTTLE_REASONS = (
    ("idle", 0x1),
    ("sw_power_cap", 0x4),
    ("hw_slowdown", 0x8),
    ("sync_boost", 0x10),
    ("sw_thermal_slowdown", 0x20),
    ("hw_thermal_slowdown", 0x40),
    ("hw_power_brake", 0x80),
)

# Cumulative time the SM clock was held down, per reason: (reason, nvml.h field ID, clock-event bit). The fields are
# NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP (= NVML_FI_DEV_PERF_POLICY_POWER), _SW_THERM_SLOWDOWN, _HW_THERM_SLOWDOWN
# and _HW_POWER_BRAKE_SLOWDOWN. Four reasons, not seven: 32 series on an 8-GPU node (issue 28's budget, with NVLink).
# Where the driver lacks a field, that reason's time is the bit integrated over samples instead (``_integrate``).
THROTTLE_TIME = (
    ("sw_power_cap", 74, 0x4),
    ("sw_thermal_slowdown", 269, 0x20),
    ("hw_thermal_slowdown", 270, 0x40),
    ("hw_power_brake", 271, 0x80),
)
# The perf-policy counters count nanoseconds, as nvmlDeviceGetViolationStatus's violationTime and DCGM's *_VIOLATION
# fields do (docs/benchmarks.md "On a real H200" says what the H200 showed).
THROTTLE_FIELD_SECONDS = 1e-9
NVLINK_LINK_COUNT = 91  # NVML_FI_DEV_NVLINK_LINK_COUNT
# NVLink error counters, read per link (scopeId = link) and summed per GPU: nvml.h's per-link totals over all lanes
# (NVML_FI_DEV_NVLINK_CRC_FLIT/CRC_DATA/REPLAY/RECOVERY_ERROR_COUNT_TOTAL), or, where a driver has none of those, the
# newer per-link counters (NVML_FI_DEV_NVLINK_COUNT_RCV_ERRORS, _LOCAL_LINK_INTEGRITY_ERRORS, _LINK_RECOVERY_EVENTS).
NVLINK_ERRORS = (("crc_flit", 38), ("crc_data", 45), ("replay", 52), ("recovery", 59))
NVLINK_ERRORS_NEWER = (("receive", 208), ("link_integrity", 211), ("link_recovery", 215))

ALL_LINKS = 0xFFFFFFFF  # nvml.h: a scopeId of UINT_MAX sums an NVLink throughput field over all links
# Cumulative byte counters read as NVML field values: (reading key, field ID, scope ID, bytes per unit).
# IDs are nvml.h's NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX (KiB) and NVML_FI_DEV_PCIE_COUNT_TX/RX_BYTES.
FIELD_COUNTERS = (
    ("nvlink_transmit_bytes", 138, ALL_LINKS, 1024),
    ("nvlink_receive_bytes", 139, ALL_LINKS, 1024),
    ("pcie_transmit_bytes", 197, 0, 1),
    ("pcie_receive_bytes", 198, 0, 1),
)
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

# What the sample reads at each series level (sources.gpu.series): the energy call is made only where
# mfu_gpu_energy_joules is exported (render/gpu.py COUNTERS, at full); on a real H200 it was the slowest call.
ENERGY_LEVEL = "full"
# Node totals kept monotonic while GPUs come and go (node.counters.Totals): reading keys, at every level.
TOTAL_KEYS = ("nvlink_transmit_bytes", "nvlink_receive_bytes", "pcie_transmit_bytes", "pcie_receive_bytes")


@dataclasses.dataclass(frozen=True)
class GpuSample:
    """One sample of the node's GPUs: what ``exporter.render.gpu`` exports, the job model's inventory and the
    attribution's readings."""

    series: str  # sources.gpu.series: which per-GPU families are exported
    driver: tuple[str, str] | None  # (driver version, CUDA driver version)
    gpus: dict[int, GpuReading]  # by ``gpu`` label, in label order; a lost GPU is there with ``up`` False
    totals: dict[str, float]  # node totals: TOTAL_KEYS and ecc_corrected/ecc_uncorrected -> since the exporter started
    inventory: list[GpuInfo]  # the GPUs known, for the job model


# A reading's figures (every per-GPU gauge and counter of render/gpu.py among them): the GpuReading fields that are None until NVML
# gives them. A sample fills a dict of them, then builds the reading.
READING_KEYS = tuple(f.name for f in dataclasses.fields(GpuReading) if f.default is None)

GPM_NOT_SUPPORTED = "not supported by this GPU (NVML GPM needs Hopper or newer)"
GPM_MIG = "not read in MIG mode (GPM is per GPU instance there; per-instance metrics are not implemented)"
GPM_OFF = "off (sources.gpu.gpm is false)"


def decode_throttle_reasons(mask: int) -> list[str]:
    """The names of the clock-event reasons set in an NVML bitmask, in THROTTLE_REASONS order."""
    return [name for name, bit in THROTTLE_REASONS if mask & bit]


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _cuda_version(number: int) -> str:
    """NVML's CUDA driver version integer (12080) as "12.8"."""
    return f"{number // 1000}.{number % 1000 // 10}"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class _Gpm:
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


class _Gpu:
    """What the source keeps of one GPU across cycles and NVML sessions."""

    def __init__(self, index: int, uuid: str, name: str, pci_bus_id: str):
        self.index = index
        self.uuid = uuid
        self.name = name
        self.pci_bus_id = pci_bus_id
        model = gpu_model(name)
        self.peak_clock_hz = model.peak_clock_mhz * 1e6 if model and model.peak_clock_mhz else None
        self.handle: Any = None
        self.lost_reason: str | None = None
        self.mig = False
        self.sm_clock_max_hz: float | None = None
        self.unsupported: dict[str, str] = {}  # call or field key -> why NVML refused it
        self.event_set: Any = None
        self.memory_reserved: float | None = None  # what the driver reserves (v2 memory call), for the status
        self.xids: dict[int, int] = {}  # Xid -> count
        self.xid_counts: tuple[tuple[int, int], ...] = ()  # (Xid, count) by Xid, replaced on change
        self.xid_total = 0
        self.gpm: _Gpm | None = None
        self.gpm_note = "not opened"
        self.integrated: dict[str, float] = {}  # byte counters integrated from GPM rates
        self.field_specs: tuple = ()
        self.field_request: list = []
        self.planned = False
        # Throttle time: each reason's counter from its field (seconds), or its bit integrated over samples.
        self.throttle_field: dict[str, float] = {}
        self.throttle_integrated: dict[str, float] = {}
        self.mask_at: float | None = None  # when the clock-event bitmask was last read (the integration's step)
        # NVLink errors: the links NVML reports, the counters asked for, and each (field, link)'s last value.
        self.nvlink_links: int | None = None
        self.nvlink_kinds: tuple[tuple[str, int], ...] = NVLINK_ERRORS
        self.nvlink_absent: set[tuple[int, int]] = set()
        self.nvlink_values: dict[tuple[int, int], float] = {}

    @property
    def up(self) -> bool:
        return self.handle is not None


class GpuSource:
    """Samples every GPU of the node through NVML; see the module docstring for costs and fault handling."""

    name = "gpu"

    def __init__(
        self,
        nvml: Any,
        interval: float = 1.0,
        timeout: float = 5.0,
        retry_interval: float = 60.0,
        gpm: bool = True,
        monotonic: Callable[[], float] = time.monotonic,
        session: NvmlSession | None = None,
        series: str = "full",  # every family; the config (sources.<name>.series) defaults to standard
    ):
        self.interval = interval
        self.timeout = timeout
        self.retry_interval = retry_interval
        self._nvml = nvml
        self._gpm_enabled = gpm
        self._monotonic = monotonic
        self._absent_codes = frozenset(
            {nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_FUNCTION_NOT_FOUND, nvml.NVML_ERROR_NO_PERMISSION}
        )
        # A field or GPM metric ID newer than the driver comes back INVALID_ARGUMENT: as absent as NOT_SUPPORTED.
        self._absent_id_codes = self._absent_codes | {nvml.NVML_ERROR_INVALID_ARGUMENT}
        self._lost_codes = frozenset(
            {nvml.NVML_ERROR_GPU_IS_LOST, nvml.NVML_ERROR_RESET_REQUIRED, nvml.NVML_ERROR_UNKNOWN}
        )
        self._init_reasons = {
            nvml.NVML_ERROR_LIBRARY_NOT_FOUND: "library_not_found",
            nvml.NVML_ERROR_DRIVER_NOT_LOADED: "driver_not_loaded",
            nvml.NVML_ERROR_NO_PERMISSION: "no_permission",
            nvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH: "driver_library_mismatch",
        }
        # NVML is borrowed from the process's one session (discovery and preflight borrow it too): see exporter.node.nvml.
        self._session = session or NvmlSession(nvml)
        self._initialized = False  # whether this source holds a reference to the session
        self._no_permission = nvml.NVML_ERROR_NO_PERMISSION
        self._clock_memo: dict[str, bool] = {}  # which clock-event call this driver has (exporter.node.nvml)
        self._gpus: dict[str, _Gpu] = {}
        self._ordered: list[_Gpu] = []
        self._inventory: list[GpuInfo] = []
        # NVML indices this session could not open: index -> (why, NVML error code). A GPU NVML keeps listing after
        # it fell off the bus (nvml.h: it keeps its index) is not here: it is a lost GPU, listed once as such.
        self._unreachable: dict[int, tuple[str, int]] = {}
        self._uuid_at: dict[int, str] = {}  # the UUID each NVML index had when it last opened
        self._driver: tuple[str, str] | None = None
        self._reinit_at: float | None = None
        self._logged: set[str] = set()
        self._errors: Counter = Counter()
        self._blank = dict.fromkeys(READING_KEYS)
        self._series = series
        self._read_energy = exports(series, ENERGY_LEVEL)
        self._totals = Totals()

    @classmethod
    def from_config(cls, section: GpuConfig, ctx: SourceContext) -> GpuSource:
        return cls(
            ctx.nvml,
            interval=section.interval,
            timeout=section.timeout,
            retry_interval=section.retry_interval,
            gpm=section.gpm,
            monotonic=ctx.monotonic,
            session=ctx.nvml_session,
            series=section.series,
        )

    # --- the cycle ------------------------------------------------------------------------------------------

    def sample(self) -> Snapshot:
        errors = self._errors = Counter()
        now = self._monotonic()
        if self._initialized and self._reinit_at is not None and now >= self._reinit_at:
            log.info("re-initialising NVML to look for lost GPUs")
            self._reopen(now)
        if not self._initialized:
            self._open(now)
        rows = []
        for gpu in self._ordered:
            self._poll_xids(gpu)
            reading = None
            if gpu.up:
                try:
                    reading = self._sample_gpu(gpu, now)
                except self._nvml.NVMLError as exc:
                    if exc.value not in self._lost_codes:
                        raise
                    self._lose(gpu, exc, now)
            rows.append((gpu, reading or self._down_reading(gpu)))
        readings = {gpu.index: reading for gpu, reading in rows}
        sample = GpuSample(self._series, self._driver, readings, self._add_totals(readings), self._inventory)
        return Snapshot(readings=sample, errors=errors, status=self._status(rows))

    def _sample_gpu(self, gpu: _Gpu, now: float) -> GpuReading:
        nvml, handle, call = self._nvml, gpu.handle, self._call
        mig = call(gpu, "mig_mode", nvml.nvmlDeviceGetMigMode, handle)
        if mig is not None and bool(mig[0]) != gpu.mig:
            self._mig_changed(gpu, bool(mig[0]), now)
        if not gpu.planned:
            self._plan(gpu)
        reading = self._blank.copy()
        reading["sm_clock_max_hz"] = gpu.sm_clock_max_hz
        utilization = call(gpu, "utilization", nvml.nvmlDeviceGetUtilizationRates, handle)
        if utilization is not None:
            reading["utilization"] = utilization.gpu / 100
            reading["memory_utilization"] = utilization.memory / 100
        memory = self._memory(gpu)
        if memory is not None:
            reading["memory_used_bytes"] = float(memory.used)
            reading["memory_total_bytes"] = float(memory.total)
            gpu.memory_reserved = float(getattr(memory, "reserved", 0.0)) or None
        clock = call(gpu, "sm_clock", nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM)
        if clock is not None:
            reading["sm_clock_hz"] = clock * 1e6
        power = call(gpu, "power", nvml.nvmlDeviceGetPowerUsage, handle)
        if power is not None:
            reading["power_watts"] = power / 1000  # NVML reports milliwatts
        limit = call(gpu, "power_limit", nvml.nvmlDeviceGetEnforcedPowerLimit, handle)
        if limit is not None:
            reading["power_limit_watts"] = limit / 1000
        # On a real H200 this call took 4.7 ms, the slowest of the sample: made only where its family is exported.
        energy = call(gpu, "energy", nvml.nvmlDeviceGetTotalEnergyConsumption, handle) if self._read_energy else None
        if energy is not None:
            reading["energy_joules"] = energy / 1000  # millijoules
        temperature = call(gpu, "temperature", nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU)
        if temperature is not None:
            reading["temperature"] = float(temperature)
        mask = call(gpu, "clocks_event_reasons", clock_event_reasons, nvml, handle, self._clock_memo)
        if mask is not None:
            reading["clocks_event_reasons"] = mask
            throttle_reasons = tuple(decode_throttle_reasons(mask))
        else:
            throttle_reasons = ()
        for key, error_type in (
            ("ecc_corrected", nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
            ("ecc_uncorrected", nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
        ):
            # Volatile counts: since the driver loaded, updated live (the aggregate ones lag in the infoROM).
            count = call(gpu, key, nvml.nvmlDeviceGetTotalEccErrors, handle, error_type, nvml.NVML_VOLATILE_ECC)
            if count is not None:
                reading[key] = float(count)
        self._read_fields(gpu, reading)
        throttle_seconds = self._throttle_time(gpu, mask, now)
        self._read_gpm(gpu, now, reading)
        tensor, sm_clock = reading["tensor_active"], reading["sm_clock_hz"]
        if tensor is not None and sm_clock is not None and gpu.peak_clock_hz:
            reading["hardware_flops_utilization"] = tensor * sm_clock / gpu.peak_clock_hz
        return GpuReading(
            gpu.index,
            gpu.uuid,
            gpu.name,
            gpu.pci_bus_id,
            up=True,
            mig=gpu.mig,
            throttle_reasons=throttle_reasons,
            throttle_seconds=throttle_seconds,
            xid_count=gpu.xid_total,
            xids=gpu.xid_counts,
            **reading,
        )

    def _down_reading(self, gpu: _Gpu) -> GpuReading:
        return GpuReading(
            gpu.index,
            gpu.uuid,
            gpu.name,
            gpu.pci_bus_id,
            up=False,
            mig=gpu.mig,
            xid_count=gpu.xid_total,
            xids=gpu.xid_counts,
        )

    # --- NVML calls -----------------------------------------------------------------------------------------

    def _call(self, gpu: _Gpu, key: str, function: Callable, *args: Any) -> Any:
        """``function(*args)``, or None when NVML cannot answer it for this GPU (remembered) or failed this once."""
        if key in gpu.unsupported:
            return None
        try:
            return function(*args)
        except self._nvml.NVMLError as exc:
            self._refused(gpu, key, exc)
            return None

    def _refused(self, gpu: _Gpu, key: str, exc: Exception, absent: frozenset | None = None) -> None:
        """File an NVML error on ``key``: remember it as unsupported, count it, or raise it when the GPU is lost.
        UNKNOWN ("on any unexpected error", nvml.h) means lost only when the GPU fails a cheap call too: an unknown
        error on one call, field, GPM metric or the Xid registration degrades that series alone."""
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

    def _answers(self, gpu: _Gpu) -> bool:
        """Whether the GPU still answers NVML at all (its UUID, the cheapest call)."""
        try:
            self._nvml.nvmlDeviceGetUUID(gpu.handle)
        except self._nvml.NVMLError:
            return False
        return True

    def _reason(self, exc: Exception) -> str:
        """A bounded error label from the NVML error class: NVMLError_Timeout -> nvml_timeout."""
        name = type(exc).__name__
        if name.startswith("NVMLError_"):
            return "nvml_" + _snake(name[len("NVMLError_") :])
        return f"nvml_error_{exc.value}"

    def _memory(self, gpu: _Gpu) -> Any:
        """Memory from the v2 call, whose ``used`` leaves out what the driver reserves (v1's ``used`` counts it: 615
        MiB on an idle H200); v1 on a driver without v2 (FUNCTION_NOT_FOUND, or a version it does not know)."""
        nvml = self._nvml
        if "memory_v2" not in gpu.unsupported:
            try:
                return nvml.nvmlDeviceGetMemoryInfo(gpu.handle, version=nvml.nvmlMemory_v2)
            except nvml.NVMLError as exc:
                if exc.value not in self._absent_codes | {nvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH}:
                    self._refused(gpu, "memory", exc)
                    return None
                gpu.unsupported["memory_v2"] = str(exc)
        return self._call(gpu, "memory", nvml.nvmlDeviceGetMemoryInfo, gpu.handle)

    def _quietly(self, function: Callable, *args: Any) -> None:
        """Release calls during cleanup: a GPU that is gone may refuse them, which changes nothing for us."""
        try:
            function(*args)
        except self._nvml.NVMLError:
            pass

    def _plan(self, gpu: _Gpu) -> None:
        """Which field values and GPM metrics to request, given what this GPU refused so far. Every field goes into
        one nvmlDeviceGetFieldValues call a cycle: (tag, key, field ID, scope ID, scale) per field."""
        specs = [("counter", key, field_id, scope, scale) for key, field_id, scope, scale in FIELD_COUNTERS]
        specs += [("throttle", reason, field_id, 0, THROTTLE_FIELD_SECONDS) for reason, field_id, _ in THROTTLE_TIME]
        specs += [
            ("nvlink", kind, field_id, link, 1)
            for link in range(self._nvlink_links(gpu))
            for kind, field_id in gpu.nvlink_kinds
            if (field_id, link) not in gpu.nvlink_absent
        ]
        gpu.field_specs = tuple(spec for spec in specs if _field_key(spec) not in gpu.unsupported)
        gpu.field_request = [(field_id, scope) for _, _, field_id, scope, _ in gpu.field_specs]
        if gpu.gpm is not None:
            metrics = [(key, metric_id) for key, metric_id in GPM_ACTIVITY if f"gpm:{key}" not in gpu.unsupported]
            metrics += [
                (key, GPM_RATES[key])
                for key, _, _, _ in FIELD_COUNTERS
                if key in gpu.unsupported and f"gpm:{key}" not in gpu.unsupported
            ]
            if metrics:
                gpu.gpm.request_metrics(metrics)
            else:
                self._close_gpm(gpu, "no GPM metric wanted here is supported by this GPU")
        gpu.planned = True

    def _nvlink_links(self, gpu: _Gpu) -> int:
        """How many NVLink links NVML reports for the GPU (0 without NVLink), asked once per open."""
        if gpu.nvlink_links is None:
            gpu.nvlink_links = 0
            if "nvlink_errors" not in gpu.unsupported:
                try:
                    (value,) = self._nvml.nvmlDeviceGetFieldValues(gpu.handle, [(NVLINK_LINK_COUNT, 0)])
                except self._nvml.NVMLError as exc:
                    self._refused(gpu, "nvlink_errors", exc, self._absent_id_codes)
                    return 0
                if value.nvmlReturn == self._nvml.NVML_SUCCESS:
                    gpu.nvlink_links = int(_field_number(value))
                else:
                    gpu.unsupported["nvlink_errors"] = f"link count: {self._nvml.NVMLError(value.nvmlReturn)}"
                if gpu.nvlink_links == 0:
                    gpu.unsupported.setdefault("nvlink_errors", "no NVLink links")
        return gpu.nvlink_links

    def _read_fields(self, gpu: _Gpu, reading: dict[str, Any]) -> None:
        if gpu.field_request:
            try:
                values = self._nvml.nvmlDeviceGetFieldValues(gpu.handle, gpu.field_request)
            except self._nvml.NVMLError as exc:
                if exc.value in self._absent_codes:
                    for spec in gpu.field_specs:
                        self._refused(gpu, _field_key(spec), exc)
                else:
                    self._refused(gpu, "fields", exc)
                return
            success = self._nvml.NVML_SUCCESS
            for spec, value in zip(gpu.field_specs, values):
                tag, key, field_id, scope, scale = spec
                code = _member(value, "nvmlReturn")
                if code == success:
                    value_type = _member(value, "valueType")
                    number = float(getattr(_member(value, "value"), _VALUE_MEMBERS[value_type]) * scale)
                    if tag == "counter" and value_type in _NARROW_TYPES:
                        # A 32-bit byte counter wraps every 4 GiB (the H200's PCIe fields 197/198 do): sampled once a
                        # second it can wrap several times between samples, so GPM's rate integrated stands in.
                        gpu.unsupported[key] = "a 32-bit counter that wraps every 4 GiB; GPM's rate integrated instead"
                        gpu.planned = False
                    elif tag == "counter":
                        reading[key] = number
                    elif tag == "throttle":
                        gpu.throttle_field[key] = number
                    else:
                        gpu.nvlink_values[(field_id, scope)] = number
                elif tag == "nvlink" and code in self._absent_id_codes:
                    gpu.nvlink_absent.add((field_id, scope))  # an inactive link, or a counter this driver lacks
                    gpu.planned = False
                else:  # UNKNOWN from a GPU that still answers: counted, this field skipped this cycle (_refused)
                    self._refused(gpu, _field_key(spec), self._nvml.NVMLError(code), self._absent_id_codes)
        self._nvlink_total(gpu, reading)

    def _nvlink_total(self, gpu: _Gpu, reading: dict[str, Any]) -> None:
        """The GPU's NVLink errors: the sum of its links' last values. A driver with none of the older counters on
        any link gets the newer ones asked instead, once."""
        links = gpu.nvlink_links or 0
        if not links or "nvlink_errors" in gpu.unsupported:
            return
        wanted = [(field_id, link) for _, field_id in gpu.nvlink_kinds for link in range(links)]
        if all(key in gpu.nvlink_absent for key in wanted):
            if gpu.nvlink_kinds is NVLINK_ERRORS:
                gpu.nvlink_kinds = NVLINK_ERRORS_NEWER
            else:
                gpu.unsupported["nvlink_errors"] = "no NVLink error counter answers on any link"
            gpu.planned = False
            return
        if gpu.nvlink_values:
            reading["nvlink_errors"] = sum(gpu.nvlink_values.values())

    def _throttle_time(self, gpu: _Gpu, mask: int | None, now: float) -> tuple[tuple[str, float], ...]:
        """Each reason's cumulative throttle seconds: its field where the driver answers it, else its bit integrated
        over samples (the state a sample reads is taken to have held since the previous sample)."""
        elapsed = now - gpu.mask_at if gpu.mask_at is not None and mask is not None else 0.0
        if mask is not None:
            gpu.mask_at = now
        out = []
        for reason, _, bit in THROTTLE_TIME:
            if reason in gpu.throttle_field:
                out.append((reason, gpu.throttle_field[reason]))
            elif f"throttle:{reason}" in gpu.unsupported and mask is not None:
                total = gpu.throttle_integrated.get(reason, 0.0) + (elapsed if mask & bit else 0.0)
                gpu.throttle_integrated[reason] = total
                out.append((reason, total))
        return tuple(out)

    # --- GPM ------------------------------------------------------------------------------------------------

    def _open_gpm(self, gpu: _Gpu, now: float) -> None:
        nvml = self._nvml
        if not self._gpm_enabled:
            gpu.gpm_note = GPM_OFF
            return
        if gpu.mig:
            gpu.gpm_note = GPM_MIG
            return
        support = self._call(gpu, "gpm", nvml.nvmlGpmQueryDeviceSupport, gpu.handle)
        if support is None:
            gpu.gpm_note = "unavailable: " + gpu.unsupported.get("gpm", "the support query failed")
            return
        if not support.isSupportedDevice:  # the struct itself is always truthy
            gpu.gpm_note = GPM_NOT_SUPPORTED
            return
        samples: list[Any] = []
        try:
            samples.append(nvml.nvmlGpmSampleAlloc())
            samples.append(nvml.nvmlGpmSampleAlloc())
            nvml.nvmlGpmSampleGet(gpu.handle, samples[0])
        except nvml.NVMLError as exc:
            for sample in samples:
                self._quietly(nvml.nvmlGpmSampleFree, sample)
            gpu.gpm_note = f"unavailable: {exc}"
            self._refused(gpu, "gpm", exc)
            return
        gpu.gpm = _Gpm(nvml, samples[0], samples[1], now)
        gpu.gpm_note = "active"
        gpu.planned = False

    def _close_gpm(self, gpu: _Gpu, note: str) -> None:
        if gpu.gpm is not None:
            self._quietly(self._nvml.nvmlGpmSampleFree, gpu.gpm.previous)
            self._quietly(self._nvml.nvmlGpmSampleFree, gpu.gpm.current)
            gpu.gpm = None
        gpu.gpm_note = note

    def _read_gpm(self, gpu: _Gpu, now: float, reading: dict[str, Any]) -> None:
        gpm = gpu.gpm
        if gpm is None or not self._measure_gpm(gpu, now):
            return
        reading.update(gpm.ratios)
        for key, total in gpu.integrated.items():
            if key in gpu.unsupported:  # the field value is missing on this GPU: the integrated counter stands in
                reading[key] = total

    def _measure_gpm(self, gpu: _Gpu, now: float) -> bool:
        """Close the GPM interval that began at the last sample: its ratios, its bytes added to the integrated counters.
        Under 100 ms after that sample there is nothing new and the last ratios stand. False when NVML failed it."""
        gpm, nvml = gpu.gpm, self._nvml
        elapsed = now - gpm.taken_at
        if elapsed < MIN_GPM_INTERVAL:
            return True
        try:
            nvml.nvmlGpmSampleGet(gpu.handle, gpm.current)
            gpm.request.sample1 = gpm.previous
            gpm.request.sample2 = gpm.current
            nvml.nvmlGpmMetricsGet(gpm.request)
        except nvml.NVMLError as exc:
            self._refused(gpu, "gpm", exc)
            if "gpm" in gpu.unsupported:
                self._close_gpm(gpu, "unavailable: " + gpu.unsupported["gpm"])
            # A passing failure: no activity this cycle; the previous sample stays, so the next interval is longer.
            gpm.ratios = {}
            return False
        gpm.previous, gpm.current = gpm.current, gpm.previous
        gpm.taken_at = now
        for slot, key in enumerate(gpm.keys):
            metric = gpm.request.metrics[slot]
            if metric.nvmlReturn != nvml.NVML_SUCCESS:
                self._refused(gpu, f"gpm:{key}", nvml.NVMLError(metric.nvmlReturn), self._absent_id_codes)
                gpm.ratios.pop(key, None)
            elif not math.isfinite(metric.value):
                # The H200 answered SUCCESS with NaN (DRAM_BW_UTIL, samples under 100 ms apart): nothing this time.
                gpm.ratios.pop(key, None)
            elif key in GPM_RATES:
                gpu.integrated[key] = gpu.integrated.get(key, 0.0) + metric.value * MIB * elapsed
            else:
                gpm.ratios[key] = metric.value / 100
        return True

    def _add_totals(self, readings: dict[int, GpuReading]) -> dict[str, float]:
        """The node totals with this sample's readings added: byte and ECC counters summed over the GPUs up, kept
        monotonic while GPUs come and go (``node.counters.Totals``)."""
        totals = self._totals
        for reading in readings.values():
            if not reading.up:
                continue
            device = reading.uuid
            for key in TOTAL_KEYS:
                if (value := getattr(reading, key)) is not None:
                    totals.add_reading(device, key, value)
            for key in ("ecc_corrected", "ecc_uncorrected"):
                if (value := getattr(reading, key)) is not None:
                    totals.add_reading(device, key, value)
        return dict(totals.totals)

    # --- Xid events -----------------------------------------------------------------------------------------

    def _open_events(self, gpu: _Gpu) -> None:
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

    def _poll_xids(self, gpu: _Gpu) -> None:
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

    def _count_xid(self, gpu: _Gpu, xid: int) -> None:
        gpu.xids[xid] = gpu.xids.get(xid, 0) + 1
        gpu.xid_total += 1
        gpu.xid_counts = tuple(sorted(gpu.xids.items()))
        log.warning("GPU %d (%s): Xid %d", gpu.index, gpu.uuid, xid)

    # --- session: open, lose, re-open, close ----------------------------------------------------------------

    def _unavailable(self, reason: str, detail: str) -> SourceUnavailable:
        if reason not in self._logged:
            self._logged.add(reason)
            level = logging.INFO if reason == "library_not_found" else logging.WARNING
            log.log(level, "no GPU metrics: %s; retrying every %gs", detail, self.retry_interval)
        return SourceUnavailable(reason, detail, retry_after=self.retry_interval)

    def _open(self, now: float, restart: bool = False) -> None:
        """Take a reference to the NVML session (``restart``: end NVML and start it again for every borrower, so it
        enumerates the GPUs anew) and open every GPU it lists."""
        nvml = self._nvml
        try:
            if restart:
                self._session.restart()
            else:
                self._session.acquire()
        except nvml.NVMLError as exc:
            if restart:  # the reference taken before stays ours to give back
                self._session.release()
                self._initialized = False
            reason = self._init_reasons.get(exc.value, "nvml_init_failed")
            detail = (
                "NVML library libnvidia-ml.so.1 not found"
                if reason == "library_not_found"
                else f"nvmlInit failed: {exc}"
            )
            raise self._unavailable(reason, detail) from None
        self._initialized = True
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as exc:
            self._close_session()
            raise self._unavailable("nvml_init_failed", f"nvmlDeviceGetCount failed: {exc}") from None
        try:
            self._driver = (nvml.nvmlSystemGetDriverVersion(), _cuda_version(nvml.nvmlSystemGetCudaDriverVersion()))
        except nvml.NVMLError as exc:
            self._errors[self._reason(exc)] += 1
        self._unreachable = {i: entry for i, entry in self._unreachable.items() if i < count}
        for nvml_index in range(count):
            self._open_gpu(nvml_index, now)
        for gpu in self._gpus.values():
            if not gpu.up and gpu.lost_reason is None:
                self._lose(gpu, "not found after NVML was re-initialised", now)
        self._ordered = sorted(self._gpus.values(), key=lambda g: g.index)
        self._inventory = [GpuInfo(g.index, g.uuid, g.name) for g in self._ordered]
        # A GPU this process may not open (NO_PERMISSION: a cgroup device rule) is not ours: no re-initialisation
        # for it, which would cut every healthy GPU's Xid registration and GPM interval each retry_interval.
        unreachable = [code for _, code in self._unreachable.values() if code != nvml.NVML_ERROR_NO_PERMISSION]
        missing = unreachable or any(not g.up for g in self._ordered)
        self._reinit_at = now + self.retry_interval if missing else None
        if not self._gpus:
            self._close_session()
            raise self._unavailable(
                "no_gpus",
                "NVML found no GPU"
                if not self._unreachable
                else "NVML lists GPUs but none answers: " + "; ".join(why for why, _ in self._unreachable.values()),
            )
        self._logged.clear()  # a later outage is news again

    def _open_gpu(self, nvml_index: int, now: float) -> None:
        nvml = self._nvml
        gpu = None
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(nvml_index)
            uuid = nvml.nvmlDeviceGetUUID(handle)
            gpu = self._gpus.get(uuid)
            if gpu is None:
                name = nvml.nvmlDeviceGetName(handle)
                pci_bus_id = _text(nvml.nvmlDeviceGetPciInfo(handle).busId)
                gpu = self._gpus[uuid] = _Gpu(self._free_index(nvml_index), uuid, name, pci_bus_id)
            elif gpu.lost_reason is not None:
                log.warning("GPU %d (%s) answers NVML again", gpu.index, gpu.uuid)
            gpu.handle = handle
            gpu.lost_reason = None
            gpu.nvlink_links, gpu.nvlink_kinds, gpu.nvlink_absent = None, NVLINK_ERRORS, set()  # asked anew per open
            max_clock = self._call(gpu, "sm_clock_max", nvml.nvmlDeviceGetMaxClockInfo, handle, nvml.NVML_CLOCK_SM)
            gpu.sm_clock_max_hz = max_clock * 1e6 if max_clock is not None else None
            mig = self._call(gpu, "mig_mode", nvml.nvmlDeviceGetMigMode, handle)
            gpu.mig = bool(mig and mig[0])
            self._open_events(gpu)
            self._open_gpm(gpu, now)
            gpu.planned = False
        except nvml.NVMLError as exc:
            # NVML keeps a GPU that fell off the bus at its index: the GPU known there is the one failing.
            known = gpu or self._gpus.get(self._uuid_at.get(nvml_index, ""))
            if known is not None:
                if known.lost_reason is None:
                    self._lose(known, exc, now)  # counted once per loss, not at every re-initialisation
                else:
                    known.handle, known.lost_reason = None, str(exc)
                return
            first = nvml_index not in self._unreachable
            self._unreachable[nvml_index] = (f"NVML index {nvml_index}: {exc}", exc.value)
            if first:
                self._errors["gpu_lost" if exc.value in self._lost_codes else self._reason(exc)] += 1
                log.warning("GPU at NVML index %d cannot be opened: %s", nvml_index, exc)
            return
        self._uuid_at[nvml_index] = gpu.uuid
        self._unreachable.pop(nvml_index, None)

    def _free_index(self, nvml_index: int) -> int:
        """NVML's index for a GPU first seen now, unless a known (lost) GPU holds that label already."""
        taken = {g.index for g in self._gpus.values()}
        if nvml_index not in taken:
            return nvml_index
        return next(i for i in range(len(taken) + 1) if i not in taken)

    def _mig_changed(self, gpu: _Gpu, mig: bool, now: float) -> None:
        log.info("GPU %d (%s): MIG mode %s", gpu.index, gpu.uuid, "enabled" if mig else "disabled")
        gpu.mig = mig
        # What NVML supports depends on the mode: forget what it refused in the other mode.
        gpu.unsupported = {k: v for k, v in gpu.unsupported.items() if k == "mig_mode"}
        self._close_gpm(gpu, GPM_MIG)
        if not mig:
            self._open_gpm(gpu, now)
        gpu.planned = False

    def _lose(self, gpu: _Gpu, why: Exception | str, now: float) -> None:
        gpu.handle = None
        gpu.mask_at = None  # the time it was away is not integrated into throttle seconds
        gpu.lost_reason = str(why)
        self._errors["gpu_lost"] += 1
        log.warning(
            "GPU %d (%s) lost: %s; the other GPUs keep reporting; NVML is re-initialised every %gs to find it",
            gpu.index,
            gpu.uuid,
            why,
            self.retry_interval,
        )
        if self._reinit_at is None:
            self._reinit_at = now + self.retry_interval

    def _reopen(self, now: float) -> None:
        """Shut NVML down and initialise it again to find lost GPUs, at no cost to the healthy ones. Freeing an event
        set drops the Xid events still queued in it, so every GPU's queue is read first; and a GPM interval can only be
        closed against its own first sample, so each healthy GPU's interval is measured now and its ratios carried (by
        UUID) into the new session, whose first GPM sample starts the next interval. Only Xids past the
        MAX_XIDS_PER_CYCLE read here, or raised between this read and the new session's registration, can be missed."""
        for gpu in self._ordered:
            self._poll_xids(gpu)
            if gpu.up and gpu.gpm is not None:
                try:
                    self._measure_gpm(gpu, now)
                except self._nvml.NVMLError as exc:
                    if exc.value not in self._lost_codes:
                        raise
                    self._lose(gpu, exc, now)
        activity = {gpu.uuid: gpu.gpm.ratios for gpu in self._ordered if gpu.up and gpu.gpm is not None}
        self._release_handles()
        self._open(now, restart=True)
        for gpu in self._ordered:
            if gpu.gpm is not None and gpu.uuid in activity:
                gpu.gpm.ratios = activity[gpu.uuid]

    def _release_handles(self) -> None:
        """Free what this session gave: GPM samples and Xid event sets; handles are void after it."""
        nvml = self._nvml
        for gpu in self._gpus.values():
            self._close_gpm(gpu, "not opened")
            if gpu.event_set is not None:
                self._quietly(nvml.nvmlEventSetFree, gpu.event_set)
                gpu.event_set = None
            gpu.handle = None

    def _close_session(self) -> None:
        self._release_handles()
        if self._initialized:
            self._session.release()
            self._initialized = False

    def close(self) -> None:
        self._close_session()

    # --- status ---------------------------------------------------------------------------------------------

    def _status(self, rows: tuple) -> dict[str, Any]:
        notes: dict[str, list[int]] = {}
        gpus = []
        for gpu, reading in rows:
            gpus.append(
                {
                    "index": gpu.index,
                    "uuid": gpu.uuid,
                    "name": gpu.name,
                    "pci_bus_id": gpu.pci_bus_id,
                    "up": reading.up,
                    "lost_reason": gpu.lost_reason,
                    "mig": gpu.mig,
                    "gpm": gpu.gpm_note,
                    "unsupported": dict(gpu.unsupported),
                    "xid_errors": gpu.xid_total,
                    # the readings the status page shows
                    "utilization": reading.utilization,
                    "tensor_active": reading.tensor_active,
                    "hardware_flops_utilization": reading.hardware_flops_utilization,
                    "sm_clock_hz": reading.sm_clock_hz,
                    "temperature_celsius": reading.temperature,
                    "power_watts": reading.power_watts,
                    "throttle": list(reading.throttle_reasons),
                    "throttle_seconds": dict(reading.throttle_seconds),
                    "throttle_time_from": {
                        reason: "field" if reason in gpu.throttle_field else "samples"
                        for reason, _ in reading.throttle_seconds
                    },
                    "memory_reserved_bytes": gpu.memory_reserved,
                    "nvlink_links": gpu.nvlink_links,
                    "nvlink_errors": _nvlink_by_kind(gpu),
                }
            )
            if not reading.up:
                notes.setdefault(
                    f"lost ({gpu.lost_reason}); NVML is re-initialised every {self.retry_interval:g}s to find it", []
                ).append(gpu.index)
                continue
            if gpu.mig:
                notes.setdefault(
                    "in MIG mode: NVML reports no utilization and GPM is per instance there (not read yet); "
                    "identity, memory, clocks, power, temperature, throttling and errors are still exported",
                    [],
                ).append(gpu.index)
            elif gpu.gpm_note != "active":
                notes.setdefault(f"no tensor/SM/DRAM activity series: GPM {gpu.gpm_note}", []).append(gpu.index)
            elif gpu.peak_clock_hz is None:
                notes.setdefault(
                    f"no hardware FLOPs estimate: the reference tensor clock of {gpu.name} is not in the peak table", []
                ).append(gpu.index)
        lines = [
            f"GPU{'s' if len(indices) > 1 else ''} {', '.join(map(str, indices))}: {text}"
            for text, indices in notes.items()
        ]
        lines += [
            f"cannot open {why}"
            + (" (not this process's: no re-initialisation for it)" if code == self._no_permission else "")
            for why, code in self._unreachable.values()
        ]
        return {
            "driver_version": self._driver[0] if self._driver else None,
            "cuda_driver_version": self._driver[1] if self._driver else None,
            "gpus": gpus,
            "notes": lines,
        }


def _nvlink_by_kind(gpu: _Gpu) -> dict[str, float]:
    """The GPU's NVLink errors by kind (summed over links), for the status page: the metric has only the sum."""
    out: dict[str, float] = {}
    for (field_id, _), value in gpu.nvlink_values.items():
        kind = _NVLINK_KIND[field_id]
        out[kind] = out.get(kind, 0.0) + value
    return out


# Built once, not per GPU and sample: the status is made every second.
_NVLINK_KIND = {field_id: kind for kind, field_id in (*NVLINK_ERRORS, *NVLINK_ERRORS_NEWER)}


def _field_key(spec: tuple) -> str:
    """The ``unsupported`` key of a field spec: the reading key of a counter, ``throttle:<reason>``,
    ``nvlink:<field>:<link>``."""
    tag, key, field_id, scope, _ = spec
    if tag == "counter":
        return key
    return f"throttle:{key}" if tag == "throttle" else f"nvlink:{field_id}:{scope}"


def _field_number(value: Any) -> float:
    """The number in an nvmlFieldValue_t, read through the union member its valueType names."""
    return getattr(_member(value, "value"), _VALUE_MEMBERS[_member(value, "valueType")])


# pynvml's structures override __getattribute__ in Python only to turn bytes into str. A field value has no bytes
# member, so reading its members through object's lookup gives the same numbers without that Python call: 78 fields
# on each of 8 GPUs every second made it most of the source's own work.
_member = object.__getattribute__


# nvml.h nvmlValueType_t: DOUBLE, UNSIGNED_INT, UNSIGNED_LONG, UNSIGNED_LONG_LONG, SIGNED_LONG_LONG, SIGNED_INT,
# UNSIGNED_SHORT.
_VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")
_NARROW_TYPES = frozenset({1, 5, 6})  # 32- and 16-bit value types: counters that wrap too soon to be rated
