"""Every real paste of tests/fixtures/logs/real/pastes.txt read in auto mode: the step and every progress number
each line shows, what detection decides, and whether the stream reports a format that reads nothing."""

from __future__ import annotations

import pytest

from mfu_exporter.logs import LogStream, Progress
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


def test_share_of_real_progress_lines_read_right_meets_the_target():
    """The figure itself is printed at the end of the run (tests/conftest.py) and by bench/logs.py."""
    result = real_pastes.share(PASTES)
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
    """Python logging's time and "[Rank 15]:" before Megatron's line: detection and reading both see the peeled line,
    so a line detected as Megatron is also read as Megatron, never a silent zero."""
    (line,) = by_name("megatron/ibm-go-parser-rank-prefix").lines
    for wrapped in (line, " 3: " + line, "stdout: " + line, "[trainer1|1]:" + line):
        stream = LogStream("auto")
        (event,) = stream.feed_many([wrapped], real_pastes.READ_TIME)
        assert stream.format == "megatron" and event.record.step == 20 and stream.no_progress is None
        assert event.origin.endswith("Rank 15")


def updates(paste_name: str, facts) -> list:
    from mfu_exporter.logs import JobLog, Update

    stream = LogStream("auto")
    events = stream.feed_many(by_name(paste_name).lines, real_pastes.READ_TIME)
    return [u for u in JobLog().feed("train.log", events, facts) if isinstance(u, Update)]


def test_fork_fields_reach_the_job_model_in_their_unit_and_scope():
    from mfu_exporter.logs import Facts

    share = 8 / 16
    # Argonne's consumed tokens: a global running total, preferred over consumed samples.
    (update,) = updates("megatron/argonne-megatron-deepspeed-63", Facts(node_gpus=8, world_size=16, seq_len=4096))
    assert update.tokens_total == 42467328 * share and update.how.startswith("tokens seen")
    assert update.framework_tflops_per_gpu == 48.80  # [LM]TFLOPs, per GPU; [DS]TFLOPs is not read
    # TRL's num_tokens: a global running total too.
    first, second = updates("hf/trl-3926-sft-num-tokens", Facts(node_gpus=8, world_size=16))
    assert (first.tokens_total, second.tokens_total) == (5734 * share, 11421 * share)
    # NeMo 1.x's bar rounds consumed_samples (1.63e+6): step x global batch x seq_len where known, else the total.
    (exact,) = updates(
        "nemo/nemo-launcher-55-nemo1-bar", Facts(node_gpus=8, world_size=16, seq_len=2048, global_batch=2048)
    )
    assert exact.tokens_total == 794 * 2048 * 2048 * share and exact.how.startswith("step")
    (rounded,) = updates("nemo/nemo-launcher-55-nemo1-bar", Facts(node_gpus=8, world_size=16, seq_len=2048))
    assert rounded.tokens_total == 1.63e6 * 2048 * share and rounded.how.startswith("consumed samples")
    # NeMo Automodel's per-GPU tokens/s: integrated over the job's GPUs on this node, between lines 2 s apart.
    steps = updates("nemo/nemo-automodel-3473", Facts(node_gpus=8))
    assert steps[1].tokens_total - steps[0].tokens_total == pytest.approx(3960.80 * 8 * 2.0)


def test_a_named_format_whose_progress_lines_never_come_says_so():
    titan = by_name("torchtitan/torchtitan-3393-t4").lines
    stream = LogStream("megatron", detect_lines=10)
    assert stream.feed_many(titan, real_pastes.READ_TIME) == []
    assert stream.unrecognised and "format megatron is set, but none of the first 16 lines" in stream.unrecognised
