import json
import math
import subprocess
import sys

import pytest

from mfu_exporter.cli import build_parser
from mfu_exporter.cli.plan import PlanError, make_plan, run_plan
from mfu_exporter.model.flops import ModelShape

DAY = 86400.0

# Llama 3 405B: 405B parameters, 15.6T tokens, 16,384 H100 SXM at 989.4 TFLOP/s dense BF16, 40% MFU.
LLAMA3_405B = ["--params", "405B", "--tokens", "15.6T", "--gpus", "16384", "--gpu", "h100-sxm", "--mfu", "0.40"]


def plan(*argv):
    args = build_parser().parse_args(["plan", *argv])
    out = __import__("io").StringIO()
    code = run_plan(args, out=out)
    return code, out.getvalue()


def plan_json(*argv):
    code, out = plan(*argv, "--json")
    assert code == 0
    return json.loads(out)


def test_llama3_405b_by_hand():
    # t = 6·P·D / (N·T·MFU), worked out here without the MFU module
    seconds = 6 * 405e9 * 15.6e12 / (16384 * 989.4e12 * 0.40)
    assert seconds / DAY == pytest.approx(67.66, abs=0.01)  # the reference's 67.7 days
    document = plan_json(*LLAMA3_405B)
    planned, at_25, at_50 = document["scenarios"]
    assert document["flops_per_token"] == 6 * 405e9
    assert document["total_flops"] == pytest.approx(3.7908e25)
    assert planned["mfu"] == 0.40
    assert planned["seconds"] == pytest.approx(seconds)
    assert planned["gpu_hours"] == pytest.approx(16384 * seconds / 3600)  # 26.6M
    assert planned["gpu_hours"] == pytest.approx(26.61e6, rel=1e-3)
    # the guide's bands: the same run at 25% MFU takes 1.6× as long, at 50% 0.8×
    assert (at_25["mfu"], at_50["mfu"]) == (0.25, 0.50)
    assert at_25["seconds"] == pytest.approx(seconds * 0.40 / 0.25)
    assert at_50["seconds"] == pytest.approx(seconds * 0.40 / 0.50)


def test_text_output_shows_the_three_mfus():
    code, out = plan(*LLAMA3_405B)
    assert code == 0
    lines = out.splitlines()
    assert "405B parameters, 15.6T tokens, 2.43e+12 FLOPs/token" in lines[0]
    assert lines[2] == "cluster    16,384 GPUs × h100-sxm bf16, 989.4 TFLOP/s dense"
    rows = [line.split() for line in lines if line.startswith(("40%", "25%", "50%"))]
    assert rows == [
        ["40%", "(plan)", "67.7d", "26.6M"],
        ["25%", "(guide)", "108.3d", "42.6M", "+40.6d"],
        ["50%", "(guide)", "54.1d", "21.3M", "-13.5d"],
    ]


def test_attention_term_and_causal_halving():
    layers, heads, head_dim, seq_len = 126, 128, 128, 8192  # Llama 3 405B's shape
    full = plan_json(*LLAMA3_405B, "--attention", f"{layers},{heads},{head_dim},{seq_len}")
    causal = plan_json(*LLAMA3_405B, "--attention", f"{layers},{heads},{head_dim},{seq_len}", "--causal-attention")
    attention = 12 * layers * heads * head_dim * seq_len
    assert full["flops_per_token"] == 6 * 405e9 + attention
    assert causal["flops_per_token"] == 6 * 405e9 + attention / 2
    assert (
        full["scenarios"][0]["seconds"]
        > causal["scenarios"][0]["seconds"]
        > plan_json(*LLAMA3_405B)["scenarios"][0]["seconds"]
    )


def test_peak_override_and_dtype():
    overridden = plan_json(
        "--params", "70B", "--tokens", "15T", "--gpus", "1024", "--peak-tflops", "500", "--mfu", "0.5"
    )
    assert overridden["peak_flops_per_gpu"] == 500e12
    assert overridden["scenarios"][0]["seconds"] == pytest.approx(6 * 70e9 * 15e12 / (1024 * 500e12 * 0.5))
    fp8 = plan_json("--params", "70B", "--tokens", "15T", "--gpus", "1024", "--gpu", "h100", "--dtype", "fp8")
    assert fp8["peak_flops_per_gpu"] == 1978.9e12
    assert fp8["mfu"] == 0.40  # the default


def test_cost_column():
    document = plan_json(*LLAMA3_405B, "--price-per-gpu-hour", "2.5")
    for scenario in document["scenarios"]:
        assert scenario["cost"] == pytest.approx(scenario["gpu_hours"] * 2.5)
    code, out = plan(*LLAMA3_405B, "--price-per-gpu-hour", "2.5")
    assert "cost" in out.splitlines()[4]
    assert "$66.5M" in out


def test_deadline_solves_for_gpus():
    document = plan_json("--params", "405B", "--tokens", "15.6T", "--gpu", "h100-sxm", "--mfu", "0.40", "--time", "60d")
    gpus = document["gpus"]
    assert document["solved"] == "gpus"
    assert gpus == math.ceil(6 * 405e9 * 15.6e12 / (60 * DAY * 989.4e12 * 0.40))  # 18,478
    assert document["scenarios"][0]["seconds"] <= 60 * DAY
    assert 6 * 405e9 * 15.6e12 / ((gpus - 1) * 989.4e12 * 0.40) > 60 * DAY  # one GPU fewer misses the deadline


def test_deadline_solves_for_mfu():
    document = plan_json(
        "--params", "405B", "--tokens", "15.6T", "--gpus", "16384", "--gpu", "h100-sxm", "--time", "60d"
    )
    assert document["solved"] == "mfu"
    assert document["mfu"] == pytest.approx(0.40 * 67.66 / 60, rel=1e-3)  # 45.1%
    assert document["scenarios"][0]["seconds"] == pytest.approx(60 * DAY)
    code, out = plan("--params", "405B", "--tokens", "15.6T", "--gpus", "1024", "--gpu", "h100-sxm", "--time", "30d")
    assert "unreachable" in out  # 1,024 GPUs would need far above 100% MFU


@pytest.mark.parametrize(
    "argv,message",
    [
        (
            ["--params", "70B", "--tokens", "15T", "--gpus", "8", "--gpu", "tpu-v9"],
            "unknown --gpu 'tpu-v9'; known: gb200",
        ),
        (["--params", "70B", "--tokens", "15T", "--gpus", "8"], "give --gpu"),
        (["--params", "70B", "--tokens", "15T", "--gpu", "h100"], "give --gpus, or --time"),
        (
            ["--params", "70B", "--tokens", "15T", "--gpu", "a100", "--dtype", "fp8", "--gpus", "8"],
            "no fp8 peak for a100",
        ),
        (
            ["--params", "70B", "--tokens", "15T", "--gpu", "h100", "--gpus", "8", "--mfu", "0.4", "--time", "30d"],
            "not both",
        ),
    ],
)
def test_bad_combinations_exit_two(argv, message, capsys):
    code, _ = plan(*argv)
    assert code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "flag,value",
    [
        ("--params", "seventy"),
        ("--mfu", "1.5"),
        ("--mfu", "0"),
        ("--gpus", "8.5"),
        ("--time", "soon"),
        ("--attention", "126,128,128"),
    ],
)
def test_bad_values_are_argument_errors(flag, value):
    argv = ["--params", "70B", "--tokens", "15T", "--gpus", "8", "--gpu", "h100"]
    if flag in argv:
        argv[argv.index(flag) + 1] = value
    else:
        argv += [flag, value]
    with pytest.raises(SystemExit) as caught:
        build_parser().parse_args(["plan", *argv])
    assert caught.value.code == 2


def test_mfu_as_percent_and_make_plan_directly():
    assert plan_json("--params", "7B", "--tokens", "1T", "--gpus", "64", "--gpu", "a100", "--mfu", "45%")["mfu"] == 0.45
    with pytest.raises(PlanError):
        make_plan(ModelShape(7e9), 1e12, 312e12, "a100", gpus=64, mfu_ratio=0.4, target_seconds=DAY)


def test_console_script_entry_point():
    result = subprocess.run(
        [sys.executable, "-m", "mfu_exporter", "plan", *LLAMA3_405B], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "67.7d" in result.stdout
