"""The two distributions' build files agree: one version everywhere, and the client's modules are the ones the
daemon's wheel leaves out. tests/e2e/test_packaging.py builds and installs them."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from mfu_exporter import __version__

ROOT = Path(__file__).resolve().parents[2]
CLIENT = ROOT / "clients" / "python"


def test_the_daemon_requires_the_client_at_its_own_version():
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.findall(r'"mfu-exporter-client==([^"]+)"', pyproject) == [__version__]
    for path in (ROOT / "pyproject.toml", CLIENT / "pyproject.toml"):
        assert 'version = { attr = "mfu_exporter.__version__" }' in path.read_text(), path


def test_the_client_links_the_modules_the_daemon_wheel_leaves_out():
    setup = ast.parse((ROOT / "setup.py").read_text())
    (left_out,) = [
        ast.literal_eval(node.value)
        for node in ast.walk(setup)
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "CLIENT_MODULES"
    ]
    links = sorted((CLIENT / "mfu_exporter").iterdir())
    assert {link.stem for link in links} == left_out
    for link in links:
        # A link, not a copy: one file for both distributions, so the client cannot drift from the code tested here.
        assert link.is_symlink() and link.resolve() == (ROOT / "mfu_exporter" / link.name).resolve(), link
    manifest = (ROOT / "MANIFEST.in").read_text()
    assert all(f"mfu_exporter/{name}.py" in manifest for name in left_out)
    assert (CLIENT / "LICENSE").resolve() == (ROOT / "LICENSE").resolve()
