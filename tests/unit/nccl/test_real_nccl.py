"""Scored on every run: real nccl-tests pastes and NCCL_DEBUG=INFO snippets from public GitHub issues.

Done when the ``nccl`` command gives the right average and largest busbw, largest size, row count, rank count and
wrong-value flag for at least 95 % of the real pastes, and the right transport and fallback for at least 95 % of
the real debug snippets. The synthetic blocks (layouts no real paste shows) must all be read exactly right.
"""

from __future__ import annotations

import re

import pytest

from tests.unit.nccl.real_nccl import debug_mismatches, load, perf_mismatches, score

THRESHOLD = 0.95


def _report(kind: str, right: int, total: int, wrong: dict[str, list[str]]) -> str:
    lines = [f"{kind}: {right}/{total} real blocks right ({right / total:.1%})"]
    lines += [f"  {name}: {'; '.join(why)}" for name, why in wrong.items()]
    return "\n".join(lines)


def test_real_nccl_tests_pastes_score() -> None:
    blocks = load("real/perf.txt")
    right, total, wrong = score(blocks, perf_mismatches)
    print(_report("nccl-tests", right, total, wrong))
    assert total >= 25
    assert right / total >= THRESHOLD, _report("nccl-tests", right, total, wrong)


def test_real_debug_snippets_score() -> None:
    blocks = load("real/debug.txt")
    right, total, wrong = score(blocks, debug_mismatches)
    print(_report("NCCL_DEBUG=INFO", right, total, wrong))
    assert total >= 15
    assert right / total >= THRESHOLD, _report("NCCL_DEBUG=INFO", right, total, wrong)


@pytest.mark.parametrize("name", ["real/perf.txt", "real/debug.txt"])
def test_every_real_block_names_its_source_and_truth(name: str) -> None:
    for block in load(name):
        assert not block.synthetic, block.name
        assert re.match(r"https://github\.com/[\w.-]+/[\w.-]+/(issues|pull)/\d+ \(", block.headers.get("source", "")), (
            block.name
        )
        assert block.lines, block.name
        assert block.expect, block.name


@pytest.mark.parametrize("block", load("synthetic/perf.txt"), ids=lambda b: b.name)
def test_synthetic_layouts_read_exactly(block) -> None:
    assert block.synthetic
    assert perf_mismatches(block) == []
