"""NVML calls, fields and time per GPU per sample of the GPU source at each series level (docs/benchmarks.md).

    python -m bench.nvml_calls [--samples 300] [--json FILE]

An 8-GPU H100 node on the fake NVML (18 NVLink links a GPU, GPM on). Each level's source is warmed up (open, first
GPM interval, field plan), then sampled ``--samples`` times, one simulated second apart. Calls are counted at the
module the source is given; fields are the IDs asked of ``nvmlDeviceGetFieldValues``; CPU is ``time.process_time``
of the samples, which on the fake is the source's Python plus the fake's (docs/benchmarks.md gives the real H200's
per-call times). ``scripts/gpu-truth.py`` (``make gpu-check``) measures the same on a real node's NVML with
``sample_cost``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Callable

from mfu_exporter.sim import nvml as fake
from mfu_exporter.sources.gpu import GpuSource

GPUS = 8
LEVELS = ("minimal", "standard", "full")


class CountingNvml:
    """The NVML module with each function's calls, wall time and (for field values) fields counted."""

    def __init__(self, nvml: Any):
        self._nvml = nvml
        self.calls: dict[str, int] = {}
        self.seconds: dict[str, float] = {}
        self.fields = 0

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._nvml, name)
        if not name.startswith("nvml") or not callable(value) or isinstance(value, type):
            return value

        def counted(*args: Any, **kwargs: Any) -> Any:
            if name == "nvmlDeviceGetFieldValues":
                self.fields += len(args[1])
            started = time.perf_counter()
            try:
                return value(*args, **kwargs)
            finally:
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - started
                self.calls[name] = self.calls.get(name, 0) + 1

        return counted

    def reset(self) -> None:
        self.calls.clear()
        self.seconds.clear()
        self.fields = 0


def sample_cost(
    nvml: Any,
    series: str,
    samples: int,
    monotonic: Callable[[], float] = time.monotonic,
    between: Callable[[], None] = lambda: None,
    warm_up: int = 3,
) -> dict:
    """The GPU source at ``series`` on ``nvml``, sampled ``warm_up`` times, then ``samples`` times measured, with
    ``between()`` after each (a pause on a real GPU: GPM needs 100 ms; the fake's clock moved). Per GPU and sample:
    NVML calls, fields, wall and CPU milliseconds of the whole sample, and each call's count and milliseconds."""
    counting = CountingNvml(nvml)
    source = GpuSource(counting, series=series, monotonic=monotonic)
    try:
        for _ in range(warm_up):
            source.sample()
            between()
        counting.reset()
        wall = cpu = 0.0
        gpus = 0
        for _ in range(samples):
            started, started_cpu = time.perf_counter(), time.process_time()
            snapshot = source.sample()
            wall += time.perf_counter() - started
            cpu += time.process_time() - started_cpu
            gpus = sum(1 for gpu in snapshot.readings.gpus.values() if gpu.up)
            between()
    finally:
        source.close()
    per = max(samples * gpus, 1)
    return {
        "series": series,
        "gpus": gpus,
        "calls_per_gpu_sample": round(sum(counting.calls.values()) / per, 2),
        "fields_per_gpu_sample": round(counting.fields / per, 1),
        "wall_ms_per_gpu_sample": round(wall / per * 1000, 4),
        "cpu_ms_per_gpu_sample": round(cpu / per * 1000, 4),
        "calls": {
            name: {
                "per_gpu_sample": round(count / per, 2),
                "ms_per_call": round(counting.seconds[name] / count * 1e3, 4),
            }
            for name, count in sorted(counting.calls.items())
        },
    }


def describe(result: dict) -> str:
    """One level's cost as a line: calls, fields, wall and CPU time per GPU and sample."""
    return (
        f"{result['series']:>8}: {result['calls_per_gpu_sample']:5.2f} NVML calls, "
        f"{result['fields_per_gpu_sample']:5.1f} fields, {result['wall_ms_per_gpu_sample']:.3f} ms wall, "
        f"{result['cpu_ms_per_gpu_sample']:.3f} ms CPU per GPU and sample"
    )


def measure(series: str, samples: int) -> dict:
    """``sample_cost`` on the fake node, its clock moved one second between samples."""
    nvml = fake.node(fake.h100, count=GPUS)
    now = [1000.0]

    def second() -> None:
        now[0] += 1.0
        nvml.advance(1.0)

    return sample_cost(nvml, series, samples, monotonic=lambda: now[0], between=second)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args(argv)
    results = [measure(series, args.samples) for series in LEVELS]
    for result in results:
        print(describe(result))
    for result in results:
        calls = result["calls"]
        print(f"{result['series']:>8}: " + ", ".join(f"{k} {v['per_gpu_sample']:g}" for k, v in calls.items()))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
