"""MFU from real training processes' own logs, under a real ``mfu-exporter run``, against the frameworks' own counts:
a Hugging Face Trainer (its console dicts) and a Lightning run (its CSVLogger's metrics.csv with a ThroughputMonitor),
tiny GPT-2 shapes on the CPU (tests/support/realjobs).

The peak both sides use, and what the daemon is told, are the harness's (tests/support/realjobs_harness.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.realjobs_harness import (
    TOLERANCE,
    Daemon,
    figures,
    hf_trainer,
    lightning_metrics,
    lightning_run,
    settled,
)

pytestmark = pytest.mark.slow


# -- MFU from the frameworks' own logs -------------------------------------------------------------------------------


def test_hf_trainer_mfu_from_its_log_is_its_own_flops_count_over_the_declared_peak(tmp_path, facts):
    """The Trainer prints a dict every ``logging_steps`` (its console callback, as in any pod); with
    ``include_num_input_tokens_seen`` each carries its global token count. Its own FLOPs are ``total_flos``
    (6 x non-embedding parameters x tokens) over ``train_runtime``: the daemon's MFU, with the same parameter count
    as the job's fact, is within 2 % of that, and of the Trainer's count between the lines the daemon's window
    holds (its first and last)."""
    out = tmp_path / "hf"
    peak = facts["peak_flops"]
    daemon = Daemon(
        tmp_path,
        [{"path": str(out / "train.log"), "job": "hf-gpt2"}],
        {"hf-gpt2": {"params": facts["non_embedding_params"], "gpus": 1, "world_size": 1, "peak_flops": peak}},
        # The window holds the whole run (about 30 s), so the daemon's figure and the Trainer's cover one span.
        {"mfu": {"window": "5m"}},
    )
    daemon.start()
    job = hf_trainer(out, steps=800, logging_steps=100)
    try:
        assert job.wait() == 0, job.text()[-3000:]
        result = json.loads((out / "trainer_result.json").read_text())
        metrics = result["metrics"]
        lines = [entry for entry in result["log_history"] if "loss" in entry]
        served = settled(
            daemon,
            "hf-gpt2",
            "the Trainer's last count to be served, with an MFU",
            lambda j: j["tokens_total"] == metrics["num_input_tokens_seen"] and j["mfu"] is not None,
        )
    finally:
        job.stop()
        daemon.stop()
    whole_run = metrics["total_flos"] / metrics["train_runtime"] / peak
    first, last = lines[0], lines[-1]
    flops_per_token = metrics["total_flos"] / metrics["num_input_tokens_seen"]
    span = (
        flops_per_token
        * (last["num_input_tokens_seen"] - first["num_input_tokens_seen"])
        / (last["train_runtime"] - first["train_runtime"])
        / peak
    )
    figures("hf", served=served["mfu"], span=span, whole_run=whole_run, lines=len(lines), peak=peak)
    assert served["flops_per_token"] == pytest.approx(flops_per_token, rel=1e-9)  # the Trainer's 6·N, exactly
    assert served["peak_flops"] == pytest.approx(peak)
    assert served["mfu"] == pytest.approx(span, rel=TOLERANCE), (served["mfu"], span, whole_run)
    assert served["mfu"] == pytest.approx(whole_run, rel=TOLERANCE), (served["mfu"], span, whole_run)


def test_lightning_mfu_from_its_csv_logger_is_its_throughput_monitor_s_flops_over_the_declared_peak(tmp_path, facts):
    """Lightning under a non-TTY prints nothing during fit: its progress is its CSVLogger's metrics.csv, which the
    daemon follows as ``format: lightning_csv``. The ThroughputMonitor counts FLOPs with Lightning's own counter
    (``measure_flops``, attention included): its FLOP/s over the span the daemon's window holds, over the declared
    peak, is the daemon's MFU within 2 %, with the job's facts (matmul parameters, layers, heads, head dim and
    sequence: our 6·N plus the attention term)."""
    from tests.support.realjobs.model import HEADS, LAYERS, SEQ, WIDTH

    out = tmp_path / "lightning"
    peak = facts["peak_flops"]
    model = {"params": facts["matmul_params"], "layers": LAYERS, "heads": HEADS, "head_dim": WIDTH // HEADS}
    daemon = Daemon(
        tmp_path,
        [{"path": str(lightning_metrics(out)), "job": "lightning-gpt2", "format": "lightning_csv"}],
        {"lightning-gpt2": {**model, "seq_len": SEQ, "gpus": 1, "peak_flops": peak}},
        {"mfu": {"window": "5m"}},
    )
    daemon.start()
    job = lightning_run(out, steps=800)
    try:
        assert job.wait() == 0, job.text()[-3000:]
        rows = list(_csv_rows(lightning_metrics(out)))
        progress = [row for row in rows if row.get("train/lengths")]
        served = settled(
            daemon,
            "lightning-gpt2",
            "the last row's tokens to be served, with an MFU",
            lambda j: j["tokens_total"] == float(progress[-1]["train/lengths"]) and j["mfu"] is not None,
        )
    finally:
        job.stop()
        daemon.stop()
    assert job.text().count("train_loss") <= 1, "Lightning printed progress during fit"  # only its final bar line
    # The monitor's FLOPs per batch: its FLOP/s over its batches/s, both over its own window (a constant per batch).
    timed = [row for row in progress if row.get("train/device/flops_per_sec")]
    per_batch = {
        round(float(row["train/device/flops_per_sec"]) / float(row["train/device/batches_per_sec"])) for row in timed
    }
    assert len(per_batch) == 1, per_batch
    flops_per_batch = per_batch.pop()
    first, last = progress[0], progress[-1]
    span = (
        flops_per_batch
        * (float(last["train/batches"]) - float(first["train/batches"]))
        / (float(last["train/time"]) - float(first["train/time"]))
        / peak
    )
    monitor_last = float(timed[-1]["train/device/flops_per_sec"]) / peak
    tokens_per_batch = float(last["train/lengths"]) / float(last["train/batches"])
    figures("lightning", served=served["mfu"], span=span, monitor_last=monitor_last, rows=len(progress), peak=peak)
    assert served["flops_per_token"] == pytest.approx(flops_per_batch / tokens_per_batch, rel=1e-6)
    assert served["mfu"] == pytest.approx(span, rel=TOLERANCE), (served["mfu"], span, monitor_last)


def _csv_rows(path: Path):
    import csv

    with open(path, newline="") as handle:
        yield from csv.DictReader(handle)
