"""The daemon serves its own cost: client_python's ProcessCollector under the standard ``process_`` names, on a
real ``mfu-exporter run`` over loopback, in both exposition formats; documented in docs/metrics.md."""

from __future__ import annotations

import os

import pytest
import requests

from tests.support.expo import samples
from tests.support.prom_harness import documented_metrics, no_sources_config, start_exporter  # noqa: F401 - fixture

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="ProcessCollector reads /proc")


def test_the_daemon_serves_its_own_cpu_and_memory(start_exporter):  # noqa: F811 - the fixture
    exporter = start_exporter(no_sources_config())
    text = requests.get(f"{exporter.url}/metrics", timeout=5).text
    values = {name: value for (name, labels), value in samples(text).items() if not labels}
    assert values["process_cpu_seconds_total"] > 0  # starting Python and importing aiohttp costs CPU
    assert 10e6 < values["process_resident_memory_bytes"] < 2e9
    assert values["process_start_time_seconds"] > 1.7e9
    process = {name for name in values if name.startswith("process_")}
    assert process <= set(documented_metrics()), f"undocumented: {sorted(process - set(documented_metrics()))}"
    openmetrics = requests.get(
        f"{exporter.url}/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}, timeout=5
    ).text
    assert "\nprocess_cpu_seconds_total " in openmetrics and "\nprocess_resident_memory_bytes " in openmetrics
    assert openmetrics.endswith("# EOF\n")
