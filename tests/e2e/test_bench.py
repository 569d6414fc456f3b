"""The benchmark runs end to end (``python -m bench.run --quick``) and emits every figure docs/benchmarks.md reports.

Only that it works: the quick mode's counts are too small for its numbers to mean anything, and timings belong to
``make bench``, never to a test.
"""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.tools import require_tool

REPOSITORY = Path(__file__).resolve().parents[2]
SOURCES = ("gpu", "rdma", "ethtool", "checkpoint", "preflight", "storage")
MODES = ("openmetrics_gzip", "openmetrics", "text_gzip", "text")  # every format, with gzip and without
SCRAPES = [f"{mode}.{kind}" for mode in MODES for kind in ("single", "concurrent", "fresh_single", "fresh_concurrent")]
FIGURES = [
    "fixture.gpus",
    "fixture.rdma_ports",
    "fixture.ethtool_interfaces",
    "fixture.ethtool_stats_per_interface",
    "fixture.jobs",
    *(f"sample.{source}.{cpu}" for source in SOURCES for cpu in ("cpu_ms", "process_cpu_ms")),
    "sample.fabric.cpu_ms",
    "sample.ethtool.fixture_reader_cpu_ms",
    *(
        f"render.{fmt}.{figure}"
        for fmt in ("text", "openmetrics")
        for figure in ("cpu_ms", "library_cpu_ms", "gzip_cpu_ms")
    ),
    *(
        f"series.{group}"
        for group in (
            *SOURCES,
            "jobs",
            "exporter",
            "total",
            "per_1000_nodes",
            "per_10000_nodes",
            "remote_write",
            "remote_write_per_10000_nodes",
        )
    ),
    *(f"{who}.{mode}_bytes" for who in ("body", "node_exporter.body") for mode in MODES),
    "node_exporter.series",
    *(
        f"{who}.{scrape}.{quantile}_ms"
        for who in ("scrape", "node_exporter.scrape")
        for scrape in SCRAPES
        for quantile in ("p50", "p99", "max")
    ),
    *(f"ratio.{scrape}.{quantile}" for scrape in SCRAPES for quantile in ("p50", "p99")),
    "cpu.daemon_percent",
    "cpu.daemon_window_percent",
    "node_exporter.cpu_percent",
    "node_exporter.cpu_window_percent",
    "hung.scrape.p50_ms",
    "hung.scrape.p99_ms",
    "hung.scrape.max_ms",
    "hung.scrapes",
    "hung.timed_out_repetitions",
    "rss.warm_mb",
    "rss.steady_mb",
    "rss.final_mb",
    "rss.growth_percent",
    "rss.growth_from_warm_percent",
    "rss.scrapes",
    "rss.reports",
    "node_exporter.rss_mb",
    "ingest.reports_per_second",
    "ingest.p50_ms",
    "ingest.p99_ms",
    "ingest.refused_percent",
    "demo.cpu_percent",
    "demo.rss_mb",
]


def number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@pytest.mark.slow
def test_quick_bench_emits_every_figure(tmp_path):
    require_tool("prometheus-node-exporter", "prometheus-node-exporter")
    output = tmp_path / "bench.json"
    run = subprocess.run(
        [sys.executable, "-m", "bench.run", "--quick", "--json", str(output)],
        cwd=REPOSITORY,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(output.read_text())
    figures = result["figures"]
    missing = [name for name in FIGURES if name not in figures]
    assert missing == []
    for name in FIGURES:
        value = figures[name]
        if isinstance(value, dict):  # a repeated figure: median, min and max over the repetitions
            assert all(number(value[key]) for key in ("median", "min", "max")), (name, value)
            assert value["min"] <= value["median"] <= value["max"], (name, value)
        else:
            assert number(value), (name, value)
    assert (figures["fixture.gpus"], figures["fixture.rdma_ports"], figures["fixture.jobs"]) == (8, 8, 4)
    assert figures["fixture.ethtool_stats_per_interface"] >= 300
    assert figures["series.total"] == sum(figures[f"series.{group}"] for group in (*SOURCES, "jobs", "exporter"))
    assert all(figures[f"series.{source}"] > 0 for source in SOURCES)
    assert figures["body.openmetrics_gzip_bytes"] < figures["body.openmetrics_bytes"]  # gzip was asked for and given
    assert figures["body.text_gzip_bytes"] < figures["body.text_bytes"]
    assert figures["body.openmetrics_content_type"].startswith("application/openmetrics-text")
    assert figures["body.text_gzip_content_type"].startswith("text/plain")
    assert figures["hung.scrapes"]["min"] > 0  # scraped while the source's sample was blocked
    assert {verdict["figure"] for verdict in result["targets"]} <= set(figures)
    assert result["machine"]["cpus"] >= 1 and result["machine"]["python"] == ".".join(map(str, sys.version_info[:3]))
    for name in FIGURES:
        assert name in run.stdout  # the printed table has them too


def test_the_scaling_guide_ships_what_the_bench_counts():
    from bench.run import REMOTE_WRITE_KEEP

    assert f'regex: "{REMOTE_WRITE_KEEP}"' in (REPOSITORY / "docs" / "scaling.md").read_text()


def test_discovery_bench_runs_and_emits_its_figures(tmp_path):
    # Only that it works (three samples); the figure in docs/benchmarks.md comes from a longer run.
    out = tmp_path / "discovery.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.discovery", "--samples", "3", "--json", str(out)],
        cwd=REPOSITORY,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode in (0, 1), done.stderr
    figures = json.loads(out.read_text())
    assert (figures["gpus"], figures["pods"]) == (8, 16)
    assert figures["jobs_found"] == 12  # 4 Kubernetes jobs of 2 pods, 8 Slurm jobs of 2 processes
    assert math.isfinite(figures["cpu_ms_per_second"]) and figures["cpu_ms_per_second"] > 0
