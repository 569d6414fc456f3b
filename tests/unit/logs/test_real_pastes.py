"""Every real paste of tests/fixtures/logs/real/pastes.txt read in auto mode: the step and every progress number
each line shows, what detection decides, and whether the stream reports a format that reads nothing."""

from __future__ import annotations

import pytest

from exporter.logs import LogStream, Progress
from tests.unit.logs import real_pastes

PASTES = real_pastes.load()


def test_the_fixture_holds_at_least_30_real_pastes_over_the_five_frameworks():
    real = [p for p in PASTES if not p.synthetic]
    assert len(real) >= 30
    frameworks = {p.name.split("/")[0] for p in real if p.expects}
    assert {"torchtitan", "megatron", "nemo", "hf", "deepspeed"} <= frameworks
    for paste in PASTES:
        assert paste.headers.get("source"), paste.name
        assert paste.lines, paste.name
        assert paste.synthetic == paste.headers["source"].startswith("synthetic"), paste.name


@pytest.mark.parametrize("paste", PASTES, ids=[p.name for p in PASTES])
def test_paste_reads_right(paste):
    reading = real_pastes.read(paste)
    assert reading.wrong == [], "\n".join(reading.wrong)
    assert reading.false_progress == 0, [e.record for e in reading.progress[len(paste.expects) :]]
    stream = reading.stream
    expected = paste.headers["format"]
    assert set(stream.formats) == (set() if expected == "none" else set(expected.split("+")))
    if paste.headers["unread"] == "yes":
        assert stream.no_progress and "no progress read" in stream.no_progress
        assert stream.errors["no_progress_read"] == 1
    else:
        assert stream.no_progress is None, stream.no_progress


def test_share_of_real_progress_lines_read_right_is_printed_and_meets_the_target(capsys):
    result = real_pastes.share(PASTES)
    with capsys.disabled():
        print("\n" + real_pastes.summary_line(result))
    assert result["progress_lines"] >= 70
    assert result["share"] >= 0.95, result["wrong"]
    assert result["false_progress"] == 0, result["wrong"]


def by_name(name: str) -> real_pastes.Paste:
    return next(p for p in PASTES if p.name == name)


def test_a_mixed_log_takes_the_richer_framework_by_rule_not_by_order():
    """DeepSpeed's throughput line and GPT-NeoX's iteration line for the same step (DeepSpeed#3742): the iteration
    line carries a step time and FLOPs besides the rate, so its framework gives the progress, whichever comes
    first."""
    lines = by_name("deepspeed/deepspeed-3742-gpt-neox-mixed").lines
    timer, neox = lines[0], lines[3]
    for order, taken in (
        ([timer, neox, timer], ["deepspeed", "megatron"]),  # DeepSpeed's only until the richer line appears
        ([neox, timer, neox], ["megatron", "megatron"]),
    ):
        stream = LogStream("auto")
        events = [e for e in stream.feed_many(order, real_pastes.READ_TIME) if isinstance(e.record, Progress)]
        assert [e.framework for e in events] == taken
        assert stream.format == "megatron" and set(stream.formats) == {"megatron", "deepspeed"}
        assert stream.left_out == 1


def test_an_hf_dict_with_a_token_count_is_richer_than_deepspeeds_throughput():
    ds = by_name("deepspeed/deepspeed-1825-hf-notebook").lines
    hf = by_name("hf/trl-3926-sft-num-tokens").lines
    stream = LogStream("auto")
    events = stream.feed_many([ds[1], hf[0], ds[6], hf[2]], real_pastes.READ_TIME)
    progress = [e for e in events if isinstance(e.record, Progress)]
    assert stream.format == "hf"
    assert [e.framework for e in progress] == ["deepspeed", "hf", "hf"]
    assert stream.left_out == 1


def test_the_unread_reason_clears_at_the_next_progress_and_returns_after_a_run_of_unread_lines():
    grpo = by_name("hf/trl-3452-grpo-nothing-useful").lines
    sft = by_name("hf/trl-3926-sft-num-tokens").lines
    stream = LogStream("auto")
    stream.feed_many(grpo[:1], real_pastes.READ_TIME)
    assert stream.no_progress and "last 1 line(s) of hf's progress form" in stream.no_progress  # none read yet
    stream.feed_many(sft[:1], real_pastes.READ_TIME)
    assert stream.no_progress is None and stream.progress_lines == 1
    stream.feed_many(grpo[:2], real_pastes.READ_TIME)
    assert stream.no_progress is None  # two unread lines among read ones: not yet a broken format
    stream.feed_many(grpo[2:3], real_pastes.READ_TIME)
    assert stream.no_progress and "last 3 line(s)" in stream.no_progress
    assert stream.errors["no_progress_read"] == 2


def test_launcher_prefixes_are_peeled_once_for_detection_and_reading():
    """The silent zero of issue 29: Python logging's time and "[Rank 15]:" before Megatron's line was detected as
    Megatron by one pattern and read by another; now both see the peeled line."""
    (line,) = by_name("megatron/ibm-go-parser-rank-prefix").lines
    for wrapped in (line, " 3: " + line, "stdout: " + line, "[trainer1|1]:" + line):
        stream = LogStream("auto")
        (event,) = stream.feed_many([wrapped], real_pastes.READ_TIME)
        assert stream.format == "megatron" and event.record.step == 20 and stream.no_progress is None
        assert event.origin.endswith("Rank 15")
