"""The daemon's CPU driven one way at a time, and the floor a bare aiohttp server sets for the same requests.

    python -m bench.cpu_modes [--seconds 30]

Starts ``bench.node`` on the fixture as ``bench.cpu_window`` does (warmed up the same way), then runs a window of
``--seconds`` in each mode, the fabric moving throughout: ``sampling`` (no scrape, no report: the sources and the
1 s tick alone), ``scrape`` (one OpenMetrics + gzip scrape a second), ``report`` (every job reporting once a
second), ``both`` (what ``bench.cpu_window`` runs). Then the same requests, both kinds, to a bare aiohttp server
that answers a scrape with fixed bytes of the daemon's body size and a report with a small JSON: what HTTP alone
costs in this process model. Prints the CPU (% of a core, /proc user + system) of each.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from bench import fixture, loadgen
from bench.run import Process, Reporters, all_sources_sampled, free_port, scratch, start_exporter, wait_until, warm_up

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


async def window(process: Process, seconds: int, mode: str, fabric, reporters: Reporters) -> float:
    """The process's CPU (% of a core) over ``seconds`` driven in ``mode``."""
    connection = loadgen.Connection(process.address)
    scrape = loadgen.get_request(process.address, "/metrics", loadgen.SCRAPE_MODES["openmetrics_gzip"])
    cpu, started = process.cpu_seconds(), time.monotonic()
    try:
        for second in range(1, seconds + 1):
            fabric.tick(1.0)
            if mode in ("report", "both"):
                await reporters.report_jobs(connection)
            if mode in ("scrape", "both"):
                await connection.timed(scrape)
            await asyncio.sleep(max(started + second - time.monotonic(), 0.0))
    finally:
        await connection.close()
    return (process.cpu_seconds() - cpu) / (time.monotonic() - started) * 100


async def main_async(seconds: int) -> int:
    with scratch("mfu-cpu-modes-") as (root, processes):
        fabric = fixture.build_fabric(root)
        daemon = start_exporter(root)
        processes.append(daemon)
        await wait_until(daemon, "/api/v1/status", all_sources_sampled)
        reporters = Reporters(daemon.address)
        await warm_up(daemon, reporters)
        probe = loadgen.Connection(daemon.address)
        body = await probe.exchange(
            loadgen.get_request(daemon.address, "/metrics", loadgen.SCRAPE_MODES["openmetrics_gzip"])
        )
        await probe.close()
        for mode in MODES:
            print(f"daemon, {mode:8s} {await window(daemon, seconds, mode, fabric, reporters):5.2f} %", flush=True)
        daemon.stop()
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
    return asyncio.run(main_async(parser.parse_args().seconds))


if __name__ == "__main__":
    raise SystemExit(main())
