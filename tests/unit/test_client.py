import logging
import threading
import time

import pytest

from mfu_exporter import VERSION_HEADER, __version__
from mfu_exporter.client import ProgressReporter as Reporter
from tests.support.fake_exporter import FakeExporter
from tests.support.wait import wait_until

PROGRESS = "/api/v1/progress"


@pytest.fixture
def exporter():
    with FakeExporter() as server:
        yield server


def ProgressReporter(*args, **kwargs):
    """A reporter without its start event and heartbeats: these tests count the requests its totals make (the run
    events have their own tests below)."""
    return Reporter(*args, **{"announce": False, "heartbeat": None, **kwargs})


def test_reports_carry_model_facts_and_time(exporter):
    exporter.add(PROGRESS)
    reporter = ProgressReporter(exporter.url, "llama3-70b", model={"params": "70B"}, gpus=8, clock=lambda: 1234.5)
    reporter.update(tokens_total=1000, step=3)
    reporter.close()
    # The update, unless close() came first and sent it as the final report; that one says the job finished.
    assert 1 <= len(exporter.calls) <= 2
    body = exporter.calls[-1].body
    assert b'"state": "finished"' in body
    assert b'"tokens_total": 1000' in body and b'"step": 3' in body and b'"time": 1234.5' in body
    assert b'"model": {"params": "70B"}' in body and b'"gpus": 8' in body
    assert exporter.calls[-1].headers["Content-Type"] == "application/json"
    assert exporter.calls[-1].headers["User-Agent"] == f"mfu-exporter-client/{__version__}"


def test_retries_with_backoff_until_the_exporter_answers(exporter):
    exporter.add(PROGRESS, status=503)
    exporter.add(PROGRESS, drop=True)  # the connection closed with no answer
    exporter.add(PROGRESS)
    reporter = ProgressReporter(exporter.url, "job", max_backoff=0.01)
    reporter.update(tokens_total=10)
    wait_until(lambda: reporter.sent == 1)
    reporter.close()
    assert len(exporter.calls) == 4  # the last: close() saying the job finished
    assert b'"state"' not in exporter.calls[2].body and b'"state": "finished"' in exporter.calls[3].body
    assert reporter.failures == 2


def test_an_exporter_that_is_not_there_is_retried_and_never_raises():
    with FakeExporter() as gone:
        url = gone.url
    reporter = ProgressReporter(url, "job", max_backoff=0.01)
    reporter.update(tokens_total=1)
    wait_until(lambda: reporter.failures >= 2)  # connection refused, again and again
    reporter.close(timeout=0.5)
    assert reporter.sent == 0


def test_newest_totals_replace_unsent_ones(exporter):
    gate = threading.Event()
    bodies = []

    def slow(call):
        gate.wait(5)
        bodies.append(call.body)
        return 200, {}

    exporter.add(PROGRESS, callback=slow)
    reporter = ProgressReporter(exporter.url, "job")
    reporter.update(tokens_total=1)
    wait_until(lambda: len(exporter.calls) == 0 and reporter._pending is None)
    for total in range(2, 1002):
        reporter.update(tokens_total=total)  # the first request is still in flight
    gate.set()
    reporter.close()
    assert len(bodies) == 2
    assert b'"tokens_total": 1001' in bodies[1]


def send_three_totals(exporter) -> Reporter:
    """Three totals, each sent before the next, then the reporter closed (its end is the fourth request)."""
    reporter = ProgressReporter(exporter.url, "job")
    for total in range(1, 4):
        reporter.update(tokens_total=total)
        wait_until(lambda total=total: reporter.sent == total)
    reporter.close()
    return reporter


def test_reports_share_one_kept_alive_connection(exporter):
    exporter.add(PROGRESS)
    reporter = send_three_totals(exporter)
    assert len(exporter.calls) == 4 and reporter.failures == 0
    assert len({call.peer for call in exporter.calls}) == 1  # one TCP connection (client port) for all four reports


def test_one_connection_even_when_the_process_holds_over_1024_descriptors(exporter):
    """A training process often holds over 1,024 descriptors (data files, shared memory); the reporter's socket is
    then numbered above what select() takes, and the connection must still be kept."""
    import os
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 1200
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))
    held = []
    try:
        while len(held) < wanted - 64:
            held.append(os.open(os.devnull, os.O_RDONLY))
        assert held[-1] >= 1024, "the descriptors given out stay under 1,024: nothing to test here"
        exporter.add(PROGRESS)
        send_three_totals(exporter)
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert len({call.peer for call in exporter.calls}) == 1, [call.peer for call in exporter.calls]


def test_update_never_blocks_or_raises_when_the_exporter_is_gone():
    hung = threading.Event()  # set only at the end: until then every send hangs, as to an exporter that never answers

    class Broken:
        calls = 0

        def post(self, *args, **kwargs):
            Broken.calls += 1
            if Broken.calls == 1:
                hung.wait()
            raise RuntimeError("boom")

    reporter = ProgressReporter("http://127.0.0.1:9", "job", session=Broken(), max_backoff=0.01)
    reporter.update(tokens_total=0)
    wait_until(lambda: Broken.calls == 1, 60, "the first send, hanging")
    updates = threading.Thread(target=lambda: [reporter.update(tokens_total=total) for total in range(1, 10_000)])
    updates.start()
    # The training step never waits on the network: all 10k updates return while the first send still hangs.
    wait_until(lambda: not updates.is_alive(), 60, "10,000 updates while the send hangs")
    assert Broken.calls == 1
    hung.set()
    reporter.close(timeout=0.5)
    assert reporter.sent == 0 and reporter.failures >= 1


def test_a_rejected_report_is_not_retried(exporter):
    exporter.add(PROGRESS, status=400, body={"error": "bad", "field": "job"})
    reporter = ProgressReporter(exporter.url, "job")
    reporter.update(tokens_total=1)
    reporter.close()
    assert len(exporter.calls) == 1


def test_close_flushes_the_pending_total(exporter):
    exporter.add(PROGRESS)
    with ProgressReporter(exporter.url, "job") as reporter:
        reporter.update(tokens_total=42)
    assert b'"tokens_total": 42' in exporter.calls[-1].body


def test_close_and_the_context_manager_say_how_the_job_ended(exporter):
    exporter.add(PROGRESS)

    def final_state(exit_with: type[BaseException] | None) -> bytes:
        exporter.reset()
        try:
            with ProgressReporter(exporter.url, "job") as reporter:
                reporter.update(tokens_total=10)
                if exit_with is not None:
                    raise exit_with()
        except BaseException as exc:  # noqa: BLE001 - the job's own exception passes through untouched
            assert exit_with is not None and isinstance(exc, exit_with)
        return exporter.calls[-1].body

    assert b'"state": "finished"' in final_state(None)
    assert b'"state": "failed"' in final_state(RuntimeError)
    assert b'"state": "cancelled"' in final_state(KeyboardInterrupt)
    exporter.reset()
    reporter = ProgressReporter(exporter.url, "job")
    reporter.update(tokens_total=5)
    wait_until(lambda: reporter.sent == 1)
    reporter.close(state="cancelled")
    reporter.update(tokens_total=6)  # after the end: dropped, or it would start a new run
    assert [b'"state"' in c.body for c in exporter.calls] == [False, True]
    assert b'"state": "cancelled"' in exporter.calls[1].body and b'"tokens_total": 5' in exporter.calls[1].body


def test_a_reporter_that_never_reported_sends_nothing_on_close_and_a_bad_state_is_finished(exporter):
    exporter.add(PROGRESS)
    ProgressReporter(exporter.url, "idle").close()
    assert len(exporter.calls) == 0
    reporter = ProgressReporter(exporter.url, "job")
    reporter.update(tokens_total=1)
    reporter.close(state="exploded")
    assert b'"state": "finished"' in exporter.calls[-1].body


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
        with pytest.raises(ValueError, match="MFU_TRAINING_JOB"):
            ProgressReporter("http://127.0.0.1:9")


def test_a_url_without_its_scheme_is_refused_at_once_rather_than_retried_for_ever():
    with pytest.raises(ValueError, match="http:// or https://"):
        ProgressReporter("127.0.0.1:9495", "job")


def test_a_reporter_announces_its_run_sends_heartbeats_and_times_a_checkpoint_load(exporter):
    exporter.add(PROGRESS)
    monotonic = [100.0]
    reporter = Reporter(
        exporter.url,
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
    wait_until(lambda: any(b'"heartbeat"' in c.body for c in exporter.calls))
    reporter.close()
    bodies = exporter.bodies()
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


def test_an_exporter_without_run_ids_gets_plain_totals(exporter):
    exporter.add(PROGRESS, status=400, body={"error": "unknown field run", "field": "run"})
    exporter.add(PROGRESS)
    reporter = Reporter(exporter.url, "job", heartbeat=0.01)
    reporter.update(tokens_total=5)
    reporter.close()
    bodies = exporter.bodies()
    assert bodies[0]["event"] == "start"  # refused: the reporter learns the exporter is older
    assert all("run" not in b and "event" not in b for b in bodies[1:]) and bodies[-1]["tokens_total"] == 5


class _Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_wait_for_each_next_batch_is_timed_and_sent_as_a_running_total(exporter):
    exporter.add(PROGRESS)
    clock = _Clock()
    reporter = ProgressReporter(exporter.url, "job", monotonic=clock)

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
    body = exporter.bodies()[-1]
    assert body["data_wait_seconds"] == 1.75 and body["tokens_total"] == 30


def test_an_explicit_data_wait_total_is_sent_and_a_bad_one_left_out(exporter, caplog):
    exporter.add(PROGRESS)
    reporter = ProgressReporter(exporter.url, "job")
    reporter.update(tokens_total=1, data_wait_seconds=float("nan"))
    reporter.close()
    assert "data_wait_seconds" not in exporter.bodies()[-1]
    assert "data_wait_seconds must be a running total of seconds" in caplog.text
    exporter.reset()
    reporter = ProgressReporter(exporter.url, "job")
    reporter.update(tokens_total=2, data_wait_seconds=12.5)
    reporter.close()
    assert exporter.bodies()[-1]["data_wait_seconds"] == 12.5


def test_an_exporter_without_data_wait_gets_totals_without_it(exporter):
    exporter.add(PROGRESS, status=400, body={"error": "unknown field", "field": "data_wait_seconds"})
    exporter.add(PROGRESS)
    reporter = ProgressReporter(exporter.url, "job")
    reporter.update(tokens_total=5, data_wait_seconds=1.0)
    wait_until(lambda: reporter.sent == 1)
    reporter.update(tokens_total=6, data_wait_seconds=2.0)
    reporter.close()
    bodies = exporter.bodies()
    assert "data_wait_seconds" in bodies[0]
    assert all("data_wait_seconds" not in b for b in bodies[1:]) and bodies[-1]["tokens_total"] == 6


def test_an_exporter_of_another_major_version_is_named_in_a_warning(exporter, caplog):
    major = int(__version__.split(".")[0])
    exporter.add(PROGRESS, headers={VERSION_HEADER: f"{major + 1}.0.0"})
    with caplog.at_level(logging.WARNING, logger="mfu_exporter.client"):
        reporter = ProgressReporter(exporter.url, "job")
        reporter.update(tokens_total=1)
        wait_until(lambda: reporter.sent == 1)
        reporter.update(tokens_total=2)
        reporter.close()
    assert reporter.exporter_version == f"{major + 1}.0.0" and reporter.sent == 2  # a warning, never a refusal
    warnings = [r.getMessage() for r in caplog.records if "major versions differ" in r.getMessage()]
    assert len(warnings) == 1, warnings  # once, not once per report
    assert f"is version {major + 1}.0.0" in warnings[0]
    assert f"pip install 'mfu-exporter-client=={major + 1}.*'" in warnings[0]


def test_an_exporter_of_the_same_major_version_or_without_the_header_is_not_warned_about(exporter, caplog):
    major = __version__.split(".")[0]
    exporter.add(PROGRESS, headers={VERSION_HEADER: f"{major}.99.1"})
    with caplog.at_level(logging.WARNING, logger="mfu_exporter.client"):
        reporter = ProgressReporter(exporter.url, "job")
        reporter.update(tokens_total=1)
        reporter.close()
        assert reporter.exporter_version == f"{major}.99.1"
        exporter.reset()
        quiet = FakeExporter()
        with quiet:
            quiet.add(PROGRESS)
            older = ProgressReporter(quiet.url, "job")
            older.update(tokens_total=1)
            older.close()
        assert older.exporter_version is None and older.sent == 1
    assert "major versions differ" not in caplog.text
