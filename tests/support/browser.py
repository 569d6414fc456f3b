"""Debian's headless Chromium, run on a page: its DOM after the page's own JavaScript ran, or a screenshot."""

from __future__ import annotations

import struct
import subprocess
from pathlib import Path

from tests.support.tools import require_tool

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    # Virtual time runs the page's timers and fetches until the budget is spent: at least two refreshes.
    "--virtual-time-budget=5000",
]


def chromium(profiles: Path, url: str, *args: str, width: int = 1400, height: int = 1500) -> str:
    """Run Chromium on ``url`` with ``args`` (``--dump-dom``, ``--screenshot=FILE``) in a window of ``width`` ×
    ``height``, with a fresh profile under ``profiles``; its standard output."""
    browser = require_tool("chromium", "chromium")
    profile = profiles / f"profile-{len(list(profiles.iterdir()))}"
    flags = [*CHROMIUM_FLAGS, f"--window-size={width},{height}", f"--user-data-dir={profile}"]
    result = subprocess.run([browser, *flags, *args, url], capture_output=True, timeout=90)
    assert result.returncode == 0, result.stderr.decode(errors="replace")[-2000:]
    return result.stdout.decode()


def png_size(path: Path) -> tuple[int, int]:
    """A PNG file's width and height, from its IHDR chunk; AssertionError for anything that is not a PNG."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", f"{path} is not a PNG"
    width, height = struct.unpack(">II", head[16:24])
    return width, height
