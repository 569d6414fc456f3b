import argparse
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from mfu_exporter.cli import build_parser, main
from mfu_exporter.cli.flags import add_flag
from mfu_exporter.config import ConfigError, validate
from mfu_exporter.sources import require_sources
from mfu_exporter.sources.base import SourceUnavailable
from tests.support.net import free_port
from tests.support.sources import ScriptedSource


def test_daemon_runs_without_config_and_stops_cleanly_on_sigterm(tmp_path):
    port = free_port()
    env = {
        **os.environ,
        "MFU_EXPORTER_WEB_LISTEN_ADDRESS": f"127.0.0.1:{port}",
        "MFU_EXPORTER_PATH_SYSFS": str(tmp_path),
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "mfu_exporter"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as response:
                    assert response.status == 200
                    break
            except OSError:
                assert time.monotonic() < deadline, (
                    process.stdout.read1().decode() if process.poll() is not None else "not ready"
                )
                time.sleep(0.1)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            body = response.read().decode()
        assert "mfu_exporter_build_info" in body
        process.send_signal(signal.SIGTERM)
        started = time.monotonic()
        assert process.wait(timeout=10) == 0
        assert time.monotonic() - started < 5
    finally:
        if process.poll() is None:
            process.kill()


def test_help_documents_every_env_var():
    result = subprocess.run(
        [sys.executable, "-m", "mfu_exporter", "run", "--help"], capture_output=True, text=True, timeout=30
    )
    for env in (
        "MFU_EXPORTER_CONFIG",
        "MFU_EXPORTER_WEB_LISTEN_ADDRESS",
        "MFU_EXPORTER_PATH_SYSFS",
        "MFU_EXPORTER_LOG_LEVEL",
    ):
        assert env in result.stdout


def test_plain_help_shows_the_daemon_flags_and_their_env_vars():
    result = subprocess.run(
        [sys.executable, "-m", "mfu_exporter", "--help"], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0
    for flag, env in (
        ("--config", "MFU_EXPORTER_CONFIG"),
        ("--web.listen-address", "MFU_EXPORTER_WEB_LISTEN_ADDRESS"),
        ("--web.config.file", "MFU_EXPORTER_WEB_CONFIG_FILE"),
        ("--path.sysfs", "MFU_EXPORTER_PATH_SYSFS"),
        ("--path.procfs", "MFU_EXPORTER_PATH_PROCFS"),
        ("--log.level", "MFU_EXPORTER_LOG_LEVEL"),
    ):
        assert flag in result.stdout and env in result.stdout
    assert "run, the default command" in result.stdout


def test_a_bad_env_value_exits_two_naming_the_variable():
    env = {**os.environ, "MFU_EXPORTER_LOG_LEVEL": "bogus"}
    result = subprocess.run([sys.executable, "-m", "mfu_exporter"], env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert (
        result.stderr
        == 'mfu-exporter: MFU_EXPORTER_LOG_LEVEL: expected one of debug, info, warning, error, got "bogus"\n'
    )


def test_env_values_are_checked_only_where_used(monkeypatch):
    monkeypatch.setenv("MFU_EXPORTER_LOG_LEVEL", "bogus")
    # the command line overrides the variable, and a command without the flag never reads it
    assert build_parser().parse_args(["run", "--log.level", "debug"]).log_level == "debug"
    assert main(["plan", "--params", "7B", "--tokens", "1T", "--gpus", "8", "--gpu", "h100-sxm", "--json"]) == 0


def test_log_levels_in_any_case(monkeypatch):
    monkeypatch.setenv("MFU_EXPORTER_LOG_LEVEL", "WARNING")
    assert build_parser().parse_args(["run"]).log_level == "warning"
    monkeypatch.setenv("MFU_EXPORTER_LOG_LEVEL", "debug")
    assert build_parser().parse_args(["run"]).log_level == "debug"
    assert build_parser().parse_args(["run", "--log.level", "Error"]).log_level == "error"


def test_a_bad_env_value_in_a_typed_flag_is_reported_in_the_flag_s_words(monkeypatch):
    def count(text):
        if not text.isdigit():
            raise argparse.ArgumentTypeError("a whole number of GPUs")
        return int(text)

    def parse():
        parser = argparse.ArgumentParser()
        add_flag(parser, "--test.count", "a count", dest="count", type=count)
        add_flag(parser, "--test.ratio", "a ratio", dest="ratio", type=float)
        return parser.parse_args([])

    monkeypatch.setenv("MFU_EXPORTER_TEST_COUNT", "many")
    monkeypatch.setenv("MFU_EXPORTER_TEST_RATIO", "half")
    args = parse()
    assert str(args.count.error()) == 'MFU_EXPORTER_TEST_COUNT: expected a whole number of GPUs, got "many"'
    assert (
        str(args.ratio.error()) == 'MFU_EXPORTER_TEST_RATIO: expected a float value, as --test.ratio takes, got "half"'
    )
    monkeypatch.setenv("MFU_EXPORTER_TEST_COUNT", "8")
    monkeypatch.setenv("MFU_EXPORTER_TEST_RATIO", "0.5")
    assert (parse().count, parse().ratio) == (8, 0.5)


def test_a_required_source_that_cannot_start_stops_the_start_with_exit_two(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("sources:\n  rdma: {enabled: true}\n  checkpoint: {enabled: true}\n")
    env = {**os.environ, "MFU_EXPORTER_WEB_LISTEN_ADDRESS": f"127.0.0.1:{free_port()}"}
    result = subprocess.run(
        [sys.executable, "-m", "mfu_exporter", "--config", str(config), "--path.sysfs", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == (
        f"mfu-exporter: {config}: sources.rdma.enabled: true requires this source, but it cannot start here "
        f"(no_devices: {tmp_path}/class/infiniband does not exist (no RDMA driver loaded)); expected a node where it works, "
        "or auto to serve without it"
    )


def test_required_sources_are_sampled_once_before_the_start(scripted_source):
    config = validate({"sources": {"rdma": {"enabled": "true"}, "ethtool": {"enabled": "auto"}}})
    scripted_source.name = "rdma"
    absent = ScriptedSource(name="ethtool")
    absent.unavailable = SourceUnavailable("no_interfaces")
    require_sources(config, [scripted_source, absent], "config.yaml")  # auto may be down; true must work
    assert (scripted_source.calls, absent.calls) == (1, 0)
    scripted_source.unavailable = SourceUnavailable("no_devices", "none under /sys/class/infiniband")
    with pytest.raises(
        ConfigError,
        match=r"^config.yaml: sources.rdma.enabled: true requires this source, but it "
        r"cannot start here \(no_devices: none under /sys/class/infiniband\)",
    ):
        require_sources(config, [scripted_source], "config.yaml")
    scripted_source.unavailable = None
    scripted_source.release.clear()  # a first sample that hangs past the source's timeout
    with pytest.raises(ConfigError, match=r"its first sample took longer than its timeout of 0.2s"):
        require_sources(config, [scripted_source], "config.yaml")
