"""``mfu-exporter run``: the exporter daemon (the default command)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
from typing import Any

from mfu_exporter.cli.flags import add_daemon_flags, load_daemon_config, require_path_flags
from mfu_exporter.service import build_service
from mfu_exporter.sources import Paths, SourceContext, build_sources, require_sources
from mfu_exporter.web.app import serve


def add_run_flags(parser: argparse.ArgumentParser) -> None:
    add_daemon_flags(parser)


def run_daemon(args: argparse.Namespace, nvml: Any = None) -> int:
    """The daemon; ``nvml`` replaces the pynvml module only where a test runs it over the fake (mfu_exporter/sim/nvml)."""
    require_path_flags(args)
    config = load_daemon_config(args)
    ctx = SourceContext(config, Paths(args.sysfs, args.procfs))  # the real NVML, ethtool ioctl and clocks
    if nvml is not None:
        ctx = dataclasses.replace(ctx, nvml=nvml)
    sources = build_sources(config, ctx)
    require_sources(config, sources, args.config)
    service = build_service(config, sources, paths=ctx.paths, monotonic=ctx.monotonic)
    asyncio.run(serve(service))
    return 0
