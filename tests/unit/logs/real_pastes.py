"""The real pasted training-log lines of tests/fixtures/logs/real/pastes.txt, read and scored.

Shared by the test per paste (tests/unit/logs/test_real_pastes.py) and ``bench/logs.py``, which both print the share of
real progress lines read right in auto mode, and the progress read from lines that are none (false progress).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from pathlib import Path

from mfu_exporter.logs import LogStream, Progress
from mfu_exporter.logs.base import local_time
from mfu_exporter.logs.transport import parse_rfc3339
from tests.support.pastes import read_blocks

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "logs" / "real" / "pastes.txt"
READ_TIME = 2_000_000_000.0  # far from every paste's own time, so a line's time is never mistaken for it
INTS = {"step", "global_batch"}


@dataclass
class Paste:
    name: str
    headers: dict[str, str] = field(default_factory=dict)
    expects: list[tuple[str | None, dict]] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)

    @property
    def synthetic(self) -> bool:
        return self.headers.get("synthetic") == "yes"


def parse_expect(text: str) -> tuple[str | None, dict]:
    framework = None
    values: dict = {}
    for token in text.split():
        if token.startswith("[") and token.endswith("]"):
            framework = token[1:-1]
            continue
        key, _, value = token.partition("=")
        if key == "time":  # local, as the line prints it, unless it names its zone
            zoned = value.endswith("Z") or "+" in value or value.count("-") > 2
            values[key] = parse_rfc3339(value) if zoned else local_time(value)
        elif key == "rounded":
            values[key] = value == "yes"
        elif key in INTS:
            values[key] = int(value)
        else:
            values[key] = float(value)
    return framework, values


def load(path: Path = FIXTURE) -> list[Paste]:
    return [Paste(b.name, b.headers, [parse_expect(e) for e in b.expects], b.lines) for b in read_blocks(path)]


def mismatch(event, framework: str | None, expected: dict) -> str | None:
    """Why a progress event is not the expected reading of its line, or None when it is."""
    record: Progress = event.record
    if framework is not None and event.framework != framework:
        return f"read by {event.framework}, expected {framework}"
    for f in fields(Progress):
        if f.name == "time":
            continue
        got, want = getattr(record, f.name), expected.get(f.name, False if f.name == "rounded" else None)
        if want is None or isinstance(want, bool):
            if got != want:
                return f"{f.name}={got!r}, expected {want!r}"
        elif got is None or not math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-9):
            return f"{f.name}={got!r}, expected {want!r}"
    if "time" in expected and not math.isclose(event.time, expected["time"], abs_tol=1e-3):
        return f"time={event.time!r}, expected {expected['time']!r}"
    return None


@dataclass
class Reading:
    paste: Paste
    stream: LogStream
    progress: list  # every framework's progress events, in order
    wrong: list[str]  # one entry per expected progress line not read right

    @property
    def right(self) -> int:
        return len(self.paste.expects) - len(self.wrong)

    @property
    def false_progress(self) -> int:
        return max(len(self.progress) - len(self.paste.expects), 0)


def read(paste: Paste, keep_all: bool = True) -> Reading:
    """The paste's lines through the logs' own path in auto mode (transport, detection, parsers)."""
    stream = LogStream("auto", keep_all=keep_all)
    events = stream.feed_many(paste.lines, READ_TIME)
    progress = [e for e in events if isinstance(e.record, Progress)]
    wrong = []
    for index, (framework, expected) in enumerate(paste.expects):
        if index >= len(progress):
            wrong.append(f"line {index + 1}: no progress read")
            continue
        why = mismatch(progress[index], framework, expected)
        if why:
            wrong.append(f"line {index + 1}: {why}")
    return Reading(paste, stream, progress, wrong)


def share(pastes: list[Paste] | None = None) -> dict:
    """Real progress lines read right in auto mode, and false progress, over the fixture's real pastes."""
    readings = [read(p) for p in (pastes or load()) if not p.synthetic]
    lines = sum(len(r.paste.expects) for r in readings)
    right = sum(r.right for r in readings)
    return {
        "pastes": len(readings),
        "progress_lines": lines,
        "read_right": right,
        "share": right / lines if lines else 0.0,
        "false_progress": sum(r.false_progress for r in readings),
        "wrong": {r.paste.name: r.wrong for r in readings if r.wrong or r.false_progress},
    }


def summary_line(result: dict) -> str:
    return (
        f"real training-log pastes: {result['read_right']}/{result['progress_lines']} progress lines read right in "
        f"auto mode ({100 * result['share']:.1f} %, target >= 95 %) over {result['pastes']} pastes; "
        f"false progress from other lines: {result['false_progress']}"
    )
