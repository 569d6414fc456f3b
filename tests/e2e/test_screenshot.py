"""The README's picture of the status page (docs/img/status-page.png), taken from the demo in Chromium.

Every run takes the screenshot and checks the page it shows; ``--update-screenshot`` (make screenshot) also writes it
over docs/img/status-page.png, as ``--update-golden`` does for the golden exposition. A change of pixels never
fails a test: what the page says is checked in the page itself, here and in test_status_page.py.
"""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import pytest

from tests.support.browser import browser
from tests.support.demo_harness import get_json, running_demo
from tests.support.wait import wait_until

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PICTURE = ROOT / "docs" / "img" / "status-page.png"
WIDTH, HEIGHT = 1400, 1000  # the window; the viewport's top: the jobs' MFU, their charts, the cause, the first GPUs
JOB = "llama3-70b"
# The job's card says its MFU and why it is low: a cause, and the checkpoint being written.
CARD = (
    f"const card = document.querySelector('.card[data-job=\"{JOB}\"]');"
    "const cause = card && card.querySelector('[data-cause]');"
    "return card ? {cause: cause && cause.dataset.cause, text: card.textContent} : null"
)


def png_size(path: Path) -> tuple[int, int]:
    """A PNG file's width and height, from its IHDR chunk; AssertionError for anything that is not a PNG."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", f"{path} is not a PNG"
    width, height = struct.unpack(">II", head[16:24])
    return width, height


@pytest.fixture
def update_screenshot(request) -> bool:
    return request.config.getoption("--update-screenshot")


def test_the_readme_screenshot_of_the_status_page(tmp_path, update_screenshot):
    # The rotation with 4 minutes of healthy training between incidents: a PFC storm, then a checkpoint write that
    # stalls for 15 minutes. During the stall the picture shows a cause with its evidence, and a chart with the
    # storm's drop and the stall's dip; the stall outlasts the browser's work however slow the machine is.
    with running_demo("--incident-gap", "4m", speed=20) as base:
        wait_until(
            lambda: get_json(base + "api/v1/demo")["incident"] == "checkpoint-stall",
            120,
            "the checkpoint stall",
            interval=0.5,
        )
        shot = tmp_path / "status-page.png"
        with browser(tmp_path, WIDTH, HEIGHT) as page:
            page.get(base)
            # A routine checkpoint write names the cause too, for seconds; the stall's holds while the demo says so.
            card = wait_until(
                lambda: (card := page.execute(CARD)) and card["cause"] == "checkpoint" and card,
                60,
                "the page to say the job's MFU is low for its checkpoint",
            )
            page.screenshot(shot)
            assert get_json(base + "api/v1/demo")["incident"] == "checkpoint-stall"  # what the picture shows

    assert "step-" in card["text"] and "%" in card["text"]  # the checkpoint's name, the MFU
    width, height = png_size(shot)
    assert width == WIDTH and 0.7 * HEIGHT < height <= HEIGHT  # the viewport: the window less the browser's own
    assert shot.stat().st_size > 20_000  # a drawn page, not a blank window
    if update_screenshot:
        PICTURE.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, PICTURE)
    # The picture the README shows is one this test took (now, or when it was last updated).
    assert png_size(PICTURE)[0] == WIDTH, f"{PICTURE}: run pytest {__file__} --update-screenshot"
