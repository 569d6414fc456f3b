"""``make gpu-check`` on the fake NVML (``scripts/gpu-truth.py --fake``), so the GPU node's acceptance run cannot rot.

The run itself starts a real daemon, reports the CPU stand-in's products through ``mfu_exporter.client`` and has the
logs source follow an HF-format log; here we check that every comparison it makes came out as it must on the fake,
and that its checks can fail (a GPU without a core series, NVML that does not start).
"""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from mfu_exporter.sim import nvml as sim
from tests.support import scripts

REPOSITORY = Path(__file__).resolve().parents[2]
SCRIPT = REPOSITORY / "scripts" / "gpu-truth.py"
MUST_PASS = (
    "gpu_source_core_series",
    "gpu_source_gpm",
    "gpu_source_sample_time",
    "gpu_source_cost_by_level",
    "gemm_formula_mfu",
    "gemm_hardware_estimate",
    "throttle_seconds",
    "log_mfu_standin",
    "daemon_cpu",
)
MUST_SKIP = ("trainer_log_mfu", "nvidia_smi_reference")  # transformers and nvidia-smi are not here


def load_script():
    return scripts.load_script(SCRIPT.name)


@pytest.fixture(scope="module")
def fake_report(tmp_path_factory):
    work = tmp_path_factory.mktemp("gpu-truth")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--fake", "--json", str(work / "report.json"), "--work", str(work / "run")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPOSITORY,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads((work / "report.json").read_text()), done.stdout


def test_every_comparison_passes_or_skips_with_a_reason_on_the_fake(fake_report):
    report, stdout = fake_report
    verdicts = {c["name"]: c for c in report["checks"]}
    assert report["mode"] == "fake"
    for name in MUST_PASS:
        assert verdicts[name]["verdict"] == "PASS", verdicts[name]
        assert f"PASS  {name}: " in stdout  # the readable summary names each verdict
    for name in MUST_SKIP:
        assert verdicts[name]["verdict"] == "SKIP" and verdicts[name]["detail"], verdicts[name]
    assert "0 failed" in stdout


def test_the_cost_per_gpu_and_sample_is_printed_for_each_series_level(fake_report):
    report, stdout = fake_report
    costs = {result["series"]: result for result in report["figures"]["sample_cost"]}
    assert list(costs) == ["minimal", "standard", "full"]
    for series, cost in costs.items():
        assert f"{series:>8}: " in stdout and "ms wall" in stdout
        assert cost["gpus"] == 2 and cost["wall_ms_per_gpu_sample"] > 0
        # One field-values request per GPU and sample carries power, energy, ECC and the counters.
        assert cost["calls"]["nvmlDeviceGetFieldValues"]["per_gpu_sample"] == 1
        assert "nvmlDeviceGetPowerUsage" not in cost["calls"]
    assert costs["minimal"]["calls_per_gpu_sample"] < costs["standard"]["calls_per_gpu_sample"]
    assert costs["minimal"]["fields_per_gpu_sample"] < costs["full"]["fields_per_gpu_sample"]


def test_the_gemm_figures_are_the_products_flops(fake_report):
    report, _ = fake_report
    gemm = next(c for c in report["checks"] if c["name"] == "gemm_formula_mfu")["figures"]
    # The stand-in peak is twice the CPU's warm-up rate: the MFU lands near 0.5 on a quiet machine (0.14 was seen with
    # the suite's other workers on 2 cores), well off 0, where a wrong 6·P·tokens shows as a gap of points.
    assert 0.05 < gemm["truth_mfu"] < 1.0
    assert abs(gemm["formula_mfu"] - gemm["truth_mfu"]) <= 0.02
    assert gemm["params"] == pytest.approx(2 * 30**3 * 1e6 / 6)  # one product = one token, each FLOP a million
    # The fake's GPUs hold tensor activity at 45 % at 1830 MHz, the H100's reference clock: the estimate is 0.45.
    assert gemm["tensor_active"] == pytest.approx(0.45) and gemm["hardware_flops_utilization"] == pytest.approx(0.45)


def test_the_probes_record_what_nvml_answered(fake_report):
    report, _ = fake_report
    probes = report["figures"]["nvml_probes"]
    assert probes["init_refcount"]["count_after"] == 2  # a second init and one shutdown leave the session open
    assert probes["xid_wait"]["answer"] == "NVMLError_Timeout"
    assert set(probes["gpm_idle"]) == {"20ms", "50ms", "100ms", "200ms"}
    assert probes["memory_idle"]["v1"]["used"] == 40 * 1024**3


def test_a_gpu_lacking_a_core_series_fails_the_check():
    script = load_script()
    nvml = sim.node(sim.h100, count=2)
    nvml.gpus[1].fields -= {185}  # neither the power field nor the call answers
    nvml.gpus[1].fail["nvmlDeviceGetPowerUsage"] = nvml.NVML_ERROR_NOT_SUPPORTED
    report = script.Report("fake")
    script.check_gpu_source(report, nvml, samples=2, pause=0.11)
    core = next(c for c in report.data["checks"] if c["name"] == "gpu_source_core_series")
    assert core["verdict"] == "FAIL" and core["figures"]["problems"] == ["GPU 1 lacks mfu_gpu_power_watts"]


def test_a_machine_without_a_cuda_pytorch_exits_2_with_the_reason(tmp_path):
    # The test environment has PyTorch's CPU build (the real-jobs tests train on it), or none: the real mode must say
    # which is missing and stop, never half-run.
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=60, cwd=REPOSITORY)
    assert done.returncode == 2
    if importlib.util.find_spec("torch") is None:
        assert "PyTorch is not importable" in done.stderr
    else:
        assert "PyTorch sees no CUDA GPU here" in done.stderr


def test_mig_gpus_need_no_utilization_and_gpm_is_checked_on_hopper_only():
    # Folded in from the old gpu-smoke script: in MIG mode NVML has no utilization, and that is not a failure.
    script = load_script()
    nvml = sim.node(sim.h100(0), sim.a100(1, mig_mode=1))
    report = script.Report("fake")
    gpus = script.check_gpu_source(report, nvml, samples=2, pause=0.11)
    verdicts = {c["name"]: c for c in report.data["checks"]}
    assert verdicts["gpu_source_core_series"]["verdict"] == "PASS"
    assert verdicts["gpu_source_gpm"]["figures"]["hopper_gpus"] == ["0"]  # the A100 has no GPM to ask for
    assert [g["mig"] for g in gpus] == [False, True]
    assert not nvml.initialized  # the source closed its NVML session


def test_nvml_that_does_not_start_fails_the_source_check():
    script = load_script()
    report = script.Report("fake")
    assert script.check_gpu_source(report, sim.node(sim.h100, count=1, library_present=False), 1, 0.1) == []
    (check,) = report.data["checks"]
    assert check["verdict"] == "FAIL" and "NVML did not start" in check["detail"]
