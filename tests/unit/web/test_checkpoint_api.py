"""POST /api/v1/checkpoints through the real aiohttp app, with the checkpoint source sampled by the real daemon."""

import subprocess
import time

import pytest

from mfu_exporter.config import typed_config, validate
from mfu_exporter.model.checkpoints import CheckpointTracker
from mfu_exporter.sources.checkpoint import CheckpointSource
from tests.support.expo import samples
from tests.support.tools import require_tool
from tests.support.wait import wait_for

JOB = "llama3-70b"
KEY = (("training_job", JOB),)
CONFIG = {
    "sources": {"checkpoint": {"interval": "20ms", "started_timeout": "1h"}},
    "jobs": {JOB: {"params": "70.6B", "gpus": 8, "peak_tflops": 989.4}},
}


class Clock:
    def __init__(self):
        self.now = time.time()

    def __call__(self):
        return self.now


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def checkpoint_client(make_client, clock):
    """An exporter app whose checkpoint source and tracker run on ``clock``."""

    async def make(config=CONFIG):
        section = typed_config(validate(config)).sources.checkpoint
        source = CheckpointSource(
            section, CheckpointTracker(started_timeout=section.started_timeout, clock=clock), clock=clock
        )
        client = await make_client(config, [source])
        client.state = client.service.scheduler.states["checkpoint"]
        return client

    return make


async def metrics_after_a_sample(client):
    """/metrics once the source has sampled again, so the tracker's newest totals are in it."""
    cycles = client.state.cycles
    await wait_for(lambda: client.state.cycles > cycles + 1)
    return samples(await (await client.get("/metrics")).text())


async def post(client, **body):
    response = await client.post("/api/v1/checkpoints", json=body)
    return response.status, await response.json()


async def test_started_then_finished_is_one_timed_write(checkpoint_client, clock):
    client = await checkpoint_client()
    start = clock.now - 50
    assert await post(client, job=JOB, checkpoint="step-12000", phase="started", time=start) == (
        200,
        {"job": JOB, "checkpoint": "step-12000", "state": "in_progress"},
    )
    assert (await metrics_after_a_sample(client))[("mfu_checkpoint_in_progress", KEY)] == 1
    status, answer = await post(
        client, job=JOB, checkpoint="step-12000", phase="finished", time=start + 38, bytes=2**40
    )
    assert (status, answer["state"], answer["duration_seconds"]) == (200, "finished", 38)
    values = await metrics_after_a_sample(client)
    assert values[("mfu_checkpoint_in_progress", KEY)] == 0
    assert values[("mfu_checkpoint_writes_total", KEY)] == 1
    assert values[("mfu_checkpoint_write_failures_total", KEY)] == 0
    assert values[("mfu_checkpoint_write_duration_seconds_bucket", (("le", "45.0"),) + KEY)] == 1
    assert values[("mfu_checkpoint_write_duration_seconds_bucket", (("le", "30.0"),) + KEY)] == 0
    assert values[("mfu_checkpoint_written_bytes_total", KEY)] == 2**40
    assert values[("mfu_checkpoint_last_duration_seconds", KEY)] == 38
    assert values[("mfu_checkpoint_last_success_timestamp_seconds", KEY)] == start + 38
    assert values[("mfu_checkpoint_last_write_bandwidth_bytes_per_second", KEY)] == pytest.approx(2**40 / 38)


async def test_failed_counts_a_failure_and_no_duration(checkpoint_client, clock):
    client = await checkpoint_client()
    await post(client, job=JOB, checkpoint="step-1", phase="started", time=clock.now - 5)
    status, answer = await post(client, job=JOB, checkpoint="step-1", phase="failed")
    assert (status, answer["state"]) == (200, "failed")
    values = await metrics_after_a_sample(client)
    assert values[("mfu_checkpoint_writes_total", KEY)] == 1
    assert values[("mfu_checkpoint_write_failures_total", KEY)] == 1
    assert values[("mfu_checkpoint_write_duration_seconds_count", KEY)] == 0
    assert ("mfu_checkpoint_last_success_timestamp_seconds", KEY) not in values


async def test_single_shot_events_for_saves_the_job_timed(checkpoint_client):
    client = await checkpoint_client()
    assert (await post(client, job=JOB, checkpoint="step-1", duration_seconds=840.5, bytes=1e12, ok=True))[0] == 200
    assert (await post(client, job=JOB, checkpoint="step-2", duration_seconds=12))[0] == 200  # ok defaults to true
    assert (await post(client, job=JOB, checkpoint="step-3", duration_seconds=3, ok=False))[0] == 200
    # a finished without started is fine when it carries its duration
    assert (await post(client, job=JOB, checkpoint="step-4", phase="finished", duration_seconds=44))[0] == 200
    values = await metrics_after_a_sample(client)
    assert values[("mfu_checkpoint_writes_total", KEY)] == 4
    assert values[("mfu_checkpoint_write_failures_total", KEY)] == 1
    assert values[("mfu_checkpoint_write_duration_seconds_sum", KEY)] == 840.5 + 12 + 44
    assert values[("mfu_checkpoint_write_duration_seconds_bucket", (("le", "900.0"),) + KEY)] == 3
    assert values[("mfu_checkpoint_write_duration_seconds_bucket", (("le", "600.0"),) + KEY)] == 2
    assert values[("mfu_checkpoint_written_bytes_total", KEY)] == 1e12


async def test_finished_without_started_or_duration_is_rejected_clearly(checkpoint_client):
    client = await checkpoint_client()
    status, answer = await post(client, job=JOB, checkpoint="step-7", phase="finished")
    assert status == 400
    assert answer["field"] == "duration_seconds"
    assert "no started event" in answer["error"] and "step-7" in answer["error"]
    assert client.service.checkpoints.totals() == {}  # rejected: no job created, here or in the job tracker
    assert (await (await client.get("/api/v1/jobs")).json()) == {"jobs": []}


async def test_a_started_never_finished_times_out_as_a_failure(checkpoint_client, clock):
    client = await checkpoint_client()
    await post(client, job=JOB, checkpoint="step-5", phase="started")
    assert (await metrics_after_a_sample(client))[("mfu_checkpoint_in_progress", KEY)] == 1
    clock.now += 3601
    values = await metrics_after_a_sample(client)
    assert values[("mfu_checkpoint_in_progress", KEY)] == 0
    assert values[("mfu_checkpoint_write_failures_total", KEY)] == 1
    assert client.service.checkpoints.overlap(JOB, 60)["last_failure"]["reason"] == "timeout"
    status, answer = await post(client, job=JOB, checkpoint="step-5", phase="finished")
    assert (status, answer["field"]) == (409, "checkpoint")  # too late: it already counted as failed
    assert "already counted as a failed write (timeout" in answer["error"]


async def test_a_late_end_of_a_timed_out_write_is_refused_not_counted_again(checkpoint_client, clock):
    client = await checkpoint_client()
    await post(client, job=JOB, checkpoint="step-5", phase="started")
    clock.now += 3601
    before = await metrics_after_a_sample(client)
    assert (before[("mfu_checkpoint_writes_total", KEY)], before[("mfu_checkpoint_write_failures_total", KEY)]) == (
        1,
        1,
    )
    # the client's context manager sends finished with its own duration, which needs no open started
    status, answer = await post(client, job=JOB, checkpoint="step-5", phase="finished", duration_seconds=3700)
    assert status == 409
    assert answer == {
        "field": "checkpoint",
        "error": "checkpoint 'step-5' of job 'llama3-70b' was already counted as a "
        "failed write (timeout: no finished within sources.checkpoint.started_timeout (3600 s)); "
        "this late end is not counted again",
    }
    assert (await post(client, job=JOB, checkpoint="step-5", phase="failed"))[0] == 409
    assert (await post(client, job=JOB, checkpoint="step-5", duration_seconds=3700))[0] == 409
    after = await metrics_after_a_sample(client)
    assert after[("mfu_checkpoint_writes_total", KEY)] == 1
    assert after[("mfu_checkpoint_write_failures_total", KEY)] == 1
    assert after[("mfu_checkpoint_write_duration_seconds_count", KEY)] == 0
    # writing the same checkpoint again is a new write, counted as usual
    await post(client, job=JOB, checkpoint="step-5", phase="started")
    clock.now += 40
    assert (await post(client, job=JOB, checkpoint="step-5", phase="finished"))[0] == 200
    assert (await metrics_after_a_sample(client))[("mfu_checkpoint_write_duration_seconds_count", KEY)] == 1


async def test_job_json_and_status_show_a_checkpoint_overlapping_the_mfu_window(checkpoint_client, clock):
    client = await checkpoint_client()
    await client.post("/api/v1/progress", json={"job": JOB, "tokens_total": 1000})
    await post(client, job=JOB, checkpoint="step-12000", phase="started", time=clock.now - 12)
    (job,) = (await (await client.get("/api/v1/jobs")).json())["jobs"]
    assert job["checkpoint"]["in_progress"] == "step-12000"
    assert job["checkpoint"]["elapsed_seconds"] == pytest.approx(12)
    assert job["checkpoint"]["overlaps_window"] is True
    await post(client, job=JOB, checkpoint="step-12000", phase="finished")
    (job,) = (await (await client.get("/api/v1/status")).json())["jobs"]
    assert (job["checkpoint"]["in_progress"], job["checkpoint"]["overlaps_window"]) == (None, True)
    assert job["checkpoint"]["last_duration_seconds"] == pytest.approx(12)
    clock.now += 61  # the write ended before the MFU window (60 s)
    (job,) = (await (await client.get("/api/v1/jobs")).json())["jobs"]
    assert job["checkpoint"]["overlaps_window"] is False
    answer = await (await client.post("/api/v1/progress", json={"job": JOB, "tokens_total": 2000})).json()
    job = await (await client.get(answer["links"]["job"])).json()  # the answer links to the job's full JSON
    assert job["checkpoint"]["last_checkpoint"] == "step-12000"


async def test_unknown_jobs_are_accepted_up_to_the_job_cap(checkpoint_client):
    client = await checkpoint_client({**CONFIG, "ingest": {"max_jobs": 2}})
    assert (await post(client, job="a", checkpoint="s", duration_seconds=1))[0] == 200
    assert (await post(client, job="b", checkpoint="s", phase="started"))[0] == 200
    status, answer = await post(client, job="c", checkpoint="s", duration_seconds=1)
    assert (status, answer["field"]) == (429, "job")
    assert client.service.checkpoints.overlap("c", 60) is None
    assert sorted(j["job"] for j in (await (await client.get("/api/v1/jobs")).json())["jobs"]) == ["a", "b"]


@pytest.mark.parametrize(
    "body,field",
    [
        ({"job": JOB, "checkpoint": "s", "duration_seconds": -1}, "duration_seconds"),
        ({"job": JOB, "checkpoint": "s", "duration_seconds": 86401}, "duration_seconds"),
        ({"job": JOB, "checkpoint": "s", "duration_seconds": "40s"}, "duration_seconds"),
        ({"job": JOB, "checkpoint": "s", "duration_seconds": 1, "bytes": -5}, "bytes"),
        ({"job": JOB, "checkpoint": "s", "duration_seconds": 1, "bytes": 2**51}, "bytes"),
        ({"job": JOB, "checkpoint": "s", "duration_seconds": 1, "bytes": True}, "bytes"),
        ({"job": JOB, "checkpoint": "s", "phase": "started", "time": "FUTURE"}, "time"),
        ({"job": JOB, "checkpoint": "s", "phase": "started", "time": -3}, "time"),
        ({"job": JOB, "checkpoint": "s", "phase": "saving"}, "phase"),
        ({"job": JOB, "checkpoint": "s", "phase": "started", "duration_seconds": 3}, "duration_seconds"),
        ({"job": JOB, "checkpoint": "s", "phase": "started", "bytes": 3}, "bytes"),
        ({"job": JOB, "checkpoint": "s", "phase": "failed", "ok": False}, "ok"),
        ({"job": JOB, "checkpoint": "s", "duration_seconds": 1, "ok": "yes"}, "ok"),
        ({"job": JOB, "checkpoint": "s", "duration_seconds": 1, "ok": False, "bytes": 9}, "bytes"),
        ({"job": JOB, "checkpoint": "s"}, "duration_seconds"),
        ({"job": JOB, "checkpoint": "", "duration_seconds": 1}, "checkpoint"),
        ({"job": JOB, "checkpoint": "a\nb", "duration_seconds": 1}, "checkpoint"),
        ({"job": JOB, "checkpoint": "x" * 257, "duration_seconds": 1}, "checkpoint"),
        ({"job": "../etc", "checkpoint": "s", "duration_seconds": 1}, "job"),
        ({"job": JOB, "checkpoint": "s", "duration_seconds": 1, "rank": 0}, "rank"),
        ([1, 2], ""),
    ],
)
async def test_bad_events_get_400_naming_the_field_and_change_nothing(checkpoint_client, body, field):
    client = await checkpoint_client()
    if isinstance(body, dict) and body.get("time") == "FUTURE":
        body = {**body, "time": time.time() + 86400 + 3600}
    response = await client.post("/api/v1/checkpoints", json=body)
    assert response.status == 400
    answer = await response.json()
    assert answer["field"] == field
    assert answer["error"]
    assert client.service.checkpoints.totals() == {}
    assert (await (await client.get("/api/v1/jobs")).json()) == {"jobs": []}


async def test_not_json_gets_400_like_progress(checkpoint_client):
    client = await checkpoint_client()
    response = await client.post("/api/v1/checkpoints", data=b"{nope", headers={"Content-Type": "application/json"})
    assert (response.status, (await response.json())["field"]) == (400, "")


async def test_disabled_source_answers_404(make_client):
    client = await make_client({"sources": {"checkpoint": {"enabled": False}}})
    status, answer = await post(client, job=JOB, checkpoint="s", duration_seconds=1)
    assert status == 404
    assert "sources.checkpoint.enabled" in answer["error"]


async def test_checkpoint_metrics_pass_promtool_check_metrics(checkpoint_client):
    promtool = require_tool("promtool", "prometheus")
    client = await checkpoint_client()
    await post(client, job=JOB, checkpoint="s", duration_seconds=42, bytes=10**9)
    await metrics_after_a_sample(client)
    body = await (await client.get("/metrics")).read()
    assert b"mfu_checkpoint_write_duration_seconds_bucket" in body
    result = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, timeout=30)
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
