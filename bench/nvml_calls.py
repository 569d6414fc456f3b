"""NVML calls, fields and time per GPU per sample of the GPU source at each series level (docs/benchmarks.md).

    python -m bench.nvml_calls [--samples 300] [--json FILE]

An 8-GPU H100 node on the fake NVML (18 NVLink links a GPU, GPM on). Each level's source is warmed up (open, first
GPM interval, field plan), then sampled ``--samples`` times, one simulated second apart. Calls are the fake's own
counts; fields are the IDs asked of ``nvmlDeviceGetFieldValues``; CPU is ``time.process_time`` of the samples, which
on the fake is the source's Python plus the fake's (docs/benchmarks.md gives the real H200's per-call times).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from mfu_exporter.sim import nvml as fake
from mfu_exporter.sources.gpu import GpuSource

GPUS = 8


def measure(series: str, samples: int) -> dict:
    nvml = fake.node(fake.h100, count=GPUS)
    fields = [0]
    get_fields = nvml.nvmlDeviceGetFieldValues

    def counting(handle, field_ids):
        fields[0] += len(field_ids)
        return get_fields(handle, field_ids)

    nvml.nvmlDeviceGetFieldValues = counting
    now = [1000.0]
    source = GpuSource(nvml, series=series, monotonic=lambda: now[0])
    for _ in range(3):
        source.sample()
        now[0] += 1.0
        nvml.advance(1.0)
    nvml.calls.clear()
    fields[0] = 0
    cpu = 0.0
    for _ in range(samples):
        started = time.process_time()
        source.sample()
        cpu += time.process_time() - started
        now[0] += 1.0
        nvml.advance(1.0)
    source.close()
    per = samples * GPUS
    calls = {name: count / per for name, count in sorted(nvml.calls.items())}
    return {
        "series": series,
        "calls_per_gpu_sample": round(sum(calls.values()), 2),
        "fields_per_gpu_sample": round(fields[0] / per, 1),
        "cpu_ms_per_gpu_sample": round(cpu / per * 1000, 4),
        "calls": {name: round(value, 2) for name, value in calls.items()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args(argv)
    results = [measure(series, args.samples) for series in ("minimal", "standard", "full")]
    for result in results:
        print(
            f"{result['series']:>8}: {result['calls_per_gpu_sample']:5.2f} NVML calls, "
            f"{result['fields_per_gpu_sample']:5.1f} fields, {result['cpu_ms_per_gpu_sample']:.3f} ms CPU per GPU and sample"
        )
    for result in results:
        print(f"{result['series']:>8}: " + ", ".join(f"{k} {v:g}" for k, v in result["calls"].items()))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
