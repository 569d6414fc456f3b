"""Every alert's runbook_url is an absolute link to a heading of docs/runbook.md, in alerts/, in the rule unit tests
and in the Kubernetes PrometheusRule; scripts/gen-prometheusrule.py moves all of them to another base at once."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ALERTS_DIR = ROOT / "alerts"
RUNBOOK = ROOT / "docs" / "runbook.md"
PROMETHEUS_RULE = ROOT / "deploy" / "kubernetes" / "prometheusrule.yaml"
GENERATOR = ROOT / "scripts" / "gen-prometheusrule.py"
WIKI = "https://wiki.example.org/mfu"


def load_generator():
    spec = importlib.util.spec_from_file_location("gen_prometheusrule_links", GENERATOR)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


generator = load_generator()


def alert_links(groups: list[dict]) -> dict[str, set[str]]:
    """Alert name -> the runbook URLs its rules carry (an alert may have a rule per severity)."""
    links: dict[str, set[str]] = {}
    for group in groups:
        for rule in group["rules"]:
            if "alert" in rule:
                links.setdefault(rule["alert"], set()).add(rule["annotations"]["runbook_url"])
    return links


def rule_file_links(alerts_dir: Path) -> dict[str, set[str]]:
    links: dict[str, set[str]] = {}
    for path, groups in generator.rule_files(alerts_dir):
        for name, urls in alert_links(groups).items():
            links.setdefault(name, set()).update(urls)
    return links


def unit_test_links(alerts_dir: Path) -> dict[str, set[str]]:
    """Alert name -> the runbook URLs the promtool unit tests expect it to fire with."""
    links: dict[str, set[str]] = {}
    for path in sorted((alerts_dir / "tests").glob("*.yaml")):
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                for alert in check["exp_alerts"]:
                    url = alert.get("exp_annotations", {}).get("runbook_url")
                    if url is not None:
                        links.setdefault(check["alertname"], set()).add(url)
    return links


def assert_resolves(name: str, url: str, base: str) -> None:
    parts = urlsplit(url)
    assert parts.scheme == "https" and parts.netloc, f"{name}: {url} is not an absolute link"
    assert url == f"{base}/runbook.md#{parts.fragment}", f"{name}: {url} is not on the base {base}"
    anchors = generator.heading_anchors(RUNBOOK.read_text())
    assert parts.fragment in anchors, f"{name}: #{parts.fragment} is no heading of docs/runbook.md"
    assert parts.fragment == name.lower(), f"{name}: links to another alert's entry (#{parts.fragment})"


def test_every_alert_links_to_its_own_runbook_heading():
    links = rule_file_links(ALERTS_DIR)
    entries = re.findall(r"^## (Mfu\w+)$", RUNBOOK.read_text(), re.MULTILINE)
    assert entries and set(links) == set(entries)  # every alert of alerts/, not an empty parse
    for name, urls in links.items():
        (url,) = urls  # one entry per alert, whatever the severity
        assert_resolves(name, url, generator.DEFAULT_RUNBOOK_BASE)


def test_the_prometheusrule_and_the_unit_tests_carry_the_same_links():
    manifest = yaml.safe_load(PROMETHEUS_RULE.read_text())
    assert alert_links(manifest["spec"]["groups"]) == rule_file_links(ALERTS_DIR)
    expected = unit_test_links(ALERTS_DIR)
    assert expected, "the unit tests check no runbook_url"
    for name, urls in expected.items():
        for url in urls:
            assert_resolves(name, url, generator.DEFAULT_RUNBOOK_BASE)


def test_heading_anchors_follow_the_markdown_renderers():
    markdown = "# Runbook\n## MFU thresholds\n## `MfuLow`\n```\n## not a heading\n```\n## MFU thresholds\n"
    assert generator.heading_anchors(markdown) == {"runbook", "mfu-thresholds", "mfulow", "mfu-thresholds-1"}


@pytest.fixture
def tree(tmp_path) -> Path:
    """A copy of alerts/, docs/runbook.md and the PrometheusRule to regenerate in."""
    shutil.copytree(ALERTS_DIR, tmp_path / "alerts")
    (tmp_path / "docs").mkdir()
    shutil.copy(RUNBOOK, tmp_path / "docs" / "runbook.md")
    shutil.copy(PROMETHEUS_RULE, tmp_path / "prometheusrule.yaml")
    return tmp_path


def generate(tree: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            str(GENERATOR),
            "--alerts",
            str(tree / "alerts"),
            "--output",
            str(tree / "prometheusrule.yaml"),
            "--runbook",
            str(tree / "docs" / "runbook.md"),
            *flags,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_committed_files_are_on_the_default_base(tree):
    result = generate(tree, "--check")
    assert result.returncode == 0, result.stderr


def test_another_base_moves_every_link_and_nothing_else(tree):
    before = {path: path.read_text() for path in (tree / "alerts").rglob("*.yaml")}
    result = generate(tree, "--runbook-base", WIKI + "/")  # a trailing slash is not doubled
    assert result.returncode == 0, result.stderr
    for name, urls in rule_file_links(tree / "alerts").items():
        assert urls == {f"{WIKI}/runbook.md#{name.lower()}"}, name
    for name, urls in unit_test_links(tree / "alerts").items():
        assert urls == {f"{WIKI}/runbook.md#{name.lower()}"}, name
    manifest = yaml.safe_load((tree / "prometheusrule.yaml").read_text())
    assert alert_links(manifest["spec"]["groups"]) == rule_file_links(tree / "alerts")
    for path, text in before.items():
        # Only runbook_url lines change: comments, quoting and order stay as written.
        changed = [(old, new) for old, new in zip(text.splitlines(), path.read_text().splitlines()) if old != new]
        assert len(text.splitlines()) == len(path.read_text().splitlines()), path.name
        assert all("runbook_url:" in old and WIKI in new for old, new in changed), (path.name, changed[:2])
    # Against the default base, every file moved is now out of date; regenerating brings them back.
    drift = generate(tree, "--check")
    assert drift.returncode == 1 and "mfu-exporter.alerts.yaml is out of date" in drift.stderr
    assert "prometheusrule.yaml is out of date" in drift.stderr
    assert generate(tree).returncode == 0
    assert {path: path.read_text() for path in (tree / "alerts").rglob("*.yaml")} == before


@pytest.mark.parametrize(
    "base", ["docs", "wiki.example.org/mfu", "https://wiki.example.org/mfu#x", "ftp://wiki.example.org/mfu"]
)
def test_a_base_that_is_not_an_absolute_url_is_refused(tree, base):
    result = generate(tree, "--runbook-base", base)
    assert result.returncode == 2 and "--runbook-base: expected an absolute http(s) URL" in result.stderr


def test_a_link_to_no_heading_is_refused_naming_the_file_and_line(tree):
    alerts = tree / "alerts" / "mfu-exporter.alerts.yaml"
    text = alerts.read_text()
    line = text[: text.index("#mfulow")].count("\n") + 1
    alerts.write_text(text.replace("#mfulow", "#mfu-low", 1))
    result = generate(tree)
    assert result.returncode == 2
    assert f"{alerts}:{line}: runbook_url:" in result.stderr and "no heading has the anchor 'mfu-low'" in result.stderr
    assert alerts.read_text() == text.replace("#mfulow", "#mfu-low", 1), "nothing is written on an error"
