"""The service's figures for a job that behaves as real ones do: loads, restarts and clocks, tick by tick."""

from dataclasses import replace

import pytest

from mfu_exporter.config import validate
from mfu_exporter.model.checkpoints import CheckpointTracker
from mfu_exporter.model.errors import ValidationError
from mfu_exporter.model.progress import parse_progress
from mfu_exporter.service import build_service


class Clocks:
    """The node's two clocks: monotonic seconds, and a wall clock that drifts from it by a little every read."""

    def __init__(self, wall: float = 1_800_000_000.0):
        self.mono = 1000.0
        self.base = wall - self.mono
        self.reads = 0

    def monotonic(self) -> float:
        return self.mono

    def time(self) -> float:
        self.reads += 1
        return self.base + self.mono + self.reads * 1e-6

    def advance(self, seconds: float) -> None:
        self.mono += seconds


def service_with(clocks: Clocks, jobs: dict | None = None):
    # Ticked every second here (evaluate_once after each second of the clocks), as mfu.interval says.
    config = validate(
        {"mfu": {"interval": "1s"}, "jobs": jobs or {"llama": {"params": 7e9, "gpus": 8, "peak_tflops": 989}}}
    )
    return build_service(config, [], clock=clocks.time, monotonic=clocks.monotonic)


def test_one_checkpoint_load_is_counted_once_over_many_ticks():
    clocks = Clocks()
    service = service_with(clocks)
    service.ingest_progress({"job": "llama", "event": "start", "run": "r1"})
    service.ingest_progress({"job": "llama", "event": "checkpoint_load_started", "step": 100})
    clocks.advance(30.0)
    service.ingest_progress({"job": "llama", "event": "checkpoint_load_finished", "step": 100})
    tokens = 0.0
    for second in range(200):
        clocks.advance(1.0)
        if second % 5 == 0:
            tokens += 5 * 4000.0
            service.ingest_progress({"job": "llama", "tokens_total": tokens, "step": 101 + second // 5})
        service.evaluate_once()
    totals = service.restores.totals()["llama"]
    assert totals.loads == 1
    assert abs(totals.seconds - 30.0) < 0.01


PEAK_PER_GPU = 989e12
LLAMA = {"params": 7e9, "gpus": 8, "peak_tflops": 989, "expected_mfu": 0.45}
# Tokens/s at 45 % MFU on 8 GPUs of 989 TFLOP/s with 6 × 7e9 FLOPs per token.
HEALTHY = 0.45 * 8 * PEAK_PER_GPU / (6 * 7e9)


def job_json(service, name="llama"):
    (view,) = [v for v in service.jobs.views() if v.name == name]
    return service.job_json(view)


def log_every(service, clocks, every, seconds, each_second=lambda second: None):
    """The job counts its tokens every ``every`` s of its own clock at the healthy rate, the service ticking each
    second, for ``seconds`` s; ``each_second`` looks after each tick."""
    start, tokens = clocks.time(), 0.0
    for second in range(1, seconds):
        clocks.advance(1.0)
        if second % every == 0:
            tokens += every * HEALTHY
            service.ingest_progress({"job": "llama", "tokens_total": tokens, "time": start + second})
        service.evaluate_once()
        each_second(second)


def test_a_job_that_reports_every_36_s_has_its_mfu_from_its_own_lines_and_is_never_stalled_between_them():
    clocks = Clocks()
    service = service_with(clocks, {"llama": LLAMA})
    seen = []

    def from_the_second_line(second):
        if second > 72:
            data = job_json(service)
            seen.append((second, data["mfu"], (data["bottleneck"] or {}).get("cause")))

    log_every(service, clocks, 36, 400, each_second=from_the_second_line)
    assert all(mfu is not None and abs(mfu - 0.45) < 0.01 for _, mfu, _ in seen), seen[:5]
    assert {cause for _, _, cause in seen} == {"none"}
    data = job_json(service)
    assert data["cadence_seconds"] == 36.0 and data["stall_after_seconds"] == 108.0
    assert data["window_seconds"] >= 36.0


def test_a_job_read_at_its_own_cadence_is_stalled_after_three_of_its_intervals_of_silence():
    clocks = Clocks()
    service = service_with(clocks, {"llama": LLAMA})
    log_every(service, clocks, 36, 181)
    # The last line came at second 180: silence is a stall after 3 × 36 s, at second 288, not before.
    for second in range(181, 300):
        clocks.advance(1.0)
        service.evaluate_once()
        data = job_json(service)
        cause = (data["bottleneck"] or {}).get("cause")
        if second < 288:
            assert cause == "none" and data["mfu"] > 0.4, (second, data["mfu"], cause)
        elif second > 289:
            assert cause == "stalled" and data["mfu"] == 0.0, (second, data["mfu"], cause)


def test_a_job_with_one_count_is_never_called_stalled():
    clocks = Clocks()
    service = service_with(clocks, {"llama": LLAMA})
    service.ingest_progress({"job": "llama", "tokens_total": 1000.0})
    for _ in range(600):
        clocks.advance(1.0)
        service.evaluate_once()
    data = job_json(service)
    assert data["mfu"] is None and data["stall_after_seconds"] is None
    assert (data["bottleneck"] or {}).get("cause") != "stalled"


def test_a_crashed_job_serves_no_live_mfu_and_a_restarted_one_no_old_figure_while_it_loads():
    clocks = Clocks()
    service = service_with(clocks, {"llama": LLAMA})
    tokens = 0.0
    service.ingest_progress({"job": "llama", "event": "start", "run": "r1", "heartbeat_seconds": 1})
    for second in range(60):
        clocks.advance(1.0)
        tokens += HEALTHY
        service.ingest_progress({"job": "llama", "tokens_total": tokens, "run": "r1", "heartbeat_seconds": 1})
        service.evaluate_once()
    assert abs(job_json(service)["mfu"] - 0.45) < 0.01
    shown = []
    for second in range(30):  # the process is killed: nothing more comes
        clocks.advance(1.0)
        service.evaluate_once()
        data = job_json(service)
        shown.append((second, data["mfu"], (data["bottleneck"] or {}).get("cause"), data["ledger"]["state"]))
    # Gone once its heartbeats are missed (3 s) or its silence is a stall (3 of its intervals): never a live figure.
    assert all(mfu == 0.0 and cause == "stalled" for _, mfu, cause, _ in shown[4:]), shown
    assert shown[-1][3] == "down"
    service.ingest_progress({"job": "llama", "event": "start", "run": "r2"})
    service.ingest_progress({"job": "llama", "event": "checkpoint_load_started", "run": "r2", "step": 40})
    for second in range(20):
        clocks.advance(1.0)
        service.evaluate_once()
        data = job_json(service)
        assert data["mfu"] == 0.0 and data["ledger"]["state"] == "checkpoint_load", (second, data["mfu"])
        assert "loading its checkpoint" in data["bottleneck"]["evidence"]
    service.ingest_progress({"job": "llama", "event": "checkpoint_load_finished", "run": "r2", "step": 40})
    tokens = 40 * HEALTHY
    for second in range(30):
        clocks.advance(1.0)
        tokens += HEALTHY * 0.5  # the new run trains at half speed: only its own counts may say so
        service.ingest_progress({"job": "llama", "tokens_total": tokens, "run": "r2"})
        service.evaluate_once()
        mfu = job_json(service)["mfu"]
        assert mfu is None or abs(mfu - 0.225) < 0.01, (second, mfu)
    assert abs(job_json(service)["mfu"] - 0.225) < 0.01


def train(service, clocks, seconds, tokens=0.0, rate=HEALTHY, **extra):
    """The job reports every second for ``seconds`` at ``rate``, the service ticking; the token total after."""
    for _ in range(seconds):
        clocks.advance(1.0)
        tokens += rate
        service.ingest_progress({"job": "llama", "tokens_total": tokens, "time": clocks.time(), **extra})
        service.evaluate_once()
    return tokens


def test_a_report_dated_ahead_is_refused_and_honest_reports_keep_their_mfu():
    clocks = Clocks()
    service = service_with(clocks, {"llama": LLAMA})
    tokens = train(service, clocks, 30)
    with pytest.raises(ValidationError) as refused:
        service.ingest_progress({"job": "llama", "tokens_total": tokens + HEALTHY, "time": clocks.time() + 3600})
    assert refused.value.field == "time"
    train(service, clocks, 30, tokens)
    assert abs(job_json(service)["mfu"] - 0.45) < 0.01


def test_a_pause_of_the_exporter_books_no_job_time_to_a_cause():
    clocks = Clocks()
    service = service_with(clocks, {"llama": LLAMA})
    tokens = train(service, clocks, 60)
    # The exporter is stopped for 30 s: the job goes on and its reports wait in the socket, then arrive at once.
    queued = []
    for _ in range(30):
        clocks.advance(1.0)
        tokens += HEALTHY
        queued.append({"job": "llama", "tokens_total": tokens, "time": clocks.time()})
    service.evaluate_once()  # the tick may run before the queued reports are read
    for body in queued:
        service.ingest_progress(body)
    train(service, clocks, 30, tokens)
    lost = {cause: seconds for cause, seconds in service.attribution.standings()[0].lost_seconds}
    assert sum(lost.values()) < 1.0, lost
    assert 29.0 <= service.attribution.unobserved_seconds <= 31.0


def test_a_late_report_of_an_ended_run_is_no_restart():
    clocks = Clocks()
    service = service_with(clocks, {"llama": LLAMA})
    service.ingest_progress({"job": "llama", "event": "start", "run": "r1"})
    old = train(service, clocks, 20, run="r1")
    service.ingest_progress({"job": "llama", "event": "start", "run": "r2"})
    tokens = train(service, clocks, 20, 0.0, run="r2")
    service.ingest_progress({"job": "llama", "tokens_total": old, "run": "r1", "time": clocks.time()})
    train(service, clocks, 5, tokens, run="r2")
    data = job_json(service)
    assert data["ledger"]["restarts"] == 1 and data["restarts"] == 1  # r2 only
    assert len(data["ledger"]["runs"]) == 2


def test_a_checkpoint_started_before_the_write_timeout_is_refused():
    clocks = Clocks()
    service = service_with(clocks, {"llama": LLAMA})
    service.checkpoints = CheckpointTracker(clock=clocks.time)
    with pytest.raises(ValidationError) as refused:
        service.ingest_checkpoint({"job": "llama", "checkpoint": "step-1", "phase": "started", "time": 1})
    assert refused.value.field == "time"
    service.checkpoints.tick()
    assert service.checkpoints.totals().get("llama") is None or service.checkpoints.totals()["llama"].failures == 0


def stateful(clocks: Clocks, directory) -> object:
    config = validate({"jobs": {"llama": LLAMA}, "state": {"dir": str(directory)}})
    return build_service(config, [], clock=clocks.time, monotonic=clocks.monotonic)


def exported(service, name="llama"):
    (view,) = [v for v in service.jobs.views() if v.name == name]
    return view.tokens_processed, view.model_flops


def test_a_jobs_counters_begin_at_0_at_its_first_count_here():
    clocks = Clocks()
    service = service_with(clocks, {"llama": LLAMA})
    train(service, clocks, 10, tokens=5e9)  # a job seen mid-run: its own total is already 5e9
    tokens, flops = exported(service)
    assert abs(tokens - 9 * HEALTHY) < 1 and abs(flops - 6 * 7e9 * tokens) < 1e6


@pytest.mark.parametrize("continues", [True, False], ids=["running-total", "integrated-rate"])
def test_an_exporter_restart_resumes_the_counters_never_lower(tmp_path, continues):
    clocks = Clocks()
    first = stateful(clocks, tmp_path)
    first.load_counters()
    total = train(first, clocks, 30)
    before, flops_before = exported(first)
    first.save_counters(final=True)  # as the exporter stops
    # The exporter is down 20 s; the job trains on. A log read from its tail again integrates its rate from there:
    # a total of its own frame, lower than the one the last exporter saw.
    clocks.advance(20.0)
    total += 20 * HEALTHY
    second = stateful(clocks, tmp_path)
    second.load_counters()
    again = total if continues else 3 * HEALTHY
    report = {"job": "llama", "tokens_total": again, "time": clocks.time()}
    second.jobs.report(replace(parse_progress(report, clocks.time()), continues=continues))
    after, flops_after = exported(second)
    assert after >= before and flops_after >= flops_before
    # A running total says what the job did meanwhile; an integrated rate cannot, and resumes where it was.
    assert abs(after - (before + 20 * HEALTHY if continues else before)) < 1
    third = stateful(clocks, tmp_path)
    third.load_counters()
    assert third.jobs.counters()["llama"].tokens == before  # the file is the last save's


def test_without_a_state_dir_a_restarted_exporter_begins_the_counters_at_0():
    clocks = Clocks()
    first = service_with(clocks, {"llama": LLAMA})
    total = train(first, clocks, 30)
    second = service_with(clocks, {"llama": LLAMA})
    train(second, clocks, 5, tokens=total)
    assert abs(exported(second)[0] - 4 * HEALTHY) < 1


def test_a_state_dir_that_cannot_be_written_loses_no_count(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    clocks = Clocks()
    service = stateful(clocks, blocker / "state")
    service.load_counters()
    train(service, clocks, 30)
    assert service.save_failures >= 2 and exported(service)[0] > 0


def test_a_pause_of_the_exporter_loses_no_run_whose_heartbeats_wait_in_the_socket():
    clocks = Clocks()
    service = service_with(clocks, {"llama": LLAMA})
    tokens = train(service, clocks, 10, run="r1", heartbeat_seconds=1)
    # Stopped for 10 s: the client's reports and heartbeats go on and wait to be read; the tick runs first.
    queued = []
    for _ in range(10):
        clocks.advance(1.0)
        tokens += HEALTHY
        queued.append(
            {"job": "llama", "tokens_total": tokens, "time": clocks.time(), "run": "r1", "heartbeat_seconds": 1}
        )
    service.evaluate_once()
    for body in queued:
        service.ingest_progress(body)
    train(service, clocks, 10, tokens, run="r1", heartbeat_seconds=1)
    data = job_json(service)
    assert data["ledger"]["restarts"] == 0 and len(data["ledger"]["runs"]) == 1
    assert data["ledger"]["kinds"]["down"] == 0.0
    # A run that really died meanwhile is still lost, its missed heartbeats counted from the exporter's return.
    clocks.advance(10.0)
    service.evaluate_once()
    for _ in range(4):
        clocks.advance(1.0)
        service.evaluate_once()
    data = job_json(service)
    assert data["ledger"]["state"] == "down" and data["mfu"] == 0.0
    assert data["ledger"]["runs"][0]["end_reason"] == "lost"


def test_a_restart_that_keeps_its_run_id_goes_on_counting():
    # torchrun keeps one run id across its restarts: the new process's totals go back to its checkpoint, under the
    # same id. That is the run alive, not a late report of the one that ended.
    clocks = Clocks()
    service = service_with(clocks, {"llama": LLAMA})
    service.ingest_progress({"job": "llama", "event": "start", "run": "r1"})
    train(service, clocks, 20, run="r1")
    service.ingest_progress({"job": "llama", "event": "start", "run": "r1"})
    before = exported(service)[0]
    train(service, clocks, 20, 0.0, run="r1")
    data = job_json(service)
    assert abs(exported(service)[0] - (before + 19 * HEALTHY)) < 1
    assert data["ledger"]["restarts"] == 1 and abs(data["mfu"] - 0.45) < 0.01


def integrated(service, clocks, total):
    """A count of a log reader's integrated rate (no running total of the job's own) at the clock's now."""
    service.jobs.report(
        replace(parse_progress({"job": "llama", "tokens_total": total}, clocks.time()), continues=False)
    )


def test_a_killed_exporter_never_resumes_an_integrated_frame_below_what_it_exported(tmp_path):
    # Killed, the exporter leaves its last periodic save, older than its last counts. A log reader's integrated
    # total cannot say what the job did since: resuming at the saved value would be lower than the last one
    # exported, which Prometheus reads as a reset and counts again. It begins a new series at 0.
    clocks = Clocks()
    first = stateful(clocks, tmp_path)
    first.load_counters()
    for total in range(1, 16):
        clocks.advance(1.0)
        integrated(first, clocks, total * HEALTHY)
        first.evaluate_once()
    before = exported(first)[0]
    assert first.jobs.counters()["llama"].tokens > 0  # a periodic save holds less than this
    clocks.advance(5.0)
    second = stateful(clocks, tmp_path)
    second.load_counters()
    integrated(second, clocks, HEALTHY)
    after = exported(second)[0]
    assert after >= before or after == 0.0, (before, after)
    # Stopped cleanly, the last save is its last count: the next exporter resumes there.
    second.evaluate_once()
    clocks.advance(1.0)
    integrated(second, clocks, 2 * HEALTHY)
    before = exported(second)[0]
    second.save_counters(final=True)
    third = stateful(clocks, tmp_path)
    third.load_counters()
    integrated(third, clocks, HEALTHY)
    assert exported(third)[0] == before


def test_a_killed_exporter_resumes_a_restarted_job_at_no_lower_value(tmp_path):
    # The job restarts from a checkpoint just after a periodic save; the exporter is killed after its next tick.
    # That tick saved the counters again: the saved running total is the new run's, so the next exporter resumes
    # at what it exported at least.
    clocks = Clocks()
    first = stateful(clocks, tmp_path)
    first.load_counters()
    total = train(first, clocks, 20)
    first.save_counters()
    clocks.advance(1.0)
    first.ingest_progress({"job": "llama", "tokens_total": total / 2, "time": clocks.time()})
    first.evaluate_once()
    before = exported(first)[0]
    clocks.advance(3.0)
    second = stateful(clocks, tmp_path)
    second.load_counters()
    second.ingest_progress({"job": "llama", "tokens_total": total / 2 + 3 * HEALTHY, "time": clocks.time()})
    assert exported(second)[0] >= before


def test_a_clean_stop_passes_on_a_killed_exporters_save_as_it_was(tmp_path):
    # A killed exporter's periodic save, read by one that stops before the job reports again, is saved again as it
    # came: not as a final one, which would let a log reader's integrated frame resume below what was exported.
    clocks = Clocks()
    first = stateful(clocks, tmp_path)
    first.load_counters()
    for total in range(1, 16):  # saved at the first count and 10 s later, then counting on
        clocks.advance(1.0)
        integrated(first, clocks, total * HEALTHY)
        first.evaluate_once()
    before = exported(first)[0]
    second = stateful(clocks, tmp_path)
    second.load_counters()
    second.save_counters(final=True)
    third = stateful(clocks, tmp_path)
    third.load_counters()
    integrated(third, clocks, HEALTHY)
    after = exported(third)[0]
    assert after >= before or after == 0.0, (before, after)


def test_a_run_lost_for_want_of_heartbeats_that_reports_again_is_that_run_not_a_stale_one():
    clocks = Clocks()
    service = service_with(clocks, {"llama": LLAMA})
    service.ingest_progress({"job": "llama", "event": "start", "run": "r1", "heartbeat_seconds": 1})
    tokens = train(service, clocks, 20, run="r1", heartbeat_seconds=1)
    for _ in range(30):  # its GPU fell off the bus: no step, no heartbeat; the run is lost after three misses
        clocks.advance(1.0)
        service.evaluate_once()
    assert job_json(service)["ledger"]["state"] == "down"
    train(service, clocks, 30, tokens, run="r1", heartbeat_seconds=1)  # the same process goes on
    assert abs(job_json(service)["mfu"] - 0.45) < 0.01


def test_saved_counters_of_a_job_silent_past_its_ttl_are_forgotten(tmp_path):
    clocks = Clocks()
    config = validate({"jobs": {"llama": LLAMA}, "state": {"dir": str(tmp_path)}, "ingest": {"job_ttl": "1h"}})
    first = build_service(config, [], clock=clocks.time, monotonic=clocks.monotonic)
    train(first, clocks, 10)
    first.save_counters()
    second = build_service(config, [], clock=clocks.time, monotonic=clocks.monotonic)
    second.load_counters()
    assert "llama" in second.jobs.counters()  # not counting here yet: kept for the exporter after this one
    clocks.advance(3601.0)
    assert "llama" not in second.jobs.counters()


def test_a_killed_exporter_resumes_no_counter_below_its_last_tick_when_the_job_restarted_meanwhile(tmp_path):
    # The job counted for 15 s (a periodic save at 10 s), the exporter is killed after its tick, and the job restarts
    # meanwhile from a checkpoint whose total lies between the periodic save's and the last one counted.
    clocks = Clocks()
    first = stateful(clocks, tmp_path)
    first.load_counters()
    train(first, clocks, 15)
    before = exported(first)[0]
    clocks.advance(5.0)
    second = stateful(clocks, tmp_path)
    second.load_counters()
    second.ingest_progress({"job": "llama", "tokens_total": 13 * HEALTHY, "time": clocks.time()})
    after = exported(second)[0]
    assert after >= before or after == 0.0, (before, after)
