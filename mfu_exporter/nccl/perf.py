"""An nccl-tests run as people have it (a log file, a paste), read into its table, and the judgement of it.

The layout (NVIDIA/nccl-tests ``src/util.cu``, ../shared/reference/collectives-and-input.md), every version since
2019 read by one parser:

- header: ``# nccl-tests version 2.19.6 ...`` (2.18+), ``# Collective test starting: all_reduce_perf`` (2.17+),
  ``# nThread 1 nGpus 1 minBytes ... agg iters: 1 ...``, ``# Using devices`` and one line per rank,
  ``#  Rank  0 Group  0 Pid  1234 on host device  0 [0x18] NVIDIA H100`` (no ``Group`` before 2.x);
- the column header ``size count type redop root`` (old tests print fewer of the three last ones) then, out-of-place
  and again in-place, ``time algbw busbw #wrong`` (``error`` before ~2021: the largest floating-point error, not a
  count), each followed by ``i_min i_max i_p99 i_cv%`` with ``-I 1`` and a timestamp with ``-Z``;
- a row per size; ``#wrong`` is ``N/A`` when not checked and ``%g`` (``1.04858e+06``) when large; a trace replay
  leaves the out-of-place half blank;
- footer: ``# Out of bounds values : 0 OK``, ``# Avg bus bandwidth    : 21.4 [OK|FAILED]``.

As pasted: launcher prefixes (Open MPI ``[1,0]<stdout>:``, srun ``0: ``, Ray ``(pid=...)`` and
``(head, rank=0, pid=...)``), ``NCCL INFO`` lines between rows, GitHub's Markdown eating a leading ``#``, cut-off
tables. A value the text does not show stays None, never guessed. Pure: no files.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Iterable, Literal

from mfu_exporter.nccl.debug import TransportFinding, TransportScanner

#: busbw = algbw x factor(n) (nccl-tests doc/PERFORMANCE.md).
_FACTORS = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "sendrecv": lambda n: 1.0,
}

_PREFIXES = (
    re.compile(r"\[\d+,\d+\]<(?:stdout|stderr)>:"),  # mpirun --tag-output (no space after it)
    re.compile(r"\((?:[^()]*?[\s,])?pid=\d+[^()]*\)\s?"),  # Ray: (pid=1), (head, rank=0, pid=1), (Worker pid=1, ip=..)
    re.compile(r"\s*\d+:\s"),  # srun --label
)
_VERSION = re.compile(r"#?\s*nccl-tests version\s+(?P<v>\S+)")
_STARTING = re.compile(r"#?\s*Collective test (?:starting|concluded):\s*(?P<name>\w+?)(?:_perf\w*)?\s*$")
_NTHREAD = re.compile(r"#?\s*nThread\s+\d+\s+nGpus\s+\d+\s+minBytes\s+\d+")
_RANK = re.compile(r"#?\s*Rank\s+(?P<rank>\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(?P<host>\S+)\s+device\b")
_HEADER = re.compile(r"#?\s*size\s+count\s+type\b(?P<rest>.*)$")
_AVG = re.compile(r"#?\s*Avg bus bandwidth\s*:\s*(?P<value>\S+)(?:\s+(?P<check>OK|FAILED))?")
_OOB = re.compile(r"#?\s*Out of bounds values\s*:\s*(?P<n>\d+)")
_COMMAND = re.compile(
    r"\b(?P<name>all_reduce|all_gather|reduce_scatter|alltoall|broadcast|reduce|sendrecv|alltoallv|gather|scatter|"
    r"hypercube)_perf(?:_\w+)?\b"  # all_reduce_perf_mpi: the MPI build some images ship beside the plain one
)

_INT = re.compile(r"-?\d+$")
_WORD = re.compile(r"[A-Za-z_][\w]*$")
_TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\d|\d\d:\d\d:\d\d")


@dataclass(frozen=True)
class Half:
    """One half of a row (out-of-place or in-place). ``wrong`` is the ``#wrong`` count; None for ``N/A`` and for
    the old ``error`` column (a floating-point error, not a count)."""

    time_us: float | None
    algbw_gbps: float | None
    busbw_gbps: float | None
    wrong: float | None

    def json(self) -> dict[str, float | None]:
        return {
            "time_us": self.time_us,
            "algbw_gbps": self.algbw_gbps,
            "busbw_gbps": self.busbw_gbps,
            "wrong": self.wrong,
        }


@dataclass(frozen=True)
class Row:
    size_bytes: int
    count: int
    type: str
    redop: str | None
    out_of_place: Half | None
    in_place: Half | None

    def json(self) -> dict[str, object]:
        return {
            "size_bytes": self.size_bytes,
            "count": self.count,
            "type": self.type,
            "redop": self.redop,
            "out_of_place": None if self.out_of_place is None else self.out_of_place.json(),
            "in_place": None if self.in_place is None else self.in_place.json(),
        }


@dataclass(frozen=True)
class PerfRun:
    """One nccl-tests run as the text shows it (the first run, where a text holds several)."""

    collective: str | None
    rows: tuple[Row, ...]
    avg_busbw_gbps: float | None
    avg_check: str | None  # "OK" / "FAILED" after the average when NCCL_TESTS_MIN_BW is set
    n_ranks: int | None
    wrong_column: Literal["#wrong", "error"] | None
    out_of_bounds: int | None
    version: str | None
    more_runs: int  # further runs in the text, not read

    @property
    def max_busbw_gbps(self) -> float | None:
        values = [
            r.out_of_place.busbw_gbps for r in self.rows if r.out_of_place and r.out_of_place.busbw_gbps is not None
        ]
        return max(values) if values else None

    @property
    def largest_size_bytes(self) -> int | None:
        return self.rows[-1].size_bytes if self.rows else None

    @property
    def largest_busbw_gbps(self) -> float | None:
        """The out-of-place busbw of the last row (in-place where the row has no out-of-place half)."""
        if not self.rows:
            return None
        last = self.rows[-1]
        half = last.out_of_place or last.in_place
        return None if half is None else half.busbw_gbps

    @property
    def wrong_nonzero(self) -> bool | None:
        if self.wrong_column != "#wrong":
            return None
        counts = [h.wrong for r in self.rows for h in (r.out_of_place, r.in_place) if h and h.wrong is not None]
        if not counts:
            return None
        return any(c > 0 for c in counts)

    def busbw_mismatches(self) -> list[Row]:
        """Rows whose busbw is not algbw x the collective's factor for ``n_ranks`` (print rounding allowed)."""
        factor_of = _FACTORS.get(self.collective or "")
        if factor_of is None or not self.n_ranks:
            return []
        factor = factor_of(self.n_ranks)
        bad = []
        for row in self.rows:
            for half in (row.out_of_place, row.in_place):
                if half is None or half.algbw_gbps is None or half.busbw_gbps is None:
                    continue
                want = half.algbw_gbps * factor
                # algbw and busbw are printed to 2 decimals (1 or 0 past 1000 GB/s): half a unit of each.
                if abs(half.busbw_gbps - want) > 0.011 * max(factor, 1.0) + 0.01 * max(want, half.busbw_gbps):
                    bad.append(row)
                    break
        return bad

    def json(self) -> dict[str, object]:
        return {
            "collective": self.collective,
            "rows": [r.json() for r in self.rows],
            "avg_busbw_gbps": self.avg_busbw_gbps,
            "max_busbw_gbps": self.max_busbw_gbps,
            "largest_size_bytes": self.largest_size_bytes,
            "n_ranks": self.n_ranks,
            "wrong_nonzero": self.wrong_nonzero,
        }


def peel(line: str) -> str:
    """The line without the launchers' prefixes (nested in any order) and its line end."""
    text = line.rstrip("\r\n")
    changed = True
    while changed:
        changed = False
        for prefix in _PREFIXES:
            m = prefix.match(text)
            if m is not None and m.end() > 0:
                text = text[m.end() :]
                changed = True
    return text


# What a figure of nccl-tests may be; a row with one past these is not read, since no fabric or run reaches them
# and the verification exports them.
MAX_BUSBW_GBPS = 1e4  # 10 TB/s: several times the fastest NVLink a GPU has
MAX_TIME_US = 3.6e9  # an hour for one collective
MAX_SIZE_DIGITS = 16  # sizes and counts up to 10^16 (beyond any GPU's memory)
MAX_RANKS = 1 << 24
MAX_LINE_CHARS = 64 << 10  # of one line: nccl-tests' rows are a few hundred characters


def _number(token: str, upper: float = math.inf) -> float | None:
    """A printed figure; None for N/A, for what is not finite (nan, inf) and for what is over ``upper``."""
    try:
        value = float(token)
    except ValueError:
        return None
    return value if math.isfinite(value) and value <= upper else None


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return token == "N/A"
    return True


def _count(token: str) -> bool:
    """A size or an element count as nccl-tests prints it: ASCII digits, no more than ``MAX_SIZE_DIGITS``."""
    return token.isascii() and token.isdigit() and len(token) <= MAX_SIZE_DIGITS


@dataclass
class _Layout:
    half: int = 4  # fields per half: time algbw busbw wrong (+ i_min i_max i_p99 i_cv%)
    wrong_column: Literal["#wrong", "error"] | None = None


def _layout(rest: str) -> _Layout:
    names = rest.split()
    layout = _Layout()
    if "error" in names:
        layout.wrong_column = "error"
    elif any(n.lstrip("#") == "wrong" for n in names):
        layout.wrong_column = "#wrong"
    if "i_min" in names:
        layout.half = 8
    return layout


def _half(fields: list[str], layout: _Layout) -> Half | None:
    time, algbw, busbw, wrong = (fields + [""] * 4)[:4]
    values = [_number(time), _number(algbw), _number(busbw)]
    if any(v is not None and v < 0 for v in values):
        return None
    uppers = (MAX_TIME_US, math.inf, MAX_BUSBW_GBPS)  # algbw of an in-place copy on one GPU is any figure
    if any(v is not None and v > upper for v, upper in zip(values, uppers)):
        return None
    wrong_value = None if layout.wrong_column == "error" else _number(wrong)
    if wrong_value is not None and wrong_value < 0:
        return None
    return Half(values[0], values[1], values[2], wrong_value)


def _row(text: str, layout: _Layout) -> Row | None:
    tokens = text.split()
    if len(tokens) < 7 or not (_count(tokens[0]) and _count(tokens[1]) and _WORD.match(tokens[2])):
        return None
    i = 3
    redop = None
    if not _is_number(tokens[i]):
        if not _WORD.match(tokens[i]):
            return None
        redop = tokens[i]
        i += 1
    rest = tokens[i:]
    while rest and _TIMESTAMP.match(rest[-1]):
        rest.pop()
    if not all(_is_number(t) for t in rest):
        return None
    half = layout.half
    if len(rest) % half == 1 and _INT.match(rest[0]):
        rest = rest[1:]  # the root
    if len(rest) == 2 * half:
        out, inp = _half(rest[:half], layout), _half(rest[half:], layout)
        if out is None or inp is None:
            return None
    elif len(rest) == half and re.search(r"\S {30,}\S", text):
        out, inp = None, _half(rest, layout)  # a trace replay: the out-of-place half left blank
        if inp is None:
            return None
    else:
        return None
    return Row(int(tokens[0]), int(tokens[1]), tokens[2], redop, out, inp)


class _PerfReader:
    def __init__(self) -> None:
        self.collective: str | None = None
        self.command_names: list[str] = []
        self.rows: list[Row] = []
        self.avg: float | None = None
        self.avg_check: str | None = None
        self.ranks: set[int] = set()
        self.layout = _Layout()
        self.header_seen = False
        self.oob: int | None = None
        self.version: str | None = None
        self.more_runs = 0
        self.done = False
        self.seen = False  # any line of nccl-tests at all

    def _next_run(self, counts: bool) -> bool:
        """A new run's header after this one's rows: the rest of the text is another run (each run prints one
        ``nThread`` line; ``counts`` when the header that ends this run is not followed by one)."""
        if self.rows or self.avg is not None:
            self.done = True
            self.more_runs += int(counts)
            return True
        return False

    def feed(self, text: str) -> None:
        s = text.strip()
        if not s:
            return
        if self.done:
            self.more_runs += int(bool(_NTHREAD.match(s)))
            return
        m = _VERSION.match(s)
        if m:
            if not self._next_run(False):
                self.version, self.seen = m.group("v"), True
            return
        m = _STARTING.match(s)
        if m:
            if "starting" in s and self._next_run(False):
                return
            self.collective = self.collective or m.group("name")
            self.seen = True
            return
        if _NTHREAD.match(s):
            if not self._next_run(True):
                self.seen = True
            return
        m = _RANK.match(s)
        if m:
            if not self.rows and int(m.group("rank")) < MAX_RANKS:
                self.ranks.add(int(m.group("rank")))
            self.seen = True
            return
        m = _HEADER.match(s)
        if m:
            if self.rows and self._next_run(True):
                return
            self.layout = _layout(m.group("rest"))
            self.header_seen = self.seen = True
            return
        m = _AVG.match(s)
        if m:
            if self.avg is None:
                self.avg, self.avg_check = _number(m.group("value"), MAX_BUSBW_GBPS), m.group("check")
            self.seen = True
            return
        m = _OOB.match(s)
        if m:
            self.oob = int(m.group("n"))
            self.seen = True
            return
        if s[0].isdigit():
            if self.avg is not None:
                return  # rows after the footer belong to no table of this run
            layout = self.layout
            if not self.header_seen and layout.wrong_column is None and re.search(r"\s0e\+00\b", s):
                layout = self.layout = _Layout(layout.half, "error")  # a table cut above its header, 2019 layout
            row = _row(s, layout)
            if row is not None:
                self.rows.append(row)
                self.seen = True
            return
        if "NCCL INFO" not in s and not self.rows:
            for name in _COMMAND.findall(s):
                if name not in self.command_names:
                    self.command_names.append(name)

    def run(self) -> PerfRun | None:
        if not self.seen:
            return None
        collective = self.collective
        if collective is None and len(self.command_names) == 1:
            collective = self.command_names[0]
        layout = self.layout
        if layout.wrong_column is None and self.rows and not self.header_seen:
            layout.wrong_column = (
                "#wrong"
                if any(h.wrong is not None for r in self.rows for h in (r.out_of_place, r.in_place) if h)
                else None
            )
        return PerfRun(
            collective=collective,
            rows=tuple(self.rows),
            avg_busbw_gbps=self.avg,
            avg_check=self.avg_check,
            n_ranks=max(self.ranks) + 1 if self.ranks else None,
            wrong_column=layout.wrong_column,
            out_of_bounds=self.oob,
            version=self.version,
            more_runs=self.more_runs,
        )


@dataclass(frozen=True)
class Reading:
    """What one text holds: an nccl-tests run and what NCCL's INFO lines say about the transport."""

    perf: PerfRun | None
    transport: TransportFinding | None
    lines: int = 0
    skipped: int = 0  # lines that broke the parser, each skipped on its own


def read_text(lines: Iterable[str]) -> Reading:
    reader = _PerfReader()
    scanner = TransportScanner()
    n = skipped = 0
    for line in lines:
        n += 1
        try:
            text = peel(line[:MAX_LINE_CHARS])
            if "NCCL INFO" in text:
                scanner.feed(text)
                continue
            reader.feed(text)
        except Exception:  # noqa: BLE001 - one line that breaks the reader is skipped; the rest is still read
            skipped += 1
    return Reading(reader.run(), scanner.finding(), n, skipped + scanner.skipped)


Verdict = Literal["pass", "fail", "unreadable"]

#: nccl-tests' own check: an average below 0.9 x NCCL_TESTS_MIN_BW is FAILED. The same margin applies to the
#: expected figure here.
MARGIN = 0.9


@dataclass(frozen=True)
class Judgement:
    verdict: Verdict
    reasons: tuple[str, ...] = field(default_factory=tuple)
    expected_busbw_gbps: float | None = None
    measured_busbw_gbps: float | None = None


def judge(reading: Reading, expected_busbw_gbps: float | None, expected_from: str = "") -> Judgement:
    """Pass, fail or unreadable, with every reason. ``expected_busbw_gbps`` is what the largest size's busbw
    should reach (the fabric's figure or the user's); None judges no bandwidth and says so."""
    perf, transport = reading.perf, reading.transport
    if perf is None and transport is None:
        return Judgement("unreadable", ("no nccl-tests output and no NCCL INFO line in the text",))
    fails: list[str] = []
    notes: list[str] = []
    measured = None
    if perf is not None:
        if not perf.rows:
            fails.append(
                "the nccl-tests output has no data row (the test stopped before its first size, or the "
                "table is cut off)"
            )
        if perf.wrong_nonzero:
            fails.append("wrong values: a #wrong count is above zero (data corruption)")
        if perf.out_of_bounds:
            fails.append(f"{perf.out_of_bounds} out-of-bounds values")
        if perf.avg_check == "FAILED":
            fails.append("nccl-tests marks the average bus bandwidth FAILED (below 0.9 x NCCL_TESTS_MIN_BW)")
        bad = perf.busbw_mismatches()
        if bad:
            fails.append(
                f"busbw is not algbw x the {perf.collective} factor for {perf.n_ranks} ranks in {len(bad)} rows: "
                "the ranks listed did not run one test together"
            )
        measured = perf.largest_busbw_gbps
        if perf.rows and measured is None:
            fails.append("the largest size's bus bandwidth is not a number")
        if measured is not None and expected_busbw_gbps is not None:
            floor = MARGIN * expected_busbw_gbps
            size = perf.largest_size_bytes
            if measured < floor:
                fails.append(
                    f"busbw {measured:g} GB/s at {size} B is below {MARGIN:g} x the expected "
                    f"{expected_busbw_gbps:g} GB/s{expected_from}"
                )
            else:
                notes.append(
                    f"busbw {measured:g} GB/s at {size} B reaches {MARGIN:g} x {expected_busbw_gbps:g} GB/s"
                    f"{expected_from}"
                )
        elif measured is not None:
            notes.append("bandwidth not judged: no expected figure (no active RDMA port, no --expect-busbw)")
        if perf.more_runs:
            notes.append(f"the text holds {perf.more_runs} more test runs after the first; only the first is judged")
    if transport is not None and transport.fell_back_to_socket:
        fails.append(f"NCCL uses sockets, not RDMA, between nodes ({transport.evidence})")
    if perf is None:
        notes.append("no nccl-tests table: only the transport is judged")
    verdict: Verdict = "fail" if fails else "pass"
    return Judgement(verdict, tuple(fails + notes), expected_busbw_gbps, measured)


def report(reading: Reading, judgement: Judgement) -> dict[str, object]:
    """The JSON contract of ``mfu-exporter nccl --json``."""
    transport = reading.transport
    return {
        "perf": None if reading.perf is None else reading.perf.json(),
        "transport": None
        if transport is None or transport.transport is None
        else {
            "transport": transport.transport,
            "gdr": transport.gdr,
            "fell_back_to_socket": transport.fell_back_to_socket,
            "evidence": transport.evidence,
        },
        "verdict": judgement.verdict,
        "reasons": list(judgement.reasons),
    }
