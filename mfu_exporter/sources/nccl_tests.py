"""The nccl source's second half: the node's last NCCL verification, the newest ``sources.nccl.tests_paths`` file.

A Slurm prolog or a Kubernetes init container runs a short all_reduce_perf and writes its output there
(docs/commands.md, "Verifying the fabric"). The source reads the newest matching file, judges it the way ``mfu-exporter nccl`` does
(``mfu_exporter.preflight.nccl``: busbw at the largest size against the ACTIVE RDMA ports, wrong values, sockets
between nodes) and keeps the verdict until a newer file comes. A file is read again only when its modification
time or size changes.

No ``tests_paths`` configured, or none matching yet: an empty reading and a status saying so, not an error. A
file that cannot be read or holds no NCCL output is a failed verification, never a silent pass.

``mfu_exporter.sources.nccl`` samples it beside NCCL Inspector's files and hands the ``NcclTestReading`` in its
``NcclSample``; ``mfu_exporter.render.nccl`` turns it into families.
"""

from __future__ import annotations

import glob
import os
from collections import Counter
from dataclasses import dataclass
from typing import Callable

from mfu_exporter.config import NcclConfig
from mfu_exporter.node.rdma import RdmaPort, discover_ports
from mfu_exporter.preflight.nccl import (
    Expectation,
    Unreadable,
    fabric_expectation,
    read_lines,
    user_expectation,
    verify,
)
from mfu_exporter.sources.base import SourceContext

GB = 1e9  # nccl-tests' GB/s are 10^9 bytes per second


@dataclass(frozen=True)
class NcclTestReading:
    """The last verification; every figure None where the file does not show it. ``path`` None: no file yet."""

    path: str | None
    verified_at: float | None  # the file's modification time (Unix seconds): when the test finished writing it
    verdict: str  # "pass", "fail", "unreadable", or "none" while no file matches
    passed: bool | None  # unreadable counts as failed; None while no file matches
    collective: str | None
    busbw_bytes_per_second: float | None  # out-of-place busbw at the largest size
    largest_size_bytes: int | None
    expected_bytes_per_second: float | None
    wrong_values: bool | None  # None: not checked (N/A) or the old error column
    fell_back_to_socket: bool | None
    reasons: tuple[str, ...]
    series: str  # the source's series level, for the renderer


class NcclTests:
    """The verification files of ``tests_paths``, judged; ``sample`` once per cycle of the nccl source."""

    def __init__(
        self,
        section: NcclConfig,
        ports: Callable[[], list[RdmaPort]] = list,
    ):
        """``ports``: the node's RDMA ports, read on each new file for the expected figure (unless expect_busbw)."""
        self.series = section.series
        self._patterns = tuple(section.tests_paths)
        self._expect = section.expect_busbw
        self._ports = ports
        self._last: tuple[tuple[str, int, int], NcclTestReading] | None = None

    def sample(self, errors: Counter) -> tuple[NcclTestReading, dict]:
        """The last verification and its status for people; counts problems in ``errors``."""
        if not self._patterns:
            return self._empty("no sources.nccl.tests_paths configured")
        newest = self._newest(errors)
        if newest is None:
            return self._empty(f"no file matches {', '.join(self._patterns)} yet")
        path, stat = newest
        key = (path, stat.st_mtime_ns, stat.st_size)
        if self._last is None or self._last[0] != key:
            self._last = (key, self._judge(path, stat.st_mtime, errors))
        reading = self._last[1]
        status = {
            "file": reading.path,
            "verified_at": reading.verified_at,
            "verdict": reading.verdict,
            "reasons": list(reading.reasons),
        }
        return reading, status

    # internals

    def _empty(self, why: str) -> tuple[NcclTestReading, dict]:
        reading = NcclTestReading(None, None, "none", None, None, None, None, None, None, None, (why,), self.series)
        return reading, {"file": None, "verdict": why}

    def _newest(self, errors: Counter) -> tuple[str, os.stat_result] | None:
        best: tuple[str, os.stat_result] | None = None
        for pattern in self._patterns:
            for path in glob.glob(pattern):
                try:
                    stat = os.stat(path)
                except OSError:
                    errors["file_vanished"] += 1  # removed between the listing and the stat: the next file wins
                    continue
                if not os.path.isfile(path):
                    continue
                if best is None or (stat.st_mtime_ns, path) > (best[1].st_mtime_ns, best[0]):
                    best = (path, stat)
        return best

    def _expectation(self) -> Expectation:
        if self._expect is not None:
            return user_expectation(self._expect)
        return fabric_expectation(self._ports())

    def _judge(self, path: str, mtime: float, errors: Counter) -> NcclTestReading:
        expectation = self._expectation()
        expected = None if expectation.busbw_gbps is None else expectation.busbw_gbps * GB
        try:
            lines = read_lines(path)
        except Unreadable as exc:
            errors["unreadable_file"] += 1
            return NcclTestReading(
                path, mtime, "unreadable", False, None, None, None, expected, None, None, (str(exc),), self.series
            )
        reading, judgement = verify(lines, expectation)
        if reading.skipped:
            errors["unreadable_line"] += reading.skipped
        perf, transport = reading.perf, reading.transport
        measured = judgement.measured_busbw_gbps
        return NcclTestReading(
            path=path,
            verified_at=mtime,
            verdict=judgement.verdict,
            passed=judgement.verdict == "pass",
            collective=None if perf is None else perf.collective,
            busbw_bytes_per_second=None if measured is None else measured * GB,
            largest_size_bytes=None if perf is None else perf.largest_size_bytes,
            expected_bytes_per_second=expected,
            wrong_values=None if perf is None else perf.wrong_nonzero,
            fell_back_to_socket=None if transport is None else transport.fell_back_to_socket,
            reasons=judgement.reasons,
            series=self.series,
        )


def fabric_ports(ctx: SourceContext) -> Callable[[], list[RdmaPort]]:
    """The RDMA ports under ``ctx``'s sysfs, filtered as the rdma source filters them: the expected figure's."""
    rdma = ctx.settings.sources.rdma
    sysfs = ctx.paths.sysfs

    def ports() -> list[RdmaPort]:
        return discover_ports(
            sysfs, rdma.devices_include, rdma.devices_exclude, virtual_functions=rdma.virtual_functions
        )

    return ports
