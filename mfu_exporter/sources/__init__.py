"""The sources: one per plane, each sampled in its own worker thread (``mfu_exporter.scheduler``).

``SOURCES`` is the registry: source name -> factory, every factory of one signature ``(section, ctx)``, where
``section`` is the source's own config section, typed (``mfu_exporter.config``), and ``ctx`` a ``SourceContext`` (the
whole config, the paths, the NVML module, the ethtool reader, the clocks). ``build_sources`` builds every source the
config does not disable; production, the demo, the benchmarks and the tests all build through it and differ only in
the context.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from mfu_exporter.config import Config, ConfigError, Enabled, typed_config
from mfu_exporter.sources.base import Paths, Source, SourceContext, SourceUnavailable
from mfu_exporter.sources.checkpoint import checkpoint_source
from mfu_exporter.sources.discovery import DiscoverySource
from mfu_exporter.sources.ethtool import ethtool_source
from mfu_exporter.sources.gpu import GpuSource
from mfu_exporter.sources.logs import logs_source
from mfu_exporter.sources.nccl import NcclSource
from mfu_exporter.sources.preflight import PreflightSource
from mfu_exporter.sources.rdma import rdma_source
from mfu_exporter.sources.storage import storage_source

__all__ = ["SOURCES", "Paths", "SourceContext", "build_sources", "enabled", "require_sources", "section_of"]

Factory = Callable[[Any, SourceContext], Source]  # (the source's section of mfu_exporter.config.Config, ctx)

# In this order the scheduler lists them (status page, /api/v1/status, the per-source families).
SOURCES: dict[str, Factory] = {
    "gpu": GpuSource.from_config,
    "checkpoint": checkpoint_source,
    "preflight": PreflightSource.from_config,
    "rdma": rdma_source,
    "ethtool": ethtool_source,
    "logs": logs_source,
    "nccl": NcclSource.from_config,
    "storage": storage_source,
    "discovery": DiscoverySource.from_config,
}


def section_of(config: Config, name: str) -> Any:
    """The source's config section: ``sources.<name>``, except discovery's, the top-level ``discovery`` (it finds
    jobs rather than sampling a plane, and each of its halves has its own ``enabled``)."""
    return config.discovery if name == "discovery" else getattr(config.sources, name)


def _enabled_keys(config: Config, name: str) -> list[tuple[str, Enabled]]:
    """The config keys that turn the source on or off, with their values."""
    if name == "discovery":
        halves = {"kubernetes": config.discovery.kubernetes, "slurm": config.discovery.slurm}
        return [(f"discovery.{half}.enabled", section.enabled) for half, section in halves.items()]
    return [(f"sources.{name}.enabled", getattr(config.sources, name).enabled)]


def enabled(config: Config, name: str) -> bool:
    """Whether the source runs: not ``false``. Discovery runs unless both of its halves are off."""
    return any(value is not Enabled.FALSE for _, value in _enabled_keys(config, name))


def build_sources(config: dict, ctx: SourceContext) -> list[Source]:
    """Every source not disabled in the config. ``auto`` and ``true`` both build it; ``require_sources`` is what
    makes ``true`` stop the start when the source cannot work here."""
    typed = ctx.settings if ctx.config is config else typed_config(config)
    return [factory(section_of(typed, name), ctx) for name, factory in SOURCES.items() if enabled(typed, name)]


def _required_key(config: Config, source: Source) -> str | None:
    """The config key whose ``true`` makes this source required, or None when nothing requires it."""
    return next((key for key, value in _enabled_keys(config, source.name) if value is Enabled.TRUE), None)


def require_sources(config: dict, sources: list[Source], file: str | None) -> None:
    """Sample once, before the daemon starts, each source the config sets to ``enabled: true``; raise ConfigError
    (exit 2) when one cannot work here, so a node meant to export it does not serve without it unnoticed.

    ``auto`` is for sources that may be absent (it reports them down and serves the rest); ``true`` says the source
    is required. Only the start is checked: a required source that fails later (a GPU falling off the bus) reports
    down like any other, since stopping the exporter then would hide everything else it shows. The samples run
    together, each in its own thread bounded by the source's timeout, as the daemon would run them.
    """
    typed = typed_config(config)
    required = [s for s in sources if _required_key(typed, s) is not None]
    outcomes: dict[str, Exception | None] = {}

    def probe(source: Source) -> None:
        try:
            source.sample()
        except Exception as exc:  # noqa: BLE001 - reported below as why the source cannot start
            outcomes[source.name] = exc
        else:
            outcomes[source.name] = None

    threads = [threading.Thread(target=probe, args=(s,), name=f"require-{s.name}", daemon=True) for s in required]
    for thread in threads:
        thread.start()
    started = time.monotonic()
    for source, thread in zip(required, threads):
        thread.join(max(source.timeout - (time.monotonic() - started), 0.0))
    for source in required:
        if source.name not in outcomes:
            why = f"its first sample took longer than its timeout of {source.timeout:g}s"
        elif (error := outcomes[source.name]) is None:
            continue
        else:
            why = str(error) if isinstance(error, SourceUnavailable) else f"{type(error).__name__}: {error}"
        raise ConfigError(
            file or "<config>",
            _required_key(typed, source) or f"sources.{source.name}.enabled",
            "a node where it works, or auto to serve without it",
            problem=f"true requires this source, but it cannot start here ({why}); ",
        )
