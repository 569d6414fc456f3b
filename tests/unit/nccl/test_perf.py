"""mfu_exporter.nccl.perf on the cases the real pastes do not pin down: prefixes, strictness with bad rows, runs."""

from __future__ import annotations

import pytest

from mfu_exporter.nccl.perf import judge, peel, read_text

ROW = "     1048576        262144     float     sum      -1    51.20   20.48   20.48      0    50.90   20.60   20.60      0"
HEADER = "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong"


@pytest.mark.parametrize(
    "prefix",
    ["", "[1,0]<stdout>:", "[1,12]<stderr>:", "0: ", "  3: ", "(pid=4242) ", "(head, rank=0, pid=4242) ",
     "(RayTrainWorker pid=1585, ip=10.0.0.1) ", "[1,0]<stdout>:0: "],
)  # fmt: skip
def test_launcher_prefixes_are_peeled(prefix: str) -> None:
    assert peel(prefix + ROW) == ROW
    run = read_text([prefix + HEADER, prefix + ROW]).perf
    assert run is not None and len(run.rows) == 1 and run.rows[0].size_bytes == 1048576


@pytest.mark.parametrize(
    "line",
    [
        "     1048576        262144     float     sum      -1   -51.20   20.48   20.48      0    50.90   20.60   20.60      0",
        "     1048576        262144     float     sum      -1    51.20   twenty  20.48      0    50.90   20.60   20.60      0",
        "     1048576        262144     float     sum      -1    51.20   20.48   20.48      0    50.90   20.60",
        "     1048576        262144     float     sum      -1    51.20   20.48   20.48     -3    50.90   20.60   20.60      0",
        "   1048576.5        262144     float     sum      -1    51.20   20.48   20.48      0    50.90   20.60   20.60      0",
        "8 x H100 80GB with 400 Gb/s each and more words here",
    ],
    ids=["negative time", "word in a number", "half cut off", "negative wrong", "fractional size", "prose"],
)
def test_bad_rows_are_not_rows(line: str) -> None:
    run = read_text([HEADER, line]).perf
    assert run is not None and run.rows == ()


def test_non_finite_figures_stay_null() -> None:
    run = read_text([HEADER, ROW.replace("20.48   20.48", "  inf    -nan")]).perf
    assert run is not None
    half = run.rows[0].out_of_place
    assert half is not None and (half.algbw_gbps, half.busbw_gbps) == (None, None)
    assert run.max_busbw_gbps is None
    assert "not a number" in " ".join(
        judge(read_text([HEADER, ROW.replace("20.48   20.48", "  inf    -nan")]), None).reasons
    )


def test_only_the_first_run_is_read() -> None:
    first = ["# nThread 1 nGpus 1 minBytes 1048576 maxBytes 1048576 step: 2(factor)", HEADER, ROW,
             "# Avg bus bandwidth    : 20.54 "]  # fmt: skip
    second = ["# nThread 1 nGpus 1 minBytes 2097152 maxBytes 2097152 step: 2(factor)", HEADER,
              ROW.replace("1048576 ", "2097152 "), "# Avg bus bandwidth    : 30.1 "]  # fmt: skip
    reading = read_text(first + second + second)
    assert reading.perf is not None
    assert (reading.perf.avg_busbw_gbps, len(reading.perf.rows), reading.perf.more_runs) == (20.54, 1, 2)
    assert any("2 more test runs" in r for r in judge(reading, None).reasons)


def test_out_of_bounds_values_fail() -> None:
    reading = read_text([HEADER, ROW, "# Out of bounds values : 3 FAILED", "# Avg bus bandwidth    : 20.54 "])
    assert judge(reading, None).verdict == "fail"


def test_nothing_is_unreadable() -> None:
    assert judge(read_text([]), None).verdict == "unreadable"
    assert judge(read_text(["NCCL version 2.18.3+cuda12.2", "loss 2.3"]), None).verdict == "unreadable"
