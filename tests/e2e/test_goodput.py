"""The time ledger's known-truth run, end to end against a real daemon: the exporter's own HTTP server (``serve``), its
sources as the daemon builds them (logs, discovery over the demo's real pod-resources gRPC server, checkpoints), on a
simulated clock the test moves (wall and monotonic alike, as the demo's ``--speed`` does).

The run: start-up 20 s, steps of 1 s, a checkpoint save at step 100 (10 s), a crash after step 130, gone 60 s, a
restart with 5 s of start-up and a 15 s checkpoint load, steps 101–130 redone, then on to step 200. Its ledger must
match the script within 2 % per kind and its goodput within 1 point, through the client, through a torchtitan log
and through discovery (a pod restart)."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from pathlib import Path

import pytest

from mfu_exporter.client import ProgressReporter
from mfu_exporter.config import validate
from mfu_exporter.service import build_service
from mfu_exporter.sim import nvml as fake_nvml
from mfu_exporter.sim.podresources import PodResourcesServer, SimPod
from mfu_exporter.sources import Paths, SourceContext, build_sources
from mfu_exporter.web.app import serve
from tests.support.expo import samples
from tests.support.known_truth import GOODPUT, TRUTH, step_time
from tests.support.net import free_port

START = 1_800_000_000.0  # the simulated Unix time the run starts at
GPUS = 4
JOB = "llama"
SOURCES = ("gpu", "rdma", "ethtool", "checkpoint", "preflight", "logs")


class SimTime:
    """The simulated clock: the daemon's wall and monotonic clocks and the job's, moved only by the test."""

    def __init__(self):
        self.now = START

    def __call__(self) -> float:
        return self.now

    def at(self, seconds: float) -> None:
        assert START + seconds >= self.now, "the script only goes forward"
        self.now = START + seconds


class Daemon:
    """The real exporter's service and HTTP server (``mfu_exporter.web.app.serve``) on a loopback port."""

    def __init__(self, config: dict, clock: SimTime, ctx_extra: dict | None = None):
        self.port = free_port()
        job = {"params": 7e9, "gpus": GPUS, **config.pop("job", {})}
        config = validate({**config, "web": {"listen_address": f"127.0.0.1:{self.port}"}, "jobs": {JOB: job}})
        ctx = SourceContext(config, wall=clock, monotonic=clock, **(ctx_extra or {}))
        self.service = build_service(config, build_sources(config, ctx), clock=clock, monotonic=clock, paths=ctx.paths)
        self.url = f"http://127.0.0.1:{self.port}"
        self._stop = asyncio.Event()
        self._task: asyncio.Task | None = None

    async def __aenter__(self) -> "Daemon":
        started = asyncio.Event()
        self._task = asyncio.create_task(serve(self.service, on_started=lambda urls: started.set(), stop=self._stop))
        await asyncio.wait_for(started.wait(), 30)
        return self

    async def __aexit__(self, *exc) -> None:
        self._stop.set()
        assert self._task is not None
        await asyncio.wait_for(self._task, 30)

    async def get(self, path: str) -> bytes:
        def fetch() -> bytes:
            with urllib.request.urlopen(self.url + path, timeout=10) as response:
                return response.read()

        return await asyncio.to_thread(fetch)

    async def ledger(self) -> dict:
        return json.loads(await self.get(f"/api/v1/jobs/{JOB}/ledger"))

    async def job(self) -> dict:
        jobs = json.loads(await self.get("/api/v1/jobs"))["jobs"]
        return next((j for j in jobs if j["job"] == JOB), {})

    def tick(self) -> None:
        self.service.evaluate_once()  # the 1 s tick, now, on the simulated clock


async def until(predicate, what: str, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while True:
        value = await predicate() if asyncio.iscoroutinefunction(predicate) else predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


async def delivered(reporter: ProgressReporter, before: int) -> None:
    await until(lambda: reporter.sent > before, "the reporter's request")


async def client_run(daemon: Daemon, clock: SimTime, announce: bool = True, on_crash=None, on_restart=None) -> None:
    """The script through the real ProgressReporter: its start event, updates, a timed save and a timed load.
    ``announce`` False: a reporter without start events and heartbeats; ``on_crash`` and ``on_restart`` run at 160 s
    and 220 s (the pod going away and coming back)."""

    def reporter(run_id: str) -> ProgressReporter:
        return ProgressReporter(
            daemon.url,
            JOB,
            run_id=run_id,
            clock=clock,
            monotonic=clock,
            heartbeat=10.0 if announce else None,
            announce=announce,
            max_backoff=0.05,
        )

    async def steps(job: ProgressReporter, first: int, last: int, run: int) -> None:
        for step in range(first, last + 1):
            clock.at(step_time(step, run))
            sent = job.sent
            job.update(tokens_total=step * 1000, step=step)
            await delivered(job, sent)
            if step == 100 and run == 1:
                sent = job.sent
                with job.checkpoint("step-100"):
                    clock.at(step_time(100, 1) + 10)
                await until(lambda: job.sent >= sent + 2, "the save's two events")

    clock.at(0)
    first = reporter("run-a")
    if announce:
        await delivered(first, 0)
    await steps(first, 1, 130, 1)
    first.abandon()  # the process dies: nothing more from it, not even how it ended
    if on_crash is not None:
        await on_crash()
    for seconds in range(165, 220, 5):  # gone 60 s: the daemon's tick runs on
        clock.at(seconds)
        daemon.tick()
    clock.at(220)
    if on_restart is not None:
        await on_restart()
    second = reporter("run-b")
    if announce:
        await delivered(second, 0)
    clock.at(225)
    sent = second.sent
    with second.checkpoint_load(step=100):
        clock.at(240)
    await until(lambda: second.sent >= sent + 2, "the load's two events")
    await steps(second, 101, 200, 2)
    second.close()


def assert_truth(ledger: dict, metrics: dict | None = None) -> None:
    for kind, seconds in TRUTH.items():
        got = ledger["kinds"][kind] / GPUS
        assert got == pytest.approx(seconds, rel=0.02, abs=0.5 if seconds == 0 else 0), (
            f"{kind}: {got} s, truth {seconds} s"
        )
    assert ledger["goodput"] == pytest.approx(GOODPUT, abs=0.01)
    if metrics is not None:
        for kind in TRUTH:
            key = ("mfu_job_gpu_seconds_total", (("kind", kind), ("training_job", JOB)))
            assert metrics[key] == pytest.approx(ledger["kinds"][kind], abs=1e-6)
        assert metrics[("mfu_job_goodput_ratio", (("training_job", JOB),))] == pytest.approx(ledger["goodput"])
        assert metrics[("mfu_job_restarts_total", (("training_job", JOB),))] == 1


def no_sources(*keep: str) -> dict:
    """Only the sources a test needs, and no discovery unless it configures its own."""
    off = {"enabled": "false"}
    return {
        "sources": {name: {"enabled": name in keep} for name in SOURCES},
        "discovery": {"kubernetes": off, "slurm": off},
    }


async def test_the_known_truth_run_through_the_client():
    clock = SimTime()
    async with Daemon(no_sources("checkpoint"), clock) as daemon:
        await client_run(daemon, clock)
        daemon.tick()  # /metrics shows the job model as of a tick: this one, at the run's end
        ledger = await daemon.ledger()
        assert_truth(ledger, samples((await daemon.get("/metrics")).decode()))
        first, second = ledger["runs"]
        assert (first["start"], first["first_step_time"], first["end"]) == (START, START + 20, START + 160)
        assert first["end_reason"] == "lost"  # no heartbeat for three intervals: the client's process is gone
        assert (second["start"], second["first_step_time"]) == (START + 220, START + 240)
        assert second["end_reason"] == "finished" and ledger["ideal_step_seconds"] == 1.0


def titan(at: float, message: str) -> str:
    """A torchtitan log line (its logger format, ``torchtitan/tools/logging.py``), at a simulated Unix time."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))
    return f"[titan] {stamp},{int(round(at % 1 * 1000)):03d} - root - INFO - {message}\n"


def titan_step(at: float, step: int) -> str:
    return titan(
        at,
        f"step: {step:2}  loss:  2.41032  grad_norm:  0.3312  memory: 61.20GiB(77.30%)  tps: 8,192  tflops: 358.12  mfu: 36.21%",
    )


INIT = (
    "Trainer is initialized with local batch size 4, global batch size 16, gradient accumulation steps 1, "
    "sequence length 2048, total steps 1000 (warmup 10)"
)


async def test_the_known_truth_run_through_a_torchtitan_log(tmp_path: Path):
    """No client at all: the logs source follows the job's log as it is written; its start-up, save, load and step
    lines (torchtitan's format strings, cited in mfu_exporter/logs/torchtitan.py) are all the ledger has."""
    clock = SimTime()
    log = tmp_path / "train.log"
    log.touch()
    config = {
        **no_sources("logs", "checkpoint"),
        "job": {"world_size": GPUS},
    }
    config["sources"]["logs"] = {
        "files": [{"path": str(log), "job": JOB, "format": "torchtitan"}],
        "discovered_pods": False,
    }
    async with Daemon(config, clock) as daemon:
        await until(lambda: daemon.service.scheduler.ready, "the first sample cycle", 30)

        def view():
            return next((v for v in daemon.service.jobs.views() if v.name == JOB), None)

        def live():
            job = view()
            return job.ledger if job is not None and job.ledger is not None else None

        async def write(lines: list[str], seconds: float, read, what: str) -> None:
            """Move the clock to the last line's time, append the lines, and wait until the daemon has read them (a
            line is read after it was written, never before its own time). The test ticks too, a few times a wall
            second: the daemon's own tick comes every mfu.interval, and on the held clock one more changes nothing."""
            clock.at(seconds)
            with open(log, "a") as out:
                out.write("".join(lines))
            ticked = [0.0]

            def applied():
                if time.monotonic() - ticked[0] >= 0.2:
                    ticked[0] = time.monotonic()
                    daemon.tick()
                return read()

            await until(applied, what)

        def at_step(step):
            return lambda: view() is not None and view().step == step, f"step {step} read"

        def runs(count, **last):
            return (
                lambda: (
                    live() is not None
                    and len(live().runs) == count
                    and all(live().runs[-1][k] == v for k, v in last.items())
                )
            ), f"run {count} with {last}"

        await write([titan(START, INIT)], 0, *runs(1))
        await write([titan(START + 20, "Training starts at step 1")], 20, *runs(1, resume_step=0))
        for first in range(1, 131, 10):
            last = min(first + 9, 130)
            lines = []
            for step in range(first, last + 1):
                lines.append(titan_step(START + step_time(step, 1), step))
                if step == 100:
                    lines.append(titan(START + step_time(100, 1), "Saving the checkpoint."))
                    lines.append(
                        titan(START + step_time(100, 1) + 10, "Finished saving the checkpoint in 10.00 seconds.")
                    )
            # The clock at the batch's last line: the save's end, 10 s after step 100, in the batch that ends there.
            await write(lines, step_time(last, 1) + (10.0 if last == 100 else 0.0), *at_step(last))
        for seconds in range(165, 220, 5):  # the process died after step 130; nothing is written for 60 s
            clock.at(seconds)
            daemon.tick()
        await write([titan(START + 220, INIT)], 220, *runs(2))  # a new process: its start-up lines
        loading = titan(START + 225, "Loading the checkpoint from ./outputs/checkpoint/step-100.")
        await write([loading], 225, *runs(2, resume_step=100))
        loaded = [
            titan(START + 240, "Finished loading the checkpoint in 15.00 seconds."),
            titan(START + 240, "Training starts at step 101"),
        ]
        await write(loaded, 240, lambda: live().state == "startup", "the load's end")
        for first in range(101, 201, 10):
            last = first + 9
            lines = [titan_step(START + step_time(s, 2), s) for s in range(first, last + 1)]
            await write(lines, step_time(last, 2), *at_step(last))
        ledger = await daemon.ledger()
        assert_truth(ledger)
        first, second = ledger["runs"]
        assert first["end_reason"] == "restarted" and first["end"] == START + 160
        assert second["start"] == START + 220 and second["first_step_time"] == START + 240


async def test_the_known_truth_run_through_discovery_a_pod_restart(tmp_path: Path):
    """The kubelet (the demo's real pod-resources gRPC server) lists the job's pod; the pod goes away when the job
    crashes and a new one of the same name comes back 60 s later. The client here sends neither start events nor
    heartbeats (an older training script's reporter): discovery alone says when each run started and ended."""
    clock = SimTime()
    nvml = fake_nvml.node(fake_nvml.h100, count=8)
    uuids = [gpu.uuid for gpu in nvml.gpus[:GPUS]]
    socket = f"/tmp/e2e-goodput-{time.monotonic_ns()}.sock"
    pod = SimPod(f"{JOB}-master-0", "research", {"pytorch": [("nvidia.com/gpu", uuids)]})
    kubelet = PodResourcesServer(socket, [pod]).start()
    config = {
        **no_sources("gpu", "checkpoint"),
        "discovery": {
            "interval": "1s",
            "kubernetes": {"enabled": "true", "socket": socket, "api_server": {"enabled": "false"}},
            "slurm": {"enabled": "false"},
        },
    }
    try:
        async with Daemon(config, clock, {"nvml": nvml, "paths": Paths(str(tmp_path))}) as daemon:

            async def found() -> bool:
                daemon.service.apply_discovery()
                return (await daemon.job()).get("discovered") is not None

            async def lost() -> bool:
                daemon.service.apply_discovery()
                return (await daemon.job()).get("discovered") is None

            await until(found, "discovery to find the pod", 30)  # at the script's 0 s: the run starts

            async def pod_gone() -> None:
                kubelet.set_pods([])
                await until(lost, "discovery to see the pod gone", 30)

            async def pod_back() -> None:
                kubelet.set_pods([pod])
                await until(found, "discovery to find the new pod", 30)

            await client_run(daemon, clock, announce=False, on_crash=pod_gone, on_restart=pod_back)
            daemon.tick()  # /metrics shows the job model as of a tick: this one, at the run's end
            ledger = await daemon.ledger()
            assert_truth(ledger, samples((await daemon.get("/metrics")).decode()))
            first, second = ledger["runs"]
            assert first["source"] == "discovery" and first["end_reason"] == "gone" and first["end"] == START + 160
            assert second["source"] == "discovery" and second["start"] == START + 220
    finally:
        kubelet.stop()
        Path(socket).unlink(missing_ok=True)


def test_the_demo_job_crashes_and_restarts_and_its_ledger_shows_the_runs():
    """``mfu-exporter demo --incident crash-restart``: the job's process dies after the warm-up (its reporter goes
    silent, its pod leaves the demo's kubelet), is gone a minute, and a new one loads the last checkpoint."""
    from tests.support.demo_harness import get_json, running_demo
    from tests.support.wait import wait_until

    with running_demo("--incident", "crash-restart", speed=20) as base:
        url = base + "api/v1/jobs/llama3-70b/ledger"
        # While no run trains (its process gone, the new one starting or loading), the job serves no live MFU.
        served: list[tuple[str, float | None]] = []

        def restarted():
            job = get_json(base + "api/v1/jobs/llama3-70b")
            served.append((job["ledger"]["state"] if job["ledger"] else "none", job["mfu"]))
            ledger = get_json(url)
            return ledger if len(ledger["runs"]) == 2 and ledger["kinds"]["checkpoint_load"] > 0 else None

        ledger = wait_until(restarted, 60, "the restart and its checkpoint load", ignore=(OSError,))
        gone = [mfu for state, mfu in served if state in ("down", "startup", "checkpoint_load")]
        assert "down" in {state for state, _ in served} and all(mfu in (None, 0.0) for mfu in gone), served
        first, second = ledger["runs"]
        assert first["end_reason"] in ("restarted", "gone", "lost") and first["end"] is not None
        assert second["start"] >= first["end"] and ledger["kinds"]["down"] > 0
        assert {band["kind"] for band in ledger["bands"]} >= {"startup", "down", "checkpoint_load"}
        wait_until(lambda: get_json(url)["runs"][1]["first_step_time"] is not None, 60, "the new run's first step")
