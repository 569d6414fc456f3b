"""The Xid catalogue as data (mfu_exporter/model/xid.py): every code has a state, an action and a source; the state
follows NVIDIA's immediate-action bucket; unknown codes get the documented default; docs/metrics.md lists exactly
the table; and a GPU's health across samples latches, takes the worst, and clears on a reset it sees."""

import re
from pathlib import Path

import pytest

from mfu_exporter.model import xid
from mfu_exporter.model.xid import (
    DEGRADED,
    HEALTH_STATES,
    HEALTHY,
    INSPECTION_REQUIRED,
    REBOOT_REQUIRED,
    RESET_REQUIRED,
    XIDS,
    Conditions,
    GpuHealth,
    classify,
)

ROOT = Path(__file__).resolve().parents[3]
# The Xids the operator asks about most: ECC and row remapping, application faults, NVLink (74 and NVLink5's
# 144-150), GSP, fallen off the bus, the recovery action.
NAMED = {13, 31, 43, 48, 63, 64, 74, 79, 92, 94, 95, 119, 120, 154, *range(144, 151)}
# NVIDIA's immediate-action buckets that decide the state alone (the workflows and RESTART_APP/IGNORE are judged per
# code, with the memory document where it says more).
BUCKET_STATE = {
    "RESET_GPU": RESET_REQUIRED,
    "RESTART_BM": REBOOT_REQUIRED,
    "RESTART_VM": REBOOT_REQUIRED,
    "CHECK_MECHANICALS": INSPECTION_REQUIRED,
}


def test_at_least_30_xids_each_with_a_state_an_action_and_a_cited_source():
    assert len(XIDS) >= 30
    assert NAMED <= set(XIDS)
    for code, entry in XIDS.items():
        assert entry.code == code
        assert entry.state in HEALTH_STATES, code
        assert entry.action and entry.mnemonic and entry.nvidia_action, code
        assert "https://docs.nvidia.com/" in entry.source, code


def test_each_state_follows_nvidias_immediate_action():
    for code, entry in XIDS.items():
        if entry.nvidia_action in BUCKET_STATE:
            assert entry.state == BUCKET_STATE[entry.nvidia_action], code
        if entry.nvidia_action in ("RESTART_APP", "IGNORE") and entry.state != HEALTHY:
            # Only where NVIDIA's memory document or the bucket's own investigation asks for more.
            assert entry.state == DEGRADED and (xid.MEMORY in entry.source or "support" in entry.action), code


def test_application_faults_leave_the_gpu_healthy():
    for code in (13, 31, 43):
        assert classify(code).state == HEALTHY
        assert "restart" in classify(code).action


def test_an_unknown_xid_gets_the_documented_default():
    entry = classify(999)
    assert (entry.state, entry.action) == (xid.UNKNOWN_XID_STATE, xid.UNKNOWN_XID_ACTION)
    assert entry.state == DEGRADED
    doc = (ROOT / "docs" / "metrics.md").read_text()
    assert "**Unknown Xids**" in doc and f"`{xid.UNKNOWN_XID_STATE}`" in doc


def test_the_metrics_doc_lists_every_xid_with_its_state_and_bucket():
    doc = (ROOT / "docs" / "metrics.md").read_text()
    rows = {
        int(code): (mnemonic, bucket, state)
        for code, mnemonic, bucket, state in re.findall(
            r"^\| (\d+) \| `([A-Z0-9_]+)` \| ([A-Z0-9_]+) \| `([a-z_]+)` \|", doc, re.M
        )
    }
    assert rows == {code: (e.mnemonic, e.nvidia_action, e.state) for code, e in XIDS.items()}
    assert f"The Xids classified ({len(XIDS)})" in doc


def test_an_xid_latches_its_state_and_the_worst_one_wins():
    health = GpuHealth()
    health.observe(Conditions())
    assert health.view().state == HEALTHY and health.view().last_xid is None
    health.xid(63)
    assert health.view().state == DEGRADED
    health.xid(95)
    health.xid(13)  # an application fault after it changes nothing but the last Xid
    view = health.view()
    assert (view.state, view.reason) == (RESET_REQUIRED, "Xid 95 ROBUST_CHANNEL_UNCONTAINED_ERROR")
    assert view.action == xid.RESET_GPU
    assert view.last_xid.code == 13 and view.last_xid.state == HEALTHY
    for _ in range(3):
        health.observe(Conditions())
    assert health.view().state == RESET_REQUIRED  # an event, not a reading: it holds


@pytest.mark.parametrize(
    "before, after",
    [
        (Conditions(recovery_action=1), Conditions(recovery_action=0)),
        (Conditions(remap_pending=True), Conditions(remap_pending=False)),
        (Conditions(retirement_pending=True), Conditions(retirement_pending=False)),
        (Conditions(up=False), Conditions(up=True)),
    ],
    ids=["recovery action done", "row remapped", "pages retired", "back on the bus"],
)
def test_a_reset_seen_clears_what_the_xids_latched(before, after):
    health = GpuHealth()
    health.observe(before)
    health.xid(48)
    assert health.view().state in (RESET_REQUIRED, REBOOT_REQUIRED)  # the Xid's, or the lost GPU's if worse
    health.observe(after)
    assert health.view().state == HEALTHY
    assert health.view().last_xid.code == 48  # the last Xid stays on record
    assert health.resets == 1


def test_no_reset_no_clearing_and_a_driver_without_the_fields_keeps_the_state():
    health = GpuHealth()
    health.observe(Conditions(recovery_action=None, remap_pending=None))
    health.xid(119)
    health.observe(Conditions(recovery_action=0))  # unknown before: not a transition from pending
    assert health.view().state == RESET_REQUIRED


def test_inspection_from_an_xid_survives_a_reset():
    health = GpuHealth()
    health.observe(Conditions(remap_pending=True))
    health.xid(54)
    health.observe(Conditions(remap_pending=False))
    assert health.view().state == INSPECTION_REQUIRED


@pytest.mark.parametrize(
    "conditions, state, reason",
    [
        (Conditions(up=False), REBOOT_REQUIRED, "fallen off the bus"),
        (Conditions(up=False, lost_reset_required=True), RESET_REQUIRED, "NVML: reset required"),
        (Conditions(recovery_action=1), RESET_REQUIRED, "recovery action GPU_RESET"),
        (Conditions(recovery_action=2), REBOOT_REQUIRED, "recovery action NODE_REBOOT"),
        (Conditions(recovery_action=3), DEGRADED, "recovery action DRAIN_P2P"),
        (Conditions(recovery_action=42), DEGRADED, "recovery action 42"),
        (Conditions(remap_pending=True), DEGRADED, "row remap pending"),
        (Conditions(remap_pending=True, remap_failed=True), INSPECTION_REQUIRED, "row remap failed"),
        (Conditions(retirement_pending=True), DEGRADED, "pages pending retirement"),
    ],
)
def test_nvmls_conditions_hold_while_the_driver_reports_them(conditions, state, reason):
    health = GpuHealth()
    health.observe(conditions)
    view = health.view()
    assert (view.state, view.reason) == (state, reason)
    assert view.action and view.source
    health.observe(Conditions())
    assert health.view().state == HEALTHY


def test_a_condition_and_an_xid_of_the_same_state_show_the_xid():
    health = GpuHealth()
    health.observe(Conditions(recovery_action=1))
    health.xid(95)
    assert health.view().reason.startswith("Xid 95")
    as_json = health.view().as_json()
    assert as_json["state"] == RESET_REQUIRED and as_json["last_xid"]["code"] == 95
