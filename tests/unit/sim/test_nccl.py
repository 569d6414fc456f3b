"""The demo's NCCL verification file (mfu_exporter/sim/nccl.py ``NcclTestsOutput``), read by the real readers: the
nccl-tests parser, the judge and the daemon's nccl source."""

from __future__ import annotations

from pathlib import Path

import pytest

from mfu_exporter.config import typed_config, validate
from mfu_exporter.nccl.perf import judge, read_text
from mfu_exporter.sim.nccl import NcclTestsOutput
from mfu_exporter.sources.nccl import NcclSource

HOSTS = ("demo-node-0", "demo-node-1")


@pytest.fixture
def written(tmp_path: Path) -> Path:
    return NcclTestsOutput(tmp_path, HOSTS).write("all_reduce_perf.txt", 362.0)


def test_the_file_reads_as_the_guides_all_reduce_across_both_nodes(written):
    reading = read_text(written.read_text().splitlines())
    perf = reading.perf
    assert perf is not None and reading.transport is None
    assert perf.collective == "all_reduce"
    assert perf.n_ranks == 16
    assert [row.size_bytes for row in perf.rows] == [8 << 20 << i for i in range(8)]  # -b 8M -e 1G -f 2
    assert not perf.busbw_mismatches()  # busbw = algbw x 2(n-1)/n in every row, as nccl-tests prints it
    assert perf.wrong_nonzero is False
    assert 0.95 * 362.0 < perf.largest_busbw_gbps < 362.0
    busbws = [half.busbw_gbps for row in perf.rows for half in (row.out_of_place, row.in_place)]
    assert perf.avg_busbw_gbps == pytest.approx(sum(busbws) / len(busbws), abs=1e-3)


def test_it_passes_against_the_demo_fabric_and_fails_against_a_faster_one(written):
    reading = read_text(written.read_text().splitlines())
    assert judge(reading, 320.0).verdict == "pass"  # 0.8 x 8 ACTIVE ports x 400 Gb/s
    failed = judge(reading, 400.0)
    assert failed.verdict == "fail"
    assert "below 0.9 x the expected 400 GB/s" in failed.reasons[0]


def test_the_nccl_source_exports_the_verification(written):
    section = typed_config(
        validate({"sources": {"nccl": {"tests_paths": [str(written.parent / "*.txt")], "expect_busbw": 320}}})
    )
    snapshot = NcclSource(section.sources.nccl).sample()
    test = snapshot.readings.test
    assert test is not None
    assert (test.verdict, test.passed) == ("pass", True)
    assert test.expected_bytes_per_second == 320e9
