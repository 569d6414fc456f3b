"""Lightning's CSVLogger metrics.csv with a ThroughputMonitor, as lightning 2.6.6 wrote it for the tiny GPT-2 of
tests/support/realjobs (log_every_n_steps 50, flushed every 100 steps, the module's train_loss in rows of its own)."""

from __future__ import annotations

import pytest

from mfu_exporter.logs import Facts, JobLog, LogStream, Progress, Update
from mfu_exporter.logs.lightning_csv import LightningCsvParser
from mfu_exporter.logs.records import Line

T0 = 1_780_000_000.0
# Written by tests/support/realjobs/lightning_run.py (400 steps, batch 8 of 128 tokens), its first rows verbatim.
HEADER = (
    "epoch,step,train/batches,train/device/batches_per_sec,train/device/flops_per_sec,train/device/items_per_sec,"
    "train/device/samples_per_sec,train/lengths,train/samples,train/time,train_loss"
)
ROWS = [
    "0,49,50,,,,,51200,400,2.110289105999982,",
    "0,49,,,,,,,,,5.557274341583252",
    "0,99,100,23.879598387617403,72113972425.6156,24452.70874892022,191.03678710093922,102400,800,4.21436169499998,",
    "0,99,,,,,,,,,5.550743579864502",
    "0,149,150,24.882491654015062,75142608677.56944,25479.671453711424,199.0599332321205,153600,1200,6.133993641000018,",
]


def test_rows_with_the_monitor_s_totals_are_progress_per_device_and_the_loss_rows_are_not():
    parser = LightningCsvParser()
    assert parser.parse(Line(HEADER)) is None
    records = [parser.parse(Line(row)) for row in ROWS]
    assert [r is not None for r in records] == [True, False, True, False, True]
    first, _, second, _, third = records
    # The monitor's window is not full yet: no FLOP/s. Its clock: seconds since the stage began.
    assert first == Progress(step=49, tokens_seen_per_device=51200.0, elapsed=2.110289105999982)
    assert (second.step, second.tokens_seen_per_device) == (99, 102400.0)
    assert second.tflops_per_gpu == pytest.approx(0.0721139724256156)
    assert second.mfu is None  # Lightning knows no CPU peak: no train/device/mfu column
    assert third.step == 149


def test_no_row_is_read_before_a_header_and_a_rewritten_header_remaps_the_columns():
    parser = LightningCsvParser()
    assert parser.parse(Line(ROWS[0])) is None
    # A new column rewrites the file, header first, columns sorted: the same row has moved.
    parser.parse(Line("epoch,lr,step,train/lengths,train/samples"))
    record = parser.parse(Line("0,0.001,199,204800,1600"))
    assert (record.step, record.tokens_seen_per_device) == (199, 204800.0)
    # Without length_fn: samples per device, which need seq_len.
    parser.parse(Line("epoch,step,train/batches,train/samples,train/time"))
    record = parser.parse(Line("0,49,50,400,2.1"))
    assert (record.tokens_seen_per_device, record.samples_seen_per_device) == (None, 400.0)


def test_a_named_lightning_csv_stream_gives_this_node_s_tokens_per_device_times_its_devices():
    stream = LogStream("lightning_csv")
    events = stream.feed_many([HEADER, *ROWS], T0)
    assert stream.format == "lightning_csv" and stream.no_progress is None
    updates = [u for u in JobLog().feed("metrics.csv", events, Facts(node_gpus=2)) if isinstance(u, Update)]
    assert [u.tokens_total for u in updates] == [102400.0, 204800.0, 307200.0]
    assert updates[0].how == "tokens seen per device × node GPUs"
    assert updates[1].framework_tflops_per_gpu == pytest.approx(0.0721139724256156)
    # Samples per device: × seq_len × devices.
    stream = LogStream("lightning_csv")
    events = stream.feed_many(["step,train/samples", "49,400"], T0)
    (update,) = JobLog().feed("metrics.csv", events, Facts(node_gpus=1, seq_len=128))
    assert update.tokens_total == 400 * 128
    (update,) = JobLog().feed(
        "metrics.csv", LogStream("lightning_csv").feed_many(["step,train/samples", "49,400"], T0), Facts(node_gpus=1)
    )
    assert update.tokens_total is None and "seq_len" in update.reason


def test_auto_detection_does_not_take_csv_rows():
    """Its rows carry no keyword: auto never reads a CSV file (a file names the format)."""
    stream = LogStream("auto")
    assert stream.feed_many([HEADER, *ROWS], T0) == []
    assert stream.format is None


def test_rows_are_dated_by_the_job_s_own_clock_from_when_the_first_flush_was_read():
    """A flush of two rows read at once, late (the file found a glob interval after it appeared): the newest row is
    dated when it was read, the older one its own interval before, and later flushes keep the job's intervals; a
    clock that goes back (a new run) anchors again."""
    stream = LogStream("lightning_csv")
    late = 0.8
    first = stream.feed_many([HEADER, *ROWS[:4]], T0 + late)
    assert [round(e.time - T0, 6) for e in first] == [round(late - (4.21436169499998 - 2.110289105999982), 6), late]
    (third,) = stream.feed_many([ROWS[4]], T0 + late + 5.0)  # read 5 s later, written 1.92 s after the last
    assert third.time - first[-1].time == pytest.approx(6.133993641000018 - 4.21436169499998)
    (restarted,) = stream.feed_many(["0,49,50,,,,,51200,400,2.0,"], T0 + 100.0)
    assert restarted.time == pytest.approx(T0 + 100.0)


def test_a_rewritten_file_read_again_from_its_header_gives_only_the_rows_not_read_before():
    """A new column (the monitor's window filling) rewrites metrics.csv whole; the follower reads it from the start:
    the rows already read are no progress again, the new ones are, under the new header's columns."""
    parser = LightningCsvParser()
    parser.parse(Line("epoch,step,train/batches,train/lengths,train/samples,train/time,train_loss"))
    assert parser.parse(Line("0,49,50,51200,400,2.1,")).tokens_seen_per_device == 51200
    parser.parse(Line(HEADER))  # the rewrite: more columns, sorted
    assert parser.parse(Line("0,49,50,,,,,51200,400,2.1,")) is None  # row 49 again
    assert parser.parse(Line(ROWS[2])).tokens_seen_per_device == 102400
    # A new run from step 49 (resumed from a checkpoint): its own clock, so progress again.
    assert parser.parse(Line("0,49,50,,,,,51200,400,1.5,")).step == 49
