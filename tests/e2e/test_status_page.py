"""The status page in a real browser: Debian's headless Chromium runs the page's own JavaScript against the demo."""

import re
import subprocess
import threading

from tests.support.demo_harness import get_json, metric_samples, running_demo
from tests.support.tools import require_tool
from tests.support.wait import wait_until

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
    "--window-size=1400,1500",
    # Virtual time runs the page's timers and fetches until the budget is spent: at least two refreshes.
    "--virtual-time-budget=5000",
]


def chromium(tmp_path, url, *args):
    browser = require_tool("chromium", "chromium")
    profile = tmp_path / f"profile-{len(list(tmp_path.iterdir()))}"
    result = subprocess.run(
        [browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args, url], capture_output=True, timeout=90
    )
    assert result.returncode == 0, result.stderr.decode(errors="replace")[-2000:]
    return result.stdout.decode()


def test_page_shows_the_apis_mfu_and_a_forced_incident(tmp_path):
    # A long window keeps MFU steady between the browser's read and ours.
    with running_demo("--incident", "thermal", "--mfu.window", "60s", speed=20) as base:
        # The node's count of GPUs held down by heat (the per-GPU reasons are at series: full); the page names GPU 1.
        throttled = ("mfu_node_gpus_throttled", (("cause", "thermal"),))
        wait_until(lambda: metric_samples(base).get(throttled) == 1, 30, "a GPU throttled for heat")
        readings = []

        def settled():
            readings.append(get_json(base + "api/v1/jobs")["jobs"][0]["mfu"] or 0)
            return len(readings) >= 3 and 0.27 < readings[-1] < 0.33 and max(readings[-3:]) - min(readings[-3:]) < 0.003

        wait_until(settled, 40, "MFU to settle near 30%", interval=0.5)
        # The page reads the API while the browser runs; what the API said all that time is polled beside it, so
        # the comparison holds however far a loaded machine lets the simulated job move meanwhile.
        during, browsing = [readings[-1]], threading.Event()

        def poll():
            while not browsing.wait(0.05):
                during.append(get_json(base + "api/v1/jobs")["jobs"][0]["mfu"] or 0)

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        try:
            dom = chromium(tmp_path, base, "--dump-dom")
        finally:
            browsing.set()
            poller.join()
        during.append(get_json(base + "api/v1/jobs")["jobs"][0]["mfu"] or 0)

        assert int(re.search(r'data-updates="(\d+)"', dom).group(1)) >= 1, "the page never updated itself"
        shown_ratio, shown_text = re.search(r'data-mfu="([0-9.]+)">([0-9.]+)%<', dom).groups()
        assert shown_text == f"{100 * float(shown_ratio):.1f}"  # the figure printed is the one the page received
        assert min(during) - 0.005 < float(shown_ratio) < max(during) + 0.005  # and it is one the API gave
        gpu1 = re.search(r"<tr><td[^>]*>1</td>.*?</tr>", dom).group(0)
        assert "hw_thermal_slowdown" in gpu1 and "91 °C" in gpu1
        assert "ens3np0" in dom and "mlx5_2/1" in dom
        cause = re.search(r'<div class="cause" data-cause="([a-z_]+)">(.*?)</div>', dom)
        assert cause, "the page does not say why MFU is low"
        assert cause.group(1) == "thermal" and "GPU 1 throttled: hw_thermal_slowdown" in cause.group(2)
        assert 'data-job="bert-pretrain"' in dom and "kubernetes" in dom  # the discovered job, and how it was found

        screenshot = tmp_path / "status-page.png"
        chromium(tmp_path, base, f"--screenshot={screenshot}")
        assert screenshot.stat().st_size > 20_000
