"""Parse cost of the logs source: CPU seconds to follow and parse 10,000 log lines, i.e. the share of one core a
log written at 10,000 lines/s costs (target: under 5 %).

The lines are written to a real file first, then read the way the source reads them: ``Follower.poll`` (reads,
splits, decodes) into ``LogsSource``'s own per-batch path (transport, format detection, parser, derivation, the job
model), timed with ``time.process_time``. Mixes:

- ``noise``: a torchtitan rank-0 log as CRI lines, 1 % of them coloured step lines, the rest NCCL INFO and warnings
  (what a busy training log is made of);
- ``progress``: every line a Megatron iteration line (the worst case: each one parsed and fed to the job model;
  no framework prints progress that fast, so its figure reads as the cost per progress line, not against the target);
- ``unrecognised``: lines of no known format (auto detection tries every anchor on each).

It also reads the real pasted logs of tests/fixtures/logs/real/pastes.txt in auto mode and prints the share of
their progress lines read right and the false progress from their other lines (target >= 95 %, none).

Usage: ``python -m bench.logs [--lines 100000] [--json FILE]``; exit 1 when the noise or unrecognised mix misses.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from mfu_exporter.config import typed_config, validate
from mfu_exporter.model.feed import apply_feed
from mfu_exporter.model.jobs import JobTracker
from mfu_exporter.model.readings import GpuInfo
from mfu_exporter.sources.base import ModelReads
from mfu_exporter.sources.logs import LogsSource
from tests.unit.logs import framework_lines as fl
from tests.unit.logs import real_pastes

TARGET_CORE_PERCENT = 5.0
T0 = 1_787_300_000.0


def noise_lines(count: int) -> list[str]:
    lines = []
    for i in range(count):
        at = T0 + i * 1e-4
        if i % 100 == 0:
            text = "[rank0]:" + fl.titan_logger(
                at, fl.titan_step(i // 100 + 1, 2.4, 0.33, 61.2, 77.3, 6875, 358.12, 36.21)
            )
        elif i % 7 == 0:
            text = (
                f"[rank0]:/usr/lib/python3/site-packages/torch/utils/checkpoint.py:{i % 900}: UserWarning: "
                "None of the inputs have requires_grad=True"
            )
        else:
            peer = (i + 1) % 8
            text = (
                f"[rank0]:node-{i % 4}:{1000 + i % 8}:{2000 + i % 64} [{i % 8}] NCCL INFO Channel {i % 32:02d}/0 : "
                f"{i % 8}[{i % 8}] -> {peer}[{peer}] via P2P/IPC"
            )
        lines.append(fl.cri(at, text))
    return lines


def progress_lines(count: int) -> list[str]:
    return [
        fl.megatron_iteration(T0 + i, i + 1, 10**7, (i + 1) * 512, 1.0, 412.3, 1e-4, 512, 2.3) for i in range(count)
    ]


def unrecognised_lines(count: int) -> list[str]:
    return [
        f"2026-12-03 12:00:{i % 60:02d} worker {i % 16}: processed batch {i} in 0.{i % 997:03d}s" for i in range(count)
    ]


def measure(lines: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as root:
        path = Path(root) / "train.log"
        path.write_text("".join(line + "\n" for line in lines))
        files = [{"path": str(path), "job": "llm"}]
        config = validate(
            {"sources": {"logs": {"files": files}}, "jobs": {"llm": {"params": 7e9, "world_size": 16, "seq_len": 4096}}}
        )
        inventory = [GpuInfo(i, f"GPU-{i}", "NVIDIA H100 80GB HBM3") for i in range(8)]
        jobs = JobTracker(configured=config["jobs"], gpu_inventory=lambda: inventory, clock=lambda: T0 + len(lines))
        source = LogsSource(typed_config(config).sources.logs, config["jobs"], use_inotify=False)
        source.bind(ModelReads(gpu_count=jobs.gpu_count, job_names=jobs.names))
        source._wanted = source._expand()  # what sample() does, without starting the follower's thread
        source.follower.read_budget = 1 << 40
        source.follower.head_bytes = source.follower.tail_bytes = 1 << 40  # the whole file, as a live log
        source.follower.patterns = [str(path)]
        source.max_feed = len(lines)  # every line's item kept: the file is read in one pass
        started = time.process_time()
        source.follower.poll()
        apply_feed(source.take_feed(), jobs, None)  # the lines' feed, as the service's tick applies them
        cpu = time.process_time() - started
        source.follower.stop()
        followed = source._followed[str(path)]
        assert followed.lines == len(lines), (followed.lines, len(lines))
    per_10k = cpu * 10_000 / len(lines)
    return {
        "lines": len(lines),
        "cpu_seconds": round(cpu, 4),
        "format": followed.stream.format,
        "core_percent_at_10k_lines_per_second": round(100 * per_10k, 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=100_000)
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args(argv)
    results = {
        "noise": measure(noise_lines(args.lines)),
        "progress": measure(progress_lines(args.lines)),
        "unrecognised": measure(unrecognised_lines(args.lines)),
    }
    for name, figures in results.items():
        print(
            f"{name:13s} {figures['core_percent_at_10k_lines_per_second']:6.2f} % of one core at 10,000 lines/s "
            f"({figures['lines']} lines in {figures['cpu_seconds']} CPU s; format {figures['format']})"
        )
    pastes = real_pastes.share()
    print(real_pastes.summary_line(pastes))
    results["real_pastes"] = {k: v for k, v in pastes.items() if k != "wrong"}
    if args.json:
        Path(args.json).write_text(json.dumps({"target_core_percent": TARGET_CORE_PERCENT, **results}, indent=2))
    # The target is for a log's lines as they come (mostly noise); a log of nothing but progress lines at 10,000/s
    # is no framework's (they print a few a second at most): its figure is the cost per progress line.
    missed = [
        n
        for n in ("noise", "unrecognised")
        if results[n]["core_percent_at_10k_lines_per_second"] >= TARGET_CORE_PERCENT
    ]
    micro = results["progress"]["cpu_seconds"] * 1e6 / results["progress"]["lines"]
    print(
        f"progress lines cost {micro:.0f} µs each; target (< {TARGET_CORE_PERCENT:g} % at 10,000 lines/s) "
        f"{'missed by ' + ', '.join(missed) if missed else 'met by noise and unrecognised'}"
    )
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
