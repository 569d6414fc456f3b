"""The README's picture of the status page (docs/img/status-page.png), taken from the demo in Chromium.

Every run takes the screenshot and checks the page it shows; ``--update-screenshot`` (make screenshot) also writes it
over docs/img/status-page.png, as ``--update-golden`` does for the golden exposition. A change of pixels never
fails a test: the page's content is checked in the DOM, here and in test_status_page.py.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from tests.support.browser import chromium, png_size
from tests.support.demo_harness import get_json, running_demo
from tests.support.wait import wait_until

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PICTURE = ROOT / "docs" / "img" / "status-page.png"
WIDTH, HEIGHT = 1400, 1000  # the top of the page: the job's MFU, its chart, the cause, the GPUs
JOB = "llama3-70b"


@pytest.fixture
def update_screenshot(request) -> bool:
    return request.config.getoption("--update-screenshot")


def test_the_readme_screenshot_of_the_status_page(tmp_path, update_screenshot):
    # The rotation with 4 minutes of healthy training between incidents: a PFC storm, then a checkpoint write that
    # stalls for 15 minutes. During the stall the picture shows a cause with its evidence, and a chart with the
    # storm's drop and the stall's dip; the stall outlasts the browser's run however slow the machine is.
    with running_demo("--incident-gap", "4m", speed=20) as base:

        def shown() -> bool:
            if get_json(base + "api/v1/demo")["incident"] != "checkpoint-stall":
                return False  # a routine checkpoint write names the cause too, for a few seconds only
            (job,) = [j for j in get_json(base + "api/v1/jobs")["jobs"] if j["job"] == JOB]
            return (job.get("bottleneck") or {}).get("cause") == "checkpoint"

        wait_until(shown, 120, "the checkpoint stall's cause", interval=0.5)
        shot = tmp_path / "status-page.png"
        # One browser run for both: the DOM checked is the page the picture shows.
        dom = chromium(tmp_path, base, "--dump-dom", f"--screenshot={shot}", width=WIDTH, height=HEIGHT)

    # What the caption says the picture shows: the job's MFU, and the cause with its evidence.
    card = dom.split(f'<div class="card" data-job="{JOB}">', 1)[-1].split('<div class="card" data-job=', 1)[0]
    assert card != dom and re.search(r'data-mfu="[0-9.]+"', card)
    cause = re.search(r'data-cause="([a-z_]+)"', card)
    assert cause and cause.group(1) == "checkpoint" and "step-" in card, cause
    assert png_size(shot) == (WIDTH, HEIGHT)
    assert shot.stat().st_size > 20_000  # a drawn page, not a blank window
    if update_screenshot:
        PICTURE.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, PICTURE)
    # The picture the README shows is one this test took (now, or when it was last updated).
    assert png_size(PICTURE) == (WIDTH, HEIGHT), f"{PICTURE}: run pytest {__file__} --update-screenshot"
