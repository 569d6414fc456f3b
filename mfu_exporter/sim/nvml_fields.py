"""The fake NVML's field values (``mfu_exporter.sim.nvml.FakeNvml.nvmlDeviceGetFieldValues``): the nvml.h field IDs
it answers and how each is read off a ``FakeGpu``, with its own ``nvmlReturn`` per field as real NVML gives it:
NOT_SUPPORTED for an ID outside ``FakeGpu.fields``, the code in ``FakeGpu.field_errors``, INVALID_ARGUMENT for a link
the GPU does not have."""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING

import pynvml

if TYPE_CHECKING:
    from mfu_exporter.sim.nvml import FakeGpu

MIB = 1024 * 1024
ALL_LINKS = 0xFFFFFFFF

# nvml.h field IDs the fake answers: cumulative NVLink data KiB (per link or all links) and PCIe bytes.
NVLINK_FIELDS = {
    pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: "nvlink_tx_bytes",
    pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: "nvlink_rx_bytes",
}
PCIE_FIELDS = {197: "pcie_tx_bytes", 198: "pcie_rx_bytes"}  # NVML_FI_DEV_PCIE_COUNT_TX_BYTES / _RX_BYTES
# Figures a call also gives, by field ID: POWER_AVERAGE and POWER_CURRENT_LIMIT (mW, power scope 0: the GPU, 32-bit as
# real NVML answers them), TOTAL_ENERGY_CONSUMPTION (mJ), ECC_SBE_VOL_TOTAL and ECC_DBE_VOL_TOTAL.
FIGURE_FIELDS = {185: "power_mw", 190: "power_limit_mw", 83: "energy_mj", 3: "ecc_corrected", 4: "ecc_uncorrected"}
FIGURE_VALUE_TYPES = {185: pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, 190: pynvml.NVML_VALUE_TYPE_UNSIGNED_INT}
POWER_FIELDS = (185, 190)
# Cumulative throttle time in ns (NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP = PERF_POLICY_POWER, SW/HW thermal,
# HW power brake), grown by ``advance`` while the matching clock-event bit is set.
THROTTLE_FIELDS = {74: 0x4, 269: 0x20, 270: 0x40, 271: 0x80}
NVLINK_LINK_COUNT = 91
# Per-link NVLink error counters (scopeId = link): CRC flit, CRC data, replay, recovery totals over lanes; and the
# newer per-link counters (receive errors, local link integrity errors, link recovery events).
NVLINK_ERROR_FIELDS = (38, 45, 52, 59)
NVLINK_ERROR_FIELDS_NEWER = (208, 211, 215)
# What the driver says a GPU needs: the recovery action (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION), row remap pending and
# failed, pages pending retirement; each 0 until a simulation sets it in ``FakeGpu.health``.
RECOVERY_ACTION, REMAP_PENDING, REMAP_FAILED, RETIRED_PENDING = 230, 144, 145, 31
HEALTH_FIELDS = (RECOVERY_ACTION, REMAP_PENDING, REMAP_FAILED, RETIRED_PENDING)


def field_values(gpu: FakeGpu, field_ids: list) -> ctypes.Array:
    """The answer of ``nvmlDeviceGetFieldValues`` for ``gpu``: one ``c_nvmlFieldValue_t`` per requested ID (or
    (ID, scope) pair), filled from the GPU's readings in NVML's units."""
    values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
    # Members are set through object's setattr: pynvml's Python __setattr__ only encodes str, and no member here
    # is one, while real NVML fills these structs in C (the bench counts this fake's work as the daemon's).
    put = object.__setattr__
    for value, requested in zip(values, field_ids):
        field_id, scope = requested if isinstance(requested, tuple) else (requested, 0)
        put(value, "fieldId", field_id)
        put(value, "scopeId", scope)
        if field_id in gpu.field_errors:
            put(value, "nvmlReturn", gpu.field_errors[field_id])
            continue
        if field_id not in gpu.fields:
            put(value, "nvmlReturn", pynvml.NVML_ERROR_NOT_SUPPORTED)
            continue
        if field_id in FIGURE_FIELDS:
            if field_id in POWER_FIELDS and scope != 0:  # the module's or the memory's power: not this GPU's
                put(value, "nvmlReturn", pynvml.NVML_ERROR_NOT_SUPPORTED)
                continue
            number = getattr(gpu, FIGURE_FIELDS[field_id])
        elif field_id == NVLINK_LINK_COUNT:
            number = gpu.nvlink_links
        elif field_id in THROTTLE_FIELDS:
            number = gpu.throttle_ns.get(field_id, 0)
        elif field_id in HEALTH_FIELDS:
            number = gpu.health.get(field_id, 0)
        elif field_id in NVLINK_ERROR_FIELDS or field_id in NVLINK_ERROR_FIELDS_NEWER:
            if not 0 <= scope < gpu.nvlink_links:
                put(value, "nvmlReturn", pynvml.NVML_ERROR_INVALID_ARGUMENT)
                continue
            number = gpu.nvlink_errors.get((field_id, scope), 0)
        elif field_id in NVLINK_FIELDS:
            if scope != ALL_LINKS and scope >= gpu.nvlink_links:
                put(value, "nvmlReturn", pynvml.NVML_ERROR_INVALID_ARGUMENT)
                continue
            total = getattr(gpu, NVLINK_FIELDS[field_id]) / 1024  # NVML counts NVLink data in KiB
            number = total if scope == ALL_LINKS else total / gpu.nvlink_links
        else:
            number = getattr(gpu, PCIE_FIELDS[field_id])
        value_type = gpu.field_value_types.get(
            field_id, FIGURE_VALUE_TYPES.get(field_id, pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG)
        )
        put(value, "valueType", value_type)
        if value_type == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT:
            object.__getattribute__(value, "value").uiVal = int(number) % 2**32
        else:
            object.__getattribute__(value, "value").ullVal = int(number)
        put(value, "nvmlReturn", pynvml.NVML_SUCCESS)
    return values
