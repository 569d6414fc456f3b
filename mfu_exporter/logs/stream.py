"""One log file (or container log) from raw lines to records: transport, format detection, parsing.

One definition of a line: the transport (``mfu_exporter.logs.transport``) peels container, launcher and colour layers
once, and both detection and every parser read that same ``Line``; each parser's ``anchor`` for progress is its
``candidate`` pattern, searched the same way by detection and by the parser.

``auto`` never guesses. A format is chosen only by a line that matches exactly one parser's anchor (a progress
line of that framework, or its unmistakable logger prefix); lines seen before that are kept (up to
``replay_lines``) and parsed once the format is known, so start-up facts printed before the first step are not
lost. A log with no such line in its first ``detect_lines`` lines is reported unrecognised, with the reason, once;
detection goes on, so a job that is slow to start still gets its format when its first step prints.

**Mixed logs.** Detection goes on after the first format (for the first ``MIXED_WINDOW`` progress lines): HF Trainer
or Megatron-DeepSpeed running on DeepSpeed print both frameworks' lines, and each detected framework reads its own.
Progress is taken from the framework whose progress is richest (``richness``: a running total first, then a step, a
rate or step time, FLOPs), by that rule and a fixed order of frameworks for a tie, never by which printed first; the
other's progress lines are left out (counted in ``left_out``), its start-up and checkpoint lines are kept.

**No silent zero.** A line of a detected framework's progress form (``Parser.candidate``) that gives no progress is
an unread line. While no progress has been read from the file, the first one sets ``no_progress`` (shown on the
status page and as the job's reason, counted as ``no_progress_read``); after progress was read,
``UNREAD_RUN`` unread lines in a row do. The next progress line clears it.
"""

from __future__ import annotations

import math
import re
from collections import Counter, deque
from dataclasses import dataclass, fields, replace

from mfu_exporter.logs.base import Parser
from mfu_exporter.logs.datawait import KEYWORDS as LINE_WAIT_KEYWORDS
from mfu_exporter.logs.deepspeed import DeepSpeedParser
from mfu_exporter.logs.hf import HfParser
from mfu_exporter.logs.lightning_csv import LightningCsvParser
from mfu_exporter.logs.megatron import MegatronParser
from mfu_exporter.logs.nemo import NemoParser
from mfu_exporter.logs.profiler_tables import KEYWORDS as TABLE_WAIT_KEYWORDS
from mfu_exporter.logs.profiler_tables import WaitReader
from mfu_exporter.logs.records import Line, Progress, Record
from mfu_exporter.logs.regex import RegexParser
from mfu_exporter.logs.torchtitan import TorchtitanParser
from mfu_exporter.logs.transport import Peeler, parse_rfc3339, split_line

PARSERS: dict[str, type[Parser]] = {
    "torchtitan": TorchtitanParser,
    "megatron": MegatronParser,
    "hf": HfParser,
    "nemo": NemoParser,
    "deepspeed": DeepSpeedParser,
}
# Formats read only when a file names them: their lines carry no keyword detection could find them by (CSV rows).
NAMED_ONLY: dict[str, type[Parser]] = {"lightning_csv": LightningCsvParser}
FORMATS = ("auto", *PARSERS, *NAMED_ONLY, "regex")
# What a line must contain to be worth trying during detection: every parser's keywords and its anchors' prefixes.
# What a line must contain to be worth a data-wait reader's look (``mfu_exporter.logs.datawait``, ``profiler_tables``).
WAIT_KEYWORDS = LINE_WAIT_KEYWORDS + TABLE_WAIT_KEYWORDS
WAIT_PATTERN = re.compile("|".join(map(re.escape, WAIT_KEYWORDS)))
DETECT_KEYWORDS = tuple(sorted({k for cls in PARSERS.values() for k in cls.keywords or ()} | {"[titan] "}))


def keyword_pattern(keywords: tuple[str, ...] | None) -> re.Pattern | None:
    """One regex for "contains any of": a single C-level search per line instead of a Python loop. A keyword that
    contains another is left out (the shorter one finds its lines), so the alternation stays short. The data-wait
    lines' keywords are always in: those lines are read whatever the format (``mfu_exporter.logs.datawait``)."""
    if not keywords:
        return None
    unique = sorted(set(keywords) | set(WAIT_KEYWORDS))
    needed = [k for k in unique if not any(other != k and other in k for other in unique)]
    return re.compile("|".join(map(re.escape, needed)))


DETECT_PATTERN = keyword_pattern(DETECT_KEYWORDS)


UNRECOGNISED = (
    "no line of a known format in the first {lines} lines (torchtitan 'step: .. tps:', Megatron "
    "'iteration ../.. | consumed samples:', HF \"{{'loss': ..}}\", NeMo 'epoch .., iteration ../.. |', "
    "DeepSpeed 'SamplesPerSec='); set format, or format: regex with a pattern"
)


# Progress lines after which no further framework is looked for: a mixed log's two frameworks print progress at
# their own cadences (DeepSpeed every steps_per_print, HF every logging_steps), both well within this many lines;
# past it a line is tried only by the detected frameworks' keywords, as cheap as a log of one framework.
MIXED_WINDOW = 100
# Unread progress-form lines in a row, once progress was read, before the stream says so: one garbled line among
# good ones is not a broken format.
UNREAD_RUN = 3
# Ties of richness go by this order (the frameworks whose lines carry more of what the job model wants first).
PRIORITY = ("regex", "megatron", "torchtitan", "nemo", "hf", "deepspeed", "lightning_csv")


def richness(record: Progress) -> int:
    """How much of what the job model wants one progress record carries: a running total counts most (it survives
    lost lines), then a step, then a rate or step time, then the framework's FLOPs."""
    return (
        4
        * any(
            v is not None
            for v in (
                record.tokens_seen,
                record.samples_seen,
                record.tokens_seen_per_device,
                record.samples_seen_per_device,
            )
        )
        + 2 * (record.step is not None)
        + any(v is not None for v in (record.tokens_per_second_per_gpu, record.samples_per_second, record.step_seconds))
        + (record.tflops_per_gpu is not None or record.mfu is not None)
    )


NAMED_UNSEEN = (
    "format {format} is set, but none of the first {lines} lines is its progress line: check the format, or set "
    "format: auto"
)


@dataclass(frozen=True)
class Event:
    """A record with the best time known for it, the writer it came from and the framework that read it.

    ``time`` is the transport's (CRI/Docker, UTC, nanoseconds), else the line's own (the framework's prefix,
    local time), else when the exporter read it.
    """

    record: Record
    time: float
    origin: str
    framework: str = ""


# A progress line's figures past this (a step, a token or sample count, a rate) are no training run's: 2^53 is also
# the largest integer a double holds exactly, so a line with one is skipped, never turned into a sample.
MAX_FIGURE = 2**53


def _in_bounds(record: Progress) -> bool:
    """Whether every number of the record is finite and no larger than ``MAX_FIGURE`` either way."""
    for value in (getattr(record, f.name) for f in fields(record)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if isinstance(value, int) and not -MAX_FIGURE <= value <= MAX_FIGURE:
            return False
        if isinstance(value, float) and not (math.isfinite(value) and abs(value) <= MAX_FIGURE):
            return False
    return True


class LogStream:
    def __init__(
        self,
        format: str = "auto",
        pattern: str | None = None,
        container: str = "auto",
        detect_lines: int = 5000,
        replay_lines: int = 2000,
        keep_all: bool = False,
    ):
        if format not in FORMATS:
            raise ValueError(f"unknown format {format!r}; known: {', '.join(FORMATS)}")
        self.peeler = Peeler(container)
        self.errors: Counter = self.peeler.errors
        self.detect_lines = detect_lines
        self.lines = 0
        self.unrecognised: str | None = None
        self.auto = format == "auto"
        # Every framework's progress is kept (measurement, tests); by default only the richest framework's.
        self.keep_all = keep_all
        self.active: list[Parser] = []
        self._candidates: list[Parser] = []
        self._pending: deque[tuple[Line, float]] = deque(maxlen=replay_lines)
        self._waits = WaitReader()
        if format == "regex":
            if not pattern:
                raise ValueError("format regex needs a pattern")
            self.active = [RegexParser(pattern)]
        elif self.auto:
            self._candidates = [cls() for cls in PARSERS.values()]
        else:
            self.active = [{**PARSERS, **NAMED_ONLY}[format]()]
        self._keywords = DETECT_PATTERN if self.auto else keyword_pattern(self.active[0].keywords)
        self._detect_keywords = keyword_pattern(tuple(k for p in self._candidates for k in p.anchor_keywords))
        self._best: dict[str, int] = {}  # per framework: the richest progress record it read
        self.progress_format: str | None = None
        self.left_out = 0  # progress lines of a poorer framework in a mixed log
        # The no-progress diagnosis.
        self.candidate_lines = 0
        self.progress_lines = 0
        self._unread_run = 0
        self._first_unread: str | None = None
        self.no_progress: str | None = None
        # Dating by the job's own clock (``_date_by_elapsed``): this batch's such events, the anchor, the last clock.
        self._elapsed: list[int] = []
        self._anchor: float | None = None
        self._last_elapsed = 0.0

    @property
    def parser(self) -> Parser | None:
        """The parser whose progress is taken (the first detected, before any progress)."""
        for parser in self.active:
            if parser.name == self.progress_format:
                return parser
        return self.active[0] if self.active else None

    @property
    def format(self) -> str | None:
        parser = self.parser
        return parser.name if parser else None

    @property
    def formats(self) -> list[str]:
        """Every framework detected in the file, in the order they were."""
        return [p.name for p in self.active]

    def feed(self, raw: str, read_time: float) -> list[Event]:
        """Records of one raw line (CRI partial lines give none until their last segment)."""
        return self.feed_many([raw], read_time)

    def feed_many(self, raws: list[str], read_time: float) -> list[Event]:
        """Records of raw lines read together; the loop every line of a log goes through, so kept lean."""
        events: list[Event] = []
        unwrap = self.peeler.unwrap
        for raw in raws:
            try:
                for text, stamp in unwrap(raw):
                    self.lines += 1
                    keywords = self._keywords  # narrows once a format is detected
                    if keywords is not None and keywords.search(text) is None:
                        # Nothing any parser reads (or, while detecting, could decide on): skipped before any regex.
                        if not self.active:
                            self._undecided()
                        continue
                    for line in split_line(text, parse_rfc3339(stamp) if stamp else None):
                        if WAIT_PATTERN.search(line.text) is not None and self._wait(line, read_time, events):
                            continue
                        # A line an active parser reads as progress is no other framework's; any other line may make
                        # one more framework detected (a mixed log), tried only when it holds one of their anchors' words.
                        if self.active and self._parse(line, read_time, events):
                            continue
                        detect = self._detect_keywords
                        if detect is not None and detect.search(line.text) and self._detect(line, read_time, events):
                            self._parse(line, read_time, events)
                        elif not self.active:
                            self._pending.append((line, read_time))
                            self._undecided()
            except Exception:  # noqa: BLE001 - a line that breaks a parser is skipped; the rest of the chunk is read
                self.errors["unreadable_line"] += 1
        if self._elapsed:
            self._date_by_elapsed(events)
        if not self.auto and self.unrecognised is None and self.lines >= self.detect_lines and not self.progress_lines:
            if not self.candidate_lines:  # a named format none of whose progress lines is in the log
                self.unrecognised = NAMED_UNSEEN.format(format=self.active[0].name, lines=self.lines)
        return events

    def _wait(self, line: Line, read_time: float, events: list[Event]) -> bool:
        """A data-loading line, read whatever the format (it decides none); whether it was one."""
        wait = self._waits.read(line.text, self.lines)
        if wait is None:
            return False
        when = line.time if line.time is not None else wait.time if wait.time is not None else read_time
        events.append(Event(wait, when, line.origin, wait.framework))
        return True

    def _undecided(self) -> None:
        if self.unrecognised is None and self.lines >= self.detect_lines:
            self.unrecognised = UNRECOGNISED.format(lines=self.lines)

    def _detect(self, line: Line, read_time: float, events: list[Event]) -> bool:
        """Whether the line makes one more framework detected (then it is to be read by it)."""
        hits = [p for p in self._candidates if p.anchor.search(line.text)]
        if len(hits) > 1:
            self.errors["ambiguous_line"] += 1
            return False
        if not hits:
            return False
        parser = hits[0]
        self._candidates.remove(parser)
        first = not self.active
        self.active.append(parser)
        # From now on a line is worth a look when an active parser may read it or it may detect one more framework.
        self._detect_keywords = keyword_pattern(tuple(k for p in self._candidates for k in p.anchor_keywords))
        self._keywords = keyword_pattern(
            tuple(k for p in self.active for k in p.keywords or ())
            + tuple(k for p in self._candidates for k in p.anchor_keywords)
        )
        self.unrecognised = None
        if first:  # the lines kept before any format was known, read by it now
            pending = list(self._pending)
            self._pending.clear()
            for old, old_read in pending:
                self._parse(old, old_read, events)
        return True

    def _parse(self, line: Line, read_time: float, events: list[Event]) -> bool:
        """Read the line with the active parsers; whether it was progress."""
        record = None
        parser = None
        for parser in self.active:
            record = parser.parse(line)
            if record is not None:
                break
        progress = isinstance(record, Progress)
        if progress and not _in_bounds(record):
            self.errors["value_out_of_range"] += 1  # skipped whole: one absurd figure makes the line untrustworthy
            return True
        if not progress:
            if any(p.candidate.search(line.text) for p in self.active):
                self._unread(line)
            if record is None:
                return False
        elif not self._progress(record, parser.name):
            return True
        own = getattr(record, "time", None)
        when = line.time if line.time is not None else own if own is not None else read_time
        if progress and line.time is None and own is None and record.elapsed is not None:
            self._elapsed.append(len(events))  # dated once the whole batch is read (``_date_by_elapsed``)
        events.append(Event(record, when, line.origin, parser.name))
        return progress

    def _date_by_elapsed(self, events: list[Event]) -> None:
        """Lines with no wall time but the job's own clock (``Progress.elapsed``) are dated ``anchor + elapsed``.
        The anchor is set once per run (again when the clock goes back: a new run) from the newest such line of the
        batch that first shows it, which was the last written: read time minus its elapsed. A file found late
        (its first rows are read up to a glob interval after they were written) then shifts every date by the same
        delay, and the time between two lines is the job's own, where read times would shorten the first interval
        by that delay."""
        indices, self._elapsed = self._elapsed, []
        for position, index in enumerate(indices):
            event = events[index]
            assert isinstance(event.record, Progress) and event.record.elapsed is not None
            elapsed = event.record.elapsed
            if self._anchor is None or elapsed < self._last_elapsed:
                newest = elapsed
                for later in indices[position + 1 :]:
                    record = events[later].record
                    assert isinstance(record, Progress) and record.elapsed is not None
                    if record.elapsed < newest:
                        break  # the run after this one
                    newest = record.elapsed
                self._anchor = event.time - newest
            self._last_elapsed = elapsed
            events[index] = replace(event, time=self._anchor + elapsed)

    def _progress(self, record: Progress, framework: str) -> bool:
        """Whether this progress record is taken: its framework is the richest in the file (or ``keep_all``)."""
        self.progress_lines += 1
        self._unread_run = 0
        self.no_progress = None
        if self.progress_lines == MIXED_WINDOW and self._candidates:
            self._candidates = []
            self._detect_keywords = None
            self._keywords = keyword_pattern(tuple(k for p in self.active for k in p.keywords or ()))
        score = richness(record)
        if score > self._best.get(framework, -1):
            self._best[framework] = score
            self.progress_format = max(self._best, key=lambda name: (self._best[name], -PRIORITY.index(name)))
        if self.keep_all or framework == self.progress_format:
            return True
        self.left_out += 1
        return False

    def _unread(self, line: Line) -> None:
        self.candidate_lines += 1
        if self._unread_run == 0:
            self._first_unread = line.text.strip()[:240]
        self._unread_run += 1
        if self.no_progress is None and (self.progress_lines == 0 or self._unread_run >= UNREAD_RUN):
            parser = next((p for p in self.active if p.candidate.search(line.text)), self.active[0])
            self.no_progress = (
                f"detected {'+'.join(self.formats)}, {self.lines} lines read, no progress read from the last "
                f"{self._unread_run} line(s) of {parser.name}'s progress form: first unread line "
                f"{self._first_unread!r}; {parser.unread_hint}"
            )
            self.errors["no_progress_read"] += 1
