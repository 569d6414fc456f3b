"""The daemon's CPU driven one way at a time, and the floor a bare aiohttp server sets for the same requests.

    python -m bench.cpu_modes [--seconds 30] [--interval SECONDS] [--scrape-every SECONDS]
                              [--modes sampling,scrape,report,both] [--no-bare]

Starts ``bench.node`` on the fixture as ``bench.cpu_window`` does (warmed up the same way), then runs a window of
``--seconds`` in each mode, the fabric moving throughout: ``sampling`` (no scrape, no report: the sources and the
1 s tick alone), ``scrape`` (one OpenMetrics + gzip scrape a second), ``report`` (every job reporting once a
second), ``both`` (what ``bench.cpu_window`` runs). Then the same requests, both kinds, to a bare aiohttp server
that answers a scrape with fixed bytes of the daemon's body size and a report with a small JSON: what HTTP alone
costs in this process model. Prints the CPU (% of a core, /proc user + system) of each. ``--interval`` samples the
GPU, RDMA and ethtool sources at that interval instead of their 5 s default (the 1 s tick stays): what a node pays
for a cause's onset within a second (``--interval 1``). ``--scrape-every 15`` scrapes as a Prometheus does by default.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from bench import fixture, loadgen
from bench.run import (
    Process,
    Reporters,
    all_sources_sampled,
    free_port,
    positive_seconds,
    scratch,
    start_exporter,
    wait_until,
    warm_up,
)

MODES = ("sampling", "scrape", "report", "both")

BARE_SERVER = """
import json, os, sys
from aiohttp import web
BODY = os.urandom(int(sys.argv[2]))
async def metrics(request):
    return web.Response(body=BODY, headers={"Content-Type": "application/openmetrics-text; version=1.0.0",
                                            "Content-Encoding": "gzip"})
async def progress(request):
    body = json.loads(await request.read())
    return web.json_response({"accepted": True, "job": body["job"]})
async def status(request):
    return web.json_response({"sources": []})
app = web.Application()
app.router.add_get("/metrics", metrics)
app.router.add_post("/api/v1/progress", progress)
app.router.add_get("/api/v1/status", status)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
"""


async def window(
    process: Process, seconds: int, mode: str, fabric, reporters: Reporters, scrape_every: int = 1
) -> float:
    """The process's CPU (% of a core) over ``seconds`` driven in ``mode``, scraped once every ``scrape_every``
    seconds in the modes that scrape."""
    connection = loadgen.Connection(process.address)
    scrape = loadgen.get_request(process.address, "/metrics", loadgen.SCRAPE_MODES["openmetrics_gzip"])
    cpu, started = process.cpu_seconds(), time.monotonic()
    try:
        for second in range(1, seconds + 1):
            fabric.tick(1.0)
            if mode in ("report", "both"):
                await reporters.report_jobs(connection)
            if mode in ("scrape", "both") and second % scrape_every == 0:
                await connection.timed(scrape)
            await asyncio.sleep(max(started + second - time.monotonic(), 0.0))
    finally:
        await connection.close()
    return (process.cpu_seconds() - cpu) / (time.monotonic() - started) * 100


async def main_async(
    seconds: int, interval: float | None, modes: list[str], bare_server: bool, scrape_every: int
) -> int:
    with scratch("mfu-cpu-modes-") as (root, processes):
        fabric = fixture.build_fabric(root)
        daemon = start_exporter(root, extra=[] if interval is None else ["--interval", f"{interval:g}"])
        processes.append(daemon)
        await wait_until(daemon, "/api/v1/status", all_sources_sampled)
        reporters = Reporters(daemon.address)
        await warm_up(daemon, reporters)
        probe = loadgen.Connection(daemon.address)
        body = await probe.exchange(
            loadgen.get_request(daemon.address, "/metrics", loadgen.SCRAPE_MODES["openmetrics_gzip"])
        )
        await probe.close()
        for mode in modes:
            cpu = await window(daemon, seconds, mode, fabric, reporters, scrape_every)
            print(f"daemon, {mode:8s} {cpu:5.2f} %", flush=True)
        daemon.stop()
        if not bare_server:
            return 0
        address = f"127.0.0.1:{free_port()}"
        script = root / "bare_server.py"
        script.write_text(BARE_SERVER)
        argv = [sys.executable, str(script), address.rsplit(":", 1)[1], str(len(body.body))]
        bare = Process("bare aiohttp", argv, address, root / "bare.log")
        processes.append(bare)
        await wait_until(bare, "/api/v1/status", lambda response: response.status == 200)
        bare_reporters = Reporters(bare.address)
        warm = loadgen.Connection(bare.address)
        for _ in range(20):  # warmed up as the daemon was
            await bare_reporters.report_jobs(warm)
        await warm.close()
        print(f"bare aiohttp, both {await window(bare, seconds, 'both', fabric, bare_reporters):5.2f} %", flush=True)
        return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=30)
    parser.add_argument(
        "--interval",
        type=positive_seconds,
        metavar="SECONDS",
        help="sampling interval of the gpu, rdma and ethtool sources (default 5 s)",
    )
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument(
        "--scrape-every",
        type=int,
        default=1,
        metavar="SECONDS",
        help="scrape once every this many seconds (a Prometheus: 15)",
    )
    parser.add_argument("--no-bare", action="store_true", help="skip the bare aiohttp server")
    args = parser.parse_args()
    modes = [mode for mode in args.modes.split(",") if mode]
    unknown = sorted(set(modes) - set(MODES))
    if unknown or not modes:
        parser.error(
            f"--modes: {', '.join(unknown) or 'none given'}; expected a comma-separated list of {', '.join(MODES)}"
        )
    if args.scrape_every < 1:
        parser.error(f"--scrape-every: {args.scrape_every}; expected a whole number of seconds, 1 or more")
    return asyncio.run(main_async(args.seconds, args.interval, modes, not args.no_bare, args.scrape_every))


if __name__ == "__main__":
    raise SystemExit(main())
