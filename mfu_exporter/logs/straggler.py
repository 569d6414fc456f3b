"""The slow rank, as training jobs name it in their own logs.

- Megatron-LM ``--log-straggler``, ``megatron/core/utils.py`` ``StragglerDetector.report`` (rank 0, every
  ``log_interval``)::

      logger.info(f"{now} | MnRtt/Rnk: {o_dt.min_elapsed} | MxRtt/Rnk: {o_dt.max_elapsed} | MnPwr/Rnk: ... "
                  f"| MnEtpt/Rnk: {min_flops:.2f}TF/{min_frank} | MxEtpt/Rnk: {max_flops:.2f}TF/{max_frank}")

  each ``<value><unit>/<rank>`` (``MnRtt/Rnk: 3453.08ms/8``, ``MnEtpt/Rnk: 296.02TF/0``; README_STRAGGLER.md's
  example). Rtt is a rank's round-trip time of the timed section, Etpt its estimated TFLOP/s: the straggler is the
  rank of ``MxRtt`` and of ``MnEtpt``. Newer trees (Heimdall) print the same fields after a ``[INFO]`` tag.
- nvidia-resiliency-ext, ``ptl_resiliency/straggler_det_callback.py`` ``_print_gpu_scores`` /
  ``_format_gpu_scores``: ``GPU relative performance:`` (or ``GPU individual performance:``), then
  ``  Rank={r} Node={rank_to_node[r]} Score={s:.2f}`` lines (worst first when there are many), and
  ``STRAGGLER DETECTION WARNING: Some GPUs have worse relative performance. Affected ranks: {...}``. A score is
  a rank's performance relative to the best (1.0) or to its own best (individual); 0.75 is the callback's default
  threshold (``gpu_relative_perf_threshold``).

Pure: lines in, the latest finding out. Each report replaces the previous one, so a straggler that recovers is
no longer named at the next report.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

THRESHOLD = 0.75  # nvidia-resiliency-ext's default: a rank at under 75% of the best holds the job back
MEGATRON_FIELD = re.compile(r"\b(Mn|Mx)(Rtt|Etpt)/Rnk:\s*([0-9.]+)\s*(ms|s|TF)?/(\d+)")
NVRX_HEADER = re.compile(r"GPU (relative|individual) performance:")
NVRX_SCORE = re.compile(r"\bRank=(\d+)\s+Node=(\S+)\s+Score=([0-9.]+)")


@dataclass(frozen=True, slots=True)
class StragglerFinding:
    rank: int
    node: str | None  # as the job names it (nvidia-resiliency-ext's rank_to_node), None when it does not
    score: float  # the rank's performance relative to the best, 0–1
    source: str  # "megatron" or "nvidia-resiliency-ext"
    evidence: str


class StragglerScanner:
    """Feed a job's log lines in order; ``finding()`` is the straggler its latest report names, or None."""

    def __init__(self) -> None:
        self._finding: StragglerFinding | None = None
        self._scores: dict[int, tuple[str, float]] | None = None  # the nvidia-resiliency-ext block being read
        self._kind = "relative"

    def feed(self, line: str) -> None:
        if "Rnk:" in line:
            self._megatron(line)
            return
        header = NVRX_HEADER.search(line)
        if header:
            self._close()
            self._scores, self._kind = {}, header.group(1)
            return
        if self._scores is not None:
            score = NVRX_SCORE.search(line)
            if score:
                self._scores[int(score.group(1))] = (score.group(2), float(score.group(3)))
            elif "performing" not in line:  # "Worst/Best performing 3/N ranks:" stay inside the block
                self._close()

    @property
    def in_block(self) -> bool:
        """Inside an nvidia-resiliency-ext score block: any other line ends it."""
        return self._scores is not None

    def finding(self) -> StragglerFinding | None:
        self._close()
        return self._finding

    def _close(self) -> None:
        if self._scores is None:
            return
        scores, self._scores = self._scores, None
        if not scores:
            return
        rank, (node, score) = min(scores.items(), key=lambda kv: kv[1][1])
        if score >= THRESHOLD:
            self._finding = None
            return
        self._finding = StragglerFinding(
            rank,
            node,
            score,
            "nvidia-resiliency-ext",
            f"nvidia-resiliency-ext: rank {rank} on node {node} has {self._kind} GPU performance {score:.2f} "
            f"(under {THRESHOLD:g})",
        )

    def _megatron(self, line: str) -> None:
        fields = {(mn + kind): (float(value), int(rank)) for mn, kind, value, _, rank in MEGATRON_FIELD.findall(line)}
        if "MnEtpt" in fields and "MxEtpt" in fields and fields["MxEtpt"][0] > 0:
            (low, rank), (high, best) = fields["MnEtpt"], fields["MxEtpt"]
            score, what = low / high, f"{low:g} TFLOP/s against rank {best}'s {high:g}"
        elif "MnRtt" in fields and "MxRtt" in fields and fields["MxRtt"][0] > 0:
            (fast, best), (slow, rank) = fields["MnRtt"], fields["MxRtt"]
            score, what = fast / slow, f"{slow:g} ms a step against rank {best}'s {fast:g}"
        else:
            return
        self._finding = (
            StragglerFinding(
                rank, None, score, "megatron", f"Megatron's straggler detector: rank {rank} is slowest ({what})"
            )
            if score < THRESHOLD
            else None
        )
