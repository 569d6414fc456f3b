"""A torchrun job on two CPU ranks (gloo) under a real ``mfu-exporter run``, read from its log alone: a rank killed
with ``kill -9`` and the group restarted from its torch.distributed.checkpoint, against what its processes recorded
with their own clocks; and the same job with a data loader made slow, named ``input`` (tests/support/realjobs).

The peak both sides use, and what the daemon is told, are the harness's (tests/support/realjobs_harness.py)."""

from __future__ import annotations

import json
import os
import re
import signal
import time

import pytest

from tests.support.realjobs_harness import (
    JOB_DEADLINE,
    SERVED,
    TOLERANCE,
    Daemon,
    figures,
    settled,
    torchrun_job,
    truth,
)
from tests.support.wait import wait_until

pytestmark = pytest.mark.slow


# -- torchrun: a rank killed, the group restarted from its checkpoint ------------------------------------------------

DDP_FACTS = {"gpus": 2, "world_size": 2}
STEP_LINE = re.compile(r"^\[titan\] (\S+ \S+) - root - INFO - .*step: +(\d+) ", re.M)


def ddp_config(facts: dict) -> dict:
    from tests.support.realjobs.model import HEADS, LAYERS, SEQ, WIDTH

    model = {"params": facts["matmul_params"], "layers": LAYERS, "heads": HEADS, "head_dim": WIDTH // HEADS}
    return {**model, "seq_len": SEQ, **DDP_FACTS, "peak_flops": facts["peak_flops"]}


def ledger_truth(records: list[dict], killed_at: float, end: float) -> dict[str, float]:
    """Seconds of each ledger kind, from rank 0's own records of its two runs (restart 0, killed at ``killed_at``;
    restart 1, to ``end``): start-up from the process's start to its loop (its load apart), the load, the saves,
    down from the kill to the next process's start, wasted while the second run redoes the steps the first had
    done, productive the rest of the loops."""
    runs = {r: [x for x in records if x["restart"] == r] for r in (0, 1)}
    first, second = runs[0], runs[1]
    start = {r: next(x["time"] for x in runs[r] if x["event"] == "start") for r in runs}
    train = {r: next(x["time"] for x in runs[r] if x["event"] == "train") for r in runs}
    loads = [x["end"] - x["time"] for x in second if x["event"] == "load"]
    saves = [x for x in records if x["event"] == "save" and x["time"] < (killed_at if x["restart"] == 0 else end)]
    done = max(x["step"] for x in first if x["event"] == "step")
    redone = next(x["time"] for x in second if x["event"] == "step" and x["step"] >= done)
    save_seconds = sum(min(x["end"], end) - x["time"] for x in saves)
    saves_while_redoing = sum(x["end"] - x["time"] for x in saves if x["restart"] == 1 and x["end"] <= redone)
    truth_seconds = {
        "startup": (train[0] - start[0]) + (train[1] - start[1]) - sum(loads),
        "checkpoint_load": sum(loads),
        "checkpoint_save": save_seconds,
        "down": start[1] - killed_at,
        "wasted": redone - train[1] - saves_while_redoing,
        "stalled": 0.0,
    }
    truth_seconds["productive"] = (end - start[0]) - sum(truth_seconds.values())
    return truth_seconds


def test_torchrun_kill_9_of_a_rank_restart_and_dcp_checkpoints_in_the_ledger(tmp_path, facts):
    """``kill -9`` of rank 1 after the step-170 line: torchrun's agent stops the group and starts it again, which
    loads its newest checkpoint (DCP, step 150) and redoes the steps since. The job's ledger, from its log alone,
    gives each kind within 2 % of the run's time of what rank 0 recorded with its own clock; its checkpoint saves
    and the load, timed by the job and printed, are the daemon's save and load durations."""
    out = tmp_path / "ddp"
    daemon = Daemon(
        tmp_path,
        [{"path": str(out / "train.log"), "job": "ddp-gpt2"}],
        {"ddp-gpt2": ddp_config(facts)},
    )
    daemon.start()
    job = torchrun_job(out, facts["peak_flops"], "--steps", "300", "--checkpoint-every", "50")
    try:
        wait_until(lambda: "step: 170 " in job.text(), JOB_DEADLINE, "the step-170 line", interval=0.02)
        victim = next(x["pid"] for x in truth(out, 1) if x["event"] == "start")
        killed_at = time.time()
        os.kill(victim, signal.SIGKILL)
        assert job.wait() == 0, job.text()[-3000:]
        records = truth(out, 0)
        last_step, last_line = _last_step_line(job.text())
        assert last_step == 300 and "Finished loading the checkpoint" in job.text()
        ledger = wait_until(
            lambda: (
                (led := daemon.ledger("ddp-gpt2"))
                and led["bands"]
                and led["bands"][-1]["end"] >= last_line - 0.01
                and led
            ),
            SERVED,
            "the ledger to reach the last step line",
        )
        # The checkpoint source publishes the saves the tick applied at its next sample.
        saved = sum(x["event"] == "save" for x in records)
        wait_until(
            lambda: daemon.metric("mfu_checkpoint_writes_total", training_job="ddp-gpt2") == saved,
            SERVED,
            "every save the job printed on /metrics",
        )
        writes = daemon.metric("mfu_checkpoint_writes_total", training_job="ddp-gpt2")
        saves = daemon.metric("mfu_checkpoint_write_duration_seconds_sum", training_job="ddp-gpt2")
        load = daemon.metric("mfu_checkpoint_last_load_duration_seconds", training_job="ddp-gpt2")
    finally:
        job.stop()
        daemon.stop()
    end = max(x["time"] for x in records if x["event"] == "step")
    expected = ledger_truth(records, killed_at, end)
    seen = ledger["seconds"]
    total = sum(expected.values())
    figures("ledger", **{f"{k}_ledger": seen[k] for k in seen}, **{f"{k}_truth": v for k, v in expected.items()})
    assert ledger["restarts"] == 1 and len(ledger["runs"]) == 2
    assert sum(seen.values()) == pytest.approx(total, rel=TOLERANCE), (seen, expected)
    off = {
        kind: seen[kind] - expected[kind] for kind in expected if abs(seen[kind] - expected[kind]) > TOLERANCE * total
    }
    assert not off, f"ledger {seen} against the processes' {expected} (total {total:.2f} s): off {off}"
    # Real DCP saves and the load, as the job timed them (printed to 10 ms).
    timed_saves = [x["end"] - x["time"] for x in records if x["event"] == "save"]
    assert writes == len(timed_saves)
    assert saves == pytest.approx(sum(timed_saves), abs=0.006 * len(timed_saves) + 0.001)
    (timed_load,) = [x["end"] - x["time"] for x in records if x["event"] == "load"]
    figures("dcp", saves=saves, saves_truth=sum(timed_saves), writes=writes, load=load, load_truth=timed_load)
    assert load == pytest.approx(timed_load, abs=0.006)


def _last_step_line(text: str) -> tuple[int, float]:
    """The last step line's step and its time (torchtitan's logger prefix, local time)."""
    stamp, step = STEP_LINE.findall(text)[-1]
    day, clock = stamp.split(" ")
    seconds = time.mktime(time.strptime(f"{day} {clock.split(',')[0]}", "%Y-%m-%d %H:%M:%S"))
    return int(step), seconds + int(clock.split(",")[1]) / 1000


# -- A slow input pipeline -------------------------------------------------------------------------------------------


def test_a_slow_data_loader_is_input_with_the_wait_as_evidence(tmp_path, facts):
    """The torchrun job in Megatron-LM's form, with ``--timing-log-level 2``'s timers (its ``batch-generator``
    row, the max over ranks, ms per iteration): healthy for 100 steps, then each sample's read waits. The daemon
    learns the healthy MFU (a short baseline, as a node with a fast-changing job would set), then names the cause
    ``input`` with the wait's share as evidence, near the share the ranks recorded."""
    out = tmp_path / "slow"
    daemon = Daemon(
        tmp_path,
        [{"path": str(out / "train.log"), "job": "slow-gpt2"}],
        {"slow-gpt2": ddp_config(facts)},
        {"attribution": {"baseline_interval": "1s", "baseline_min_samples": 5}, "mfu": {"window": "15s"}},
    )
    daemon.start()
    job = torchrun_job(
        out, facts["peak_flops"], "--steps", "2000", "--log-style", "megatron", "--checkpoint-every", "0",
        "--slow-loader", "0.01", "--slow-after", "100",
    )  # fmt: skip
    try:
        served = settled(
            daemon,
            "slow-gpt2",
            "the cause input",
            lambda j: (j.get("bottleneck") or {}).get("cause") == "input",
            timeout=JOB_DEADLINE,
        )
        steps = [x for x in truth(out, 0) if x["event"] == "step" and x["step"] > 100]
    finally:
        job.stop()
        daemon.stop()
    evidence = served["bottleneck"]["evidence"]
    assert evidence.startswith("waiting for its next batch "), evidence
    share = float(re.match(r"waiting for its next batch (\d+)% of wall time", evidence).group(1)) / 100
    recorded = sum(x["wait"] for x in steps) / sum(x["seconds"] for x in steps)
    figures("input", evidence=evidence, recorded_share=recorded, data_wait=json.dumps(served["data_wait"]))
    assert served["data_wait"]["source"].startswith("log"), served["data_wait"]
    assert share == pytest.approx(recorded, abs=0.1), (evidence, recorded)
