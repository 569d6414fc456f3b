"""Loss attribution with the real sources' snapshot shapes: one test per cause, and overlaps resolved by precedence.

tests/e2e/test_attribution_sources.py drives the same through the real sources over the fakes."""

import functools

import pytest

from mfu_exporter.model.attribution import CAUSES, Attributor, NodeSignals, Thresholds
from mfu_exporter.model.datawait import DataWaitView
from mfu_exporter.model.job_view import JobView
from mfu_exporter.model.readings import GpuReading, JobCollectives
from mfu_exporter.node.counters import Changes
from mfu_exporter.node.pci import nearest_devices
from mfu_exporter.node.rdma import RdmaPort, discover_ports
from mfu_exporter.render.attribution import attribution_families
from mfu_exporter.sim.nvml import h100
from mfu_exporter.sources.ethtool import InterfaceReading
from mfu_exporter.sources.rdma import PortReading
from mfu_exporter.sources.storage import MountReading
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
        cadence_seconds=1.0,  # a report a second, as the job model learns it: stalled after 3 s of silence
        window_seconds=15.0,
        stall_after_seconds=3.0,
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


def test_input_from_the_recent_share_before_the_windows_share_crosses_the_line():
    """A loader that starts waiting now: over the MFU window the share is still under the line, over the last
    seconds it is over it; the cause shows at once, with the recent figure as its evidence."""
    view = job()
    view.data_wait = DataWaitView(100.0, 12.5, ratio=0.06, source="client", recent_ratio=0.4)
    _, found = verdict(view, NodeSignals(gpus=healthy_gpus()))
    assert found.cause == "input"
    assert found.evidence.startswith("waiting for its next batch 40% of wall time")
    view.data_wait = DataWaitView(100.0, 12.5, ratio=0.06, source="client", recent_ratio=0.05)
    assert verdict(view, NodeSignals(gpus=healthy_gpus()))[1].cause == "unknown"


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
    hot = NodeSignals(gpus=healthy_gpus(**{"3": {"throttle_reasons": ["hw_thermal_slowdown"]}}))
    attributor, found = verdict(job(mfu=0.43), hot)
    assert found.cause == "none"
    lost = {m.name: m for m in attribution_families(attributor.standings())}["mfu_job_lost_gpu_seconds"]
    assert all(sample.value == 0 for sample in lost.samples)


def test_a_lost_gpu_is_the_jobs_cause_at_once_but_loses_only_what_its_mfu_shows():
    """A job's GPU off the bus stops it: gpu_lost before its windowed MFU moves, with nothing booked until it does."""
    attributor, found = verdict(job(mfu=0.45), NodeSignals(gpus=healthy_gpus(**{"3": {"up": False}})))
    assert found.cause == "gpu_lost"
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


@pytest.mark.parametrize("interval", [1.0, 5.0])
def test_a_tick_at_its_interval_books_the_gap_and_a_stopped_exporter_books_none(interval):
    """Evaluations a tick's interval apart, each a little late as on a busy loop, book the job's gap to its cause;
    evaluations more than two intervals (and 5 s) apart mean the exporter did not run: that time is unobserved."""
    attributor = Attributor(interval=interval)
    signals = NodeSignals(gpus=healthy_gpus(**{"5": {"throttle_reasons": ["hw_thermal_slowdown"]}}))
    view = job(mfu=0.30)
    now = 1000.0
    for _ in range(11):
        attributor.evaluate(now, [view], signals)
        now += interval * 1.04
    booked = 8 * (0.45 - 0.30) / 0.45 * 10 * interval * 1.04
    assert attributor.unobserved_seconds == 0
    lost = {m.name: m for m in attribution_families(attributor.standings())}["mfu_job_lost_gpu_seconds"]
    thermal = next(s.value for s in lost.samples if s.name.endswith("_total") and s.labels["cause"] == "thermal")
    assert thermal == pytest.approx(booked)
    stopped = now - interval * 1.04 + max(5.0, 2 * interval) + 1.0
    attributor.evaluate(stopped, [view], signals)
    assert attributor.unobserved_seconds == pytest.approx(max(5.0, 2 * interval) + 1.0)


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


# --- on time and to the second -----------------------------------------------------------------------------------

PER_TOKEN, PEAK, HEALTHY_RATE = 1e12, 8e15, 0.45 * 8e15 / 1e12  # the rate at which job() runs at its 45 % baseline


def reporting(mfu=0.45, at=0.0, tokens=0.0, **fields):
    """``job()`` as the job model shows it after a report at ``at`` with ``tokens`` processed: its window MFU is
    ``mfu`` (the window, a rate over the last 15 s, moves late; the reports themselves say what happens now)."""
    view = job(mfu=mfu, rate=mfu * PEAK / PER_TOKEN, **fields)
    view.last_report_time, view.tokens_processed = at, tokens
    return view


def run(attributor, signals_at, rates, window_mfu, start=0.0):
    """Evaluate once a second from ``start``, the job reporting each second at ``rates(t)`` × the healthy rate, its
    window MFU ``window_mfu(t)``, the node's signals ``signals_at(t)``; returns the verdicts by second."""
    tokens, verdicts = 0.0, {}
    for second in range(int(start), int(start) + len(rates)):
        tokens += rates[second - int(start)] * HEALTHY_RATE
        attributor.evaluate(float(second), [reporting(window_mfu(second), second, tokens)], signals_at(second))
        verdicts[second] = attributor.verdict("llama")
    return verdicts


def lost_by_cause(attributor):
    lost = {m.name: m for m in attribution_families(attributor.standings())}["mfu_job_lost_gpu_seconds"]
    return {s.labels["cause"]: s.value for s in lost.samples if s.name.endswith("_total")}


HOT = NodeSignals(gpus=healthy_gpus(**{"5": {"throttle_reasons": ["hw_thermal_slowdown"]}}))
COOL = NodeSignals(gpus=healthy_gpus())


def test_a_cause_shows_with_its_signal_and_the_recent_progress_not_a_window_later():
    """Heat from second 10 slows the job to 60 %: the window's MFU (15 s) still shows 45 % at second 11, yet the
    reports since say the job is slow and GPU 5 throttles: thermal at once, with when it began."""
    attributor = Attributor(Thresholds(), window=15.0)
    rates = [1.0] * 10 + [0.6] * 5
    verdicts = run(attributor, lambda t: HOT if t >= 10 else COOL, rates, lambda t: 0.45)
    assert verdicts[9].cause == "none"
    assert verdicts[10].cause == "thermal" and verdicts[10].since == 10.0
    assert verdicts[14].cause == "thermal" and verdicts[14].since == 10.0


def test_a_cleared_cause_keeps_the_seconds_its_window_still_shows():
    """Heat from second 10 to 40; the window's MFU falls late and recovers late (a window after the heat ends). The
    seconds it shows below the baseline after second 40 are the heat's, until the window no longer holds any of it:
    then a gap with no signal is unknown again."""
    attributor = Attributor(Thresholds(), window=15.0)

    def window_mfu(t):  # the 15 s window's MFU of a job at 45 % that runs at 60 % of it from 10 to 40
        slow = max(0.0, min(t, 40) - max(t - 15, 10))
        return 0.45 * (1 - 0.4 * slow / 15)

    rates = [1.0] * 10 + [0.6] * 30 + [1.0] * 20
    verdicts = run(attributor, lambda t: HOT if 10 <= t < 40 else COOL, rates, window_mfu)
    assert {verdicts[t].cause for t in range(10, 52)} == {"thermal"}
    # From 52 the window's gap is within the tolerance: none shows, while its seconds still go to the heat; at 55 the
    # window is whole again.
    assert {verdicts[t].cause for t in range(52, 60)} == {"none"}
    assert "(cleared 11 s ago; the 15 s MFU window still holds its slow seconds)" in verdicts[50].evidence
    lost = lost_by_cause(attributor)
    expected = sum(8 * (0.45 - window_mfu(t)) / 0.45 for t in range(11, 60))
    assert lost["thermal"] == pytest.approx(expected)
    assert sum(v for cause, v in lost.items() if cause != "thermal") == 0
    # A gap a window and more after the heat, with no signal: no longer the heat's.
    attributor.evaluate(75.0, [reporting(0.30, 75.0, 1e9)], COOL)
    assert attributor.verdict("llama").cause == "unknown"


def test_a_job_whose_reports_stop_with_a_lost_gpu_is_gpu_lost_at_once():
    """GPU 3 falls off the bus at second 10 and the job's reports stop: a GPU off the bus is enough, though the
    window's MFU still shows the rate before the stop."""
    attributor = Attributor(Thresholds(), window=15.0)
    lost_gpu = NodeSignals(gpus=healthy_gpus(**{"3": {"up": False}}))
    tokens = 0.0
    for second in range(10):
        tokens += HEALTHY_RATE
        attributor.evaluate(float(second), [reporting(0.45, second, tokens)], COOL)
    for second in range(10, 13):  # no report after second 9
        attributor.evaluate(float(second), [reporting(0.45, 9.0, tokens)], lost_gpu)
    assert attributor.verdict("llama").cause == "gpu_lost"
    assert attributor.verdict("llama").since <= 11.0
    stopped = Attributor(Thresholds(), window=15.0)
    tokens = 0.0
    for second in range(10):
        tokens += HEALTHY_RATE
        stopped.evaluate(float(second), [reporting(0.45, second, tokens)], COOL)
    for second in range(10, 13):
        stopped.evaluate(float(second), [reporting(0.45, 9.0, tokens)], COOL)
    assert stopped.verdict("llama").cause == "none"  # within three of its intervals: a report may still come
    stopped.evaluate(13.0, [reporting(0.45, 9.0, tokens)], COOL)
    assert stopped.verdict("llama").cause == "stalled"  # and with nothing else seen: no progress
    assert "no progress report since one was due" in stopped.verdict("llama").evidence


def test_a_cause_held_over_still_yields_to_a_signal_of_higher_precedence():
    attributor = Attributor(Thresholds(), window=15.0)
    checkpoint = NodeSignals(
        gpus=healthy_gpus(), checkpoint=lambda job: {"in_progress": "step-9", "elapsed_seconds": 3}
    )
    rates = [1.0] * 5 + [0.5] * 10 + [0.5] * 5
    verdicts = run(attributor, lambda t: HOT if t < 15 else checkpoint, rates, lambda t: 0.30, start=0)
    assert verdicts[14].cause == "thermal"
    assert verdicts[16].cause == "checkpoint"  # a checkpoint outranks heat, held or seen


def test_a_gap_explained_within_the_window_is_the_causes_not_unknown():
    """A job slows at second 10 and its cause (a straggler named by NCCL Inspector, here heat) is seen only at
    second 14: the seconds booked meanwhile go to it. A gap no cause explains within the window is unknown."""
    attributor = Attributor(Thresholds(), window=15.0)
    rates = [1.0] * 10 + [0.5] * 10
    run(attributor, lambda t: HOT if t >= 14 else COOL, rates, lambda t: 0.45 if t < 10 else 0.30)
    lost = lost_by_cause(attributor)
    assert lost["unknown"] == 0 and lost["thermal"] == pytest.approx(8 * (0.45 - 0.30) / 0.45 * 10)
    never = Attributor(Thresholds(), window=15.0)
    run(never, lambda t: COOL, [1.0] * 10 + [0.5] * 30, lambda t: 0.45 if t < 10 else 0.30)
    assert lost_by_cause(never)["unknown"] > 0


def test_a_learned_baseline_learns_only_from_health_and_holds_through_an_incident():
    """No expected_mfu: 20 s healthy at 54 %, then a throttle to 26 % for five minutes. The baseline is frozen while
    the cause lasts, so the incident never becomes the job's healthy figure."""
    attributor = Attributor(Thresholds(baseline_interval=1.0, baseline_min_samples=10), window=15.0)
    tokens = 0.0
    for second in range(20):
        tokens += HEALTHY_RATE * 0.54 / 0.45
        view = reporting(0.54, second, tokens)
        view.facts = {}
        attributor.evaluate(float(second), [view], COOL)
    assert attributor.verdict("llama").baseline == pytest.approx(0.54)
    for second in range(20, 320):
        tokens += HEALTHY_RATE * 0.26 / 0.45
        view = reporting(0.26, second, tokens)
        view.facts = {}
        attributor.evaluate(float(second), [view], HOT)
    verdict = attributor.verdict("llama")
    assert verdict.cause == "thermal" and verdict.baseline == pytest.approx(0.54)
    assert "healthy samples" in verdict.baseline_from
    assert attributor.verdict("llama").as_json()["baseline_from"] == verdict.baseline_from
