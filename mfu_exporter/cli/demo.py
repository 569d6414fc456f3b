"""``mfu-exporter demo``: a simulated 8-GPU training node through the real exporter (``mfu_exporter.sim.node``)."""

from __future__ import annotations

import argparse
import asyncio
import shutil
import ssl
import tempfile
from pathlib import Path
from typing import Any

from mfu_exporter.cli.flags import UsageError, add_daemon_flags, apply_web_flags, positive
from mfu_exporter.client import ProgressReporter
from mfu_exporter.config import Config, ConfigError, Invalid, duration
from mfu_exporter.sim.fleet import FLEET_INCIDENTS, build_fleet, serve_fleet
from mfu_exporter.sim.node import (
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
from mfu_exporter.web.app import serve


class NotForTheDemo(argparse.Action):
    """``--path.sysfs`` and ``--path.procfs`` say where the kernel's trees are, and the demo reads no kernel tree: its
    sources read the simulated ones it writes into its own temporary directory. Writing a simulated tree at the
    given path instead would write into whatever is there (``/sys`` is the flags' default), so the demo refuses
    them (exit 2) rather than take them and ignore them."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: Any, values: Any, option: Any = None) -> None:
        parser.error(
            f"{option} is not accepted: the demo reads the simulated sysfs and procfs trees it writes into its own "
            "temporary directory (shown at start as files); to read another tree, run mfu-exporter run "
            + f"{option} DIR"
        )


def mfu_window(value: str) -> float:
    try:
        return duration(value)
    except Invalid as exc:
        raise argparse.ArgumentTypeError(exc.expected) from None


def incident_gap(value: str) -> float:
    seconds = mfu_window(value)
    if seconds < 30.0:
        # The MFU window (15 s) and one more must pass between incidents, or one's last seconds fall in the next.
        raise argparse.ArgumentTypeError("must be at least 30s")
    return seconds


def incident_lengths(value: str) -> float | dict[str, float]:
    """``--for``: one duration (the forced incident's, or every incident's in the rotation), or ``NAME=DURATION``
    pairs, comma-separated, for the incidents named."""
    try:
        if "=" not in value:
            return duration(value)
        lengths: dict[str, float] = {}
        for item in value.split(","):
            name, _, length = (part.strip() for part in item.partition("="))
            if name not in INCIDENTS:
                raise argparse.ArgumentTypeError(f"{name!r} is not an incident ({', '.join(INCIDENTS)})")
            lengths[name] = duration(length)
        return lengths
    except Invalid as exc:
        raise argparse.ArgumentTypeError(f"{value!r}: expected DURATION or NAME=DURATION,...: {exc.expected}") from None


def add_demo_flags(parser: argparse.ArgumentParser) -> None:
    add_daemon_flags(parser, paths=False)
    for flag in ("--path.sysfs", "--path.procfs"):
        parser.add_argument(flag, action=NotForTheDemo, metavar="DIR", help=argparse.SUPPRESS)
    parser.add_argument(
        "--speed", type=positive(float), default=1.0, help="simulated seconds per wall-clock second (default 1)"
    )
    parser.add_argument(
        "--incident",
        choices=INCIDENTS,
        help="force one incident after 10 s of healthy training; it lasts until the demo stops (crash-restart: "
        "the job restarts after a minute), or for --for DURATION",
    )
    parser.add_argument(
        "--mfu.window",
        dest="mfu_window",
        type=mfu_window,
        metavar="DURATION",
        help="MFU window; overrides mfu.window of --config (default 15s, so changes show fast)",
    )
    parser.add_argument(
        "--for",
        dest="incident_for",
        type=incident_lengths,
        metavar="DURATION",
        help="how long the forced incident lasts, then training is healthy again (default: until the demo stops; "
        "crash-restart: a minute); without --incident, how long each incident of the rotation lasts, or "
        "NAME=DURATION,... for the incidents named (default: the table's)",
    )
    parser.add_argument(
        "--warm-up",
        dest="warmup",
        type=mfu_window,
        metavar="DURATION",
        help="healthy training before the first incident (default 10s with --incident, the incident gap without): "
        "time for a Prometheus to start scraping the demo before anything happens",
    )
    parser.add_argument(
        "--incident-gap",
        dest="incident_gap",
        type=incident_gap,
        metavar="DURATION",
        help="the rotation's healthy time before each incident (default 3m; shorter makes a quicker rotation)",
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
        "port + i, in jobs of 8-32 nodes (mfu_exporter/sim/fleet.py)",
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
    if not args.speed > 0:  # argparse checks the flag; a caller building the namespace itself is checked here
        raise UsageError("--speed must be positive")
    lengths = getattr(args, "incident_for", None)
    if args.incident and isinstance(lengths, dict) and set(lengths) != {args.incident}:
        raise UsageError(f"--for with --incident {args.incident} takes one duration, or {args.incident}=DURATION")
    if args.nodes is not None:
        return run_fleet(args)
    if args.incident_node is not None:
        raise UsageError("--incident-node needs --nodes")
    root = Path(tempfile.mkdtemp(prefix="mfu-demo-"))
    try:
        service, node, simulation = build_demo(args, root, flags=lambda config: demo_flags(config, args))

        def started(urls: list[str]) -> None:
            url = urls[0]
            if node.training_log is None:
                # One reporter per process of the job: the crash-restart incident starts a new one (a new run).
                node.new_reporter = lambda: ProgressReporter(
                    url,
                    JOB,
                    model=dict(MODEL),
                    dtype="bf16",
                    gpus=list(JOB_GPUS),
                    target_tokens=NODE_TARGET_TOKENS,
                    clock=lambda: node.stamp,  # the time of the tick's token count, not of the send
                    monotonic=node.clock.monotonic,  # heartbeats and the load's duration on the simulated clock
                    **reporter_access(service.settings, url),
                )
                node.reporter = node.new_reporter()
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
            print(
                f"  truth        {url}api/v1/demo (each incident: when, the cause it should yield, the jobs)",
                flush=True,
            )
            print(f"  schedule     {node.schedule.describe(args.speed)}", flush=True)
            print(f"  files        {root} (sysfs tree, ethtool texts, checkpoints)", flush=True)
            if node.training_log is not None:
                print(f"  training log {node.training_log.path} (torchtitan's lines; MFU comes from here)", flush=True)
            print("  Ctrl-C stops it.", flush=True)

        # The simulation's truth, served beside the exporter's own answers (the web layer never imports sim/).
        asyncio.run(serve(service, on_started=started, documents={"/api/v1/demo": node.truth}))
        simulation.stop()
        if node.kubelet is not None:
            node.kubelet.stop()
        if node.reporter is not None:
            node.reporter.close(timeout=1.0)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


def demo_flags(config: dict, args: argparse.Namespace) -> dict:
    """The command line over the demo's config: the web flags as ``run`` applies them, and ``--mfu.window``."""
    apply_web_flags(config, args)
    if args.mfu_window is not None:
        config["mfu"]["window"] = args.mfu_window
    return config


def reporter_access(settings: Config, url: str) -> dict[str, Any]:
    """How the demo's own job reaches the demo's server when ``--web.config.file`` or ``ingest.token_file`` secure
    it: the token from the token file, and over TLS a context that does not verify the certificate. The job and
    the server are one process on loopback, and the certificate names whatever host the operator's file was made
    for; the scrapers and browsers the demo serves verify it as usual. Basic auth governs reads, not reports."""
    access: dict[str, Any] = {}
    token_file = settings.ingest.token_file
    if token_file:
        try:
            with open(token_file, encoding="utf-8") as handle:
                access["token"] = handle.read().strip()
        except OSError as exc:  # the server reads it too, and says what is wrong with it
            raise ConfigError(token_file, "ingest.token_file", f"a readable file ({exc.strerror})") from None
    if url.startswith("https:"):
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        access["ssl_context"] = context
    return access


def run_fleet(args: argparse.Namespace) -> int:
    """``demo --nodes N``: N simulated nodes in one process (``mfu_exporter.sim.fleet``)."""
    if not 1 <= args.nodes <= 4096:
        raise UsageError("--nodes must be from 1 to 4096")
    if args.incident and args.incident not in FLEET_INCIDENTS:
        raise UsageError(f"--nodes simulates the incidents {', '.join(FLEET_INCIDENTS)}")
    if args.progress != "api":
        raise UsageError("--nodes reports progress to each node's job model (--progress api)")
    if args.incident_node is not None and not 0 <= args.incident_node < args.nodes:
        raise UsageError(f"--incident-node must be from 0 to {args.nodes - 1}")
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
