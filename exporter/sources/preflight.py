"""The preflight checks as a daemon source: rerun every few minutes, exported as ``mfu_preflight_check_ok{check}``
and ``mfu_preflight_check_warning{check}``.

A fleet dashboard then shows misconfigured nodes before jobs land on them, and ``MfuPreflightFailed`` alerts on
them. The checks themselves live in ``exporter.preflight.checks`` (shared with ``mfu-exporter check``).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Iterable

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from exporter.config import PreflightConfig
from exporter.node.nic_qos import KernelNicQos, NicQos
from exporter.preflight.checks import (
    CheckResult,
    PreflightSettings,
    Status,
    gather,
    read_env_file,
    results_json,
    run_checks,
)
from exporter.sources.base import Snapshot, SourceContext, levelled

# The lowest series level (sources.preflight.series) at which each family is on: a failure is what the central
# MfuPreflightFailed reads; warnings (MfuPfcOtherPriorities) are on by default too.
FAMILY_LEVELS = {"mfu_preflight_check_ok": "minimal", "mfu_preflight_check_warning": "standard"}


def check_families(results: list[CheckResult]) -> Iterable[Metric]:
    ok = GaugeMetricFamily(
        "mfu_preflight_check_ok",
        "1 when the preflight check passes (PASS or WARN), 0 when it FAILs; absent when it does not apply.",
        labels=["check"],
    )
    # WARN is ok (the node works) but its own series, so an alert can key on one warning (MfuPfcOtherPriorities).
    warning = GaugeMetricFamily(
        "mfu_preflight_check_warning",
        "1 when the preflight check WARNs (works, but not as the guide wants), 0 when it passes or FAILs; absent when it does not apply.",
        labels=["check"],
    )
    for result in results:
        if result.status != Status.SKIP:
            ok.add_metric([result.check], 0.0 if result.status == Status.FAIL else 1.0)
            warning.add_metric([result.check], 1.0 if result.status == Status.WARN else 0.0)
    yield ok
    yield warning


class PreflightSource:
    name = "preflight"

    def __init__(
        self,
        settings: PreflightSettings,
        sysfs: str,
        procfs: str,
        nvml: Any,
        qos: NicQos | None = None,
        nccl_env_file: str | None = None,
        interval: float = 300.0,
        timeout: float = 30.0,
        series: str = "standard",
    ):
        self.series = series
        self.settings = settings
        self.sysfs = sysfs
        self.procfs = procfs
        self.nvml = nvml
        self.qos = qos or KernelNicQos()
        self.nccl_env_file = nccl_env_file
        self.interval = interval
        self.timeout = timeout

    @classmethod
    def from_config(cls, section: PreflightConfig, ctx: SourceContext) -> PreflightSource:
        return cls(
            PreflightSettings.from_config(section),
            ctx.paths.sysfs,
            ctx.paths.procfs,
            ctx.nvml,
            qos=ctx.nic_qos,
            nccl_env_file=section.nccl_env_file,
            interval=section.interval,
            timeout=section.timeout,
            series=section.series,
        )

    def sample(self) -> Snapshot:
        errors: Counter = Counter()
        env = None
        if self.nccl_env_file:
            try:
                env = read_env_file(self.nccl_env_file)
            except (OSError, UnicodeDecodeError):  # missing, unreadable, or not UTF-8 text
                errors["nccl_env_file_unreadable"] += 1  # the NCCL checks SKIP, saying no environment was given
        facts = gather(self.settings, self.sysfs, self.procfs, nvml=self.nvml, qos=self.qos, nccl_env=env)
        results = run_checks(facts, self.settings)
        return Snapshot(
            render=lambda: levelled(check_families(results), FAMILY_LEVELS, self.series),
            errors=errors,
            status=results_json(results),
            data={"results": results},
        )

    def close(self) -> None:
        """Nothing to release: each run opens and closes what it reads."""
