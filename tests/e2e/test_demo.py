"""The demo drives the real sources: every family of the golden exposition appears (tests/support/golden.py),
steady MFU is ~45%, each incident moves its signals."""

import asyncio

import pytest

from mfu_exporter.sim import node as demo
from tests.support.demo_harness import get, get_json, metric_samples, running_demo
from tests.support.golden import GOLDEN, names_by_source, render_full_node, sample_names
from tests.support.prom_harness import documented_metrics
from tests.support.wait import wait_until

JOB = (("training_job", "llama3-70b"),)


@pytest.fixture(scope="module")
def full_node_families(tmp_path_factory):
    """The sample names of the golden exposition (the full node of bench/fixture.py), and which source renders
    which of them, from the same node rendered live."""
    _, service = asyncio.run(render_full_node(tmp_path_factory.mktemp("full-node")))
    return sample_names(GOLDEN.read_text()), names_by_source(service)


def cause(base):
    values = metric_samples(base)
    return next(
        (
            dict(labels)["cause"]
            for (name, labels), value in values.items()
            if name == "mfu_job_bottleneck" and value == 1 and dict(labels)["training_job"] == "llama3-70b"
        ),
        None,
    )


def mfu(base):
    return metric_samples(base).get(("mfu_model_flops_utilization_ratio", JOB))


def test_steady_rate_is_chosen_from_the_formula():
    per_token = 6 * 70.6e9 + 12 * 80 * 64 * 128 * 8192
    assert demo.healthy_tokens_per_second() * per_token / (4 * 989.4e12) == pytest.approx(0.45)  # on GPUs 0–3


def test_healthy_node_has_every_family_and_steady_mfu(full_node_families):
    golden, by_source = full_node_families
    with running_demo(speed=20) as base:
        # the first checkpoint (at 20 s) is written in ~40 s of demo time: wait for it to finish
        wait_until(lambda: metric_samples(base).get(("mfu_checkpoint_writes_total", JOB), 0) >= 1, 30, "a checkpoint")
        values = metric_samples(base)
        names = {name for name, _ in values}
        # Every family a full node exports, but those of sources the demo does not run.
        running = {source["source"] for source in get_json(base + "api/v1/status")["sources"]}
        not_run = set().union(*(found for source, found in by_source.items() if source not in running))
        missing = sorted(golden - not_run - names)
        assert not missing, missing
        undocumented = sorted(names - set(documented_metrics()))
        assert not undocumented, f"the demo exports families docs/metrics.md lacks: {undocumented}"
        assert 0.40 <= mfu(base) <= 0.50
        assert values[("mfu_gpu_utilization_ratio", (("gpu", "0"),))] == pytest.approx(0.95)
        assert values[("mfu_gpu_tensor_active_ratio", (("gpu", "0"),))] == pytest.approx(0.60)
        assert 30 <= values[("mfu_checkpoint_last_duration_seconds", JOB)] <= 45
        assert all(
            values[("mfu_exporter_source_up", (("source", s),))] == 1
            for s in ("gpu", "rdma", "ethtool", "checkpoint", "preflight")
        )
        assert cause(base) == "none"
        failing = [
            labels for (name, labels), value in values.items() if name == "mfu_preflight_check_ok" and value == 0
        ]
        assert not failing, failing  # the simulated node is set up as the guide wants


def test_a_second_job_found_by_discovery_with_its_hardware_figure():
    with running_demo(speed=20) as base:
        # The GPUs a pod holds are known by UUID: their indices wait on the GPU source's first sample.
        wait_until(
            lambda: (
                {j["job"]: j["gpu_indices"] is not None for j in get_json(base + "api/v1/jobs")["jobs"]}
                == {"llama3-70b": True, "bert-pretrain": True}
            ),
            30,
            "the discovered job, with its GPUs",
        )
        jobs = {j["job"]: j for j in get_json(base + "api/v1/jobs")["jobs"]}
        assert jobs["bert-pretrain"]["found_by"] == ["kubernetes"]
        assert jobs["bert-pretrain"]["gpu_indices"] == [4, 5, 6, 7]
        assert jobs["llama3-70b"]["found_by"] == ["reported", "config", "kubernetes"]  # one job, not two
        assert jobs["llama3-70b"]["gpu_indices"] == [0, 1, 2, 3]
        bert = (("training_job", "bert-pretrain"),)
        wait_until(lambda: ("mfu_job_hardware_flops_utilization_ratio", bert) in metric_samples(base), 30, "its figure")
        values = metric_samples(base)
        assert values[("mfu_job_tensor_active_ratio", bert)] == pytest.approx(demo.DISCOVERED_TENSOR_ACTIVE / 100)
        assert values[("mfu_exporter_source_up", (("source", "discovery"),))] == 1
        assert ("mfu_model_flops_utilization_ratio", bert) not in values  # it reports nothing: no formula MFU
        wait_until(
            lambda: get_json(base + "api/v1/jobs")["jobs"][1]["bottleneck"] is not None, 30, "its cause, from hardware"
        )


def pause_frames(values, interface):
    return values.get(
        ("mfu_nic_pfc_pause_frames_total", (("direction", "rx"), ("interface", interface), ("priority", "3"))), 0
    )


def test_pfc_storm_pauses_two_nics_and_drops_mfu_below_25_percent():
    with running_demo("--incident", "pfc-storm", speed=20) as base:
        wait_until(lambda: (mfu(base) or 1) < 0.25, 30, "MFU below 25%")
        before = metric_samples(base)
        wait_until(
            lambda: pause_frames(metric_samples(base), "ens3np0") > pause_frames(before, "ens3np0"),
            10,
            "pause frames to climb",
        )
        after = metric_samples(base)
        assert pause_frames(after, "ens6np0") > 0 and pause_frames(after, "ens1np0") == 0
        # CNPs come from the RDMA source, sampled apart from ethtool's pause frames: wait on the counter itself.
        cnp = ("mfu_rdma_hw_counters_total", (("counter", "np_cnp_sent"), ("device", "mlx5_2"), ("port", "1")))
        wait_until(lambda: metric_samples(base)[cnp] > before[cnp], 10, "the storm's NIC to send CNPs")
        status = get_json(base + "api/v1/status")
        nics = {
            n["interface"]: n for s in status["sources"] if s["source"] == "ethtool" for n in s["status"]["interfaces"]
        }
        assert nics["ens3np0"]["pause_ratio"]["rx/3"] > 0.3
        wait_until(lambda: cause(base) == "network", 10, "the loss attributed to the network")
        (job,) = [j for j in get_json(base + "api/v1/jobs")["jobs"] if j["job"] == "llama3-70b"]
        assert "ens3np0" in job["bottleneck"]["evidence"] or "ens6np0" in job["bottleneck"]["evidence"]


def test_thermal_throttles_gpu_1_and_slows_the_job():
    with running_demo("--incident", "thermal", speed=20) as base:
        # One GPU held down by heat (the node summary; the per-GPU reasons are at series: full), and it is GPU 1.
        throttled = ("mfu_node_gpus_throttled", (("cause", "thermal"),))
        wait_until(lambda: metric_samples(base).get(throttled) == 1, 30, "one GPU throttled for heat")
        wait_until(lambda: 0.25 <= (mfu(base) or 0) <= 0.35, 30, "MFU near 30%")
        values = metric_samples(base)
        assert values[("mfu_gpu_sm_clock_hertz", (("gpu", "1"),))] < values[("mfu_gpu_sm_clock_hertz", (("gpu", "0"),))]
        (source,) = [s for s in get_json(base + "api/v1/status")["sources"] if s["source"] == "gpu"]
        gpus = {gpu["index"]: gpu for gpu in source["status"]["gpus"]}
        assert "hw_thermal_slowdown" in gpus[1]["throttle"] and "hw_thermal_slowdown" not in gpus[0]["throttle"]
        wait_until(lambda: cause(base) == "thermal", 10, "the loss attributed to heat")


def test_gpu_lost_marks_gpu_3_down_and_progress_stops():
    with running_demo("--incident", "gpu-lost", speed=20) as base:
        wait_until(lambda: metric_samples(base).get(("mfu_gpu_up", (("gpu", "3"),))) == 0, 30, "GPU 3 lost")
        wait_until(lambda: metric_samples(base).get(("mfu_job_tokens_per_second", JOB)) == 0, 30, "progress to stop")
        values = metric_samples(base)
        assert values[("mfu_gpu_up", (("gpu", "2"),))] == 1
        assert ("mfu_gpu_utilization_ratio", (("gpu", "3"),)) not in values
        assert values[("mfu_exporter_source_errors_total", (("reason", "gpu_lost"), ("source", "gpu")))] >= 1
        wait_until(lambda: cause(base) == "gpu_lost", 10, "the loss attributed to the lost GPU")
        # Fallen off the bus: the state and the action NVIDIA's catalogue gives Xid 79.
        assert health(base, 3)["state"] == "reboot_required" and health(base, 2)["state"] == "healthy"
        assert health(base, 3)["last_xid"]["code"] == 79 and "reboot" in health(base, 3)["action"]
        assert metric_samples(base)[("mfu_gpu_health", (("gpu", "3"), ("state", "reboot_required")))] == 1


def health(base, index):
    """GPU ``index``'s health in /api/v1/status ({} until the GPU source's first sample)."""
    (source,) = [s for s in get_json(base + "api/v1/status")["sources"] if s["source"] == "gpu"]
    return next((gpu["health"] for gpu in source["status"].get("gpus", []) if gpu["index"] == index), {})


def test_uncorrectable_ecc_needs_gpu_0_reset_and_stalls_the_job():
    with running_demo("--incident", "uncorrectable-ecc", speed=20) as base:
        wait_until(lambda: health(base, demo.ECC_GPU).get("state") == "reset_required", 30, "GPU 0 to need a reset")
        row = next(r for r in get_json(base + "api/v1/demo")["incident_table"] if r["name"] == "uncorrectable-ecc")
        assert row["gpu_health"] == {"gpu": demo.ECC_GPU, "xids": [95, 154], "state": "reset_required"}
        gpu0 = health(base, demo.ECC_GPU)
        assert gpu0["reason"] == "Xid 95 ROBUST_CHANNEL_UNCONTAINED_ERROR" and "nvidia-smi -r" in gpu0["action"]
        assert gpu0["last_xid"]["code"] == 154  # the driver's recovery action changed (to GPU_RESET) after it
        values = metric_samples(base)
        assert values[("mfu_gpu_health", (("gpu", "0"), ("state", "reset_required")))] == 1
        assert values[("mfu_gpu_up", (("gpu", "0"),))] == 1  # it answers NVML: not lost, only unusable
        assert all(health(base, i)["state"] == "healthy" for i in range(1, demo.GPUS))
        wait_until(lambda: metric_samples(base).get(("mfu_job_tokens_per_second", JOB)) == 0, 30, "progress to stop")
        wait_until(lambda: cause(base) == "stalled", 10, "the loss attributed to the stop")


def test_checkpoint_stall_keeps_a_write_open_and_dips_mfu():
    with running_demo("--incident", "checkpoint-stall", speed=30) as base:
        wait_until(
            lambda: metric_samples(base).get(("mfu_checkpoint_in_progress", JOB)) == 1, 30, "a checkpoint in progress"
        )
        wait_until(lambda: (mfu(base) or 1) < 0.3, 30, "MFU to dip")
        jobs = get_json(base + "api/v1/jobs")["jobs"]
        status = get_json(base + "api/v1/status")
        (job,) = [j for j in status["jobs"] if j["job"] == "llama3-70b"]

        def llama(status):
            return next(j for j in status["jobs"] if j["job"] == "llama3-70b")

        wait_until(
            lambda: llama(get_json(base + "api/v1/status"))["checkpoint"]["elapsed_seconds"] > 60,
            30,
            "the write to outlast a healthy one",
        )
        assert [j["job"] for j in jobs] == ["llama3-70b", "bert-pretrain"]
        wait_until(lambda: cause(base) == "checkpoint", 10, "the loss attributed to the checkpoint")
        assert job["checkpoint"]["in_progress"].startswith("step-")
        assert get(base).startswith(b"<!doctype html>")


def test_the_scheduled_rotation_brings_every_incident_and_a_fifteen_minute_checkpoint_stall(tmp_path):
    monotonic = [0.0]
    clock = demo.SimClock(1.0, wall=lambda: 1_800_000_000.0, monotonic=lambda: monotonic[0])
    node = demo.DemoNode(tmp_path, clock, demo.Schedule())
    order, stall_ticks, stall_writing = [], 0, 0
    while monotonic[0] < demo.ROTATION_SECONDS:
        node.tick()
        if node.incident and node.incident not in order:
            order.append(node.incident)
        if node.incident == "checkpoint-stall":
            stall_ticks += 1
            stall_writing += node.checkpoints.writing and node.checkpoints.duration == demo.STALLED_CHECKPOINT_SECONDS
        monotonic[0] += 10.0
    assert order == list(demo.INCIDENTS)
    assert stall_ticks == demo.STALLED_CHECKPOINT_SECONDS / 10
    assert stall_writing >= stall_ticks - 1  # the stalled write spans the incident, ending with it


def log_job(base: str) -> dict:
    """The demo's training job as /api/v1/jobs shows it ({} until it appears); the discovered job sits beside it."""
    return next((j for j in get_json(base + "api/v1/jobs")["jobs"] if j["job"] == demo.JOB), {})


def test_log_only_demo_gets_mfu_from_the_training_log_alone():
    """--progress logs: no reporter; the job prints torchtitan's lines (one per ~18 s step), the logs source reads MFU
    from them: from the second line on, within a point of the log's own figure, and no cause while healthy."""
    with running_demo("--progress", "logs", speed=20) as base:
        # The step and the MFU from one answer: a line read between two reads would pair a later step with it.
        job = wait_until(lambda: (found := log_job(base)).get("mfu") is not None and found, 60, "MFU from the log")
        # The first line opens the rate (torchtitan's tps is over the interval before it): MFU by the second.
        assert job["step"] <= 3, job["step"]
        assert abs(job["mfu"] - job["framework_mfu"]) <= 0.01, (job["mfu"], job["framework_mfu"])
        assert job["bottleneck"]["cause"] == "none", job["bottleneck"]  # healthy until the rotation's first incident
        assert job["cadence_seconds"] > 10 and job["stall_after_seconds"] == 3 * job["cadence_seconds"]
        values = metric_samples(base)
        assert values[("mfu_job_framework_mfu_ratio", JOB)] == pytest.approx(0.45, rel=0.1)
        assert values[("mfu_exporter_source_up", (("source", "logs"),))] == 1


def test_the_demo_serves_with_the_web_config_and_its_config_file(tmp_path):
    """--web.config.file puts TLS and basic auth on the demo's server, as on the daemon's, and the demo's own job
    still reports through it; --config's keys are merged over the demo's (here: no GPU source)."""
    import base64
    import ssl
    import urllib.error

    import bcrypt
    import trustme

    authority = trustme.CA()
    cert = authority.issue_cert("127.0.0.1", "localhost")
    cert.cert_chain_pems[0].write_to_path(tmp_path / "server.crt")
    cert.private_key_pem.write_to_path(tmp_path / "server.key")
    hashed = bcrypt.hashpw(b"secret", bcrypt.gensalt(rounds=4)).decode()
    web = tmp_path / "web.yaml"
    web.write_text(
        f"tls_server_config: {{cert_file: server.crt, key_file: server.key}}\nbasic_auth_users: {{alice: '{hashed}'}}\n"
    )
    config = tmp_path / "demo.yaml"
    config.write_text("sources:\n  gpu: {enabled: false}\n")
    context = ssl.create_default_context()
    authority.configure_trust(context)
    alice = {"Authorization": "Basic " + base64.b64encode(b"alice:secret").decode()}
    with running_demo("--web.config.file", str(web), "--config", str(config), context=context) as base:
        assert base.startswith("https://")
        with pytest.raises(urllib.error.HTTPError) as refused:
            get(base + "api/v1/jobs", context)
        assert refused.value.code == 401
        with pytest.raises(OSError):  # plain HTTP to a TLS port gets no answer it could read
            get(base.replace("https", "http") + "readyz")

        def llama():
            jobs = get_json(base + "api/v1/jobs", context, alice)["jobs"]
            return next((job for job in jobs if job["job"] == "llama3-70b"), {})

        wait_until(lambda: (llama().get("step") or 0) > 0, 30, "the demo's job to report over TLS")
        running = {source["source"] for source in get_json(base + "api/v1/status", context, alice)["sources"]}
        assert "gpu" not in running and {"rdma", "checkpoint"} <= running
