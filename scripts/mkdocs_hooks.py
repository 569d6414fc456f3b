"""MkDocs hook (mkdocs.yml ``hooks:``): a guide's relative link to a file of the repository outside docs/ (``../alerts/``,
``../deploy/kubernetes/``, ``../CHANGELOG.md``) becomes a link to that file on GitHub, so the site's links work; one to a
file that does not exist is left as it is, for strict mode to fail on. Links inside code are not touched."""

from __future__ import annotations

import re
from pathlib import Path

LINK = re.compile(r"(\]\()([^)\s#]+)(#[^)\s]*)?(\))")
FENCE = re.compile(r"^\s*(```|~~~)")


def on_page_markdown(markdown, page, config, files):
    docs = Path(config["docs_dir"]).resolve()
    root = docs.parent
    base = config["repo_url"].rstrip("/")
    here = Path(page.file.abs_src_path).parent

    def rewrite(match: re.Match) -> str:
        target = match.group(2)
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("/"):
            return match.group(0)
        path = (here / target).resolve()
        if path.is_relative_to(docs) or not path.is_relative_to(root) or not path.exists():
            return match.group(0)
        kind = "tree" if path.is_dir() else "blob"
        url = f"{base}/{kind}/main/{path.relative_to(root).as_posix()}"
        return f"{match.group(1)}{url}{match.group(3) or ''}{match.group(4)}"

    out, fenced = [], False
    for line in markdown.splitlines(keepends=True):
        if FENCE.match(line):
            fenced = not fenced
        out.append(line if fenced else LINK.sub(rewrite, line))
    return "".join(out)
