"""The preflight checks' results (``mfu_exporter.sources.preflight.PreflightSample``) as metric families."""

from __future__ import annotations

from typing import Iterable

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from mfu_exporter.preflight.facts import CheckResult, Status
from mfu_exporter.render.common import levelled
from mfu_exporter.sources.preflight import FAMILY_LEVELS, PreflightSample


def preflight_families(sample: PreflightSample) -> Iterable[Metric]:
    return levelled(check_families(sample.results), FAMILY_LEVELS, sample.series)


def check_families(results: Iterable[CheckResult]) -> Iterable[Metric]:
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
