"""The Grafana dashboards as data: every dashboard, its data panels, and the PromQL of every target and annotation.
Read by the dashboard lint (tests/e2e/test_dashboards.py) and by the end-to-end run of those queries against a real
Prometheus (tests/e2e/test_e2e_prometheus.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

# A Grafana variable query: label_values(<selector>, <label>).
LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.+),\s*(?P<label>[a-z_]+)\)$")
DASHBOARDS_DIR = Path(__file__).resolve().parents[2] / "dashboards"


def dashboards() -> list[tuple[str, dict]]:
    return [(path.name, json.loads(path.read_text())) for path in sorted(DASHBOARDS_DIR.glob("*.json"))]


def panels(dashboard: dict) -> list[dict]:
    """Every panel that shows data: rows left out, panels of collapsed rows included."""
    found = []
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            found += panel.get("panels", [])
        else:
            found.append(panel)
    return found


def queries() -> list[tuple[str, str]]:
    """(where, expr) of every panel target and annotation of every dashboard."""
    found = []
    for name, dashboard in dashboards():
        for panel in panels(dashboard):
            for target in panel["targets"]:
                found.append((f"{name}: {panel['title']} {target['refId']}", target["expr"]))
        for annotation in dashboard["annotations"]["list"]:
            found.append((f"{name}: annotation {annotation['name']}", annotation["expr"]))
    return found
