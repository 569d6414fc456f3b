"""A job's data wait (mfu_exporter.model.datawait): running totals of one rank's wait to GPU-seconds and a share."""

import pytest

from mfu_exporter.model.datawait import RECENT_SECONDS, DataWaitMeter


def test_running_totals_count_each_increase_once_per_gpu_and_a_lower_total_is_a_new_process():
    meter = DataWaitMeter("client")
    meter.observe(100.0, 4.0, 8, "client")  # the first figure counts whole: the job's wait before we saw it
    meter.observe(110.0, 6.0, 8, "client")
    meter.observe(120.0, 1.0, 8, "client")  # restarted: its total starts again from zero
    meter.observe(130.0, 3.0, 4, "client")  # the job now has 4 GPUs here
    assert meter.rank_seconds == pytest.approx(4 + 2 + 1 + 2)
    assert meter.gpu_seconds == pytest.approx(8 * (4 + 2 + 1) + 4 * 2)


def test_the_share_is_the_wait_over_wall_time_in_the_window_and_never_above_one():
    meter = DataWaitMeter("log:megatron")
    for t, total in [(0.0, 0.0), (30.0, 3.0), (60.0, 6.0), (90.0, 15.0)]:
        meter.observe(t, total, 8, "log:megatron")
    assert meter.share(90.0, 60.0) == pytest.approx((15.0 - 3.0) / 60.0)
    assert meter.share(90.0, 10.0) == pytest.approx(9.0 / 30.0)  # sparser than the window: the last interval
    meter.observe(91.0, 30.0, 8, "log:megatron")  # a figure that says more wait than wall time
    assert meter.share(91.0, 1.0) == 1.0


def test_no_share_from_one_figure_or_figures_closer_than_a_second():
    meter = DataWaitMeter("client")
    meter.observe(10.0, 1.0, 1, "client")
    assert meter.share(10.0, 60.0) is None
    meter.observe(10.5, 1.2, 1, "client")
    assert meter.share(10.5, 60.0) is None


def test_the_recent_share_shows_a_loader_that_starts_waiting_before_the_windows_share_does():
    meter = DataWaitMeter("client")
    total = 0.0
    for second in range(33):  # a figure each second: 5 % of wall time waited, then 40 % from second 30 on
        total += 0.05 if second <= 30 else 0.4
        meter.observe(float(second), total, 8, "client")
    assert meter.share(32.0, 15.0) < 0.10  # the MFU window's share, still under the input line
    assert meter.share(32.0, RECENT_SECONDS) == pytest.approx(0.4)
