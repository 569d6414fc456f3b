import json
import threading
import time

import requests
import responses

from mfu_exporter.client import ProgressReporter as Reporter
from tests.support.wait import wait_until

URL = "http://exporter.test:9495"
PROGRESS = URL + "/api/v1/progress"


def ProgressReporter(*args, **kwargs):
    """A reporter without its start event and heartbeats: these tests count the requests its totals make (the run
    events have their own tests below)."""
    return Reporter(*args, **{"announce": False, "heartbeat": None, **kwargs})


@responses.activate
def test_reports_carry_model_facts_and_time():
    responses.post(PROGRESS, json={})
    reporter = ProgressReporter(URL, "llama3-70b", model={"params": "70B"}, gpus=8, clock=lambda: 1234.5)
    reporter.update(tokens_total=1000, step=3)
    reporter.close()
    # The update, unless close() came first and sent it as the final report; that one says the job finished.
    assert 1 <= len(responses.calls) <= 2
    body = responses.calls[-1].request.body
    assert b'"state": "finished"' in body
    assert b'"tokens_total": 1000' in body and b'"step": 3' in body and b'"time": 1234.5' in body
    assert b'"model": {"params": "70B"}' in body and b'"gpus": 8' in body


@responses.activate
def test_retries_with_backoff_until_the_exporter_answers():
    responses.post(PROGRESS, status=503)
    responses.post(PROGRESS, body=requests.ConnectionError("refused"))
    responses.post(PROGRESS, json={})
    reporter = ProgressReporter(URL, "job", max_backoff=0.01)
    reporter.update(tokens_total=10)
    wait_until(lambda: reporter.sent == 1)
    reporter.close()
    assert len(responses.calls) == 4  # the last: close() saying the job finished
    assert (
        b'"state"' not in responses.calls[2].request.body and b'"state": "finished"' in responses.calls[3].request.body
    )
    assert reporter.failures == 2


@responses.activate
def test_newest_totals_replace_unsent_ones():
    gate = threading.Event()
    bodies = []

    def slow(request):
        gate.wait(5)
        bodies.append(request.body)
        return (200, {}, "{}")

    responses.add_callback(responses.POST, PROGRESS, callback=slow)
    reporter = ProgressReporter(URL, "job")
    reporter.update(tokens_total=1)
    wait_until(lambda: len(responses.calls) == 0 and reporter._pending is None)
    for total in range(2, 1002):
        reporter.update(tokens_total=total)  # the first request is still in flight
    gate.set()
    reporter.close()
    assert len(bodies) == 2
    assert b'"tokens_total": 1001' in bodies[1]


def test_update_never_blocks_or_raises_when_the_exporter_is_gone():
    session = requests.Session()
    session.post = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom"))
    reporter = ProgressReporter(URL, "job", session=session, max_backoff=0.01)
    started = time.monotonic()
    for total in range(10_000):
        reporter.update(tokens_total=total)
    assert time.monotonic() - started < 5  # 10k updates: no network wait in the training step
    reporter.close(timeout=0.5)
    assert reporter.sent == 0 and reporter.failures >= 1


@responses.activate
def test_a_rejected_report_is_not_retried():
    responses.post(PROGRESS, status=400, json={"error": "bad", "field": "job"})
    reporter = ProgressReporter(URL, "job")
    reporter.update(tokens_total=1)
    reporter.close()
    assert len(responses.calls) == 1


@responses.activate
def test_close_flushes_the_pending_total():
    responses.post(PROGRESS, json={})
    with ProgressReporter(URL, "job") as reporter:
        reporter.update(tokens_total=42)
    assert b'"tokens_total": 42' in responses.calls[-1].request.body


@responses.activate
def test_close_and_the_context_manager_say_how_the_job_ended():
    responses.post(PROGRESS, json={})

    def final_state(exit_with: type[BaseException] | None) -> bytes:
        responses.calls.reset()
        try:
            with ProgressReporter(URL, "job") as reporter:
                reporter.update(tokens_total=10)
                if exit_with is not None:
                    raise exit_with()
        except BaseException as exc:  # noqa: BLE001 - the job's own exception passes through untouched
            assert exit_with is not None and isinstance(exc, exit_with)
        return responses.calls[-1].request.body

    assert b'"state": "finished"' in final_state(None)
    assert b'"state": "failed"' in final_state(RuntimeError)
    assert b'"state": "cancelled"' in final_state(KeyboardInterrupt)
    responses.calls.reset()
    reporter = ProgressReporter(URL, "job")
    reporter.update(tokens_total=5)
    wait_until(lambda: reporter.sent == 1)
    reporter.close(state="cancelled")
    reporter.update(tokens_total=6)  # after the end: dropped, or it would start a new run
    assert [b'"state"' in c.request.body for c in responses.calls] == [False, True]
    assert (
        b'"state": "cancelled"' in responses.calls[1].request.body
        and b'"tokens_total": 5' in responses.calls[1].request.body
    )


@responses.activate
def test_a_reporter_that_never_reported_sends_nothing_on_close_and_a_bad_state_is_finished():
    responses.post(PROGRESS, json={})
    ProgressReporter(URL, "idle").close()
    assert len(responses.calls) == 0
    reporter = ProgressReporter(URL, "job")
    reporter.update(tokens_total=1)
    reporter.close(state="exploded")
    assert b'"state": "finished"' in responses.calls[-1].request.body


def test_job_name_from_the_environment_matches_discovery():
    from mfu_exporter.client import ProgressReporter, job_name_from_env

    assert job_name_from_env({"MFU_TRAINING_JOB": "team/llama 70b", "SLURM_JOB_ID": "1"}) == "team_llama_70b"
    assert job_name_from_env({"SLURM_JOB_ID": "4242"}) == "4242"
    assert job_name_from_env({"KUBERNETES_SERVICE_HOST": "10.0.0.1", "HOSTNAME": "llama-worker-3"}) == "llama"
    assert job_name_from_env({"HOSTNAME": "llama-worker-3"}) is None  # not in a pod: no guess from a host name
    assert job_name_from_env({}) is None
    import os
    from unittest import mock

    with mock.patch.dict(os.environ, {"SLURM_JOB_ID": "77"}, clear=True):
        reporter = ProgressReporter("http://127.0.0.1:9", session=None)
        assert reporter.job == "77"
        reporter.close(timeout=0.1)
    with mock.patch.dict(os.environ, {}, clear=True):
        import pytest

        with pytest.raises(ValueError, match="MFU_TRAINING_JOB"):
            ProgressReporter("http://127.0.0.1:9")


@responses.activate
def test_a_reporter_announces_its_run_sends_heartbeats_and_times_a_checkpoint_load():
    responses.post(PROGRESS, json={})
    monotonic = [100.0]
    reporter = Reporter(
        URL,
        "job",
        run_id="run-1",
        heartbeat=0.05,
        clock=lambda: 1234.5,
        monotonic=lambda: monotonic[0] + time.monotonic(),
        gpus=8,
    )
    with reporter.checkpoint_load(step=100):
        monotonic[0] += 15
    reporter.update(tokens_total=10, step=101)
    wait_until(lambda: any(b'"heartbeat"' in c.request.body for c in responses.calls))
    reporter.close()
    bodies = [json.loads(c.request.body) for c in responses.calls]
    start, load_started, load_finished = bodies[:3]
    assert start == {
        "job": "job",
        "run": "run-1",
        "event": "start",
        "time": 1234.5,
        "heartbeat_seconds": 0.05,
        "gpus": 8,
    }
    assert load_started["event"] == "checkpoint_load_started" and load_started["step"] == 100
    assert load_finished["event"] == "checkpoint_load_finished" and abs(load_finished["duration_seconds"] - 15) < 1
    assert all(b.get("run") == "run-1" for b in bodies)
    assert bodies[-1]["state"] == "finished"


@responses.activate
def test_an_exporter_without_run_ids_gets_plain_totals():
    responses.post(PROGRESS, status=400, json={"error": "unknown field run", "field": "run"})
    responses.post(PROGRESS, json={})
    reporter = Reporter(URL, "job", heartbeat=0.01)
    reporter.update(tokens_total=5)
    reporter.close()
    bodies = [json.loads(c.request.body) for c in responses.calls]
    assert bodies[0]["event"] == "start"  # refused: the reporter learns the exporter is older
    assert all("run" not in b and "event" not in b for b in bodies[1:]) and bodies[-1]["tokens_total"] == 5


class _Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@responses.activate
def test_the_wait_for_each_next_batch_is_timed_and_sent_as_a_running_total():
    responses.post(PROGRESS, json={})
    clock = _Clock()
    reporter = ProgressReporter(URL, "job", monotonic=clock)

    def slow_loader():
        for batch in range(3):
            clock.now += 0.5  # the loader takes half a second to produce each batch
            yield batch

    seen = []
    for batch in reporter.timed(slow_loader()):
        clock.now += 2.0  # the step itself: not data wait
        seen.append(batch)
    with reporter.data_wait():
        clock.now += 0.25
    assert seen == [0, 1, 2] and reporter.data_wait_seconds == 1.75
    reporter.update(tokens_total=30, step=3)
    reporter.close()
    body = json.loads(responses.calls[-1].request.body)
    assert body["data_wait_seconds"] == 1.75 and body["tokens_total"] == 30


@responses.activate
def test_an_explicit_data_wait_total_is_sent_and_a_bad_one_left_out(caplog):
    responses.post(PROGRESS, json={})
    reporter = ProgressReporter(URL, "job")
    reporter.update(tokens_total=1, data_wait_seconds=float("nan"))
    reporter.close()
    assert "data_wait_seconds" not in json.loads(responses.calls[-1].request.body)
    assert "data_wait_seconds must be a running total of seconds" in caplog.text
    responses.calls.reset()
    reporter = ProgressReporter(URL, "job")
    reporter.update(tokens_total=2, data_wait_seconds=12.5)
    reporter.close()
    assert json.loads(responses.calls[-1].request.body)["data_wait_seconds"] == 12.5


@responses.activate
def test_an_exporter_without_data_wait_gets_totals_without_it():
    responses.post(PROGRESS, status=400, json={"error": "unknown field", "field": "data_wait_seconds"})
    responses.post(PROGRESS, json={})
    reporter = ProgressReporter(URL, "job")
    reporter.update(tokens_total=5, data_wait_seconds=1.0)
    wait_until(lambda: reporter.sent == 1)
    reporter.update(tokens_total=6, data_wait_seconds=2.0)
    reporter.close()
    bodies = [json.loads(c.request.body) for c in responses.calls]
    assert "data_wait_seconds" in bodies[0]
    assert all("data_wait_seconds" not in b for b in bodies[1:]) and bodies[-1]["tokens_total"] == 6
