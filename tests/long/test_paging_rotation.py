"""The demo's own incident rotation through real Prometheus and Alertmanager, at speed (``make test-paging``): the
harness and its checks are tests/e2e/test_paging.py's; this run adds ~45 s of wall time, so make test leaves it out."""

from __future__ import annotations

import pytest

from tests.e2e.test_paging import GAP, SPEED, WARM_UP, check_the_default_rotation, paging_stack

pytestmark = pytest.mark.slow


def test_the_demos_own_rotation_pages_for_each_incident_that_outlasts_its_for_and_for_nothing_else(tmp_path):
    """The rotation as ``make demo`` runs it (2-minute incidents, the checkpoint stall's 15-minute write), at speed:
    an incident that lasts past its alert's condition and ``for:`` pages (the storm's error events, the stalled
    write's five minutes), one that does not stays quiet, and every alert that fires began within an incident and
    names only what it touches."""
    args = ["--incident-gap", f"{GAP:.0f}s", "--warm-up", f"{WARM_UP:.0f}s"]
    with paging_stack(tmp_path, SPEED, args) as stack:
        assert not stack.truth()["incidents"], "an incident began before Prometheus had the rules and the series"
        check_the_default_rotation(stack, stack.now())
