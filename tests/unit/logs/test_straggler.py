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
