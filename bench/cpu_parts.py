"""``bench.node`` with the CPU of its named parts added up: where the running daemon's CPU goes, cold, as it runs.

    python -m bench.cpu_window --parts FILE     (starts this in place of bench.node and prints FILE's table)

A profiler's figures of a process that wakes a few times a second mislead: cProfile's per-call cost inflates small
functions, and a part measured in a loop runs with warm caches, two to three times cheaper than once a second in
the daemon. Here each part is timed with ``time.thread_time`` around its call in the benchmarked daemon itself, from
SIGUSR1 (``bench.cpu_window`` sends it as its first window starts) to exit, when the parts' CPU per second of wall
time and calls per second go to ``--parts-out`` as JSON. What no part holds (aiohttp, the event loop, the worker
threads' hand-offs) is the daemon's CPU minus their sum. Parts nest: a fragment's families and deflate segment are
inside ``render`` or ``encode_ahead`` (a snapshot encoded ahead), and the tick's publication inside the tick.
"""

from __future__ import annotations

import argparse
import atexit
import collections
import functools
import json
import signal
import sys
import time
from typing import Any, Callable

from bench import fixture, node
from mfu_exporter.render import collector, exposition, fragment
from mfu_exporter.service import Service

cost: collections.Counter = collections.Counter()
calls: collections.Counter = collections.Counter()
started: list[float] = []  # when SIGUSR1 came: parts are counted from then on


def timed(label: Callable[..., str] | str, call: Callable) -> Callable:
    """``call`` with its thread CPU added to ``label`` (or to ``label(*args)``) once counting has started."""

    @functools.wraps(call)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not started:
            return call(*args, **kwargs)
        before = time.thread_time()
        try:
            return call(*args, **kwargs)
        finally:
            name = label if isinstance(label, str) else label(*args)
            cost[name] += time.thread_time() - before
            calls[name] += 1

    return wrapper


def install() -> None:
    fragment.Page._make = timed("render", fragment.Page._make)  # type: ignore[method-assign]
    fragment.Fragment._built = timed(  # type: ignore[method-assign]
        lambda part: "render part: families built (a snapshot's)" if part.ahead else "render part: families built",
        fragment.Fragment._built,
    )
    fragment.deflate_segment = timed("render part: gzip (a fragment's deflate segment)", fragment.deflate_segment)
    fragment.gzip_member = timed("render part: gzip (the member joined)", fragment.gzip_member)
    exposition.Exposition._encode_fragments = timed(  # type: ignore[method-assign]
        "encode_ahead", exposition.Exposition._encode_fragments
    )
    exposition.Exposition.sampled = timed(  # type: ignore[method-assign]
        "encode_ahead: scheduling", exposition.Exposition.sampled
    )
    collector.ExporterCollector.sampled = timed(  # type: ignore[method-assign]
        "publish: a sample's fragments", collector.ExporterCollector.sampled
    )
    Service.ingest_progress = timed("ingest_progress", Service.ingest_progress)  # type: ignore[method-assign]
    Service.evaluate_once = timed("evaluate_once (the tick)", Service.evaluate_once)  # type: ignore[method-assign]
    sources = fixture.node_sources

    def timed_sources(*args: Any, **kwargs: Any) -> list:
        built = sources(*args, **kwargs)
        for source in built:
            source.sample = timed(f"sample: {source.name}", source.sample)
        return built

    node.fixture.node_sources = timed_sources  # type: ignore[attr-defined]


def write(path: str) -> None:
    elapsed = time.monotonic() - started[0] if started else 0.0
    parts = {
        name: {"ms_per_second": spent / elapsed * 1e3, "calls_per_second": calls[name] / elapsed}
        for name, spent in cost.most_common()
    }
    with open(path, "w") as handle:
        json.dump({"seconds": elapsed, "parts": parts}, handle, indent=1)


def table(path: str) -> str:
    """The parts of a ``--parts-out`` file as lines, most CPU first."""
    with open(path) as handle:
        figures = json.load(handle)
    lines = [f"parts over {figures['seconds']:.0f} s (ms of CPU a second, calls a second; parts nest):"]
    for name, part in figures["parts"].items():
        lines.append(f"  {part['ms_per_second']:7.3f} ms/s {part['calls_per_second']:6.2f}/s  {name}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--parts-out", required=True)
    args, rest = parser.parse_known_args()
    sys.argv = [sys.argv[0], *rest]
    signal.signal(signal.SIGUSR1, lambda *_: started.append(time.monotonic()) if not started else None)
    atexit.register(write, args.parts_out)
    install()
    return node.main()


if __name__ == "__main__":
    raise SystemExit(main())
