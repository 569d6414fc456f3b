"""A job's NCCL transport and named straggler through the logs source on real files, to the attribution's cause
and the families render/collectives.py makes of them."""

from __future__ import annotations

from mfu_exporter.config import typed_config, validate
from mfu_exporter.model.attribution import Attributor, NodeSignals
from mfu_exporter.model.evidence import SOCKET_FALLBACK
from mfu_exporter.model.job_view import JobView
from mfu_exporter.model.jobs import JobTracker
from mfu_exporter.model.readings import GpuInfo
from mfu_exporter.node.counters import Changes
from mfu_exporter.node.rdma import RdmaPort
from mfu_exporter.render.collectives import collective_families, log_families
from mfu_exporter.service import job_collectives
from mfu_exporter.sources.logs import LogsSample, LogsSource
from mfu_exporter.sources.rdma import PortReading
from tests.unit.logs import framework_lines as fl
from tests.unit.logs.fed import Fed

T0 = 1_787_300_000.0
# NCCL 2.21's INIT lines in the layout of src/transport/net_socket.cc, net_ib/init.cc and the channel setup
# (`host:pid:tid [dev] NCCL INFO ...`), here for a job whose IB devices were hidden from the container: synthetic.
NCCL_SOCKETS = [
    "node-a:4101:4180 [0] NCCL INFO NCCL_SOCKET_IFNAME set by environment to eth0",
    "node-a:4101:4180 [0] NCCL INFO NET/IB : No device found.",
    "node-a:4101:4180 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.11<0>",
    "node-a:4101:4180 [0] NCCL INFO Using network Socket",
    "node-a:4101:4180 [0] NCCL INFO Channel 00/0 : 7[7] -> 8[0] [send] via NET/Socket/0",
    "node-a:4101:4180 [0] NCCL INFO Channel 01/0 : 15[7] -> 0[0] [receive] via NET/Socket/0",
    "node-a:4101:4180 [0] NCCL INFO Channel 00 : 0[0] -> 1[1] via P2P/IPC",
]
NCCL_IB = [
    "node-a:4101:4180 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/RoCE [1]mlx5_1:1/RoCE ; OOB eth0:10.0.0.11<0>",
    "node-a:4101:4180 [0] NCCL INFO Using network IB",
    "node-a:4101:4180 [0] NCCL INFO Channel 00/0 : 7[7] -> 8[0] [send] via NET/IB/0/GDRDMA",
]
MEGATRON_STRAGGLER = (
    " 0: INFO:megatron.core.utils:[2024-03-14 23:07:56] | MnRtt/Rnk: 3453.08ms/8 | MxRtt/Rnk: 6468.20ms/13 | "
    "MnEtpt/Rnk: 148.50TF/13 | MxEtpt/Rnk: 297.32TF/8"
)


class Clock:
    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now


def sample_log(tmp_path, lines):
    path = tmp_path / "train.log"
    path.write_text("".join(line + "\n" for line in lines))
    clock = Clock(T0 + 100)
    config = validate({"sources": {"logs": {"files": [{"path": str(path), "job": "llm"}]}}, "jobs": {"llm": {}}})
    inventory = [GpuInfo(i, f"GPU-{i}", "NVIDIA H100 80GB HBM3") for i in range(8)]
    tracker = JobTracker(configured=config["jobs"], window=60.0, gpu_inventory=lambda: inventory, clock=clock)
    source = Fed(LogsSource(typed_config(config).sources.logs, config["jobs"], use_inotify=False, clock=clock), tracker)
    try:
        return source.sample()
    finally:
        source.close()


def active_port():
    port = RdmaPort("mlx5_0", 1, "Ethernet", "eth0", "ACTIVE", "LinkUp", "400 Gb/sec", 400.0, None, None, False, "")
    return {"mlx5_0/1": PortReading(port, {}, {}, Changes(elapsed=1.0), Changes(elapsed=1.0))}


def job_view(name="llm"):
    return JobView(
        name=name,
        tokens_total=1e6,
        step=1,
        last_report_time=0,
        tokens_per_second=1000.0,
        flops_per_token=1e12,
        gpus=8,
        peak_flops=8e15,
        mfu=0.2,
        eta_seconds=None,
        reason=None,
        facts={"expected_mfu": 0.45},
        restarts=0,
        gpu_indices=list(range(8)),
    )


def families(logs, rdma_active=True):
    """The families of the logs source's snapshot and those the service joins with the RDMA ports."""
    made = [*log_families(LogsSample(logs)), *collective_families(logs, {}, rdma_active)]
    return {f.name: {tuple(s.labels.values()): s.value for s in f.samples} for f in made}


def test_sockets_in_the_log_make_the_cause_network_with_that_evidence(tmp_path):
    lines = [fl.megatron_iteration(T0, 10, 1000, 2560, 5.0, 300.0, 1e-4, 256, 2.3), *NCCL_SOCKETS]
    snapshot = sample_log(tmp_path, lines)
    found = snapshot.readings.collectives["llm"]
    assert found.transport.transport == "socket" and found.transport.fell_back_to_socket
    signals = NodeSignals(ports=active_port(), collectives=job_collectives(snapshot.readings.collectives, {}))
    attributor = Attributor()
    attributor.evaluate(1.0, [job_view()], signals)  # one evaluation: the first poll after the lines were read
    verdict = attributor.verdict("llm")
    assert verdict.cause == "network" and verdict.evidence.startswith(SOCKET_FALLBACK)
    assert "via NET/Socket/0" in verdict.evidence
    exported = families(snapshot.readings.collectives)
    assert exported["mfu_job_nccl_transport_info"] == {("llm", "socket", "false"): 1.0}
    assert exported["mfu_job_nccl_socket_fallback"] == {("llm",): 1.0}
    assert families(snapshot.readings.collectives, rdma_active=False)["mfu_job_nccl_socket_fallback"] == {("llm",): 0.0}


def test_rdma_in_the_log_is_no_fallback(tmp_path):
    snapshot = sample_log(tmp_path, NCCL_IB)
    exported = families(snapshot.readings.collectives)
    assert exported["mfu_job_nccl_transport_info"] == {("llm", "roce", "true"): 1.0}
    assert exported["mfu_job_nccl_socket_fallback"] == {("llm",): 0.0}
    signals = NodeSignals(ports=active_port(), collectives=job_collectives(snapshot.readings.collectives, {}))
    attributor = Attributor()
    attributor.evaluate(1.0, [job_view()], signals)
    assert attributor.verdict("llm").cause == "unknown"


def test_a_straggler_the_job_names_is_its_cause(tmp_path):
    snapshot = sample_log(tmp_path, [MEGATRON_STRAGGLER])
    signals = NodeSignals(collectives=job_collectives(snapshot.readings.collectives, {}))
    attributor = Attributor()
    attributor.evaluate(1.0, [job_view()], signals)
    verdict = attributor.verdict("llm")
    assert verdict.cause == "straggler" and "rank 13 is slowest" in verdict.evidence
    assert families(snapshot.readings.collectives)["mfu_job_straggler"] == {("llm", "megatron"): 1.0}


def test_a_log_without_nccl_lines_adds_nothing(tmp_path):
    snapshot = sample_log(tmp_path, [fl.megatron_iteration(T0, 10, 1000, 2560, 5.0, 300.0, 1e-4, 256, 2.3)])
    assert snapshot.readings.collectives == {} and families(snapshot.readings.collectives) == {}


# FlagScale's report (flagscale/runner/straggler/report.py to_text) under torchrun's prefix, and Composer's
# GlobalStragglerDetector through the console logger: synthetic values in their layouts.
FLAGSCALE_REPORT = [
    "[default0]:=== Straggler Report at Step 20 ===",
    "[default0]:",
    "[default0]:⚠️  Detected Stragglers: [3]",
    "[default0]:  - Rank 3 (node-b)",
    "[default0]:",
    "[default0]:GPU Performance Scores (higher=faster):",
    "[default0]:  Rank 0 (node-a): 2.9138",
    "[default0]:  Rank 3 (node-b): 1.4569",
]
COMPOSER = ["\t Train MinThroughput/Rank: 60.00TF/3", "\t Train MaxThroughput/Rank: 129.54TF/2"]


def test_a_straggler_flagscale_or_composer_names_reaches_the_cause_and_its_series(tmp_path):
    for lines, source, evidence in (
        (FLAGSCALE_REPORT, "flagscale", "rank 3 on node node-b is a straggler at 0.50 of the fastest"),
        (COMPOSER, "composer", "rank 3 is slowest (60 TFLOP/s against rank 2's 129.54)"),
    ):
        directory = tmp_path / source
        directory.mkdir()
        snapshot = sample_log(directory, lines)
        signals = NodeSignals(collectives=job_collectives(snapshot.readings.collectives, {}))
        attributor = Attributor()
        attributor.evaluate(1.0, [job_view()], signals)
        verdict = attributor.verdict("llm")
        assert verdict.cause == "straggler" and evidence in verdict.evidence
        assert families(snapshot.readings.collectives)["mfu_job_straggler"] == {("llm", source): 1.0}
