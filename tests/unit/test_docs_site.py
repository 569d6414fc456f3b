"""The documentation builds and its links hold: MkDocs builds the site in strict mode (a missing page, a broken link
between pages or an unknown anchor fails, as in make docs), and every relative link of README.md, CHANGELOG.md and
docs/*.md, the ones the site does not check included (README.md is not part of it, and links to the repository's
other files leave it), names a file that exists and, for a markdown file, a heading it has, as GitHub makes anchors."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "clients" / "python" / "README.md"] + sorted(
    (ROOT / "docs").glob("*.md")
)
FENCE = re.compile(r"^\s*(```|~~~)")
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def prose(text: str) -> list[str]:
    """The lines outside fenced code, with inline code blanked (a link inside code is not a link)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(re.sub(r"`[^`]*`", "``", line))
    return lines


def github_anchor(heading: str) -> str:
    """The id GitHub gives a heading: its text as rendered (code and links as their text, emphasis marks gone),
    lower-cased, every character but letters, digits, ``_``, ``-`` and spaces dropped, spaces made hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"`([^`]*)`", r"\1", text)
    text = re.sub(r"(\*\*|__|\*|(?<!\w)_|_(?!\w))", "", text)
    text = re.sub(r"<[^>]+>", "", text)
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    counts: dict[str, int] = {}
    fenced = False
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        match = None if fenced else HEADING.match(line)
        if match:
            slug = github_anchor(match.group(2))
            n = counts.get(slug, 0)
            counts[slug] = n + 1
            found.add(slug if n == 0 else f"{slug}-{n}")
    return found


def links(path: Path) -> list[str]:
    return [m.group(1) for line in prose(path.read_text()) for m in LINK.finditer(line)]


def test_the_anchor_rule_is_githubs():
    assert github_anchor("Checking a node before a job: `mfu-exporter check`") == (
        "checking-a-node-before-a-job-mfu-exporter-check"
    )
    assert github_anchor("Issue 25: growth to 4,096 nodes (measured)") == "issue-25-growth-to-4096-nodes-measured"
    assert github_anchor("POST /api/v1/progress") == "post-apiv1progress"
    assert github_anchor("MFU and **where** it_went") == "mfu-and-where-it_went"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_names_a_file_and_a_heading_that_exist(page):
    broken = []
    for target in links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):
            continue  # http(s), mailto: not fetched
        file, _, fragment = target.partition("#")
        resolved = (page.parent / unquote(file)).resolve() if file else page
        if not resolved.exists():
            broken.append(f"{target}: no {resolved.relative_to(ROOT) if resolved.is_relative_to(ROOT) else resolved}")
        elif fragment and resolved.suffix == ".md" and unquote(fragment) not in anchors(resolved):
            broken.append(f"{target}: no heading #{fragment} in {resolved.relative_to(ROOT)}")
    assert broken == [], f"{page.relative_to(ROOT)}: broken links"


def test_every_guide_is_in_the_sites_navigation():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())

    def pages(nav) -> list[str]:
        found = []
        for entry in nav:
            value = next(iter(entry.values())) if isinstance(entry, dict) else entry
            found += pages(value) if isinstance(value, list) else [value]
        return found

    listed = pages(config["nav"])
    assert sorted(listed) == sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    assert len(listed) == len(set(listed))


def test_the_site_builds_in_strict_mode(tmp_path):
    site = tmp_path / "site"
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    assert (site / "index.html").exists() and (site / "img" / "status-page.png").exists()
    for page in (ROOT / "docs").glob("*.md"):
        name = "index.html" if page.stem == "index" else f"{page.stem}/index.html"
        assert (site / name).exists(), name


def test_a_broken_link_fails_the_strict_build(tmp_path):
    """The strict build is a check: a guide linking to a page, a file or a heading that does not exist stops it."""
    tree = tmp_path / "tree"
    (tree / "docs").mkdir(parents=True)
    (tree / "scripts").mkdir()
    (tree / "scripts" / "mkdocs_hooks.py").write_text((ROOT / "scripts" / "mkdocs_hooks.py").read_text())
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    config["nav"] = [{"Home": "index.md"}]
    (tree / "mkdocs.yml").write_text(yaml.safe_dump(config))
    (tree / "docs" / "index.md").write_text(
        "# Home\n\nSee [the guide](missing.md), [a file](../absent.yaml), [a heading](#nowhere).\n"
    )
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode != 0
    assert all(name in built.stderr for name in ("missing.md", "absent.yaml", "#nowhere")), built.stderr
