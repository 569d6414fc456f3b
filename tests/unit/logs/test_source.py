"""The logs source end to end on real files: each framework's log gives the MFU the progress API gives for the
same numbers (within 1 %), with the framework's own MFU beside it; interleaved ranks, restarts, CRI pod logs, and a
job whose progress only one of two nodes sees."""

from __future__ import annotations

import math
import os
import threading
import time

import pytest

from mfu_exporter.config import LOG_FORMATS, ConfigError, typed_config, validate
from mfu_exporter.logs import FORMATS
from mfu_exporter.model.checkpoints import CheckpointTracker
from mfu_exporter.model.discovery_jobs import DiscoveredJob, DiscoveredPod
from mfu_exporter.model.jobs import JobTracker
from mfu_exporter.model.progress import parse_progress
from mfu_exporter.model.readings import GpuInfo
from mfu_exporter.render.jobs import job_families
from mfu_exporter.sources.logs import NO_PROGRESS, LogsSource
from tests.unit.logs import framework_lines as fl
from tests.unit.logs.fed import Fed

H100 = "NVIDIA H100 80GB HBM3"
PEAK = 989.4e12
T0 = 1_787_300_000.0
PARAMS = 7e9
SEQ, WORLD, BATCH, NODE_GPUS, STEP_SECONDS = 4096, 16, 256, 8, 5.0
NODE_TOKENS_PER_STEP = BATCH * SEQ * NODE_GPUS / WORLD  # 524,288
TPS_PER_GPU = BATCH * SEQ / WORLD / STEP_SECONDS  # torchtitan's tps: tokens/s per GPU
EXPECTED_MFU = 6 * PARAMS * NODE_TOKENS_PER_STEP / STEP_SECONDS / (NODE_GPUS * PEAK)
STEPS = [10, 20, 30, 40, 50, 60]
END = T0 + STEPS[-1] * STEP_SECONDS


def pod_job(gpus):
    """The job discovery found in pod llm-0 (namespace train), holding ``gpus``."""
    return DiscoveredJob("llm", "kubernetes", tuple(gpus), (DiscoveredPod("kubernetes", "train", "llm-0"),))


def inventory():
    return [GpuInfo(i, f"GPU-{i}", H100) for i in range(NODE_GPUS)]


class Clock:
    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now


def build(files, jobs, clock, **logs):
    config = validate({"sources": {"logs": {"files": files, **logs}}, "jobs": jobs})
    tracker = JobTracker(configured=config["jobs"], window=60.0, gpu_inventory=inventory, clock=clock)
    checkpoints = CheckpointTracker(clock=clock)
    source = LogsSource(typed_config(config).sources.logs, config["jobs"], use_inotify=False, clock=clock)
    # On this fake clock every pass is the test's own (Fed.sample, Fed.poll): the follower's thread makes none.
    source.follower.interval = 3600.0
    return Fed(source, tracker, checkpoints), tracker, checkpoints


def api_mfu(jobs: dict, tokens_at: dict[float, float], clock) -> float:
    """The same numbers through the progress API's parser and the same job model."""
    config = validate({"jobs": jobs})
    tracker = JobTracker(configured=config["jobs"], window=60.0, gpu_inventory=inventory, clock=clock)
    for at, tokens in tokens_at.items():
        tracker.report(parse_progress({"job": "llm", "tokens_total": tokens, "time": at}, clock()))
    (view,) = tracker.views()
    return view.mfu


def run_source(source, tracker, name="llm"):
    try:
        snapshot = source.sample()
    finally:
        source.close()
    views = {v.name: v for v in tracker.views()}
    return views[name], snapshot


def write(path, lines):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines))


def t(step):
    return T0 + step * STEP_SECONDS


def torchtitan_log(world_printed=True):
    fpt = 6 * PARAMS
    lines = [
        fl.titan_logger(T0, fl.titan_model_size("llama3", "7B", 7_500_000_000)),  # all parameters: jobs.llm.params wins
        fl.titan_logger(T0, fl.titan_peak(989e12)),
        fl.titan_logger(T0, fl.titan_init_v02(BATCH // WORLD, BATCH, 1, SEQ, 1000, 100)),
        fl.titan_logger(T0, "Training starts at step 1"),
    ]
    for step in STEPS:
        tflops = fpt * TPS_PER_GPU / 1e12
        lines.append(
            "[rank0]:"
            + fl.titan_logger(
                t(step), fl.titan_step(step, 2.4, 0.33, 61.2, 77.3, TPS_PER_GPU, tflops, 100 * tflops * 1e12 / 989e12)
            )
        )
        if step == 30:
            lines.append("[rank0]:" + fl.titan_logger(t(step) + 0.1, fl.titan_save_begin()))
            lines.append("[rank0]:" + fl.titan_logger(t(step) + 2.6, fl.titan_save_end(2.5)))
    return lines


@pytest.mark.parametrize("world_size", [WORLD, None], ids=["step-based", "tps-integrated"])
def test_torchtitan_log_gives_the_api_mfu_and_its_own(tmp_path, world_size):
    clock = Clock(END + 1)
    path = tmp_path / "train.log"
    write(path, torchtitan_log())
    job = {"params": PARAMS, "world_size": world_size} if world_size else {"params": PARAMS}
    source, tracker, checkpoints = build([{"path": str(tmp_path / "*.log"), "job": "llm"}], {"llm": job}, clock)
    view, snapshot = run_source(source, tracker)
    reference = api_mfu({"llm": {"params": PARAMS}}, {t(s): s * NODE_TOKENS_PER_STEP for s in STEPS}, clock)
    assert view.mfu == pytest.approx(reference, rel=0.01) and view.mfu == pytest.approx(EXPECTED_MFU, rel=0.01)
    assert view.step == 60 and view.facts["params"] == PARAMS
    assert view.framework_mfu == pytest.approx(6 * PARAMS * TPS_PER_GPU / 989e12, rel=1e-3)
    (status,) = snapshot.status["files"]
    assert status["format"] == "torchtitan" and status["unrecognised"] is None
    totals = checkpoints.totals()["llm"]
    assert totals.writes == 1 and checkpoints.overlap("llm", 60)["last_duration_seconds"] == 2.5


@pytest.mark.parametrize("hostile", ["9" * 5000, "9" * 400, str(2**60)], ids=["5000-digits", "400-digits", "2^60"])
def test_a_hostile_step_is_one_skipped_line_and_the_rest_of_the_chunk_is_read(tmp_path, hostile):
    clock = Clock(END + 1)
    lines = torchtitan_log()
    first = next(i for i, line in enumerate(lines) if "step: 10 " in line)
    lines.insert(first + 1, lines[first].replace("step: 10 ", f"step: {hostile} ", 1))
    write(tmp_path / "train.log", lines)
    source, tracker, _ = build([{"path": str(tmp_path / "*.log"), "job": "llm"}], {"llm": {"params": PARAMS}}, clock)
    view, snapshot = run_source(source, tracker)
    assert view.step == 60  # every line after the hostile one was read
    assert view.mfu == pytest.approx(EXPECTED_MFU, rel=0.01)
    assert sum(snapshot.errors.values()) >= 1 and "consumer_failed" not in snapshot.errors
    values = [s.value for family in job_families(tracker.views()) for s in family.samples]
    assert all(math.isfinite(v) for v in values)


def test_a_discovered_pods_per_gpu_log_counts_its_own_gpus_from_the_first_line(tmp_path):
    """torchtitan's tps is per GPU: a pod holding 2 of the node's 8 GPUs makes 2 × tps tokens/s. Its log is followed
    once the job model holds the job discovery found (the service's 1 s tick), not before, when the model could
    only count every GPU of the node (4× the MFU here)."""
    clock = Clock(END + 1)
    pod = tmp_path / "pods" / "train_llm-0_6f1c" / "trainer"
    stamps = [T0] * 4 + [t(step) for step in STEPS for _ in ([0, 1, 2] if step == 30 else [0])]
    write(pod / "0.log", [fl.cri(at, line) for at, line in zip(stamps, torchtitan_log(), strict=True)])
    source, tracker, _ = build([], {"llm": {"params": PARAMS}}, clock, pods_root=str(tmp_path / "pods"))
    source.pods = lambda: {"llm": [("train", "llm-0")]}
    try:
        assert source.sample().status["wanted"] == 0  # discovery's answer is not the model's yet
        tracker.set_discovered({"llm": pod_job([4, 5])})
        assert source.sample().status["wanted"] == 1
        source.poll()
    finally:
        source.close()
    view = {v.name: v for v in tracker.views()}["llm"]
    assert view.gpu_indices == [4, 5]
    assert view.tokens_per_second == pytest.approx(2 * TPS_PER_GPU, rel=0.01)
    assert view.mfu == pytest.approx(6 * PARAMS * TPS_PER_GPU / PEAK, rel=0.01)


def megatron_log(restart_at=None):
    lines = fl.megatron_args({"seq_length": SEQ, "world_size": WORLD, "global_batch_size": BATCH, "num_layers": 32})
    steps = STEPS if restart_at is None else STEPS + [restart_at + 10 * i for i in range(1, 5)]
    base = 0.0
    for i, step in enumerate(steps):
        if restart_at is not None and i == len(STEPS):
            base = t(STEPS[-1]) + 120 - t(restart_at)  # restarted from the checkpoint at restart_at, 2 min later
        at = t(step) + base
        lines.append(fl.megatron_iteration(at, step, 1000, step * BATCH, STEP_SECONDS, 412.3, 1e-4, BATCH, 2.3))
        if step == 30 and restart_at is None:
            lines.append(fl.megatron_save_begin(at + 0.1, 30, "/ckpt"))
            lines.append(fl.megatron_save_end(at + 8.7, 30, "/ckpt"))
    return lines


def test_megatron_log_gives_the_api_mfu_and_its_tflops_over_our_peak(tmp_path):
    clock = Clock(END + 1)
    write(tmp_path / "megatron.log", megatron_log())
    source, tracker, checkpoints = build(
        [{"path": str(tmp_path / "megatron.log"), "job": "llm", "format": "megatron"}],
        {"llm": {"params": PARAMS}},
        clock,
    )
    view, _ = run_source(source, tracker)
    reference = api_mfu({"llm": {"params": PARAMS}}, {t(s): s * NODE_TOKENS_PER_STEP for s in STEPS}, clock)
    assert view.mfu == pytest.approx(reference, rel=0.01) and view.mfu == pytest.approx(EXPECTED_MFU, rel=0.01)
    assert view.framework_mfu == pytest.approx(412.3e12 / PEAK)
    assert view.facts["seq_len"] == SEQ and view.facts["layers"] == 32  # from the argument dump
    assert checkpoints.overlap("llm", 60)["last_duration_seconds"] == pytest.approx(8.6, abs=1e-3)


def test_megatron_restart_from_a_checkpoint_is_a_new_window(tmp_path):
    clock = Clock(t(STEPS[-1]) + 120 + 40 * STEP_SECONDS + 1)
    write(tmp_path / "megatron.log", megatron_log(restart_at=30))
    source, tracker, _ = build(
        [{"path": str(tmp_path / "megatron.log"), "job": "llm"}], {"llm": {"params": PARAMS}}, clock
    )
    view, _ = run_source(source, tracker)
    assert view.restarts == 1 and view.step == 70
    assert view.replayed_tokens == pytest.approx((60 - 40) * NODE_TOKENS_PER_STEP)  # first line after: step 40
    assert view.mfu == pytest.approx(EXPECTED_MFU, rel=0.01)  # the 2-minute gap is not in the rate


def hf_cri_lines():
    lines = []
    for step in STEPS:
        lines.append(
            fl.cri(
                t(step) - 0.01, fl.tqdm_bar(step - 1, 1000) + "\r" + fl.tqdm_bar(step, 1000), stream="stderr", tag="P"
            )
        )
        lines.append(fl.cri(t(step) - 0.005, "", stream="stderr", tag="F"))
        record = fl.hf_log(
            {
                "loss": 2.15,
                "grad_norm": 0.87,
                "learning_rate": 4.8e-05,
                "epoch": step / 1000,
                "num_input_tokens_seen": step * BATCH * SEQ,
            }
        )
        # a long record split by containerd into P segments
        lines.append(fl.cri(t(step), record[:20], tag="P"))
        lines.append(fl.cri(t(step), record[20:], tag="F"))
    return lines


def test_hf_pod_cri_log_gives_the_api_mfu_with_the_bar_step(tmp_path):
    clock = Clock(END + 1)
    log = tmp_path / "pods" / "train_llm-0_6f1c" / "trainer" / "0.log"
    write(log, hf_cri_lines())
    source, tracker, _ = build(
        [], {"llm": {"params": PARAMS, "world_size": WORLD}}, clock, pods_root=str(tmp_path / "pods")
    )
    source.pods = lambda: {"llm": [("train", "llm-0")]}
    tracker.set_discovered({"llm": pod_job(range(NODE_GPUS))})  # what the service's 1 s tick hands the model
    view, snapshot = run_source(source, tracker)
    reference = api_mfu({"llm": {"params": PARAMS}}, {t(s): s * NODE_TOKENS_PER_STEP for s in STEPS}, clock)
    assert view.mfu == pytest.approx(reference, rel=0.01)
    assert view.step == 60 and view.framework_mfu is None  # HF prints no MFU
    assert snapshot.status["files"][0]["container"] == "cri" and snapshot.status["files"][0]["format"] == "hf"


def test_nemo_cri_log_gives_the_api_mfu(tmp_path):
    clock = Clock(END + 1)
    lines = []
    for step in STEPS:
        metrics = {
            "lr": 5.988e-06,
            "global_batch_size": float(BATCH),
            "global_step": float(step),
            "reduced_train_loss": 10.1,
            "train_step_timing in s": STEP_SECONDS,
            "consumed_samples": float((step + 1) * BATCH),
            "TFLOPS_per_GPU": 401.7,
        }
        lines.append(fl.cri(t(step), " 0: " + fl.nemo_step(0, step + 1, 1000, metrics)))
    lines.append(fl.cri(END, fl.nemo_logger(END, "pl", 219, fl.nemo_save(0, 60, END - 9.876, 9.876))))
    write(tmp_path / "nemo.log", lines)
    source, tracker, checkpoints = build(
        [{"path": str(tmp_path / "nemo.log"), "job": "llm"}],
        {"llm": {"params": PARAMS, "world_size": WORLD, "seq_len": SEQ}},
        clock,
    )
    view, _ = run_source(source, tracker)
    reference = api_mfu({"llm": {"params": PARAMS}}, {t(s): s * NODE_TOKENS_PER_STEP for s in STEPS}, clock)
    assert view.mfu == pytest.approx(reference, rel=0.01)
    assert view.framework_mfu == pytest.approx(401.7e12 / PEAK)
    assert checkpoints.overlap("llm", 60)["last_duration_seconds"] == pytest.approx(9.876)


def test_deepspeed_log_gives_the_api_mfu_and_ends_a_save_at_the_next_step(tmp_path):
    clock = Clock(END + 1)
    lines = []
    for step in STEPS:
        lines.append(
            fl.ds_logger(
                t(step),
                "timer.py",
                215,
                "stop",
                fl.ds_throughput(0, step, step, 51.0, BATCH / STEP_SECONDS, 59.6, 63.3),
            )
        )
        if step == 30:
            lines.append(fl.ds_logger(t(step) + 0.2, "logging.py", 96, "log_dist", fl.ds_save("global_step30")))
    write(tmp_path / "ds.log", lines)
    source, tracker, checkpoints = build(
        [{"path": str(tmp_path / "ds.log"), "job": "llm", "format": "deepspeed"}],
        {"llm": {"params": PARAMS, "world_size": WORLD, "seq_len": SEQ, "global_batch": BATCH}},
        clock,
    )
    view, _ = run_source(source, tracker)
    reference = api_mfu({"llm": {"params": PARAMS}}, {t(s): s * NODE_TOKENS_PER_STEP for s in STEPS}, clock)
    assert view.mfu == pytest.approx(reference, rel=0.01) and view.step == 60
    assert checkpoints.overlap("llm", 60)["last_checkpoint"] == "step-30"
    assert checkpoints.overlap("llm", 60)["last_duration_seconds"] == pytest.approx(t(40) - t(30) - 0.2)


def test_regex_format(tmp_path):
    clock = Clock(END + 1)
    write(tmp_path / "custom.log", [f"{t(s):.3f} it={s} seen={s * BATCH * SEQ}" for s in STEPS])
    files = [
        {
            "path": str(tmp_path / "custom.log"),
            "job": "llm",
            "format": "regex",
            "pattern": r"^(?P<time>[\d.]+) it=(?P<step>\d+) seen=(?P<tokens_seen>\d+)",
        }
    ]
    source, tracker, _ = build(files, {"llm": {"params": PARAMS, "world_size": WORLD}}, clock)
    view, _ = run_source(source, tracker)
    assert view.mfu == pytest.approx(EXPECTED_MFU, rel=0.01)


def test_interleaved_ranks_count_one_ranks_progress_once(tmp_path):
    clock = Clock(END + 1)
    lines = []
    for step in STEPS:
        for rank in (3, 0, 5, 1, 7, 2, 6, 4):  # every rank prints, in no fixed order
            lines.append(
                f"[rank{rank}]:"
                + fl.titan_logger(
                    t(step) + rank * 0.001, fl.titan_step(step, 2.4, 0.3, 61.2, 77.3, TPS_PER_GPU, 1.0, 10.0)
                )
            )
    write(tmp_path / "all-ranks.log", lines)
    source, tracker, _ = build(
        [{"path": str(tmp_path / "all-ranks.log"), "job": "llm"}], {"llm": {"params": PARAMS}}, clock
    )
    view, snapshot = run_source(source, tracker)
    assert view.tokens_total == pytest.approx((STEPS[-1] - STEPS[0]) * NODE_TOKENS_PER_STEP, rel=1e-3)
    assert view.mfu == pytest.approx(EXPECTED_MFU, rel=0.01)
    assert snapshot.errors["other_writer_progress"] == 7 * len(STEPS)


def test_torchtitan_integrated_total_goes_back_on_a_restart(tmp_path):
    clock = Clock(t(100) + 1)
    lines = [
        fl.titan_logger(t(s), fl.titan_step(s, 2.0, 0.3, 1.0, 1.0, TPS_PER_GPU, 1.0, 1.0, color=False))
        for s in (10, 20, 30, 40)
    ]
    lines += [
        fl.titan_logger(t(s + 40), fl.titan_step(s, 2.0, 0.3, 1.0, 1.0, TPS_PER_GPU, 1.0, 1.0, color=False))
        for s in (30, 40, 50, 60)
    ]
    write(tmp_path / "t.log", lines)
    source, tracker, _ = build([{"path": str(tmp_path / "t.log"), "job": "llm"}], {"llm": {"params": PARAMS}}, clock)
    view, _ = run_source(source, tracker)
    assert view.restarts == 1
    assert view.mfu == pytest.approx(EXPECTED_MFU, rel=0.01)


def test_a_writer_thread_with_buffering_feeds_the_job_live(tmp_path):
    """The follower's own thread and inotify, a writer flushing mid-line, the job model on the real clock."""
    path = tmp_path / "live.log"
    path.write_text("")
    config = validate(
        {"sources": {"logs": {"files": [{"path": str(path), "job": "llm"}]}}, "jobs": {"llm": {"params": PARAMS}}}
    )
    tracker = JobTracker(configured=config["jobs"], window=60.0, gpu_inventory=inventory)
    source = Fed(LogsSource(typed_config(config).sources.logs, config["jobs"]), tracker)
    source.sample()
    start = time.time()

    def writer():
        with open(path, "a", buffering=1 << 16) as out:
            for i, step in enumerate(range(10, 70, 10)):
                line = (
                    fl.titan_logger(start + i * 0.1, fl.titan_step(step, 2.0, 0.3, 1.0, 1.0, TPS_PER_GPU, 1.0, 1.0))
                    + "\n"
                )
                out.write(line[:25])
                out.flush()
                time.sleep(0.02)
                out.write(line[25:])
                out.flush()
                time.sleep(0.08)

    thread = threading.Thread(target=writer)
    thread.start()
    thread.join()
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and (tracker.views()[0].step != 60):
            time.sleep(0.05)
            source.sample()  # the service's tick, applying what the follower's thread read
        (view,) = tracker.views()
        assert view.step == 60
        assert view.tokens_total == pytest.approx(TPS_PER_GPU * NODE_GPUS * 0.5, rel=0.01)
    finally:
        source.close()


def test_an_unrecognised_log_is_reported_once_with_the_reason(tmp_path, caplog):
    clock = Clock(T0)
    write(tmp_path / "odd.log", [f"epoch {i}: ok" for i in range(6000)])
    source, tracker, _ = build([{"path": str(tmp_path / "odd.log"), "job": "llm"}], {}, clock)
    with caplog.at_level("WARNING"):
        view, snapshot = run_source(source, tracker)
    assert "no line of a known format" in snapshot.status["files"][0]["unrecognised"]
    assert sum("no line of a known format" in r.getMessage() for r in caplog.records) == 1
    assert view.mfu is None and view.reason == NO_PROGRESS


def test_two_nodes_only_one_sees_progress_cluster_mfu_and_attribution_stay_right(tmp_path):
    """Megatron: the iteration line on the last rank (node B), the argument dump and checkpoints on rank 0 (node A)."""
    clock = Clock(END + 1)
    rank0 = fl.megatron_args({"seq_length": SEQ, "world_size": WORLD}) + [
        fl.megatron_save_begin(t(30), 30, "/ckpt"),
        fl.megatron_save_end(t(30) + 4, 30, "/ckpt"),
    ]
    last = [fl.megatron_iteration(t(s), s, 1000, s * BATCH, STEP_SECONDS, 412.3, 1e-4, BATCH, 2.3) for s in STEPS]
    write(tmp_path / "a" / "train.log", rank0)
    write(tmp_path / "b" / "train.log", last)
    jobs = {"llm": {"params": PARAMS, "world_size": WORLD, "seq_len": SEQ}}  # what node B's log cannot say
    node_a = build([{"path": str(tmp_path / "a" / "train.log"), "job": "llm"}], jobs, clock)
    node_b = build([{"path": str(tmp_path / "b" / "train.log"), "job": "llm"}], jobs, clock)
    view_a, _ = run_source(node_a[0], node_a[1])
    view_b, _ = run_source(node_b[0], node_b[1])

    def series(view):
        return {f.name: f.samples[0].value for f in job_families([view]) if f.samples}

    a, b = series(view_a), series(view_b)
    # Node A knows the job (its GPUs join its node signals in the cluster attribution) but measures no progress.
    assert a["mfu_job_gpus"] == NODE_GPUS and a["mfu_job_peak_flops"] == NODE_GPUS * PEAK
    assert "mfu_job_model_flops" not in a and "mfu_job_tokens" not in a and view_a.reason == NO_PROGRESS
    assert node_a[2].overlap("llm", 60)["last_checkpoint"] == "step-30"  # checkpoints where rank 0 prints them
    # The cluster rule sums FLOPs rate and peak over nodes exporting both halves: node B alone, the job's MFU.
    flops_rate = view_b.flops_per_token * view_b.tokens_per_second
    both = [s for s in (a, b) if "mfu_job_model_flops" in s and "mfu_job_peak_flops" in s]
    cluster = flops_rate / sum(s["mfu_job_peak_flops"] for s in both)
    assert cluster == pytest.approx(EXPECTED_MFU, rel=0.01) and view_b.mfu == pytest.approx(EXPECTED_MFU, rel=0.01)
    # Node B's tokens are its share: 8 of the job's 16 GPUs.
    assert view_b.tokens_per_second == pytest.approx(BATCH * SEQ / STEP_SECONDS * NODE_GPUS / WORLD, rel=0.01)


def test_config_of_sources_logs():
    config = validate({"sources": {"logs": {"files": [{"path": "/x/*.log", "job": "llm"}]}}})
    assert config["sources"]["logs"]["files"][0]["format"] == "auto"
    with pytest.raises(ConfigError, match=r"sources.logs.files\[0\].pattern"):
        validate({"sources": {"logs": {"files": [{"path": "/x", "job": "j", "format": "regex"}]}}})
    with pytest.raises(ConfigError, match=r"sources.logs.files\[0\].pattern.*group names"):
        validate(
            {"sources": {"logs": {"files": [{"path": "/x", "job": "j", "format": "regex", "pattern": "(?P<bogus>x)"}]}}}
        )
    with pytest.raises(ConfigError, match=r"sources.logs.files\[0\].colour.*unknown key"):
        validate({"sources": {"logs": {"files": [{"path": "/x", "job": "j", "colour": 1}]}}})
    with pytest.raises(ConfigError, match=r"sources.logs.files\[0\].format"):
        validate({"sources": {"logs": {"files": [{"path": "/x", "job": "j", "format": "fairseq"}]}}})
    assert LOG_FORMATS == FORMATS


def test_rotation_mid_run_loses_and_repeats_nothing(tmp_path):
    clock = Clock(END + 1)
    lines = megatron_log()
    path = tmp_path / "train.log"
    write(path, lines[:8])
    source, tracker, _ = build([{"path": str(path), "job": "llm"}], {"llm": {"params": PARAMS}}, clock)
    source.sample()
    os.rename(path, tmp_path / "train.log.1")
    write(path, lines[8:])
    source.poll()
    source.close()
    (view,) = tracker.views()
    assert view.step == 60 and view.restarts == 0 and view.mfu == pytest.approx(EXPECTED_MFU, rel=0.01)


def test_exporter_restart_resumes_from_the_head_and_a_bounded_tail(tmp_path):
    """A long Megatron log at exporter start: the argument dump from its head, the latest lines from its tail."""
    clock = Clock(t(1000) + 1)
    path = tmp_path / "train.log"
    with open(path, "w") as out:
        out.write("".join(line + "\n" for line in fl.megatron_args({"seq_length": SEQ, "world_size": WORLD})))
        for step in range(10, 1001, 10):
            out.write(
                fl.megatron_iteration(t(step), step, 10**6, step * BATCH, STEP_SECONDS, 412.3, 1e-4, BATCH, 2.3) + "\n"
            )
            out.write(("NCCL INFO noise " * 20 + "\n") * 60)  # ~19 KiB between iteration lines: 1.9 MB in all
    assert path.stat().st_size > (1 << 20) + (256 << 10)
    source, tracker, _ = build([{"path": str(path), "job": "llm"}], {"llm": {"params": PARAMS}}, clock)
    view, snapshot = run_source(source, tracker)
    assert view.facts["seq_len"] == SEQ and view.step == 1000  # facts from the head, progress from the tail
    assert view.tokens_total == pytest.approx(1000 * NODE_TOKENS_PER_STEP)
    assert view.mfu == pytest.approx(EXPECTED_MFU, rel=0.01)
    assert snapshot.status["files"][0]["lines"] < 20000  # the middle of the file was never read


def test_a_restarted_container_writes_1_log_and_its_progress_takes_over(tmp_path):
    clock = Clock(t(100) + 1)
    pod = tmp_path / "pods" / "train_llm-0_6f1c" / "trainer"
    first = [
        fl.cri(t(s), fl.megatron_iteration(t(s), s, 1000, s * BATCH, STEP_SECONDS, None, 1e-4, BATCH, 2.3))
        for s in (10, 20, 30)
    ]
    # The container died after step 30 and came back 2 minutes later from the checkpoint at step 10: kubelet's 1.log.
    resumed = [
        fl.cri(t(s) + 120, fl.megatron_iteration(t(s) + 120, s, 1000, s * BATCH, STEP_SECONDS, None, 1e-4, BATCH, 2.3))
        for s in (20, 30, 40, 50, 60)
    ]
    write(pod / "0.log", first)
    jobs = {"llm": {"params": PARAMS, "world_size": WORLD, "seq_len": SEQ}}
    source, tracker, _ = build([], jobs, clock, pods_root=str(tmp_path / "pods"))
    source.pods = lambda: {"llm": [("train", "llm-0")]}
    tracker.set_discovered({"llm": pod_job(range(NODE_GPUS))})  # what the service's 1 s tick hands the model
    try:
        source.sample()
        write(pod / "1.log", resumed)
        source.sample()  # the next pass finds 1.log
        source.poll()
    finally:
        source.close()
    (view,) = tracker.views()
    assert view.step == 60 and view.restarts == 1  # 1.log's writer took over, and its step 20 is a new window
    assert view.mfu == pytest.approx(EXPECTED_MFU, rel=0.01)


def test_a_detected_format_that_reads_nothing_is_visible_within_a_minute_with_the_line(tmp_path, caplog):
    """TRL's GRPO dicts (huggingface/trl#3452, real): HF detected, no step and no token count in any line. The job's
    reason, the file's status and a counted error say so, with the line, as soon as the follower reads the lines."""
    from tests.unit.logs.real_pastes import load

    lines = next(p for p in load() if p.name == "hf/trl-3452-grpo-nothing-useful").lines
    path = tmp_path / "train.log"
    write(path, [])
    config = validate({"sources": {"logs": {"files": [{"path": str(path), "job": "llm"}], "interval": 1.0}}})
    tracker = JobTracker(configured=config["jobs"], window=60.0, gpu_inventory=inventory)
    source = Fed(LogsSource(typed_config(config).sources.logs, config["jobs"], use_inotify=False), tracker)
    try:
        source.sample()  # starts following the empty file
        started = time.monotonic()
        with path.open("a") as f:
            f.write("".join(line + "\n" for line in lines))
        reason = None
        while time.monotonic() - started < 60:
            source.sample()  # the service's tick, applying what the follower's thread read
            views = {v.name: v for v in tracker.views()}
            reason = views["llm"].reason if "llm" in views else None
            if reason and "no progress read" in reason:
                break
            time.sleep(0.2)
        visible_after = time.monotonic() - started
        snapshot = source.sample()
    finally:
        source.close()
    assert reason is not None and "detected hf" in reason and "no progress read" in reason, reason
    assert "first unread line \"{'loss': 0.0, 'grad_norm': 0.08656957000494003" in reason
    assert "include_num_input_tokens_seen" in reason
    assert visible_after < 60
    (status,) = snapshot.status["files"]
    assert status["no_progress"] and status["formats"] == ["hf"] and status["progress_lines"] == 0
    assert source.errors["no_progress_read"] == 1
    assert views["llm"].mfu is None


def test_samples_before_the_tick_create_the_job_once_and_keep_the_reason_a_later_line_gave(tmp_path):
    """The logs source samples every second and the service applies its feeds at the tick, several samples later:
    the job is created once (one Seen), so the reason the unread lines gave is the job's when the tick applies them."""
    from mfu_exporter.model.feed import Seen, apply_feed
    from mfu_exporter.sources.base import ModelReads
    from tests.unit.logs.real_pastes import load

    lines = next(p for p in load() if p.name == "hf/trl-3452-grpo-nothing-useful").lines
    path = tmp_path / "train.log"
    write(path, [])
    config = validate({"sources": {"logs": {"files": [{"path": str(path), "job": "llm"}]}}})
    tracker = JobTracker(configured=config["jobs"], window=60.0, gpu_inventory=inventory)
    source = LogsSource(typed_config(config).sources.logs, config["jobs"], use_inotify=False)
    source.bind(ModelReads(gpu_count=tracker.gpu_count, is_discovered=tracker.is_discovered, job_names=tracker.names))
    feeds = []
    try:
        feeds.append(source.sample())  # starts following the empty file
        with path.open("a") as f:
            f.write("".join(line + "\n" for line in lines))
        source.follower.poll()
        feeds.extend(source.sample() for _ in range(4))  # the samples between two ticks
    finally:
        source.close()
    seen = [item for snapshot in feeds for item in snapshot.feed if isinstance(item, Seen)]
    assert [item.reason for item in seen][0] == NO_PROGRESS
    assert len([item for item in seen if item.reason == NO_PROGRESS]) == 1, seen
    for snapshot in feeds:  # the tick: every sample's feed, in the order sampled
        apply_feed(snapshot.feed, tracker, None)
    (view,) = tracker.views()
    assert view.reason is not None and "no progress read" in view.reason, view.reason


def test_megatron_timers_give_the_jobs_data_wait_in_gpu_seconds_and_its_share(tmp_path):
    """--timing-log-level 2: batch-generator's per-iteration max after each iteration line (1.25 s of each 5 s
    step): the job's data wait is one rank's wait x its 8 GPUs here, a quarter of wall time."""
    lines = []
    for line in megatron_log():
        lines.append(line)
        if " iteration " in line:
            lines.append("(min, max) time across ranks (ms):")
            lines.append("    " + "batch-generator ".ljust(48, ".") + ": (400.00, 1250.00)")
    clock = Clock(END + 1)
    write(tmp_path / "megatron.log", lines)
    source, tracker, _ = build(
        [{"path": str(tmp_path / "megatron.log"), "job": "llm", "format": "megatron"}],
        {"llm": {"params": PARAMS}},
        clock,
    )
    view, _ = run_source(source, tracker)
    waited = 1.25 * (STEPS[-1] - STEPS[0])  # counted from the second timer line on
    assert view.data_wait.rank_seconds == pytest.approx(waited)
    assert view.data_wait.gpu_seconds == pytest.approx(waited * NODE_GPUS)
    assert view.data_wait.ratio == pytest.approx(0.25)
    assert view.data_wait.source == "log:megatron"


def test_a_line_dated_ahead_of_the_clock_is_read_as_of_when_it_was_read(tmp_path):
    """A line an hour ahead (a wrong clock, a time zone the line does not name) must not hold the job's counts in
    the future: read as of when it was read, the honest lines after it keep the MFU."""
    path = tmp_path / "train.log"
    lines = torchtitan_log()
    ahead = next(i for i, line in enumerate(lines) if "step: 40" in line)
    lines[ahead] = lines[ahead].replace(
        time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t(40))),
        time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t(40) + 3600)),
    )
    assert lines[ahead] != torchtitan_log()[ahead]
    clock = Clock(t(40) + 0.5)
    write(path, lines[: ahead + 1])
    source, tracker, _ = build([{"path": str(tmp_path / "*.log"), "job": "llm"}], {"llm": {"params": PARAMS}}, clock)
    try:
        first = source.sample()
        with open(path, "a") as out:
            out.write("".join(line + "\n" for line in lines[ahead + 1 :]))
        clock.now = END + 1
        source.poll()
        second = source.sample()
    finally:
        source.close()
    (view,) = tracker.views()
    assert view.step == 60 and view.mfu == pytest.approx(EXPECTED_MFU, rel=0.02)
    assert (first.errors + second.errors)["line_time_ahead"] == 1


def test_each_sample_says_how_far_the_jobs_logs_were_read_so_the_wait_for_the_next_is_no_stall(tmp_path):
    """A sample's feed ends with how far the follower had read each job's log (its last whole pass): the job model
    counts the job's silence up to then, not up to a read between two samples; a sample that read further without a
    new line shows the stall."""
    from mfu_exporter.model.feed import Heard

    clock = Clock(END + 1)
    write(tmp_path / "train.log", torchtitan_log())
    source, tracker, _ = build([{"path": str(tmp_path / "*.log"), "job": "llm"}], {"llm": {"params": PARAMS}}, clock)
    try:
        feed = source.sample().feed
        assert feed[-1] == Heard(("llm",), END + 1, source.interval + source.follower.interval)
        # The tick takes the feed between samples too: the next word comes within a pass of the follower.
        assert source.take_feed() == (Heard(("llm",), END + 1, source.follower.interval),)
        (view,) = tracker.views()
        overdue = view.stall_after_seconds  # three of its 50 s intervals
        clock.now = END + 1 + overdue + 10  # no sample since the lines were read: silent for 0 s as far as is known
        (view,) = tracker.views()
        assert view.tokens_per_second == pytest.approx(NODE_TOKENS_PER_STEP / STEP_SECONDS, rel=1e-3)
        source.sample()  # a pass that reads nothing new
        (view,) = tracker.views()
        assert view.tokens_per_second == 0.0 and view.silence_seconds == pytest.approx(overdue + 10)
    finally:
        source.close()
