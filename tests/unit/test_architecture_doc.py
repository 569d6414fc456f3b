"""docs/architecture.md names every package and module of mfu_exporter/ (the map is drawn from the code), and no
file of mfu_exporter/ but the simulation's fakes is over 600 lines."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "mfu_exporter"
GENERATED = re.compile(r"_pb2(_grpc)?$")  # the kubelet's generated gRPC stubs
MAX_LINES = 600


def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if not GENERATED.search(p.stem))


def test_every_package_and_module_is_named_in_the_architecture_page():
    text = (ROOT / "docs" / "architecture.md").read_text()
    missing = []
    for path in modules():
        name = path.parent.name + "/" if path.stem == "__init__" else path.stem
        if path.stem == "__init__" and path.parent == PACKAGE:
            continue
        if not re.search(rf"(?<![\w/]){re.escape(name)}(?:\.py)?(?!\w)", text):
            missing.append(str(path.relative_to(ROOT)))
    assert missing == []


def test_no_module_but_the_simulations_is_over_600_lines():
    long = {
        str(path.relative_to(ROOT)): lines
        for path in modules()
        if (lines := len(path.read_text().splitlines())) > MAX_LINES and path.parent.name != "sim"
    }
    assert long == {}
