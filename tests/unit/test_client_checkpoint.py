"""ProgressReporter.checkpoint: started/finished/failed timed on the job's side, never raising into the job."""

import logging
import threading

import pytest

from mfu_exporter.client import ProgressReporter
from tests.support.fake_exporter import FakeExporter
from tests.support.wait import wait_until

CHECKPOINTS = "/api/v1/checkpoints"
PROGRESS = "/api/v1/progress"


@pytest.fixture
def exporter():
    with FakeExporter() as server:
        yield server


class Clocks:
    """The wall clock and the monotonic clock of the job, moved together by the test."""

    def __init__(self):
        self.wall = 1_800_000_000.0
        self.mono = 500.0

    def advance(self, seconds):
        self.wall += seconds
        self.mono += seconds


def reporter_with(exporter, clocks, **kwargs):
    # Without its start event and heartbeats, which test_client covers: these tests count checkpoint requests.
    kwargs = {"announce": False, "heartbeat": None, **kwargs}
    return ProgressReporter(
        exporter.url, "llama3-70b", clock=lambda: clocks.wall, monotonic=lambda: clocks.mono, **kwargs
    )


def test_a_save_sends_started_then_finished_with_its_duration_and_bytes(exporter):
    exporter.add(CHECKPOINTS)
    clocks = Clocks()
    reporter = reporter_with(exporter, clocks)
    with reporter.checkpoint("step-12000") as save:
        clocks.advance(42.5)
        save.bytes = 2**40
    reporter.close()
    assert exporter.bodies(CHECKPOINTS) == [
        {"job": "llama3-70b", "checkpoint": "step-12000", "phase": "started", "time": 1_800_000_000.0},
        {
            "job": "llama3-70b",
            "checkpoint": "step-12000",
            "phase": "finished",
            "time": 1_800_000_042.5,
            "duration_seconds": 42.5,
            "bytes": 2**40,
        },
    ]


def test_a_save_that_raises_sends_failed_and_the_jobs_exception_goes_on(exporter):
    exporter.add(CHECKPOINTS)
    clocks = Clocks()
    reporter = reporter_with(exporter, clocks)
    with pytest.raises(OSError, match="disk full"):
        with reporter.checkpoint("step-7"):
            clocks.advance(3)
            raise OSError("disk full")
    reporter.close()
    assert [(e["phase"], e.get("duration_seconds")) for e in exporter.bodies(CHECKPOINTS)] == [
        ("started", None),
        ("failed", 3),
    ]


def test_an_absent_exporter_never_raises_into_the_job_and_events_are_retried(exporter):
    exporter.add(CHECKPOINTS, drop=True)
    exporter.add(CHECKPOINTS, status=503)
    exporter.add(CHECKPOINTS)
    clocks = Clocks()
    reporter = reporter_with(exporter, clocks, max_backoff=0.01)
    with reporter.checkpoint("step-1") as save:
        save.bytes = "a lot"  # not a byte count: sent without it, no exception
    wait_until(lambda: reporter.sent == 2)
    reporter.close()
    phases = [e["phase"] for e in exporter.bodies(CHECKPOINTS)]
    assert phases == ["started", "started", "started", "finished"]  # retried in order, nothing lost
    assert "bytes" not in exporter.bodies(CHECKPOINTS)[-1]
    assert reporter.failures == 2


def test_rejected_events_are_not_retried(exporter):
    exporter.add(CHECKPOINTS, status=400, body={"error": "bad", "field": "checkpoint"})
    reporter = reporter_with(exporter, Clocks())
    with reporter.checkpoint("step-1"):
        pass
    reporter.close()
    assert len(exporter.bodies(CHECKPOINTS)) == 2


def test_checkpoint_events_are_not_coalesced_like_progress_totals(exporter):
    gate = threading.Event()
    entered = threading.Event()

    def slow(call):
        entered.set()
        gate.wait(5)
        return 200, {}

    exporter.add(PROGRESS, callback=slow)
    exporter.add(CHECKPOINTS)
    clocks = Clocks()
    reporter = reporter_with(exporter, clocks)
    reporter.update(tokens_total=1)
    assert entered.wait(5)  # the thread is busy with the first progress report
    for step in (100, 200):
        reporter.update(tokens_total=step)
        with reporter.checkpoint(f"step-{step}"):
            clocks.advance(1)
    gate.set()
    reporter.close()
    assert [(e["checkpoint"], e["phase"]) for e in exporter.bodies(CHECKPOINTS)] == [
        ("step-100", "started"),
        ("step-100", "finished"),
        ("step-200", "started"),
        ("step-200", "finished"),
    ]
    assert [body["tokens_total"] for body in exporter.bodies(PROGRESS)] == [1, 200]


def test_a_full_queue_drops_the_oldest_events_with_a_warning(exporter, caplog):
    gate = threading.Event()
    entered = threading.Event()

    def slow(call):
        entered.set()
        gate.wait(5)
        return 200, {}

    exporter.add(CHECKPOINTS, callback=slow)
    clocks = Clocks()
    reporter = reporter_with(exporter, clocks, checkpoint_queue=3)
    with reporter.checkpoint("step-1"):
        assert entered.wait(5)  # "started" of step-1 is in flight; the queue holds what follows
    with caplog.at_level(logging.WARNING, logger="mfu_exporter.client"):
        for step in (2, 3):
            with reporter.checkpoint(f"step-{step}"):
                pass
    gate.set()
    reporter.close()
    assert [(e["checkpoint"], e["phase"]) for e in exporter.bodies(CHECKPOINTS)] == [
        ("step-1", "started"),
        ("step-2", "finished"),
        ("step-3", "started"),
        ("step-3", "finished"),
    ]
    assert reporter.dropped_checkpoint_events == 2
    assert "dropping the oldest (finished of step-1)" in caplog.text
