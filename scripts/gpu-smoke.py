#!/usr/bin/env python3
"""One-off check of the GPU source against the real NVIDIA driver, for a machine with GPUs.

    python scripts/gpu-smoke.py [--pause SECONDS]

Samples every GPU twice through pynvml, 1 s apart (GPM activity is measured between two samples), and prints the
second sample's series as /metrics serves them (Prometheus text format), then the source's status notes and the
errors it counted as comments. Exits 1 when NVML does not start or a GPU lacks a core series: ``mfu_gpu_up`` = 1,
utilization (except in MIG mode, where NVML has none), memory used and total, power. tests/test_gpu_source.py runs
``main`` against the fake NVML, so the script keeps working without a GPU to try it on.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # runs from a checkout without installing it

import pynvml
from prometheus_client.exposition import choose_encoder
from prometheus_client.parser import text_string_to_metric_families

from exporter.render.encode import encode_families
from exporter.sources.base import SourceUnavailable
from exporter.sources.gpu import GpuSource

CORE_SERIES = ("mfu_gpu_memory_used_bytes", "mfu_gpu_memory_total_bytes", "mfu_gpu_power_watts")


def missing_core_series(text: str, gpus: list[dict[str, Any]]) -> list[str]:
    """What each GPU of the status lacks among the core series in the rendered ``text``."""
    values = {
        (sample.name, sample.labels.get("gpu")): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    problems = []
    for gpu in gpus:
        label = str(gpu["index"])
        if values.get(("mfu_gpu_up", label)) != 1:
            problems.append(f"GPU {label} is not up: {gpu['lost_reason']}")
            continue
        wanted = CORE_SERIES if gpu["mig"] else ("mfu_gpu_utilization_ratio", *CORE_SERIES)
        problems += [f"GPU {label} lacks {name}" for name in wanted if (name, label) not in values]
    return problems


def main(argv: list[str] | None = None, nvml: Any = pynvml) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pause", type=float, default=1.0, help="seconds between the two samples (GPM needs over 0.1)")
    args = parser.parse_args(argv)
    source = GpuSource(nvml)
    try:
        first = source.sample()
        time.sleep(args.pause)
        snapshot = source.sample()
    except SourceUnavailable as exc:
        print(f"gpu-smoke: NVML did not start: {exc}", file=sys.stderr)
        return 1
    finally:
        source.close()
    encoder, _ = choose_encoder("")  # the text format, as /metrics answers a plain scrape
    text = encode_families(snapshot.render(), encoder, openmetrics=False)
    print(text, end="")
    print("# status notes:")
    for note in snapshot.status["notes"] or ["none"]:
        print(f"#   {note}")
    errors = first.errors + snapshot.errors
    print(
        '# errors counted (reasons of mfu_exporter_source_errors_total{source="gpu"}): '
        + (", ".join(f"{reason}={count}" for reason, count in sorted(errors.items())) or "none")
    )
    problems = missing_core_series(text, snapshot.status["gpus"])
    for problem in problems:
        print(f"gpu-smoke: FAIL: {problem}", file=sys.stderr)
    if not problems:
        print(f"gpu-smoke: OK: {len(snapshot.status['gpus'])} GPU(s) up with every core series", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
