"""GPU health: each Xid, and each condition NVML reports without one (a GPU off the bus, a recovery action, a row
remap pending or failed, pages pending retirement), as a health state and the action it asks of a person.

The states are NVIDIA's immediate-action buckets, folded into five, ordered by what they ask:

- ``healthy``: nothing to do on the GPU. The catalogue's IGNORE and RESTART_APP: an application fault (Xid 13, 31,
  43...) ends that application, and the GPU takes new work as it is.
- ``degraded``: the GPU keeps working; act at its next drain (a row remap pending until a reset, a high single-bit
  ECC rate, an NVLink Xid whose subcode says whether it was fatal).
- ``reset_required``: RESET_GPU, or NVML's GPU_RESET recovery action: unusable until reset.
- ``reboot_required``: RESTART_BM (the host) or RESTART_VM, or NVML's NODE_REBOOT: a reset does not clear it.
- ``inspection_required``: CHECK_MECHANICALS, or a row-remap failure (NVIDIA's RMA policy): neither reset nor
  reboot is the fix; a person inspects the board or opens a case with the vendor.

Sources, each entry naming its own:

- CATALOGUE: NVIDIA, "Analyzing Xid Errors with the Xid Catalog", the "Resolution Bucket (Immediate Action)" column
  and the "XID 144-150 Decode" sheet, https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, as
  published on 2025-10-29 (the date GPUd's generated copy of its spreadsheet, leptonai/gpud
  components/accelerator/nvidia/xid/catalog_generated.go at 4a8de33, records).
- MEMORY: NVIDIA, "GPU Memory Error Management", "Error Recovery and Response Flags" (row-remapping pending and
  failure flags, the recovery action flag), https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/.
- XID_DOC: NVIDIA, "Xid Errors", https://docs.nvidia.com/deploy/xid-errors/index.html (Xid 74: "GPU reset or system
  reboot is needed to clear the error").
- DEBUG: NVIDIA, "GPU Debug Guidelines", Xid messages (Xid 48 followed by 63 or 64: drain and reset the GPU),
  https://docs.nvidia.com/deploy/gpu-debug-guidelines/index.html#xid-messages.
- NVML: nvml.h, nvmlReturn_t NVML_ERROR_GPU_IS_LOST ("fallen off the bus or otherwise become inaccessible") and
  NVML_ERROR_RESET_REQUIRED ("requires a reset before it can be used again"); nvmlDeviceGpuRecoveryAction_t, read
  as field NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (230).

NVML's Xid event carries the code only (``eventData``), not the NVLink subcode of Xids 144-150 the kernel log prints,
so those take the state their subcodes share, or ``degraded`` where the decode sheet has both fatal and non-fatal
ones; a fatal one sets the recovery action too (Xid 154), which ``GpuHealth`` reads where the driver has the field.

Pure: no I/O. ``mfu_exporter.sources.gpu`` feeds each GPU's Xids and NVML conditions into a ``GpuHealth``.
"""

from __future__ import annotations

from dataclasses import dataclass

HEALTHY = "healthy"
DEGRADED = "degraded"
RESET_REQUIRED = "reset_required"
REBOOT_REQUIRED = "reboot_required"
INSPECTION_REQUIRED = "inspection_required"
# In order of what each asks: the worse of two states is the later one.
HEALTH_STATES = (HEALTHY, DEGRADED, RESET_REQUIRED, REBOOT_REQUIRED, INSPECTION_REQUIRED)
SEVERITY = {state: rank for rank, state in enumerate(HEALTH_STATES)}

CATALOGUE = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html (2025-10-29)"
NVLINK_DECODE = CATALOGUE + ", sheet XID 144-150 Decode"
MEMORY = "https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/ (Error Recovery and Response Flags)"
XID_DOC = "https://docs.nvidia.com/deploy/xid-errors/index.html"
DEBUG = "https://docs.nvidia.com/deploy/gpu-debug-guidelines/index.html#xid-messages"
NVML = "nvml.h (nvmlReturn_t, nvmlDeviceGpuRecoveryAction_t)"

# The actions, written once: what a person does in each case.
RESTART_APP = "none on the GPU: the application that hit it failed; restart it, and check its code if it repeats"
IGNORE = "none: informational; contact NVIDIA support if it repeats"
RESET_GPU = "drain the GPU's jobs, then reset the GPU (nvidia-smi -r -i <gpu>); contact support if it returns"
RESTART_BM = "drain the node and reboot it; contact support if the GPU falls off again"
REMAP_AT_RESET = "keep running; reset the GPU at its next drain so the pending row remap takes effect"
NVLINK_SUBCODE = (
    "read the kernel log's line for the unit and error status (the catalogue's 144-150 decode): reset the GPU if it "
    "was fatal; non-fatal ones need nothing"
)
SUPPORT = "contact NVIDIA support with an nvidia-bug-report.sh log"


@dataclass(frozen=True, slots=True)
class XidClass:
    """One Xid as classified: NVIDIA's mnemonic and immediate action, the state it puts the GPU in, what to do, and
    where that comes from."""

    code: int
    mnemonic: str
    nvidia_action: str  # the catalogue's Resolution Bucket (Immediate Action)
    state: str
    action: str
    source: str

    def as_json(self) -> dict[str, object]:
        return {
            "code": self.code,
            "mnemonic": self.mnemonic,
            "nvidia_action": self.nvidia_action,
            "state": self.state,
            "action": self.action,
            "source": self.source,
        }


def _x(code: int, mnemonic: str, nvidia: str, state: str, action: str, source: str = CATALOGUE) -> XidClass:
    return XidClass(code, mnemonic, nvidia, state, action, source)


XIDS: dict[int, XidClass] = {
    x.code: x
    for x in (
        # Application faults: the catalogue's RESTART_APP (and IGNORE for 43); the GPU stays usable.
        _x(8, "ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT", "RESTART_APP", HEALTHY, RESTART_APP),
        _x(11, "ROBUST_CHANNEL_GR_ERROR_MISSING_HW", "RESTART_APP", HEALTHY, RESTART_APP),
        _x(13, "ROBUST_CHANNEL_GR_EXCEPTION", "RESTART_APP", HEALTHY, RESTART_APP),
        _x(31, "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", "RESTART_APP", HEALTHY, RESTART_APP),
        _x(32, "ROBUST_CHANNEL_PBDMA_ERROR", "RESTART_APP", HEALTHY, RESTART_APP),
        _x(43, "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", "IGNORE", HEALTHY, RESTART_APP),
        _x(
            45,
            "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL",
            "WORKFLOW_XID_45",
            HEALTHY,
            "none of its own: the cleanup after another error; act on the Xid that came with it",
        ),
        _x(69, "ROBUST_CHANNEL_GR_CLASS_ERROR", "RESTART_APP", HEALTHY, RESTART_APP),
        _x(80, "PBDMA_PUSHBUFFER_CRC_MISMATCH", "RESTART_APP", HEALTHY, RESTART_APP),
        _x(137, "NVLINK_PRIV_ERR", "IGNORE", HEALTHY, IGNORE),
        # Every subcode of these two is non-fatal, IGNORE, in the decode sheet.
        _x(147, "NVLINK_TREX_ERROR", "WORKFLOW_NVLINK5_ERR", HEALTHY, IGNORE, NVLINK_DECODE),
        _x(148, "NVLINK_NVLPW_CTRL_ERROR", "WORKFLOW_NVLINK5_ERR", HEALTHY, IGNORE, NVLINK_DECODE),
        # Memory: the GPU keeps working, and a reset at its next drain activates the row remap (MEMORY: "row-remapping
        # will happen at the next GPU reset"; unaffected applications continue).
        _x(63, "INFOROM_DRAM_RETIREMENT_EVENT", "IGNORE", DEGRADED, REMAP_AT_RESET, f"{CATALOGUE}; {MEMORY}"),
        _x(
            92,
            "EXCESSIVE_SBE_INTERRUPTS",
            "IGNORE",
            DEGRADED,
            "keep running; watch its corrected ECC errors, and contact NVIDIA support if the rate stays high",
        ),
        _x(93, "INFOROM_ERASE_LIMIT_EXCEEDED", "IGNORE", DEGRADED, "keep running; " + SUPPORT),
        _x(
            94,
            "ROBUST_CHANNEL_CONTAINED_ERROR",
            "RESTART_APP",
            DEGRADED,
            "restart the application that hit it; reset the GPU at its next drain so the row remap takes effect",
            f"{CATALOGUE}; {MEMORY}",
        ),
        _x(157, "RESOURCE_RETIREMENT_FAILURE", "IGNORE", DEGRADED, "keep running; " + SUPPORT),
        # NVLink5 Xids whose subcodes are fatal or not (decode sheet): the event alone cannot say which.
        _x(144, "NVLINK_SAW_ERROR", "WORKFLOW_NVLINK5_ERR", DEGRADED, NVLINK_SUBCODE, NVLINK_DECODE),
        _x(145, "NVLINK_RLW_ERROR", "WORKFLOW_NVLINK5_ERR", DEGRADED, NVLINK_SUBCODE, NVLINK_DECODE),
        _x(146, "NVLINK_TLW_ERROR", "WORKFLOW_NVLINK5_ERR", DEGRADED, NVLINK_SUBCODE, NVLINK_DECODE),
        _x(149, "NVLINK_NETIR_ERROR", "WORKFLOW_NVLINK5_ERR", DEGRADED, NVLINK_SUBCODE, NVLINK_DECODE),
        _x(
            154,
            "GPU_RECOVERY_ACTION_CHANGED",
            "XID_154",
            DEGRADED,
            "do the recovery action the driver now names (nvidia-smi -q, Recovery Action; the kernel log's Xid 154 "
            "line); where NVML has the field, the state follows it",
            f"{CATALOGUE}; {NVML}",
        ),
        # Reset: the catalogue's RESET_GPU.
        _x(46, "ROBUST_CHANNEL_GPU_TIMEOUT_ERROR", "RESET_GPU", RESET_REQUIRED, RESET_GPU),
        _x(
            48,
            "ROBUST_CHANNEL_GPU_ECC_DBE",
            "WORKFLOW_XID_48",
            RESET_REQUIRED,
            "drain the GPU's jobs and reset the GPU; the Xid 63 (row remapped) or 64 (remap failed) after it says "
            "whether its memory recovered",
            f"{CATALOGUE}; {DEBUG}",
        ),
        _x(62, "PMU_HALT_ERROR", "RESET_GPU", RESET_REQUIRED, RESET_GPU),
        _x(
            64,
            "INFOROM_DRAM_RETIREMENT_FAILURE",
            "RESET_GPU",
            RESET_REQUIRED,
            "drain the GPU's jobs and reset the GPU; a remap that fails again is an RMA (NVIDIA's row-remapping "
            "RMA policy)",
            f"{CATALOGUE}; {MEMORY}",
        ),
        _x(74, "NVLINK_ERROR", "WORKFLOW_NVLINK_ERR", RESET_REQUIRED, RESET_GPU, f"{CATALOGUE}; {XID_DOC}"),
        _x(95, "ROBUST_CHANNEL_UNCONTAINED_ERROR", "RESET_GPU", RESET_REQUIRED, RESET_GPU, f"{CATALOGUE}; {MEMORY}"),
        _x(109, "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR", "RESET_GPU", RESET_REQUIRED, RESET_GPU),
        _x(110, "SEC_FAULT_ERROR", "RESET_GPU", RESET_REQUIRED, RESET_GPU),
        _x(119, "GSP_RPC_TIMEOUT", "RESET_GPU", RESET_REQUIRED, RESET_GPU),
        _x(120, "GSP_ERROR", "RESET_GPU", RESET_REQUIRED, RESET_GPU),
        _x(136, "ALI_TRAINING_FAIL", "RESET_GPU", RESET_REQUIRED, RESET_GPU),
        _x(140, "UNRECOVERABLE_ECC_ERROR_ESCAPE", "RESET_GPU", RESET_REQUIRED, RESET_GPU),
        _x(143, "GPU_INIT_ERROR", "RESET_GPU", RESET_REQUIRED, RESET_GPU),
        # Its one unit, MSE_WATCHDOG, is fatal and RESET_GPU in the decode sheet.
        _x(150, "NVLINK_MSE_ERROR", "WORKFLOW_NVLINK5_ERR", RESET_REQUIRED, RESET_GPU, NVLINK_DECODE),
        _x(155, "NVLINK_SW_DEFINED_ERROR", "RESET_GPU", RESET_REQUIRED, RESET_GPU),
        _x(156, "RESOURCE_RETIREMENT_EVENT", "RESET_GPU", RESET_REQUIRED, RESET_GPU),
        _x(158, "GPU_FATAL_TIMEOUT", "RESET_GPU", RESET_REQUIRED, RESET_GPU),
        # Reboot: RESTART_BM (bare metal) and RESTART_VM.
        _x(79, "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "RESTART_BM", REBOOT_REQUIRED, RESTART_BM),
        _x(
            151,
            "ROBUST_CHANNEL_KEY_ROTATION_ERROR",
            "RESTART_VM",
            REBOOT_REQUIRED,
            "restart the VM the GPU is passed through to; " + SUPPORT + " if it returns",
        ),
        # Inspection: CHECK_MECHANICALS.
        _x(
            54,
            "SILENT_RUNNING_PWR_REDUCED_CLOCKING",
            "CHECK_MECHANICALS",
            INSPECTION_REQUIRED,
            "drain the node and check the GPU board's auxiliary power connection; then " + SUPPORT,
        ),
    )
}

# An Xid this table does not know (a newer driver's, or one the catalogue lists as unused): not healthy, since
# nothing says so, and not a page, since nothing says the GPU is unusable. A person looks it up.
UNKNOWN_XID_STATE = DEGRADED
UNKNOWN_XID_ACTION = "look the code up in NVIDIA's Xid catalogue; this exporter's table does not list it"


def classify(code: int) -> XidClass:
    """The classification of Xid ``code``; an unknown one gets ``UNKNOWN_XID_STATE``."""
    known = XIDS.get(code)
    if known is not None:
        return known
    return XidClass(code, "", "", UNKNOWN_XID_STATE, UNKNOWN_XID_ACTION, CATALOGUE)


@dataclass(frozen=True, slots=True)
class Condition:
    """A condition NVML reports without an Xid, as a state and an action."""

    name: str
    state: str
    action: str
    source: str


# How a GPU was lost (the NVML error that marked it down): RESET_REQUIRED asks for a reset, any other loss is the
# GPU off the bus (GPU_IS_LOST, or a GPU that answers nothing), Xid 79's case.
FALLEN_OFF_BUS = Condition("fallen off the bus", REBOOT_REQUIRED, RESTART_BM, f"{NVML}; Xid 79 in {CATALOGUE}")
LOST_RESET_REQUIRED = Condition("NVML: reset required", RESET_REQUIRED, RESET_GPU, NVML)
# nvmlDeviceGpuRecoveryAction_t -> its condition (MEMORY defines NONE, GPU_RESET, NODE_REBOOT, DRAIN_P2P and
# DRAIN_AND_RESET; nvml.h adds the rest).
RECOVERY_ACTIONS: dict[int, Condition] = {
    1: Condition("recovery action GPU_RESET", RESET_REQUIRED, RESET_GPU, MEMORY),
    2: Condition("recovery action NODE_REBOOT", REBOOT_REQUIRED, RESTART_BM, MEMORY),
    3: Condition(
        "recovery action DRAIN_P2P",
        DEGRADED,
        "stop the GPU's peer-to-peer traffic (drain its NVLink jobs); it clears when the traffic stops",
        MEMORY,
    ),
    4: Condition("recovery action DRAIN_AND_RESET", RESET_REQUIRED, RESET_GPU, MEMORY),
    5: Condition("recovery action RECOVER_IMEX_DOMAIN", DEGRADED, "recover the GPU's IMEX domain", NVML),
    6: Condition("recovery action BUS_RESET", RESET_REQUIRED, "drain the GPU's jobs and reset its PCIe bus", NVML),
    7: Condition("recovery action SYSTEM_REBOOT", REBOOT_REQUIRED, RESTART_BM, NVML),
}
REMAP_PENDING = Condition("row remap pending", DEGRADED, REMAP_AT_RESET, MEMORY)
REMAP_FAILED = Condition(
    "row remap failed",
    INSPECTION_REQUIRED,
    "drain the GPU and open an RMA case: a failed row remap is past NVIDIA's row-remapping RMA threshold",
    MEMORY,
)
RETIREMENT_PENDING = Condition(
    "pages pending retirement",
    DEGRADED,
    "keep running; reboot the node (or reload the driver) at its next drain so the pending pages are retired",
    f"{NVML} (NVML_FI_DEV_RETIRED_PENDING)",
)


@dataclass(frozen=True, slots=True)
class Conditions:
    """What NVML says of a GPU this cycle besides its Xids; None where the driver does not answer."""

    up: bool = True
    lost_reset_required: bool = False  # lost with NVML_ERROR_RESET_REQUIRED rather than off the bus
    recovery_action: int | None = None
    remap_pending: bool | None = None
    remap_failed: bool | None = None
    retirement_pending: bool | None = None


@dataclass(frozen=True, slots=True)
class HealthView:
    """A GPU's health now: its state, the action, why, and the last Xid seen (None before any)."""

    state: str
    action: str
    reason: str
    source: str
    last_xid: XidClass | None

    def as_json(self) -> dict[str, object]:
        return {
            "state": self.state,
            "action": self.action,
            "reason": self.reason,
            "source": self.source,
            "last_xid": self.last_xid.as_json() if self.last_xid else None,
        }


HEALTHY_VIEW = HealthView(HEALTHY, "none", "no Xid or NVML condition asks for anything", "", None)


class GpuHealth:
    """One GPU's health across cycles. An Xid's state holds (latched) until the GPU is seen reset: back after it was
    lost, its recovery action gone from pending to none, or a pending row remap or page retirement done, each of
    which only a reset or reboot brings about. A restart of the exporter forgets it (a reboot restarts the exporter;
    the conditions NVML keeps, read again, say what still stands). ``inspection_required`` from an Xid holds until
    then too: a reset does not repair a board."""

    def __init__(self) -> None:
        self.latched: XidClass | None = None  # the worst Xid since the last reset seen
        self.last_xid: XidClass | None = None
        self.resets = 0  # resets seen
        self._last: Conditions | None = None

    def xid(self, code: int) -> None:
        entry = classify(code)
        self.last_xid = entry
        if entry.state != HEALTHY and (self.latched is None or SEVERITY[entry.state] >= SEVERITY[self.latched.state]):
            self.latched = entry

    def observe(self, now: Conditions) -> None:
        """This cycle's conditions (before its Xids are fed): a reset seen clears what the Xids latched."""
        before = self._last
        self._last = now
        if before is None:
            return
        back = now.up and not before.up
        recovered = bool(before.recovery_action) and now.recovery_action == 0
        remapped = bool(before.remap_pending) and now.remap_pending is False
        retired = bool(before.retirement_pending) and now.retirement_pending is False
        if back or recovered or remapped or retired:
            self.resets += 1
            if self.latched is not None and self.latched.state != INSPECTION_REQUIRED:
                self.latched = None

    def view(self) -> HealthView:
        """The worst of what the Xids latched and what NVML's conditions say now."""
        found: list[tuple[str, str, str, str]] = []  # (state, action, reason, source)
        if self.latched is not None:
            x = self.latched
            found.append((x.state, x.action, f"Xid {x.code}" + (f" {x.mnemonic}" if x.mnemonic else ""), x.source))
        now = self._last or Conditions()
        conditions = []
        if not now.up:
            conditions.append(LOST_RESET_REQUIRED if now.lost_reset_required else FALLEN_OFF_BUS)
        if now.recovery_action:
            conditions.append(
                RECOVERY_ACTIONS.get(
                    now.recovery_action,
                    Condition(f"recovery action {now.recovery_action}", DEGRADED, UNKNOWN_XID_ACTION, NVML),
                )
            )
        if now.remap_failed:
            conditions.append(REMAP_FAILED)
        if now.remap_pending:
            conditions.append(REMAP_PENDING)
        if now.retirement_pending:
            conditions.append(RETIREMENT_PENDING)
        found += [(c.state, c.action, c.name, c.source) for c in conditions]
        if not found:
            return HealthView(HEALTHY, "none", HEALTHY_VIEW.reason, "", self.last_xid)
        # The worst state; among equals, the first found (an Xid's own action before a condition's).
        state, action, reason, source = max(found, key=lambda f: SEVERITY[f[0]])
        return HealthView(state, action, reason, source, self.last_xid)
