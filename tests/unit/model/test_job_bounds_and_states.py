"""Bounds on what jobs report, an MFU above 1 withheld with the fact to suspect, and jobs that end."""

from __future__ import annotations

import logging
import math

import pytest
from prometheus_client.core import Metric

from mfu_exporter.config import ConfigError, validate
from mfu_exporter.model.attribution import Attributor, NodeSignals
from mfu_exporter.model.checkpoints import CheckpointTracker, parse_checkpoint_event
from mfu_exporter.model.errors import TooManyJobs, ValidationError
from mfu_exporter.model.jobs import JobTracker
from mfu_exporter.model.progress import parse_progress
from mfu_exporter.model.readings import GpuInfo
from mfu_exporter.render.attribution import attribution_families
from mfu_exporter.render.jobs import job_families
from tests.support.wait import next_tick

NOW = 1_800_000_000.0
H100 = "NVIDIA H100 80GB HBM3"
MODEL = {"params": 7e9}


class Clock:
    def __init__(self, now: float = NOW):
        self.now = now

    def __call__(self) -> float:
        return self.now


def eight_h100() -> list[GpuInfo]:
    return [GpuInfo(i, f"GPU-{i}", H100) for i in range(8)]


def report(job: str = "j", tokens: float = 0, **extra):
    # Parsed when it is sent: a report's time is at most a little ahead of the node's clock.
    return parse_progress({"job": job, "tokens_total": tokens, **extra}, max(NOW, extra.get("time") or NOW))


def samples(views) -> dict[tuple[str, tuple], float]:
    found = {}
    for family in job_families(views):
        assert isinstance(family, Metric)
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def names_for(views, job: str) -> set[str]:
    return {name for name, labels in samples(views) if dict(labels).get("training_job") == job}


def train(
    jobs: JobTracker,
    clock: Clock,
    job: str = "j",
    seconds: int = 30,
    tokens_per_second: float = 100_000,
    start_tokens: float = 0,
    **facts,
):
    """Reports every 10 s from now on; returns the last view."""
    view = None
    for i in range(0, seconds + 1, 10):
        view = jobs.report(
            report(job, start_tokens + i * tokens_per_second, time=clock.now, **(facts if i == 0 else {}))
        )
        clock.now += 10
    clock.now -= 10
    return view


# --- bounds -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field, body",
    [
        ("tokens_total", {"tokens_total": 1.0000001e21}),
        ("step", {"step": 2**53 + 1}),
        ("model.params", {"model": {"params": 1.1e15}}),
        ("model.params", {"model": {"params": "2000000P"}}),
        ("model.params", {"model": {"params": 0.5}}),
        ("model.layers", {"model": {"layers": 100_001}}),
        ("model.heads", {"model": {"heads": 10**6}}),
        ("model.head_dim", {"model": {"head_dim": 10**9}}),
        ("model.seq_len", {"model": {"seq_len": 10**9 + 1}}),
        ("gpus", {"gpus": 1025}),
        ("gpus", {"gpus": list(range(1025))}),
        ("gpus", {"gpus": [0, 5000]}),
        ("peak_tflops", {"peak_tflops": 1e-4}),
        ("peak_tflops", {"peak_tflops": 5e-324}),
        ("peak_tflops", {"peak_tflops": 1.1e6}),
        ("target_tokens", {"target_tokens": 1e22}),
        ("state", {"state": "done"}),
        ("state", {"state": None}),
    ],
)
def test_a_value_out_of_bounds_is_refused_naming_its_field(field, body):
    with pytest.raises(ValidationError) as refused:
        parse_progress({"job": "j", "tokens_total": 0, **body}, NOW)
    assert refused.value.field == field


@pytest.mark.parametrize(
    "body",
    [
        {"tokens_total": 1e21, "step": 2**53, "target_tokens": "1e21"},
        {"model": {"params": "1000T", "layers": 100_000, "heads": 100_000, "head_dim": 100_000, "seq_len": 10**9}},
        {"gpus": 1024, "peak_tflops": 1e6},
        {"gpus": list(range(1024)), "peak_tflops": 0.001},
    ],
)
def test_the_bounds_themselves_are_accepted_and_give_finite_figures(body):
    clock = Clock()
    jobs = JobTracker(window=60, clock=clock)
    first = parse_progress(
        {"job": "j", "tokens_total": 0, "time": NOW, "model": {"params": 1e15}, "gpus": 8, "peak_tflops": 1000, **body},
        NOW,
    )
    jobs.report(first)
    clock.now += 1
    jobs.report(parse_progress({"job": "j", "tokens_total": 1e21, "time": NOW + 1}, NOW))
    for (name, labels), value in samples(jobs.views()).items():
        assert math.isfinite(value), name


def test_config_jobs_take_the_same_bounds_naming_the_key():
    with pytest.raises(ConfigError) as refused:
        validate({"jobs": {"llama": {"params": "70B", "peak_tflops": 1e7}}}, "cfg.yaml")
    assert "jobs.llama.peak_tflops" in str(refused.value) and "cfg.yaml" in str(refused.value)


def test_a_checkpoint_timed_below_a_millisecond_has_no_bandwidth():
    clock = Clock()
    checkpoints = CheckpointTracker(clock=clock)
    for name, duration in (("fast", 5e-324), ("real", 2.0)):
        event = parse_checkpoint_event(
            {"job": "j", "checkpoint": name, "duration_seconds": duration, "bytes": 2**50}, NOW
        )
        checkpoints.record(event)
        bandwidth = checkpoints.totals()["j"].last_bandwidth
        assert bandwidth is None if name == "fast" else bandwidth == 2**49


# --- the time step ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("step", [0.0, 1e-9, 1e-3, 0.999])
def test_a_zero_or_sub_second_step_divides_nothing(step):
    clock = Clock()
    jobs = JobTracker(window=60, clock=clock)
    jobs.report(report(tokens=0, time=1000.0, model=MODEL, gpus=8, peak_tflops=1000))
    view = jobs.report(report(tokens=1e21, time=1000.0 + step))
    assert view.tokens_per_second is None and view.mfu is None
    assert view.reason == "waiting for progress reports at least 1 s apart"
    assert all(math.isfinite(v) for v in samples([view]).values())
    clock.now += 1.0
    view = jobs.report(report(tokens=2e21 / 2, time=1001.0))  # one second after the first: a rate again
    assert view.tokens_per_second == pytest.approx(1e21)


# --- an MFU above 1 ---------------------------------------------------------------------------------------------


def test_a_tiny_peak_override_withholds_mfu_and_peak_naming_peak_tflops_logged_once(caplog):
    clock = Clock()
    jobs = JobTracker(window=60, gpu_inventory=eight_h100, clock=clock)
    with caplog.at_level(logging.WARNING, logger="mfu_exporter.jobs"):
        view = train(jobs, clock, model=MODEL, peak_tflops=0.5)
        for _ in range(3):
            clock.now += 1
            jobs.views()
    assert view.mfu is None and view.implausible_mfu == pytest.approx(6 * 7e9 * 100_000 / (8 * 0.5e12))
    assert "peak_tflops (0.5 TFLOP/s per GPU, the GPU table says 989.4) is below what its GPUs do" in view.reason
    assert view.as_json()["implausible_mfu"] == view.implausible_mfu and view.as_json()["reason"] == view.reason
    exported = names_for([view], "j")
    assert "mfu_model_flops_utilization_ratio" not in exported and "mfu_job_peak_flops" not in exported
    assert {"mfu_job_model_flops_total", "mfu_job_tokens_total", "mfu_job_gpus"} <= exported
    assert [r.message for r in caplog.records].count(f"job j: no MFU: {view.reason}") == 1


def test_too_few_gpus_declared_names_gpus():
    clock = Clock()
    jobs = JobTracker(window=60, gpu_inventory=eight_h100, clock=clock)
    # 1.3e15 FLOP/s: more than one H100 does (989 TFLOP/s), less than eight.
    view = train(jobs, clock, tokens_per_second=31_000, model=MODEL, gpus=1)
    assert view.mfu is None and view.implausible_mfu > 1
    assert "gpus (1) is fewer than the GPUs the job trains on here (this node has 8)" in view.reason


def test_global_tokens_name_the_token_totals():
    clock = Clock()
    jobs = JobTracker(window=60, gpu_inventory=eight_h100, clock=clock)
    view = train(jobs, clock, tokens_per_second=1e9, model=MODEL)  # 4.2e19 FLOP/s on 8 H100s
    assert view.mfu is None
    assert "tokens_total grows faster than these GPUs can train" in view.reason and "model.params" in view.reason


def test_the_mfu_comes_back_when_the_facts_are_fixed():
    clock = Clock()
    jobs = JobTracker(window=10, gpu_inventory=eight_h100, clock=clock)
    train(jobs, clock, model=MODEL, peak_tflops=0.5)
    clock.now += 10
    view = train(jobs, clock, start_tokens=3_100_000, peak_tflops=989.4)
    assert view.reason is None and view.mfu == pytest.approx(6 * 7e9 * 100_000 / (8 * 989.4e12))


def test_the_flops_counter_never_goes_back_when_the_model_facts_change():
    clock = Clock()
    jobs = JobTracker(window=60, clock=clock)
    jobs.report(report(tokens=0, time=NOW, model={"params": 70e9}, gpus=8, peak_tflops=1000))
    clock.now += 5
    jobs.report(report(tokens=1000, time=NOW + 5))
    before = jobs.views()[0].model_flops
    assert before == 6 * 70e9 * 1000
    clock.now += 5
    after = jobs.report(report(tokens=2000, time=NOW + 10, model={"params": 7e9})).model_flops
    assert after == before + 6 * 7e9 * 1000  # the first 1,000 tokens keep the FLOPs they were counted with


# --- jobs that end ----------------------------------------------------------------------------------------------


def test_a_finished_job_loses_its_mfu_series_at_once_and_keeps_its_counters():
    clock = Clock()
    jobs = JobTracker(window=60, gpu_inventory=eight_h100, clock=clock)
    running = train(jobs, clock, model=MODEL, target_tokens="1T")
    assert running.mfu is not None and running.eta_seconds is not None
    clock.now += 1
    ended = jobs.report(report(tokens=3_000_000, time=clock.now, state="finished"))
    assert ended.state == "finished" and ended.mfu is None and ended.tokens_per_second is None
    assert ended.reason == "the job finished: MFU is measured while a job runs"
    exported = names_for(jobs.views(), "j")
    assert exported == {
        "mfu_job_tokens_total",
        "mfu_job_tokens_created",
        "mfu_job_model_flops_total",
        "mfu_job_model_flops_created",
        "mfu_job_step",
        "mfu_job_last_report_timestamp_seconds",
        "mfu_job_flops_per_token",
        "mfu_job_state",
        "mfu_job_info",
    } - {"mfu_job_step"}  # train() sends no step
    state = {
        dict(labels)["state"]: value
        for (name, labels), value in samples(jobs.views()).items()
        if name == "mfu_job_state"
    }
    assert state == {"running": 0.0, "finished": 1.0, "failed": 0.0, "cancelled": 0.0}


def test_an_ended_job_frees_its_slot_under_the_cap_and_reporting_again_is_a_new_run():
    clock = Clock()
    jobs = JobTracker(window=60, max_jobs=2, clock=clock)
    jobs.report(report("a", 1000, time=NOW, model=MODEL, gpus=8, peak_tflops=1000))
    jobs.report(report("b", 0, time=NOW))
    with pytest.raises(TooManyJobs):
        jobs.report(report("c", 0, time=NOW))
    clock.now += 10
    jobs.report(report("a", 2000, time=NOW + 10, state="failed"))
    jobs.report(report("c", 0, time=NOW + 10))  # a's slot is free
    with pytest.raises(TooManyJobs):  # a new run of a needs a slot again
        jobs.report(report("a", 0, time=NOW + 20))
    jobs.report(report("b", 10, time=NOW + 20, state="cancelled"))
    clock.now += 10
    view = jobs.report(report("a", 500, time=NOW + 20))
    assert (view.state, view.runs, view.tokens_total, view.restarts) == ("running", 2, 500, 0)
    # The counters began at 0 at a's first count (1,000) and carry on from the first run: no reset.
    assert view.tokens_processed == 1500
    assert view.facts.get("params") is None and view.mfu is None  # a new run says its facts again
    assert view.model_flops == 6 * 7e9 * 1000


def test_ended_jobs_are_bounded_by_the_cap_oldest_forgotten_first():
    clock = Clock()
    jobs = JobTracker(window=60, max_jobs=2, clock=clock)
    for name in ("a", "b", "c"):
        clock.now += 1
        jobs.report(report(name, 10, time=clock.now, state="finished"))
    assert sorted(jobs.names()) == ["b", "c"]


def test_an_ended_job_is_left_alone_by_the_attribution():
    clock = Clock()
    jobs = JobTracker(window=60, clock=clock)
    attribution = Attributor()
    train(jobs, clock, model=MODEL, gpus=8, peak_tflops=1000, expected_mfu=0.9)
    attribution.evaluate(clock.now, jobs.views(), NodeSignals())
    assert attribution.verdict("j") is not None
    jobs.report(report(tokens=3_000_000, time=clock.now + 1, state="finished"))
    attribution.evaluate(clock.now + 1, jobs.views(), NodeSignals())
    assert attribution.verdict("j") is None
    families = {f.name: f for f in attribution_families(attribution.standings())}
    assert not families["mfu_job_bottleneck"].samples
    assert families["mfu_job_lost_gpu_seconds"].samples  # a counter stays while the job is known


# --- over HTTP ----------------------------------------------------------------------------------------------------


async def test_the_api_frees_the_cap_on_finish_and_shows_why_an_mfu_was_withheld(make_client):
    client = await make_client({"ingest": {"max_jobs": 1}})
    now = client.service.clock()
    facts = {"model": MODEL, "gpus": 8, "peak_tflops": 0.5}
    for at, tokens in ((now - 20, 0), (now - 10, 1_000_000), (now, 2_000_000)):
        answer = await client.post("/api/v1/progress", json={"job": "a", "tokens_total": tokens, "time": at, **facts})
        assert answer.status == 200
    status = await (await client.get("/api/v1/status")).json()
    (job,) = status["jobs"]
    assert job["mfu"] is None and job["implausible_mfu"] > 1 and "peak_tflops (0.5 TFLOP/s per GPU)" in job["reason"]
    await next_tick(client.service)  # a report changes the job model; the tick publishes it to /metrics
    body = await (await client.get("/metrics")).text()
    assert 'mfu_job_tokens_total{training_job="a"}' in body  # the job is published, without an MFU
    assert 'mfu_model_flops_utilization_ratio{training_job="a"}' not in body
    assert 'mfu_job_peak_flops{training_job="a"}' not in body
    refused = await client.post("/api/v1/progress", json={"job": "b", "tokens_total": 0})
    assert refused.status == 429 and (await refused.json())["field"] == "job"
    bad = await client.post("/api/v1/progress", json={"job": "a", "tokens_total": 2_000_000, "state": "stopped"})
    assert bad.status == 400 and (await bad.json())["field"] == "state"
    done = await client.post("/api/v1/progress", json={"job": "a", "tokens_total": 2_000_000, "state": "finished"})
    assert done.status == 200 and (await done.json())["state"] == "finished"
    assert (await client.post("/api/v1/progress", json={"job": "b", "tokens_total": 0})).status == 200
    await next_tick(client.service)
    body = await (await client.get("/metrics")).text()
    assert 'mfu_job_state{state="finished",training_job="a"} 1.0' in body
    assert 'mfu_job_tokens_total{training_job="a"} 2e+06' in body


@pytest.mark.parametrize(
    "parse,body,field",
    [
        (parse_progress, {"job": "j1\n", "tokens_total": 1}, "job"),
        (parse_progress, {"job": "j1", "tokens_total": 1, "run": "r1\n"}, "run"),
        (parse_checkpoint_event, {"job": "j1\n", "checkpoint": "step-1"}, "job"),
        (parse_checkpoint_event, {"job": "j1", "checkpoint": "step-1\n"}, "checkpoint"),
    ],
)
def test_a_trailing_newline_never_passes_a_name_check(parse, body, field):
    # "$" matches before a final newline; the names are matched whole, so "j1\n" is refused, not a new label value.
    with pytest.raises(ValidationError) as refused:
        parse(body, NOW)
    assert refused.value.field == field


def test_a_config_job_name_with_a_trailing_newline_is_refused():
    with pytest.raises(ConfigError) as refused:
        validate({"jobs": {"j1\n": {"params": "7B"}}})
    assert "jobs" in str(refused.value)
