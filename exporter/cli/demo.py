"""``mfu-exporter demo``: a simulated 8-GPU training node through the real exporter (``exporter.sim.node``)."""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
from pathlib import Path

from exporter.cli.flags import add_daemon_flags
from exporter.client import ProgressReporter
from exporter.sim.fleet import FLEET_INCIDENTS, build_fleet, serve_fleet
from exporter.sim.node import (
    DISCOVERED_GPUS,
    DISCOVERED_JOB,
    GPU_NAME,
    INCIDENTS,
    JOB,
    JOB_GPUS,
    MODEL,
    NODE_TARGET_TOKENS,
    build_demo,
)
from exporter.web.app import serve

DEMO_HELP = "Run a simulated 8-GPU training node through the real exporter, with live MFU and incidents."


def add_demo_flags(parser: argparse.ArgumentParser) -> None:
    add_daemon_flags(parser)
    parser.add_argument("--speed", type=float, default=1.0, help="simulated seconds per wall-clock second (default 1)")
    parser.add_argument("--incident", choices=INCIDENTS, help="force one incident after a short healthy warm-up")
    parser.add_argument(
        "--mfu.window", dest="mfu_window", default="15s", help="MFU window (default 15s, so changes show fast)"
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed of the simulation's noise")
    parser.add_argument(
        "--progress",
        choices=("api", "logs"),
        default="api",
        help="how the job's progress reaches the exporter: api (its ProgressReporter) or logs (it prints "
        "torchtitan's log lines to a file the logs source follows; no reporting at all)",
    )
    parser.add_argument(
        "--nodes",
        type=int,
        help="run a fleet of N simulated 8-GPU nodes in this process instead, node i on the --web.listen-address "
        "port + i, in jobs of 8-32 nodes (exporter/sim/fleet.py)",
    )
    parser.add_argument(
        "--incident-node",
        dest="incident_node",
        type=int,
        help="with --nodes: the node that carries the incident (default 0); its whole job slows",
    )
    parser.add_argument(
        "--fleet.interval",
        dest="fleet_interval",
        default="5s",
        help="with --nodes: every node's sample interval (default 5s; a scrape interval is enough)",
    )


def run_demo(args: argparse.Namespace) -> int:
    if args.speed <= 0:
        raise SystemExit("mfu-exporter demo: --speed must be positive")
    if args.nodes is not None:
        return run_fleet(args)
    if args.incident_node is not None:
        raise SystemExit("mfu-exporter demo: --incident-node needs --nodes")
    root = Path(tempfile.mkdtemp(prefix="mfu-demo-"))
    try:
        runtime, node, simulation = build_demo(args, root)

        def started(urls: list[str]) -> None:
            url = urls[0]
            if node.training_log is None:
                node.reporter = ProgressReporter(
                    url,
                    JOB,
                    model=dict(MODEL),
                    dtype="bf16",
                    gpus=list(JOB_GPUS),
                    target_tokens=NODE_TARGET_TOKENS,
                    clock=node.clock.time,
                )
            simulation.start()
            print(f"mfu-exporter demo: a simulated 8 × {GPU_NAME} node training {JOB}", flush=True)
            print(f"  reporting    {JOB} on GPUs {', '.join(map(str, JOB_GPUS))}", flush=True)
            if node.kubelet is not None:
                gpus = ", ".join(map(str, DISCOVERED_GPUS))
                print(f"  discovered   {DISCOVERED_JOB} on GPUs {gpus}: reports nothing, found through", flush=True)
                print(f"               the pod-resources API at {node.kubelet.socket}", flush=True)
            print(f"  status page  {url}", flush=True)
            print(f"  metrics      {url}metrics", flush=True)
            print(f"  jobs         {url}api/v1/jobs", flush=True)
            print(f"  schedule     {node.schedule.describe(args.speed)}", flush=True)
            print(f"  files        {root} (sysfs tree, ethtool texts, checkpoints)", flush=True)
            if node.training_log is not None:
                print(f"  training log {node.training_log.path} (torchtitan's lines; MFU comes from here)", flush=True)
            print("  Ctrl-C stops it.", flush=True)

        asyncio.run(serve(runtime, on_started=started))
        simulation.stop()
        if node.kubelet is not None:
            node.kubelet.stop()
        if node.reporter is not None:
            node.reporter.close(timeout=1.0)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


def run_fleet(args: argparse.Namespace) -> int:
    """``demo --nodes N``: N simulated nodes in one process (``exporter.sim.fleet``)."""
    if not 1 <= args.nodes <= 4096:
        raise SystemExit("mfu-exporter demo: --nodes must be from 1 to 4096")
    if args.incident and args.incident not in FLEET_INCIDENTS:
        raise SystemExit(f"mfu-exporter demo: --nodes simulates the incidents {', '.join(FLEET_INCIDENTS)}")
    if args.progress != "api":
        raise SystemExit("mfu-exporter demo: --nodes reports progress to each node's job model (--progress api)")
    if args.incident_node is not None and not 0 <= args.incident_node < args.nodes:
        raise SystemExit(f"mfu-exporter demo: --incident-node must be from 0 to {args.nodes - 1}")
    root = Path(tempfile.mkdtemp(prefix="mfu-fleet-"))
    try:
        fleet = build_fleet(args, root)

        def started(urls: list[str]) -> None:
            sizes = ", ".join(f"{job.name} ({len(job.nodes)})" for job in fleet.jobs)
            print(f"mfu-exporter demo: a fleet of {len(fleet.nodes)} simulated 8 × {GPU_NAME} nodes", flush=True)
            print(f"  nodes        {urls[0]} ... {urls[-1]} (node i on port {fleet.base_port} + i)", flush=True)
            print(f"  jobs         {sizes}", flush=True)
            print(
                f"  incident     on node {fleet.incident_node} ({fleet.incident_job().name}): "
                f"{fleet.schedule.describe(args.speed)}",
                flush=True,
            )
            print(f"  truth        {urls[0]}api/v1/fleet", flush=True)
            print("  Ctrl-C stops it.", flush=True)

        asyncio.run(serve_fleet(fleet, on_started=started))
        fleet.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0
