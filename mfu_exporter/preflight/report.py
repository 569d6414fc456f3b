"""Preflight results as ``mfu-exporter check`` prints them: the summary, the JSON and the table."""

from __future__ import annotations

import textwrap
from collections import Counter
from typing import Iterable

from mfu_exporter.preflight.facts import CheckResult, Status


def summary(results: Iterable[CheckResult]) -> dict[str, int]:
    counts = Counter(r.status for r in results)
    return {status.value.lower(): counts.get(status, 0) for status in Status}


def results_json(results: list[CheckResult]) -> dict:
    return {
        "ok": all(r.status != Status.FAIL for r in results),
        "summary": summary(results),
        "results": [r.as_json() for r in results],
    }


TABLE_COLUMNS = ("CHECK", "STATUS", "OBSERVED", "EXPECTED", "FIX")
WRAP_WIDTHS = {"OBSERVED": 48, "EXPECTED": 40}  # the fix column is never wrapped, so it stays copy-pasteable


def render_table(results: list[CheckResult]) -> str:
    rows = [[r.check, r.status.value, r.observed, r.expected, r.fix] for r in results]
    cells = [
        [
            textwrap.wrap(value, WRAP_WIDTHS[column]) or [""] if column in WRAP_WIDTHS else [value]
            for column, value in zip(TABLE_COLUMNS, row)
        ]
        for row in rows
    ]
    widths = [
        max([len(column)] + [len(line) for row in cells for line in row[i]]) for i, column in enumerate(TABLE_COLUMNS)
    ]
    widths[-1] = 0  # last column unpadded

    def line(values: list[str]) -> str:
        return "  ".join(value.ljust(width) for value, width in zip(values, widths)).rstrip()

    out = [line(list(TABLE_COLUMNS))]
    for row in cells:
        for i in range(max(len(cell) for cell in row)):
            out.append(line([cell[i] if i < len(cell) else "" for cell in row]))
    counts = summary(results)
    out.append("")
    out.append(", ".join(f"{counts[s.value.lower()]} {s.value}" for s in Status))
    return "\n".join(out)


# --- command line -----------------------------------------------------------------------------------------------
