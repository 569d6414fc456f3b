"""Checkpoint restores (mfu_exporter.model.restore): a load's time from the ledger's bands, its bytes from the checkpoint
mounts' read counters around it, and the loads it cannot measure."""

import pytest

from mfu_exporter.model.ledger import Ledger
from mfu_exporter.model.restore import RestoreMeter
from tests.support.known_truth import END, play

LOAD = [(1, 2, 200.0, 215.0)]  # (number, run, start, end): the ledger's ended loads


def test_a_loads_bytes_are_the_mounts_reads_from_the_sample_before_it_to_the_one_after():
    meter = RestoreMeter()
    for at, value in ((195.0, 1000.0), (205.0, 21000.0), (220.0, 51000.0)):
        meter.observe_mounts(at, {"/ckpt": value})
    meter.observe_job("llama", LOAD, ("/ckpt",), now=221.0)
    total = meter.totals()["llama"]
    # From the sample at 195 (1000), the last at or before the start, to the one at 220 (51000), the first after the end.
    assert (total.loads, total.seconds, total.read_bytes, total.loads_with_bytes) == (1, 15.0, 50000.0, 1)
    assert total.last_bandwidth == pytest.approx(50000.0 / 15)
    meter.observe_job("llama", LOAD, ("/ckpt",), now=222.0)
    assert meter.totals()["llama"].loads == 1  # counted once


def test_a_load_waits_for_its_end_and_for_the_sample_after_it():
    meter = RestoreMeter()
    meter.observe_mounts(190.0, {"/ckpt": 0.0})
    meter.observe_job("llama", [], ("/ckpt",), now=216.0)  # still loading: the ledger has not ended it
    meter.observe_job("llama", LOAD, ("/ckpt",), now=216.0)  # ended, but no sample after 215 yet
    assert meter.totals() == {}
    meter.observe_mounts(216.0, {"/ckpt": 26000.0})
    meter.observe_job("llama", LOAD, ("/ckpt",), now=217.0)
    assert meter.totals()["llama"].read_bytes == pytest.approx(26000.0)


def test_loads_the_counters_do_not_cover_count_without_bytes():
    started_during = RestoreMeter()
    started_during.observe_mounts(205.0, {"/ckpt": 0.0})
    started_during.observe_mounts(220.0, {"/ckpt": 10.0})
    started_during.observe_job("llama", LOAD, ("/ckpt",), now=221.0)
    no_mount = RestoreMeter()
    no_mount.observe_job("llama", LOAD, (), now=221.0)
    stopped = RestoreMeter()
    stopped.observe_mounts(190.0, {"/ckpt": 0.0})
    stopped.observe_job("llama", LOAD, ("/ckpt",), now=300.0)
    assert stopped.totals() == {}  # the storage source may still sample
    stopped.observe_job("llama", LOAD, ("/ckpt",), now=900.0)
    for meter in (started_during, no_mount, stopped):
        total = meter.totals()["llama"]
        assert (total.loads, total.seconds, total.loads_with_bytes, total.last_bandwidth) == (1, 15.0, 0, None)
    remounted = RestoreMeter()
    remounted.observe_mounts(190.0, {"/ckpt": 5000.0})
    remounted.observe_mounts(210.0, {"/ckpt": 10.0})  # the counter went back: the samples before are forgotten
    remounted.observe_mounts(230.0, {"/ckpt": 20.0})
    remounted.observe_job("llama", LOAD, ("/ckpt",), now=231.0)
    assert remounted.totals()["llama"].loads_with_bytes == 0
    remounted.forget(["llama"])
    assert remounted.totals() == {}


def test_the_known_truth_runs_load_from_a_real_ledger():
    ledger = Ledger(gpus=4)
    offset = 1_800_000_000.0
    play(ledger, offset)
    view = ledger.view(END, offset)
    (load,) = [band for band in view.bands if band[1] == "checkpoint_load"]
    assert view.loads == ((1, load[0], load[2], load[3]),)
    meter = RestoreMeter()
    rate = 3e9
    for second in range(int(load[2]) - 10, int(load[3]) + 10, 5):
        meter.observe_mounts(float(second), {"/ckpt": rate * max(0.0, min(second, load[3]) - load[2])})
    meter.observe_job("llama", view.loads, ("/ckpt",), now=load[3] + 20)
    total = meter.totals()["llama"]
    assert total.loads == 1 and total.seconds == load[3] - load[2]
    assert total.last_bandwidth == pytest.approx(rate)


def test_one_load_counts_once_however_the_clocks_move_between_ticks():
    # Each view converts the ledger's monotonic times with the clocks' offset of that instant, which moves by a
    # little every tick and by a lot when the wall clock steps: the load's number, not its start, identifies it.
    ledger = Ledger(gpus=8)
    ledger.start_run(0.0, 1e9, "client")
    ledger.load("started", 10.0, 1e9)
    ledger.load("finished", 40.0, 1e9)
    ledger.progress(60.0, 1e9, 101.0, "client")
    meter = RestoreMeter()
    for tick in range(300):
        offset = 1e9 + tick * 1e-4 + (3600.0 if tick > 200 else 0.0)
        ledger.tick(100.0 + tick, offset)
        meter.observe_job("llama", ledger.view(100.0 + tick, offset).loads, (), now=1e9 + 100.0 + tick)
    assert meter.totals()["llama"].loads == 1
    assert meter.totals()["llama"].seconds == pytest.approx(30.0)


def test_the_loads_a_meter_remembers_are_one_number_per_job():
    meter = RestoreMeter()
    loads = [(n, 1, 100.0 * n, 100.0 * n + 5) for n in range(1, 40)]
    for upto in range(1, 40):
        meter.observe_job("llama", loads[max(upto - 16, 0) : upto], (), now=1e6)
    assert meter.totals()["llama"].loads == 39
    assert meter._counted == {"llama": 39}
