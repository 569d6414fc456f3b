"""The nccl source's verification reading (``mfu_exporter.sources.nccl_tests.NcclTestReading``) as metric families;
``mfu_exporter.render.collectives.nccl_families`` renders the rest of the source's sample and calls this.

One verification per node: its bus bandwidth at the largest size (by collective, as the file names it), the figure
it was held to, whether wrong values were seen, when it ran and whether it passed. Nothing while no file matches.
"""

from __future__ import annotations

from typing import Iterable, Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from mfu_exporter.render.common import levelled
from mfu_exporter.sources.nccl_tests import NcclTestReading

# The lowest series level (sources.nccl.series) at which each family is on. minimal: what MfuNcclTestFailed reads.
FAMILY_LEVELS = {
    "mfu_nccl_test_passed": "minimal",
    "mfu_nccl_test_busbw_bytes_per_second": "minimal",
    "mfu_nccl_test_timestamp_seconds": "minimal",
    "mfu_nccl_test_expected_busbw_bytes_per_second": "standard",
    "mfu_nccl_test_wrong_values": "standard",
}


def nccl_test_families(reading: NcclTestReading) -> Iterable[Metric]:
    return levelled(_families(reading), FAMILY_LEVELS, reading.series)


def _gauge(name: str, text: str, value: float | None, labels: dict[str, str] | None = None) -> Iterator[Metric]:
    if value is None:
        return
    family = GaugeMetricFamily(name, text, labels=list(labels or {}))
    family.add_metric(list((labels or {}).values()), value)
    yield family


def _families(reading: NcclTestReading) -> Iterator[Metric]:
    if reading.passed is None:
        return  # no verification yet
    yield from _gauge(
        "mfu_nccl_test_passed",
        "1 when the node's last NCCL verification (the newest sources.nccl.tests_paths file) passed: busbw at the "
        "largest size within 0.9 x the expected figure, no wrong values, RDMA between nodes; 0 when it failed or "
        "could not be read.",
        1.0 if reading.passed else 0.0,
    )
    yield from _gauge(
        "mfu_nccl_test_busbw_bytes_per_second",
        "Bus bandwidth of the last NCCL verification at its largest message size (out-of-place, as nccl-tests "
        "prints it), by collective (unknown when the file does not name it).",
        reading.busbw_bytes_per_second,
        {"collective": reading.collective or "unknown"},
    )
    yield from _gauge(
        "mfu_nccl_test_timestamp_seconds",
        "When the last NCCL verification was written (its file's modification time, Unix seconds).",
        reading.verified_at,
    )
    yield from _gauge(
        "mfu_nccl_test_expected_busbw_bytes_per_second",
        "The bus bandwidth the verification is held to: 0.8 x the ACTIVE RDMA ports' line rate, or "
        "sources.nccl.expect_busbw; absent when neither is known.",
        reading.expected_bytes_per_second,
    )
    yield from _gauge(
        "mfu_nccl_test_wrong_values",
        "1 when the last verification's #wrong column counted wrong values (data corruption), 0 when it counted "
        "none; absent when it did not check (N/A, or the old error column).",
        None if reading.wrong_values is None else float(reading.wrong_values),
    )
