import errno
import io
import json
import os
import socket
import struct
import subprocess
import sys

import pynvml
import pytest

from mfu_exporter.cli import build_parser
from mfu_exporter.cli.check import run_check
from mfu_exporter.config import ConfigError, defaults, validate
from mfu_exporter.node import nic_qos
from mfu_exporter.node.nic_qos import GlobalPause
from mfu_exporter.node.pci import pci_address_from_nvml
from mfu_exporter.preflight import checks as preflight
from mfu_exporter.preflight import facts as facts_module
from mfu_exporter.preflight.facts import PreflightSettings, Status
from mfu_exporter.render.preflight import check_families
from mfu_exporter.render.snapshots import snapshot_families
from mfu_exporter.sim.nvml import FakeNvml, a100, h100
from mfu_exporter.sources import build_sources
from mfu_exporter.sources.base import Paths, SourceContext
from mfu_exporter.sources.preflight import PreflightSource
from tests.support.nodes import FakeQos, Node, hgx_node
from tests.support.tools import require_tool


def healthy_qos(count: int = 8) -> FakeQos:
    return FakeQos(
        pfc={f"eth{i}": {3} for i in range(count)},
        pause={f"eth{i}": GlobalPause(autoneg=False, rx=False, tx=False) for i in range(count)},
    )


def run(node: Node, nvml=None, qos=None, settings=None, env=None):
    settings = settings or PreflightSettings()
    facts = facts_module.gather(
        settings,
        node.sys,
        node.proc,
        nvml=nvml or FakeNvml([h100(i) for i in range(8)]),
        qos=qos or healthy_qos(),
        nccl_env={} if env is None else env,
    )
    return {r.check: r for r in preflight.run_checks(facts, settings)}


def test_check_names_are_stable_and_unique(tmp_path):
    results = run(hgx_node(tmp_path))
    assert list(results) == [
        "net.core.rmem_max",
        "net.core.wmem_max",
        "net.ipv4.tcp_rmem",
        "net.ipv4.tcp_wmem",
        "rdma.port_state",
        "rdma.port_rate",
        "rdma.link_layer",
        "rdma.node_bandwidth",
        "rdma.nic_per_gpu",
        "rdma.gpu_nic_affinity",
        "roce.pfc",
        "roce.pfc_other_priorities",
        "roce.ecn",
        "roce.global_pause",
        "gpudirect.rdma",
        "pci.acs",
        "pci.iommu",
        "nccl.NCCL_IB_DISABLE",
        "nccl.NCCL_NET_GDR_LEVEL",
        "nccl.NCCL_IB_HCA",
        "gpu.inventory",
        "gpu.persistence_mode",
        "gpu.health",
    ]


def test_healthy_hgx_node_passes_everything(tmp_path):
    results = run(hgx_node(tmp_path), env={"NCCL_IB_DISABLE": "0", "NCCL_NET_GDR_LEVEL": "5", "NCCL_IB_HCA": "mlx5"})
    assert {name: r.status for name, r in results.items() if r.status != Status.PASS} == {}
    assert results["rdma.node_bandwidth"].observed == "3200 Gb/s over 8 ACTIVE ports"
    assert results["rdma.gpu_nic_affinity"].observed == "8 GPUs: 8× same PCIe switch"
    assert results["gpu.inventory"].observed == "8× NVIDIA H100 80GB HBM3"
    assert results["roce.pfc"].observed == "priority 3 on 8 interfaces"
    assert results["roce.pfc_other_priorities"].observed == "none on 8 interfaces"
    assert results["roce.ecn"].observed == "enabled on 8 interfaces"
    assert results["roce.global_pause"].observed == "off on 8 interfaces"
    assert all(r.fix == "" for r in results.values())


# (case, mutation of the healthy node, check, status, text expected in the fix)
def _small_rmem(node, ctx):
    node.sysctl("net.core.rmem_max", "4194304")


def _small_tcp_wmem(node, ctx):
    node.sysctl("net.ipv4.tcp_wmem", "4096\t16384\t4194304")


def _port_down(node, ctx):
    node.write(node.sys / "class/infiniband/mlx5_3/ports/1/state", "1: DOWN")


def _port_slow(node, ctx):
    node.write(node.sys / "class/infiniband/mlx5_5/ports/1/rate", "200 Gb/sec (4X HDR)")


def _wrong_link_layer(node, ctx):
    ctx["settings"] = PreflightSettings(link_layer="InfiniBand")


def _thin_node(node, ctx):
    for i in range(8):
        node.write(node.sys / f"class/infiniband/mlx5_{i}/ports/1/rate", "25 Gb/sec (1X EDR)")


def _pfc_off(node, ctx):
    ctx["qos"].pfc["eth2"] = set()


def _pfc_extra(node, ctx):
    ctx["qos"].pfc["eth4"] = {3, 4}


def _ecn_off(node, ctx):
    node.ecn("eth1", 3, rp="0")


def _global_pause(node, ctx):
    ctx["qos"].pause["eth6"] = GlobalPause(autoneg=True, rx=True, tx=True)


def _no_peermem(node, ctx):
    node.modules("nvidia_uvm", "nvidia", "mlx5_ib")


def _ib_disabled(node, ctx):
    ctx["env"] = {"NCCL_IB_DISABLE": "1"}


def _gdr_too_low(node, ctx):
    ctx["env"] = {"NCCL_NET_GDR_LEVEL": "LOC"}


def _hca_typo(node, ctx):
    ctx["env"] = {"NCCL_IB_HCA": "mlx5_0,mlx6_1"}


def _hca_excludes_all(node, ctx):
    ctx["env"] = {"NCCL_IB_HCA": "^mlx5"}


def _hca_partial(node, ctx):
    ctx["env"] = {"NCCL_IB_HCA": "=mlx5_0,mlx5_1"}


def _mixed_gpus(node, ctx):
    ctx["nvml"] = FakeNvml([h100(i) for i in range(7)] + [a100(7)])


def _gpu_missing_from_nvml(node, ctx):
    gpus = [h100(i) for i in range(8)]
    # Not enumerated by NVML (unbound from the driver); sysfs still lists the PCI function. One that fell off the bus
    # keeps its NVML index instead, and fails gpu.health (below).
    gpus[2].unbound = True
    ctx["nvml"] = FakeNvml(gpus)


def _gpu_lost(node, ctx):
    gpus = [h100(i) for i in range(8)]
    gpus[4].fail["nvmlDeviceGetName"] = pynvml.NVML_ERROR_GPU_IS_LOST
    ctx["nvml"] = FakeNvml(gpus)


def _gpu_thermal(node, ctx):
    ctx["nvml"] = FakeNvml([h100(i, clocks_event_reasons=0x40 if i == 1 else 0x1) for i in range(8)])


def _persistence_off(node, ctx):
    ctx["nvml"] = FakeNvml([h100(i, persistence_mode=i not in (0, 5)) for i in range(8)])


def _expected_more_gpus(node, ctx):
    ctx["settings"] = PreflightSettings(expected_gpus=16)


FAILURES = [
    ("rmem_max", _small_rmem, "net.core.rmem_max", Status.FAIL, "sysctl -w net.core.rmem_max=67108864"),
    (
        "tcp_wmem",
        _small_tcp_wmem,
        "net.ipv4.tcp_wmem",
        Status.FAIL,
        'sysctl -w net.ipv4.tcp_wmem="4096 16384 67108864"',
    ),
    ("port down", _port_down, "rdma.port_state", Status.FAIL, "ip link set dev eth3 up; ethtool eth3"),
    ("port slow", _port_slow, "rdma.port_rate", Status.FAIL, "ethtool eth5"),
    ("link layer", _wrong_link_layer, "rdma.link_layer", Status.FAIL, "mlxconfig -d 0000:19:00.0 set LINK_TYPE_P1=1"),
    ("thin node", _thin_node, "rdma.node_bandwidth", Status.FAIL, "rdma.port_state"),
    ("pfc off", _pfc_off, "roce.pfc", Status.FAIL, "dcb pfc set dev eth2 prio-pfc all:off 3:on"),
    ("pfc extra", _pfc_extra, "roce.pfc_other_priorities", Status.WARN, "dcb pfc set dev eth4 prio-pfc all:off 3:on"),
    ("ecn off", _ecn_off, "roce.ecn", Status.FAIL, "echo 1 > /sys/class/net/eth1/ecn/roce_rp/enable/3"),
    ("global pause", _global_pause, "roce.global_pause", Status.FAIL, "ethtool -A eth6 rx off tx off"),
    ("no peermem", _no_peermem, "gpudirect.rdma", Status.FAIL, "modprobe nvidia_peermem"),
    ("ib disabled", _ib_disabled, "nccl.NCCL_IB_DISABLE", Status.FAIL, "export NCCL_IB_DISABLE=0"),
    ("gdr off", _gdr_too_low, "nccl.NCCL_NET_GDR_LEVEL", Status.FAIL, "export NCCL_NET_GDR_LEVEL=5"),
    ("hca typo", _hca_typo, "nccl.NCCL_IB_HCA", Status.FAIL, "export NCCL_IB_HCA=mlx5_0,mlx5_1,mlx5_2"),
    ("hca excludes all", _hca_excludes_all, "nccl.NCCL_IB_HCA", Status.FAIL, "export NCCL_IB_HCA=mlx5_0,"),
    ("hca partial", _hca_partial, "nccl.NCCL_IB_HCA", Status.WARN, "export NCCL_IB_HCA=mlx5_0,"),
    ("mixed gpus", _mixed_gpus, "gpu.inventory", Status.FAIL, "nvidia-smi -L"),
    ("gpu missing", _gpu_missing_from_nvml, "gpu.inventory", Status.FAIL, "nvidia-smi -L"),
    ("gpu lost", _gpu_lost, "gpu.health", Status.FAIL, "nvidia-smi -q -i 4"),
    ("gpu thermal", _gpu_thermal, "gpu.health", Status.FAIL, "nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER -i 1"),
    ("persistence", _persistence_off, "gpu.persistence_mode", Status.WARN, "nvidia-smi -pm 1"),
    ("gpu count", _expected_more_gpus, "gpu.inventory", Status.FAIL, "nvidia-smi -L"),
]


@pytest.mark.parametrize("mutate,check,status,fix", [case[1:] for case in FAILURES], ids=[case[0] for case in FAILURES])
def test_each_misconfiguration_is_caught_alone(tmp_path, mutate, check, status, fix):
    node = hgx_node(tmp_path)
    ctx = {"qos": healthy_qos(), "env": {}, "settings": None, "nvml": None}
    mutate(node, ctx)
    results = run(node, nvml=ctx["nvml"], qos=ctx["qos"], settings=ctx["settings"], env=ctx["env"])
    assert results[check].status == status, results[check]
    assert fix in results[check].fix
    others = {name: r.status for name, r in results.items() if name != check and r.status in (Status.FAIL, Status.WARN)}
    assert others == {}


def test_pfc_missing_on_one_interface_and_extra_on_another_are_two_findings(tmp_path):
    """The RoCE priority without PFC fails roce.pfc; other priorities with PFC warn in a check of their own, so the
    warning is not hidden behind the failure (and MfuPfcOtherPriorities can key on it)."""
    node = hgx_node(tmp_path)
    ctx = {"qos": healthy_qos()}
    _pfc_off(node, ctx)
    ctx["qos"].pfc["eth5"] = {0, 3}
    results = run(node, qos=ctx["qos"])
    assert (results["roce.pfc"].status, results["roce.pfc"].observed) == (Status.FAIL, "eth2: none")
    other = results["roce.pfc_other_priorities"]
    assert (other.status, other.observed) == (Status.WARN, "eth5: 0,3")
    assert other.fix.startswith("dcb pfc set dev eth5 prio-pfc all:off 3:on")
    families = {f.name: {s.labels["check"]: s.value for s in f.samples} for f in check_families(list(results.values()))}
    assert families["mfu_preflight_check_ok"]["roce.pfc_other_priorities"] == 1.0  # a WARN: the node works
    assert families["mfu_preflight_check_warning"]["roce.pfc_other_priorities"] == 1.0
    assert (
        families["mfu_preflight_check_warning"]["roce.pfc"] == 0.0
        and families["mfu_preflight_check_ok"]["roce.pfc"] == 0.0
    )


def test_observed_values_name_the_culprits(tmp_path):
    node = hgx_node(tmp_path)
    _port_down(node, {})
    _port_slow(node, {})
    results = run(node)
    assert results["rdma.port_state"].observed == "mlx5_3/1 DOWN"
    assert results["rdma.port_rate"].observed == "mlx5_5/1 200 Gb/sec (4X HDR)"
    assert results["rdma.port_rate"].expected == "≥ 400 Gb/s per port (the fastest port)"
    assert results["rdma.node_bandwidth"].observed == "2600 Gb/s over 7 ACTIVE ports"


def test_configured_port_rate_and_bandwidth_floor(tmp_path):
    node = hgx_node(tmp_path)
    results = run(node, settings=PreflightSettings(port_rate_gbps=800, min_node_gbps=6400))
    assert results["rdma.port_rate"].status == Status.FAIL
    assert "sources.preflight.port_rate_gbps" in results["rdma.port_rate"].expected
    assert results["rdma.node_bandwidth"].status == Status.FAIL


def test_fewer_nics_than_gpus_is_a_warning_not_a_failure(tmp_path):
    results = run(hgx_node(tmp_path, nics=4), qos=healthy_qos(4))
    assert results["rdma.nic_per_gpu"].status == Status.WARN
    assert results["rdma.nic_per_gpu"].observed == "4 NICs for 8 GPUs"
    # GPUs 4-7 sit on NUMA node 1 and the four NICs on node 0: their nearest NIC is across the socket interconnect
    assert results["rdma.gpu_nic_affinity"].status == Status.WARN
    assert results["rdma.gpu_nic_affinity"].observed == (
        "nearest NIC across NUMA nodes for GPU 4 (0000:9a:00.0) → mlx5_0, "
        "GPU 5 (0000:ab:00.0) → mlx5_0, GPU 6 (0000:ba:00.0) → mlx5_0, "
        "GPU 7 (0000:db:00.0) → mlx5_0"
    )


def test_nics_on_one_socket_are_flagged_and_set_the_gdr_level_needed(tmp_path):
    node = hgx_node(tmp_path, nics_on_socket=0)
    results = run(node, env={"NCCL_NET_GDR_LEVEL": "PHB"})
    assert results["rdma.gpu_nic_affinity"].status == Status.WARN
    assert results["rdma.gpu_nic_affinity"].observed.count("→") == 4  # GPUs 4-7
    assert results["nccl.NCCL_NET_GDR_LEVEL"].status == Status.FAIL
    assert "SYS" in results["nccl.NCCL_NET_GDR_LEVEL"].expected
    assert run(node, env={"NCCL_NET_GDR_LEVEL": "5"})["nccl.NCCL_NET_GDR_LEVEL"].status == Status.PASS


@pytest.mark.parametrize(
    "value,status",
    [
        (None, Status.PASS),
        ("PIX", Status.PASS),
        ("1", Status.PASS),
        ("PXB", Status.PASS),
        ("0", Status.FAIL),
        ("LOC", Status.FAIL),
        ("nonsense", Status.FAIL),
    ],
)
def test_gdr_level_against_a_one_switch_topology(tmp_path, value, status):
    env = {} if value is None else {"NCCL_NET_GDR_LEVEL": value}
    assert run(hgx_node(tmp_path), env=env)["nccl.NCCL_NET_GDR_LEVEL"].status == status


def test_acs_redirect_on_switch_ports_fails_with_setpci(tmp_path):
    results = run(hgx_node(tmp_path, acs=0x1D))  # SrcValid ReqRedir CmpltRedir UpstreamFwd, as many BIOSes ship
    acs = results["pci.acs"]
    assert acs.status == Status.FAIL
    assert "0000:16:00.0 ReqRedir+ CmpltRedir+" in acs.observed
    assert "setpci -s 0000:16:00.0 ECAP_ACS+6.w=0000" in acs.fix
    assert "0000:15:01.0" not in acs.observed  # root ports are left alone


def test_acs_without_redirect_passes_and_unreadable_config_skips(tmp_path):
    assert run(hgx_node(tmp_path, acs=0x01))["pci.acs"].status == Status.PASS  # source validation only
    node = hgx_node(tmp_path / "short")
    for config in (node.sys / "devices").rglob("config"):
        config.write_bytes(bytes(64))  # what a non-root reader gets
    assert run(node)["pci.acs"].status == Status.SKIP


def test_translating_iommu_fails_and_passthrough_passes(tmp_path):
    results = run(hgx_node(tmp_path / "dma", gpu_iommu="DMA-FQ"))
    assert results["pci.iommu"].status == Status.FAIL
    assert "iommu=pt" in results["pci.iommu"].fix
    assert run(hgx_node(tmp_path / "pt", gpu_iommu="identity"))["pci.iommu"].status == Status.PASS


def test_dmabuf_counts_as_gpudirect_on_the_open_driver(tmp_path):
    node = hgx_node(tmp_path)
    node.modules("nvidia", "mlx5_ib")
    node.write(
        node.proc / "driver/nvidia/version", "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.133.20"
    )
    assert run(node)["gpudirect.rdma"].observed == "DMA-BUF: open GPU kernel module on Linux 6.8"
    node.sysctl("kernel.osrelease", "5.4.0-200-generic")
    assert run(node)["gpudirect.rdma"].status == Status.FAIL


def test_infiniband_ports_skip_the_roce_checks(tmp_path):
    node = Node(tmp_path)
    node.pci("pci0000:00", ["0000:00:01.0", "0000:01:00.0"])
    node.rdma("mlx5_0", "0000:01:00.0", link_layer="InfiniBand")
    results = run(node, qos=FakeQos())
    for check in ("roce.pfc", "roce.pfc_other_priorities", "roce.ecn", "roce.global_pause"):
        assert results[check].status == Status.SKIP
        assert "InfiniBand uses credit-based flow control" in results[check].observed
    assert results["rdma.port_state"].status == Status.PASS


def test_unreadable_pfc_and_missing_ecn_sysfs_skip_with_reasons(tmp_path):
    node = hgx_node(tmp_path)
    for i in range(8):
        for path in sorted((node.sys / "class/net" / f"eth{i}").rglob("*"), reverse=True):
            path.unlink() if path.is_file() else path.rmdir()
    results = run(node, qos=FakeQos())
    assert results["roce.pfc"].status == Status.SKIP
    assert "eth0: Operation not supported" in results["roce.pfc"].observed
    assert results["roce.ecn"].status == Status.SKIP
    assert results["roce.global_pause"].status == Status.SKIP


def test_bare_machine_skips_everything_with_a_reason(tmp_path):
    node = Node(tmp_path)
    results = run(node, nvml=FakeNvml([], library_present=False), qos=FakeQos(), env=None)
    assert {r.status for r in results.values()} == {Status.SKIP}
    assert all(r.observed for r in results.values())
    assert results["rdma.port_state"].observed == f"no RDMA devices under {node.sys}/class/infiniband"
    assert results["gpu.inventory"].observed.startswith("NVML unavailable")


class NvmlThatCannotCount(FakeNvml):
    """Initialises, then fails to enumerate: what a driver in a bad state does."""

    def nvmlDeviceGetCount(self):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)


def test_gpus_that_nvml_cannot_count_skip_with_the_reason(tmp_path):
    nvml = NvmlThatCannotCount([h100(i) for i in range(8)])
    results = run(hgx_node(tmp_path), nvml=nvml, qos=healthy_qos())
    assert results["gpu.inventory"].status == Status.SKIP
    assert results["gpu.inventory"].observed == "NVML could not count the GPUs: Unknown Error"
    assert not nvml.initialized  # shut down again


def test_nccl_checks_skip_without_a_job_environment(tmp_path):
    facts = facts_module.gather(
        PreflightSettings(),
        hgx_node(tmp_path).sys,
        tmp_path / "proc",
        nvml=FakeNvml([h100(i) for i in range(8)]),
        qos=healthy_qos(),
        nccl_env=None,
    )
    results = {r.check: r for r in preflight.run_checks(facts, PreflightSettings())}
    assert results["nccl.NCCL_IB_HCA"].status == Status.SKIP
    assert "--env-file" in results["nccl.NCCL_IB_HCA"].observed


@pytest.mark.parametrize(
    "spec,selected,unmatched",
    [
        ("mlx5", {"mlx5_0", "mlx5_1", "mlx5_10"}, []),
        ("=mlx5_1", {"mlx5_1"}, []),
        ("mlx5_1", {"mlx5_1", "mlx5_10"}, []),  # NCCL matches prefixes unless the list starts with =
        ("^mlx5_0", {"mlx5_1", "mlx5_10"}, []),
        ("^=mlx5_1:1", {"mlx5_0", "mlx5_10"}, []),
        ("mlx5_0:1,bnxt_re0", {"mlx5_0"}, ["bnxt_re0"]),
    ],
)
def test_nccl_ib_hca_selection(spec, selected, unmatched):
    assert preflight.hca_selection(spec, ["mlx5_0", "mlx5_1", "mlx5_10"]) == (selected, unmatched)


def test_env_file_forms(tmp_path):
    path = tmp_path / "job.env"
    path.write_text(
        '# the job\nexport NCCL_IB_HCA="=mlx5_0,mlx5_1"\nNCCL_NET_GDR_LEVEL=5 '
        "# guide\nNCCL_DEBUG='INFO'\n\nnot a line\n"
        'NCCL_SOCKET_IFNAME="eth0\n'
    )
    assert preflight.read_env_file(str(path)) == {
        "NCCL_IB_HCA": "=mlx5_0,mlx5_1",
        "NCCL_NET_GDR_LEVEL": "5",
        "NCCL_DEBUG": "INFO",
        "NCCL_SOCKET_IFNAME": '"eth0',
    }


def test_pci_address_from_nvml_bus_id():
    assert pci_address_from_nvml(b"00000000:2A:00.0") == "0000:2a:00.0"
    assert pci_address_from_nvml("00000001:DB:00.1") == "0001:db:00.1"


# --- the command: exit codes, JSON, table ---------------------------------------------------------------------------


def check_command(node, *extra, nvml=None, qos=None):
    args = build_parser().parse_args(["check", "--path.sysfs", str(node.sys), "--path.procfs", str(node.proc), *extra])
    out = io.StringIO()
    code = run_check(args, nvml=nvml or FakeNvml([h100(i) for i in range(8)]), qos=qos or healthy_qos(), out=out)
    return code, out.getvalue()


def test_exit_code_zero_on_pass_and_warn_one_on_fail(tmp_path, monkeypatch):
    for key in [k for k in os.environ if k.startswith("NCCL_")]:
        monkeypatch.delenv(key)
    node = hgx_node(tmp_path)
    assert check_command(node)[0] == 0
    assert check_command(node, nvml=FakeNvml([h100(i, persistence_mode=i != 1) for i in range(8)]))[0] == 0  # a WARN
    monkeypatch.setenv("NCCL_IB_DISABLE", "1")  # the current environment is the job's when no --env-file is given
    assert check_command(node)[0] == 1
    env_file = tmp_path / "job.env"
    env_file.write_text("NCCL_IB_DISABLE=0\n")
    assert check_command(node, "--env-file", str(env_file))[0] == 0


def test_json_output_schema(tmp_path):
    node = hgx_node(tmp_path)
    _small_rmem(node, {})
    code, out = check_command(node, "--json")
    document = json.loads(out)
    assert code == 1
    assert set(document) == {"ok", "summary", "results"}
    assert document["ok"] is False
    assert set(document["summary"]) == {"pass", "warn", "fail", "skip"}
    assert sum(document["summary"].values()) == len(document["results"]) == 23
    for result in document["results"]:
        assert set(result) == {"check", "status", "observed", "expected", "fix"}
        assert result["status"] in ("PASS", "WARN", "FAIL", "SKIP")
        assert all(isinstance(value, str) for value in result.values())
    failed = [r for r in document["results"] if r["status"] == "FAIL"]
    assert failed == [
        {
            "check": "net.core.rmem_max",
            "status": "FAIL",
            "observed": "4194304 (4 MiB)",
            "expected": "max ≥ 67108864 (64 MiB)",
            "fix": "sysctl -w net.core.rmem_max=67108864",
        }
    ]


def test_table_keeps_fix_commands_whole(tmp_path):
    node = hgx_node(tmp_path)
    _small_tcp_wmem(node, {})
    qos = healthy_qos()
    qos.pfc["eth2"] = set()
    code, out = check_command(node, "--env-file", os.devnull, qos=qos)
    lines = out.splitlines()
    assert code == 1
    assert lines[0].split() == ["CHECK", "STATUS", "OBSERVED", "EXPECTED", "FIX"]
    assert any(
        line.startswith("net.ipv4.tcp_wmem")
        and "FAIL" in line
        and line.endswith('sysctl -w net.ipv4.tcp_wmem="4096 16384 67108864"')
        for line in lines
    )
    assert any("roce.pfc" in line and line.endswith("dcb pfc set dev eth2 prio-pfc all:off 3:on") for line in lines)
    assert lines[-1] == "21 PASS, 0 WARN, 2 FAIL, 0 SKIP"


def test_config_thresholds_reach_the_command(tmp_path):
    node = hgx_node(tmp_path)
    config = tmp_path / "config.yaml"
    config.write_text("sources:\n  preflight:\n    roce_priority: 4\n    link_layer: Ethernet\n")
    code, out = check_command(node, "--config", str(config), "--json")
    results = {r["check"]: r for r in json.loads(out)["results"]}
    assert code == 1
    assert results["roce.pfc"]["expected"] == "PFC on priority 4"
    assert "4:on" in results["roce.pfc"]["fix"]


def test_bad_config_and_env_file_exit_two(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("sources:\n  preflight:\n    roce_priority: 9\n")
    node = Node(tmp_path / "node")
    with pytest.raises(ConfigError, match="sources.preflight.roce_priority: expected an 802.1p priority from 0 to 7"):
        check_command(node, "--config", str(config))
    with pytest.raises(ConfigError, match="a readable env file"):
        check_command(node, "--env-file", str(tmp_path / "missing.env"))
    latin1 = tmp_path / "latin1.env"
    latin1.write_bytes(b"NCCL_IB_HCA=mlx5_0\nNCCL_DEBUG=caf\xe9\n")
    with pytest.raises(ConfigError) as error:
        check_command(node, "--env-file", str(latin1))
    assert str(error.value) == f"{latin1}: expected a UTF-8 text file (byte 33 is not UTF-8)"


def test_command_line_runs_on_this_machine(tmp_path):
    """The real entry point, real NVML and kernel queries: on a machine without GPUs or RDMA every check SKIPs."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mfu_exporter",
            "check",
            "--json",
            "--path.sysfs",
            str(tmp_path),
            "--path.procfs",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    document = json.loads(result.stdout)
    assert result.returncode == 0, result.stderr
    assert {r["status"] for r in document["results"]} <= {"SKIP", "PASS"}
    bad = subprocess.run(
        [sys.executable, "-m", "mfu_exporter", "check", "--env-file", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2
    assert "a readable env file" in bad.stderr
    (tmp_path / "latin1.env").write_bytes(b"NCCL_DEBUG=caf\xe9\n")
    bad = subprocess.run(
        [sys.executable, "-m", "mfu_exporter", "check", "--env-file", str(tmp_path / "latin1.env")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (bad.returncode, bad.stderr) == (
        2,
        f"mfu-exporter: {tmp_path}/latin1.env: expected a UTF-8 text file (byte 14 is not UTF-8)\n",
    )


# --- the daemon source ------------------------------------------------------------------------------------------


def test_source_exports_check_ok_and_leaves_skips_out(tmp_path):
    node = hgx_node(tmp_path)
    _small_rmem(node, {})
    source = PreflightSource(
        PreflightSettings(),
        str(node.sys),
        str(node.proc),
        FakeNvml([h100(i) for i in range(8)]),
        qos=healthy_qos(),
        nccl_env_file=None,
    )
    snapshot = source.sample()
    family, warning = list(snapshot_families(snapshot))
    values = {s.labels["check"]: s.value for s in family.samples}
    assert (family.name, warning.name) == ("mfu_preflight_check_ok", "mfu_preflight_check_warning")
    assert {s.labels["check"] for s in warning.samples} == set(values)  # both series for each check that applies
    assert {s.value for s in warning.samples} == {0.0}
    assert values["net.core.rmem_max"] == 0.0
    assert values["rdma.port_state"] == 1.0
    assert "nccl.NCCL_IB_HCA" not in values  # SKIP: no job environment configured
    assert snapshot.status["ok"] is False
    assert snapshot.status["summary"]["fail"] == 1
    assert not snapshot.errors


def test_source_counts_an_unreadable_env_file(tmp_path):
    node = hgx_node(tmp_path)
    source = PreflightSource(
        PreflightSettings(),
        str(node.sys),
        str(node.proc),
        FakeNvml([h100(0)]),
        qos=healthy_qos(),
        nccl_env_file=str(tmp_path / "missing.env"),
    )
    assert source.sample().errors == {"nccl_env_file_unreadable": 1}


def test_source_counts_an_env_file_that_is_not_utf8(tmp_path):
    node = hgx_node(tmp_path)
    env_file = tmp_path / "latin1.env"
    env_file.write_bytes(b"NCCL_DEBUG=caf\xe9\n")
    source = PreflightSource(
        PreflightSettings(),
        str(node.sys),
        str(node.proc),
        FakeNvml([h100(0)]),
        qos=healthy_qos(),
        nccl_env_file=str(env_file),
    )
    snapshot = source.sample()
    assert snapshot.errors == {"nccl_env_file_unreadable": 1}
    assert snapshot.status["results"]  # the other checks still ran


def test_source_is_registered_with_config_defaults(tmp_path):
    config = defaults()
    assert config["sources"]["preflight"]["interval"] == 300.0
    ctx = SourceContext(config, Paths(str(tmp_path), str(tmp_path)))
    (source,) = [s for s in build_sources(config, ctx) if s.name == "preflight"]
    assert (source.interval, source.timeout) == (300.0, 30.0)
    off = validate({"sources": {"preflight": {"enabled": False}}})
    assert "preflight" not in [s.name for s in build_sources(off, SourceContext(off))]


async def test_metrics_endpoint_serves_preflight_results(tmp_path, make_client):
    node = hgx_node(tmp_path)
    source = PreflightSource(
        PreflightSettings(),
        str(node.sys),
        str(node.proc),
        FakeNvml([h100(i) for i in range(8)]),
        qos=healthy_qos(),
        interval=300.0,
        timeout=5.0,
    )
    client = await make_client(sources=[source])
    await client.service.scheduler.start()
    try:
        await client.service.scheduler.first_cycle_done.wait()
        body = await (await client.get("/metrics")).text()
    finally:
        await client.service.scheduler.stop()
    assert 'mfu_preflight_check_ok{check="roce.pfc"} 1.0' in body
    assert 'mfu_preflight_check_warning{check="roce.pfc"} 0.0' in body
    assert 'mfu_exporter_source_up{source="preflight"} 1.0' in body


# --- the kernel queries ---------------------------------------------------------------------------------------------


def ieee_reply(pfc_enabled: int, sequence: int = 7) -> bytes:
    pfc = struct.pack("=BBBxHxx16Q", 0xFF, pfc_enabled, 0, 0, *([0] * 16))
    ieee = struct.pack("=HH", 4 + len(pfc), nic_qos.DCB_ATTR_IEEE_PFC) + pfc
    name = b"eth0\0"
    attrs = struct.pack("=HH", 4 + len(name), nic_qos.DCB_ATTR_IFNAME) + name + b"\0" * 3
    attrs += struct.pack("=HH", 4 + len(ieee), nic_qos.DCB_ATTR_IEEE | 0x8000) + ieee
    body = struct.pack("=BBH", 0, nic_qos.DCB_CMD_IEEE_GET, 0) + attrs
    return struct.pack("=IHHII", 16 + len(body), nic_qos.RTM_GETDCB, 0, sequence, 0) + body


def test_dcbnl_reply_decoding():
    assert nic_qos.parse_ieee_reply(ieee_reply(0b00001000)) == frozenset({3})
    assert nic_qos.parse_ieee_reply(ieee_reply(0b00011000)) == frozenset({3, 4})
    assert nic_qos.parse_ieee_reply(ieee_reply(0)) == frozenset()
    error = struct.pack("=IHHIIi", 36, nic_qos.NLMSG_ERROR, 0, 7, 0, -errno.EOPNOTSUPP) + bytes(16)
    with pytest.raises(OSError) as caught:
        nic_qos.parse_ieee_reply(error)
    assert caught.value.errno == errno.EOPNOTSUPP


def test_dcbnl_request_encoding():
    message = nic_qos.build_ieee_get("eth0", 5)
    length, kind, flags, sequence, _ = struct.unpack_from("=IHHII", message)
    assert (length, kind, flags, sequence) == (len(message), 78, 1, 5)
    assert message[16:20] == bytes([socket.AF_UNSPEC, 21, 0, 0])
    assert message[20:] == struct.pack("=HH", 9, 1) + b"eth0\0" + b"\0" * 3


@pytest.mark.parametrize("interface", ["lo", "no-such-if0"])
def test_kernel_queries_agree_with_dcb_and_ethtool(interface):
    """The real netlink and ioctl paths against the running kernel, compared with iproute2's dcb and ethtool."""
    dcb = require_tool("dcb", "iproute2")
    ethtool = require_tool("ethtool", "ethtool")
    qos = nic_qos.KernelNicQos()
    with pytest.raises(OSError) as pfc_error:
        qos.pfc_priorities(interface)
    with pytest.raises(OSError) as pause_error:
        qos.global_pause(interface)
    dcb_run = subprocess.run([dcb, "pfc", "show", "dev", interface], capture_output=True, text=True, timeout=10)
    ethtool_run = subprocess.run([ethtool, "-a", interface], capture_output=True, text=True, timeout=10)
    assert dcb_run.returncode != 0 and ethtool_run.returncode != 0
    if interface == "lo":  # loopback has no DCB and no pause settings: both tools report EOPNOTSUPP, as do we
        assert pfc_error.value.errno == errno.EOPNOTSUPP and "Operation not supported" in dcb_run.stderr
        assert pause_error.value.errno == errno.EOPNOTSUPP and "Operation not supported" in ethtool_run.stderr
    else:
        assert pfc_error.value.errno in (errno.ENODEV, errno.EINVAL)
        assert pause_error.value.errno == errno.ENODEV


def test_preflight_falls_back_to_the_older_clock_reason_call_on_drivers_before_r535(tmp_path):
    # Drivers before R535 lack nvmlDeviceGetCurrentClocksEventReasons: pynvml raises FUNCTION_NOT_FOUND, which must
    # not turn every GPU into a lost one (the GPU source has the same fallback).
    gpus = [h100(i, clocks_event_reasons=0x1) for i in range(2)]
    for gpu in gpus:
        gpu.fail["nvmlDeviceGetCurrentClocksEventReasons"] = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    facts = facts_module.read_gpus(FakeNvml(gpus))
    assert [(g.lost, g.clocks_event_reasons) for g in facts.devices] == [(None, 0x1), (None, 0x1)]
