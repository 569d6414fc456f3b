"""The time ledger (mfu_exporter.model.ledger) alone and through the job model: the known-truth run, each feed's way of
saying a run started or ended, and the property that the kinds partition time whatever happens."""

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mfu_exporter.model.discovery_jobs import DiscoveredJob, DiscoveredPod
from mfu_exporter.model.jobs import JobTracker
from mfu_exporter.model.ledger import KINDS, Ledger
from mfu_exporter.model.progress import parse_progress
from mfu_exporter.model.readings import GpuInfo
from mfu_exporter.model.recent import RecentValues
from tests.support.known_truth import END, TRUTH, play, script

OFFSET = 1_800_000_000.0
GPUS = 4


def test_the_known_truth_run_on_the_ledger_alone():
    ledger = Ledger(gpus=GPUS)
    play(ledger, OFFSET)
    view = ledger.view(END, OFFSET)
    assert view.seconds == pytest.approx(TRUTH)
    assert view.gpu_seconds == pytest.approx({k: v * GPUS for k, v in TRUTH.items()})
    assert view.goodput == pytest.approx(200 / 340)
    assert view.restarts == 1 and view.ideal_step_seconds == 1.0
    first, second = view.runs
    assert (first["start"], first["first_step_time"], first["end"], first["end_reason"]) == (
        OFFSET,
        OFFSET + 20,
        OFFSET + 160,
        "restarted",
    )
    assert (second["start"], second["first_step_time"], second["end"]) == (OFFSET + 220, OFFSET + 240, None)
    kinds = [(run, kind) for run, kind, _, _ in view.bands]
    assert kinds[:3] == [(1, "startup"), (1, "productive"), (1, "checkpoint_save")]
    assert (1, "down") in kinds and (2, "checkpoint_load") in kinds and (2, "wasted") in kinds


def test_a_first_step_reported_every_ten_steps_is_not_start_up():
    """Megatron prints every log interval: the first line's ten steps took their time, not start-up's."""
    ledger = Ledger(gpus=1)
    ledger.start_run(0.0, 0.0, "log")
    for n in range(1, 6):
        ledger.progress(30.0 + 20.0 * n, 0.0, 10 * n, "log")  # 2 s per step, from t=30
    ledger.finish(130.0, 0.0)
    assert ledger.seconds["startup"] == pytest.approx(30.0)
    assert ledger.seconds["productive"] == pytest.approx(100.0)


def test_a_restart_that_says_when_its_loop_begins_is_start_up_until_then_however_slow_its_first_steps():
    """torchtitan prints "Training starts at step N" as its loop begins, and then a step line every ten steps: the
    steps redone up to the first line took all the time since, even at three times the run's ideal step time."""
    ledger = Ledger(gpus=1)
    ledger.start_run(0.0, 0.0, "log")
    for n in range(1, 11):
        ledger.progress(10.0 + 10.0 * n, 0.0, 10 * n, "log")  # 1 s per step, from t=10 to step 100 at t=110
    ledger.start_run(120.0, 0.0, "log")  # a new process: the old one died after step 100
    ledger.load("finished", 130.0, 0.0, duration=5.0, resume=90)
    ledger.resume_at(132.0, 0.0, 90, "log")
    ledger.progress(162.0, 0.0, 100, "log")  # ten steps redone at 3 s each
    assert ledger.seconds["startup"] == pytest.approx(10.0 + 5.0 + 2.0)
    assert ledger.seconds["checkpoint_load"] == pytest.approx(5.0)
    assert ledger.seconds["wasted"] == pytest.approx(30.0)
    assert ledger.runs[1].first_step_time == pytest.approx(132.0)


def test_a_loop_begun_longer_ago_than_the_holdback_is_counted_as_training_before_its_first_step():
    ledger = Ledger(gpus=1, holdback=30.0)
    ledger.start_run(0.0, 0.0, "log")
    ledger.resume_at(20.0, 0.0, 0, "log")
    ledger.tick(200.0, 0.0)  # a job that logs every few minutes: its first line is still to come
    assert ledger.seconds["startup"] == pytest.approx(20.0)
    assert ledger.seconds["productive"] == pytest.approx(150.0)
    ledger.progress(240.0, 0.0, 100, "log")
    assert ledger.seconds["startup"] == pytest.approx(20.0)
    assert ledger.seconds["productive"] == pytest.approx(220.0)


def test_a_hang_is_stalled_and_a_crash_found_by_the_restart_is_down():
    ledger = Ledger(gpus=1)
    ledger.start_run(0.0, 0.0, "log")
    for step in range(1, 21):
        ledger.progress(float(step), 0.0, step, "log")
    ledger.progress(81.0, 0.0, 21, "log")  # 61 s for a 1 s step: a hang that recovered
    assert ledger.seconds["stalled"] == pytest.approx(60.0)
    for step in range(22, 31):
        ledger.progress(60.0 + step, 0.0, step, "log")
    ledger.tick(120.0, 0.0)  # nothing for 30 s: looks stalled, but within the holdback nothing is counted yet
    assert ledger.seconds["stalled"] == pytest.approx(60.0)
    ledger.start_run(150.0, 0.0, "log")  # start-up lines of a new process: the old one died after step 30
    assert ledger.seconds["down"] == pytest.approx(60.0)
    assert ledger.runs[0].end_reason == "restarted"


def test_pending_time_is_committed_after_the_holdback_and_a_job_that_ended_stops_accruing():
    ledger = Ledger(gpus=2, holdback=30.0)
    ledger.start_run(0.0, 0.0, "client", "a")
    ledger.tick(100.0, 0.0)
    assert ledger.seconds["startup"] == pytest.approx(70.0)  # what is older than the holdback
    ledger.end_run(100.0, 0.0, "finished")
    ledger.tick(1000.0, 0.0)
    assert sum(ledger.seconds.values()) == pytest.approx(100.0)
    assert ledger.idle_seconds == pytest.approx(870.0)  # idle too is settled up to the holdback


def test_a_lost_client_ends_its_run_at_its_last_heartbeat():
    ledger = Ledger(gpus=1)
    ledger.start_run(0.0, 0.0, "client", "a")
    ledger.alive(0.0, heartbeat=10.0)
    ledger.progress(5.0, 0.0, 1, "client")
    ledger.progress(6.0, 0.0, 2, "client")
    for second in range(1, 41):  # ticked every second: no gap of the exporter's own holds the silence back
        ledger.tick(float(second), 0.0)
    assert ledger.runs[0].end_reason == "lost" and ledger.runs[0].end == 6.0
    ledger.finish(40.0, 0.0)
    assert ledger.seconds["down"] == pytest.approx(34.0)


H100 = [GpuInfo(i, f"GPU-{i}", "NVIDIA H100 80GB HBM3") for i in range(8)]


class Clocks:
    """A wall clock that can step (NTP, an operator) and a monotonic one that never goes back."""

    def __init__(self):
        self.wall, self.mono = OFFSET, 1000.0

    def advance(self, seconds, wall_step=0.0):
        self.mono += seconds
        self.wall += seconds + wall_step


def job_tracker(clocks, gpus=GPUS):
    return JobTracker(
        configured={"llama": {"params": 7e9, "gpus": gpus}},
        gpu_inventory=lambda: H100,
        clock=lambda: clocks.wall,
        monotonic=lambda: clocks.mono,
    )


def ledger_of(jobs):
    [view] = [v for v in jobs.views() if v.name == "llama"]
    return view.ledger


def test_the_known_truth_run_through_the_job_model_with_reports_and_checkpoint_events():
    clocks = Clocks()
    jobs = job_tracker(clocks)
    begin = clocks.mono
    for at, event, arg in script():
        clocks.advance(begin + at - clocks.mono)
        body = {"job": "llama", "time": clocks.wall, "run": "a" if at < 220 else "b"}
        if event == "start":
            jobs.report(parse_progress({**body, "event": "start"}, clocks.wall))
        elif event == "step":
            jobs.report(parse_progress({**body, "tokens_total": arg * 1000, "step": arg}, clocks.wall))
        elif event.startswith("save"):
            jobs.checkpoint_event("llama", event.split("_")[1], clocks.wall, None)
        else:
            payload = {**body, "event": f"checkpoint_{event}"}
            if arg is not None:
                payload["step"] = arg
            jobs.report(parse_progress(payload, clocks.wall))
        jobs.tick()
    clocks.advance(begin + END - clocks.mono)
    view = ledger_of(jobs)
    # The last step's report settles everything up to the end.
    assert view.gpu_seconds == pytest.approx({k: v * GPUS for k, v in TRUTH.items()})
    assert view.goodput == pytest.approx(200 / 340)


def test_discovery_starts_and_ends_runs_and_a_new_pod_is_a_restart():
    clocks = Clocks()
    jobs = job_tracker(clocks)

    def found(pod):
        return {"llama": DiscoveredJob("llama", "kubernetes", (0, 1, 2, 3), (DiscoveredPod("kubernetes", "ns", pod),))}

    jobs.set_discovered(found("llama-0"))
    clocks.advance(10)
    for step in range(1, 11):
        jobs.report(parse_progress({"job": "llama", "tokens_total": step, "step": step}, clocks.wall))
        clocks.advance(1)
    jobs.set_discovered({})  # the pod is gone
    clocks.advance(30)
    jobs.set_discovered(found("llama-0"))  # back (a new pod of the same name): a new run
    clocks.advance(5)
    jobs.report(parse_progress({"job": "llama", "tokens_total": 11, "step": 11}, clocks.wall))
    view = ledger_of(jobs)
    assert view.restarts == 1
    assert [r["end_reason"] for r in view.runs] == ["gone", None]
    assert view.seconds["down"] == pytest.approx(31.0)  # from step 10 to the pod's return
    # Found at 0, its first 1 s step ended at 10: 9 s; back at 50, one step ended at 55: 4 s.
    assert view.seconds["startup"] == pytest.approx(13.0)


# -- the property: kinds partition time -------------------------------------------------------------------------
OPS = st.one_of(
    st.tuples(st.just("advance"), st.floats(0.0, 200.0), st.floats(-3600.0, 3600.0)),  # seconds, wall-clock step
    st.tuples(st.just("report"), st.integers(-5, 40), st.floats(0.0, 30.0)),  # step change, lag of its time
    st.tuples(st.just("tokens"), st.integers(-5000, 40000), st.floats(0.0, 30.0)),  # a report with no step
    st.tuples(st.just("event"), st.sampled_from(["start", "heartbeat", "checkpoint_load_started"]), st.floats(0, 5)),
    st.tuples(st.just("load_finished"), st.integers(0, 200), st.floats(0.0, 60.0)),
    st.tuples(st.just("log"), st.sampled_from(["start", "training_starts", "alive"]), st.integers(0, 200)),
    st.tuples(st.just("observe"), st.integers(-5, 40), st.floats(0.0, 30.0)),
    st.tuples(st.just("save"), st.sampled_from(["started", "finished", "failed"]), st.floats(0.0, 50.0)),
    st.tuples(st.just("discovery"), st.sampled_from(["none", "pod-a", "pod-b"]), st.just(0)),
    st.tuples(st.just("gpus"), st.integers(1, 8), st.just(0)),  # validated facts: 1 GPU or more
    st.tuples(st.just("end"), st.sampled_from(["finished", "failed", "cancelled"]), st.just(0)),
    st.tuples(st.just("tick"), st.just(0), st.just(0)),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(OPS, min_size=5, max_size=80))
def test_the_kinds_partition_wall_time_times_gpus_for_any_sequence(ops):
    clocks = Clocks()
    jobs = job_tracker(clocks)
    step = tokens = 0
    seen: dict[str, float] = {}
    for op, a, b in ops:
        if op == "advance":
            clocks.advance(a, b)
        elif op == "report":
            step = max(step + a, 0)
            jobs.report(
                parse_progress(
                    {"job": "llama", "tokens_total": step, "step": step, "time": clocks.wall - b}, clocks.wall
                )
            )
        elif op == "tokens":
            tokens = max(tokens + a, 0)
            jobs.report(parse_progress({"job": "llama", "tokens_total": tokens, "time": clocks.wall - b}, clocks.wall))
        elif op == "event":
            body = {"job": "llama", "event": a, "run": f"r{int(b)}", "heartbeat_seconds": 10}
            jobs.report(parse_progress(body, clocks.wall))
        elif op == "load_finished":
            body = {"job": "llama", "event": "checkpoint_load_finished", "step": a, "duration_seconds": b + 1}
            jobs.report(parse_progress(body, clocks.wall))
        elif op == "log":
            jobs.observe("llama")
            jobs.run_event("llama", a, clocks.wall, step=b)
        elif op == "observe":
            step = max(step + a, 0)
            jobs.observe("llama", step=step, at=clocks.wall - b)
        elif op == "save":
            jobs.checkpoint_event("llama", a, clocks.wall - b / 10, b if a != "started" else None)
        elif op == "discovery":
            pods = (
                {}
                if a == "none"
                else {"llama": DiscoveredJob("llama", "kubernetes", (0, 1), (DiscoveredPod("kubernetes", "ns", a),))}
            )
            jobs.set_discovered(pods)
        elif op == "gpus":
            if "llama" in jobs._jobs:
                jobs._jobs["llama"].facts["gpus"] = a
        elif op == "end":
            if "llama" in jobs._jobs:
                jobs.report(parse_progress({"job": "llama", "tokens_total": tokens, "state": a}, clocks.wall))
        else:
            jobs.tick()
        job = jobs._jobs.get("llama")
        if job is None:
            continue
        view = job.ledger.view(clocks.mono, clocks.wall - clocks.mono)
        for kind in KINDS:
            assert math.isfinite(view.gpu_seconds[kind]) and math.isfinite(view.seconds[kind])
            assert view.gpu_seconds[kind] >= seen.get(kind, 0.0) - 1e-9, f"{kind} went back"
            seen[kind] = view.gpu_seconds[kind]
        assert view.goodput is None or 0.0 <= view.goodput <= 1.0
        ledger = job.ledger
        if ledger.settled is not None:
            # Every second since the first event is one kind, or idle while the job had ended, never both.
            assert ledger.settled <= clocks.mono + 1e-9
            assert sum(ledger.seconds.values()) + ledger.idle_seconds == pytest.approx(
                ledger.settled - ledger.origin, abs=1e-6
            )
    job = jobs._jobs.get("llama")
    if job is not None and job.ledger.settled is not None:
        job.ledger.finish(clocks.mono, clocks.wall - clocks.mono)
        ledger = job.ledger
        assert ledger.settled == pytest.approx(clocks.mono)
        assert sum(ledger.seconds.values()) + ledger.idle_seconds == pytest.approx(
            clocks.mono - ledger.origin, abs=1e-6
        )
        if not any(op == "end" for op, _, _ in ops):
            assert ledger.idle_seconds == 0.0
        if not any(op == "gpus" for op, _, _ in ops):  # the configured 4 GPUs throughout: GPU-seconds = 4 × seconds
            assert sum(ledger.gpu_seconds.values()) == pytest.approx(GPUS * sum(ledger.seconds.values()), abs=1e-6)


def test_gpu_seconds_follow_the_gpu_count_over_time():
    clocks = Clocks()
    jobs = job_tracker(clocks, gpus=2)
    jobs.report(parse_progress({"job": "llama", "event": "start", "run": "a"}, clocks.wall))
    clocks.advance(10)
    jobs.tick()  # 10 s at 2 GPUs (pending)
    jobs._jobs["llama"].facts["gpus"] = 6
    jobs.tick()  # the count changes: what was pending is settled at 2
    clocks.advance(10)
    jobs._jobs["llama"].ledger.finish(clocks.mono, 0.0)
    assert jobs._jobs["llama"].ledger.gpu_seconds["startup"] == pytest.approx(10 * 2 + 10 * 6)


def test_a_new_slurm_step_on_the_jobs_gpus_is_a_new_run():
    clocks = Clocks()
    jobs = job_tracker(clocks)

    def found(steps):
        pod = DiscoveredPod("slurm", slurm_job_id="4242", slurm_steps=steps)
        return {"llama": DiscoveredJob("llama", "slurm", (0, 1, 2, 3), (pod,))}

    jobs.set_discovered(found("0"))
    jobs.report(parse_progress({"job": "llama", "tokens_total": 1, "step": 1}, clocks.wall))
    clocks.advance(5)
    jobs.set_discovered(found("0"))  # the same step: the same run
    jobs.set_discovered(found("1"))  # srun again in the same allocation: step 1
    view = ledger_of(jobs)
    assert view.restarts == 1 and [r["source"] for r in view.runs] == ["discovery", "discovery"]


def test_tokens_growing_between_long_steps_are_not_a_stall():
    """Steps of 60 s with a report of the growing token total every 5 s (the demo's job): never stalled."""
    clocks = Clocks()
    jobs = job_tracker(clocks)
    jobs.report(parse_progress({"job": "llama", "event": "start", "run": "a"}, clocks.wall))
    for tick in range(1, 121):
        clocks.advance(5)
        body = {"job": "llama", "run": "a", "tokens_total": tick * 100, "step": tick // 12}
        jobs.report(parse_progress(body, clocks.wall))
        jobs.tick()
    jobs._jobs["llama"].ledger.finish(clocks.mono, clocks.wall - clocks.mono)
    seconds = jobs._jobs["llama"].ledger.seconds
    assert seconds["stalled"] == 0.0 and seconds["productive"] == pytest.approx(600.0)  # training from the start
    assert jobs._jobs["llama"].ledger.ideal_step() == 60.0  # its long steps are steady ones


def test_a_save_the_job_trains_through_is_not_checkpoint_save():
    """The checkpoint watcher sees a 40 s write while the job's steps go on (an async save): training, not a save;
    a save with no step during it blocked training."""
    ledger = Ledger(gpus=1)
    ledger.start_run(0.0, 0.0, "client", "a")
    for step in range(1, 11):
        ledger.progress(float(step), 0.0, step, "client")
    ledger.save("started", 10.0, 0.0)
    for step in range(11, 51):
        ledger.progress(float(step), 0.0, step, "client")
    ledger.save("finished", 50.0, 0.0)
    ledger.save("started", 50.0, 0.0)
    ledger.save("finished", 60.0, 0.0)  # nothing during this one: it blocked
    ledger.progress(61.0, 0.0, 51, "client")
    ledger.finish(61.0, 0.0)
    assert ledger.seconds["checkpoint_save"] == pytest.approx(10.0)
    assert ledger.seconds["productive"] == pytest.approx(51.0) and ledger.ideal_step() == 1.0


def test_no_time_before_the_exporter_started_is_counted():
    """A job that started an hour before the exporter (its client's start event says so): its ledger begins when
    the exporter did, not an hour earlier."""
    clocks = Clocks()
    jobs = job_tracker(clocks)
    jobs.report(parse_progress({"job": "llama", "event": "start", "run": "a", "time": clocks.wall - 3600}, clocks.wall))
    clocks.advance(10)
    jobs._jobs["llama"].ledger.finish(clocks.mono, clocks.wall - clocks.mono)
    assert jobs._jobs["llama"].ledger.seconds["startup"] == pytest.approx(10.0)


@given(st.integers(1, 8), st.lists(st.floats(0.001, 1e6), max_size=40))
def test_recent_values_median_is_the_upper_median_of_the_last_values(size, values):
    recent = RecentValues(size)
    for count, value in enumerate(values, 1):
        recent.append(value)
        last = sorted(values[max(count - size, 0) : count])
        assert len(recent) == len(last) and recent.median() == last[len(last) // 2]
