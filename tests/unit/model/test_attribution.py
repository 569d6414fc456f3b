"""Loss attribution with the real sources' snapshot shapes: one test per cause, and overlaps resolved by precedence.

tests/e2e/test_attribution_sources.py drives the same through the real sources over the fakes."""

import functools

import pytest

from exporter.model.attribution import CAUSES, Attributor, NodeSignals, Thresholds
from exporter.model.datawait import DataWaitView
from exporter.model.job_view import JobView
from exporter.model.readings import GpuReading, JobCollectives
from exporter.node.counters import Changes
from exporter.node.pci import nearest_devices
from exporter.node.rdma import RdmaPort, discover_ports
from exporter.render.attribution import attribution_families
from exporter.sim.nvml import h100
from exporter.sources.ethtool import InterfaceReading
from exporter.sources.rdma import PortReading
from exporter.sources.storage import MountReading
from tests.support.nodes import hgx_node


def job(mfu=0.2, rate=1000.0, expected=0.45, gpus=8, indices=tuple(range(8)), name="llama"):
    return JobView(
        name=name,
        tokens_total=1e6,
        step=1,
        last_report_time=0,
        tokens_per_second=rate,
        flops_per_token=1e12,
        gpus=gpus,
        peak_flops=8e15,
        mfu=mfu,
        eta_seconds=None,
        reason=None,
        facts={"expected_mfu": expected},
        restarts=0,
        gpu_indices=list(indices),
    )


def gpu(index, **readings):
    """A GPU source reading: busy, cool, not throttled, at the bus ID of the fake NVML's H100 of that index."""
    figures = {"utilization": 0.95, "temperature": 65.0, **readings}
    figures["throttle_reasons"] = tuple(figures.get("throttle_reasons", ()))
    return GpuReading(index, f"GPU-{index}", h100(index).name, h100(index).pci_bus_id, **figures)


def healthy_gpus(**overrides):
    gpus = {i: gpu(i) for i in range(8)}
    for index, readings in overrides.items():
        gpus[int(index)] = gpu(int(index), **readings)
    return gpus


def nic(name, rdma_ports=(), **deltas):
    """An ethtool reading whose stats grew by ``deltas`` over one second (pause durations in µs, as mlx5 counts)."""
    return InterfaceReading(
        interface=name,
        rdma_ports=rdma_ports,
        stats=dict.fromkeys(deltas, 0),
        changes=Changes(elapsed=1.0, deltas=deltas),
    )


def port(key, **deltas):
    device, number = key.split("/")
    info = RdmaPort(
        device=device,
        port=int(number),
        link_layer="Ethernet",
        netdev=f"eth-{device}",
        state="ACTIVE",
        physical_state="LinkUp",
        rate="400 Gb/sec",
        rate_gbps=400.0,
        pci_address=None,
        numa_node=None,
        virtual_function=False,
        path="",
    )
    return PortReading(
        port=info,
        counters={},
        hw_counters={},
        counter_changes=Changes(elapsed=1.0),
        hw_counter_changes=Changes(elapsed=1.0, deltas=deltas),
    )


def verdict(view, signals, limits=Thresholds()):
    attributor = Attributor(limits)
    attributor.evaluate(100.0, [view], signals)
    attributor.evaluate(101.0, [view], signals)
    return attributor, attributor.verdict(view.name)


@pytest.mark.parametrize(
    "signals,cause,evidence",
    [
        (NodeSignals(gpus=healthy_gpus(**{"3": {"up": False}})), "gpu_lost", "GPU 3 (GPU-3) is off the bus"),
        (
            NodeSignals(
                gpus=healthy_gpus(), checkpoint=lambda job: {"in_progress": "step-12000", "elapsed_seconds": 300}
            ),
            "checkpoint",
            "checkpoint step-12000 writing for 300s",
        ),
        (
            NodeSignals(
                gpus=healthy_gpus(),
                interfaces={
                    "ens3np0": nic("ens3np0", rx_prio3_pause_duration=450_000, tx_prio3_pause_duration=100_000)
                },
            ),
            "network",
            "ens3np0 paused 45% of the time on priority 3 (the switch paused it)",
        ),
        (
            NodeSignals(gpus=healthy_gpus(), interfaces={"ens3np0": nic("ens3np0", tx_pause_storm_warning_events=2)}),
            "network",
            "ens3np0: pause storm events (warning 2)",
        ),
        (
            NodeSignals(gpus=healthy_gpus(), ports={"mlx5_2/1": port("mlx5_2/1", local_ack_timeout_err=7)}),
            "network",
            "mlx5_2/1 (eth-mlx5_2): local_ack_timeout_err +7",
        ),
        (
            NodeSignals(
                gpus=healthy_gpus(), ports={"mlx5_2/1": port("mlx5_2/1", np_cnp_sent=25_000, rp_cnp_handled=25_000)}
            ),
            "network",
            "50,000 CNPs/s",
        ),
        (
            NodeSignals(gpus=healthy_gpus(**{"5": {"throttle_reasons": ["hw_thermal_slowdown"], "temperature": 91.0}})),
            "thermal",
            "GPU 5 throttled: hw_thermal_slowdown at 91 °C",
        ),
        (
            NodeSignals(gpus=healthy_gpus(**{"1": {"throttle_reasons": ["sw_power_cap"]}})),
            "power",
            "GPU 1 throttled: sw_power_cap",
        ),
        (
            NodeSignals(
                gpus=healthy_gpus(),
                ports={"mlx5_0/1": port("mlx5_0/1")},
                collectives={"llama": JobCollectives("socket", True, "Channel 00/0 : 0[0] -> 8[0] via NET/Socket/0")},
            ),
            "network",
            "NCCL uses sockets, not RDMA: the job's inter-node traffic is on TCP while mlx5_0/1 is active; Channel 00/0",
        ),
        (
            NodeSignals(
                gpus=healthy_gpus(), collectives={"llama": JobCollectives(straggler="node-b GPU 3 is slowest")}
            ),
            "straggler",
            "node-b GPU 3 is slowest",
        ),
        (NodeSignals(gpus={i: gpu(i, utilization=0.2) for i in range(8)}), "idle", "GPUs 20% busy"),
        (NodeSignals(gpus=healthy_gpus()), "unknown", "no sampled signal explains it"),
    ],
)
def test_each_cause_with_its_evidence(signals, cause, evidence):
    _, found = verdict(job(), signals)
    assert found.cause == cause
    assert evidence in found.evidence
    assert found.lost_fraction == pytest.approx((0.45 - 0.2) / 0.45)


def waiting(ratio, source="client", **kw):
    view = job(**kw)
    view.data_wait = DataWaitView(gpu_seconds=100.0, rank_seconds=12.5, ratio=ratio, source=source)
    return view


def test_input_when_the_job_says_it_waits_for_its_batches_with_the_wait_and_the_mounts_as_evidence():
    """GPUs busy between waits (utilization 95 %): the old leftover could never say input; the wait does."""
    mounts = (
        MountReading("/data", "nfs4", "srv:/datasets", "mountstats", 10, 1, 0.1, 2.1e6, (("llama", "data"),)),
        MountReading("/ckpt", "nfs4", "srv:/ckpt", "mountstats", 10, 1, 0.1, 9e9, (("llama", "checkpoint"),)),
        MountReading("/other", "ext4", "/dev/nvme1n1", "diskstats", 10, 1, 0.1, 5e8, (("bert", "data"),)),
    )
    signals = NodeSignals(gpus=healthy_gpus(), mounts=mounts)
    _, found = verdict(waiting(0.3, "log:megatron"), signals)
    assert found.cause == "input"
    assert found.evidence == (
        "waiting for its next batch 30% of wall time (its megatron log's data-loading timer), over the 10% line; "
        "dataset mount /data (nfs4 srv:/datasets) reads 2.1 MB/s"
    )
    _, found = verdict(waiting(0.3), NodeSignals(gpus=healthy_gpus()))
    assert (
        found.evidence
        == "waiting for its next batch 30% of wall time (its client's data_wait_seconds), over the 10% line"
    )


def test_a_wait_under_the_line_is_not_input_and_idle_gpus_without_a_figure_are_idle_not_input():
    idle = NodeSignals(gpus={i: gpu(i, utilization=0.2) for i in range(8)})
    assert verdict(waiting(0.05), NodeSignals(gpus=healthy_gpus()))[1].cause == "unknown"
    assert verdict(waiting(0.05), idle)[1].evidence == "GPUs 20% busy on average, no sampled signal explains it"
    _, found = verdict(job(), idle)
    assert found.cause == "idle" and "report data_wait_seconds" in found.evidence
    # The threshold is the config's attribution.input_wait_ratio.
    assert (
        verdict(waiting(0.05), NodeSignals(gpus=healthy_gpus()), Thresholds(input_wait_ratio=0.04))[1].cause == "input"
    )


def test_input_comes_after_stalled_and_the_hardware_causes():
    throttled = NodeSignals(gpus=healthy_gpus(**{"1": {"throttle_reasons": ["sw_power_cap"]}}))
    assert verdict(waiting(0.5), throttled)[1].cause == "power"
    assert verdict(waiting(0.5, mfu=0.0, rate=0.0), NodeSignals(gpus=healthy_gpus()))[1].cause == "stalled"


def test_stalled_when_no_progress_and_nothing_else():
    _, found = verdict(job(mfu=0.0, rate=0.0), NodeSignals(gpus=healthy_gpus()))
    assert found.cause == "stalled"


def test_overlapping_causes_resolve_by_precedence():
    everything = NodeSignals(
        gpus=healthy_gpus(**{"3": {"up": False}, "5": {"throttle_reasons": ["hw_thermal_slowdown"]}}),
        interfaces={"ens3np0": nic("ens3np0", rx_prio3_pause_duration=500_000)},
        checkpoint=lambda job: {"in_progress": "step-1", "elapsed_seconds": 1},
    )
    assert verdict(job(), everything)[1].cause == "gpu_lost"
    everything.gpus[3] = gpu(3)
    assert verdict(job(), everything)[1].cause == "checkpoint"
    everything.checkpoint = lambda job: None
    assert verdict(job(), everything)[1].cause == "network"
    everything.interfaces = {}
    everything.ports = {"mlx5_0/1": port("mlx5_0/1")}
    everything.collectives = {"llama": JobCollectives("socket", True, straggler="rank 9 is slowest")}
    assert verdict(job(), everything)[1].cause == "network"  # NCCL on sockets: the fabric is why ranks wait
    everything.collectives = {"llama": JobCollectives(straggler="rank 9 is slowest")}
    assert verdict(job(mfu=0.0, rate=0.0), everything)[1].cause == "thermal"  # a throttled GPU explains a stall
    everything.gpus[5] = gpu(5, throttle_reasons=["sw_power_cap"])
    assert verdict(job(), everything)[1].cause == "power"  # the hardware reason a rank is slow, before its name
    everything.gpus[5] = gpu(5)
    assert verdict(job(), everything)[1].cause == "straggler"
    assert (
        verdict(job(mfu=0.0, rate=0.0), everything)[1].cause == "straggler"
    )  # a straggling job still waits on one rank
    everything.collectives = {}
    assert verdict(job(mfu=0.0, rate=0.0), everything)[1].cause == "stalled"


def test_sockets_on_a_node_without_an_active_rdma_port_are_no_fallback():
    """A node whose RDMA ports are down or absent has only sockets: NCCL on TCP there is no choice it made."""
    collectives = {"llama": JobCollectives("socket", True, "via NET/Socket/0")}
    down = port("mlx5_0/1")
    down = type(down)(
        port=type(down.port)(**{**down.port.__dict__, "state": "DOWN"}),
        counters={},
        hw_counters={},
        counter_changes=down.counter_changes,
        hw_counter_changes=down.hw_counter_changes,
    )
    for ports in ({}, {"mlx5_0/1": down}):
        found = verdict(job(), NodeSignals(gpus=healthy_gpus(), ports=ports, collectives=collectives))[1]
        assert found.cause == "unknown", ports


def test_only_the_jobs_gpus_count():
    signals = NodeSignals(gpus=healthy_gpus(**{"7": {"up": False}}))
    assert verdict(job(gpus=4, indices=(0, 1, 2, 3)), signals)[1].cause == "unknown"


def test_a_job_watches_the_nics_on_its_gpus_pcie_switches(tmp_path):
    """On an HGX node each GPU shares a PCIe switch with one NIC: GPU 2's NIC, on the NUMA node of GPUs 0 and 1 too,
    pausing is not the network of a job on GPUs 0 and 1."""
    node = hgx_node(tmp_path)
    ports = {
        p.key: PortReading(p, {}, {}, Changes(elapsed=1.0), Changes(elapsed=1.0)) for p in discover_ports(str(node.sys))
    }
    signals = NodeSignals(
        gpus=healthy_gpus(),
        ports=ports,
        nearest_nics=functools.partial(nearest_devices, str(node.sys)),
        interfaces={"eth2": nic("eth2", rdma_ports=("mlx5_2/1",), rx_prio3_pause_duration=450_000)},
    )
    assert verdict(job(gpus=2, indices=(0, 1)), signals)[1].cause == "unknown"
    found = verdict(job(gpus=2, indices=(2, 3)), signals)[1]
    assert found.cause == "network"
    assert (
        found.evidence
        == "eth2 paused 45% of the time on priority 3 (the switch paused it); nearest NIC of the job's GPU 2"
    )


def test_healthy_job_is_none_and_loses_nothing():
    attributor, found = verdict(job(mfu=0.43), NodeSignals(gpus=healthy_gpus(**{"3": {"up": False}})))
    assert found.cause == "none"
    lost = {m.name: m for m in attribution_families(attributor.standings())}["mfu_job_lost_gpu_seconds"]
    assert all(sample.value == 0 for sample in lost.samples)


def test_lost_gpu_seconds_integrate_the_gap_by_cause():
    attributor = Attributor()
    signals = NodeSignals(gpus=healthy_gpus(**{"5": {"throttle_reasons": ["hw_thermal_slowdown"]}}))
    view = job(mfu=0.30)
    for second in range(11):
        attributor.evaluate(1000.0 + second, [view], signals)
    families = {m.name: m for m in attribution_families(attributor.standings())}
    lost = {
        s.labels["cause"]: s.value for s in families["mfu_job_lost_gpu_seconds"].samples if s.name.endswith("_total")
    }
    assert lost["thermal"] == pytest.approx(8 * (0.45 - 0.30) / 0.45 * 10)
    assert sum(v for c, v in lost.items() if c != "thermal") == 0
    bottleneck = {s.labels["cause"]: s.value for s in families["mfu_job_bottleneck"].samples}
    assert set(bottleneck) == set(CAUSES) and bottleneck["thermal"] == 1 and sum(bottleneck.values()) == 1
    assert families["mfu_job_baseline_mfu_ratio"].samples[0].value == 0.45


def test_baseline_learned_from_recent_windows_without_expected_mfu():
    limits = Thresholds(baseline_min_samples=5, baseline_interval=1.0)
    attributor = Attributor(limits)
    signals = NodeSignals(gpus=healthy_gpus())
    for second, mfu in enumerate([0.44, 0.46, 0.45, 0.47, 0.43, 0.45]):
        attributor.evaluate(float(second), [job(mfu=mfu, expected=None)], signals)
    assert attributor.verdict("llama").cause == "none"
    attributor.evaluate(10.0, [job(mfu=0.2, expected=None)], signals)
    found = attributor.verdict("llama")
    assert found.baseline == pytest.approx(0.47) and found.cause == "unknown"


def test_job_without_mfu_has_no_verdict_and_gone_jobs_are_forgotten():
    attributor = Attributor()
    attributor.evaluate(0.0, [job(mfu=None)], NodeSignals())
    assert attributor.verdict("llama") is None
    attributor.evaluate(1.0, [], NodeSignals())
    assert list(attribution_families(attributor.standings()))[0].samples == []
