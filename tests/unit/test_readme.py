"""The README says what the program does: every route the server serves, every incident of the demo's rotation and
its length, so the quick start cannot name fewer incidents or fewer minutes than the demo runs."""

from __future__ import annotations

import re
from pathlib import Path

from mfu_exporter.config import validate
from mfu_exporter.service import build_service
from mfu_exporter.sim.node import INCIDENT_TABLE, INCIDENTS, ROTATION_SECONDS
from mfu_exporter.web.app import create_app

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_every_route_is_in_the_readme():
    app = create_app(build_service(validate({}), []))
    paths = {
        re.sub(r"\{(\w+)\}", r"<\1>", resource.canonical)
        for resource in app.router.resources()
        if not resource.canonical.startswith("/static")
    }
    missing = sorted(p for p in paths if f"`{p}`" not in README and f" {p}`" not in README)
    assert not missing, f"routes the README does not list: {missing}"


def test_the_quick_start_names_every_incident_and_the_rotation_length():
    quick_start = README.split("## ", 2)[1]  # the first section after the title
    for name in INCIDENTS:
        assert f"`{name}`" in quick_start, name
    minutes = round(ROTATION_SECONDS / 60)
    assert f"{minutes} minutes a rotation" in quick_start, minutes


def test_the_incident_table_says_each_incident_s_cause_and_jobs_as_the_demo_does():
    rows = {
        cells[0].strip("`"): cells
        for line in README.splitlines()
        if line.startswith("| `") and len(cells := [c.strip() for c in line.strip("|").split("|")]) == 5
    }
    for incident in INCIDENT_TABLE:
        name, _, jobs, cause, _ = rows[incident.name]
        assert cause == f"`{incident.cause}`", incident.name
        assert jobs == ("both" if len(incident.touches) == 2 else ", ".join(incident.touches)), incident.name
