"""Dashboard lint: the main grafana/dashboard-linter rules, re-implemented (the linter ships only as a Go binary), plus
checks of our own: every query parses (promql-parser for the structure, Prometheus 2.42's own parser through
promtool for the dialect), names only documented or recorded series, and filters by the dashboard's variables."""

from __future__ import annotations

import re
import subprocess
from datetime import timedelta
from pathlib import Path

import promql_parser
import pytest
import yaml

from tests.support.dashboards import DASHBOARDS_DIR, LABEL_VALUES, dashboards, panels, queries
from tests.support.prom_harness import RULE_FILES, documented_metrics, promql_nodes
from tests.support.tools import require_tool

ROOT = Path(__file__).resolve().parents[2]
PROVISIONING = DASHBOARDS_DIR / "provisioning.yaml"
DEPLOY_PROVISIONING = ROOT / "deploy" / "grafana" / "provisioning" / "dashboards" / "mfu-exporter.yaml"
RULES_FILE = RULE_FILES[0]

# Changing a uid breaks every bookmark and link to the dashboard: these stay.
STABLE_UIDS = {"mfu-overview", "mfu-fabric", "mfu-gpu", "mfu-storage"}
SCHEMA_VERSION = 39
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
QUERY_VARIABLES = ("job", "instance", "training_job")
# Grafana unit ids these dashboards use (Grafana's unit picker, categories Misc, Data, Data rate, Time, Energy,
# Temperature, Throughput). Add one here after checking that Grafana knows it.
UNITS = {"percentunit", "short", "s", "h", "bytes", "Bps", "bps", "pps", "cps", "hertz", "watt", "celsius"}
RATE_FUNCTIONS = {"rate", "irate", "increase"}
# Grafana's interval variables, replaced by durations no query would write itself, so the parsed ranges tell
# which variable a query used.
GRAFANA_DURATIONS = {
    "$__rate_interval": "7777s",
    "$__interval": "6666s",
    "$__range_s": "8888",
    "$__range": "8888s",
}
RATE_INTERVAL = timedelta(seconds=7777)


def substitute(expr: str) -> str:
    for variable, duration in GRAFANA_DURATIONS.items():
        expr = expr.replace(variable, duration)
    return expr


def parsed(expr: str):
    return promql_parser.parse(substitute(expr))


def selectors(expr: str):
    """(vector selector, enclosing functions) of every series an expression reads."""
    return [
        (node, calls) for node, calls in promql_nodes(parsed(expr)) if isinstance(node, promql_parser.VectorSelector)
    ]


def matchers(selector) -> dict[str, tuple[str, str]]:
    return {m.name: (str(m.op).rsplit(".", 1)[-1], m.value) for m in selector.matchers.matchers}


def recorded_names() -> set[str]:
    """Recorded by either tier (the node tier's per-interface pause ratio is drawn on the fabric dashboard)."""
    return {
        rule["record"]
        for path in RULE_FILES
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
        if "record" in rule
    }


def recorded_value(name: str) -> float:
    (rule,) = [
        r for g in yaml.safe_load(RULES_FILE.read_text())["groups"] for r in g["rules"] if r.get("record") == name
    ]
    return float(re.fullmatch(r"vector\(([0-9.]+)\)", rule["expr"]).group(1))


QUERIES = queries()


# --- dashboard-level rules ------------------------------------------------------------------------------------


def test_dashboards_have_their_stable_uids():
    found = {dashboard["uid"]: name for name, dashboard in dashboards()}
    assert set(found) == STABLE_UIDS
    for uid, name in found.items():
        assert name == f"{uid}.json" and len(uid) <= 40
    titles = [dashboard["title"] for _, dashboard in dashboards()]
    assert len(set(titles)) == len(titles)


@pytest.mark.parametrize("name, dashboard", dashboards())
def test_dashboard_is_provisionable_and_not_editable(name, dashboard):
    assert dashboard["editable"] is False
    assert dashboard["id"] is None, "a fixed id clashes with the target Grafana's own"
    assert dashboard["schemaVersion"] == SCHEMA_VERSION
    assert "mfu-exporter" in dashboard["tags"]
    assert dashboard["title"] and dashboard["description"]


@pytest.mark.parametrize("name, dashboard", dashboards())
def test_one_datasource_variable(name, dashboard):
    variables = dashboard["templating"]["list"]
    (datasource,) = [v for v in variables if v["type"] == "datasource"]
    assert (datasource["name"], datasource["label"], datasource["query"]) == ("datasource", "Data source", "prometheus")


@pytest.mark.parametrize("name, dashboard", dashboards())
def test_job_instance_and_training_job_variables_come_from_label_values(name, dashboard):
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    for wanted in QUERY_VARIABLES:
        variable = variables[wanted]
        assert variable["type"] == "query" and variable["datasource"] == DATASOURCE, wanted
        assert variable["multi"] and variable["includeAll"] and variable["allValue"] == ".+", wanted
        assert variable["refresh"] == 2, f"{wanted}: reload on time range change"
        query = LABEL_VALUES.match(variable["query"])
        assert query and query["label"] == wanted, f"{wanted}: {variable['query']}"
        ((selector, _),) = selectors(query["selector"])
        assert selector.name in documented_metrics(), f"{wanted}: {selector.name} is not documented"


# --- panel rules ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, dashboard", dashboards())
def test_every_panel_uses_the_datasource_variable(name, dashboard):
    for panel in panels(dashboard):
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"], f"{panel['title']}: no targets"
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, panel["title"]
    for annotation in dashboard["annotations"]["list"]:
        assert annotation["datasource"] == DATASOURCE, annotation["name"]


@pytest.mark.parametrize("name, dashboard", dashboards())
def test_every_panel_has_a_title_a_description_and_a_unit(name, dashboard):
    ids = [panel["id"] for panel in dashboard["panels"]] + [
        p["id"] for r in dashboard["panels"] for p in r.get("panels", [])
    ]
    assert len(set(ids)) == len(ids)
    for panel in panels(dashboard):
        assert panel["title"] and panel["description"], panel["id"]
        assert panel["fieldConfig"]["defaults"].get("unit") in UNITS, f"{panel['title']}: unit"
        position = panel["gridPos"]
        assert position["x"] + position["w"] <= 24, panel["title"]
        if panel["type"] == "heatmap":
            assert all(t.get("format") == "heatmap" for t in panel["targets"]), panel["title"]


def test_mfu_colours_match_the_threshold_rules():
    (overview,) = [d for _, d in dashboards() if d["uid"] == "mfu-overview"]
    (stat,) = [p for p in panels(overview) if p["title"] == "MFU (selected jobs)"]
    steps = [s["value"] for s in stat["fieldConfig"]["defaults"]["thresholds"]["steps"]]
    assert steps == [
        None,
        recorded_value("mfu:threshold_critical:ratio"),
        recorded_value("mfu:threshold_low:ratio"),
        recorded_value("mfu:threshold_achievable:ratio"),
    ]


# --- query rules ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("where, expr", QUERIES)
def test_query_parses(where, expr):
    parsed(expr)


def test_queries_parse_with_the_prometheus_242_parser(tmp_path):
    """promql-parser follows newer Prometheus; promtool checks the dialect of the Prometheus the tests run (2.42)."""
    promtool = require_tool("promtool", "prometheus")
    rules = [{"record": f"dashboard:query_{i}:check", "expr": substitute(expr)} for i, (_, expr) in enumerate(QUERIES)]
    check = tmp_path / "dashboard-queries.yaml"
    check.write_text(yaml.safe_dump({"groups": [{"name": "dashboard-queries", "rules": rules}]}))
    result = subprocess.run([promtool, "check", "rules", str(check)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("where, expr", QUERIES)
def test_rates_use_the_rate_interval(where, expr):
    for node, _ in promql_nodes(parsed(expr)):
        if isinstance(node, promql_parser.Call) and node.func.name in RATE_FUNCTIONS:
            (matrix,) = node.args
            assert matrix.range == RATE_INTERVAL, f"{node.func.name}() over {matrix.range}, not $__rate_interval"


@pytest.mark.parametrize("where, expr", QUERIES)
def test_counters_and_buckets_only_inside_rates(where, expr):
    for selector, calls in selectors(expr):
        if selector.name.endswith(("_total", "_bucket")):
            assert RATE_FUNCTIONS & set(calls), f"{selector.name} outside rate/irate/increase"


@pytest.mark.parametrize("where, expr", QUERIES)
def test_queries_read_documented_or_recorded_series(where, expr):
    known = set(documented_metrics()) | recorded_names()
    for selector, _ in selectors(expr):
        assert selector.name in known, f"{selector.name} is neither in docs/metrics.md nor recorded by alerts/"


@pytest.mark.parametrize("where, expr", QUERIES)
def test_queries_filter_by_the_dashboard_variables(where, expr):
    """Exporter series by $job and $instance (dashboard-linter's target-job/instance rules), per-job series also by
    $training_job; recorded series by the labels their level keeps."""
    documented = documented_metrics()
    for selector, _ in selectors(expr):
        name = selector.name
        if ":" in name:
            level = name.split(":")[0]
            wanted = {"training_job": ["training_job"], "instance": ["job", "instance"], "mfu": []}[level]
        else:
            wanted = ["job", "instance"] + (["training_job"] if "training_job" in documented.get(name, ()) else [])
        found = matchers(selector)
        for label in wanted:
            assert found.get(label) == ("Re", f"${label}"), f'{name}: needs {label}=~"${label}", has {found.get(label)}'


# --- provisioning -----------------------------------------------------------------------------------------------


def test_provisioning_file_loads_this_directory():
    document = yaml.safe_load(PROVISIONING.read_text())
    assert document["apiVersion"] == 1
    (provider,) = document["providers"]
    assert provider["type"] == "file" and provider["options"]["path"].startswith("/")
    assert provider["allowUiUpdates"] is False, "the JSON files are the source: UI edits would be lost"
    assert len(provider["folderUid"]) <= 40


def test_provisioning_file_matches_the_deploy_one():
    assert yaml.safe_load(PROVISIONING.read_text()) == yaml.safe_load(DEPLOY_PROVISIONING.read_text())
