"""A cheap fleet of fake scrape targets: N nodes' ``/metrics`` from one process, for fleets the simulator of
``demo --nodes`` (mfu_exporter/sim/fleet.py, one whole exporter per node) cannot run on a small machine.

The pattern of Prometheus' own load tools (avalanche, prombench's fake targets), with the project's real output:

- **Captured at startup, never stored.** The server first runs a small simulated fleet (``Fleet``, real sources over
  fake NVML and mlx5 trees, the real job model, collector and encoder) on a stepped clock, and renders the
  exposition of five nodes through their own ``Service.metrics``: a ``healthy`` node; in a job with a pfc-storm, the
  ``incident`` node and a ``waiting`` node of that job; in a job whose GPU is lost, the ``lost`` node and a
  ``stopped`` node of that job. A change of the exporter's families or series is served at once, with no file to
  regenerate.
- **Counters advance.** Each state is rendered twice, ``CAPTURE_SECONDS`` of simulated time apart: a counter's
  served value grows at its captured rate from the server's start, so ``rate()`` over the served fleet sees the
  captured node's rates. ``*_timestamp_seconds`` gauges follow the wall clock; other gauges keep their captured value.
- **Per node, per job.** Every served node is in a job of the layout (``--layout``): ``small``, jobs of 16, 8 and 32
  nodes in turn (``layout_jobs``); ``one``, one job on every node (a pre-training run over the whole fleet);
  ``mixed``, one job on the first half of the nodes and small jobs on the rest. Its series carry its job's name; a
  GPU's ``uuid`` carries the node's index. The scraper tells nodes apart by the ``instance`` label of its target list
  (``file_sd``): ``instance(i)``.
- **Cheap to serve.** One port, one path per node (``/node/<i>/metrics``). Values are formatted once per interval
  per state, each job's body is made from its state's text once per interval, and a request only joins its node's
  ``uuid`` token into the job's body: no per-request formatting.

**Or a real node, replayed** (``--exposition``): the exposition of a node, a file or its ``/metrics`` URL (a running
``mfu-exporter demo``, or any node's), served by every node with every job of it (the one-job layout: each job on
every node). Counters advance at the rate between two captures ``--exposition-apart`` apart: two files given, or a
URL read twice; each node is its own ``instance`` and its GPUs' UUIDs carry its index, as above. The incident and
lost-GPU nodes are none: the replayed node's own causes are every node's.

``GET /api/v1/fleet`` gives the truth: each job's nodes, instances and MFU (what the served counters make it), the
incident's node, job and instance, and the lost GPU's.

``python -m mfu_exporter.sim.targets --nodes 4096 --listen 127.0.0.1:9400 --file-sd nodes.json``
``python -m mfu_exporter.sim.targets --nodes 2048 --exposition http://127.0.0.1:9495/metrics``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import re
import signal
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from aiohttp import web

from mfu_exporter.quantities import parse_duration
from mfu_exporter.sim.fleet import JOB_SIZES, Fleet, FleetJob, FleetSchedule, layout_jobs, require_node
from mfu_exporter.sim.node import INCIDENT_BY_NAME, SimClock

log = logging.getLogger(__name__)

HEALTHY, INCIDENT, WAITING, LOST, STOPPED = "healthy", "incident", "waiting", "lost", "stopped"
STATES = (HEALTHY, INCIDENT, WAITING, LOST, STOPPED)
REPLAY = "replay"  # the one state of a replayed node's fleet (--exposition)
JOB_LABEL = re.compile(r'training_job="((?:[^"\\]|\\.)*)"')
# The capture fleets: 18 nodes make a healthy job of 16 (nodes 0-15) and a job of 2 (16 and 17) with the incident on
# node 16 and node 17 waiting on it (layout_jobs' sizes 16, 8, 32).
CAPTURE_NODES = 18
CAPTURED = {HEALTHY: 0, INCIDENT: 16, WAITING: 17}  # in the pfc-storm fleet
CAPTURED_LOST = {LOST: 16, STOPPED: 17}  # in the gpu-lost fleet
CAPTURE_STEP = 5.0  # simulated seconds per step: the sources' interval and the fleet's tick
# 240 s of warm-up: the forced incident starts at 10 s and the job models' 15 s windows fill; every job's first
# checkpoint (1 s to 7 s) is long over and the next is at 600 s, so no captured node is writing one.
CAPTURE_WARMUP = 240.0
CAPTURE_SECONDS = 60.0  # between the two renderings: long enough that one step's token noise (±2 %) averages out
TARGET_INCIDENTS = ("pfc-storm", "straggler")  # what the incident node and its job's waiting nodes can show
DEFAULT_INCIDENT_NODE = 17  # in job 01 (nodes 16-23), as in the fleet e2e test
DEFAULT_LOST_NODE = 25  # in job 02 (nodes 24-55)
NODE_TOKEN = "\x00NODE\x00"  # where a node's own label value goes in a job's body
JOB_TOKEN = "\x00JOB\x00"  # where the job's name goes in a state's text
UUID = re.compile(r'(uuid="GPU-)[0-9a-fA-F]{8}(-)')
MONOTONIC_SUFFIXES = ("_total", "_bucket", "_count", "_sum")
TIMESTAMP_SUFFIX = "_timestamp_seconds"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LAYOUTS = ("small", "one", "mixed")  # --layout: many small jobs, one job on every node, half and half


def served_jobs(nodes: int, layout: str = "small") -> list[FleetJob]:
    """The jobs of a ``layout`` over nodes 0..N-1 (see the module's docstring)."""
    if layout == "small":
        return layout_jobs(nodes)
    if layout == "one":
        return layout_jobs(nodes, sizes=(nodes,))
    if layout == "mixed":
        big = max(nodes // 2, 1)
        rest = -(-(nodes - big) // sum(JOB_SIZES))  # rounds of the small sizes that cover the other half
        return layout_jobs(nodes, sizes=(big, *JOB_SIZES * max(rest, 1)))
    raise ValueError(f"--layout must be one of {', '.join(LAYOUTS)}, not {layout!r}")


class StepClock(SimClock):
    """Simulated time that moves only when ``advance`` says: a capture takes seconds, whatever it simulates."""

    def __init__(self, start: float):
        self._elapsed = 0.0
        super().__init__(1.0, wall=lambda: start, monotonic=lambda: self._elapsed)

    def advance(self, seconds: float) -> None:
        self._elapsed += seconds


def instance(index: int, address: str) -> str:
    """The ``instance`` label of node ``index``: the target's address and path, unique per node."""
    return f"{address}/node/{index}"


def node_token(index: int) -> str:
    """What node ``index`` puts in its GPUs' UUIDs (``GPU-<8 hex>-...``)."""
    return f"{index:08x}"


def file_sd(nodes: int, address: str) -> list[dict[str, Any]]:
    """A file_sd target list for Prometheus and vmagent: one target group per node, its path and instance set."""
    return [
        {"targets": [address], "labels": {"__metrics_path__": f"/node/{i}/metrics", "instance": instance(i, address)}}
        for i in range(nodes)
    ]


@dataclass
class Rendering:
    """A captured node's two expositions, ``CAPTURE_SECONDS`` apart, its job's name and the simulated time of the
    second."""

    first: str
    second: str
    job: str  # "" for a replayed node: its jobs keep their names
    at: float
    apart: float = CAPTURE_SECONDS  # seconds between the two


async def _capture_fleet(root: Path, incident: str, nodes: dict[str, int], warmup: float) -> dict[str, Rendering]:
    """Run a small fleet with ``incident`` forced on node 16 on a stepped clock and render ``nodes`` (state -> node
    index) at the end of the warm-up and ``CAPTURE_SECONDS`` later."""
    clock = StepClock(time.time() - warmup - CAPTURE_SECONDS)
    fleet = Fleet(root, CAPTURE_NODES, 1, clock, FleetSchedule(incident), incident_node=16, interval=CAPTURE_STEP)
    watched = {state: fleet.nodes[index] for state, index in nodes.items()}
    for node in watched.values():
        await node.service.scheduler.start()
    first: dict[str, str] = {}
    warmup_steps, steps = int(warmup / CAPTURE_STEP), int((warmup + CAPTURE_SECONDS) / CAPTURE_STEP)
    try:
        for step in range(1, steps + 1):
            clock.advance(CAPTURE_STEP)
            await asyncio.to_thread(fleet.tick)
            # Every source of every watched node sees this step's readings before the jobs report and evaluate.
            for node in watched.values():
                for source in node.service.scheduler.sources:
                    await node.service.scheduler.sample_once(source)
            fleet.report()
            for node in watched.values():
                node.service.evaluate_once()
            if step == warmup_steps:
                for state, node in watched.items():
                    first[state] = (await node.service.metrics(None, None))[0].decode()
        return {
            state: Rendering(
                first[state], (await node.service.metrics(None, None))[0].decode(), node.job.name, clock.time()
            )
            for state, node in watched.items()
        }
    finally:
        for node in watched.values():
            await node.service.scheduler.stop()
        fleet.close()


async def capture(root: Path, warmup: float = CAPTURE_WARMUP, incident: str = "pfc-storm") -> dict[str, StateTemplate]:
    """The five states' templates, from two capture fleets (``incident``, a pfc-storm or a straggler, and a lost
    GPU) run at once. A shorter ``warmup`` (at least 60 s: the incident, the jobs' windows and the first checkpoint
    over) is for tests."""
    storm, lost = await asyncio.gather(
        _capture_fleet(root / "storm", incident, CAPTURED, warmup),
        _capture_fleet(root / "lost", "gpu-lost", CAPTURED_LOST, warmup),
    )
    return {state: StateTemplate.parse(state, rendering) for state, rendering in {**storm, **lost}.items()}


def _tokenize(line: str, job: str) -> str:
    """A captured line with its job's name and its GPUs' node part replaced by the tokens a served node fills."""
    if job:
        line = line.replace(f'training_job="{job}"', f'training_job="{JOB_TOKEN}"')
    return UUID.sub(rf"\g<1>{NODE_TOKEN}\g<2>", line)


def read_exposition(source: str) -> str:
    """A node's exposition: a file, or a running node's ``/metrics`` (an http:// or https:// URL)."""
    if source.startswith(("http://", "https://")):
        with urllib.request.urlopen(source, timeout=30) as response:
            return response.read().decode()
    return Path(source).read_text()


def replay_rendering(sources: list[str], apart: float, sleep: Callable[[float], None] = time.sleep) -> Rendering:
    """The two captures of a replayed node: two sources ``apart`` seconds apart, or one URL read twice, ``apart``
    seconds apart. A file's capture time is its modification time (its timestamps are offset from it)."""
    url = len(sources) == 1 and sources[0].startswith(("http://", "https://"))
    if len(sources) not in (1, 2) or (len(sources) == 1 and not url):
        raise ValueError(
            "--exposition: two captures (files or URLs) --exposition-apart seconds apart, or one URL to read twice: "
            "one file has no counter rates"
        )
    if apart <= 0:
        raise ValueError(f"--exposition-apart: a positive duration, not {apart:g} s")
    first = read_exposition(sources[0])
    if url:
        sleep(apart)
    second = read_exposition(sources[-1])
    at = time.time() if sources[-1].startswith(("http://", "https://")) else Path(sources[-1]).stat().st_mtime
    if not any(line.startswith("mfu_") for line in second.splitlines()):
        raise ValueError(f"--exposition: {sources[-1]} has no mfu_ series: not an mfu-exporter's /metrics")
    return Rendering(first, second, "", at, apart)


@dataclass
class StateTemplate:
    """One state's exposition as text pieces and value slots: ``parts[i]`` for each slot is rewritten per interval.

    A slot is a counter (value at capture plus rate × seconds since the server started) or a timestamp gauge (the
    wall clock, offset as captured); every other value stays in the static text."""

    state: str
    parts: list[str]
    slots: list[tuple[int, float, float, bool]]  # (index in parts, value at capture, per second, is a timestamp)
    captured_at: float  # the simulated Unix time of the second rendering: timestamps are offset from it
    values: dict[str, float] = field(default_factory=dict)  # series -> value at capture, for the truth
    rates: dict[str, float] = field(default_factory=dict)  # series -> per second, counters only

    @classmethod
    def parse(cls, state: str, captured: Rendering) -> StateTemplate:
        earlier = dict(_samples(_tokenize(line, captured.job) for line in captured.first.splitlines()))
        parts: list[str] = []
        slots: list[tuple[int, float, float, bool]] = []
        values: dict[str, float] = {}
        rates: dict[str, float] = {}
        static: list[str] = []
        for line in captured.second.splitlines():
            line = _tokenize(line, captured.job)
            if not line or line.startswith("#"):
                static.append(line + "\n")
                continue
            key, _, text = line.rpartition(" ")
            value = float(text)
            name = key.split("{", 1)[0]
            values[key] = value
            monotonic = name.endswith(MONOTONIC_SUFFIXES)
            timestamp = name.endswith(TIMESTAMP_SUFFIX)
            if not (monotonic or timestamp) or not math.isfinite(value):
                static.append(line + "\n")
                continue
            rate = 0.0
            if monotonic:
                before = earlier.get(key)
                # A counter that fell (none does in a capture: no restart) or is new moves no faster than zero.
                rate = max(value - before, 0.0) / captured.apart if before is not None else 0.0
                rates[key] = rate
            static.append(key + " ")
            parts.append("".join(static))
            static = ["\n"]
            slots.append((len(parts), value, rate, timestamp))
            parts.append(text)
        parts.append("".join(static))
        return cls(state, parts, slots, captured.at, values, rates)

    def render(self, started: float, now: float) -> str:
        """The state's text at ``now`` for a server started at ``started`` (job and node tokens still in it)."""
        parts = self.parts
        for index, value, rate, timestamp in self.slots:
            parts[index] = repr(value - self.captured_at + now if timestamp else value + rate * (now - started))
        return "".join(parts)

    def job_value(self, family: str, job: str = JOB_TOKEN) -> float | None:
        """The captured value of a job family's one series (``<family>{training_job=...}``)."""
        return self.values.get(f'{family}{{training_job="{job}"}}')

    def job_rate(self, family: str, job: str = JOB_TOKEN) -> float | None:
        return self.rates.get(f'{family}{{training_job="{job}"}}')

    def job_names(self) -> list[str]:
        """The jobs a replayed node's series name, in their order."""
        return list(dict.fromkeys(m.group(1) for key in self.values for m in JOB_LABEL.finditer(key)))


def _samples(lines: Any) -> list[tuple[str, float]]:
    found = []
    for line in lines:
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            found.append((key, float(value)))
    return found


@dataclass
class ServedJob:
    name: str
    nodes: list[int]
    states: list[str]  # per node, in order


class TargetFleet:
    """N nodes in jobs, each node in one of the captured states, rendered per interval from the templates."""

    def __init__(
        self,
        templates: dict[str, StateTemplate],
        nodes: int,
        address: str,
        interval: float = 15.0,
        incident_node: int | None = DEFAULT_INCIDENT_NODE,
        lost_node: int | None = DEFAULT_LOST_NODE,
        clock: Callable[[], float] = time.time,
        layout: str = "small",
        incident: str = "pfc-storm",  # the incident the templates were captured with
    ):
        require_node("--incident-node", incident_node, nodes)
        require_node("--lost-node", lost_node, nodes)
        self.templates = templates
        self.nodes = nodes
        self.address = address
        self.interval = interval
        self.clock = clock
        self.started = clock()
        self.jobs: list[ServedJob] = []
        self.incident_node, self.lost_node = incident_node, lost_node
        self.incident = incident
        self.node_job: list[int] = []
        self.node_state: list[str] = []
        self.layout = layout
        if REPLAY in templates:
            # Every job of the replayed node on every node: one body for all (no job token in it).
            self.layout, self.incident_node, self.lost_node = REPLAY, None, None
            everyone = list(range(nodes))
            self.jobs = [ServedJob(name, everyone, [REPLAY] * nodes) for name in templates[REPLAY].job_names()]
            self.node_job, self.node_state = [0] * nodes, [REPLAY] * nodes
        for index, job in enumerate(served_jobs(nodes, layout) if REPLAY not in templates else ()):
            if lost_node in job.nodes and incident_node in job.nodes:
                raise ValueError("--incident-node and --lost-node must be in different jobs")
            states = [
                INCIDENT
                if node == incident_node
                else WAITING
                if incident_node in job.nodes
                else LOST
                if node == lost_node
                else STOPPED
                if lost_node in job.nodes
                else HEALTHY
                for node in job.nodes
            ]
            self.jobs.append(ServedJob(job.name, job.nodes, states))
            self.node_job.extend([index] * len(job.nodes))
            self.node_state.extend(states)
        self._bucket: float | None = None
        self._bodies: dict[tuple[int, str], list[bytes]] = {}
        self._tokens = [node_token(i).encode() for i in range(nodes)]
        self.refreshes = 0

    def refresh(self, now: float | None = None) -> None:
        """Format every state's values for the interval ``now`` is in, and make each job's bodies from them."""
        now = self.clock() if now is None else now
        bucket = math.floor(now / self.interval) * self.interval
        if bucket == self._bucket:
            return
        texts = {state: template.render(self.started, bucket) for state, template in self.templates.items()}
        bodies: dict[tuple[int, str], list[bytes]] = {}
        for index, job in enumerate(self.jobs):
            for state in set(job.states):
                body = texts[state].replace(JOB_TOKEN, job.name).encode()
                bodies[(index, state)] = body.split(NODE_TOKEN.encode())
        self._bodies, self._bucket = bodies, bucket
        self.refreshes += 1

    def body(self, node: int) -> bytes:
        self.refresh()
        return self._tokens[node].join(self._bodies[(self.node_job[node], self.node_state[node])])

    def job_mfu(self, job: ServedJob) -> float | None:
        """The job's MFU as the served counters make it: the sum of its nodes' model FLOP/s over the sum of their
        peaks, counting only nodes that export both (the recording rule's definition)."""
        flops = peak = 0.0
        for state in job.states:
            template, name = self.templates[state], job.name if state == REPLAY else JOB_TOKEN
            rate = template.job_rate("mfu_job_model_flops_total", name)
            node_peak = template.job_value("mfu_job_peak_flops", name)
            if rate is not None and node_peak:
                flops, peak = flops + rate, peak + node_peak
        return flops / peak if peak else None

    def truth(self) -> dict[str, Any]:
        def node(name: str, index: int | None) -> dict[str, Any] | None:
            """The incident on node ``index``: the cause it should yield (the demo's incident table) and the job it
            touches (the node's; every other job carries on)."""
            if index is None:
                return None
            job = self.jobs[self.node_job[index]].name
            return {
                "name": name,
                "node": index,
                "instance": instance(index, self.address),
                "job": job,
                "cause": INCIDENT_BY_NAME[name].cause,
                "touches": [job],
            }

        return {
            "nodes": self.nodes,
            "layout": self.layout,
            "address": self.address,
            "interval_seconds": self.interval,
            "incident": node(self.incident, self.incident_node) if self.layout != REPLAY else None,
            "lost": node("gpu-lost", self.lost_node),
            "jobs": [
                {
                    "name": job.name,
                    "nodes": job.nodes,
                    "instances": [instance(i, self.address) for i in job.nodes],
                    "states": job.states,
                    "mfu_1m": self.job_mfu(job),
                }
                for job in self.jobs
            ],
        }


def create_app(fleet: TargetFleet) -> web.Application:
    async def metrics(request: web.Request) -> web.Response:
        try:
            node = int(request.match_info["node"])
        except ValueError:
            raise web.HTTPNotFound(text="node must be an integer\n") from None
        if not 0 <= node < fleet.nodes:
            raise web.HTTPNotFound(text=f"node must be 0 to {fleet.nodes - 1}\n")
        return web.Response(body=fleet.body(node), headers={"Content-Type": CONTENT_TYPE})

    async def truth(request: web.Request) -> web.Response:
        return web.json_response(fleet.truth())

    async def healthy(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def refresh_every_interval(app: web.Application) -> Any:
        # Bodies are made at each interval's start, off the scrapes' path: a scrape only joins bytes.
        async def loop() -> None:
            while True:
                fleet.refresh()
                await asyncio.sleep(fleet.interval - time.time() % fleet.interval + 0.01)

        task = asyncio.create_task(loop())
        yield
        task.cancel()

    app = web.Application()
    app.router.add_get(r"/node/{node}/metrics", metrics)
    app.router.add_get("/api/v1/fleet", truth)
    app.router.add_get("/healthz", healthy)
    app.cleanup_ctx.append(refresh_every_interval)
    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mfu_exporter.sim.targets", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--listen", default="127.0.0.1:9400", help="host:port to serve on (loopback by default)")
    parser.add_argument("--interval", default="15s", help="how often counters move: the scrape interval")
    parser.add_argument(
        "--incident", choices=TARGET_INCIDENTS, default="pfc-storm", help="the incident node's incident"
    )
    parser.add_argument("--incident-node", default=str(DEFAULT_INCIDENT_NODE), help="the incident's node, or none")
    parser.add_argument(
        "--lost-node",
        default=str(DEFAULT_LOST_NODE),
        help="the lost GPU's node, or none (by default none where the layout puts it in the incident's job)",
    )
    parser.add_argument(
        "--layout",
        choices=LAYOUTS,
        default="small",
        help="the jobs: many small ones (16, 8, 32 nodes in turn), one on every node, or one on half and small ones",
    )
    parser.add_argument(
        "--exposition",
        action="append",
        metavar="FILE_OR_URL",
        help="replay this node's exposition on every node instead (twice: two captures --exposition-apart apart; "
        "once, a URL read twice): --layout, --incident and the nodes' flags do not apply",
    )
    parser.add_argument(
        "--exposition-apart", default="60s", help="the time between the two captures of --exposition (60s)"
    )
    parser.add_argument("--file-sd", type=Path, help="write a file_sd target list of every node here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    def node(flag: str, value: str) -> int | None:
        if value == "none":
            return None
        try:
            return int(value)
        except ValueError:
            parser.error(f"{flag}: a node index or none, not {value!r}")
            raise

    host, _, port = args.listen.rpartition(":")
    if not port.isdigit():
        parser.error(f"--listen: host:port, not {args.listen!r}")
    if args.nodes < 1:
        parser.error(f"--nodes: at least 1, not {args.nodes}")
    if args.exposition:
        # A replayed node's fleet has no incident, lost GPU or layout of its own: those flags do not apply.
        started = time.monotonic()
        try:
            replayed = replay_rendering(args.exposition, parse_duration(args.exposition_apart))
            templates = {REPLAY: StateTemplate.parse(REPLAY, replayed)}
            fleet = TargetFleet(templates, args.nodes, args.listen, parse_duration(args.interval), None, None)
        except (OSError, ValueError) as exc:
            print(f"mfu-exporter targets: {exc}", file=sys.stderr)
            return 2
        return _serve(args, host, port, fleet, started)
    incident, lost = node("--incident-node", args.incident_node), node("--lost-node", args.lost_node)
    if args.lost_node == str(DEFAULT_LOST_NODE) and lost is not None:
        # A fleet too small for the default lost GPU's node has none, and so has a layout that puts it in the
        # incident's job (one job on every node); a node asked for must exist.
        jobs = served_jobs(args.nodes, args.layout)
        if lost >= args.nodes or any(lost in job.nodes and incident in job.nodes for job in jobs):
            lost = None
    try:
        require_node("--incident-node", incident, args.nodes)
        require_node("--lost-node", lost, args.nodes)
    except ValueError as exc:  # before the capture's seconds
        parser.error(str(exc))
    started = time.monotonic()
    # The capture's nodes log what a starting node logs (no MFU before a second report, the lost GPU's Xid): not
    # news here.
    logging.getLogger("mfu_exporter").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="mfu-targets-") as tmp:
        templates = asyncio.run(capture(Path(tmp), incident=args.incident))
    logging.getLogger("mfu_exporter").setLevel(logging.WARNING)
    try:
        fleet = TargetFleet(
            templates,
            args.nodes,
            args.listen,
            parse_duration(args.interval),
            incident,
            lost,
            layout=args.layout,
            incident=args.incident,
        )
    except ValueError as exc:
        print(f"mfu-exporter targets: {exc}", file=sys.stderr)
        return 2
    return _serve(args, host, port, fleet, started)


def _serve(args: argparse.Namespace, host: str, port: str, fleet: TargetFleet, started: float) -> int:
    fleet.refresh()
    if args.file_sd:
        args.file_sd.write_text(json.dumps(file_sd(args.nodes, args.listen)))
    print(
        f"targets: {args.nodes} nodes ({fleet.layout} jobs) on http://{args.listen}/node/<i>/metrics, captured in "
        f"{time.monotonic() - started:.1f} s",
        flush=True,
    )
    app = create_app(fleet)

    async def serve() -> None:
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        await web.TCPSite(runner, host or None, int(port), reuse_address=True).start()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        await stop.wait()
        await runner.cleanup()

    asyncio.run(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
