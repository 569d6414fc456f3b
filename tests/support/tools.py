"""Debian tools the tests drive (promtool, prometheus, ss, ethtool...): found on PATH, or the test says why not."""

from __future__ import annotations

import os
import shutil

import pytest


def require_tool(tool: str, package: str) -> str:
    """The path of a Debian tool a test drives. Missing in CI is a failure (make test installs it); elsewhere a skip."""
    path = shutil.which(tool)
    if path:
        return path
    message = f"{tool} not found: `make test` installs Debian's {package} (run it as root)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)
