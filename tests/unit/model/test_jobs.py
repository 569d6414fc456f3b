import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mfu_exporter.model.errors import TooManyJobs, ValidationError
from mfu_exporter.model.jobs import JobTracker
from mfu_exporter.model.progress import parse_progress
from mfu_exporter.model.readings import GpuInfo

NOW = 1_800_000_000.0
H100 = "NVIDIA H100 80GB HBM3"
LLAMA = {"params": 70.6e9, "layers": 80, "heads": 64, "head_dim": 128, "seq_len": 8192}


class Clock:
    def __init__(self, now=NOW):
        self.now = now

    def __call__(self):
        return self.now


def eight_h100():
    return [GpuInfo(i, f"GPU-{i}", H100) for i in range(8)]


def tracker(clock, inventory=eight_h100, **kwargs):
    return JobTracker(configured={"llama3-70b": dict(LLAMA)}, window=60, gpu_inventory=inventory, clock=clock, **kwargs)


def report(job="llama3-70b", tokens=0, **extra):
    # Parsed when it is sent: a report's time is at most a little ahead of the node's clock.
    return parse_progress({"job": job, "tokens_total": tokens, **extra}, max(NOW, extra.get("time") or NOW))


def test_mfu_from_two_reports_matches_the_formula():
    clock = Clock()
    jobs = tracker(clock)
    jobs.report(report(tokens=0, time=NOW))
    clock.now += 10
    view = jobs.report(report(tokens=100_000, time=NOW + 10, step=12))
    per_token = 6 * 70.6e9 + 12 * 80 * 64 * 128 * 8192
    assert view.tokens_per_second == pytest.approx(10_000)
    assert view.peak_flops == pytest.approx(8 * 989.4e12)
    assert view.mfu == pytest.approx(per_token * 10_000 / (8 * 989.4e12))
    assert view.step == 12 and view.reason is None


def test_window_uses_oldest_and_newest_report_inside_it():
    clock = Clock()
    jobs = tracker(clock)
    for second, tokens in [(0, 0), (30, 1000), (70, 5000), (100, 8000)]:
        clock.now = NOW + second
        view = jobs.report(report(tokens=tokens, time=NOW + second))
    # the window is [40, 100]: reports at 70 and 100
    assert view.tokens_per_second == pytest.approx((8000 - 5000) / 30)


def test_a_job_reporting_every_step_keeps_about_one_window_point_per_second_and_an_exact_rate():
    clock = Clock()
    jobs = tracker(clock)
    for i in range(120 * 50):  # 50 reports a second for two minutes, 2,000 tokens/s
        clock.now = NOW + i / 50
        view = jobs.report(report(tokens=i * 40, time=clock.now))
    assert len(jobs._jobs["llama3-70b"].window) <= 64  # a point a second over the 60 s window, and its ends
    assert view.tokens_per_second == pytest.approx(2000)


def test_repeated_report_double_counts_nothing_and_backwards_total_starts_new_window():
    clock = Clock()
    jobs = tracker(clock)
    jobs.report(report(tokens=1000, time=NOW))
    clock.now += 5
    jobs.report(report(tokens=2000, time=NOW + 5))
    view = jobs.report(report(tokens=2000, time=NOW + 5))
    assert view.tokens_total == 2000
    clock.now += 5
    view = jobs.report(report(tokens=500, time=NOW + 10))  # restarted from a checkpoint
    assert view.restarts == 1
    assert view.tokens_per_second is None and view.mfu is None
    clock.now += 5
    view = jobs.report(report(tokens=1500, time=NOW + 15))
    assert view.tokens_per_second == pytest.approx(200)
    # the exported counter began at 0 at the first count (1000) and never goes backwards: 1000 before the restart,
    # then 1000 more tokens trained
    assert view.tokens_processed == 2000 and view.replayed_tokens == 1500


def test_no_report_for_a_window_means_zero_rate():
    clock = Clock()
    jobs = tracker(clock)
    jobs.report(report(tokens=0, time=NOW))
    clock.now += 10
    jobs.report(report(tokens=1000, time=NOW + 10))
    clock.now += 61
    (view,) = jobs.views()
    assert view.tokens_per_second == 0 and view.mfu == 0


def test_reasons_when_mfu_cannot_be_known():
    clock = Clock()
    jobs = JobTracker(gpu_inventory=lambda: [GpuInfo(0, "GPU-0", "NVIDIA Quantum Toaster")], clock=clock)
    view = jobs.report(report(job="mystery", tokens=0))
    assert "params unknown" in view.reason
    view = jobs.report(report(job="mystery", tokens=10, model={"params": "7B"}))
    assert "no bf16 peak known for GPU 'NVIDIA Quantum Toaster'" in view.reason
    clock.now += 1
    view = jobs.report(report(job="mystery", tokens=20, peak_tflops=100))
    assert view.reason is None and view.peak_flops == 100e12


def test_no_inventory_needs_gpus_and_peak_override():
    jobs = tracker(Clock(), inventory=lambda: None)
    view = jobs.report(report(tokens=0))
    assert "GPU inventory is unknown" in view.reason
    view = jobs.report(report(tokens=0, gpus=8))
    assert "set peak_tflops" in view.reason


def test_job_gpu_list_on_a_mixed_node_sums_each_peak():
    inventory = [GpuInfo(0, "GPU-a", H100), GpuInfo(1, "GPU-b", "NVIDIA A100-SXM4-80GB")]
    jobs = tracker(Clock(), inventory=lambda: inventory)
    view = jobs.report(report(tokens=0, gpus=[0, "GPU-b"]))
    assert view.peak_flops == pytest.approx(989.4e12 + 312e12)
    assert view.gpu_indices == [0, 1]
    view = jobs.report(report(tokens=0, gpus=[5]))
    assert "not found on this node: 5" in view.reason


def test_a_gpu_named_by_index_and_uuid_is_not_counted_twice():
    jobs = tracker(Clock())
    view = jobs.report(report(tokens=0, gpus=[0, 1, "GPU-0"]))
    assert view.reason == "job GPUs name GPU 0 twice (as 0 and GPU-0); list each GPU once"
    assert (view.gpus, view.peak_flops, view.mfu) == (None, None, None)  # no peak a cluster ratio would sum twice
    view = jobs.report(report(tokens=0, gpus=[0, 1]))
    assert (view.gpus, view.peak_flops) == (2, pytest.approx(2 * 989.4e12))


def test_the_no_mfu_line_is_logged_once_per_job_and_reason(caplog):
    clock = Clock()
    jobs = JobTracker(gpu_inventory=eight_h100, job_ttl=100, clock=clock)
    with caplog.at_level("WARNING", logger="mfu_exporter.model.jobs"):
        for job in ("a", "b", "a", "b"):
            jobs.report(report(job=job))
        assert [r.getMessage() for r in caplog.records] == [
            f"job {job}: no MFU: model params unknown: send model.params in a progress report or set jobs.<name>.params"
            for job in ("a", "b")
        ]
        caplog.clear()
        clock.now += 101  # both forgotten: a new job "a" is logged again
        jobs.report(report(job="a"))
        assert [r.getMessage() for r in caplog.records] == [
            "job a: no MFU: model params unknown: send model.params in a progress report or set jobs.<name>.params"
        ]


def test_eta_from_target_tokens():
    clock = Clock()
    jobs = tracker(clock)
    jobs.report(report(tokens=0, target_tokens="1M"))
    clock.now += 10
    view = jobs.report(report(tokens=100_000))
    assert view.eta_seconds == pytest.approx(90)


def test_job_cap_and_expiry():
    clock = Clock()
    jobs = JobTracker(max_jobs=2, job_ttl=100, clock=clock)
    jobs.report(report(job="a"))
    jobs.report(report(job="b"))
    with pytest.raises(TooManyJobs):
        jobs.report(report(job="c"))
    clock.now += 101
    jobs.report(report(job="c"))
    assert jobs.names() == ["c"]


class EveryPass(JobTracker):
    """A tracker that looks at every job for expiry every time, as before the pass could be skipped."""

    def _expire(self, now):
        self._expiry_bound = (float("inf"), 0.0)
        super()._expire(now)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["report", "touch", "views", "tick", "names"]),
            st.sampled_from(["a", "b", "c"]),
            st.sampled_from([0.0, 0.5, 3.0, 10.0, 10.5, 25.0, -4.0, -30.0]),  # clock steps, backwards too
        ),
        max_size=30,
    )
)
def test_jobs_expire_when_they_did_when_every_report_looked_at_every_job(operations):
    clocks = Clock(), Clock()
    trackers = JobTracker(job_ttl=10, clock=clocks[0]), EveryPass(job_ttl=10, clock=clocks[1])
    for operation, job, step in operations:
        outcomes = []
        for clock, jobs in zip(clocks, trackers):
            clock.now += step
            if operation == "report":
                outcomes.append(jobs.report(report(job=job)).name)
            elif operation == "touch":
                jobs.touch(job)
            elif operation == "views":
                outcomes.append([view.name for view in jobs.views()])
            elif operation == "tick":
                outcomes.append([view.name for view in jobs.tick()])
            outcomes.append((jobs.names(), jobs.generation))
        assert outcomes[: len(outcomes) // 2] == outcomes[len(outcomes) // 2 :]


def test_views_change_nothing_and_the_tick_forgets_expired_jobs(caplog):
    clock = Clock()
    jobs = JobTracker(gpu_inventory=eight_h100, job_ttl=100, clock=clock)
    jobs.report(report(job="a"), view=False)  # as a log source feeds it: no view, so no line yet
    jobs.report(report(job="b", model={"params": "7B"}))
    clock.now += 50
    jobs.report(report(job="b", model={"params": "7B"}, tokens=1000))
    clock.now += 51  # a is past job_ttl, b is not
    generation = jobs.generation
    with caplog.at_level("WARNING", logger="mfu_exporter.model.jobs"):
        caplog.clear()
        for _ in range(3):
            assert [view.name for view in jobs.views()] == ["b"]  # a is left out of every read...
        assert (jobs.names(), jobs.generation, caplog.records) == (["a", "b"], generation, [])  # ...and stays
        assert [view.name for view in jobs.tick()] == ["b"]
    assert jobs.names() == ["b"] and jobs.generation == generation + 1
    jobs.report(report(job="c"), view=False)
    with caplog.at_level("WARNING", logger="mfu_exporter.model.jobs"):
        caplog.clear()
        jobs.views()
        assert caplog.records == []  # a read logs nothing, the tick does, once
        jobs.tick()
        jobs.tick()
    assert [r.getMessage() for r in caplog.records] == [
        "job c: no MFU: model params unknown: send model.params in a progress report or set jobs.<name>.params"
    ]


@pytest.mark.parametrize(
    "body,field",
    [
        ({"tokens_total": 1}, "job"),
        ({"job": "a b", "tokens_total": 1}, "job"),
        ({"job": "x" * 129, "tokens_total": 1}, "job"),
        ({"job": "ok"}, "tokens_total"),
        ({"job": "ok", "tokens_total": -1}, "tokens_total"),
        ({"job": "ok", "tokens_total": "12"}, "tokens_total"),
        ({"job": "ok", "tokens_total": True}, "tokens_total"),
        ({"job": "ok", "tokens_total": 1, "step": 1.5}, "step"),
        ({"job": "ok", "tokens_total": 1, "time": NOW + 2 * 86400}, "time"),
        ({"job": "ok", "tokens_total": 1, "model": {"params": "seventy"}}, "model.params"),
        ({"job": "ok", "tokens_total": 1, "model": {"parms": 1}}, "model.parms"),
        ({"job": "ok", "tokens_total": 1, "model": []}, "model"),
        ({"job": "ok", "tokens_total": 1, "dtype": "int4"}, "dtype"),
        ({"job": "ok", "tokens_total": 1, "gpus": -1}, "gpus"),
        ({"job": "ok", "tokens_total": 1, "gpus": [0, 0]}, "gpus"),
        ({"job": "ok", "tokens_total": 1, "gpus": ["GPU-a", 1, "GPU-a"]}, "gpus"),
        ({"job": "ok", "tokens_total": 1, "tokens": 1}, "tokens"),
        ([1, 2], ""),
    ],
)
def test_bad_progress_names_the_field(body, field):
    with pytest.raises(ValidationError) as caught:
        parse_progress(body, NOW)
    assert caught.value.field == field


def test_facts_validated_once_are_told_apart_by_type_and_sign():
    # Validated facts are kept by their JSON text: facts that read the same to ``==`` must still validate apart.
    def facts(model, **more):
        return parse_progress({"job": "llama", "tokens_total": 1, "model": model, **more}, 1e9).facts

    for _ in range(2):  # the second time from what was kept
        assert facts({"params": 8e9, "layers": 32}) == {"params": 8e9, "layers": 32}
        with pytest.raises(ValidationError) as error:
            facts({"params": 8e9, "layers": 32.0})
        assert error.value.field == "model.layers"
        assert facts({"params": "8B", "causal_attention": True})["causal_attention"] is True
        with pytest.raises(ValidationError):
            facts({"params": "8B", "causal_attention": 1})
        assert facts({"params": "8B"}, gpus=[0, 1])["gpus"] == [0, 1]
        with pytest.raises(ValidationError):
            facts({"params": "8B"}, gpus=[0, True])
        assert str(facts({"params": "8B"}, expected_mfu=0.0)["expected_mfu"]) == "0.0"


def test_a_restart_from_a_checkpoint_never_lowers_the_counter_by_a_rounding():
    # (-23309.212 + 122945.238) + (561955.641 - 122945.238) is one ulp below -23309.212 + 561955.641 in doubles: a
    # counter one ulp lower reads as a reset to Prometheus, which counts the whole value again.
    clock = [1000.0]
    tracker = JobTracker({"llama": {"params": 7e9, "gpus": 8, "peak_tflops": 989}}, clock=lambda: clock[0])
    seen = []
    for total in (23309.212, 561955.641, 122945.238):
        clock[0] += 10.0
        tracker.report(parse_progress({"job": "llama", "tokens_total": total}, clock[0]))
        (view,) = tracker.views()
        seen.append((view.tokens_processed, view.model_flops))
    assert seen == sorted(seen) and seen[2] == seen[1]


def test_a_fed_count_arrives_when_its_line_was_read_so_a_stall_shows_as_soon_after_the_last_line():
    """A log's counts reach the model at the tick after the sample that carried them, seconds after the line was
    read: the job's silence counts from the read, as a report's from its arrival."""
    from mfu_exporter.model.feed import Progress, apply_feed

    clock = Clock()
    jobs = tracker(clock)
    for i in range(4):  # a line every 10 s, each applied 8 s after it was read
        read = NOW + 10 * i
        clock.now = read + 8
        apply_feed([Progress("llama3-70b", read, step=i, tokens=100_000.0 * i, read=read)], jobs, None)
    last_read = NOW + 30
    (view,) = jobs.views()
    assert view.progress_arrival == last_read
    overdue = view.stall_after_seconds
    clock.now = last_read + overdue + 1  # past the stall by the read; 7 s short of it by the tick that applied it
    (view,) = jobs.views()
    assert view.tokens_per_second == 0.0
    clock.now = last_read + overdue - 1
    (view,) = jobs.views()
    assert view.tokens_per_second == pytest.approx(10_000)


def _deliver(jobs, clock, lines, until, every=6.0):
    """What a logs sample hands over, applied at a tick: the lines read (at, tokens) and how far the log was read."""
    from mfu_exporter.model.feed import Heard, Progress, apply_feed

    items = [Progress("llama3-70b", at, tokens=tokens, read=at) for at, tokens in lines]
    apply_feed([*items, Heard(("llama3-70b",), until, every)], jobs, None)


def test_a_fed_job_is_not_stalled_while_its_next_lines_wait_for_the_sample_and_the_tick():
    """A log read every second, handed over every 5 s and applied at a tick that comes just before the sample: each
    tick applies lines read up to 5 s earlier. A job logging every 1.5 s (stalled after 4.5 s) is silent up to then
    only, so neither a tick nor a read between two ticks calls it stalled. Once its log goes quiet, the stall shows
    at the first delivery that read past it by its stall_after."""
    clock = Clock()
    jobs = tracker(clock, interval=5.0)
    lines = [(NOW + 1.5 * i, 10_000.0 * 1.5 * i) for i in range(40)]  # 10,000 tokens/s until NOW + 58.5
    rates = []
    for tick in range(2, 24):  # the first lines are read by NOW + 5, and delivered a tick later
        at = NOW + 5 * tick - 0.01  # the tick, just before the sample due at NOW + 5 * tick
        until = at - 5  # what the last sample had read
        clock.now = at
        _deliver(jobs, clock, [line for line in lines if until - 5 < line[0] <= until], until)
        for offset in (0.0, 1.0, 2.5, 4.9):  # the tick's view, then reads until the next tick
            clock.now = at + offset
            (view,) = jobs.views()
            rates.append((round(clock.now - NOW, 2), view.tokens_per_second))
    last_line = lines[-1][0]
    live = [(t, r) for t, r in rates if t <= last_line - NOW + 5 + view.stall_after_seconds]
    assert all(r == pytest.approx(10_000) for t, r in live if t > 10), live
    stalled_from = min(t for t, r in rates if r == 0.0)
    # Read past its last line by stall_after (4.5 s): at the delivery of the first sample after NOW + 63.
    assert stalled_from == pytest.approx(69.99), rates


def test_a_fed_job_whose_feed_stopped_coming_is_stalled_once_a_delivery_is_long_overdue():
    """The logs source hangs: no line, and no word of how far its logs were read. The job's silence counts up to
    now again once twice the longest delivery (the feed's 6 s, then the 5 s tick) has passed."""
    clock = Clock()
    jobs = tracker(clock, interval=5.0)
    for i in range(5):
        clock.now = NOW + 1.5 * i + 5
        _deliver(jobs, clock, [(NOW + 1.5 * i, 10_000.0 * 1.5 * i)], NOW + 1.5 * i)
    heard = NOW + 6
    (view,) = jobs.views()
    clock.now = heard + 2 * (6 + 5) - 0.1
    (view,) = jobs.views()
    assert view.tokens_per_second == pytest.approx(10_000)  # known silent 0 s, as far as its log was read
    clock.now = heard + 2 * (6 + 5) + view.stall_after_seconds + 0.1
    (view,) = jobs.views()
    assert view.tokens_per_second == 0.0
