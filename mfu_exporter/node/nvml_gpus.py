"""Every GPU of the node through NVML (pynvml, or the fake of it): the session, each GPU's figures per cycle, GPM,
field values and Xid events. Returns figures in base units; the GPU source (``mfu_exporter.sources.gpu``) makes them
readings.

Cheap by construction: NVML is initialised once; handles, Xid event sets, GPM samples and the GPM request struct
are opened once per GPU and reused; a call NVML refuses for good is remembered per GPU and not made again
(``mfu_exporter.node.nvml_calls``); a call whose figure the series level does not use is not made (``GpuReads``).

Faults stay local to one GPU: a GPU that answers GPU_IS_LOST or RESET_REQUIRED, or UNKNOWN and then fails its UUID
too, is marked down (its figures disappear, a ``gpu_lost`` error is counted once) while the others keep reporting;
an UNKNOWN from a GPU that still answers degrades only that call, field, GPM metric or Xid registration. Every
``retry_interval`` while a GPU is missing, NVML is shut down and initialised again to find it (a new session
enumerates the GPUs anew, which finds one that was reset or re-bound to the driver). NVML counts its inits
(nvml.h), so the session is the process's one (``mfu_exporter.node.nvml.NvmlSession``), borrowed by discovery and
preflight too: the restart really ends it. Real NVML keeps a GPU that fell off the bus at its index, so the failing
index is that same lost GPU, never a second one. A GPU this process may not open (NO_PERMISSION) is listed once and
not re-initialised for. The re-initialisation costs the healthy GPUs nothing: the old session's queued Xid events
and GPM interval are read before it closes (``_reopen``). GPUs are keyed by UUID, so a GPU keeps its index label
(the index NVML gave it when first seen) across re-initialisations.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

from mfu_exporter.node.gpm import (
    GPM_ACTIVITY,
    GPM_MIG,
    GPM_NOT_SUPPORTED,
    GPM_OFF,
    GPM_RATES,
    MIB,
    MIN_GPM_INTERVAL,
    Gpm,
)
from mfu_exporter.node.nvml import NvmlSession, clock_event_reasons
from mfu_exporter.node.nvml_calls import GpuState, NvmlUnavailable
from mfu_exporter.node.nvml_fields import (
    FIELD_COUNTERS,
    FIGURE_FIELD_KEYS,
    NVLINK_ERRORS,
    FieldValues,
    decode_throttle_reasons,
)
from mfu_exporter.node.xid import XidEvents

log = logging.getLogger(__name__)

# Seconds between reads of a GPU's MIG mode: 0.53 ms a call on a real H200 (docs/benchmarks.md), 4 ms a second on
# an 8-GPU node if read every sample, for a mode an operator changes by hand, rarely, with the GPU idle. A change is
# seen within this time (and at once after NVML is re-initialised, which reads it when it opens the GPU); a clock
# that went back reads it again.
MIG_READ_INTERVAL = 10.0


@dataclass(frozen=True)
class GpuReads:
    """Which of a GPU's figures a cycle reads: the calls whose figures the series level exports per GPU (the node
    summaries, the attribution and the job model read the rest at every level)."""

    memory: bool = True  # nvmlDeviceGetMemoryInfo: used, total, reserved
    power: bool = True  # the power and power limit fields (or nvmlDeviceGetPowerUsage, ...GetEnforcedPowerLimit)
    temperature: bool = True  # nvmlDeviceGetTemperature
    # The energy field (or nvmlDeviceGetTotalEnergyConsumption: 4.7 ms of a 6.4 ms sample on a real H200).
    energy: bool = True
    nvlink_errors: bool = True  # the NVLink error fields, per link (4 a link: 72 on an 18-link GPU)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _cuda_version(number: int) -> str:
    """NVML's CUDA driver version integer (12080) as "12.8"."""
    return f"{number // 1000}.{number % 1000 // 10}"


class NvmlGpus(FieldValues, XidEvents):
    """The node's GPUs through one NVML session; see the module docstring for costs and fault handling."""

    def __init__(
        self,
        nvml: Any,
        figure_keys: tuple[str, ...],
        retry_interval: float = 60.0,
        gpm: bool = True,
        session: NvmlSession | None = None,
        reads: GpuReads = GpuReads(),
        peak_clock_hz: Callable[[str], float | None] = lambda name: None,
    ):
        super().__init__(nvml)
        self.retry_interval = retry_interval
        self.reads = reads
        self.read_nvlink_errors = reads.nvlink_errors
        # The figures read as field values (node.nvml_fields.FIELD_FIGURES) at this level, and the call each comes
        # from on a GPU that does not answer its field: (its ``unsupported`` key, function, arguments after the
        # handle, scale to base units). ECC counts are volatile: since the driver loaded, updated live (the aggregate
        # ones lag in the infoROM); energy is in millijoules, power in milliwatts.
        calls = {
            "power_watts": ("power", nvml.nvmlDeviceGetPowerUsage, (), 1e-3),
            "power_limit_watts": ("power_limit", nvml.nvmlDeviceGetEnforcedPowerLimit, (), 1e-3),
            "energy_joules": ("energy", nvml.nvmlDeviceGetTotalEnergyConsumption, (), 1e-3),
            "ecc_corrected": (
                "ecc_corrected",
                nvml.nvmlDeviceGetTotalEccErrors,
                (nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, nvml.NVML_VOLATILE_ECC),
                1.0,
            ),
            "ecc_uncorrected": (
                "ecc_uncorrected",
                nvml.nvmlDeviceGetTotalEccErrors,
                (nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC),
                1.0,
            ),
        }
        wanted = {"power_watts": reads.power, "power_limit_watts": reads.power, "energy_joules": reads.energy}
        self._figure_calls = {key: call for key, call in calls.items() if wanted.get(key, True)}
        self.figures_read = frozenset(self._figure_calls)
        self._gpm_enabled = gpm
        self._peak_clock_hz = peak_clock_hz  # a model name's reference tensor clock (the hardware FLOPs estimate)
        self._init_reasons = {
            nvml.NVML_ERROR_LIBRARY_NOT_FOUND: "library_not_found",
            nvml.NVML_ERROR_DRIVER_NOT_LOADED: "driver_not_loaded",
            nvml.NVML_ERROR_NO_PERMISSION: "no_permission",
            nvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH: "driver_library_mismatch",
        }
        # NVML is borrowed from the process's one session (discovery and preflight borrow it too): see mfu_exporter.node.nvml.
        self._session = session or NvmlSession(nvml)
        self._initialized = False  # whether this reader holds a reference to the session
        self.no_permission = nvml.NVML_ERROR_NO_PERMISSION
        self.reset_required = nvml.NVML_ERROR_RESET_REQUIRED
        self._clock_memo: dict[str, bool] = {}  # which clock-event call this driver has (mfu_exporter.node.nvml)
        self._gpus: dict[str, GpuState] = {}
        self._ordered: list[GpuState] = []
        # NVML indices this session could not open: index -> (why, NVML error code). A GPU NVML keeps listing after
        # it fell off the bus (nvml.h: it keeps its index) is not here: it is a lost GPU, listed once as such.
        self.unreachable: dict[int, tuple[str, int]] = {}
        self._uuid_at: dict[int, str] = {}  # the UUID each NVML index had when it last opened
        self.driver: tuple[str, str] | None = None  # (driver version, CUDA driver version)
        self._reinit_at: float | None = None
        self._logged: set[str] = set()
        self._blank: dict[str, Any] = dict.fromkeys(figure_keys)

    @property
    def gpus(self) -> list[GpuState]:
        """The GPUs known, up or lost, by index."""
        return self._ordered

    @property
    def by_uuid(self) -> dict[str, GpuState]:
        return self._gpus

    def read(self, now: float) -> list[tuple[GpuState, dict[str, Any] | None]]:
        """One cycle: every known GPU with its figures, None for a GPU that is down (lost now or before). Raises
        ``NvmlUnavailable`` when NVML cannot be used at all; this cycle's errors are in ``errors`` after it."""
        self._errors = Counter()
        if self._initialized and self._reinit_at is not None and now >= self._reinit_at:
            log.info("re-initialising NVML to look for lost GPUs")
            self._reopen(now)
        if not self._initialized:
            self._open(now)
        rows: list[tuple[GpuState, dict[str, Any] | None]] = []
        for gpu in self._ordered:
            self._poll_xids(gpu)
            figures = None
            if gpu.up:
                try:
                    figures = self._sample_gpu(gpu, now)
                except self._nvml.NVMLError as exc:
                    if exc.value not in self._lost_codes:
                        raise
                    self._lose(gpu, exc, now)
            rows.append((gpu, figures))
        return rows

    @property
    def errors(self) -> Counter[str]:
        """Problems met by the last ``read`` that did not fail it, by reason."""
        return self._errors

    def _sample_gpu(self, gpu: GpuState, now: float) -> dict[str, Any]:
        """One GPU's figures this cycle (the reading's keyword arguments past its identity), in base units."""
        nvml, handle, call, reads = self._nvml, gpu.handle, self._call, self.reads
        if gpu.mig_read_at is None or not 0 <= now - gpu.mig_read_at < MIG_READ_INTERVAL:
            gpu.mig_read_at = now
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
        memory = self._memory(gpu) if reads.memory else None
        if memory is not None:
            reading["memory_used_bytes"] = float(memory.used)
            reading["memory_total_bytes"] = float(memory.total)
            gpu.memory_reserved = float(getattr(memory, "reserved", 0.0)) or None
        clock = call(gpu, "sm_clock", nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM)
        if clock is not None:
            reading["sm_clock_hz"] = clock * 1e6
        temperature = (
            call(gpu, "temperature", nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU)
            if reads.temperature
            else None
        )
        if temperature is not None:
            reading["temperature"] = float(temperature)
        mask = call(gpu, "clocks_event_reasons", clock_event_reasons, nvml, handle, self._clock_memo)
        if mask is not None:
            reading["clocks_event_reasons"] = mask
            throttle_reasons = tuple(decode_throttle_reasons(mask))
        else:
            throttle_reasons = ()
        self._read_fields(gpu, reading, now)
        for key in self._figure_calls:
            if FIGURE_FIELD_KEYS[key] in gpu.unsupported:  # the field is not answered here: the figure's own call
                call_key, function, args, scale = self._figure_calls[key]
                value = call(gpu, call_key, function, handle, *args)
                if value is not None:
                    reading[key] = value * scale
        throttle_seconds, throttle_ratio = self._throttle_time(gpu, mask, now)
        self._read_gpm(gpu, now, reading)
        tensor, sm_clock = reading["tensor_active"], reading["sm_clock_hz"]
        if tensor is not None and sm_clock is not None and gpu.peak_clock_hz:
            reading["hardware_flops_utilization"] = tensor * sm_clock / gpu.peak_clock_hz
        return {
            "throttle_reasons": throttle_reasons,
            "throttle_seconds": throttle_seconds,
            "throttle_ratio": throttle_ratio,
            **reading,
        }

    def _plan(self, gpu: GpuState) -> None:
        """Which field values and GPM metrics to request, given what this GPU refused so far."""
        self._plan_fields(gpu)
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

    def _memory(self, gpu: GpuState) -> Any:
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

    def _open_gpm(self, gpu: GpuState, now: float) -> None:
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
        gpu.gpm = Gpm(nvml, samples[0], samples[1], now)
        gpu.gpm_note = "active"
        gpu.planned = False

    def _close_gpm(self, gpu: GpuState, note: str) -> None:
        if gpu.gpm is not None:
            self._quietly(self._nvml.nvmlGpmSampleFree, gpu.gpm.previous)
            self._quietly(self._nvml.nvmlGpmSampleFree, gpu.gpm.current)
            gpu.gpm = None
        gpu.gpm_note = note

    def _read_gpm(self, gpu: GpuState, now: float, reading: dict[str, Any]) -> None:
        gpm = gpu.gpm
        if gpm is None or not self._measure_gpm(gpu, now):
            return
        reading.update(gpm.ratios)
        for key, total in gpu.integrated.items():
            if key in gpu.unsupported:  # the field value is missing on this GPU: the integrated counter stands in
                reading[key] = total

    def _measure_gpm(self, gpu: GpuState, now: float) -> bool:
        """Close the GPM interval that began at the last sample: its ratios, its bytes added to the integrated counters.
        Under 100 ms after that sample there is nothing new and the last ratios stand. False when NVML failed it."""
        gpm, nvml = gpu.gpm, self._nvml
        assert gpm is not None  # the callers measure GPUs with GPM open
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

    def _unavailable(self, reason: str, detail: str) -> NvmlUnavailable:
        if reason not in self._logged:
            self._logged.add(reason)
            level = logging.INFO if reason == "library_not_found" else logging.WARNING
            log.log(level, "no GPU metrics: %s; retrying every %gs", detail, self.retry_interval)
        return NvmlUnavailable(reason, detail, self.retry_interval)

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
            self.driver = (nvml.nvmlSystemGetDriverVersion(), _cuda_version(nvml.nvmlSystemGetCudaDriverVersion()))
        except nvml.NVMLError as exc:
            self._errors[self._reason(exc)] += 1
        self.unreachable = {i: entry for i, entry in self.unreachable.items() if i < count}
        for nvml_index in range(count):
            self._open_gpu(nvml_index, now)
        for gpu in self._gpus.values():
            if not gpu.up and gpu.lost_reason is None:
                self._lose(gpu, "not found after NVML was re-initialised", now)
        self._ordered = sorted(self._gpus.values(), key=lambda g: g.index)
        # A GPU this process may not open (NO_PERMISSION: a cgroup device rule) is not ours: no re-initialisation
        # for it, which would cut every healthy GPU's Xid registration and GPM interval each retry_interval.
        unreachable = [code for _, code in self.unreachable.values() if code != nvml.NVML_ERROR_NO_PERMISSION]
        missing = unreachable or any(not g.up for g in self._ordered)
        self._reinit_at = now + self.retry_interval if missing else None
        if not self._gpus:
            self._close_session()
            raise self._unavailable(
                "no_gpus",
                "NVML found no GPU"
                if not self.unreachable
                else "NVML lists GPUs but none answers: " + "; ".join(why for why, _ in self.unreachable.values()),
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
                gpu = self._gpus[uuid] = GpuState(self._free_index(nvml_index), uuid, name, pci_bus_id)
                gpu.peak_clock_hz = self._peak_clock_hz(name)
            elif gpu.lost_reason is not None:
                log.warning("GPU %d (%s) answers NVML again", gpu.index, gpu.uuid)
            gpu.handle = handle
            gpu.lost_reason = gpu.lost_code = None
            gpu.nvlink_links, gpu.nvlink_kinds, gpu.nvlink_absent = None, NVLINK_ERRORS, set()  # asked anew per open
            max_clock = self._call(gpu, "sm_clock_max", nvml.nvmlDeviceGetMaxClockInfo, handle, nvml.NVML_CLOCK_SM)
            gpu.sm_clock_max_hz = max_clock * 1e6 if max_clock is not None else None
            mig = self._call(gpu, "mig_mode", nvml.nvmlDeviceGetMigMode, handle)
            gpu.mig = bool(mig and mig[0])
            gpu.mig_read_at = now
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
                    known.handle, known.lost_reason, known.lost_code = None, str(exc), exc.value
                return
            first = nvml_index not in self.unreachable
            self.unreachable[nvml_index] = (f"NVML index {nvml_index}: {exc}", exc.value)
            if first:
                self._errors["gpu_lost" if exc.value in self._lost_codes else self._reason(exc)] += 1
                log.warning("GPU at NVML index %d cannot be opened: %s", nvml_index, exc)
            return
        self._uuid_at[nvml_index] = gpu.uuid
        self.unreachable.pop(nvml_index, None)

    def _free_index(self, nvml_index: int) -> int:
        """NVML's index for a GPU first seen now, unless a known (lost) GPU holds that label already."""
        taken = {g.index for g in self._gpus.values()}
        if nvml_index not in taken:
            return nvml_index
        return next(i for i in range(len(taken) + 1) if i not in taken)

    def _mig_changed(self, gpu: GpuState, mig: bool, now: float) -> None:
        log.info("GPU %d (%s): MIG mode %s", gpu.index, gpu.uuid, "enabled" if mig else "disabled")
        gpu.mig = mig
        # What NVML supports depends on the mode: forget what it refused in the other mode.
        gpu.unsupported = {k: v for k, v in gpu.unsupported.items() if k == "mig_mode"}
        self._close_gpm(gpu, GPM_MIG)
        if not mig:
            self._open_gpm(gpu, now)
        gpu.planned = False

    def _lose(self, gpu: GpuState, why: Exception | str, now: float) -> None:
        gpu.handle = None
        gpu.mask_at = None  # the time it was away is not integrated into throttle seconds
        gpu.throttle_last_at = None  # nor shared out over the next sample's interval
        gpu.lost_reason = str(why)
        gpu.lost_code = getattr(why, "value", None)
        gpu.health_fields = {}  # what NVML said of it before the loss no longer stands
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
