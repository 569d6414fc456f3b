"""The benchmarked exporter process: the real service and server (``mfu_exporter.web.app.serve``) on the full-node fixture.

    python -m bench.node --fixture DIR --web.listen-address 127.0.0.1:PORT

``DIR`` is a fixture tree written by ``bench.fixture.build_fabric`` (the driver keeps ticking it). Prints
``ready <url>`` once listening; SIGTERM stops it as it stops the exporter. With ``--hang-switch FILE`` the GPU
source's sample blocks while FILE exists (``bench.fixture.Hangable``).
"""

from __future__ import annotations

import argparse
import asyncio
import threading
from pathlib import Path

from bench import fixture
from bench.run import positive_seconds
from mfu_exporter.cli import setup_logging
from mfu_exporter.config import typed_config
from mfu_exporter.service import build_service
from mfu_exporter.web.app import serve


def advance_gpus(nvml, every: float, stop: threading.Event) -> None:
    """Energy and NVLink/PCIe byte counters move as on a busy GPU, once per GPU sample interval (``every``): a real
    GPU's counters move at no cost to the daemon, and a thread woken more often than the source reads them would
    add its wake-ups to the daemon's CPU."""
    while not stop.wait(every):
        nvml.advance(every)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fixture", required=True, type=Path, help="fixture root (sys/ and ethtool/ inside)")
    parser.add_argument("--web.listen-address", dest="listen_address", required=True, metavar="HOST:PORT")
    parser.add_argument(
        "--hang-switch", type=Path, metavar="FILE", help="the GPU source's sample blocks while FILE exists"
    )
    parser.add_argument(
        "--interval",
        type=positive_seconds,
        metavar="SECONDS",
        help="sampling interval of the gpu, rdma and ethtool sources (default 5 s)",
    )
    parser.add_argument(
        "--mfu-interval",
        type=positive_seconds,
        metavar="SECONDS",
        help="the job model's tick, mfu.interval (default 5 s)",
    )
    args = parser.parse_args()
    setup_logging("warning")
    nvml = fixture.build_gpus()
    config = fixture.node_config(args.listen_address, args.interval, args.mfu_interval)
    sources = fixture.node_sources(config, args.fixture, nvml)
    if args.hang_switch:
        sources = [fixture.Hangable(s, args.hang_switch) if s.name == "gpu" else s for s in sources]
    service = build_service(config, sources)
    stop = threading.Event()
    every = typed_config(config).sources.gpu.interval
    threading.Thread(target=advance_gpus, args=(nvml, every, stop), name="bench-gpus", daemon=True).start()
    asyncio.run(serve(service, on_started=lambda urls: print("ready", urls[0], flush=True)))
    stop.set()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
