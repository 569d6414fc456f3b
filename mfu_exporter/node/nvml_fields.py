"""NVML field values: which fields a GPU is asked for (power, energy, ECC counts, health, byte counters, throttle time,
NVLink errors per link), how their values are decoded, and the clock-event reason bits.

Every field goes into one ``nvmlDeviceGetFieldValues`` call per GPU and sample: one trip into the driver where a call
per figure made six. A field the driver lacks is remembered per GPU and left out of the next request; its figure then
comes from its own call (``mfu_exporter.node.nvml_gpus``), and a byte counter answered in 32 bits is left to GPM's rate
(``mfu_exporter.node.gpm``). Utilization, memory, the SM clock, the GPU temperature and the clock-event reasons have
no field ID in nvml.h: they stay calls.
"""

from __future__ import annotations

from typing import Any

from mfu_exporter.node.nvml_calls import GpuState, NvmlCalls

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
# and _HW_POWER_BRAKE_SLOWDOWN. Four reasons, not seven: 32 series on an 8-GPU node, which with NVLink's errors fits
# the ~40 the node's series budget leaves for them (tests/unit/test_series_budget.py).
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

# Seconds between two reads of a GPU's NVLink error counters. They are 4 fields a link, 72 of the 78 in an 18-link
# GPU's request at series: standard, and they rarely move; what reads them (MfuGpuNvlinkErrors: an increase over 10
# minutes, the status page) loses nothing at 10 s, while each 1 s sample asks for 6 fields instead of 78.
NVLINK_READ_INTERVAL = 10.0
ALL_LINKS = 0xFFFFFFFF  # nvml.h: a scopeId of UINT_MAX sums an NVLink throughput field over all links
# Cumulative byte counters read as NVML field values: (reading key, field ID, scope ID, bytes per unit).
# IDs are nvml.h's NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX (KiB) and NVML_FI_DEV_PCIE_COUNT_TX/RX_BYTES.
FIELD_COUNTERS = (
    ("nvlink_transmit_bytes", 138, ALL_LINKS, 1024),
    ("nvlink_receive_bytes", 139, ALL_LINKS, 1024),
    ("pcie_transmit_bytes", 197, 0, 1),
    ("pcie_receive_bytes", 198, 0, 1),
)
# Figures read as field values in place of a call each: (reading key, field ID, scope ID, scale to base units).
# NVML_FI_DEV_POWER_AVERAGE is what nvmlDeviceGetPowerUsage returns on Ampere and newer (the last second's average,
# mW; scope NVML_POWER_SCOPE_GPU); NVML_FI_DEV_POWER_CURRENT_LIMIT the limit in force (mW);
# NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION mJ since the driver loaded; NVML_FI_DEV_ECC_SBE_VOL_TOTAL and _DBE_VOL_TOTAL
# the volatile corrected and uncorrected counts of nvmlDeviceGetTotalEccErrors. GA100 and older have no averaged
# power: their GPUs answer it NOT_SUPPORTED and get the instant figure from the call.
FIELD_FIGURES = (
    ("power_watts", 185, 0, 1e-3),
    ("power_limit_watts", 190, 0, 1e-3),
    ("energy_joules", 83, 0, 1e-3),
    ("ecc_corrected", 3, 0, 1),
    ("ecc_uncorrected", 4, 0, 1),
)
# What the driver says a GPU needs, read every cycle (they are 4 fields of the one request, and a GPU's health is
# what an operator acts on): nvml.h's NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (an nvmlDeviceGpuRecoveryAction_t),
# NVML_FI_DEV_REMAPPED_PENDING and NVML_FI_DEV_REMAPPED_FAILURE (row remapping, Ampere and newer) and
# NVML_FI_DEV_RETIRED_PENDING (page retirement, older GPUs). mfu_exporter.model.xid says what each value means.
HEALTH_FIELDS = (
    ("recovery_action", 230),
    ("remap_pending", 144),
    ("remap_failed", 145),
    ("retirement_pending", 31),
)
# The field request of a GPU: (tag, key, field ID, scope ID, scale) per field; tag "figure", "counter", "throttle",
# "health" or "nvlink".
FieldSpec = tuple[str, str, int, int, float]


def decode_throttle_reasons(mask: int) -> list[str]:
    """The names of the clock-event reasons set in an NVML bitmask, in THROTTLE_REASONS order."""
    return [name for name, bit in THROTTLE_REASONS if mask & bit]


class FieldValues(NvmlCalls):
    """Reads a GPU's field values through the NVML gate; ``read_nvlink_errors`` says whether the series level
    (``sources.gpu.series``) exports what those fields feed. The throttle-time fields are read at every level: the
    loss attribution reads the share of each interval they grew by."""

    read_nvlink_errors = True
    figures_read: frozenset[str] = frozenset(key for key, _, _, _ in FIELD_FIGURES)  # the figures the level exports

    def _plan_fields(self, gpu: GpuState) -> None:
        """Which field values to request, given what this GPU refused so far and what the series level exports."""
        specs: list[FieldSpec] = [
            ("figure", key, field_id, scope, scale)
            for key, field_id, scope, scale in FIELD_FIGURES
            if key in self.figures_read
        ]
        specs += [("counter", key, field_id, scope, scale) for key, field_id, scope, scale in FIELD_COUNTERS]
        specs += [("health", key, field_id, 0, 1) for key, field_id in HEALTH_FIELDS]
        specs += [("throttle", reason, field_id, 0, THROTTLE_FIELD_SECONDS) for reason, field_id, _ in THROTTLE_TIME]
        nvlink: list[FieldSpec] = []
        if self.read_nvlink_errors:
            nvlink = [
                ("nvlink", kind, field_id, link, 1)
                for link in range(self._nvlink_links(gpu))
                for kind, field_id in gpu.nvlink_kinds
                if (field_id, link) not in gpu.nvlink_absent
            ]
        gpu.field_specs = tuple(spec for spec in specs if field_key(spec) not in gpu.unsupported)
        gpu.field_specs_nvlink = gpu.field_specs + tuple(
            spec for spec in nvlink if field_key(spec) not in gpu.unsupported
        )
        gpu.field_request = [(field_id, scope) for _, _, field_id, scope, _ in gpu.field_specs]
        gpu.field_request_nvlink = [(field_id, scope) for _, _, field_id, scope, _ in gpu.field_specs_nvlink]
        gpu.nvlink_read_at = None  # a new plan (a link found absent, the newer counters) is tried at once

    def _nvlink_links(self, gpu: GpuState) -> int:
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
                    gpu.nvlink_links = int(field_number(value))
                else:
                    gpu.unsupported["nvlink_errors"] = f"link count: {self._nvml.NVMLError(value.nvmlReturn)}"
                if gpu.nvlink_links == 0:
                    gpu.unsupported.setdefault("nvlink_errors", "no NVLink links")
        return gpu.nvlink_links

    def _read_fields(self, gpu: GpuState, reading: dict[str, Any], now: float) -> None:
        """This cycle's field values into ``reading`` (byte counters) and ``gpu`` (throttle time, NVLink errors).
        The NVLink error fields are asked every ``NVLINK_READ_INTERVAL`` seconds; between, their last values stand."""
        specs, request = gpu.field_specs, gpu.field_request
        if gpu.nvlink_read_at is None or not 0 <= now - gpu.nvlink_read_at < NVLINK_READ_INTERVAL:
            gpu.nvlink_read_at = now
            specs, request = gpu.field_specs_nvlink, gpu.field_request_nvlink
        if request:
            try:
                values = self._nvml.nvmlDeviceGetFieldValues(gpu.handle, request)
            except self._nvml.NVMLError as exc:
                if exc.value in self._absent_codes:
                    for spec in specs:
                        self._refused(gpu, field_key(spec), exc)
                else:
                    self._refused(gpu, "fields", exc)
                return
            gpu.fields_at = now
            success = self._nvml.NVML_SUCCESS
            for spec, value in zip(specs, values):
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
                    elif tag == "counter" or tag == "figure":
                        reading[key] = number
                    elif tag == "throttle":
                        gpu.throttle_field[key] = number
                    elif tag == "health":
                        gpu.health_fields[key] = number
                    else:
                        gpu.nvlink_values[(field_id, scope)] = number
                elif tag == "nvlink" and code in self._absent_id_codes:
                    gpu.nvlink_absent.add((field_id, scope))  # an inactive link, or a counter this driver lacks
                    gpu.planned = False
                else:  # UNKNOWN from a GPU that still answers: counted, this field skipped this cycle (_refused)
                    self._refused(gpu, field_key(spec), self._nvml.NVMLError(code), self._absent_id_codes)
        self._nvlink_total(gpu, reading)

    def _nvlink_total(self, gpu: GpuState, reading: dict[str, Any]) -> None:
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

    def _throttle_time(
        self, gpu: GpuState, mask: int | None, now: float
    ) -> tuple[tuple[tuple[str, float], ...], tuple[tuple[str, float], ...]]:
        """Each reason's cumulative throttle seconds, and the share of the time since the previous sample it held the
        clock down (the counter's growth over that time). The seconds are its field where the driver answers it, else
        its bit integrated over samples (the state a sample reads is taken to have held since the previous sample)."""
        elapsed = now - gpu.mask_at if gpu.mask_at is not None and mask is not None else 0.0
        if mask is not None:
            gpu.mask_at = now
        seconds = []
        for reason, _, bit in THROTTLE_TIME:
            if reason in gpu.throttle_field:
                seconds.append((reason, gpu.throttle_field[reason]))
            elif f"throttle:{reason}" in gpu.unsupported and mask is not None:
                total = gpu.throttle_integrated.get(reason, 0.0) + (elapsed if mask & bit else 0.0)
                gpu.throttle_integrated[reason] = total
                seconds.append((reason, total))
        if gpu.throttle_field and gpu.fields_at != now:
            return tuple(seconds), ()  # the counters were not read this time: the next share spans both intervals
        previous, since = gpu.throttle_last, gpu.throttle_last_at
        gpu.throttle_last, gpu.throttle_last_at = dict(seconds), now
        span = now - since if since is not None else 0.0
        if span <= 0:
            return tuple(seconds), ()
        ratios = []
        for reason, total in seconds:
            grown = total - previous.get(reason, total)
            if grown >= 0:  # a counter that went back (the driver reloaded) says nothing of this interval
                ratios.append((reason, min(grown / span, 1.0)))
        return tuple(seconds), tuple(ratios)


def nvlink_by_kind(gpu: GpuState) -> dict[str, float]:
    """The GPU's NVLink errors by kind (summed over links), for the status page: the metric has only the sum."""
    out: dict[str, float] = {}
    for (field_id, _), value in gpu.nvlink_values.items():
        kind = _NVLINK_KIND[field_id]
        out[kind] = out.get(kind, 0.0) + value
    return out


# Built once, not per GPU and sample: the status is made every second.
_NVLINK_KIND = {field_id: kind for kind, field_id in (*NVLINK_ERRORS, *NVLINK_ERRORS_NEWER)}


def field_key(spec: tuple[str, str, int, int, float]) -> str:
    """The ``unsupported`` key of a field spec: ``field:<reading key>`` of a figure (its call has the figure's own
    key), the reading key of a counter, ``health:<key>``, ``throttle:<reason>``, ``nvlink:<field>:<link>``."""
    tag, key, field_id, scope, _ = spec
    if tag == "counter":
        return key
    if tag == "figure":
        return FIGURE_FIELD_KEYS[key]
    if tag == "health":
        return f"health:{key}"
    return f"throttle:{key}" if tag == "throttle" else f"nvlink:{field_id}:{scope}"


FIGURE_FIELD_KEYS = {key: f"field:{key}" for key, _, _, _ in FIELD_FIGURES}


def field_number(value: Any) -> float:
    """The number in an nvmlFieldValue_t, read through the union member its valueType names."""
    return float(getattr(_member(value, "value"), _VALUE_MEMBERS[_member(value, "valueType")]))


# pynvml's structures override __getattribute__ in Python only to turn bytes into str. A field value has no bytes
# member, so reading its members through object's lookup gives the same numbers without that Python call: 78 fields
# on each of 8 GPUs every second made it most of the source's own work.
_member = object.__getattribute__


# nvml.h nvmlValueType_t: DOUBLE, UNSIGNED_INT, UNSIGNED_LONG, UNSIGNED_LONG_LONG, SIGNED_LONG_LONG, SIGNED_INT,
# UNSIGNED_SHORT.
_VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")
_NARROW_TYPES = frozenset({1, 5, 6})  # 32- and 16-bit value types: counters that wrap too soon to be rated
