"""What every format parser shares: the interface, number and timestamp helpers."""

from __future__ import annotations

import re
import time
from typing import ClassVar, Protocol

from mfu_exporter.logs.records import Line, Record

# Python logging's asctime (``%Y-%m-%d %H:%M:%S,mmm``) and Megatron's datetime.now() forms. Both are the training
# process's local time with no zone: read as this machine's local time (the exporter runs on the same node, and a
# container that logs in UTC usually sits on a node in UTC). Where the transport has its own time (CRI, Docker
# JSON, always UTC), the stream prefers that one.
LOCAL_STAMP = re.compile(r"(\d{4})-(\d\d)-(\d\d)[ T](\d\d):(\d\d):(\d\d)(?:[.,](\d{1,9}))?")
# A logger's time at the start of a line, bracketed or not, with or without a level before it: DeepSpeed's
# "[2023-07-25 21:03:17,269] [INFO]", its 2020 form "[INFO 2020-06-08 05:26:19]", ezpz's "[2024-10-13 10:35:15.801675][INFO]".
LEADING_TIME = re.compile(r"^\s*\[?(?:[A-Z]+ )?(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d{1,9})?)")


def local_time(text: str | None) -> float | None:
    if not text:
        return None
    match = LOCAL_STAMP.match(text)
    if not match:
        return None
    year, month, day, hour, minute, second, fraction = match.groups()
    try:
        seconds = time.mktime((int(year), int(month), int(day), int(hour), int(minute), int(second), 0, 0, -1))
    except (OverflowError, ValueError):
        return None
    if fraction:
        seconds += int(fraction) / 10 ** len(fraction)
    return seconds


def leading_time(text: str) -> float | None:
    """The local time a logger printed at the start of ``text``, if any."""
    match = LEADING_TIME.match(text)
    return local_time(match.group(1)) if match else None


def number(text: str | None) -> float | None:
    """A printed number: thousands separators allowed (torchtitan's ``6,875``); None for N/A or garbage."""
    if text is None:
        return None
    try:
        value = float(text.replace(",", ""))
    except ValueError:
        return None
    return value if value == value and value not in (float("inf"), float("-inf")) else None


def integer(text: str | None) -> int | None:
    value = number(text)
    return int(value) if value is not None and value == int(value) else None


class Searcher(Protocol):
    def search(self, text: str) -> object: ...


class AnyOf:
    """Patterns searched one after another. Faster than one alternation, which tries every alternative at every
    position of a line: each pattern here begins with a literal or ``^``, which the regex engine skips to at once."""

    def __init__(self, *patterns: str):
        self.patterns = [re.compile(p) for p in patterns]

    def search(self, text: str) -> re.Match | None:
        for pattern in self.patterns:
            match = pattern.search(text)
            if match:
                return match
        return None


class Parser:
    """One framework's lines. ``anchor`` is a pattern only this framework's progress or start-up lines match:
    detection (``auto``) decides on it and nothing weaker. ``parse`` returns a record or None."""

    name: ClassVar[str]
    anchor: ClassVar[Searcher]
    # What this framework's progress lines look like (searched in the peeled line, as ``anchor``): a line that matches
    # it but gives no progress record is an unread progress line, which the stream reports rather than dropping
    # silently. Every ``anchor`` alternative for progress is one of these, so detection and reading agree.
    candidate: ClassVar[Searcher]
    # Substrings one of which every ``anchor`` match contains: detection tries the anchor only on such lines.
    anchor_keywords: ClassVar[tuple[str, ...]] = ()
    # Said with an unread line: what to do about it.
    unread_hint: ClassVar[str] = (
        "the line does not read as this framework's progress line: set format: regex with a pattern for it "
        "(and report the line)"
    )
    # Substrings one of which every line this parser can read contains: a line with none is skipped before any
    # regex or prefix peeling (most of a training log is NCCL and warnings). None: every line is tried.
    keywords: ClassVar[tuple[str, ...] | None] = None
    # Frameworks that print a save's start but never its end (HF, DeepSpeed): the stream ends the save at the
    # next progress line, since a synchronous save blocks training.
    ends_saves_at_next_step: ClassVar[bool] = False

    def parse(self, line: Line) -> Record | None:
        raise NotImplementedError
