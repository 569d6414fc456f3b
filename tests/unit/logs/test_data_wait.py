"""Data-loading time read from training logs (mfu_exporter.logs.datawait): the real pastes' figures (Megatron, GPT-NeoX,
Lightning, DeepSpeed's pipeline engine), none from any other paste, each framework's form from its format string,
and the running total the job model gets (mfu_exporter.logs.derive)."""

from __future__ import annotations

import math

import pytest

from mfu_exporter.logs import DataWait, Facts, JobLog, LogStream, WaitAction
from mfu_exporter.logs.datawait import parse_data_wait
from tests.unit.logs import real_pastes

PASTES = [p for p in real_pastes.load() if "data_wait" in p.headers]


def waits(lines: list[str]) -> list[DataWait]:
    stream = LogStream("auto")
    return [e.record for e in stream.feed_many(lines, real_pastes.READ_TIME) if isinstance(e.record, DataWait)]


@pytest.mark.parametrize("paste", PASTES, ids=[p.name for p in PASTES])
def test_real_paste_data_wait(paste):
    expected = [] if paste.headers["data_wait"] == "none" else [paste.headers["data_wait"].split()]
    got = waits(paste.lines)
    assert [(f"[{w.framework}]", w.scope) for w in got] == [(e[0], e[1]) for e in expected]
    for wait, (_, _, seconds) in zip(got, expected):
        assert math.isclose(wait.seconds, float(seconds), rel_tol=1e-9)


def test_real_pastes_give_data_wait_from_three_frameworks_and_deepspeeds_plain_engine_none():
    """Megatron (and GPT-NeoX's Megatron timers), Lightning's profiler and DeepSpeed's pipeline engine, each from
    real output; the plain engine's breakdown has no data-loading timer."""
    real = [p for p in PASTES if not p.synthetic and p.headers["data_wait"] != "none"]
    assert {p.headers["data_wait"].split()[0] for p in real} >= {"[megatron]", "[lightning]", "[deepspeed]"}
    pipeline = [p for p in real if p.headers["data_wait"].startswith("[deepspeed]")]
    assert len(pipeline) >= 2 and all("batch_input" in "\n".join(p.lines) for p in pipeline)
    plain = next(p for p in PASTES if p.name == "deepspeed/deepspeed-1436-wall-clock-breakdown")
    assert plain.headers["data_wait"] == "none" and waits(plain.lines) == []


def test_no_other_paste_gives_a_data_wait():
    """Every paste that prints no data-loading figure (all frameworks' progress, timers, prefixes) reads none."""
    others = [p for p in real_pastes.load() if "data_wait" not in p.headers]
    assert len(others) >= 30
    assert {p.name: waits(p.lines) for p in others if waits(p.lines)} == {}


@pytest.mark.parametrize(
    "line, scope, seconds, framework",
    [
        # Megatron HEAD, megatron/core/timers.py: '\n    {}: ({:.2f}, {:.2f})'.format((name + ' ').ljust(48, '.'), ...)
        ("    " + "batch-generator ".ljust(48, ".") + ": (12.50, 40.25)", "per_step", 0.04025, "megatron"),
        # --timing-log-option max: '\n    {}: {:.2f}'
        ("    " + "batch-generator ".ljust(48, ".") + ": 40.25", "per_step", 0.04025, "megatron"),
        # v2.6: 'time (ms)' + ' | {}: {:.2f}', batch-generator last
        ("time (ms) | forward-compute: 10.00 | batch-generator: 7.50", "per_step", 0.0075, "megatron"),
        # Megatron-LM v1.0 and GPT-NeoX: 'time (ms)' + ' | {}: {:.2f}', the timer named "batch generator"
        ("time (ms) | forward: 659.86 | optimizer: 1172.51 | batch generator: 0.83", "per_step", 0.00083, "megatron"),
        # DeepSpeed before PR #3996: f"rank={dist.get_rank()} time (ms)" + " | {}: {:.2f}"
        (
            "[Rank 0] rank=0 time (ms) | batch_input: 209.59 | forward_microstep: 2785.85",
            "since_last",
            0.20959,
            "deepspeed",
        ),
        # DeepSpeed pipeline engine through log_dist: "[Rank {}] " + "time (ms)" + " | {}: {:.2f}"
        (
            "[2026-08-22 10:00:00,000] [INFO] [logging.py:128:log_dist] [Rank 0] time (ms) | batch_input: 812.40 "
            "| forward_microstep: 2000.10 | backward_microstep: 4000.00",
            "since_last",
            0.8124,
            "deepspeed",
        ),
        # Lightning simple.py extended row: f"{sep}|  {action:<{max_key}s}\t|  {mean:<15}\t|" ...
        (
            f"|  {'[_TrainingEpochLoop].train_dataloader_next':<45s}\t|  {'0.012':<15}\t|  {'1000':<15}\t|"
            f"  {'12.0':<15}\t|  {'8.5':<15}\t|",
            "total",
            12.0,
            "lightning",
        ),
        # The not-extended row: mean, total.
        (
            f"|  {'[TrainingEpochLoop].train_dataloader_next':<45s}\t|  {'0.012':<15}\t|  {'6.5':<15}\t|",
            "total",
            6.5,
            "lightning",
        ),
    ],
)
def test_each_frameworks_form_from_its_format_string(line, scope, seconds, framework):
    wait = parse_data_wait(line)
    assert wait is not None and wait.scope == scope and wait.framework == framework
    assert math.isclose(wait.seconds, seconds, rel_tol=1e-9)


@pytest.mark.parametrize(
    "line",
    [
        "time (ms) | forward_microstep: 435.69 | backward_microstep: 744.13",  # DeepSpeed's plain engine
        "rank=0 time (ms) | pipe_send_output: 41.71 | pipe_recv_grad: 1725.64",  # the pipeline's other timer line
        "iteration 10 | batch generator: 0.83",  # the timer's name outside a "time (ms)" line
        "time (ms) | batch generator queue: 3.00",  # another name that starts with it
        "  seq_length ...................................... 4096",  # Megatron's argument dump
        "    " + "data-iterator ".ljust(48, ".") + ": (3.90, 43.10)",  # a neighbour timer
        f"|  {'[_TrainingEpochLoop].val_next':<45s}\t|  {'0.1':<15}\t|  {'1':<15}\t|",  # validation fetches
    ],
)
def test_lines_that_are_not_data_wait(line):
    assert parse_data_wait(line) is None


def test_megatron_per_iteration_means_count_for_the_iterations_they_cover():
    """Megatron's timers print the mean per iteration over --log-interval iterations, after the iteration line:
    the running total grows by mean x iterations since the previous timer line."""
    row = "    " + "batch-generator ".ljust(48, ".") + ": (100.00, 250.00)"
    lines = []
    for step in (10, 20, 30):
        lines.append(
            f" iteration {step:8d}/ 1000 | consumed samples: {step * 8:12d} | elapsed time per iteration (ms): 1000.0 |"
            " global batch size:     8 |"
        )
        lines.append("(min, max) time across ranks (ms):")
        lines.append(row)
    stream, log = LogStream("auto"), JobLog()
    events = stream.feed_many(lines, 1000.0)
    actions = [
        a for a in log.feed("f", events, Facts(node_gpus=8, world_size=8, seq_len=4)) if isinstance(a, WaitAction)
    ]
    # The first timer line follows the first iteration line: the iterations it covers are unknown, so it only
    # marks where counting starts; each later one adds 10 iterations x 0.25 s (the max across ranks).
    assert [round(a.seconds, 6) for a in actions] == [2.5, 5.0]
    assert all(a.framework == "megatron" for a in actions)


def test_deepspeed_sums_and_lightning_totals_make_running_totals():
    log = JobLog()
    ds = "[Rank 0] time (ms) | batch_input: 500.00 | forward_microstep: 1.00"
    events = LogStream("auto").feed_many([ds, ds], 1000.0)
    assert [a.seconds for a in log.feed("f", events, Facts()) if isinstance(a, WaitAction)] == [0.5, 1.0]
    row = f"|  {'[_TrainingEpochLoop].train_dataloader_next':<45s}\t|  {'0.012':<15}\t|  {'1000':<15}\t|  {'12.0':<15}\t|  {'8.5':<15}\t|"
    events = LogStream("auto").feed_many([row], 1000.0)
    assert [a.seconds for a in JobLog().feed("g", events, Facts()) if isinstance(a, WaitAction)] == [12.0]
