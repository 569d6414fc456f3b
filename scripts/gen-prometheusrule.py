#!/usr/bin/env python3
"""Write deploy/kubernetes/prometheusrule.yaml from the Prometheus rule files in alerts/, and point every
``runbook_url`` in alerts/ at one runbook base URL.

Kustomize cannot read files outside its own directory, so the PrometheusRule carries a generated copy of every rule
group in alerts/*.yaml (files with a top-level ``groups:`` key; alerts/tests/ and the Alertmanager example are not
rule files). tests/e2e/test_deploy.py runs this with --check, so a rule changed in alerts/ without rerunning this fails.

A ``runbook_url`` is read by people in a pager or a chat message, where a repository-relative path is a dead link, so
each one is absolute: ``<base>/runbook.md#<anchor>``. The anchor is kept from the URL already there and must be a
heading of docs/runbook.md. The base is set here, once, for the rule files, the rule unit tests in alerts/tests/
(their expected annotations) and the PrometheusRule alike: those ``runbook_url:`` lines are rewritten in place, so
comments and layout stay as written.

    scripts/gen-prometheusrule.py                                        # regenerate (default base)
    scripts/gen-prometheusrule.py --runbook-base https://wiki.example.org/mfu
    scripts/gen-prometheusrule.py --check    # exit 1 when a committed file differs from what this would write
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from urllib.parse import urlsplit

import yaml

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_ALERTS = ROOT / "alerts"
DEFAULT_OUTPUT = ROOT / "deploy" / "kubernetes" / "prometheusrule.yaml"
DEFAULT_RUNBOOK = ROOT / "docs" / "runbook.md"
RULE_NAME = "mfu-exporter"
# The project's docs in the repository web view, where docs/runbook.md renders with its heading anchors. A site that
# keeps its own copy of the runbook (a wiki, an internal docs host) passes --runbook-base (make rules RUNBOOK_BASE=...).
DEFAULT_RUNBOOK_BASE = "https://github.com/mfu-exporter/mfu-exporter/blob/main/docs"
RUNBOOK_PAGE = "runbook.md"
# One runbook_url per line, as alerts/ writes them: `runbook_url: <url>`, the URL plain or in one kind of quotes.
RUNBOOK_LINE = re.compile(
    r"^(?P<lead>\s*(?:-\s+)?runbook_url:\s*)(?P<quote>['\"]?)(?P<url>[^'\"\s]+)(?P=quote)(?P<tail>\s*)$"
)


class RuleFileError(Exception):
    pass


class _BlockStyleDumper(yaml.SafeDumper):
    """Multi-line strings (PromQL, descriptions) as ``|`` blocks, so the generated file reads like alerts/."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockStyleDumper.add_representer(str, _represent_str)


def heading_anchors(markdown: str) -> set[str]:
    """The anchors a Markdown renderer (GitHub's, GitLab's) gives the headings of ``markdown``.

    Lower case; punctuation other than ``-`` and ``_`` dropped; spaces become ``-``; a repeated heading gets ``-1``,
    ``-2`` and so on. Headings inside fenced code blocks are not headings.
    """
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in markdown.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            continue
        match = None if fenced else re.match(r"^#{1,6}\s+(.+?)\s*#*\s*$", line)
        if not match:
            continue
        text = re.sub(r"`|\*\*|__", "", match.group(1)).strip().lower()
        slug = re.sub(r"[^\w\- ]", "", text).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def check_runbook_base(base: str) -> str:
    """``base`` without a trailing slash; RuleFileError unless it is an absolute http(s) URL with no query or fragment."""
    parts = urlsplit(base)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
        raise RuleFileError(
            f"--runbook-base: expected an absolute http(s) URL with no query or fragment, "
            f"such as {DEFAULT_RUNBOOK_BASE}, got {base!r}"
        )
    return base.rstrip("/")


def runbook_url(base: str, anchor: str) -> str:
    return f"{base}/{RUNBOOK_PAGE}#{anchor}"


def with_runbook_base(path: Path, text: str, base: str, anchors: set[str]) -> str:
    """``text`` with each ``runbook_url:`` line pointing at ``base``; the anchor after ``#`` stays as written."""
    lines = text.splitlines(keepends=True)
    for number, line in enumerate(lines):
        body = line.rstrip("\r\n")
        if "runbook_url:" not in body or body.lstrip().startswith("#"):
            continue
        match = RUNBOOK_LINE.match(body)
        if not match:
            raise RuleFileError(f"{path}:{number + 1}: runbook_url: expected one URL on the line, got {body.strip()!r}")
        anchor = match["url"].partition("#")[2]
        if anchor not in anchors:
            raise RuleFileError(
                f"{path}:{number + 1}: runbook_url: expected a URL ending in #<anchor of a heading in "
                f"{RUNBOOK_PAGE}>, got {match['url']!r}"
                + (f" (no heading has the anchor {anchor!r})" if anchor else "")
            )
        quote = match["quote"]
        lines[number] = match["lead"] + quote + runbook_url(base, anchor) + quote + match["tail"] + line[len(body) :]
    return "".join(lines)


def alert_texts(alerts_dir: Path, base: str, runbook: Path) -> dict[Path, str]:
    """Every YAML file under ``alerts_dir`` (rule files, their unit tests) with its runbook URLs on ``base``."""
    anchors = heading_anchors(runbook.read_text(encoding="utf-8")) if runbook.exists() else set()
    texts = {}
    for path in sorted([*alerts_dir.rglob("*.yaml"), *alerts_dir.rglob("*.yml")]):
        texts[path] = with_runbook_base(path, path.read_text(encoding="utf-8"), base, anchors)
    return texts


def rule_files(alerts_dir: Path, texts: dict[Path, str] | None = None) -> list[tuple[Path, list[dict]]]:
    """Each rule file in ``alerts_dir`` (sorted by name) with its groups; other YAML files are skipped.

    ``texts`` stands in for the files' contents where given (their runbook URLs already rewritten).
    """
    found = []
    for path in sorted([*alerts_dir.glob("*.yaml"), *alerts_dir.glob("*.yml")], key=lambda p: p.name):
        if texts is not None and path in texts:
            document = yaml.safe_load(texts[path])
        else:
            with path.open(encoding="utf-8") as handle:
                document = yaml.safe_load(handle)
        if not isinstance(document, dict) or "groups" not in document:
            continue
        groups = document["groups"] or []
        if not isinstance(groups, list) or not all(isinstance(g, dict) and "name" in g for g in groups):
            raise RuleFileError(f"{path}: groups: expected a list of mappings, each with a name")
        found.append((path, groups))
    return found


def render(alerts_dir: Path, texts: dict[Path, str] | None = None) -> str:
    groups: list[dict] = []
    origin: dict[str, Path] = {}
    files = rule_files(alerts_dir, texts)
    for path, file_groups in files:
        for group in file_groups:
            # The operator puts one PrometheusRule into one rule file, where Prometheus refuses repeated group names.
            if group["name"] in origin:
                raise RuleFileError(f"{path}: group {group['name']!r} is also defined in {origin[group['name']]}")
            origin[group["name"]] = path
            groups.append(group)
    manifest = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": RULE_NAME, "labels": {"app.kubernetes.io/name": "mfu-exporter"}},
        "spec": {"groups": groups},
    }
    sources = ", ".join(f"{alerts_dir.name}/{path.name}" for path, _ in files) or f"{alerts_dir.name}/ (no rule files)"
    header = (
        "# Generated by scripts/gen-prometheusrule.py; do not edit. Edit the rule files and rerun it.\n"
        f"# From: {sources}\n"
    )
    return header + yaml.dump(manifest, Dumper=_BlockStyleDumper, sort_keys=False, allow_unicode=True, width=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--alerts", type=Path, default=DEFAULT_ALERTS, help="directory of rule files (default alerts/)")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="PrometheusRule manifest to write")
    parser.add_argument(
        "--runbook-base",
        default=DEFAULT_RUNBOOK_BASE,
        metavar="URL",
        help=f"where {RUNBOOK_PAGE} is served; each runbook_url becomes URL/{RUNBOOK_PAGE}#<anchor> "
        f"(default {DEFAULT_RUNBOOK_BASE})",
    )
    parser.add_argument(
        "--runbook",
        type=Path,
        default=DEFAULT_RUNBOOK,
        help="the runbook whose headings the anchors must name (default docs/runbook.md)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 when --output or a runbook_url in --alerts is out of date",
    )
    args = parser.parse_args(argv)
    try:
        base = check_runbook_base(args.runbook_base)
        texts = alert_texts(args.alerts, base, args.runbook)
        wanted = render(args.alerts, texts)
    except (RuleFileError, yaml.YAMLError, OSError) as exc:
        print(f"gen-prometheusrule: {exc}", file=sys.stderr)
        return 2
    stale = [path for path, text in texts.items() if path.read_text(encoding="utf-8") != text]
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.exists() else None
        if current != wanted:
            stale.append(args.output)
        for path in stale:
            print(
                f"gen-prometheusrule: {path} is out of date with {args.alerts}/ and runbook base {base}; "
                "run scripts/gen-prometheusrule.py (make rules)",
                file=sys.stderr,
            )
        return 1 if stale else 0
    for path in stale:
        path.write_text(texts[path], encoding="utf-8")
        print(f"gen-prometheusrule: runbook URLs of {path} now on {base}")
    args.output.write_text(wanted, encoding="utf-8")
    print(f"gen-prometheusrule: wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
