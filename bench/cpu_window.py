"""The CPU window of ``make bench`` alone: the daemon's and node_exporter's CPU over the same seconds, repeated.

    python -m bench.cpu_window [--seconds 60] [--runs 3] [--interval SECONDS] [--profile DIR] [--parts FILE]

Starts ``bench.node`` and node_exporter on one fixture as ``bench.run`` does, warms up as it does (two reports per
job, a checkpoint event each, 20 scrapes per format), then runs ``--runs`` windows of ``--seconds`` each of what its
CPU window runs: the fabric moving, every job reporting and both scraped once a second (OpenMetrics + gzip). Prints
each window's CPU (% of a core, /proc user + system) of both and their ratio, the minimum and the load average; a
few minutes instead of ``make bench``'s fifteen, for measuring a change to the daemon's steady cost.
``--profile DIR`` records the daemon with py-spy (``--threads --idle`` off) over the windows into DIR; ``--parts
FILE`` runs ``bench.cpu_parts`` instead of ``bench.node`` and prints the CPU of the daemon's named parts over the
windows (kept in FILE as JSON): where its CPU went, measured in the daemon as it runs. ``--interval`` has the
GPU, RDMA and ethtool sources sample at that interval instead of their 5 s default (``bench.node --interval``).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from bench import cpu_parts, fixture, loadgen
from bench.run import (
    CLOCK_TICKS,
    Process,
    Reporters,
    all_sources_sampled,
    node_exporter_binary,
    positive_seconds,
    scratch,
    start_exporter,
    start_node_exporter,
    wait_until,
    warm_up,
)


def thread_cpu(pid: int) -> dict[int | str, float]:
    """CPU seconds (user + system) of each of the process's threads, by OS thread id; "system" the process's system
    time (all threads)."""
    seconds: dict[int | str, float] = {}
    with open(f"/proc/{pid}/stat") as handle:
        seconds["system"] = int(handle.read().rsplit(")", 1)[1].split()[12]) / CLOCK_TICKS
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        seconds[int(task)] = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    return seconds


def thread_names(pid: int) -> dict[int, str]:
    """OS thread id -> Python thread name, from ``py-spy dump`` (Python does not name its OS threads)."""
    spy = Path(sys.executable).parent / "py-spy"
    if not spy.exists():
        return {}
    dump = subprocess.run([str(spy), "dump", "--pid", str(pid), "--json"], capture_output=True, text=True)
    try:
        return {thread["os_thread_id"]: thread["thread_name"] for thread in json.loads(dump.stdout)}
    except (ValueError, KeyError, TypeError):
        return {}


def by_name(before: dict, after: dict, names: dict[int, str]) -> dict[str, float]:
    """CPU seconds between two ``thread_cpu`` readings, by thread name (the executor's threads together)."""
    spent: collections.Counter = collections.Counter()
    for tid, seconds in after.items():
        name = "(of which system time)" if tid == "system" else names.get(tid, f"unnamed {tid}")
        if name.startswith("asyncio_"):
            name = "executor (asyncio_*)"
        spent[name] += seconds - before.get(tid, 0.0)
    return dict(spent)


async def window(
    seconds: int, exporter: Process, node_exporter: Process, fabric, reporters: Reporters, names: dict[int, str]
) -> dict:
    scrape = {p: loadgen.Connection(p.address) for p in (exporter, node_exporter)}
    requests = {p: loadgen.get_request(p.address, "/metrics", loadgen.SCRAPE_MODES["openmetrics_gzip"]) for p in scrape}
    post = loadgen.Connection(exporter.address)
    load = os.getloadavg()[0]
    started = time.monotonic()
    cpu_at_start = {p: p.cpu_seconds() for p in scrape}
    threads_at_start = thread_cpu(exporter.pid)
    try:
        for second in range(1, seconds + 1):
            fabric.tick(1.0)
            await reporters.report_jobs(post)
            for process, connection in scrape.items():
                await connection.timed(requests[process])
            await asyncio.sleep(max(started + second - time.monotonic(), 0.0))
    finally:
        for connection in (*scrape.values(), post):
            await connection.close()
    elapsed = time.monotonic() - started
    ours = (exporter.cpu_seconds() - cpu_at_start[exporter]) / elapsed * 100
    theirs = (node_exporter.cpu_seconds() - cpu_at_start[node_exporter]) / elapsed * 100
    threads = {
        name: spent / elapsed * 100
        for name, spent in by_name(threads_at_start, thread_cpu(exporter.pid), names).items()
    }
    return {
        "daemon": ours,
        "node_exporter": theirs,
        "load_start": load,
        "load_end": os.getloadavg()[0],
        "threads": threads,
    }


async def main_async(args: argparse.Namespace) -> int:
    profiler = None
    with scratch("mfu-cpu-window-") as (root, processes):
        fabric = fixture.build_fabric(root)
        exporter = start_exporter(
            root, args.exporter, extra=[] if args.interval is None else ["--interval", f"{args.interval:g}"]
        )
        processes.append(exporter)
        node_exporter = start_node_exporter(node_exporter_binary(), root)
        processes.append(node_exporter)
        await wait_until(exporter, "/api/v1/status", all_sources_sampled)
        await wait_until(node_exporter, "/metrics", lambda response: response.status == 200)
        reporters = Reporters(exporter.address)
        await warm_up(exporter, reporters)
        names = thread_names(exporter.pid)
        if args.profile:
            args.profile.mkdir(parents=True, exist_ok=True)
            duration = args.seconds * args.runs
            profiler = subprocess.Popen(
                [
                    str(Path(sys.executable).parent / "py-spy"),
                    "record",
                    "--pid",
                    str(exporter.pid),
                    "--rate",
                    "500",
                    "--threads",
                    "--gil",
                    "--format",
                    "raw",
                    "--duration",
                    str(duration),
                    "--output",
                    str(args.profile / "daemon.txt"),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            await asyncio.sleep(1.0)
        results = []
        if args.mark_start:
            exporter.popen.send_signal(signal.SIGUSR1)
        for run in range(args.runs):
            result = await window(args.seconds, exporter, node_exporter, fabric, reporters, names)
            results.append(result)
            print(
                f"run {run + 1}: daemon {result['daemon']:.2f} %, node_exporter {result['node_exporter']:.2f} %, "
                f"ratio {result['daemon'] / result['node_exporter']:.2f} "
                f"(load {result['load_start']:.2f} -> {result['load_end']:.2f})",
                flush=True,
            )
            threads = sorted(result["threads"].items(), key=lambda item: -item[1])
            print("  by thread: " + ", ".join(f"{name} {percent:.2f}" for name, percent in threads if percent > 0))
        best = min(r["daemon"] for r in results)
        print(
            f"minimum daemon {best:.2f} %; median ratio "
            f"{sorted(r['daemon'] / r['node_exporter'] for r in results)[len(results) // 2]:.2f}"
        )
        if profiler is not None:
            profiler.wait()
        return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--exporter",
        nargs="+",
        default=["-m", "bench.node"],
        help="the daemon's command after the interpreter (a profiling wrapper of bench.node)",
    )
    parser.add_argument(
        "--mark-start", action="store_true", help="send the daemon SIGUSR1 as the first window starts (a wrapper's cue)"
    )
    parser.add_argument(
        "--interval",
        type=positive_seconds,
        metavar="SECONDS",
        help="sampling interval of the gpu, rdma and ethtool sources (default 5 s)",
    )
    parser.add_argument("--profile", type=Path, help="record the daemon with py-spy into this folder")
    parser.add_argument("--parts", type=Path, help="time the daemon's named parts (bench.cpu_parts) into this file")
    args = parser.parse_args()
    if args.parts:
        args.exporter = ["-m", "bench.cpu_parts", "--parts-out", str(args.parts)]
        args.mark_start = True
    code = asyncio.run(main_async(args))
    if args.parts:
        print(cpu_parts.table(str(args.parts)))
    return code


if __name__ == "__main__":
    raise SystemExit(main())
