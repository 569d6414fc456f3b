"""Each parser on lines built from its framework's format strings, on real pasted lines, and the transports."""

from __future__ import annotations

import pytest

from mfu_exporter.logs import Checkpoint, Line, LogStream, Progress, Restore, Startup
from mfu_exporter.logs.deepspeed import DeepSpeedParser
from mfu_exporter.logs.hf import HfParser
from mfu_exporter.logs.megatron import MegatronParser
from mfu_exporter.logs.nemo import NemoParser
from mfu_exporter.logs.regex import RegexParser
from mfu_exporter.logs.torchtitan import TorchtitanParser
from mfu_exporter.logs.transport import ANSI, Peeler, parse_rfc3339
from tests.unit.logs import framework_lines as fl

T0 = 1_787_300_000.0  # 2026-08-21


def feed_all(stream: LogStream, lines: list[str], read_time: float = T0):
    return [e for line in lines for e in stream.feed(line, read_time)]


def test_torchtitan_head_line_coloured_and_plain():
    parser = TorchtitanParser()
    for color in (True, False):
        text = fl.titan_logger(T0, fl.titan_step(100, 2.41032, 0.3312, 61.2, 77.3, 6875, 358.12, 36.21, color=color))
        (line,) = Peeler().feed("[rank0]:" + text)
        record = parser.parse(line)
        assert isinstance(record, Progress)
        assert (record.step, record.tokens_per_second_per_gpu, record.tflops_per_gpu) == (100, 6875, 358.12)
        assert record.mfu == pytest.approx(0.3621)
        assert record.time == pytest.approx(T0, abs=0.001)
        assert line.origin == "rank0"


def test_torchtitan_fp8_mfu_na_and_old_wps_layout():
    parser = TorchtitanParser()
    record = parser.parse(Line(fl.titan_step(10, 2.0, 0.1, 1.0, 1.0, 9120, 475.07, None, color=False)))
    assert record.mfu is None and record.tokens_per_second_per_gpu == 9120
    # <= 2024-11 (#697): f"step: {step:2}  loss: {loss:7.4f}  memory: ..GiB(..%)  wps: {round(wps):,}  mfu: {mfu:.2f}%"
    old = parser.parse(
        Line(f"step: {5:2}  loss: {3.1234:7.4f}  memory: {9.46:5.2f}GiB({64.9:.2f}%)  wps: {7330:,}  mfu: {0.17:.2f}%")
    )
    assert (old.step, old.tokens_per_second_per_gpu, old.tflops_per_gpu, old.mfu) == (
        5,
        7330,
        None,
        pytest.approx(0.0017),
    )


def test_torchtitan_real_t4_sample_start_up_and_checkpoint():
    """The real excerpt of torchtitan 2e998c0b1 (PR #3393), verbatim."""
    lines = [
        "[rank0]:[titan] 2026-05-18 16:04:29,785 - root - INFO - Trainer is initialized with local batch size 4, global batch size 8, gradient accumulation steps 1, sequence length 2048, total steps 50 (warmup 2)",  # noqa: E501 - verbatim
        "[rank0]:[titan] 2026-05-18 16:04:29,785 - root - INFO - Training starts at step 1",
        "[rank0]:[titan] 2026-05-18 16:04:31,772 - root - INFO - step:  1  loss:  8.10755  grad_norm:  1.4777  memory:  9.46GiB(64.94%)  tps: 3,460  tflops: 0.25  mfu: 0.08%",  # noqa: E501 - verbatim
        "[rank0]:[titan] 2026-05-18 16:04:41,837 - root - INFO - step: 10  loss:  3.58202  grad_norm:  1.3441  memory:  9.46GiB(64.99%)  tps: 7,330  tflops: 0.52  mfu: 0.17%",  # noqa: E501 - verbatim
        "[rank0]:[titan] 2026-05-18 16:05:26,896 - root - INFO - Saving the checkpoint.",
        "[rank0]:[titan] 2026-05-18 16:05:26,896 - root - INFO - Saving a full checkpoint at last step, step 50.",
        "[rank0]:[titan] 2026-05-18 16:05:27,419 - root - INFO - Last step checkpoint completed in 0.52s",
    ]
    events = feed_all(LogStream("auto"), lines)
    records = [e.record for e in events]
    assert records[0] == Startup(seq_len=2048, global_batch=8, tokens_per_step=16384.0)
    assert records[1] == Startup(first_step=1)
    assert [r.step for r in records if isinstance(r, Progress)] == [1, 10]
    start, end = [r for r in records if isinstance(r, Checkpoint)]
    assert start.phase == "start" and end.phase == "end" and end.duration == 0.52
    assert events[-1].time - events[-2].time == pytest.approx(0.523, abs=0.001)


def test_torchtitan_start_up_facts():
    parser = TorchtitanParser()
    size = parser.parse(Line(fl.titan_logger(T0, fl.titan_model_size("llama3", "8B", 8_030_261_248))))
    peak = parser.parse(Line(fl.titan_logger(T0, fl.titan_peak(989e12))))
    (text,) = [
        line.text for line in Peeler().feed(fl.titan_logger(T0, fl.titan_model_size("llama3", "8B", 8_030_261_248)))
    ]
    assert size == Startup(params=8_030_261_248) and parser.parse(Line(text)) == size
    assert peak == Startup(peak_flops_per_gpu=989e12)
    head = parser.parse(
        Line(
            fl.titan_logger(
                T0,
                "Trainer is initialized with 16384 tokens per DP rank, 131072 tokens per train step, gradient accumulation steps 1, maximum context length 8192, total steps 1000 (warmup 200)",  # noqa: E501 - verbatim
            )
        )
    )
    assert head == Startup(tokens_per_step=131072, seq_len=8192)


def test_megatron_layouts():
    parser = MegatronParser()
    line = fl.megatron_iteration(T0, 100, 500000, 51200, 5.4449, 412.3, 1.5e-4, 512, 2.345678)
    record = parser.parse(Line(line))
    assert (record.step, record.samples_seen, record.global_batch, record.tflops_per_gpu) == (100, 51200, 512, 412.3)
    assert record.step_seconds == pytest.approx(5.4449, abs=1e-4)
    assert record.time == pytest.approx(T0, abs=1e-5)
    no_stamp = parser.parse(Line(fl.megatron_iteration(T0, 7, 10, 3584, 1.0, None, 1e-4, 512, 2.0, stamp=False)))
    assert (no_stamp.step, no_stamp.time, no_stamp.tflops_per_gpu) == (7, None, None)
    # Real, NVIDIA/Megatron-LM#756 (timestamp without microseconds) and epfLLM/Megatron-LLM#11 (older layout).
    real = parser.parse(
        Line(
            " [2024-04-06 02:59:36] iteration       43/     100 | consumed samples:         5504 | elapsed time per iteration (ms): 5444.9 | throughput per GPU (TFLOP/s/GPU): 239.8 | learning rate: 8.600000E-06 | global batch size:   128 | lm loss: 1.825991E+00 | load_balancing_loss: 1.019746E+00 | loss scale: 1.0 | grad norm: 1.426 | num zeros: 0.0 | number of skipped iterations:   0 | number of nan iterations:   0 |"  # noqa: E501 - verbatim
        )
    )
    assert (real.step, real.samples_seen, real.tflops_per_gpu, real.global_batch) == (43, 5504, 239.8, 128)
    older = parser.parse(
        Line(
            " iteration      122/  250000 | consumed samples:       124928 | elapsed time per iteration (ms): 86545.2 | learning rate: 9.150E-06 | global batch size:  1024 | lm loss: 2.504220E+00 | loss scale: 1.0 | grad norm: 0.231 | number of skipped iterations:   0 | number of nan iterations:   0 |"  # noqa: E501 - verbatim
        )
    )
    assert (older.step, older.samples_seen, older.tflops_per_gpu, older.global_batch) == (122, 124928, None, 1024)


def test_megatron_arguments_and_checkpoints():
    parser = MegatronParser()
    facts = [parser.parse(Line(t)) for t in fl.megatron_args({"seq_length": 4096, "world_size": 16, "lr": 0.0001})]
    assert Startup(seq_len=4096) in facts and Startup(world_size=16) in facts
    begin = parser.parse(Line(fl.megatron_save_begin(T0, 100, "/ckpt/run1")))
    end = parser.parse(Line(fl.megatron_save_end(T0 + 8.6, 100, "/ckpt/run1")))
    assert (begin.phase, begin.step, begin.path) == ("start", 100, "/ckpt/run1")
    assert (end.phase, end.step) == ("end", 100) and end.time - begin.time == pytest.approx(8.6, abs=1e-5)
    # v2.6 / 23.04: 'saving checkpoint at iteration {:7d} to {}' and '  successfully saved checkpoint at iteration {:7d} to {}'
    assert parser.parse(Line("saving checkpoint at iteration {:7d} to {}".format(2000, "/c"))).phase == "start"
    assert (
        parser.parse(Line("  successfully saved checkpoint at iteration {:7d} to {}".format(2000, "/c"))).step == 2000
    )


def test_hf_dicts_v4_and_v5_with_the_tqdm_step():
    parser = HfParser()
    bar_then_record = fl.tqdm_bar(49, 1000) + "\r" + fl.tqdm_bar(50, 1000)
    for line in Peeler().feed(bar_then_record):
        assert parser.parse(line) is None
    v5 = fl.hf_log(
        {
            "loss": 2.1534,
            "grad_norm": 0.873,
            "learning_rate": 4.8e-05,
            "epoch": 0.1234,
            "num_input_tokens_seen": 13107200,
            "train_runtime": 412.3381,
            "train_tokens_per_second": 31787.621,
        }
    )
    record = parser.parse(Line(v5))
    assert (record.step, record.tokens_seen) == (50, 13107200)
    real = parser.parse(
        Line("{'loss': 1.2607, 'learning_rate': 6.31578947368421e-06, 'epoch': 0.03}")
    )  # stanford_alpaca#243
    assert real.tokens_seen is None and real.step == 50
    assert parser.parse(Line(str({"eval_loss": 1.0, "epoch": 1.0}))) is None
    save = parser.parse(Line(fl.hf_save("out/checkpoint-500")))
    assert (save.phase, save.step) == ("start", 500)


def test_nemo_real_line_and_checkpoint():
    stream = LogStream("auto")
    real = " 0: Training epoch 0, iteration 9/29 | lr: 5.988e-06 | global_batch_size: 512 | global_step: 9 | max_memory_reserved: 57466159104 | max_memory_allocated: 53930270720 | reduced_train_loss: 10.1 | train_step_timing in s: 27.88 | consumed_samples: 5120 | TFLOPS_per_GPU: 85.8"  # noqa: E501 - verbatim
    (event,) = stream.feed(real, T0)
    assert stream.format == "nemo" and event.origin == "0:"
    assert (event.record.step, event.record.samples_seen, event.record.global_batch) == (9, 5120, 512)
    assert (event.record.step_seconds, event.record.tflops_per_gpu) == (27.88, 85.8)
    built = fl.nemo_step(0, 101, 1000, {"global_step": 100.0, "consumed_samples": 51712.0, "TFLOPS_per_GPU": 412.345})
    assert NemoParser().parse(Line(built)).tflops_per_gpu == 412.3
    save = NemoParser().parse(Line(fl.nemo_logger(T0, "pl", 219, fl.nemo_save(0, 100, T0 - 9.876, 9.876))))
    assert (save.phase, save.step, save.duration) == ("end", 100, 9.876) and save.time == pytest.approx(T0, abs=1e-3)


def test_deepspeed_layouts_and_checkpoint():
    parser = DeepSpeedParser()
    line = fl.ds_logger(
        T0,
        "timer.py",
        215,
        "stop",
        fl.ds_throughput(0, 340, 34, 7.864669709950182, 8.00912418308922, 59.65, 63.31),
    )
    record = parser.parse(Line(line))
    assert (record.step, record.samples_per_second) == (34, pytest.approx(8.00912418308922))
    assert record.time == pytest.approx(T0, abs=1e-3)
    old = parser.parse(
        Line(
            "[2022-03-11 02:06:58,985] [INFO] [timer.py:189:stop] 0/40, SamplesPerSec=83.48609168106144, MemAllocated=0.26GB, MaxMemAllocated=9.02GB"  # noqa: E501 - verbatim
        )
    )
    assert (old.step, old.samples_per_second) == (40, pytest.approx(83.486, rel=1e-4))
    save = parser.parse(Line(fl.ds_logger(T0, "logging.py", 96, "log_dist", fl.ds_save("global_step100"))))
    assert (save.phase, save.step) == ("start", 100)


def test_regex_named_groups():
    parser = RegexParser(r"it (?P<step>\d+) seen (?P<tokens_seen>[\d.e+]+) mfu (?P<mfu>[\d.]+%)")
    record = parser.parse(Line("xx it 12 seen 1.5e6 mfu 48.5% yy"))
    assert (record.step, record.tokens_seen, record.mfu) == (12, 1.5e6, pytest.approx(0.485))
    assert parser.parse(Line("nothing")) is None


def test_cri_partial_lines_join_per_stream_and_rfc3339_nanoseconds():
    line = fl.titan_logger(T0, fl.titan_step(100, 2.4, 0.3, 61.2, 77.3, 6875, 358.12, 36.21))
    peeler = Peeler()
    raw = [
        fl.cri(T0, line[:30], tag="P"),
        fl.cri(T0, "tqdm noise", stream="stderr"),
        fl.cri(T0 + 0.5, line[30:70], tag="P"),
        fl.cri(T0 + 1, line[70:], tag="F"),
    ]
    out = [item for r in raw for item in peeler.feed(r)]
    assert [o.text for o in out] == ["tqdm noise", ANSI.sub("", line)]
    assert TorchtitanParser().parse(out[1]).step == 100
    assert out[1].time == pytest.approx(T0 + 1, abs=1e-6)
    assert parse_rfc3339("2016-10-06T00:17:09.669794202Z") == pytest.approx(1475713029.669794202)
    assert parse_rfc3339("2016-10-06T02:17:09+02:00") == 1475713029


def test_cri_overlong_partial_line_is_dropped_and_counted():
    peeler = Peeler(max_line_chars=100)
    out = []
    for _ in range(10):
        out += peeler.feed(fl.cri(T0, "x" * 40, tag="P"))
    out += peeler.feed(fl.cri(T0, "end of the long one"))
    out += peeler.feed(fl.cri(T0, "next"))
    assert [o.text for o in out] == ["next"] and peeler.errors["line_too_long"] == 1


def test_docker_json_srun_label_torchrun_prefix_and_carriage_returns():
    peeler = Peeler()
    (line,) = peeler.feed(
        '{"log":"[default3]:step: 1  loss: 1.0  tps: 5  mfu: 1.00%\\n","stream":"stdout","time":"2016-10-20T18:39:20.57606443Z"}'
    )
    assert (
        line.origin == "default3"
        and line.text.startswith("step: 1")
        and line.time == pytest.approx(1476988760.57606443)
    )
    pieces = list(Peeler().feed("1: [rank8]:" + fl.tqdm_bar(1, 10) + "\r" + fl.tqdm_bar(2, 10) + "\r{'loss': 1.0}"))
    assert [p.origin for p in pieces] == ["1:rank8"] * 3 and pieces[-1].text == "{'loss': 1.0}"


def test_auto_detection_never_guesses_and_reports_an_unknown_log_once():
    stream = LogStream("auto", detect_lines=50)
    for i in range(60):
        assert stream.feed(f"epoch {i} done, loss 1.0", T0) == []
    assert stream.format is None and "no line of a known format in the first 50 lines" in stream.unrecognised
    # Start-up lines before the first step are parsed once the format is known.
    events = feed_all(
        stream,
        fl.megatron_args({"seq_length": 2048}) + [fl.megatron_iteration(T0, 10, 100, 640, 1.0, None, 1e-4, 64, 2.0)],
    )
    assert stream.format == "megatron" and stream.unrecognised is None
    assert [type(e.record).__name__ for e in events] == ["Startup", "Progress"]


@pytest.mark.parametrize(
    "line, expected",
    [
        (fl.titan_logger(T0, "Building model"), "torchtitan"),
        (fl.megatron_iteration(T0, 1, 10, 8, 1.0, 1.0, 1e-4, 8, 2.0), "megatron"),
        (fl.hf_log({"loss": 1.0, "epoch": 0.1}), "hf"),
        (fl.nemo_step(0, 2, 10, {"global_step": 1.0}), "nemo"),
        (fl.ds_logger(T0, "timer.py", 215, "stop", fl.ds_throughput(0, 10, 10, 1.0, 1.0, 1, 1)), "deepspeed"),
    ],
)
def test_auto_detects_each_framework(line, expected):
    stream = LogStream("auto")
    stream.feed(line, T0)
    assert stream.format == expected


# Checkpoint loads at start-up (the time ledger's checkpoint_load): each line built from its framework's format string, cited in the
# parser's module.
LOADS = [
    (
        TorchtitanParser,
        "[titan] 2026-08-21 10:00:00,000 - root - INFO - Loading the checkpoint from ./outputs/checkpoint/step-100.",
        Restore("start", step=100),
    ),
    (
        TorchtitanParser,
        "[titan] 2026-08-21 10:00:15,000 - root - INFO - Finished loading the checkpoint in 15.00 seconds.",
        Restore("end", duration=15.0),
    ),
    (TorchtitanParser, "Loading the checkpoint at step 100", Restore("start", step=100)),
    (MegatronParser, " loading checkpoint from /ckpt at iteration 100", Restore("start", step=100)),
    (
        MegatronParser,
        "  successfully loaded checkpoint from /ckpt [ t 1/8, p 1/4 ] at iteration 100",
        Restore("end", step=100),
    ),
    (
        MegatronParser,
        "  successfully loaded checkpoint from /ckpt [ t 0, p 0 ] at iteration 100",
        Restore("end", step=100),
    ),
    (HfParser, "Loading model from /out/checkpoint-100.", Restore("start", step=100)),
    (HfParser, "  Continuing training from global step 100", Restore("end", step=100)),
    (
        NemoParser,
        "Restoring states from the checkpoint path at /r/ckpt/m--step=100-last.ckpt",
        Restore("start", step=100),
    ),
    (
        NemoParser,
        "INFO:lightning.pytorch.utilities.rank_zero:Restored all states from the checkpoint at /r/last.ckpt",
        Restore("end"),
    ),
]


@pytest.mark.parametrize(("parser", "text", "expected"), LOADS)
def test_checkpoint_load_lines(parser, text, expected):
    record = parser().parse(Line(text))
    assert isinstance(record, Restore)
    assert (record.phase, record.step, record.duration) == (expected.phase, expected.step, expected.duration)


def test_start_up_lines_after_progress_are_a_new_run_and_the_load_bounds_its_restore():
    from mfu_exporter.logs import Facts, JobLog, RunAction

    stream, joblog = LogStream("torchtitan"), JobLog()
    t = fl.titan_logger
    lines = [
        t(T0, "Training starts at step 1"),
        t(T0 + 1, fl.titan_step(1, 2.4, 0.3, 61.2, 77.3, 6875, 358.12, 36.21, color=False)),
        t(T0 + 60, "Loading the checkpoint from ./outputs/checkpoint/step-100."),
        t(T0 + 75, "Finished loading the checkpoint in 15.00 seconds."),
        t(T0 + 75, "Training starts at step 101"),
    ]
    out = joblog.feed("f", feed_all(stream, lines), Facts(node_gpus=8, world_size=8))
    actions = [(a.event, a.step) for a in out if isinstance(a, RunAction)]
    assert actions == [
        ("start", None),
        ("training_starts", 1),
        ("start", None),
        ("checkpoint_load_started", 100),
        ("checkpoint_load_finished", None),
        ("training_starts", 101),
    ]
    again = joblog.feed("f", feed_all(stream, [t(T0 + 99, "Training starts at step 1")]), Facts(), live=False)
    assert not [a for a in again if isinstance(a, RunAction)]  # a file's head read at a restart is history
