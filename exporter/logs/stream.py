"""One log file (or container log) from raw lines to records: transport, format detection, parsing.

``auto`` never guesses. A format is chosen only by a line that matches exactly one parser's anchor (a progress
line of that framework, or its unmistakable logger prefix); lines seen before that are kept (up to
``replay_lines``) and parsed once the format is known, so start-up facts printed before the first step are not
lost. A log with no such line in its first ``detect_lines`` lines is reported unrecognised, with the reason, once;
detection goes on, so a job that is slow to start still gets its format when its first step prints.
"""

from __future__ import annotations

import re
from collections import Counter, deque
from dataclasses import dataclass

from exporter.logs.base import Parser
from exporter.logs.deepspeed import DeepSpeedParser
from exporter.logs.hf import HfParser
from exporter.logs.megatron import MegatronParser
from exporter.logs.nemo import NemoParser
from exporter.logs.records import Line, Record
from exporter.logs.regex import RegexParser
from exporter.logs.torchtitan import TorchtitanParser
from exporter.logs.transport import Peeler, parse_rfc3339, split_line

PARSERS: dict[str, type[Parser]] = {
    "torchtitan": TorchtitanParser,
    "megatron": MegatronParser,
    "hf": HfParser,
    "nemo": NemoParser,
    "deepspeed": DeepSpeedParser,
}
FORMATS = ("auto", *PARSERS, "regex")
# What a line must contain to be worth trying during detection: every parser's keywords and its anchors' prefixes.
DETECT_KEYWORDS = tuple(sorted({k for cls in PARSERS.values() for k in cls.keywords or ()} | {"[titan] "}))


def keyword_pattern(keywords: tuple[str, ...] | None) -> re.Pattern | None:
    """One regex for "contains any of": a single C-level search per line instead of a Python loop."""
    return re.compile("|".join(map(re.escape, keywords))) if keywords else None


DETECT_PATTERN = keyword_pattern(DETECT_KEYWORDS)


UNRECOGNISED = (
    "no line of a known format in the first {lines} lines (torchtitan 'step: .. tps:', Megatron "
    "'iteration ../.. | consumed samples:', HF \"{{'loss': ..}}\", NeMo 'epoch .., iteration ../.. |', "
    "DeepSpeed 'SamplesPerSec='); set format, or format: regex with a pattern"
)


@dataclass(frozen=True)
class Event:
    """A record with the best time known for it and the writer it came from.

    ``time`` is the transport's (CRI/Docker, UTC, nanoseconds), else the line's own (the framework's prefix,
    local time), else when the exporter read it.
    """

    record: Record
    time: float
    origin: str


class LogStream:
    def __init__(
        self,
        format: str = "auto",
        pattern: str | None = None,
        container: str = "auto",
        detect_lines: int = 5000,
        replay_lines: int = 2000,
    ):
        if format not in FORMATS:
            raise ValueError(f"unknown format {format!r}; known: {', '.join(FORMATS)}")
        self.peeler = Peeler(container)
        self.errors: Counter = self.peeler.errors
        self.detect_lines = detect_lines
        self.lines = 0
        self.unrecognised: str | None = None
        if format == "regex":
            if not pattern:
                raise ValueError("format regex needs a pattern")
            self.parser: Parser | None = RegexParser(pattern)
        elif format == "auto":
            self.parser = None
            self._candidates = [cls() for cls in PARSERS.values()]
            self._pending: deque[tuple[Line, float]] = deque(maxlen=replay_lines)
        else:
            self.parser = PARSERS[format]()

    @property
    def parser(self) -> Parser | None:
        return self._parser

    @parser.setter
    def parser(self, parser: Parser | None) -> None:
        self._parser = parser
        self._keywords = keyword_pattern(parser.keywords) if parser is not None else None

    @property
    def format(self) -> str | None:
        return self.parser.name if self.parser else None

    def feed(self, raw: str, read_time: float) -> list[Event]:
        """Records of one raw line (CRI partial lines give none until their last segment)."""
        return self.feed_many([raw], read_time)

    def feed_many(self, raws: list[str], read_time: float) -> list[Event]:
        """Records of raw lines read together; the loop every line of a log goes through, so kept lean."""
        events: list[Event] = []
        unwrap = self.peeler.unwrap
        for raw in raws:
            for text, stamp in unwrap(raw):
                self.lines += 1
                parser = self._parser
                keywords = self._keywords if parser is not None else DETECT_PATTERN
                if keywords is not None and keywords.search(text) is None:
                    # Nothing any parser reads (or, while detecting, could decide on): skipped before any regex.
                    if parser is None:
                        self._undecided()
                    continue
                for line in split_line(text, parse_rfc3339(stamp) if stamp else None):
                    if self._parser is None:
                        self._detect(line, read_time, events)
                    else:
                        self._parse(line, read_time, events)
        return events

    def _undecided(self) -> None:
        if self.unrecognised is None and self.lines >= self.detect_lines:
            self.unrecognised = UNRECOGNISED.format(lines=self.lines)

    def _parse(self, line: Line, read_time: float, events: list[Event]) -> None:
        record = self.parser.parse(line)
        if record is not None:
            own = getattr(record, "time", None)
            when = line.time if line.time is not None else own if own is not None else read_time
            events.append(Event(record, when, line.origin))

    def _detect(self, line: Line, read_time: float, events: list[Event]) -> None:
        hits = [p for p in self._candidates if p.anchor.search(line.text)]
        if len(hits) == 1:
            self.parser = hits[0]
            self.unrecognised = None
            for old, old_read in self._pending:
                self._parse(old, old_read, events)
            self._pending.clear()
            self._parse(line, read_time, events)
            return
        if len(hits) > 1:
            self.errors["ambiguous_line"] += 1
        self._pending.append((line, read_time))
        self._undecided()
