"""The exporter restarted (``kill -9``, then started on the same config) under a running Hugging Face Trainer: what it
serves before, during and after, against the Trainer's own count (tests/support/realjobs).

The peak both sides use, and what the daemon is told, are the harness's (tests/support/realjobs_harness.py)."""

from __future__ import annotations

import json

import pytest

from tests.support.realjobs_harness import (
    JOB_DEADLINE,
    TOLERANCE,
    Daemon,
    Watcher,
    figures,
    hf_trainer,
    settled,
)
from tests.support.wait import wait_until

pytestmark = pytest.mark.slow


# -- The exporter restarted under a running job ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def restarted(tmp_path_factory, facts) -> dict:
    """A Trainer run (a line every 100 steps) whose daemon is killed (``kill -9``) right after one of its lines and
    started again on the same config while the job trains on; what the daemon served all along, read every 0.25 s.
    The MFU window holds the whole run, so each MFU served spans from the first line the daemon has to its last."""
    tmp = tmp_path_factory.mktemp("restart")
    out = tmp / "hf"
    peak = facts["peak_flops"]
    daemon = Daemon(
        tmp,
        [{"path": str(out / "train.log"), "job": "hf-gpt2"}],
        {"hf-gpt2": {"params": facts["non_embedding_params"], "gpus": 1, "world_size": 1, "peak_flops": peak}},
        # The job counters resume from state.dir across the restart (the shipped DaemonSet and unit keep one).
        {"mfu": {"window": "5m"}, "state": {"dir": str(tmp / "state")}},
    )
    state_file = tmp / "state" / "jobs.json"
    daemon.start()
    job = hf_trainer(out, steps=800, logging_steps=100)
    try:
        with Watcher(daemon, "hf-gpt2") as watcher:
            settled(daemon, "hf-gpt2", "an MFU", lambda j: j["mfu"] is not None, timeout=JOB_DEADLINE)
            lines = job.text().count("'num_input_tokens_seen'")
            wait_until(lambda: job.text().count("'num_input_tokens_seen'") > lines, JOB_DEADLINE, "the next line")
            restarted_after = daemon.job("hf-gpt2")
            # Killed once the daemon has saved the job's counters (the tick after its first count does).
            wait_until(
                lambda: state_file.exists() and "hf-gpt2" in json.loads(state_file.read_text())["jobs"],
                JOB_DEADLINE,
                "the job's counters saved",
            )
            daemon.kill()
            daemon.start()
            assert job.wait() == 0, job.text()[-3000:]
            result = json.loads((out / "trainer_result.json").read_text())
            final = result["metrics"]["num_input_tokens_seen"]
            settled(daemon, "hf-gpt2", "the last count", lambda j: j["tokens_total"] == final)
    finally:
        job.stop()
        daemon.stop()
    (tmp / "served.json").write_text(json.dumps(watcher.seen))  # for a look after a failure
    return {"seen": watcher.seen, "result": result, "peak": peak, "before": restarted_after}


def test_exporter_restarted_mid_run_no_counter_goes_back(restarted):
    """Every counter read before, during and after the restart is monotone: the restarted daemon resumes them from
    its state directory (a lower value would be a reset to Prometheus, which adds the whole value again)."""
    seen = restarted["seen"]
    for counter in ("mfu_job_tokens_total", "mfu_job_model_flops_total"):
        values = [(s["time"], s["start"], s[counter]) for s in seen if s.get(counter) is not None]
        assert {start for _, start, _ in values} == {1, 2}, "read before and after the restart"
        back = [(a, b) for a, b in zip(values, values[1:]) if b[2] < a[2]]
        figures(f"restart {counter}", reads=len(values), first=values[0][2], last=values[-1][2], back=len(back))
        assert not back, f"{counter} went back: {back[:3]}"


def test_exporter_restarted_mid_run_serves_no_mfu_spike(restarted):
    """Every MFU served (the gauge, and the API's value, withheld as implausible or not) is the Trainer's own over
    the same lines within 2 %: from the first line the daemon's window holds to its newest, by the Trainer's clock
    (``train_runtime``) and count (``total_flos``). The restarted daemon reads the log's backlog, dated by the
    Trainer's own clock, so its window holds the lines before the restart too: the oldest within the window."""
    seen, result, peak = restarted["seen"], restarted["result"], restarted["peak"]
    history = [entry for entry in result["log_history"] if "loss" in entry]
    by_tokens = {entry["num_input_tokens_seen"]: entry for entry in history}
    per_token = result["metrics"]["total_flos"] / result["metrics"]["num_input_tokens_seen"]
    first = {}  # per daemon start: the first token count it served (the line its window starts at)
    # /metrics shows a line from the service's next tick, the jobs JSON at once: a gauge is compared only where the
    # served counter has reached the JSON's line, its usual distance below it (the lines before the daemon's first).
    behind: dict[int, float] = {}
    for s in seen:
        if (s["job"] or {}).get("tokens_total") is not None and s.get("mfu_job_tokens_total") is not None:
            gap = s["job"]["tokens_total"] - s["mfu_job_tokens_total"]
            behind[s["start"]] = min(behind.get(s["start"], gap), gap)
    wrong = []
    compared = 0
    for s in seen:
        job = s["job"] or {}
        if job.get("tokens_total") is None:
            continue
        same_line = s.get("mfu_job_tokens_total") == job["tokens_total"] - behind.get(s["start"], 0.0)
        # The first daemon has the lines from the first it saw; the restarted one the whole log (its backlog).
        known = first.setdefault(
            s["start"], job["tokens_total"] if s["start"] == 1 else history[0]["num_input_tokens_seen"]
        )
        newest = job["tokens_total"]
        b = by_tokens[newest]
        window = job.get("window_seconds") or 0.0
        held = [e for e in history if known <= e["num_input_tokens_seen"] < newest]
        held = [e for e in held if e["train_runtime"] >= b["train_runtime"] - window] or held[-1:]
        if not held:
            continue
        a = held[0]
        start = a["num_input_tokens_seen"]
        own = per_token * (newest - start) / (b["train_runtime"] - a["train_runtime"]) / peak
        served = s.get("mfu_model_flops_utilization_ratio") if same_line else None
        for value in (served, job.get("mfu"), job.get("implausible_mfu")):
            if value is not None:
                compared += 1
                if abs(value - own) > TOLERANCE * own:
                    wrong.append((s["start"], newest, round(value, 4), round(own, 4)))
    figures("restart mfu", compared=compared, wrong=len(wrong), first_wrong=sorted(set(wrong))[:4])
    assert compared and {start for start, *_ in wrong} <= {2}, wrong[:4]  # before the restart: right
    assert not wrong, f"(daemon start, tokens, served, the Trainer's own): {sorted(set(wrong))[:6]}"
