"""A real Hugging Face Trainer logging at its own cadence, sparser than the node's MFU window, under a real
``mfu-exporter run`` (tests/support/realjobs): the time between its lines is training, not a stall, and once it has
printed its final summary and exited its MFU is no longer served as live.

A CPU has no entry in the GPU peak table: the jobs' peak is one thread's float32 matmul FLOP/s, measured once, and the
config declares it as ``jobs.<name>.peak_flops``. The daemon is configured with where the log is and the job's facts
only, and an MFU window shorter than the job's cadence, as a node set up for jobs that log every few seconds has."""

from __future__ import annotations

import json

import pytest

from mfu_exporter.config import DEFAULTS
from mfu_exporter.sources.logs import FIND_INTERVAL
from tests.support.realjobs_harness import JOB_DEADLINE, Daemon, Watcher, figures, hf_trainer, model_facts, settled

pytestmark = pytest.mark.slow

TICK = DEFAULTS.mfu.interval  # seconds between the job model's evaluations, at the default
WINDOW = 3.0  # seconds: the node's MFU window, under the Trainer's line interval here (5 s unloaded, more when busy)
AFTER_END = 3  # the job's line intervals after the job's last line by which its MFU is no longer served as live


@pytest.fixture(scope="module")
def sparse(tmp_path_factory) -> dict:
    """A Trainer run with a line every 150 steps (about 5 s on this CPU when it is idle), read every 0.25 s from start
    to well after it exited."""
    facts = model_facts()
    tmp = tmp_path_factory.mktemp("cadence")
    out = tmp / "hf"
    daemon = Daemon(
        tmp,
        [{"path": str(out / "train.log"), "job": "hf-sparse"}],
        {
            "hf-sparse": {
                "params": facts["non_embedding_params"],
                "gpus": 1,
                "world_size": 1,
                "peak_flops": facts["peak_flops"],
            }
        },
        {"mfu": {"window": f"{WINDOW:g}s"}},
    )
    daemon.start()
    job = hf_trainer(out, steps=600, logging_steps=150)
    try:
        with Watcher(daemon, "hf-sparse") as watcher:
            settled(daemon, "hf-sparse", "the first MFU", lambda j: j["mfu"] is not None, timeout=JOB_DEADLINE)
            assert job.wait() == 0, job.text()[-3000:]
            ended = watcher.seen[-1]["time"]  # the process is gone by now
            result = json.loads((out / "trainer_result.json").read_text())
            history = [e for e in result["log_history"] if "loss" in e]
            interval = (history[-1]["train_runtime"] - history[1]["train_runtime"]) / (len(history) - 2)
            final = result["metrics"]["num_input_tokens_seen"]
            last = settled(daemon, "hf-sparse", "the last count", lambda j: j["tokens_total"] == final)
            # Watch on for the end's grace: the stall rule the daemon learned from the job's own intervals (3 of
            # them: the median, which a loaded machine moves away from the mean measured here).
            grace = max(last["stall_after_seconds"] or 0.0, AFTER_END * interval)
            watcher.until(ended + grace + FIND_INTERVAL + TICK + 4.0)
            ledger = daemon.ledger("hf-sparse")
    finally:
        job.stop()
        daemon.stop()
    (tmp / "served.json").write_text(json.dumps(watcher.seen))  # for a look after a failure
    return {"seen": watcher.seen, "ended": ended, "interval": interval, "grace": grace, "ledger": ledger}


def test_a_job_logging_less_often_than_the_window_is_never_stalled_between_its_lines(sparse):
    """From its first MFU (0 included) to its exit, every view of the job has an MFU above 0 and no cause
    ``stalled``, and its ledger books no stalled time: the time between two lines is training."""
    seen, ended = sparse["seen"], sparse["ended"]
    first = next(s["time"] for s in seen if (s["job"] or {}).get("mfu") is not None)
    during = [s for s in seen if first <= s["time"] <= ended and s["job"]]
    stalled = [
        (
            round(s["time"] - first, 1),
            s["job"]["mfu"],
            (s["job"].get("bottleneck") or {}).get("cause"),
            s["job"]["reason"],
        )
        for s in during
        if not s["job"]["mfu"] or (s["job"].get("bottleneck") or {}).get("cause") == "stalled"
    ]
    figures(
        "cadence",
        interval=sparse["interval"],
        window=WINDOW,
        views=len(during),
        stalled_views=len(stalled),
        first=stalled[:3],
        ledger_stalled=sparse["ledger"]["seconds"]["stalled"],
    )
    assert not stalled, (
        f"(seconds after the first MFU, MFU, cause, reason) while it trained: {sorted(set(stalled))[:6]}"
    )
    assert sparse["ledger"]["seconds"]["stalled"] == 0


def test_a_finished_job_s_mfu_is_no_longer_served_as_live(sparse):
    """Within a few of the job's own line intervals after its process is gone (it printed its final summary dict and
    exited), the daemon serves no live MFU for it: absent, or 0 with a cause, or a state other than running; not
    its last figure, nor a 0 that no cause explains."""
    seen, ended, interval = sparse["seen"], sparse["ended"], sparse["interval"]
    # Past the grace, with the follower's pass that finds the log quiet, the tick that applies it, and a second for
    # the watcher's poll.
    late = [s for s in seen if s["time"] > ended + sparse["grace"] + FIND_INTERVAL + TICK + 1.0 and s["job"]]
    live = [
        (
            round(s["time"] - ended, 1),
            s["job"]["mfu"],
            s["job"]["state"],
            (s["job"].get("bottleneck") or {}).get("cause"),
        )
        for s in late
        if s["job"]["state"] == "running"
        and s["job"]["mfu"] is not None
        and (s["job"]["mfu"] > 0 or (s["job"].get("bottleneck") or {}).get("cause") in (None, "none"))
    ]
    figures("ended", interval=interval, views_after=len(late), live=len(live), first=live[:3])
    assert late, "no view of the job that late"
    assert not live, f"(seconds after the job exited, MFU, state, cause): {live[:6]}"
