"""Thousands of event sequences of a real training job and a real exporter, against the reference model of the truth
(tests/support/reference_model.py).

Each sequence drives real ``Service`` instances with injected clocks: a job reports its running total at its own
jittered cadence (1 s to ~300 s), may send heartbeats, crashes (its reports stop), restarts (a new run id or the same,
a start event, a checkpoint load, its total back to a checkpoint), reports a time too far ahead (refused, field
``time``), while the exporter pauses (no tick for 10–60 s, the reports meanwhile queued and read afterwards) and
restarts: a new ``Service`` on the same ``state.dir`` after its final ``save_counters`` (a clean stop) or with only
its last periodic save (killed), or without a ``state.dir``. A job's totals are its own running total (a client's
count) or a log reader's integrated sum since it began reading (``continues`` False). After every tick it
is scraped as Prometheus would, and the invariants are checked:

- every job counter (tokens, model FLOPs, GPU-seconds by kind, lost GPU-seconds by cause, restarts) never decreases
  within one series; across an exporter restart it resumes at or above its last value (the same series, its
  ``_created`` kept), or begins a new one at 0 at that exporter's first count, then holding no more than it can
  have counted since (``Series``); read without ``_created`` (a drop is a reset) it never reads more;
- what ``increase()`` reads of the token counter over the whole sequence is at most 1 % above the tokens the job
  trained from the first count to the newest accepted report, and at least 99 % of what the accepted reports prove
  (``TokenTruth``: it may miss the tokens between a crashed run's last report and the next run's first, and those
  trained while no exporter counted unless the next one resumed from ``state.dir`` in the job's running total);
  the FLOPs counter likewise, at FLOPs per token; the GPU-seconds and lost GPU-seconds at most the GPUs × the time
  the exporters ran;
- no MFU (None or 0) for a job whose process is gone, from the tick its heartbeats are missed (``HEARTBEAT_MISSES``
  of them, counted from its newest event the exporter read, or from the exporter's return after a gap of its own
  ticks, when heartbeats sent meanwhile may still wait in its socket), nor while its ledger says it is down;
- the ledger's GPU-seconds by kind plus its pending seconds × GPUs are the GPUs × the seconds since its origin;
- the ledger counts no more restarts than happened;
- nothing non-finite in the job's JSON or the rendered /metrics text.

``make test`` runs ``PROPERTY_EXAMPLES`` (2,000 by default) derandomized sequences: the same ones every run, so a
failure reproduces. ``make test-property`` runs 100,000 with a seed from the environment (``PROPERTY_SEED``).
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import tempfile
import time
from dataclasses import dataclass, field, replace
from typing import Any

from hypothesis import HealthCheck, example, given, seed, settings
from hypothesis import strategies as st
from prometheus_client.exposition import generate_latest

from mfu_exporter.config import validate
from mfu_exporter.model.errors import ValidationError
from mfu_exporter.model.ledger import HEARTBEAT_MISSES, KINDS, tick_gap
from mfu_exporter.model.progress import MAX_CLOCK_SKEW_SECONDS, parse_progress
from mfu_exporter.service import build_service
from tests.support.reference_model import JobTruth, Run, Series, TokenTruth

EXAMPLES = int(os.environ.get("PROPERTY_EXAMPLES", "2000"))
SEED = os.environ.get("PROPERTY_SEED")  # unset: derandomized (the same sequences every run)
TOLERANCE = 0.01  # the 1 % a rate() over the counters may be off the truth
PARAMS = 7e9
FLOPS_PER_TOKEN = 6 * PARAMS
PEAK_TFLOPS = 989.0
EXPECTED_MFU = 0.45
WALL = 1_800_000_000.0  # the wall clock when the monotonic clock reads 0
JOB = "llama"
STATE_ROOT = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


# -- the sequences ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Job:
    gpus: int
    mfu: float  # the job's true MFU while it trains: its rate follows
    cadence: float  # seconds between its reports
    jitter: float  # each interval is the cadence × (1 ± jitter)
    heartbeat: float | None  # its client's heartbeat interval, × the cadence; None: no heartbeats
    run_ids: bool  # its reports carry a run id
    steps: bool  # its reports carry a step
    step_seconds: float
    timestamps: bool  # its reports carry their own time
    integrated: bool  # its totals are a log reader's integrated rate since it began reading, not its own

    @property
    def rate(self) -> float:
        return self.mfu * self.gpus * PEAK_TFLOPS * 1e12 / FLOPS_PER_TOKEN

    @property
    def heartbeat_seconds(self) -> float | None:
        return None if self.heartbeat is None else min(max(self.heartbeat * self.cadence, 1.0), 3600.0)


@dataclass(frozen=True)
class Sequence:
    job: Job
    state_dir: bool  # the exporters keep the counters under a state.dir
    tick: float  # seconds between the exporter's evaluations (under the 5 s that reads as a gap of its own)
    seed: int  # the jitter of the job's intervals
    ops: tuple


# What happens, in order; each takes time. ("train", intervals): the job trains and reports. ("crash", down seconds,
# new run id, share of the run's tokens the checkpoint keeps, start-up seconds, load seconds or 0): its process dies,
# a new one starts after the down time and loads its checkpoint. ("exporter", down seconds, graceful): the exporter
# restarts (stopped, or killed right after a tick). ("pause", seconds, tick first): the exporter is stopped; the
# reports wait and are read after it resumes.
# ("skew", seconds ahead): the job's next report is dated ahead of the node's clock.
OPS = st.one_of(
    st.tuples(st.just("train"), st.floats(0.5, 6.0)),
    st.tuples(
        st.just("crash"),
        st.floats(0.0, 90.0),
        st.booleans(),
        st.floats(0.0, 1.0),
        st.floats(0.0, 30.0),
        st.one_of(st.just(0.0), st.floats(1.0, 120.0)),
    ),
    st.tuples(st.just("exporter"), st.floats(0.0, 60.0), st.booleans()),
    st.tuples(st.just("pause"), st.floats(10.0, 60.0), st.booleans()),
    st.tuples(st.just("skew"), st.one_of(st.floats(61.0, 86400.0), st.floats(0.0, 59.0))),
)

JOBS = st.builds(
    Job,
    gpus=st.integers(1, 8),
    mfu=st.floats(0.2, 0.6),
    # Log-uniform from 1 s to 300 s: most real cadences are short, a few minutes is normal too.
    cadence=st.floats(0.0, math.log(300.0)).map(math.exp),
    jitter=st.floats(0.0, 0.3),
    heartbeat=st.one_of(st.none(), st.floats(0.5, 2.0)),
    run_ids=st.booleans(),
    steps=st.booleans(),
    step_seconds=st.floats(0.5, 10.0),
    timestamps=st.booleans(),
    integrated=st.booleans(),
)

SEQUENCES = st.builds(
    Sequence,
    job=JOBS,
    state_dir=st.booleans(),
    tick=st.sampled_from([1.0, 2.0, 4.0]),
    seed=st.integers(0, 2**16),
    ops=st.lists(OPS, min_size=1, max_size=6).map(tuple),
)


# -- the world: the job's processes, the exporter, the clocks -----------------------------------------------------
class Clocks:
    def __init__(self) -> None:
        self.mono = 1000.0

    def monotonic(self) -> float:
        return self.mono

    def time(self) -> float:
        return WALL + self.mono


@dataclass
class Exporter:
    """One exporter process: its service and what the model knows of what it has seen."""

    service: Any
    instance: int
    born: float  # monotonic
    first_count: float | None = None  # job time of its first accepted token count
    origin: float | None = None  # the ledger's origin as the model places it (its first run event)
    last_seen: float | None = None  # the newest event it read of the run alive, on the ledger's clock
    last_run: Run | None = None  # the run of the newest event it read
    last_tick: float | None = None  # monotonic
    # When its ticks last resumed after a gap of its own: heartbeats sent meanwhile may still wait in its socket, so
    # a run's silence counts from then at the earliest.
    watching_since: float = 0.0
    job_ticked: bool = False  # a tick saw the job (its ledger's silence counts from its first tick at the earliest)
    published: Any = None  # the job's view at the last tick: what /metrics shows until the next one


@dataclass
class World:
    sequence: Sequence
    state: str | None
    clocks: Clocks = field(default_factory=Clocks)
    truth: JobTruth = field(default_factory=JobTruth)
    series: dict[str, Series] = field(default_factory=dict)
    broken: list[str] = field(default_factory=list)
    refused: int = 0  # reports refused for a time too far ahead
    gone_checked: int = 0  # ticks at which a dead run's missed heartbeats said it was gone (no MFU may be served)
    exporter: Exporter | None = None
    instances: int = 0
    ran_seconds: float = 0.0  # seconds the earlier exporters ran
    paused: bool = False
    queue: list = field(default_factory=list)
    heard: bool = True  # an event was accepted since the job JSON was last checked
    skew: float | None = None  # the next report's time ahead of the clock

    def __post_init__(self) -> None:
        self.tokens = TokenTruth(self.truth)
        self.random = random.Random(self.sequence.seed)
        job = self.sequence.job
        self.frame_start = self.clocks.mono  # where the integrated frame of the log reader began
        self.run_number = 1
        self.run_id = "r1" if job.run_ids else None
        self.start_exporter()
        self.begin_run(self.clocks.mono, 0.0, 0.0, 0.0)
        self.next_tick = self.clocks.mono

    # -- the exporter --------------------------------------------------------------------------------------------
    def start_exporter(self) -> None:
        job = self.sequence.job
        config: dict = {
            "mfu": {"interval": f"{self.sequence.tick:g}s"},  # the rhythm this sequence ticks the exporter at
            "jobs": {
                JOB: {"params": PARAMS, "gpus": job.gpus, "peak_tflops": PEAK_TFLOPS, "expected_mfu": EXPECTED_MFU}
            },
        }
        if self.state is not None:
            config["state"] = {"dir": self.state}
        service = build_service(validate(config), [], clock=self.clocks.time, monotonic=self.clocks.monotonic)
        service.load_counters()
        self.instances += 1
        self.exporter = Exporter(service, self.instances, self.clocks.mono, watching_since=self.clocks.mono)

    def restart_exporter(self, down: float, graceful: bool) -> None:
        """The exporter stops (``graceful``: it saves the counters as final and is scraped a last time) or is killed
        right after a tick (its last save is that tick's, or an older one), and a new one starts ``down`` s later."""
        if graceful:
            assert self.exporter is not None
            self.exporter.service.save_counters(final=True)  # as Service.stop does
            self.scrape(render=True)
        else:
            self.run_until(self.next_tick)
            assert self.exporter is not None
        self.ran_seconds += self.clocks.mono - self.exporter.born
        self.exporter = None
        # A running total says what the job did while no exporter counted: with state.dir the next one joins it.
        self.tokens.exporter_restarted(resumes=self.state is not None and not self.sequence.job.integrated)
        self.run_until(self.clocks.mono + down)
        if self.sequence.job.integrated:
            self.frame_start = self.clocks.mono  # the new reader integrates from where it begins
        self.start_exporter()
        self.next_tick = self.clocks.mono

    # -- the job -------------------------------------------------------------------------------------------------
    def begin_run(self, started: float, checkpoint: float, startup: float, load: float) -> None:
        job = self.sequence.job
        run = Run(self.run_id, started, started + startup + load, checkpoint, job.rate)
        self.truth.runs.append(run)
        self.run = run
        events = [(started, {"event": "start"})]
        if load > 0:
            step = self.step_of(checkpoint)
            events.append((started + startup, {"event": "checkpoint_load_started", "step": step}))
            events.append((started + startup + load, {"event": "checkpoint_load_finished", "step": step}))
        self.events = events
        self.next_report = run.trains_from + self.interval()
        beat = job.heartbeat_seconds
        self.next_heartbeat = started + beat if beat is not None else math.inf

    def interval(self) -> float:
        job = self.sequence.job
        return job.cadence * (1.0 + self.random.uniform(-job.jitter, job.jitter))

    def step_of(self, total: float) -> int:
        return int(total // (self.sequence.job.rate * self.sequence.job.step_seconds))

    def crash(self, down: float, new_id: bool, kept: float, startup: float, load: float) -> None:
        now = self.clocks.mono
        run = self.run
        run.ended = now
        self.next_report = self.next_heartbeat = math.inf
        self.events = []
        self.run_until(now + down)
        # The new process resumes from a checkpoint between the dead run's first and last total.
        checkpoint = run.start_total + kept * (run.total(now) - run.start_total)
        self.run_number += 1
        if self.sequence.job.run_ids and new_id:
            self.run_id = f"r{self.run_number}"
        self.begin_run(self.clocks.mono, checkpoint, startup, load)

    def body(self, t: float, extra: dict) -> dict:
        job = self.sequence.job
        body: dict[str, Any] = {"job": JOB, **extra}
        if self.run_id is not None:
            body["run"] = self.run_id
        if job.heartbeat_seconds is not None:
            body["heartbeat_seconds"] = job.heartbeat_seconds
        if job.timestamps:
            body["time"] = WALL + t
        return body

    def report_body(self, t: float) -> dict:
        job = self.sequence.job
        total = self.run.total(t)
        if job.integrated:
            total = self.truth.processed(self.frame_start, t)  # a reader's sum: it never goes back
        extra: dict[str, Any] = {"tokens_total": total}
        if job.steps:
            extra["step"] = self.step_of(self.run.total(t))
        body = self.body(t, extra)
        if self.skew is not None:
            body["time"] = WALL + t + self.skew
            self.skew = None
        return body

    # -- time passes -----------------------------------------------------------------------------------------------
    def run_until(self, end: float) -> None:
        """Every event up to ``end`` in time order: the job's reports, heartbeats and run events, the exporter's ticks."""
        while True:
            tick = self.next_tick if self.exporter is not None and not self.paused else math.inf
            event = self.events[0][0] if self.events else math.inf
            t = min(tick, event, self.next_report, self.next_heartbeat)
            if t > end:
                break
            self.clocks.mono = t
            if t == event:
                _, extra = self.events.pop(0)
                self.send(t, self.body(t, extra), progress=False)
            elif t == self.next_report:
                self.next_report = t + self.interval()
                self.send(t, self.report_body(t), progress=True)
            elif t == self.next_heartbeat:
                self.next_heartbeat = t + (self.sequence.job.heartbeat_seconds or math.inf)
                self.send(t, self.body(t, {"event": "heartbeat"}), progress=False)
            else:
                self.next_tick = t + self.sequence.tick
                self.tick()
        self.clocks.mono = max(self.clocks.mono, end)

    def send(self, t: float, body: dict, progress: bool) -> None:
        if self.exporter is None:
            return  # nothing listens: the client's report is lost
        if self.paused:
            self.queue.append((t, body, progress, self.run))
            return
        self.deliver(t, body, progress, self.run)

    def deliver(self, t: float, body: dict, progress: bool, run: Run) -> None:
        exporter = self.exporter
        assert exporter is not None
        now = self.clocks.mono
        ahead = body["time"] - WALL - now if "time" in body else 0.0
        try:
            report = parse_progress(body, self.clocks.time())
        except ValidationError as error:
            if error.field == "time" and ahead > MAX_CLOCK_SKEW_SECONDS:
                self.refused += 1
                return
            raise
        if ahead > MAX_CLOCK_SKEW_SECONDS:
            self.broken.append(f"a report {ahead:.0f} s ahead was accepted")
        if self.sequence.job.integrated:
            report = replace(report, continues=False)
        exporter.service.jobs.accept(report)
        self.heard = True  # the job JSON is checked at the next scrape (between events, only its clocks move)
        # The ledger places an event at its own time, but never later than it arrived.
        seen = min(body["time"] - WALL, now) if "time" in body else now
        if body.get("run") is not None or body.get("event") != "heartbeat":
            exporter.origin = max(exporter.born, seen) if exporter.origin is None else exporter.origin
        same = exporter.last_run is run and exporter.last_seen is not None
        exporter.last_seen = max(seen, exporter.last_seen) if same and exporter.last_seen is not None else seen
        exporter.last_run = run
        if progress:
            if exporter.first_count is None:
                exporter.first_count = t
            self.tokens.accepted(t, run)

    def pause(self, seconds: float, tick_first: bool) -> None:
        self.paused = True
        self.run_until(self.clocks.mono + seconds)
        self.paused = False
        if tick_first:
            self.tick()
        for t, body, progress, run in self.queue:
            self.deliver(t, body, progress, run)
        self.queue = []
        self.tick()
        self.next_tick = self.clocks.mono + self.sequence.tick

    # -- the exporter's tick and Prometheus's scrape ---------------------------------------------------------------
    def tick(self) -> None:
        exporter = self.exporter
        assert exporter is not None
        now = self.clocks.mono
        if exporter.last_tick is not None and now - exporter.last_tick > tick_gap(self.sequence.tick):
            exporter.watching_since = now
        if exporter.last_run is not None and not exporter.job_ticked:
            exporter.watching_since, exporter.job_ticked = now, True  # the job's ledger's first tick
        exporter.last_tick = now
        exporter.service.evaluate_once()
        exporter.published = next((v for v in exporter.service.jobs.views() if v.name == JOB), None)
        self.scrape(fresh=True)

    def scrape(self, render: bool = False, fresh: bool = False) -> None:
        """Read the counters as a scrape would; ``fresh``: right after a tick, whose views are of this instant (a
        read between ticks may get a view up to ``VIEW_MAX_AGE`` old)."""
        exporter = self.exporter
        assert exporter is not None
        service, now, gpus = exporter.service, self.clocks.mono, self.sequence.job.gpus
        views = [v for v in service.jobs.views() if v.name == JOB]
        ran = self.ran_seconds + now - exporter.born  # seconds the exporters ran so far
        lived = now - exporter.born
        fresh_tokens = self.tokens.since(exporter.first_count) if exporter.first_count is not None else 0.0
        check = self.check
        if views:
            (view,) = views
            # The token and FLOPs series began at a first count, here or in an exporter before (state.dir): their
            # _created. The ledger's and the attribution's begin with each exporter.
            created = service.jobs._jobs[JOB].counter_created
            if view.reported:
                check("tokens", view.tokens_processed, fresh_tokens, created)
            if view.model_flops is not None and view.reported:
                check("flops", view.model_flops, FLOPS_PER_TOKEN * fresh_tokens, created)
            ledger = view.ledger
            if ledger is not None:
                for kind in KINDS:
                    check(f"gpu_seconds{{{kind}}}", ledger.gpu_seconds[kind], gpus * lived)
                check("restarts", float(ledger.restarts), float(self.truth.restarts))
                if ledger.restarts > self.truth.restarts:
                    self.broken.append(f"the ledger counts {ledger.restarts} restarts of {self.truth.restarts}")
                if fresh and exporter.origin is not None:
                    booked = sum(ledger.gpu_seconds.values()) + ledger.pending_seconds * gpus
                    whole = gpus * (now - exporter.origin)
                    if abs(booked - whole) > 1e-6 * max(whole, 1.0) + 1e-6:
                        self.broken.append(
                            f"the ledger's kinds and pending hold {booked!r} GPU-seconds of {whole!r} since its origin"
                        )
                if ledger.state == "down" and view.mfu:
                    self.broken.append(f"MFU {view.mfu!r} served while the ledger says the job is down")
            self.check_gone(view)
            if self.heard or render:
                self.heard = False
                try:
                    json.dumps(service.job_json(view), allow_nan=False)
                except ValueError as error:
                    self.broken.append(f"job JSON: {error}: {service.job_json(view)!r}")
        self.bounds(exporter, gpus, ran, lived, render)

    def bounds(self, exporter: Exporter, gpus: int, ran: float, lived: float, render: bool) -> None:
        """The lost GPU-seconds, then what increase() reads over the whole sequence against the truth."""
        check = self.check
        for standing in exporter.service.attribution.standings():
            for cause, seconds in standing.lost_seconds:
                check(f"lost{{{cause}}}", seconds, gpus * lived)
        # Over the whole sequence: what increase() reads, against the truth.
        most = self.tokens.most()
        for name, bound in (("tokens", most), ("flops", FLOPS_PER_TOKEN * most)):
            series = self.series.get(name)
            if series is not None and series.increase > bound * (1 + TOLERANCE) + 1e-6:
                self.broken.append(f"increase({name}) reads {series.increase!r}, the truth is at most {bound!r}")
        for prefix in ("gpu_seconds", "lost"):
            counted = sum(s.increase for name, s in self.series.items() if name.startswith(prefix))
            if counted > gpus * ran * (1 + 1e-9) + 1e-6:
                self.broken.append(f"increase({prefix}) reads {counted!r} GPU-seconds in {ran!r} s of {gpus} GPUs")
        if render:
            self.render(exporter.published)

    def check(self, name: str, value: float, fresh_most: float, created: object = None) -> None:
        """One counter's scraped value; ``created``: when its series began (None: with this exporter)."""
        assert self.exporter is not None
        created = created or self.exporter.instance
        series = self.series.get(name)
        if series is None:
            series = self.series[name] = Series(name)
        elif series.value == value and series.created == created:
            return  # unchanged since the last scrape
        self.broken += series.scrape(value, created, fresh_most, TOLERANCE)

    def check_gone(self, view: Any) -> None:
        """No MFU for a job whose process is gone, from the first tick after its missed heartbeats say so (a scrape
        between two ticks reads the last tick's view)."""
        exporter, beat = self.exporter, self.sequence.job.heartbeat_seconds
        assert exporter is not None
        run, seen, ticked = exporter.last_run, exporter.last_seen, exporter.last_tick
        if beat is None or run is None or seen is None or ticked is None or run.ended > ticked:
            return
        if ticked - max(seen, exporter.watching_since) <= HEARTBEAT_MISSES * beat + 1e-6:
            return
        self.gone_checked += 1
        if view.mfu:
            self.broken.append(
                f"MFU {view.mfu!r} served {ticked - run.ended:.1f} s after the process died, its last event read "
                f"{ticked - seen:.1f} s before the last tick (heartbeat {beat:.1f} s)"
            )

    def render(self, view: Any) -> None:
        """The /metrics text: every sample finite, and the token counter the view's as of the last tick (``view``),
        which published it."""
        assert self.exporter is not None
        text = generate_latest(self.exporter.service.registry).decode()
        tokens = None
        for line in text.splitlines():
            if line.startswith("#"):
                continue
            value = float(line.rsplit(" ", 1)[1])
            if not math.isfinite(value):
                self.broken.append(f"/metrics: {line}")
            if line.startswith(f'mfu_job_tokens_total{{training_job="{JOB}"}} '):
                tokens = value
        if view is not None and view.reported and tokens != view.tokens_processed:
            self.broken.append(f"/metrics has tokens {tokens!r}, the view {view.tokens_processed!r}")

    # -- the script --------------------------------------------------------------------------------------------------
    def play(self) -> None:
        cadence = self.sequence.job.cadence
        for op in self.sequence.ops:
            kind = op[0]
            if kind == "train":
                self.run_until(self.clocks.mono + op[1] * cadence)
            elif kind == "crash":
                self.crash(*op[1:])
            elif kind == "exporter":
                self.restart_exporter(*op[1:])
            elif kind == "pause":
                self.pause(*op[1:])
            elif kind == "skew":
                self.skew = op[1]
                self.run_until(self.next_report)
        # Long enough for a crash's missed heartbeats, then the last scrape.
        beat = self.sequence.job.heartbeat_seconds
        tail = (HEARTBEAT_MISSES + 1) * beat if beat is not None else cadence
        self.run_until(self.clocks.mono + tail + self.sequence.tick)
        self.tick()
        self.scrape(render=True)
        proven = self.tokens.proven
        counted = self.series["tokens"].increase if "tokens" in self.series else 0.0
        if counted < proven * (1 - TOLERANCE) - 1e-6:
            self.broken.append(f"increase(tokens) reads {counted!r}, the accepted reports prove {proven!r}")
        for series in self.series.values():
            if series.naive > series.increase * (1 + 1e-9) + 1e-6:
                self.broken.append(f"{series.name}: read without _created, {series.naive!r} > {series.increase!r}")


def play(sequence: Sequence) -> World:
    # The job model logs a job's reason for having no MFU once per job; thousands of sequences need none of it.
    logger = logging.getLogger("mfu_exporter")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        with tempfile.TemporaryDirectory(dir=STATE_ROOT) as directory:
            world = World(sequence, directory if sequence.state_dir else None)
            world.play()
    finally:
        logger.setLevel(level)
    return world


PROPERTY = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=SEED is None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# Sequences played, reports refused for their time, sequences with a tick at which a dead run was known gone (for
# the long run's progress lines: how often each check had something to check).
PLAYED = [0, 0, 0]
STARTED = time.monotonic()
PROGRESS = int(os.environ.get("PROPERTY_PROGRESS", "0"))  # print a line every this many sequences (0: none)


# Sequences the long run found, kept: a scrape between two ticks after a dead run's heartbeats were missed.
FOUND = Sequence(
    Job(1, 0.5, 1.0, 0.0, 1.5, False, False, 1.0, False, False),
    state_dir=False,
    tick=1.0,
    seed=0,
    ops=(("train", 1.0), ("pause", 10.0, False), ("crash", 4.75, False, 0.0, 0.0, 0.0), ("exporter", 0.0, True)),
)


@PROPERTY
@(seed(int(SEED)) if SEED is not None else (lambda test: test))
@given(SEQUENCES)
@example(FOUND)
def test_the_counters_and_gauges_of_any_sequence_keep_to_the_truth(sequence):
    world = play(sequence)
    PLAYED[0] += 1
    PLAYED[1] += world.refused
    PLAYED[2] += world.gone_checked > 0
    if PROGRESS and PLAYED[0] % PROGRESS == 0:
        print(
            f"{PLAYED[0]} sequences played in {time.monotonic() - STARTED:.0f} s, {PLAYED[1]} reports refused for "
            f"their time, {PLAYED[2]} with a dead run's MFU checked",
            flush=True,
        )
    assert not world.broken, (world.broken[:5], sequence)
