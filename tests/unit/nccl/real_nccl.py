"""The real nccl-tests pastes and NCCL_DEBUG=INFO snippets of tests/fixtures/nccl/real/, read and scored.

Each block's ``expect:`` line is its truth, read by hand from the text (the fixture files' headers say how). A block is
right only when every field matches; the score is the share of real (not synthetic) blocks that are right.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from mfu_exporter.nccl.perf import judge, read_text, report
from tests.support.pastes import read_blocks

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "nccl"
PERF_KEYS = ("collective", "avg", "max", "largest", "rows", "ranks", "wrong")
DEBUG_KEYS = ("transport", "gdr", "fallback")


@dataclass
class Block:
    name: str
    headers: dict[str, str] = field(default_factory=dict)
    expect: dict[str, str] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)

    @property
    def synthetic(self) -> bool:
        return self.headers.get("synthetic") == "yes"


def load(name: str) -> list[Block]:
    """``name`` relative to tests/fixtures/nccl: ``real/perf.txt``, ``real/debug.txt``, ``synthetic/perf.txt``."""
    return [
        Block(
            b.name, b.headers, dict(token.partition("=")[::2] for e in b.expects[-1:] for token in e.split()), b.lines
        )
        for b in read_blocks(FIXTURES / name)
    ]


def _text(value: object) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _same(key: str, want: str, got: object) -> bool:
    if key in ("avg", "max") and want != "none" and isinstance(got, float):
        return abs(float(want) - got) < 1e-9
    return want == _text(got)


def perf_mismatches(block: Block) -> list[str]:
    """Each field of the block's truth the ``nccl`` command's JSON gets wrong, as "key: want != got"."""
    reading = read_text(block.lines)
    perf = report(reading, judge(reading, None))["perf"]
    got: dict[str, object] = dict.fromkeys(PERF_KEYS)
    if isinstance(perf, dict):
        got = {
            "collective": perf["collective"],
            "avg": perf["avg_busbw_gbps"],
            "max": perf["max_busbw_gbps"],
            "largest": perf["largest_size_bytes"],
            "rows": len(perf["rows"]),
            "ranks": perf["n_ranks"],
            "wrong": perf["wrong_nonzero"],
        }
    return [f"{k}: {block.expect[k]} != {_text(got[k])}" for k in PERF_KEYS if not _same(k, block.expect[k], got[k])]


def debug_mismatches(block: Block) -> list[str]:
    reading = read_text(block.lines)
    transport = report(reading, judge(reading, None))["transport"]
    got: dict[str, object] = {"transport": None, "gdr": None, "fallback": False}
    if isinstance(transport, dict):
        got = {
            "transport": transport["transport"],
            "gdr": transport["gdr"],
            "fallback": transport["fell_back_to_socket"],
        }
    return [f"{k}: {block.expect[k]} != {_text(got[k])}" for k in DEBUG_KEYS if block.expect[k] != _text(got[k])]


def score(blocks: list[Block], mismatches) -> tuple[int, int, dict[str, list[str]]]:
    real = [b for b in blocks if not b.synthetic]
    wrong = {b.name: m for b in real if (m := mismatches(b))}
    return len(real) - len(wrong), len(real), wrong
