"""``mfu-exporter demo`` takes the daemon's flags that make sense for a simulated node, and each one works: the
config file merged over the demo's own, the web flags as ``run`` applies them, ``--mfu.window`` over both; the
path flags are refused, since the demo reads only the trees it simulates."""

import argparse

import pytest

from mfu_exporter.cli import main
from mfu_exporter.cli.demo import demo_flags
from mfu_exporter.config import ConfigError, load_config
from mfu_exporter.sim.node import JOB, MODEL, DemoNode, Schedule, SimClock, build_demo, demo_config


@pytest.fixture
def node(tmp_path):
    return DemoNode(tmp_path / "node", SimClock(1.0), Schedule())


def demo_args(**overrides):
    args = {
        "config": None,
        "listen_address": None,
        "web_config_file": None,
        "speed": 1.0,
        "incident": None,
        "mfu_window": None,
        "seed": 0,
        "progress": "api",
    }
    return argparse.Namespace(**{**args, **overrides})


@pytest.mark.parametrize("flag", ["--path.sysfs", "--path.procfs"])
def test_the_path_flags_are_refused_with_exit_two_and_why(flag, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["demo", flag, "/tmp/elsewhere"])
    assert exited.value.code == 2
    error = capsys.readouterr().err.splitlines()[-1]
    assert error.startswith(f"mfu-exporter demo: error: {flag} is not accepted: the demo reads the simulated sysfs")
    assert error.endswith(f"run mfu-exporter run {flag} DIR")


def test_the_file_is_merged_over_the_demo_s_own_config(node, tmp_path):
    file = tmp_path / "demo.yaml"
    file.write_text(
        "mfu: {window: 30s}\n"
        "sources:\n  gpu: {enabled: false}\n  checkpoint: {interval: 3s}\n"
        "attribution: {tolerance: 0.2}\n"
        f"jobs:\n  {JOB}: {{gpus: [0, 1]}}\n"
    )
    config = demo_config(str(file), node)
    assert config["mfu"]["window"] == 30.0
    assert config["sources"]["gpu"]["enabled"] == "false"
    assert config["sources"]["gpu"]["retry_interval"] == 30.0  # the demo's, under the file's key
    assert config["sources"]["checkpoint"]["interval"] == 3.0
    assert [w["path"] for w in config["sources"]["checkpoint"]["watch"]] == [str(node.checkpoints.root)]
    assert (config["attribution"]["tolerance"], config["attribution"]["baseline_interval"]) == (0.2, 1.0)
    assert config["jobs"][JOB]["gpus"] == [0, 1]
    assert config["jobs"][JOB]["params"] == MODEL["params"]
    assert demo_config(None, node)["mfu"]["window"] == 15.0  # the demo's own default


def test_the_demo_samples_the_hardware_every_second(node):
    """The demo's incidents last seconds: its GPU, RDMA and ethtool sources sample every second, not every 5 s."""
    sources = demo_config(None, node)["sources"]
    assert [sources[name]["interval"] for name in ("gpu", "rdma", "ethtool")] == [1.0, 1.0, 1.0]


def test_a_bad_key_in_the_demo_s_file_is_the_daemon_s_error(node, tmp_path):
    file = tmp_path / "demo.yaml"
    file.write_text("sources:\n  gpu: {intreval: 5s}\n")
    with pytest.raises(ConfigError) as daemon:
        load_config(str(file))
    with pytest.raises(ConfigError) as demo:
        demo_config(str(file), node)
    assert str(demo.value) == str(daemon.value)
    assert str(demo.value).startswith(f"{file}: sources.gpu.intreval: unknown key; expected one of enabled")
    file.write_text("[1, 2]\n")
    with pytest.raises(ConfigError, match="expected a mapping of keys"):
        demo_config(str(file), node)


def test_the_demo_builds_the_sources_its_config_enables_and_the_flags_win(tmp_path):
    file = tmp_path / "demo.yaml"
    file.write_text("mfu: {window: 30s}\nsources:\n  gpu: {enabled: false}\n  preflight: {enabled: false}\n")
    web = tmp_path / "web.yaml"
    web.write_text("{}\n")
    args = demo_args(config=str(file), mfu_window=20.0, listen_address="127.0.0.1:19999", web_config_file=str(web))
    service, node, _ = build_demo(args, tmp_path / "root", flags=lambda config: demo_flags(config, args))
    try:
        assert [s.name for s in service.scheduler.sources] == [
            "checkpoint",
            "rdma",
            "ethtool",
            "logs",  # the job's NCCL_DEBUG_FILE
            "nccl",
            "storage",
            "discovery",
        ]
        assert service.settings.mfu.window == 20.0
        assert (service.settings.web.listen_address, service.settings.web.config_file) == ("127.0.0.1:19999", str(web))
    finally:
        node.kubelet.stop()
    service, node, _ = build_demo(demo_args(config=str(file)), tmp_path / "again")
    node.kubelet.stop()
    assert service.settings.mfu.window == 30.0  # without the flag, the file's


def test_a_bad_listen_address_is_the_flag_s_error(node):
    with pytest.raises(ConfigError) as raised:
        demo_flags(demo_config(None, node), demo_args(listen_address="nowhere"))
    assert str(raised.value).startswith('--web.listen-address: expected HOST:PORT such as ":9495"')
