"""The sources: one per plane, each sampled in its own worker thread (``exporter.scheduler``).

``SOURCE_FACTORIES`` is the registry: config section name -> factory. ``build_sources`` builds every source the
config does not disable.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

import pynvml

from exporter.config import ConfigError
from exporter.sources.base import Paths, Source, SourceUnavailable
from exporter.sources.checkpoint import checkpoint_source
from exporter.sources.discovery import DiscoverySource
from exporter.sources.ethtool import build_ethtool_source
from exporter.sources.gpu import GpuSource
from exporter.sources.logs import logs_source
from exporter.sources.preflight import PreflightSource
from exporter.sources.rdma import build_rdma_source


def build_sources(config: dict, paths: Paths) -> list[Source]:
    """Every source not disabled in the config. ``auto`` and ``true`` both build it; ``require_sources`` is what
    makes ``true`` stop the start when the source cannot work here."""
    sources: list[Source] = []
    for name, factory in SOURCE_FACTORIES.items():
        section = config["sources"][name]
        if section["enabled"] == "false":
            continue
        if name == "ethtool":  # it reads the RDMA ports' netdevs: only those of the devices sources.rdma selects
            sources.append(factory(section, paths, rdma=config["sources"]["rdma"]))
        elif name == "logs":  # what a log cannot say (world size, sequence length) comes from jobs.<job>
            sources.append(factory(section, paths, jobs=config["jobs"]))
        else:
            sources.append(factory(section, paths))
    if discovery_enabled(config):
        sources.append(DiscoverySource(config["discovery"], paths.procfs, paths.sysfs, pynvml))
    return sources


def discovery_enabled(config: dict) -> bool:
    """Discovery runs unless both of its halves are off (``discovery.kubernetes`` and ``discovery.slurm``)."""
    section = config["discovery"]
    return section["kubernetes"]["enabled"] != "false" or section["slurm"]["enabled"] != "false"


def _enabled_key(config: dict, source: Source) -> tuple[str, str]:
    """The config key whose ``true`` makes this source required, and its value."""
    if source.name == "discovery":
        for half in ("kubernetes", "slurm"):
            if config["discovery"][half]["enabled"] == "true":
                return f"discovery.{half}.enabled", "true"
        return "discovery.kubernetes.enabled", "auto"
    return f"sources.{source.name}.enabled", config["sources"][source.name]["enabled"]


def require_sources(config: dict, sources: list[Source], file: str | None) -> None:
    """Sample once, before the daemon starts, each source the config sets to ``enabled: true``; raise ConfigError
    (exit 2) when one cannot work here, so a node meant to export it does not serve without it unnoticed.

    ``auto`` is for sources that may be absent (it reports them down and serves the rest); ``true`` says the source
    is required. Only the start is checked: a required source that fails later (a GPU falling off the bus) reports
    down like any other, since stopping the exporter then would hide everything else it shows. The samples run
    together, each in its own thread bounded by the source's timeout, as the daemon would run them.
    """
    required = [s for s in sources if _enabled_key(config, s)[1] == "true"]
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
            _enabled_key(config, source)[0],
            "a node where it works, or auto to serve without it",
            problem=f"true requires this source, but it cannot start here ({why}); ",
        )


def _gpu_source(section: dict, paths: Paths) -> Source:
    return GpuSource.from_config(section, pynvml)  # importing pynvml needs no driver; nvmlInit finds out


def _preflight_source(section: dict, paths: Paths) -> Source:
    return PreflightSource.from_config(section, paths.sysfs, paths.procfs, pynvml)


SOURCE_FACTORIES: dict[str, Callable[[dict, Paths], Source]] = {
    "gpu": _gpu_source,
    "checkpoint": checkpoint_source,
    "preflight": _preflight_source,
    "rdma": build_rdma_source,
    "ethtool": build_ethtool_source,
    "logs": logs_source,
}
