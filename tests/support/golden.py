"""The golden exposition: the benchmarks' full node (bench/fixture.py) as its first scrape sees it, byte for byte.

What is rendered: eight H100s on the fake NVML, eight ConnectX-7 RoCE ports and their ``ethtool -S`` texts, every
source the service registers (each sampled exactly once), the fixture's four jobs with two progress reports each,
one checkpoint write per job, and one tick of the job evaluation (attribution). The body is the one a scrape gets
(``Service.metrics``, text format).

What makes it the same on every run and machine:
- One clock, fixed at ``NOW``, for the service, the job model, the reports' and checkpoints' own times.
- Each source samples exactly once: its interval is set to an hour before the scheduler starts, so rates and GPM
  ratios, which need a second sample over real elapsed time, are absent (as on a real node's first scrape).
- The preflight source reads a procfs written here (a tuned node) instead of this machine's ``/proc``, whose
  sysctls and kernel modules differ between machines, and gets the NICs' PFC and pause settings from ``FakeQos``
  (PFC on priority 3, global pause off) instead of asking this machine's kernel about interfaces it lacks.
- ``mfu_exporter_source_sample_duration_seconds`` is how long each sample took on this machine: its values are
  checked (finite, 0 ≤ d ≤ the source's timeout) and then written as 0.0; its series and labels are kept.
There is no randomness in the fixture to seed (the demo's ``random.Random(seed)`` is not part of it).

Rewrite the file after an intended change with ``pytest --update-golden tests/unit/render/test_golden_exposition.py``
(or ``make golden``) and review its diff.
"""

from __future__ import annotations

import asyncio
import math
import re
from pathlib import Path

from bench import fixture
from mfu_exporter.model.checkpoints import parse_checkpoint_event
from mfu_exporter.model.progress import parse_progress
from mfu_exporter.node.nic_qos import GlobalPause
from mfu_exporter.service import Service, build_service
from mfu_exporter.sources import build_sources
from tests.support.expo import samples, snapshot_samples
from tests.support.nodes import FakeQos
from tests.support.sources import Clock

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "e2e-output.txt"
NOW = 1_800_000_000.0  # 2027-01-15T08:00:00Z
REPORT_SECONDS = 10.0  # between a job's two progress reports, on the fixed clock
ONCE = 3600.0  # a source interval no test outlasts: every source samples once
TIMING = "mfu_exporter_source_sample_duration_seconds"
TIMING_LINE = re.compile(rf'^({TIMING}\{{source="([a-z_]+)"\}}) (\S+)$', re.MULTILINE)

# A tuned training node's procfs, as the preflight checks read it (see tests/support/nodes.hgx_node).
SYSCTLS = {
    "net.core.rmem_max": "67108864",
    "net.core.wmem_max": "67108864",
    "net.ipv4.tcp_rmem": "4096\t87380\t67108864",
    "net.ipv4.tcp_wmem": "4096\t65536\t67108864",
    "kernel.osrelease": "6.8.0-45-generic",
}
MODULES = ("nvidia_peermem", "nvidia_uvm", "nvidia", "mlx5_ib", "mlx5_core")


def write_procfs(proc: Path) -> None:
    for name, value in SYSCTLS.items():
        path = proc / "sys" / name.replace(".", "/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(value + "\n")
    (proc / "modules").write_text("".join(f"{m} 16384 0 - Live 0x0000000000000000\n" for m in MODULES))


def tuned_qos(interfaces: list[str]) -> FakeQos:
    """Lossless RoCE as configured on a training fabric: PFC on priority 3 only, link-level pause off."""
    return FakeQos(
        pfc={name: {3} for name in interfaces},
        pause={name: GlobalPause(autoneg=False, rx=False, tx=False) for name in interfaces},
    )


async def sampled_node(root: Path, jobs: tuple[str, ...], interval: float, cycles: int) -> tuple[Service, Clock]:
    """The fixture's service with one checkpoint write per job, after every source sampled ``cycles`` times at
    ``interval`` (the fabric's counters advancing between samples), on a clock fixed at ``NOW``."""
    clock = Clock(NOW)
    fabric = fixture.build_fabric(root)
    write_procfs(root / "proc")
    config = fixture.node_config()
    qos = tuned_qos([nic.netdev for nic in fabric.nics])
    ctx = fixture.node_context(config, root, fixture.build_gpus(), procfs=str(root / "proc"), qos=qos)
    sources = build_sources(config, ctx)
    for source in sources:
        source.interval = interval
    service = build_service(config, sources, clock=clock, monotonic=clock)
    assert service.checkpoints is not None, "the fixture runs the checkpoint source"
    for job in jobs:
        service.checkpoints.record(parse_checkpoint_event({**fixture.checkpoint_event(job), "time": NOW}, NOW))
    daemon = service.scheduler
    await daemon.start()
    try:
        while not all(state.cycles >= cycles for state in daemon.states.values()):
            if cycles > 1:
                fabric.tick(interval)
            await asyncio.sleep(0.01 if cycles == 1 else 0.05)
    finally:
        await daemon.stop()
    return service, clock


async def full_node(root: Path) -> Service:
    """The fixture's service after one sample of every source, the jobs' reports and one evaluation tick."""
    service, clock = await sampled_node(root, fixture.JOBS, ONCE, 1)
    for step in (1, 2):
        clock.now = NOW + step * REPORT_SECONDS
        for index, job in enumerate(fixture.JOBS):
            body = fixture.progress_report(index, job, step * fixture.TOKENS_PER_REPORT, step)
            service.jobs.report(parse_progress({**body, "time": clock.now}, clock.now))
    service.evaluate_once()  # one pass of the 1 s tick
    return service


def normalise(text: str, timeouts: dict[str, float]) -> str:
    """``text`` with each source's sample duration checked against its timeout and then written as 0.0."""

    def zero(match: re.Match) -> str:
        series, source, value = match.groups()
        seconds = float(value)
        assert math.isfinite(seconds) and 0 <= seconds <= timeouts[source], f"{series} = {value}"
        return f"{series} 0.0"

    return TIMING_LINE.sub(zero, text)


async def render_full_node(root: Path) -> tuple[str, Service]:
    """The normalised text body of a scrape of the full node, and the service it came from."""
    service = await full_node(root)
    body, headers = await service.metrics(None, None)
    assert headers["Content-Type"].startswith("text/plain"), headers
    timeouts = {source.name: source.timeout for source in service.scheduler.sources}
    return normalise(body.decode(), timeouts), service


def sample_names(text: str) -> set[str]:
    """The sample names of an exposition (a histogram's ``_bucket``, ``_sum`` and ``_count`` each)."""
    return {name for name, _ in samples(text)}


def names_by_source(service: Service) -> dict[str, set[str]]:
    """The sample names each source's snapshot renders."""
    return {
        name: {sample for sample, _ in snapshot_samples(state.snapshot)}
        for name, state in service.scheduler.states.items()
        if state.snapshot is not None
    }


BUDGET_JOB = "budget-job"


async def one_job_node(root: Path, cycles: int = 3) -> Service:
    """The fixture's node as the series budget counts it: every default, eight GPUs and eight NICs, one job holding
    all eight GPUs with two progress reports and one checkpoint write, and every source sampled ``cycles`` times
    (more than once, so the rates, GPM ratios and windowed node summaries exist, as on a node running for a while)."""
    # 0.15 s: over NVML's 100 ms between two GPM samples.
    service, clock = await sampled_node(root, (BUDGET_JOB,), 0.15, cycles)
    for step in (1, 2):
        clock.now = NOW + step * REPORT_SECONDS
        body = {
            **fixture.progress_report(0, BUDGET_JOB, step * fixture.TOKENS_PER_REPORT, step),
            "gpus": list(range(fixture.GPUS)),
            "time": clock.now,
        }
        service.jobs.report(parse_progress(body, clock.now))
    service.evaluate_once()
    return service


async def render_one_job_node(root: Path) -> tuple[str, Service]:
    """The text body of a scrape of ``one_job_node``."""
    service = await one_job_node(root)
    body, _ = await service.metrics(None, None)
    return body.decode(), service
