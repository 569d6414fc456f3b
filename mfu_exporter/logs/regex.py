"""``format: regex``: any other framework, by a pattern with named groups.

The groups a pattern may name are the ``Progress`` fields: ``step``, ``time`` (Unix seconds, RFC 3339, or a local
``YYYY-mm-dd HH:MM:SS[.,frac]``), ``tokens_seen`` and ``samples_seen`` (global running totals),
``tokens_per_second_per_gpu``, ``samples_per_second`` (global), ``global_batch``, ``step_seconds``,
``tflops_per_gpu`` and ``mfu`` (a ratio, or a percentage when the text ends in ``%``). The pattern is searched in
each line (``re.search``); a line it does not match is ignored.
"""

from __future__ import annotations

import re

from mfu_exporter.config import LOG_PROGRESS_GROUPS, LOG_REGEX_GROUPS
from mfu_exporter.logs.base import Parser, integer, local_time, number
from mfu_exporter.logs.records import Line, Progress, Record
from mfu_exporter.logs.transport import parse_rfc3339

# The groups a pattern may name are the ones the config accepts: one list, checked when the file is read.
GROUPS = LOG_REGEX_GROUPS
# One of these makes a match progress: a step alone gives no tokens, but it can carry tokens from jobs.<job>.
PROGRESS_GROUPS = LOG_PROGRESS_GROUPS


def check_pattern(pattern: str) -> str | None:
    """Why ``pattern`` cannot be used, or None."""
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        return f"not a regular expression ({exc})"
    unknown = sorted(set(compiled.groupindex) - set(GROUPS))
    if unknown:
        return f"unknown group name(s) {', '.join(unknown)}; known: {', '.join(GROUPS)}"
    if not set(compiled.groupindex) & set(PROGRESS_GROUPS):
        return f"names none of the groups {', '.join(PROGRESS_GROUPS)}"
    return None


def parse_time(text: str | None) -> float | None:
    if not text:
        return None
    value = number(text)
    if value is not None:
        return value
    return parse_rfc3339(text) or local_time(text)


class RegexParser(Parser):
    name = "regex"
    anchor = re.compile(r"(?!)")  # never chosen by auto: a user pattern is named, not detected
    candidate = anchor  # a line the pattern matches is always progress

    def __init__(self, pattern: str):
        self.pattern = re.compile(pattern)

    def parse(self, line: Line) -> Record | None:
        match = self.pattern.search(line.text)
        if not match:
            return None
        groups = match.groupdict()
        mfu_text = groups.get("mfu")
        mfu = number(mfu_text.rstrip("% ")) if mfu_text else None
        if mfu is not None and mfu_text.rstrip().endswith("%"):
            mfu /= 100
        return Progress(
            step=integer(groups.get("step")),
            time=parse_time(groups.get("time")),
            tokens_seen=number(groups.get("tokens_seen")),
            samples_seen=number(groups.get("samples_seen")),
            tokens_per_second_per_gpu=number(groups.get("tokens_per_second_per_gpu")),
            samples_per_second=number(groups.get("samples_per_second")),
            global_batch=integer(groups.get("global_batch")),
            step_seconds=number(groups.get("step_seconds")),
            tflops_per_gpu=number(groups.get("tflops_per_gpu")),
            mfu=mfu,
        )
