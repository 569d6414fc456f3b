"""Every command refuses what it cannot use, with exit 2 and the flag named: mount points that do not
exist, numbers outside what the daemon accepts, non-positive speeds and node counts."""

from __future__ import annotations

import json
import math

import pytest

from mfu_exporter.cli import build_parser, main


def refused(argv: list[str], capsys) -> str:
    """Run ``argv``; it must exit 2 (argparse's SystemExit or main's return). Its last stderr line."""
    try:
        code = main(argv)
    except SystemExit as exited:
        code = exited.code
    assert code == 2, argv
    return capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize("command", ["check", "run"])
@pytest.mark.parametrize("flag", ["--path.sysfs", "--path.procfs"])
def test_a_mount_point_that_does_not_exist_is_refused_naming_the_flag(command, flag, capsys, tmp_path):
    error = refused([command, flag, str(tmp_path / "nonexistent")], capsys)
    assert error.startswith(f"mfu-exporter {command}: {flag} (or MFU_EXPORTER_PATH_")
    assert f"expected an existing directory, got '{tmp_path / 'nonexistent'}' (no such path)" in error


def test_a_mount_point_that_is_a_file_is_refused(capsys, tmp_path):
    (tmp_path / "file").write_text("")
    assert "(not a directory)" in refused(["check", "--path.sysfs", str(tmp_path / "file")], capsys)


def test_a_deployment_s_paths_parse_anywhere_and_are_checked_where_the_command_runs(capsys):
    args = build_parser().parse_args(["run", "--path.sysfs=/host/sys"])  # a DaemonSet's, off a node
    assert args.sysfs == "/host/sys"


def test_a_mount_point_from_the_environment_is_refused_naming_the_variable(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("MFU_EXPORTER_PATH_PROCFS", str(tmp_path / "gone"))
    error = refused(["check"], capsys)
    assert "--path.procfs (or MFU_EXPORTER_PATH_PROCFS): expected an existing directory" in error


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--speed", "0"], "argument --speed: '0': must be positive"),
        (["--speed", "-1"], "argument --speed: '-1': must be positive"),
        (["--speed", "inf"], "argument --speed: 'inf': must be positive"),
        (["--nodes", "0"], "mfu-exporter demo: --nodes must be from 1 to 4096"),
        (["--incident-node", "3"], "mfu-exporter demo: --incident-node needs --nodes"),
    ],
)
def test_demo_usage_errors_exit_two(argv, message, capsys):
    assert message in refused(["demo", *argv], capsys)


PLAN = ["plan", "--params", "7B", "--tokens", "1T", "--gpu", "h100"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--gpus", "-5"], "argument --gpus: '-5': must be positive"),
        (["--gpus", "0"], "argument --gpus: '0': must be positive"),
        (["--gpus", "8", "--params", "1e308"], "parameters must be from 1 to 1e+15"),
        (["--gpus", "8", "--tokens", "1e308"], "tokens must be from 1 to 1e+21"),
        (["--gpus", "8", "--peak-tflops", "1e300"], "TFLOP/s per GPU must be from 0.001 to 1e+06"),
        (["--gpus", "8", "--attention", "1,1,1,9999999999"], "must be at most"),
    ],
)
def test_plan_bounds_its_inputs_as_the_daemon_does(argv, message, capsys):
    assert message in refused([*PLAN, *argv], capsys)


def test_plan_at_its_bounds_prints_only_finite_json(capsys):
    argv = ["plan", "--params", "1e15", "--tokens", "1e21", "--gpus", "1", "--peak-tflops", "0.001", "--json"]
    argv += ["--attention", "100000,100000,100000,1000000000", "--price-per-gpu-hour", "1e6", "--mfu", "0.001"]
    assert main(argv) == 0

    def finite(value: str) -> float:
        raise AssertionError(f"non-finite {value} in the plan's JSON")

    plan = json.loads(capsys.readouterr().out, parse_constant=finite)
    assert all(math.isfinite(s["seconds"]) and math.isfinite(s["cost"]) for s in plan["scenarios"])


def test_plan_lists_the_aliases_it_accepts(capsys):
    assert refused([*PLAN[:-2], "--gpus", "8", "--gpu", "x100"], capsys).count("h100-sxm (h100, h100-sxm5)") == 1
    assert main([*PLAN, "--gpus", "8"]) == 0  # h100 is an alias of h100-sxm, and says so above
    assert "h100-sxm bf16" in capsys.readouterr().out
