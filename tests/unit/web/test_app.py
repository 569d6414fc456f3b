import asyncio
import gzip
import logging
import socket
import subprocess
import time

import pytest
from aiohttp import web
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics

from mfu_exporter import VERSION_HEADER, __version__
from mfu_exporter.client import ProgressReporter
from mfu_exporter.config import validate
from mfu_exporter.render.fragment import Page
from mfu_exporter.service import build_service
from mfu_exporter.sources.base import SourceUnavailable
from mfu_exporter.web.app import create_app, serve
from mfu_exporter.web.security import HTTP_LIMITS
from tests.support.expo import samples
from tests.support.sources import ScriptedSource
from tests.support.tools import require_tool
from tests.support.wait import next_tick, wait_for

LLAMA = {"params": "70.6B", "layers": 80, "heads": 64, "head_dim": 128, "seq_len": 8192}
JOB = {"jobs": {"llama3-70b": {**LLAMA, "gpus": 8, "peak_tflops": 989.4}}}


async def test_progress_reports_become_mfu_metrics(make_client):
    client = await make_client(JOB)
    now = time.time()
    for offset, tokens in [(0, 1_000_000), (10, 1_100_000)]:
        response = await client.post(
            "/api/v1/progress", json={"job": "llama3-70b", "tokens_total": tokens, "step": 7, "time": now - 10 + offset}
        )
        assert response.status == 200
    await next_tick(client.service)  # a report changes the job model; the tick publishes it to /metrics
    body = await (await client.get("/metrics")).text()
    values = samples(body)
    key = (("training_job", "llama3-70b"),)
    per_token = 6 * 70.6e9 + 12 * 80 * 64 * 128 * 8192
    assert values[("mfu_job_tokens_total", key)] == 100_000  # since its first count here
    assert values[("mfu_job_model_flops_total", key)] == pytest.approx(per_token * 100_000)
    assert values[("mfu_job_peak_flops", key)] == pytest.approx(8 * 989.4e12)
    assert values[("mfu_job_gpus", key)] == 8
    assert values[("mfu_job_tokens_per_second", key)] == pytest.approx(10_000)
    assert values[("mfu_model_flops_utilization_ratio", key)] == pytest.approx(per_token * 10_000 / (8 * 989.4e12))
    assert values[("mfu_job_step", key)] == 7
    assert "job=" not in body.replace("training_job=", "")

    jobs = await (await client.get("/api/v1/jobs")).json()
    assert jobs["jobs"][0]["mfu"] == pytest.approx(values[("mfu_model_flops_utilization_ratio", key)])


async def test_data_wait_reports_become_gpu_seconds_and_a_share_of_wall_time(make_client):
    """The client's running total of one rank's wait: GPU-seconds (x the job's 8 GPUs here) and its share of wall
    time over the MFU window, in /metrics and /api/v1/jobs."""
    client = await make_client(JOB)
    now = time.time()
    for offset, tokens, wait in [(0, 1_000_000, 5.0), (10, 1_100_000, 7.5), (20, 1_200_000, 10.0)]:
        response = await client.post(
            "/api/v1/progress",
            json={"job": "llama3-70b", "tokens_total": tokens, "time": now - 20 + offset, "data_wait_seconds": wait},
        )
        assert response.status == 200
    await next_tick(client.service)
    values = samples(await (await client.get("/metrics")).text())
    key = (("training_job", "llama3-70b"),)
    assert values[("mfu_job_data_wait_seconds_total", key)] == pytest.approx(10.0 * 8)
    assert values[("mfu_job_data_wait_ratio", key)] == pytest.approx(5.0 / 20)
    job = (await (await client.get("/api/v1/jobs")).json())["jobs"][0]
    assert job["data_wait"] == {
        "gpu_seconds_total": pytest.approx(80.0),
        "rank_seconds_total": pytest.approx(10.0),
        "ratio": pytest.approx(0.25),
        "recent_ratio": pytest.approx(0.25),  # figures 10 s apart: the last interval's
        "source": "client",
    }


@pytest.mark.parametrize(
    "body,status,field",
    [
        (b"not json", 400, ""),
        (b'{"job": "x", "tokens_total": NaN}', 400, ""),
        (b'{"job": "x"}', 400, "tokens_total"),
        (b'{"job": "../../etc", "tokens_total": 1}', 400, "job"),
        (b'{"job": "x", "tokens_total": 1, "model": {"params": "seventy"}}', 400, "model.params"),
        (b"\xff\xfe", 400, ""),
        (b'{"job": "x", "event": "start", "run": "../a"}', 400, "run"),
        (b'{"job": "x", "event": "boot"}', 400, "event"),
        (b'{"job": "x", "event": "heartbeat", "heartbeat_seconds": 0}', 400, "heartbeat_seconds"),
        (b'{"job": "x", "tokens_total": 1, "duration_seconds": 3}', 400, "duration_seconds"),
        (b'{"job": "x", "tokens_total": 1, "data_wait_seconds": -1}', 400, "data_wait_seconds"),
        (b'{"job": "x", "tokens_total": 1, "data_wait_seconds": "3s"}', 400, "data_wait_seconds"),
        (b'{"job": "x", "tokens_total": 1, "data_wait_seconds": true}', 400, "data_wait_seconds"),
        (b'{"job": "x", "event": "heartbeat", "data_wait_seconds": 1}', 400, "data_wait_seconds"),
        (b"[" * 5000 + b"]" * 5000, 400, ""),
        (b"[" * 20_000 + b"]" * 20_000, 400, ""),  # 40 KB, under the body limit
        (b'{"job": "x", "tokens_total": ' + b"9" * 5000 + b"}", 400, ""),
    ],
)
async def test_bad_bodies_get_400_with_the_field_and_change_nothing(make_client, body, status, field):
    client = await make_client()
    response = await client.post("/api/v1/progress", data=body, headers={"Content-Type": "application/json"})
    assert response.status == status
    payload = await response.json()
    assert payload["error"]
    assert payload["field"] == field
    # The API's own words, never Python's: no "sys.set_int_max_str_digits", no "maximum recursion depth".
    assert "sys." not in payload["error"] and "recursion" not in payload["error"], payload["error"]
    assert (await (await client.get("/api/v1/jobs")).json()) == {"jobs": []}


async def test_oversized_body_gets_413(make_client):
    client = await make_client({"ingest": {"max_body_bytes": 1024}})
    response = await client.post("/api/v1/progress", data=b'{"job": "x", "pad": "' + b"a" * 4096 + b'"}')
    assert response.status == 413
    assert "1024" in (await response.json())["error"]


async def test_job_cap_gets_429(make_client):
    client = await make_client({"ingest": {"max_jobs": 2}})
    for name in ("a", "b"):
        assert (await client.post("/api/v1/progress", json={"job": name, "tokens_total": 1})).status == 200
    response = await client.post("/api/v1/progress", json={"job": "c", "tokens_total": 1})
    assert response.status == 429
    assert (await response.json()) == {
        "error": "this exporter already tracks 2 running jobs (ingest.max_jobs)",
        "field": "job",
    }


async def test_openmetrics_and_gzip_are_negotiated(make_client):
    client = await make_client(JOB)
    await client.post("/api/v1/progress", json={"job": "llama3-70b", "tokens_total": 5})
    response = await client.get(
        "/metrics",
        headers={"Accept": "application/openmetrics-text; version=1.0.0", "Accept-Encoding": "gzip"},
        auto_decompress=False,
    )
    assert response.headers["Content-Type"].startswith("application/openmetrics-text")
    assert response.headers["Content-Encoding"] == "gzip"
    text = gzip.decompress(await response.read()).decode()
    assert text.endswith("# EOF\n")
    names = {f.name for f in parse_openmetrics(text)}
    assert {"mfu_job_tokens", "mfu_exporter_build"} <= names
    plain = await client.get("/metrics")
    assert plain.headers["Content-Type"].startswith("text/plain")


async def rounds_of(source: ScriptedSource, count: int) -> None:
    """Wait until ``source`` has been sampled ``count`` more times: the scheduler went round, so anything it would
    have done to another source meanwhile, it did (waits on the scheduler's own work, not on the wall clock)."""
    target = source.calls + count
    await wait_for(lambda: source.calls >= target, 10, f"{count} more samples of {source.name}")


async def test_hanging_source_never_delays_metrics(make_client, scripted_source):
    witness = ScriptedSource("witness")
    client = await make_client(sources=[scripted_source, witness])
    service = client.service
    state = service.scheduler.states["fake"]
    await wait_for(lambda: state.up)
    scripted_source.value = 2.0
    scripted_source.release.clear()  # the next sample blocks until the test releases it
    await wait_for(lambda: not state.up)
    assert state.reason == "timeout"
    body = await (await client.get("/metrics")).text()
    values = samples(body)
    assert values[("mfu_exporter_source_up", (("source", "fake"),))] == 0
    assert values[("mfu_fake_value", ())] == 1.0  # the last good snapshot
    assert values[("mfu_exporter_source_errors_total", (("reason", "timeout"), ("source", "fake")))] >= 1
    # The scrape answered while the source was still blocked; how fast is `make bench`'s hung.scrape.p99_ms.
    assert scripted_source.release.is_set() is False
    calls = scripted_source.calls
    await rounds_of(witness, 5)
    assert scripted_source.calls == calls  # no second call piles onto a hung source
    scripted_source.release.set()
    await wait_for(lambda: state.up)
    assert samples(await (await client.get("/metrics")).text())[("mfu_fake_value", ())] == 2.0


async def test_unavailable_source_reports_down_and_others_keep_serving(make_client, scripted_source):
    scripted_source.unavailable = SourceUnavailable("library_not_found", "libnvidia-ml.so.1 not found", retry_after=60)
    witness = ScriptedSource("witness")
    client = await make_client(sources=[scripted_source, witness])
    state = client.service.scheduler.states["fake"]
    await wait_for(lambda: state.cycles >= 1)
    values = samples(await (await client.get("/metrics")).text())
    assert values[("mfu_exporter_source_up", (("source", "fake"),))] == 0
    assert values[("mfu_exporter_source_errors_total", (("reason", "library_not_found"), ("source", "fake")))] == 1
    assert ("mfu_fake_value", ()) not in values
    await rounds_of(witness, 5)
    assert scripted_source.calls == 1  # retry_after: no retry storm
    status = await (await client.get("/api/v1/status")).json()
    fake = next(s for s in status["sources"] if s["source"] == "fake")
    assert fake["reason"] == "library_not_found"


async def test_status_page_and_its_assets_are_served_locally(make_client):
    client = await make_client()
    page = await (await client.get("/")).text()
    assert "<title>mfu-exporter</title>" in page
    # relative references, so the page works behind a path-prefix proxy
    for reference in ('src="static/status.js"', 'href="static/status.css"'):
        assert reference in page
        assert (await client.get("/" + reference.split('"')[1])).status == 200
    assert "http" not in page.split("<nav>")[0]  # no CDN, no external fonts


async def test_health_and_readiness(make_client, scripted_source):
    scripted_source.release.clear()
    client = await make_client(sources=[scripted_source])
    assert (await client.get("/healthz")).status == 200
    assert (await client.get("/readyz")).status == 503
    scripted_source.release.set()
    await wait_for(lambda: client.service.scheduler.ready)
    assert (await client.get("/readyz")).status == 200


async def test_concurrent_scrapes_render_once_per_page(make_client, monkeypatch):
    client = await make_client(JOB)
    renders = []
    original = Page._make
    monkeypatch.setattr(Page, "_make", lambda page, *a: renders.append(page) or original(page, *a))
    bodies = await asyncio.gather(
        *[(await client.get("/metrics")).read() for _ in range(1)], *[client.get("/metrics") for _ in range(16)]
    )
    # One body serves every scraper of the same page: another only for a page published meanwhile (a tick).
    assert len(renders) == len(set(renders)) and len(renders) <= 3
    assert all(r.status == 200 for r in bodies[1:])


async def test_exposition_passes_promtool_check_metrics(make_client):
    promtool = require_tool("promtool", "prometheus")
    client = await make_client(JOB)
    await client.post("/api/v1/progress", json={"job": "llama3-70b", "tokens_total": 5, "target_tokens": "1T"})
    await next_tick(client.service)
    body = await (await client.get("/metrics")).read()
    assert b'training_job="llama3-70b"' in body
    result = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, timeout=30)
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()


async def test_the_service_starts_with_the_app_and_stops_with_it(aiohttp_client, scripted_source):
    """create_app only composes: the sampler and the tick start with the app (its cleanup_ctx) and end with it."""

    def ticking():
        return [task for task in asyncio.all_tasks() if task.get_name() == "evaluate-jobs" and not task.done()]

    service = build_service(validate({}), [scripted_source])
    app = create_app(service)
    assert (service.scheduler.first_cycle_done, ticking(), scripted_source.calls) == (None, [], 0)
    client = await aiohttp_client(app)
    assert len(ticking()) == 1
    await wait_for(lambda: scripted_source.calls >= 1, 5, "a sample once the app started")
    await client.close()
    assert ticking() == [] and scripted_source.closed  # the tick cancelled, the sources closed


async def test_process_metrics_are_the_daemons_only_and_served_once():
    """build_service renders no process_* (the golden rendering stays deterministic); the daemon adds them once."""
    service = build_service(validate({}), [])
    body, _ = await service.metrics(None, None)
    assert b"process_" not in body
    service.export_process_metrics()
    service.export_process_metrics()  # serve() on the same service again adds nothing twice
    service.evaluate_once()
    body, _ = await service.metrics(None, None)
    lines = body.decode().splitlines()
    for name in ("process_cpu_seconds_total", "process_resident_memory_bytes"):
        assert sum(line.startswith(name + " ") for line in lines) == 1, name


async def test_a_failing_evaluation_pass_does_not_end_the_tick(caplog, monkeypatch):
    """Jobs expire only in the tick: a pass that raises is logged and the next one runs."""
    service = build_service(validate({"mfu": {"interval": "1s"}}), [])
    passes = []

    def evaluate_once():
        passes.append(len(passes))
        if len(passes) == 1:
            raise RuntimeError("a bug in one pass")

    monkeypatch.setattr(service, "evaluate_once", evaluate_once)
    async with service.running():
        await wait_for(lambda: len(passes) >= 2, 10, "a second pass after the failed one")
    assert "the job evaluation failed" in caplog.text and "a bug in one pass" in caplog.text


async def test_the_ledger_shows_the_data_wait_beside_the_kinds_inside_productive(make_client):
    """The goodput library counts synchronous data loading as badput; here a step that waited for its batch still
    advanced the job, so the wait stays inside productive and is shown beside the kinds."""
    client = await make_client(JOB)
    client.service.jobs._born -= 60
    now = time.time()
    assert (
        await client.post(
            "/api/v1/progress", json={"job": "llama3-70b", "run": "a1", "event": "start", "time": now - 30}
        )
    ).status == 200
    for step in range(1, 11):
        body = {
            "job": "llama3-70b",
            "run": "a1",
            "tokens_total": step * 1000,
            "step": step,
            "time": now - 20 + 2 * step,
            "data_wait_seconds": 0.5 * step,  # a quarter of each 2 s step
        }
        assert (await client.post("/api/v1/progress", json=body)).status == 200
    ledger = await (await client.get("/api/v1/jobs/llama3-70b/ledger")).json()
    wait = ledger["data_wait"]
    assert "data_wait" not in ledger["kinds"] and wait["within"] == "productive" and wait["source"] == "client"
    assert wait["gpu_seconds"] == pytest.approx(8 * 5.0)
    assert wait["share_of_productive"] == pytest.approx(8 * 5.0 / ledger["kinds"]["productive"])
    assert 0 < wait["share_of_productive"] <= 1 and wait["ratio"] == pytest.approx(0.25)


async def test_a_progress_report_is_answered_small_with_a_link_to_the_jobs_view(make_client):
    """The ingest answer is validation and a state update only: accepted, the job's state, run and version, and
    where its full JSON is; that JSON (MFU, checkpoint, bottleneck) is GET /api/v1/jobs/<job>'s."""
    client = await make_client(JOB)
    now = time.time()
    answers = []
    for offset, tokens in [(0, 1_000_000), (10, 1_100_000)]:
        body = {"job": "llama3-70b", "tokens_total": tokens, "step": 7, "time": now - 10 + offset}
        response = await client.post("/api/v1/progress", json=body)
        assert response.status == 200
        assert response.headers["Link"] == '</api/v1/jobs/llama3-70b>; rel="related"'
        answers.append(await response.json())
    first, second = answers
    assert set(second) == {"accepted", "job", "state", "run", "version", "links"}
    assert second["accepted"] is True and second["job"] == "llama3-70b"
    assert (second["state"], second["run"]) == ("running", 1) and second["version"] > first["version"]
    assert second["links"] == {"job": "/api/v1/jobs/llama3-70b", "ledger": "/api/v1/jobs/llama3-70b/ledger"}
    job = await (await client.get(second["links"]["job"])).json()
    listed = (await (await client.get("/api/v1/jobs")).json())["jobs"]
    assert [job] == listed
    assert job["job"] == "llama3-70b" and job["mfu"] > 0 and "checkpoint" in job and "bottleneck" in job
    ended = await client.post(
        "/api/v1/progress", json={"job": "llama3-70b", "tokens_total": 1_200_000, "state": "failed"}
    )
    assert (await ended.json())["state"] == "failed"
    missing = await client.get("/api/v1/jobs/nope")
    assert missing.status == 404 and (await missing.json())["field"] == "job"


async def test_a_job_name_is_quoted_in_the_answers_links(make_client):
    client = await make_client({"jobs": {}})
    answer = await (await client.post("/api/v1/progress", json={"job": "team@llama+3", "tokens_total": 1})).json()
    assert answer["links"]["job"] == "/api/v1/jobs/team%40llama%2B3"
    assert (await (await client.get(answer["links"]["job"])).json())["job"] == "team@llama+3"


async def test_the_ledger_endpoint_answers_kinds_goodput_and_runs(make_client):
    client = await make_client(JOB)
    client.service.jobs._born -= 60  # the exporter started a minute ago: the job's start 30 s ago counts
    assert (await client.get("/api/v1/jobs/llama3-70b/ledger")).status == 404  # not known yet
    now = time.time()
    started = await client.post(
        "/api/v1/progress", json={"job": "llama3-70b", "run": "a1", "event": "start", "time": now - 30}
    )
    assert started.status == 200
    for step in (1, 2, 3):
        body = {"job": "llama3-70b", "run": "a1", "tokens_total": step * 1000, "step": step, "time": now - 3 + step}
        assert (await client.post("/api/v1/progress", json=body)).status == 200
    ledger = await (await client.get("/api/v1/jobs/llama3-70b/ledger")).json()
    assert set(ledger["kinds"]) == {
        "productive",
        "wasted",
        "startup",
        "checkpoint_save",
        "checkpoint_load",
        "down",
        "stalled",
    }
    assert ledger["kinds"]["startup"] > 0 and ledger["kinds"]["productive"] > 0 and 0 < ledger["goodput"] < 1
    [run] = ledger["runs"]
    assert set(run) >= {"start", "first_step_time", "end", "end_reason"} and run["end"] is None
    assert run["start"] == pytest.approx(now - 30, abs=1e-3)
    assert ledger["data_wait"] is None  # the job gave no data-wait figure
    missing = await client.get("/api/v1/jobs/nope/ledger")
    assert missing.status == 404 and (await missing.json())["field"] == "job"
    await next_tick(client.service)
    values = samples(await (await client.get("/metrics")).text())
    key = (("training_job", "llama3-70b"),)
    assert values[("mfu_job_gpu_seconds_total", (("kind", "startup"), ("training_job", "llama3-70b")))] > 0
    assert values[("mfu_job_goodput_ratio", key)] == pytest.approx(ledger["goodput"], abs=0.05)
    assert values[("mfu_job_restarts_total", key)] == 0


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET /" + b"a" * 5000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",  # a request line over max_line_size
        b"GET / HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"b" * 10_000 + b"\r\n\r\n",  # a header over max_field_size
    ],
)
async def test_a_malformed_request_gets_400_and_one_log_line_not_a_traceback(request_bytes, caplog):
    service = build_service(validate({}), [])
    runner = web.AppRunner(create_app(service), access_log=None, **HTTP_LIMITS)  # as serve() runs it
    await runner.setup()
    site = web.SockSite(runner, bound_socket := socket.create_server(("127.0.0.1", 0)))
    await site.start()
    try:
        with caplog.at_level(logging.DEBUG):
            reader, writer = await asyncio.open_connection(*bound_socket.getsockname()[:2])
            writer.write(request_bytes)
            answer = await reader.read()  # the server closes the connection after a parse error
            writer.close()
    finally:
        await runner.cleanup()
    assert answer.startswith(b"HTTP/1.0 400 Bad Request") or answer.startswith(b"HTTP/1.1 400 Bad Request"), answer
    errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(errors) == 1 and errors[0].exc_info is None, [r.getMessage() for r in caplog.records]
    assert "\n" not in errors[0].getMessage() and len(errors[0].getMessage()) < 400


async def test_a_port_in_use_is_one_line_before_any_source_starts():
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    source = ScriptedSource()
    service = build_service(validate({"web": {"listen_address": f"127.0.0.1:{busy.getsockname()[1]}"}}), [source])
    try:
        with pytest.raises(SystemExit) as stopped:
            await serve(service, stop=asyncio.Event())
    finally:
        busy.close()
    assert str(stopped.value).startswith("mfu-exporter: cannot listen on 127.0.0.1:")
    assert "\n" not in str(stopped.value)
    assert source.calls == 0 and not source.closed  # never started, so nothing to fail behind the message


async def test_answers_to_reports_carry_the_version_the_client_compares(make_client):
    client = await make_client(JOB)
    accepted = await client.post("/api/v1/progress", json={"job": "llama3-70b", "tokens_total": 1})
    refused = await client.post("/api/v1/progress", json={"job": "llama3-70b", "tokens_total": "many"})
    checkpoint = await client.post("/api/v1/checkpoints", json={"job": "llama3-70b", "checkpoint": "c", "phase": "x"})
    assert (accepted.status, refused.status, checkpoint.status) == (200, 400, 404)  # checkpoints are off by default
    assert {r.headers[VERSION_HEADER] for r in (accepted, refused, checkpoint)} == {__version__}
    assert VERSION_HEADER not in (await client.get("/metrics")).headers  # reads are not where the client looks
    # The client itself, over a real socket: it notes the version and, the majors being one, warns of nothing.
    reporter = ProgressReporter(str(client.make_url("/")), "llama3-70b", announce=False, heartbeat=None)
    reporter.update(tokens_total=2)
    await wait_for(lambda: reporter.sent == 1, what="the client's report taken")
    await asyncio.to_thread(reporter.close)
    assert reporter.exporter_version == __version__ and reporter.failures == 0
