"""ProgressReporter.checkpoint: started/finished/failed timed on the job's side, never raising into the job."""

import json
import logging
import threading

import pytest
import requests
import responses

from mfu_exporter.client import ProgressReporter
from tests.support.wait import wait_until

URL = "http://exporter.test:9495"
CHECKPOINTS = URL + "/api/v1/checkpoints"
PROGRESS = URL + "/api/v1/progress"


class Clocks:
    """The wall clock and the monotonic clock of the job, moved together by the test."""

    def __init__(self):
        self.wall = 1_800_000_000.0
        self.mono = 500.0

    def advance(self, seconds):
        self.wall += seconds
        self.mono += seconds


def reporter_with(clocks, **kwargs):
    # Without its start event and heartbeats, which test_client covers: these tests count checkpoint requests.
    kwargs = {"announce": False, "heartbeat": None, **kwargs}
    return ProgressReporter(URL, "llama3-70b", clock=lambda: clocks.wall, monotonic=lambda: clocks.mono, **kwargs)


def sent(url=CHECKPOINTS):
    return [json.loads(call.request.body) for call in responses.calls if call.request.url == url]


@responses.activate
def test_a_save_sends_started_then_finished_with_its_duration_and_bytes():
    responses.post(CHECKPOINTS, json={})
    clocks = Clocks()
    reporter = reporter_with(clocks)
    with reporter.checkpoint("step-12000") as save:
        clocks.advance(42.5)
        save.bytes = 2**40
    reporter.close()
    assert sent() == [
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


@responses.activate
def test_a_save_that_raises_sends_failed_and_the_jobs_exception_goes_on():
    responses.post(CHECKPOINTS, json={})
    clocks = Clocks()
    reporter = reporter_with(clocks)
    with pytest.raises(OSError, match="disk full"):
        with reporter.checkpoint("step-7"):
            clocks.advance(3)
            raise OSError("disk full")
    reporter.close()
    assert [(e["phase"], e.get("duration_seconds")) for e in sent()] == [("started", None), ("failed", 3)]


@responses.activate
def test_an_absent_exporter_never_raises_into_the_job_and_events_are_retried():
    responses.post(CHECKPOINTS, body=requests.ConnectionError("refused"))
    responses.post(CHECKPOINTS, status=503)
    responses.post(CHECKPOINTS, json={})
    clocks = Clocks()
    reporter = reporter_with(clocks, max_backoff=0.01)
    with reporter.checkpoint("step-1") as save:
        save.bytes = "a lot"  # not a byte count: sent without it, no exception
    wait_until(lambda: reporter.sent == 2)
    reporter.close()
    phases = [e["phase"] for e in sent()]
    assert phases == ["started", "started", "started", "finished"]  # retried in order, nothing lost
    assert "bytes" not in sent()[-1]
    assert reporter.failures == 2


@responses.activate
def test_rejected_events_are_not_retried():
    responses.post(CHECKPOINTS, status=400, json={"error": "bad", "field": "checkpoint"})
    reporter = reporter_with(Clocks())
    with reporter.checkpoint("step-1"):
        pass
    reporter.close()
    assert len(sent()) == 2


@responses.activate
def test_checkpoint_events_are_not_coalesced_like_progress_totals():
    gate = threading.Event()
    entered = threading.Event()

    def slow(request):
        entered.set()
        gate.wait(5)
        return (200, {}, "{}")

    responses.add_callback(responses.POST, PROGRESS, callback=slow)
    responses.post(CHECKPOINTS, json={})
    clocks = Clocks()
    reporter = reporter_with(clocks)
    reporter.update(tokens_total=1)
    assert entered.wait(5)  # the thread is busy with the first progress report
    for step in (100, 200):
        reporter.update(tokens_total=step)
        with reporter.checkpoint(f"step-{step}"):
            clocks.advance(1)
    gate.set()
    reporter.close()
    assert [(e["checkpoint"], e["phase"]) for e in sent()] == [
        ("step-100", "started"),
        ("step-100", "finished"),
        ("step-200", "started"),
        ("step-200", "finished"),
    ]
    assert [
        json.loads(body)["tokens_total"]
        for body in [c.request.body for c in responses.calls if c.request.url == PROGRESS]
    ] == [1, 200]


@responses.activate
def test_a_full_queue_drops_the_oldest_events_with_a_warning(caplog):
    gate = threading.Event()
    entered = threading.Event()

    def slow(request):
        entered.set()
        gate.wait(5)
        return (200, {}, "{}")

    responses.add_callback(responses.POST, CHECKPOINTS, callback=slow)
    clocks = Clocks()
    reporter = reporter_with(clocks, checkpoint_queue=3)
    with reporter.checkpoint("step-1"):
        assert entered.wait(5)  # "started" of step-1 is in flight; the queue holds what follows
    with caplog.at_level(logging.WARNING, logger="mfu_exporter.client"):
        for step in (2, 3):
            with reporter.checkpoint(f"step-{step}"):
                pass
    gate.set()
    reporter.close()
    assert [(e["checkpoint"], e["phase"]) for e in sent()] == [
        ("step-1", "started"),
        ("step-2", "finished"),
        ("step-3", "started"),
        ("step-3", "finished"),
    ]
    assert reporter.dropped_checkpoint_events == 2
    assert "dropping the oldest (finished of step-1)" in caplog.text
