"""The guides say what the program does: every route the server serves (docs/api.md), every incident of the demo's
rotation and its length (README.md's quick start and docs/demo.md), each incident's cause and jobs as the demo gives
them, and the causes in the order the attribution applies them (docs/mfu.md)."""

from __future__ import annotations

import re
from pathlib import Path

from mfu_exporter.config import validate
from mfu_exporter.model.attribution import CAUSES
from mfu_exporter.service import build_service
from mfu_exporter.sim.node import INCIDENT_TABLE, INCIDENTS, ROTATION_SECONDS
from mfu_exporter.web.app import create_app

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
API = (ROOT / "docs" / "api.md").read_text()
DEMO = (ROOT / "docs" / "demo.md").read_text()
MFU = (ROOT / "docs" / "mfu.md").read_text()


def table_rows(text: str, columns: int) -> dict[str, list[str]]:
    """A markdown table's rows of ``columns`` cells whose first cell is code, by that cell's text."""
    return {
        cells[0].strip("`"): cells
        for line in text.splitlines()
        if line.startswith("| `") and len(cells := [c.strip() for c in line.strip("|").split("|")]) == columns
    }


def test_every_route_is_in_the_api_guide():
    app = create_app(build_service(validate({}), []))
    paths = {
        re.sub(r"\{(\w+)\}", r"<\1>", resource.canonical)
        for resource in app.router.resources()
        if not resource.canonical.startswith("/static")
    }
    missing = sorted(p for p in paths if f"`{p}`" not in API and f" {p}`" not in API)
    assert not missing, f"routes docs/api.md does not list: {missing}"


def test_the_quick_start_and_the_demo_guide_name_every_incident_and_the_rotation_length():
    quick_start = README.split("\n## Quick start", 1)[1].split("\n## ", 1)[0]
    minutes = round(ROTATION_SECONDS / 60)
    for text in (quick_start, DEMO):
        for name in INCIDENTS:
            assert f"`{name}`" in text, name
        assert f"{minutes} minutes a rotation" in text, minutes


def test_the_incident_table_says_each_incident_s_cause_and_jobs_as_the_demo_does():
    rows = table_rows(DEMO, 5)
    for incident in INCIDENT_TABLE:
        name, _, jobs, cause, _ = rows[incident.name]
        assert cause == f"`{incident.cause}`", incident.name
        assert jobs == ("both" if len(incident.touches) == 2 else ", ".join(incident.touches)), incident.name


def test_the_cause_table_lists_every_cause_in_the_order_of_precedence():
    section = MFU.split("\n## Where did the MFU go", 1)[1]
    listed = list(table_rows(section, 2))
    assert listed == [cause for cause in CAUSES if cause != "none"]


def test_the_configuration_guide_points_to_every_section_of_the_config():
    text = (ROOT / "docs" / "configuration.md").read_text().split("\n## The config file's sections", 1)[1]
    config = validate({})
    names = [*(name for name in config if name != "sources"), *(f"sources.{name}" for name in config["sources"])]
    missing = [name for name in names if f"`{name}`" not in text]
    assert missing == [], f"sections docs/configuration.md does not place: {missing}"


def test_the_readme_stays_a_front_door():
    """What it is, the picture, the quick start, the ways to install and where to go next; the rest is in docs/."""
    assert len(README.splitlines()) <= 250
    headings = re.findall(r"^## (.+)$", README, re.M)
    assert headings[:2] == ["Contents", "Quick start"] and "Install" in headings and "Where to go next" in headings
    assert "](docs/img/status-page.png)" in README
