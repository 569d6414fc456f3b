"""The preflight checks as a daemon source: rerun every few minutes, exported as ``mfu_preflight_check_ok{check}``
and ``mfu_preflight_check_warning{check}`` (``mfu_exporter.render.preflight``).

A fleet dashboard then shows misconfigured nodes before jobs land on them, and ``MfuPreflightFailed`` alerts on
them. The checks themselves live in ``mfu_exporter.preflight`` (shared with ``mfu-exporter check``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from mfu_exporter.config import PreflightConfig
from mfu_exporter.node.nic_qos import KernelNicQos, NicQos
from mfu_exporter.node.nvml import NvmlSession
from mfu_exporter.preflight.checks import read_env_file, run_checks
from mfu_exporter.preflight.facts import CheckResult, PreflightSettings, gather
from mfu_exporter.preflight.report import results_json
from mfu_exporter.sources.base import Snapshot, SourceContext

# The lowest series level (sources.preflight.series) at which each family is on: a failure is what the central
# MfuPreflightFailed reads; warnings (MfuPfcOtherPriorities) are on by default too.
FAMILY_LEVELS = {"mfu_preflight_check_ok": "minimal", "mfu_preflight_check_warning": "standard"}


@dataclass(frozen=True)
class PreflightSample:
    """One run of the checks: what ``mfu_exporter.render.preflight`` exports."""

    series: str  # sources.preflight.series: which families are exported (FAMILY_LEVELS)
    results: tuple[CheckResult, ...]


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
        nvml_session: NvmlSession | None = None,
        series: str = "standard",
    ):
        self.series = series
        self.settings = settings
        self.sysfs = sysfs
        self.procfs = procfs
        self.nvml = nvml
        self.nvml_session = nvml_session or NvmlSession(
            nvml
        )  # borrowed: the daemon's one session (mfu_exporter.node.nvml)
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
            nvml_session=ctx.nvml_session,
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
        facts = gather(
            self.settings,
            self.sysfs,
            self.procfs,
            nvml=self.nvml,
            qos=self.qos,
            nccl_env=env,
            nvml_session=self.nvml_session,
        )
        results = run_checks(facts, self.settings)
        return Snapshot(
            readings=PreflightSample(self.series, tuple(results)), errors=errors, status=results_json(results)
        )

    def close(self) -> None:
        """Nothing to release: each run opens and closes what it reads."""
