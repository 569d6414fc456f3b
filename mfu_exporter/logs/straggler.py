"""The slow rank, as training jobs name it in their own logs.

- Megatron-LM ``--log-straggler``, ``megatron/core/utils.py`` ``StragglerDetector.report`` (rank 0, every
  ``log_interval``; HEAD d98e8a64ddf3)::

      logger.info(f"{now} | MnRtt/Rnk: {o_dt.min_elapsed} | MxRtt/Rnk: {o_dt.max_elapsed} | MnPwr/Rnk: ... "
                  f"| MnEtpt/Rnk: {min_flops:.2f}TF/{min_frank} | MxEtpt/Rnk: {max_flops:.2f}TF/{max_frank}")

  each ``<value><unit>/<rank>`` (``MnRtt/Rnk: 3453.08ms/8``, ``MnEtpt/Rnk: 296.02TF/0``; README_STRAGGLER.md's
  example). Rtt is a rank's round-trip time of the timed section, Etpt its estimated TFLOP/s: the straggler is the
  rank of ``MxRtt`` and of ``MnEtpt``. Newer trees (Heimdall) print the same fields after a ``[INFO]`` tag. With
  ``--straggler-minmax-count N`` (1 < N < world size) two more lines follow, each ``o_dt.aflops[i]`` a
  ``_ValueWithRank`` printed ``f"{value:.2f}{unit}/{rank}"`` with no unit::

      line = f"^^^^ Bottom {self.mmcnt} Ranks with lowest  Etpt(TF):"   # then f" {o_dt.aflops[i]}," per rank
      line = f"^^^^ Top    {self.mmcnt} Ranks with highest Etpt(TF):"

  so every rank of the bottom N under the threshold of the best is named, not only the slowest.
- nvidia-resiliency-ext, ``ptl_resiliency/straggler_det_callback.py`` ``_print_gpu_scores`` /
  ``_format_gpu_scores`` (HEAD d8686d9c7015): ``GPU relative performance:``, then, when individual scores are
  computed too, ``GPU individual performance:``, each followed by ``  Rank={r} Node={rank_to_node[r]} Score={s:.2f}``
  lines (worst first when there are many), after ``STRAGGLER DETECTION WARNING: Some GPUs have worse relative
  performance. Affected ranks: {...}``. A relative score is a rank's performance against the best rank (1.0), an
  individual one against the rank's own best; 0.75 is the callback's default threshold for both
  (``gpu_relative_perf_threshold``, ``gpu_individual_perf_threshold``). One report prints both blocks, so each
  kind keeps its own latest finding and the report's straggler is the worse of the two.
- Composer's ``GlobalStragglerDetector`` (mosaicml/composer PR #3342, a callback that was never merged: branch
  ``jz/GlobalStragglerDetector``, ``composer/callbacks/global_straggler_detector.py`` of 2024-06) logs Megatron's
  minima and maxima every batch through the logger as ``'MinThroughput/Rank': _ValueWithRank(min_flops, rank,
  'TF')``; the console logger prints ``\\t Train MinThroughput/Rank: 129.44TF/0`` (the PR's example; its last
  commit prints ``f"{value:.2f}{unit}/Rank-{rank}"``), the file logger ``[metric][batch=N]: MinThroughput/Rank: ...``.
- FlagScale (flagos-ai/FlagScale ``flagscale/runner/straggler/report.py`` ``StragglerReport.to_text``, PR #938 and
  #1215, 2025-11 to 2026-06) prints one multi-line report on rank 0 every ``straggler_report_interval`` steps::

      === Straggler Report at Step {step} ===
      ⚠️  Detected Stragglers: {straggler_ranks}          (or "✓ No stragglers detected.")
        - Rank {rank} ({node_name})
      Section Timings (ms):  {section}:  Min: .., Max: .., Avg: .., Slowdown: ..x  /  Rank {rank}: {ms}ms
      GPU Performance Scores (higher=faster):  Rank {rank} ({node_name}): {score:.4f}

  A rank is named when it is ``straggler_threshold`` (1.5) times slower than the fastest: the report's own
  judgement is taken, its figures give the score (the GPU score against the best, else the section time).

Pure: lines in, the latest finding out. Each report replaces the previous one of its kind, so a straggler that
recovers is no longer named at the next report.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

THRESHOLD = 0.75  # nvidia-resiliency-ext's default: a rank at under 75% of the best holds the job back
MEGATRON_FIELD = re.compile(r"\b(Mn|Mx)(Rtt|Etpt)/Rnk:\s*([0-9.]+)\s*(ms|s|TF)?/(\d+)")
MEGATRON_RANKS = re.compile(r"\^\^\^\^ (Bottom|Top) +(\d+) Ranks with (?:lowest|highest) +Etpt\(TF\):(.*)$")
MEGATRON_PAIR = re.compile(r"([0-9]+(?:\.[0-9]+)?)/(\d+),")
NVRX_HEADER = re.compile(r"GPU (relative|individual) performance:")
NVRX_SCORE = re.compile(r"\bRank=(\d+)\s+Node=(\S+)\s+Score=([0-9.]+)")
COMPOSER = re.compile(r"\b(Min|Max)Throughput/Rank:\s*([0-9]+(?:\.[0-9]+)?)\s*TF/(?:Rank-)?(\d+)\b")
FLAGSCALE_HEADER = re.compile(r"=== Straggler Report at [Ss]tep (\d+) ===")
FLAGSCALE_NAMED = re.compile(r"Detected [Ss]tragglers:\s*(?:\[([0-9, ]*)\])?\s*$")
FLAGSCALE_NODE = re.compile(r"^\s*(?:- )?[Rr]ank (\d+) \((.*)\)\s*$")
FLAGSCALE_VALUE = re.compile(r"^\s*[Rr]ank (\d+)(?: \((.*)\))?: ([0-9]+(?:\.[0-9]+)?)(?:ms)?\s*$")
FLAGSCALE_SECTION = re.compile(r"^\s*(\S+):(?:\s*$| min=)")
# The report's other lines: a section's summary, the communication statistics' "key: value", an elision.
FLAGSCALE_OTHER = re.compile(r"^\s*Min: .*Slowdown:|^\s+\S[^:]*: \S|^\s*\.\.\.\s*$")
MAX_RANK = 1 << 24
MAX_FIGURE = 1e12  # past any TFLOP/s, millisecond or score a report prints
# Substrings one of which every line the scanner reads contains (inside a block, any line is read: it may end it).
KEYWORDS = ("Rnk:", "Ranks with", "performance:", "Score=", "performing", "Throughput/Rank:", "Straggler Report")


@dataclass(frozen=True, slots=True)
class StragglerFinding:
    rank: int
    node: str | None  # as the job names it (nvidia-resiliency-ext's rank_to_node), None when it does not
    score: float | None  # the rank's performance relative to the best, 0–1; None where the report names no figure
    source: str  # "megatron", "nvidia-resiliency-ext", "composer" or "flagscale"
    evidence: str


def _rank(text: str) -> int | None:
    return int(text) if len(text) < 9 and int(text) < MAX_RANK else None


def _figure(text: str) -> float | None:
    """A printed figure, or None for one no GPU prints (thousands of digits read as infinity)."""
    try:
        value = float(text)
    except ValueError:  # "1.2.3": a figure's pattern, not a figure
        return None
    return value if math.isfinite(value) and value < MAX_FIGURE else None


class _FlagScaleReport:
    """One FlagScale report being read: its lines share the header's launcher prefix."""

    __slots__ = ("prefix", "step", "named", "listed", "nodes", "times", "gpu", "part", "section")

    def __init__(self, prefix: str, step: int) -> None:
        self.prefix, self.step = prefix, step
        self.named: list[int] | None = None
        self.listed = True  # whether the verdict line listed the ranks (else the lines after it do)
        self.nodes: dict[int, str] = {}
        self.times: dict[str, dict[int, float]] = {}
        self.gpu: dict[int, float] = {}
        self.part = ""  # "sections", "gpu" or "comm": the heading the lines are under
        self.section: str | None = None

    def feed(self, line: str) -> bool:
        """Whether the line belongs to the report (one that does not ends it)."""
        if not line.startswith(self.prefix):
            return False
        text = line[len(self.prefix) :].rstrip()
        lower = text.lower()
        if not text.strip():
            return True
        if (named := FLAGSCALE_NAMED.search(text)) is not None:
            ranks = [_rank(r) for r in (named.group(1) or "").replace(" ", "").split(",") if r]
            self.named, self.listed = [r for r in ranks if r is not None], named.group(1) is not None
            return True
        if "no stragglers detected" in lower:
            self.named = []
            return True
        for heading, part in (
            ("section timings", "sections"),
            ("gpu performance scores", "gpu"),
            ("gpu scores", "gpu"),
        ):
            if heading in lower:
                self.part = part
                return True
        if "communication statistics:" in lower:
            self.part = "comm"
            return True
        return self._line(text)

    def _line(self, text: str) -> bool:
        if (node := FLAGSCALE_NODE.match(text)) is not None and self.part == "":
            rank = _rank(node.group(1))
            if rank is not None:
                self.nodes[rank] = node.group(2)[:256]
                if not self.listed and self.named is not None and rank not in self.named:
                    self.named.append(rank)
            return True
        if (value := FLAGSCALE_VALUE.match(text)) is not None and self.part in ("sections", "gpu"):
            rank = _rank(value.group(1))
            figure = _figure(value.group(3))
            if rank is not None and figure is not None and self.part == "gpu":
                self.gpu[rank] = figure
            elif rank is not None and figure is not None and self.section is not None:
                self.times.setdefault(self.section, {})[rank] = figure
            if rank is not None and value.group(2) and value.group(2) != f"rank-{rank}":
                self.nodes.setdefault(rank, value.group(2)[:256])
            return True
        if self.part in ("sections", "comm") and (section := FLAGSCALE_SECTION.match(text)) is not None:
            self.section = section.group(1)[:256]
            return True
        return FLAGSCALE_OTHER.search(text) is not None

    def finding(self) -> StragglerFinding | None:
        if not self.named:
            return None
        scores = {rank: self._score(rank) for rank in self.named}
        rank = min(self.named, key=lambda r: (scores[r] if scores[r] is not None else 2.0, r))
        score = scores[rank]
        node = self.nodes.get(rank)
        node = None if node is None or node == f"rank-{rank}" else node
        figure = f" at {score:.2f} of the fastest" if score is not None else ""
        where = f" on node {node}" if node else ""
        others = f" (of ranks {', '.join(map(str, self.named))})" if len(self.named) > 1 else ""
        return StragglerFinding(
            rank,
            node,
            score,
            "flagscale",
            f"FlagScale's straggler report at step {self.step}: rank {rank}{where} is a straggler{figure}{others}",
        )

    def _score(self, rank: int) -> float | None:
        best = max(self.gpu.values(), default=0.0)
        if rank in self.gpu and best > 0:
            return self.gpu[rank] / best
        ratios = [min(times.values()) / times[rank] for times in self.times.values() if times.get(rank, 0.0) > 0]
        return min(ratios) if ratios else None


class StragglerScanner:
    """Feed a job's log lines in order; ``finding()`` is the straggler its latest report names, or None."""

    def __init__(self) -> None:
        self._megatron: StragglerFinding | None = None
        self._bottom: list[tuple[float, int]] | None = None  # Megatron's "Bottom N" line, until its "Top N" line
        self._nvrx: dict[str, StragglerFinding | None] = {}  # per kind of score: relative, individual
        self._composer: StragglerFinding | None = None
        self._composer_min: tuple[float, int] | None = None
        self._flagscale: StragglerFinding | None = None
        self._report: _FlagScaleReport | None = None
        self._latest = ""  # the source whose report came last
        self._scores: dict[int, tuple[str, float]] | None = None  # the nvidia-resiliency-ext block being read
        self._kind = "relative"

    def feed(self, line: str) -> None:
        if self._report is not None:
            if self._report.feed(line):
                return
            self._close_report()
        if "Rnk:" in line:
            self._megatron_line(line)
            return
        if "Ranks with" in line:
            self._megatron_ranks(line)
            return
        if "Throughput/Rank:" in line:
            self._composer_line(line)
            return
        if "Straggler Report" in line and (header := FLAGSCALE_HEADER.search(line)) is not None:
            self._close()
            self._report = _FlagScaleReport(line[: header.start()], int(header.group(1)))
            return
        header = NVRX_HEADER.search(line)
        if header:
            self._close()
            self._scores, self._kind = {}, header.group(1)
            return
        if self._scores is not None:
            score = NVRX_SCORE.search(line)
            if score:
                rank, figure = _rank(score.group(1)), _figure(score.group(3))
                if rank is not None and figure is not None:
                    self._scores[rank] = (score.group(2)[:256], figure)
            elif "performing" not in line:  # "Worst/Best performing 3/N ranks:" stay inside the block
                self._close()

    @property
    def in_block(self) -> bool:
        """Inside a multi-line report (nvidia-resiliency-ext's scores, FlagScale's report): any line is read."""
        return self._scores is not None or self._report is not None

    def finding(self) -> StragglerFinding | None:
        self._close()
        flagscale, latest = self._flagscale, self._latest
        if self._report is not None and self._report.named is not None:  # a report whose last lines are still to come
            flagscale, latest = self._report.finding(), "flagscale"
        nvrx = [f for f in self._nvrx.values() if f is not None]
        return {
            "megatron": self._megatron,
            "nvidia-resiliency-ext": min(nvrx, key=lambda f: f.score or 0.0) if nvrx else None,
            "composer": self._composer,
            "flagscale": flagscale,
        }.get(latest)

    def _close_report(self) -> None:
        if self._report is not None:
            report, self._report = self._report, None
            if report.named is not None:  # a report cut before its verdict says nothing
                self._flagscale, self._latest = report.finding(), "flagscale"

    def _close(self) -> None:
        if self._scores is None:
            return
        scores, self._scores = self._scores, None
        if not scores:
            return
        self._latest = "nvidia-resiliency-ext"
        rank, (node, score) = min(scores.items(), key=lambda kv: kv[1][1])
        if score >= THRESHOLD:
            self._nvrx[self._kind] = None
            return
        self._nvrx[self._kind] = StragglerFinding(
            rank,
            node,
            score,
            "nvidia-resiliency-ext",
            f"nvidia-resiliency-ext: rank {rank} on node {node} has {self._kind} GPU performance {score:.2f} "
            f"(under {THRESHOLD:g})",
        )

    def _megatron_line(self, line: str) -> None:
        fields = {
            (mn + kind): (figure, who)
            for mn, kind, value, _, rank in MEGATRON_FIELD.findall(line)
            if (figure := _figure(value)) is not None and (who := _rank(rank)) is not None
        }
        if "MnEtpt" in fields and "MxEtpt" in fields and fields["MxEtpt"][0] > 0:
            (low, rank), (high, best) = fields["MnEtpt"], fields["MxEtpt"]
            score, what = low / high, f"{low:g} TFLOP/s against rank {best}'s {high:g}"
        elif "MnRtt" in fields and "MxRtt" in fields and fields["MxRtt"][0] > 0:
            (fast, best), (slow, rank) = fields["MnRtt"], fields["MxRtt"]
            score, what = fast / slow, f"{slow:g} ms a step against rank {best}'s {fast:g}"
        else:
            return
        self._bottom, self._latest = None, "megatron"
        self._megatron = (
            StragglerFinding(
                rank, None, score, "megatron", f"Megatron's straggler detector: rank {rank} is slowest ({what})"
            )
            if score < THRESHOLD
            else None
        )

    def _megatron_ranks(self, line: str) -> None:
        found = MEGATRON_RANKS.search(line)
        if found is None:
            return
        pairs = [
            (figure, rank)
            for v, r in MEGATRON_PAIR.findall(found.group(3) + ",")
            if (figure := _figure(v)) is not None and (rank := _rank(r)) is not None
        ]
        if found.group(1) == "Bottom":
            self._bottom = pairs
            return
        bottom, self._bottom = self._bottom, None
        if bottom is None or not pairs:
            return
        high, best = max(pairs)
        if high <= 0:
            return
        slow = sorted((value / high, rank, value) for value, rank in bottom if value / high < THRESHOLD)
        self._latest = "megatron"
        if not slow:
            self._megatron = None
            return
        score, rank, value = slow[0]
        others = (
            f"; ranks {', '.join(str(r) for _, r, _ in slow)} are under {THRESHOLD:g} of it" if len(slow) > 1 else ""
        )
        self._megatron = StragglerFinding(
            rank,
            None,
            score,
            "megatron",
            f"Megatron's straggler detector: rank {rank} is slowest ({value:g} TFLOP/s against rank {best}'s "
            f"{high:g}{others})",
        )

    def _composer_line(self, line: str) -> None:
        found = COMPOSER.search(line)
        value = _figure(found.group(2)) if found is not None else None
        rank = _rank(found.group(3)) if found is not None else None
        if found is None or value is None or rank is None:
            return
        if found.group(1) == "Min":
            self._composer_min = (value, rank)
            return
        low, self._composer_min = self._composer_min, None
        if low is None or value <= 0:
            return
        score = low[0] / value
        self._latest = "composer"
        self._composer = (
            StragglerFinding(
                low[1],
                None,
                score,
                "composer",
                f"Composer's GlobalStragglerDetector: rank {low[1]} is slowest ({low[0]:g} TFLOP/s against rank "
                f"{rank}'s {value:g})",
            )
            if score < THRESHOLD
            else None
        )
