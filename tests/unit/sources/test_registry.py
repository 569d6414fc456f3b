"""One registry, one factory signature: ``build_sources(config, ctx)`` builds every enabled source from its typed
section and the ``SourceContext``, and the sources then read through what the context injected, nothing else."""

from mfu_exporter.config import typed_config, validate
from mfu_exporter.node.ethtool import EthtoolTextReader
from mfu_exporter.sim import nvml as fake_nvml
from mfu_exporter.sim.mlx5 import SimulatedNode
from mfu_exporter.sources import SOURCES, Paths, SourceContext, build_sources, enabled
from tests.support.nodes import FakeQos
from tests.support.sources import Clock

OFF = {"enabled": False}


def context(tmp_path, config):
    fabric = SimulatedNode(tmp_path / "fabric", nics=2)
    fabric.tick(1.0)
    clock = Clock(1_800_000_000.0)
    ctx = SourceContext(
        config,
        Paths(fabric.sysfs_root, str(tmp_path / "proc")),
        nvml=fake_nvml.node(fake_nvml.h100, count=2),
        ethtool_reader=EthtoolTextReader.from_directory(str(fabric.ethtool_directory)),
        nic_qos=FakeQos(),
        wall=clock,
        monotonic=clock,
    )
    return ctx, fabric


def test_every_enabled_source_is_built_through_the_context(tmp_path):
    (tmp_path / "ckpt").mkdir()
    watch = {"path": str(tmp_path / "ckpt"), "job": "llama", "poll": True}
    config = validate(
        {
            "sources": {"checkpoint": {"watch": [watch]}, "rdma": {"interval": "2s"}},
            "discovery": {"kubernetes": OFF, "slurm": OFF},
        }
    )
    ctx, fabric = context(tmp_path, config)
    sources = {source.name: source for source in build_sources(config, ctx)}
    assert list(sources) == [name for name in SOURCES if name != "discovery"]
    assert sources["rdma"].interval == 2.0  # from its section
    assert [gpu.uuid for gpu in sources["gpu"].sample().readings.inventory] == [g.uuid for g in ctx.nvml.gpus]
    assert sorted(sources["rdma"].sample().readings.ports) == ["mlx5_0/1", "mlx5_1/1"]  # the context's sysfs
    # The ethtool texts, not the ioctl: this machine has no such interfaces.
    assert sorted(sources["ethtool"].sample().readings.interfaces) == sorted(nic.netdev for nic in fabric.nics)
    preflight = sources["preflight"]
    assert (preflight.nvml, preflight.qos, preflight.procfs) == (ctx.nvml, ctx.nic_qos, str(tmp_path / "proc"))
    checkpoint = sources["checkpoint"]
    assert checkpoint.tracker.started_timeout == 7200.0 and checkpoint.tracker._clock is ctx.wall
    assert sources["logs"].clock is ctx.wall


def test_a_source_is_left_out_only_when_its_config_says_false(tmp_path):
    config = validate({"sources": {"gpu": OFF, "logs": OFF}, "discovery": {"kubernetes": OFF}})
    ctx, _ = context(tmp_path, config)
    names = [source.name for source in build_sources(config, ctx)]
    assert names == [
        "checkpoint",
        "preflight",
        "rdma",
        "ethtool",
        "nccl",
        "storage",
        "discovery",
    ]  # discovery: slurm is still auto
    typed = typed_config(validate({"discovery": {"kubernetes": OFF, "slurm": OFF}}))
    assert not enabled(typed, "discovery") and enabled(typed, "gpu")
