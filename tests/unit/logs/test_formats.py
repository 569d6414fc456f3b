"""The straggler reports and profiler output of tests/fixtures/logs/real/formats.txt, each read right, and no paste of
another format (the training-log pastes, the NCCL ones) giving a straggler, a data wait or progress it does not
print."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from mfu_exporter.logs import DataWait, LogStream, Progress
from mfu_exporter.logs.straggler import StragglerScanner
from mfu_exporter.sources.logs import _JobScanners
from tests.support.pastes import Block, read_blocks
from tests.unit.logs import real_pastes

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
BLOCKS = read_blocks(FIXTURES / "logs" / "real" / "formats.txt")
OTHERS = [
    *read_blocks(FIXTURES / "logs" / "real" / "pastes.txt"),
    *(block for path in sorted((FIXTURES / "nccl" / "real").glob("*.txt")) for block in read_blocks(path)),
]


def straggler(lines: list[str]):
    scanner = StragglerScanner()
    for line in lines:
        scanner.feed(line)
    return scanner.finding()


def described(found) -> str:
    if found is None:
        return "none"
    score = "none" if found.score is None else f"{found.score:.2f}"
    return f"[{found.source}] rank={found.rank} score={score}"


def read(lines: list[str]) -> tuple[list[DataWait], list]:
    """The data waits and the progress events the logs' own path reads from the lines, in auto mode."""
    events = LogStream("auto").feed_many(lines, real_pastes.READ_TIME)
    waits = [e.record for e in events if isinstance(e.record, DataWait)]
    return waits, [e for e in events if isinstance(e.record, Progress)]


def test_the_fixture_names_where_each_paste_comes_from_and_which_were_produced_here():
    assert len(BLOCKS) >= 12
    for block in BLOCKS:
        assert block.lines and {"source", "straggler", "data_wait"} <= set(block.headers), block.name
    produced = {b.name for b in BLOCKS if b.headers["source"].startswith("produced: ")}
    assert produced == {"pytorch/produced-key-averages-table", "lightning/produced-advanced-profiler"}
    assert all("tests.support.profiler_output" in b.headers["source"] for b in BLOCKS if b.name in produced)
    real = {b.name.split("/")[0] for b in BLOCKS if b.name not in produced}
    assert real >= {"megatron", "composer", "flagscale", "nvrx", "pytorch", "lightning"}


@pytest.mark.parametrize("block", BLOCKS, ids=[b.name for b in BLOCKS])
def test_each_paste_reads_right(block: Block):
    assert described(straggler(block.lines)) == block.headers["straggler"]
    waits, progress = read(block.lines)
    expected = [] if block.headers["data_wait"] == "none" else [block.headers["data_wait"].split()]
    assert [(f"[{w.framework}]", w.scope) for w in waits] == [(e[0], e[1]) for e in expected]
    for wait, (_, _, seconds) in zip(waits, expected):
        assert math.isclose(wait.seconds, float(seconds), rel_tol=1e-9)
    wanted = block.headers.get("progress")
    if wanted is None:
        assert progress == [], block.name
    else:
        (event,) = progress  # a fragment of a wrapped line reads what it prints and guesses nothing wrapped away
        framework, fields = real_pastes.parse_expect(wanted)
        assert real_pastes.mismatch(event, framework, fields) is None


@pytest.mark.parametrize("block", OTHERS, ids=[b.name for b in OTHERS])
def test_no_paste_of_another_format_names_a_straggler(block: Block):
    assert straggler(block.lines) is None


def test_no_new_format_paste_reads_as_another_frameworks_data_wait_or_progress():
    """Each block's data wait is only its own framework's; the profiler tables' and reports' lines never look like
    a training framework's progress."""
    for block in BLOCKS:
        waits, _ = read(block.lines)
        frameworks = {f"[{w.framework}]" for w in waits}
        expected = set() if block.headers["data_wait"] == "none" else {block.headers["data_wait"].split()[0]}
        assert frameworks == expected, block.name


@pytest.mark.parametrize("block", BLOCKS, ids=[b.name for b in BLOCKS])
def test_the_logs_source_hands_every_line_of_a_report_to_the_scanner(block: Block):
    scanners = _JobScanners()
    scanners.feed(block.lines)
    assert described(scanners.reading().straggler) == block.headers["straggler"]


def waits_of(*lines: str) -> list[tuple[str, str, float]]:
    waits, _ = read(list(lines))
    return [(w.framework, w.scope, round(w.seconds, 9)) for w in waits]


# torch/autograd/profiler_util.py _build_table: right-aligned columns two spaces apart, names cut to 52 + "...",
# times from _format_time ("{:.3f}s", "ms", "us"). Synthetic rows in that layout.
HEADER = (
    "                                                   Name    Self CPU %      Self CPU   CPU total %     CPU total  "
    "CPU time avg    # of Calls  "
)
RULE = "-" * 55 + "  " + "  ".join(["------------"] * 6) + "  "


def row(name: str, total: str) -> str:
    return f"{name:>55}  {'50.00%':>12}  {'1.000s':>12}  {'60.00%':>12}  {total:>12}  {'100.000ms':>12}  {'10':>12}  "


def test_the_first_data_loader_row_of_each_table_counts_once():
    """Lightning's PyTorchProfiler shows its action and the loader's own __next__ in one table: the table gives one
    figure, its first such row's; the next table gives its own."""
    table = [
        RULE,
        HEADER,
        RULE,
        row("[pl][profile][_TrainingEpochLoop].train_dataloader_n...", "2.500s"),
        row("enumerate(DataLoader)#_MultiProcessingDataLoaderIter...", "2.400s"),
        RULE,
        "Self CPU time total: 4.000s",
    ]
    assert waits_of(*table, *table) == [("lightning", "since_last", 2.5), ("lightning", "since_last", 2.5)]
    whole = row("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", "812.000us")
    assert waits_of(RULE, HEADER, RULE, whole) == [("pytorch", "since_last", 0.000812)]


@pytest.mark.parametrize(
    "lines",
    [
        [row("enumerate(DataLoader)#_SingleProcessDataLoaderIter._...", "2.500s")],  # a row with no header before it
        [RULE, HEADER, RULE, row("aten::addmm", "2.500s")],  # another op
        [RULE, HEADER, RULE, row("enumerate(DataLoader)#_SingleProcessDataLoaderIter._...", "--")],  # no time
        [RULE, HEADER.replace("CPU total  ", "CPU tot..  "), RULE, row("enumerate(DataLoader)#_Single...", "2.5s")],
        ["Profile stats for: [_TrainingEpochLoop].val_next", "  12 function calls in 0.300 seconds"],
        ["Profile stats for: [_TrainingEpochLoop].train_dataloader_next", "", "  12 function calls in 0.300 seconds"],
        ["time (ms) | forward-compute: 10.00 |", *["x"] * 13, "# optimizer: 1.00 | batch-generator: 7.50"],
        ["time (ms) | forward-compute: 10.00 | backward-compute: 20.00", "| batch-generator: 7.50"],
        ["iteration 10 |", "batch-generator: 7.50 | other text here"],
    ],
)
def test_lines_that_only_look_like_the_multi_line_forms_give_no_data_wait(lines):
    assert waits_of(*lines) == []


def test_lightning_advanced_profiler_with_a_rank_and_re_wrapped_deepspeed_timers():
    advanced = [
        "Profile stats for: [_TrainingEpochLoop].train_dataloader_next rank: 0",
        "         1287 function calls (1182 primitive calls) in 0.397 seconds",
    ]
    assert waits_of(*advanced) == [("lightning", "total", 0.397)]
    # DeepSpeed's pipeline timer line, broken after a "|": "time (ms)" + " | {}: {:.2f}" per timer.
    deepspeed = [
        "[Rank 0] time (ms) | forward_microstep: 2785.85 |",
        "> batch_input: 209.59 | backward_microstep: 3.00",
    ]
    assert waits_of(*deepspeed) == [("deepspeed", "since_last", 0.20959)]


def test_the_simple_profiler_row_re_typeset_in_markdown():
    """Lightning's simple profiler row (datawait's "\\t|" cells) as a Markdown table row reads the same."""
    assert waits_of("| [_TrainingEpochLoop].train_dataloader_next | 0.012 | 1000 | 12.0 | 8.5 |") == [
        ("lightning", "total", 12.0)
    ]


def test_each_table_adds_its_window_and_the_advanced_profiler_sets_the_total():
    """A table's figure is the wait of the window it covers: two tables printed one after the other add up; the
    AdvancedProfiler's figure is the stage's running total, taken as it is."""
    from mfu_exporter.logs import Facts, JobLog, WaitAction

    table = next(b for b in BLOCKS if b.name == "pytorch/produced-key-averages-table").lines
    events = LogStream("auto").feed_many([*table, *table], real_pastes.READ_TIME)
    totals = [a.seconds for a in JobLog().feed("f", events, Facts(node_gpus=1)) if isinstance(a, WaitAction)]
    assert totals == pytest.approx([0.693529, 2 * 0.693529])
    report = next(b for b in BLOCKS if b.name == "lightning/lightning-782-advanced-profiler").lines
    events = LogStream("auto").feed_many([*report, *report], real_pastes.READ_TIME)
    totals = [a.seconds for a in JobLog().feed("g", events, Facts(node_gpus=1)) if isinstance(a, WaitAction)]
    assert totals == pytest.approx([19.107, 19.107])
