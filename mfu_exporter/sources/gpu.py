"""GPU source: the node's GPUs through NVML, as typed readings (``GpuSample``) each cycle.

The NVML module is injected: production passes ``pynvml``, tests and the demo pass ``mfu_exporter.sim.nvml``. The
reading of NVML is ``mfu_exporter.node.nvml_gpus`` (its session, field values, GPM and Xid events, each in its own
module beside it); this source chooses what a cycle reads from its series level (``READ_LEVELS``), turns the
figures into ``GpuReading``s, keeps the node's totals and writes the status. ``mfu_exporter.render.gpu`` turns the
sample into metric families.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

from mfu_exporter.config import GpuConfig
from mfu_exporter.model.flops import gpu_model
from mfu_exporter.model.readings import GpuInfo, GpuReading
from mfu_exporter.model.xid import Conditions, GpuHealth, HealthView
from mfu_exporter.node.counters import Totals
from mfu_exporter.node.nvml import NvmlSession
from mfu_exporter.node.nvml_calls import GpuState, NvmlUnavailable
from mfu_exporter.node.nvml_fields import nvlink_by_kind
from mfu_exporter.node.nvml_gpus import GpuReads, NvmlGpus
from mfu_exporter.sources.base import Snapshot, SourceContext, SourceUnavailable, exports

# The lowest series level (sources.gpu.series) at which a cycle makes each optional call: the level of the per-GPU
# family it feeds (mfu_exporter.render.gpu's tables; tests/unit/sources/test_gpu_reads.py holds the two to each other). Every
# other call feeds a node summary, the attribution or the job model, and is made at every level: the throttle-time
# fields among them, whose growth over each interval the attribution reads (mfu_gpu_throttle_seconds is standard).
READ_LEVELS = {
    "memory": "standard",  # mfu_gpu_memory_used_bytes
    "power": "standard",  # mfu_gpu_power_watts, mfu_gpu_power_limit_watts
    "temperature": "standard",  # mfu_gpu_temperature_celsius
    "energy": "full",  # mfu_gpu_energy_joules
    "nvlink_errors": "standard",  # mfu_gpu_nvlink_errors
}
# Node totals kept monotonic while GPUs come and go (node.counters.Totals): reading keys, at every level.
TOTAL_KEYS = ("nvlink_transmit_bytes", "nvlink_receive_bytes", "pcie_transmit_bytes", "pcie_receive_bytes")
# A reading's figures (every per-GPU gauge and counter of render/gpu.py among them): the GpuReading fields that are
# None until NVML gives them. A cycle fills a dict of them, then builds the reading.
READING_KEYS = tuple(f.name for f in dataclasses.fields(GpuReading) if f.default is None)


def reads_at(series: str) -> GpuReads:
    """The calls a cycle makes at a series level."""
    return GpuReads(**{call: exports(series, level) for call, level in READ_LEVELS.items()})


def _peak_clock_hz(name: str) -> float | None:
    model = gpu_model(name)
    return model.peak_clock_mhz * 1e6 if model and model.peak_clock_mhz else None


@dataclasses.dataclass(frozen=True)
class GpuSample:
    """One sample of the node's GPUs: what ``mfu_exporter.render.gpu`` exports, the job model's inventory and the
    attribution's readings."""

    series: str  # sources.gpu.series: which per-GPU families are exported
    driver: tuple[str, str] | None  # (driver version, CUDA driver version)
    gpus: dict[int, GpuReading]  # by ``gpu`` label, in label order; a lost GPU is there with ``up`` False
    totals: dict[str, float]  # node totals: TOTAL_KEYS and ecc_corrected/ecc_uncorrected -> since the exporter started
    inventory: list[GpuInfo]  # the GPUs known, for the job model


class GpuSource:
    """Samples every GPU of the node through NVML (``mfu_exporter.node.nvml_gpus``)."""

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
        self.reader = NvmlGpus(
            nvml,
            READING_KEYS,
            retry_interval=retry_interval,
            gpm=gpm,
            session=session,
            reads=reads_at(series),
            peak_clock_hz=_peak_clock_hz,
        )
        self._monotonic = monotonic
        self._series = series
        self._totals = Totals()
        self._inventory: list[GpuInfo] = []
        self._known: list[GpuState] = []
        self._health: dict[str, GpuHealth] = {}  # by UUID: each GPU's health across cycles and NVML sessions
        self._xids_seen: dict[str, int] = {}  # by UUID: how many of its Xids the health has been fed

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

    def sample(self) -> Snapshot:
        try:
            figures = self.reader.read(self._monotonic())
        except NvmlUnavailable as exc:
            raise SourceUnavailable(exc.reason, exc.detail, retry_after=exc.retry_after) from None
        health = {gpu.uuid: self._assess(gpu, values is not None) for gpu, values in figures}
        rows = [(gpu, self._reading(gpu, values, health[gpu.uuid])) for gpu, values in figures]
        known = [gpu for gpu, _ in rows]
        if known != self._known:  # the GPUs known changed (one found, one first seen): a new inventory list
            self._known = known
            self._inventory = [GpuInfo(g.index, g.uuid, g.name) for g in known]
        readings = {gpu.index: reading for gpu, reading in rows}
        sample = GpuSample(self._series, self.reader.driver, readings, self._add_totals(readings), self._inventory)
        return Snapshot(readings=sample, errors=self.reader.errors, status=self._status(rows, health))

    def _assess(self, gpu: GpuState, up: bool) -> HealthView:
        """The GPU's health after this cycle: NVML's conditions first (a reset they show clears what earlier Xids
        latched), then the Xids drained since the last cycle, in order."""
        health = self._health.get(gpu.uuid)
        if health is None:
            health = self._health[gpu.uuid] = GpuHealth()
        fields = gpu.health_fields
        flag = {key: bool(value) for key, value in fields.items()}
        health.observe(
            Conditions(
                up=up,
                lost_reset_required=not up and gpu.lost_code == self.reader.reset_required,
                recovery_action=int(fields["recovery_action"]) if "recovery_action" in fields else None,
                remap_pending=flag.get("remap_pending"),
                remap_failed=flag.get("remap_failed"),
                retirement_pending=flag.get("retirement_pending"),
            )
        )
        new = gpu.xid_total - self._xids_seen.get(gpu.uuid, 0)
        if new > 0:
            recent = list(gpu.recent_xids)
            for code in recent[max(len(recent) - new, 0) :]:
                health.xid(code)
            self._xids_seen[gpu.uuid] = gpu.xid_total
        return health.view()

    @staticmethod
    def _reading(gpu: GpuState, figures: dict[str, Any] | None, health: HealthView) -> GpuReading:
        """A GPU's reading: its figures, or for a GPU that is down only its identity, MIG mode, Xid counts and
        health."""
        return GpuReading(
            gpu.index,
            gpu.uuid,
            gpu.name,
            gpu.pci_bus_id,
            up=figures is not None,
            mig=gpu.mig,
            xid_count=gpu.xid_total,
            xids=gpu.xid_counts,
            health=health.state,
            **(figures or {}),
        )

    def close(self) -> None:
        self.reader.close()

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

    def _status(self, rows: list, health: dict[str, HealthView]) -> dict[str, Any]:
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
                    # state, action, reason, source, last_xid (its code, state and action): see model/xid.py
                    "health": health[gpu.uuid].as_json(),
                    # the readings the status page shows
                    "utilization": reading.utilization,
                    "tensor_active": reading.tensor_active,
                    "hardware_flops_utilization": reading.hardware_flops_utilization,
                    "sm_clock_hz": reading.sm_clock_hz,
                    "temperature_celsius": reading.temperature,
                    "power_watts": reading.power_watts,
                    "throttle": list(reading.throttle_reasons),
                    "throttle_seconds": dict(reading.throttle_seconds),
                    "throttle_ratio": dict(reading.throttle_ratio),
                    "throttle_time_from": {
                        reason: "field" if reason in gpu.throttle_field else "samples"
                        for reason, _ in reading.throttle_seconds
                    },
                    "memory_reserved_bytes": gpu.memory_reserved,
                    "nvlink_links": gpu.nvlink_links,
                    "nvlink_errors": nvlink_by_kind(gpu),
                }
            )
            view = health[gpu.uuid]
            if not reading.up:
                notes.setdefault(
                    f"lost ({gpu.lost_reason}); NVML is re-initialised every {self.reader.retry_interval:g}s to find it; "
                    f"{view.state}: {view.action}",
                    [],
                ).append(gpu.index)
                continue
            if view.state != "healthy":
                notes.setdefault(f"{view.state} ({view.reason}): {view.action}", []).append(gpu.index)
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
            + (" (not this process's: no re-initialisation for it)" if code == self.reader.no_permission else "")
            for why, code in self.reader.unreachable.values()
        ]
        return {
            "driver_version": self.reader.driver[0] if self.reader.driver else None,
            "cuda_driver_version": self.reader.driver[1] if self.reader.driver else None,
            "gpus": gpus,
            "notes": lines,
        }
