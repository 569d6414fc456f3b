"""The slow rank as Megatron-LM and nvidia-resiliency-ext print it (mfu_exporter/logs/straggler.py)."""

from __future__ import annotations

from mfu_exporter.logs.straggler import StragglerScanner

# megatron/core/README_STRAGGLER.md's example line, verbatim (NVIDIA/Megatron-LM): ranks within 1% of each other.
MEGATRON_README = (
    " 0: INFO:megatron.core.utils:[2024-03-14 23:07:56] | MnRtt/Rnk: 3453.08ms/8 | MxRtt/Rnk: 3468.20ms/0 | "
    "MnPwr/Rnk: 601796W/8 | MxPwr/Rnk: 683801W/18 | MnTmp/Rnk: 52C/0 | MxTmp/Rnk: 65C/21 | MnUtl/Rnk: 97%/8 | "
    "MxUtl/Rnk: 100%/6 | MnClk/Rnk: 1950MHz/28 | MxClk/Rnk: 1980MHz/0 | MnDRtt/Rnk: 14.27ms/23 | "
    "MxDRtt/Rnk: 34.65ms/3 | MnEtpt/Rnk: 296.02TF/0 | MxEtpt/Rnk: 297.32TF/8"
)
# Synthetic: the same layout with rank 13 at half the best throughput.
MEGATRON_SLOW = MEGATRON_README.replace("MnEtpt/Rnk: 296.02TF/0", "MnEtpt/Rnk: 148.50TF/13")
# nvidia-resiliency-ext's _format_gpu_scores layout (ptl_resiliency/straggler_det_callback.py), synthetic values.
NVRX = """\
[NeMo W 2025-01-10 10:00:00 straggler_det_callback:96] STRAGGLER DETECTION WARNING: Some GPUs have worse \
relative performance. Affected ranks: {5}
[NeMo I 2025-01-10 10:00:00 straggler_det_callback:130]
    GPU relative performance:
     Worst performing 3/16 ranks:
      Rank=5 Node=node-b Score=0.52
      Rank=2 Node=node-a Score=0.97
      Rank=9 Node=node-b Score=0.98
     Best performing 3/16 ranks:
      Rank=0 Node=node-a Score=1.00
      Rank=1 Node=node-a Score=1.00
      Rank=3 Node=node-a Score=1.00
[NeMo I 2025-01-10 10:00:01 straggler_det_callback:140] Straggler report processing time: 0.012 sec."""


def scan(*lines):
    scanner = StragglerScanner()
    for line in lines:
        scanner.feed(line)
    return scanner.finding()


def test_megatron_ranks_close_together_name_nobody():
    assert scan(MEGATRON_README) is None


def test_megatron_names_the_rank_of_the_lowest_throughput():
    found = scan(MEGATRON_SLOW)
    assert (found.rank, found.node, found.source) == (13, None, "megatron")
    assert round(found.score, 2) == 0.5
    assert "rank 13 is slowest (148.5 TFLOP/s against rank 8's 297.32)" in found.evidence


def test_a_later_report_without_a_straggler_clears_it():
    assert scan(MEGATRON_SLOW, MEGATRON_README) is None


def test_nvidia_resiliency_ext_scores():
    found = scan(*NVRX.splitlines())
    assert (found.rank, found.node, found.source) == (5, "node-b", "nvidia-resiliency-ext")
    assert found.evidence == (
        "nvidia-resiliency-ext: rank 5 on node node-b has relative GPU performance 0.52 (under 0.75)"
    )
    healthy = NVRX.replace("Score=0.52", "Score=0.95")
    assert scan(*NVRX.splitlines(), *healthy.splitlines()) is None


def formats_block(name: str) -> list[str]:
    from pathlib import Path

    from tests.support.pastes import read_blocks

    path = Path(__file__).resolve().parents[2] / "fixtures" / "logs" / "real" / "formats.txt"
    return next(b for b in read_blocks(path) if b.name == name).lines


def test_an_individual_block_after_the_relative_one_does_not_clear_a_relative_straggler():
    """The callback prints relative scores, then individual ones, in one report (NeMo's documented 512-rank report,
    its worst relative score set to 0.52 here): the healthy individual block leaves the relative finding standing,
    and the next healthy report clears it."""
    real = formats_block("nvrx/nemo-resiliency-512-ranks")
    slow = [
        line.replace("Rank=76 Node=h100-001-253-012 Score=0.94", "Rank=76 Node=h100-001-253-012 Score=0.52")
        if line.startswith("  Rank=76") and "0.94" in line
        else line
        for line in real
    ]
    assert slow != real
    found = scan(*slow)
    assert (found.rank, found.node, found.score) == (76, "h100-001-253-012", 0.52)
    assert "relative GPU performance 0.52" in found.evidence
    assert scan(*slow, *real) is None


def test_an_individual_straggler_is_named_when_the_relative_scores_are_healthy():
    real = formats_block("nvrx/nemo-resiliency-512-ranks")
    marker = real.index("GPU individual performance:")
    slow = real[: marker + 2] + [real[marker + 2].replace("Score=0.98", "Score=0.60")] + real[marker + 3 :]
    found = scan(*slow)
    assert (found.rank, found.score) == (76, 0.60) and "individual GPU performance 0.60" in found.evidence


# megatron/core/utils.py: f"^^^^ Bottom {self.mmcnt} Ranks with lowest  Etpt(TF):" + f" {o_dt.aflops[i]}," per rank,
# each "{value:.2f}/{rank}"; then the "Top" line. Synthetic values: two ranks under 0.75 of the best.
MEGATRON_BOTTOM = (
    " 0: INFO:megatron.core.utils:^^^^ Bottom 4 Ranks with lowest  Etpt(TF): 140.10/13, 180.50/5, 296.23/1, 296.23/4,"
)
MEGATRON_TOP = (
    " 0: INFO:megatron.core.utils:^^^^ Top    4 Ranks with highest Etpt(TF): 297.28/15, 297.28/11, 297.32/12, 297.32/8,"
)


def test_megatron_bottom_ranks_name_every_rank_under_the_threshold():
    found = scan(MEGATRON_README, MEGATRON_BOTTOM, MEGATRON_TOP)
    assert (found.rank, found.source) == (13, "megatron") and round(found.score, 3) == round(140.10 / 297.32, 3)
    assert "ranks 13, 5 are under 0.75" in found.evidence
    # The Top line alone, or a Bottom line whose ranks are close to the best, name nobody.
    assert scan(MEGATRON_README, MEGATRON_TOP) is None
    assert (
        scan(MEGATRON_SLOW, MEGATRON_BOTTOM.replace("140.10/13, 180.50/5", "296.10/13, 296.50/5"), MEGATRON_TOP) is None
    )


# Composer's GlobalStragglerDetector through the console logger: "\t Train MinThroughput/Rank: ..." (its last commit
# prints "/Rank-{rank}"); the file logger's "[metric][batch=N]: ..." form. Synthetic values.
def test_composer_min_and_max_throughput_ranks():
    found = scan("\t Train MinThroughput/Rank: 60.00TF/Rank-3", "\t Train MaxThroughput/Rank: 129.54TF/Rank-2")
    assert (found.rank, found.source) == (3, "composer") and round(found.score, 3) == round(60 / 129.54, 3)
    assert "rank 3 is slowest (60 TFLOP/s against rank 2's 129.54)" in found.evidence
    file_logger = [
        "[metric][batch=7]: MinThroughput/Rank: 60.00TF/3",
        "[metric][batch=7]: MaxThroughput/Rank: 129.54TF/2",
    ]
    assert scan(*file_logger).rank == 3
    assert scan(*file_logger, *formats_block("composer/composer-3342-global-straggler-detector")) is None
    assert scan("Train MaxThroughput/Rank: 129.54TF/2") is None  # a maximum with no minimum before it


# flagscale/runner/straggler/report.py StragglerReport.to_text, with stragglers named. Synthetic values.
FLAGSCALE_SLOW = """[default0]:=== Straggler Report at Step 20 ===
[default0]:
[default0]:⚠️  Detected Stragglers: [3]
[default0]:  - Rank 3 (node-b)
[default0]:
[default0]:Section Timings (ms):
[default0]:
[default0]:  forward_backward:
[default0]:    Min: 281.94ms, Max: 563.88ms, Avg: 352.43ms, Slowdown: 2.00x
[default0]:    Rank 0: 281.94ms
[default0]:    Rank 3: 563.88ms
[default0]:
[default0]:GPU Performance Scores (higher=faster):
[default0]:  Rank 0 (node-a): 2.9138
[default0]:  Rank 3 (node-b): 1.4569
[default0] iteration 21 | other output"""
# The lower-case layout of the report's other version: the verdict, then one "  rank N (node)" line per straggler.
FLAGSCALE_LOWER = """=== Straggler Report at step 20 ===
Detected stragglers:
  rank 3 (node-b)

Section timings (ms):
  forward_backward: min=281.94, max=563.88, avg=352.43
    rank 0 (node-a): 281.94
    rank 3 (node-b): 563.88"""


def test_flagscale_reports_name_their_stragglers_with_the_gpu_score_or_the_section_time():
    found = scan(*FLAGSCALE_SLOW.splitlines())
    assert (found.rank, found.node, found.source, round(found.score, 2)) == (3, "node-b", "flagscale", 0.5)
    assert (
        found.evidence
        == "FlagScale's straggler report at step 20: rank 3 on node node-b is a straggler at 0.50 of the fastest"
    )
    lower = scan(*FLAGSCALE_LOWER.splitlines())
    assert (lower.rank, lower.node, round(lower.score, 2)) == (3, "node-b", 0.5)
    healthy = formats_block("flagscale/flagscale-938-report")
    assert scan(*FLAGSCALE_SLOW.splitlines(), *healthy) is None


def test_a_flagscale_report_read_in_two_batches_keeps_its_figures():
    scanner = StragglerScanner()
    lines = FLAGSCALE_SLOW.splitlines()
    for line in lines[:5]:
        scanner.feed(line)
    assert scanner.finding().rank == 3  # the verdict is in; the scores are still to come
    for line in lines[5:]:
        scanner.feed(line)
    assert round(scanner.finding().score, 2) == 0.5
