"""The guide's last fabric step: an NCCL test's output judged against what this node's fabric can carry.

Shared by ``mfu-exporter nccl`` (one file or stdin), ``mfu-exporter check --nccl FILE`` (one more line of the
preflight report) and the daemon's ``nccl`` source (the newest file a prolog wrote). The text is read by
``mfu_exporter.nccl`` (pure parsing); here are the file, the node's active RDMA ports and the verdict.

The expected figure: the active RDMA ports' line rate (sysfs ``rate``), summed and turned into GB/s, times
``BUSBW_SHARE``, the share of line rate NCCL's bus bandwidth reaches at large sizes on a healthy fabric; the
measured busbw at the largest size passes at ``mfu_exporter.nccl.perf.MARGIN`` (0.9, nccl-tests' own rule) of it.
A run on one node measures NVLink, not the fabric, and passes this bar easily; the transport lines tell the two
apart when the job logged them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from mfu_exporter.nccl.perf import MARGIN, Judgement, Reading, judge, read_text
from mfu_exporter.node.rdma import RdmaPort
from mfu_exporter.preflight.facts import CheckResult, Status

#: NCCL's busbw at 1 GiB on a healthy fabric is 80-95 % of the ports' line rate (nccl-tests doc/PERFORMANCE.md; the
#: NDR and RoCE results in tests/fixtures/nccl/real/perf.txt). The lower end, so a good node never fails.
BUSBW_SHARE = 0.8
#: A test output worth reading is a few MB even with NCCL_DEBUG=INFO; more is not an nccl-tests file.
MAX_BYTES = 64 * 1024 * 1024


class Unreadable(Exception):
    """The file cannot be read as text (missing, a directory, too large, not UTF-8): exit 2, never a pass."""


@dataclass(frozen=True)
class Expectation:
    busbw_gbps: float | None
    source: str  # " (the user's --expect-busbw)" or " (0.8 x 8 ACTIVE ports' 3200 Gb/s)"; "" when None


def fabric_expectation(ports: Iterable[RdmaPort]) -> Expectation:
    """The busbw this node's active RDMA ports should let a large all-reduce reach; None with no active port."""
    active = [p for p in ports if p.active and p.rate_gbps]
    if not active:
        return Expectation(None, "")
    line_gbps = sum(p.rate_gbps or 0.0 for p in active)
    expected = BUSBW_SHARE * line_gbps / 8  # Gb/s of the links to GB/s of nccl-tests
    noun = "port" if len(active) == 1 else "ports"
    return Expectation(expected, f" ({BUSBW_SHARE:g} x {len(active)} ACTIVE RDMA {noun}' {line_gbps:g} Gb/s)")


def user_expectation(busbw_gbps: float) -> Expectation:
    if not math.isfinite(busbw_gbps) or busbw_gbps <= 0:
        raise ValueError(f"--expect-busbw must be a positive number of GB/s, not {busbw_gbps!r}")
    return Expectation(busbw_gbps, " (--expect-busbw)")


def read_lines(path: str | Path) -> list[str]:
    """A test output's lines; ``Unreadable`` says why not."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_BYTES + 1)
    except OSError as exc:
        raise Unreadable(f"{path}: {exc.strerror or exc}") from None
    return decode(data, str(path))


def decode(data: bytes, name: str) -> list[str]:
    if len(data) > MAX_BYTES:
        raise Unreadable(f"{name}: larger than {MAX_BYTES // (1024 * 1024)} MiB, not an nccl-tests output")
    try:
        return data.decode("utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise Unreadable(f"{name}: not UTF-8 text (byte {exc.start})") from None


def verify(lines: Iterable[str], expectation: Expectation) -> tuple[Reading, Judgement]:
    reading = read_text(lines)
    return reading, judge(reading, expectation.busbw_gbps, expectation.source)


def check_result(reading: Reading, judgement: Judgement, name: str) -> CheckResult:
    """The verification as one line of ``mfu-exporter check``: FAIL unless the test passed."""
    perf = reading.perf
    observed = []
    if perf is not None and perf.rows:
        observed.append(
            f"{perf.collective or 'collective not shown'}: {judgement.measured_busbw_gbps} GB/s busbw at "
            f"{perf.largest_size_bytes} B"
        )
    if reading.transport is not None and reading.transport.transport is not None:
        observed.append(f"transport {reading.transport.transport}")
    observed.append(judgement.reasons[0] if judgement.reasons else judgement.verdict)
    expected = "no wrong values, RDMA between nodes (no expected busbw: no ACTIVE RDMA port)"
    if judgement.expected_busbw_gbps is not None:
        expected = f"busbw ≥ {MARGIN * judgement.expected_busbw_gbps:g} GB/s, no wrong values, RDMA between nodes"
    if judgement.verdict == "pass":
        return CheckResult("nccl.test", Status.PASS, "; ".join(observed), expected)
    return CheckResult(
        "nccl.test",
        Status.FAIL,
        f"{name}: " + "; ".join(observed),
        expected,
        "run `mfu-exporter nccl FILE` for every reason; check NCCL_IB_DISABLE, NCCL_NET, NCCL_IB_HCA and the ports "
        "(rdma.port_state), then rerun all_reduce_perf",
    )
