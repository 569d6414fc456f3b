"""Training jobs on this node: their progress reports, model facts and live MFU.

Progress is cumulative (totals, not deltas), so a lost or repeated report loses nothing and double-counts
nothing. MFU over the window = FLOPs/token × Δtokens/Δt ÷ (job GPUs here × dense peak), with Δ taken between the
oldest and newest report inside the window, at least ``REPORT_RESOLUTION_SECONDS`` apart. Nothing here knows about
HTTP; its refusals are ``exporter.model.errors.IngestError`` (``ValidationError`` 400, ``TooManyJobs`` 429).

Every number a job's facts and reports lead to is finite: the facts are bounded (``exporter.config``, MAX_*), tokens
too, and a rate needs a time step of a second or more. An MFU above 1 is more FLOP/s than the GPUs' peak, so one
of the job's facts is wrong: that window is not exported and the job's reason says which fact to suspect.

A job ends when a report says ``state`` finished, failed or cancelled: its MFU, rate, ETA, peak and GPU series go at
once, it no longer takes a slot under ``max_jobs``, and its counters stay until ``job_ttl`` (or until
``max_jobs`` ended jobs are newer). A running report after that is a new run, on the same counters.
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily

from exporter.config import DEFAULTS, JOB_NAME_FORM, JOB_NAME_PATTERN, MAX_TOKENS, ConfigError, validate_job_facts
from exporter.model import flops as mfu_math
from exporter.model.discovery_jobs import DiscoveredJob, HardwareFigures, hardware_figures
from exporter.model.errors import TooManyJobs, ValidationError
from exporter.model.ledger import Ledger, LedgerView
from exporter.model.readings import GpuReading

log = logging.getLogger(__name__)

MAX_FUTURE_SECONDS = 86400.0
MAX_STEP = 2**53  # the largest integer a double (and so a Prometheus sample) holds exactly
# Reports closer together than this are merged in the MFU window, and a rate needs at least this much time between
# the window's ends: over a zero or nanosecond step any token count would be an infinite or absurd rate.
REPORT_RESOLUTION_SECONDS = 1.0
STATES = ("running", "finished", "failed", "cancelled")
RUNNING = "running"
FACT_KEYS = ("dtype", "gpus", "target_tokens", "peak_tflops", "expected_mfu")
MODEL_KEYS = ("params", "layers", "heads", "head_dim", "seq_len", "causal_attention")
FACT_DEFAULTS = {"dtype": "bf16", "causal_attention": False}
# What a run of the job says besides its totals (the ``event`` field; ``tokens_total`` is optional with one): its
# process started, it is alive, or it loads a checkpoint (``step``: the step it resumes from).
EVENTS = ("start", "heartbeat", "checkpoint_load_started", "checkpoint_load_finished")
RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$")
MAX_HEARTBEAT_SECONDS = 3600.0


@dataclass(frozen=True)
class GpuInfo:
    """One GPU of this node as the GPU source sees it; all that jobs need to know to find their peak."""

    index: int
    uuid: str
    name: str


def validate_job_name(value: Any, field_name: str = "job") -> str:
    if not isinstance(value, str) or not JOB_NAME_PATTERN.match(value):
        raise ValidationError(field_name, f"{field_name} must be {JOB_NAME_FORM}")
    return value


def validate_time(value: Any, now: float, field_name: str = "time") -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValidationError(field_name, f"{field_name} must be a Unix time in seconds")
    if value > now + MAX_FUTURE_SECONDS:
        raise ValidationError(field_name, f"{field_name} is more than a day in the future")
    return float(value)


def require_object(body: Any) -> dict:
    if not isinstance(body, dict):
        raise ValidationError("", "the body must be a JSON object")
    return body


def reject_unknown(body: dict, known: Iterable[str], prefix: str = "") -> None:
    known = set(known)
    for key in body:
        if key not in known:
            raise ValidationError(
                prefix + str(key), f"unknown field {prefix}{key!s}; known fields: {', '.join(sorted(known))}"
            )


MAX_KEPT_FACTS = 256  # validated fact sets kept; a node has a few jobs, each sending the same facts every report
_kept_facts: dict[str, dict] = {}


def _validated_facts(raw_facts: dict) -> dict:
    """``validate_job_facts(raw_facts, "request")``, kept by the facts' ``repr``: a job sends the same model facts in
    every report, and validating them is most of a report's parse. The text tells 1 from 1.0 and True, "1" from 1
    and 0.0 from -0.0, so facts that validate differently never share an entry; facts that fail are validated every
    time. (JSON bodies hold only dicts, lists, strings, numbers, booleans and null, whose ``repr`` says all.)"""
    try:
        key = repr(raw_facts)
    except ValueError:  # an integer too long to write: validation says what it makes of it
        return validate_job_facts(raw_facts, "request")
    validated = _kept_facts.get(key)
    if validated is None:
        validated = validate_job_facts(raw_facts, "request")
        if len(_kept_facts) >= MAX_KEPT_FACTS:
            _kept_facts.clear()
        _kept_facts[key] = validated
    return validated


@dataclass(frozen=True)
class ProgressReport:
    job: str
    tokens_total: float | None  # None only in an event-only report (a start, a heartbeat, a checkpoint load)
    step: int | None
    time: float | None
    facts: dict[str, Any]  # only the facts this report carries, validated
    state: str = RUNNING
    run: str | None = None  # the run's id (one per process): a new id is a new run
    event: str | None = None
    heartbeat: float | None = None  # seconds between the client's heartbeats, when it sends them
    duration: float | None = None  # of a finished checkpoint load, timed by the job


def parse_progress(body: Any, now: float) -> ProgressReport:
    """Validate a ``POST /api/v1/progress`` body; raises ValidationError naming the field."""
    body = require_object(body)
    reject_unknown(
        body,
        (
            "job",
            "tokens_total",
            "step",
            "time",
            "state",
            "model",
            "run",
            "event",
            "heartbeat_seconds",
            "duration_seconds",
        )
        + FACT_KEYS,
    )
    job = validate_job_name(body.get("job"))
    run, event, heartbeat, duration = _run_fields(body)
    tokens = body.get("tokens_total")
    if tokens is None and event is not None:
        pass  # an event-only report: no totals
    elif (
        isinstance(tokens, bool)
        or not isinstance(tokens, (int, float))
        or not math.isfinite(tokens)
        or not 0 <= tokens <= MAX_TOKENS
    ):
        raise ValidationError(
            "tokens_total",
            f"tokens_total must be the number of tokens processed so far (a running total), from 0 to {MAX_TOKENS:g}",
        )
    step = body.get("step")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0 or step > MAX_STEP):
        raise ValidationError("step", "step must be an integer from 0 to 2^53")
    report_time = validate_time(body.get("time"), now)
    state = body.get("state", RUNNING)
    if state not in STATES:
        raise ValidationError("state", "state must be running, finished, failed or cancelled")

    model = body.get("model")
    if model is None:
        model = {}
    if not isinstance(model, dict):
        raise ValidationError("model", 'model must be an object like {"params": "70B", "layers": 80}')
    reject_unknown(model, MODEL_KEYS, "model.")
    raw_facts = {k: v for k, v in model.items() if v is not None}
    raw_facts.update({k: body[k] for k in FACT_KEYS if body.get(k) is not None})
    try:
        validated = _validated_facts(raw_facts)
    except ConfigError as exc:
        field_name = f"model.{exc.path}" if exc.path in MODEL_KEYS else exc.path
        raise ValidationError(field_name, f"{field_name}: {exc.detail}") from None
    facts = {k: validated[k] for k in raw_facts}
    total = float(tokens) if tokens is not None else None
    return ProgressReport(job, total, step, report_time, facts, state, run, event, heartbeat, duration)


def _run_fields(body: dict) -> tuple[str | None, str | None, float | None, float | None]:
    """The run fields of a progress report: ``run`` (its id), ``event``, ``heartbeat_seconds``, ``duration_seconds``."""
    run = body.get("run")
    if run is not None and (not isinstance(run, str) or not RUN_ID.match(run)):
        raise ValidationError("run", "run must be the run's id: 1–64 letters, digits, '.', '_', ':' or '-'")
    event = body.get("event")
    if event is not None and event not in EVENTS:
        raise ValidationError("event", f"event must be one of {', '.join(EVENTS)}")
    numbers = []
    for key, limit in (("heartbeat_seconds", MAX_HEARTBEAT_SECONDS), ("duration_seconds", MAX_FUTURE_SECONDS)):
        value = body.get(key)
        if value is not None and (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or not 0 < value <= limit
        ):
            raise ValidationError(key, f"{key} must be a number of seconds above 0, at most {limit:g}")
        numbers.append(float(value) if value is not None else None)
    if numbers[1] is not None and event != "checkpoint_load_finished":
        raise ValidationError("duration_seconds", "duration_seconds belongs to event checkpoint_load_finished")
    return run, event, numbers[0], numbers[1]


@dataclass
class Job:
    name: str
    facts: dict[str, Any]
    created: float
    tokens_total: float = 0.0
    step: int | None = None
    last_report_time: float = 0.0  # the job's own time of its newest report
    last_arrival: float = 0.0  # our clock, when the newest report arrived
    restarts: int = 0
    replayed_tokens: float = 0.0  # tokens re-trained after restarts from checkpoints
    window: deque = field(default_factory=deque)  # (report time, tokens_total)
    reported: bool = False
    state: str = RUNNING
    ended: float | None = None  # our clock, when a report said the job ended
    runs: int = 1  # runs under this name since the exporter first saw it (a report after an end starts one)
    carried_tokens: float = 0.0  # tokens processed by the earlier runs, so the counters continue across runs
    flops_total: float = 0.0  # model FLOPs counted so far: each token at the FLOPs/token known when it was reported
    counted_tokens: float = 0.0  # of carried + processed tokens, those already in flops_total
    # Log-fed jobs (sources.logs): what the framework printed about its own speed, and why the log's lines give
    # no token total yet (a missing world size or sequence length), shown as the job's reason.
    framework_mfu: float | None = None
    framework_tflops_per_gpu: float | None = None
    feed_reason: str | None = None
    interval: float = 0.0  # the job's own time between its last two reports
    touched: bool = False  # created by another API (checkpoints, a log): counts against ingest.max_jobs like a report
    discovered: DiscoveredJob | None = None  # what discovery found of it on this node, while it finds it
    ledger: Ledger = field(default_factory=Ledger)  # where its time here went (exporter.model.ledger)
    pods: frozenset | None = None  # the pods (or Slurm steps) discovery found it in: a new one is a new run

    @property
    def tokens_processed(self) -> float:
        return self.carried_tokens + self.tokens_total + self.replayed_tokens


@dataclass
class JobView:
    """A job's state at one instant, for metrics, JSON and the status page."""

    name: str
    tokens_total: float
    step: int | None
    last_report_time: float
    tokens_per_second: float | None
    flops_per_token: float | None
    gpus: int | None
    peak_flops: float | None
    mfu: float | None
    eta_seconds: float | None
    reason: str | None
    facts: dict[str, Any]
    restarts: int
    gpu_indices: list[int] | None = None
    found_by: tuple[str, ...] = ()  # reported, config, kubernetes, slurm
    discovered: DiscoveredJob | None = None
    hardware: HardwareFigures | None = None
    replayed_tokens: float = 0.0
    state: str = RUNNING
    runs: int = 1
    tokens_processed: float = 0.0  # monotonic: tokens of earlier runs, the reported total and replayed tokens
    model_flops: float | None = None  # the FLOPs counter; None until the job's FLOPs per token are known
    implausible_mfu: float | None = None  # an MFU above 1, withheld from the metrics (``reason`` says why)
    reported: bool = True  # False for a job known only by name (checkpoints, a log with no progress lines yet)
    framework_mfu: float | None = None  # the framework's own MFU (printed, or its TFLOP/s/GPU over our peak)
    framework_tflops_per_gpu: float | None = None
    ledger: LedgerView | None = None  # None until a run of it shows progress (or its client says it started)

    @property
    def running(self) -> bool:
        return self.state == RUNNING

    def as_json(self) -> dict[str, Any]:
        return {
            "job": self.name,
            "tokens_total": self.tokens_total,
            "step": self.step,
            "last_report_time": self.last_report_time,
            "tokens_per_second": self.tokens_per_second,
            "flops_per_token": self.flops_per_token,
            "gpus": self.gpus,
            "gpu_indices": self.gpu_indices,
            "found_by": list(self.found_by),
            "discovered": self.discovered.as_json() if self.discovered else None,
            "hardware": self.hardware.as_json() if self.hardware else None,
            "peak_flops": self.peak_flops,
            "mfu": self.mfu,
            "eta_seconds": self.eta_seconds,
            "reason": self.reason,
            "restarts": self.restarts,
            "replayed_tokens": self.replayed_tokens,
            "state": self.state,
            "runs": self.runs,
            "implausible_mfu": self.implausible_mfu,
            "framework_mfu": self.framework_mfu,
            "framework_tflops_per_gpu": self.framework_tflops_per_gpu,
            "ledger": self.ledger.as_json() if self.ledger is not None else None,
            "model": {k: self.facts.get(k) for k in MODEL_KEYS},
            **{k: self.facts.get(k) for k in FACT_KEYS},
        }


class JobTracker:
    """Thread-safe store of jobs reporting to this node, and of the jobs discovery finds on it.

    ``gpu_inventory`` returns this node's GPUs (from the GPU source) or None when unknown; it is how a job's
    peak is found without this module knowing about NVML. ``gpu_readings`` returns the GPU source's latest
    readings by index (or None): each job's hardware figures are their means over the job's GPUs.

    A discovered job and a reporting job of one name are one job. Discovered jobs have their own cap (the
    discovery source's ``max_jobs``), so they never take a reporting job's place under ``ingest.max_jobs``; one
    that discovery stops finding ends, unless it reports too (then only its discovery facts go).
    """

    def __init__(
        self,
        configured: dict[str, dict] | None = None,
        window: float = DEFAULTS.mfu.window,  # the config table's defaults (exporter/config.py)
        max_jobs: int = DEFAULTS.ingest.max_jobs,
        job_ttl: float = DEFAULTS.ingest.job_ttl,
        gpu_inventory: Callable[[], list[GpuInfo] | None] = lambda: None,
        clock: Callable[[], float] = time.time,
        gpu_readings: Callable[[], dict[int, GpuReading] | None] = lambda: None,
        monotonic: Callable[[], float] = time.monotonic,
    ):
        self._configured = configured or {}
        self.window = window
        self.max_jobs = max_jobs
        self.job_ttl = job_ttl
        self._gpu_inventory = gpu_inventory
        self._gpu_readings = gpu_readings
        self._clock = clock
        self._monotonic = monotonic  # the ledgers' clock: a wall-clock step moves no second from one kind to another
        self._born = monotonic()  # a ledger counts no time before this exporter started
        self._lock = threading.Lock()
        self._jobs: dict[str, Job] = {}
        self._warned: set[tuple[str, str]] = set()  # (job, reason) already logged
        self.generation = 0
        self._expiry_bound = (float("inf"), 0.0)  # (clock of the last pass over the jobs, their oldest arrival then)

    def report(self, report: ProgressReport, view: bool = True) -> JobView | None:
        now = self._clock()
        with self._lock:
            self._expire(now)
            job = self._jobs.get(report.job)
            if job is None or not (job.reported or job.touched):
                # New to the ingest APIs (a job only discovered so far takes no slot until it reports).
                if report.state == RUNNING:
                    self._admit()
                if job is None:
                    job = Job(report.job, dict(self._configured.get(report.job, {})), created=now)
                    self._jobs[report.job] = job
            elif job.state != RUNNING and report.state == RUNNING:
                self._admit()
                self._new_run(job, now)
            job.facts.update(report.facts)
            at = report.time if report.time is not None else now
            if report.tokens_total is None:
                # An event of the run (start, heartbeat, checkpoint load): its ledger's, no totals to count.
                job.touched = True
                job.last_arrival = now
                self._ledger_report(job, report, at, now)
                if report.state != job.state:
                    self._end(job, report.state, now)
                self.generation += 1
                return self._answer(job, now) if view else None
            before = job.tokens_total if job.reported else report.tokens_total
            if job.reported and report.tokens_total < job.tokens_total:
                # Restarted from a checkpoint: a new window, never a negative rate; the exported counters keep
                # counting up (re-trained tokens are work done again), so rate() sees no false reset spike.
                job.window.clear()
                job.restarts += 1
                job.replayed_tokens += job.tokens_total - report.tokens_total
            if job.window and at < job.window[-1][0]:
                at = job.window[-1][0]  # reports out of order by the job's clock: keep the window monotonic
            if job.window and at > job.window[-1][0]:
                job.interval = at - job.window[-1][0]
            if len(job.window) >= 2 and at - job.window[-2][0] < REPORT_RESOLUTION_SECONDS:
                # Jobs may report every step: the rate needs only the window's ends, so reports closer than the
                # resolution replace the newest point and a window holds ~one point per second, not per step.
                job.window[-1] = (at, report.tokens_total)
            else:
                job.window.append((at, report.tokens_total))
            while len(job.window) > 2 and job.window[1][0] < at - self.window:
                job.window.popleft()
            job.tokens_total = report.tokens_total
            if report.step is not None:
                job.step = report.step
            job.last_report_time = at
            job.last_arrival = now
            job.reported = True
            self._count_flops(job)
            self._ledger_report(job, report, at, now, before)
            if report.state != job.state:
                self._end(job, report.state, now)
            self.generation += 1
            # A log source feeds many lines at once and needs no view of each (a view looks the peak up); the
            # 1 s tick logs its reason then.
            if not view:
                return None
            return self._answer(job, now)

    def _answer(self, job: Job, now: float) -> JobView:
        answer = self._view(job, now)
        self._warn(answer)
        return answer

    # -- the time ledger (exporter.model.ledger) ----------------------------------------------------------------
    def _clocks(self, at: float | None, now: float) -> tuple[float, float, float]:
        """(the event's monotonic time, monotonic now, Unix minus monotonic time). An event's own Unix time counts
        back from now on the monotonic clock, never past it: a report that arrives late keeps its time."""
        mono = self._monotonic()
        when = mono if at is None else mono - min(max(now - at, 0.0), MAX_FUTURE_SECONDS)
        return max(when, min(self._born, mono)), mono, now - mono

    def _ledger(self, job: Job, mono: float, offset: float) -> Ledger:
        job.ledger.set_gpus(mono, offset, self._job_gpus(job) or 0)
        return job.ledger

    def _job_gpus(self, job: Job) -> int | None:
        facts = {**FACT_DEFAULTS, **job.facts}
        if facts.get("gpus") is None and job.discovered is not None:
            facts["gpus"] = list(job.discovered.gpus)
        return self._resolve_gpus(facts)[1]

    def _ledger_report(self, job: Job, report: ProgressReport, at: float, now: float, before: float = 0.0) -> None:
        """The report for the job's ledger; ``before`` is the job's token total before it."""
        when, mono, offset = self._clocks(at, now)
        ledger = self._ledger(job, mono, offset)
        if report.event == "start" or report.run is not None:
            ledger.start_run(when, offset, "client", report.run, restart=report.event == "start")
        if report.event == "heartbeat" or report.heartbeat:
            ledger.alive(when, report.heartbeat)
        if report.event == "checkpoint_load_started":
            ledger.load("started", when, offset, resume=report.step)
        elif report.event == "checkpoint_load_finished":
            ledger.load("finished", when, offset, duration=report.duration, resume=report.step)
        elif report.tokens_total is not None:
            position = report.step if report.step is not None else report.tokens_total
            ledger.progress(when, offset, float(position), "client", steps=report.step is not None)
            if report.step is not None and report.tokens_total > before:
                ledger.advanced(when, offset)  # tokens grew within the step: progress, whatever the step says
        if report.state != RUNNING:
            ledger.end_run(when, offset, report.state)

    def run_event(
        self,
        name: str,
        event: str,
        at: float | None = None,
        *,
        step: int | None = None,
        duration: float | None = None,
        source: str = "log",
    ) -> None:
        """What a log (or another feed) says of the job's run: ``start`` (start-up lines: a new process),
        ``checkpoint_load_started``/``_finished`` (``step``: resumed from), ``training_starts`` (``step``: the
        first step it trains), ``alive`` (a line with nothing else). Needs the job known (observe or touch)."""
        with self._job_ledger(name, at) as found:
            if found is None:
                return
            ledger, when, offset = found
            if event == "start":
                ledger.start_run(when, offset, source)
            elif event in ("checkpoint_load_started", "checkpoint_load_finished"):
                phase = "started" if event.endswith("started") else "finished"
                ledger.load(phase, when, offset, duration=duration, resume=step)
            elif event == "training_starts" and step is not None:
                ledger.resume_at(when, offset, float(max(step - 1, 0)), source)
            else:
                ledger.alive(when)

    def checkpoint_event(self, name: str, phase: str, at: float, duration: float | None) -> None:
        """A checkpoint write of the job started, finished or failed (the checkpoint tracker tells, for every feed)."""
        with self._job_ledger(name, at) as found:
            if found is not None:
                ledger, when, offset = found
                ledger.save(phase, when, offset, duration)

    @contextlib.contextmanager
    def _job_ledger(self, name: str, at: float | None) -> Iterator[tuple[Ledger, float, float] | None]:
        """Under the lock: the job's ledger (its GPU count brought up to date), the event's monotonic time and the
        clocks' offset; None for a job not known. A change to the model either way."""
        now = self._clock()
        with self._lock:
            job = self._jobs.get(name)
            if job is None:
                yield None
                return
            when, mono, offset = self._clocks(at, now)
            yield self._ledger(job, mono, offset), when, offset
            self.generation += 1

    def observe(
        self,
        name: str,
        *,
        step: int | None = None,
        framework_mfu: float | None = None,
        framework_tflops_per_gpu: float | None = None,
        reason: str | None = None,
        facts: dict[str, Any] | None = None,
        at: float | None = None,
    ) -> None:
        """What a log line says besides a token total: the step, the framework's own figures, model facts it
        printed, or why the line gives no total (``reason``; None once a total arrives through ``report``).
        ``at`` is the line's time (the step's, for the ledger). Creates the job like touch (and raises TooManyJobs
        like it)."""
        self.touch(name)
        with self._lock:
            job = self._jobs.get(name)
            if job is None:
                return
            if facts:
                job.facts.update(facts)
            if step is not None:
                job.step = step
                when, mono, offset = self._clocks(at, self._clock())
                self._ledger(job, mono, offset).progress(when, offset, float(step), "log")
            if framework_mfu is not None:
                job.framework_mfu = framework_mfu
            if framework_tflops_per_gpu is not None:
                job.framework_tflops_per_gpu = framework_tflops_per_gpu
            job.feed_reason = reason
            job.last_arrival = max(job.last_arrival, self._clock())
            self.generation += 1

    def gpu_count(self, name: str) -> int | None:
        """The job's GPUs on this node as its MFU counts them: its gpus fact, else the GPUs discovery saw it hold,
        else the GPU inventory (``_gpu_facts``, the rule the MFU's peak follows)."""
        with self._lock:
            job = self._jobs.get(name)
            facts = {**FACT_DEFAULTS, **(job.facts if job else self._configured.get(name, {}))}
            facts = self._gpu_facts(facts, job)
        return self._resolve_gpus(facts)[1]

    @staticmethod
    def _gpu_facts(facts: dict, job: Job | None) -> dict:
        """``facts`` with the GPUs discovery saw the job hold, where the job named none itself. A log's tokens per
        GPU are scaled by this count too, so tokens and peak are over the same GPUs (counting every GPU on a shared
        node made a 2-GPU Slurm job's MFU four times too high on 8)."""
        if facts.get("gpus") is None and job is not None and job.discovered is not None:
            return {**facts, "gpus": list(job.discovered.gpus)}
        return facts

    def _admit(self) -> None:
        """Refuse one more running job past the cap; ended jobs keep their counters but take no slot, and jobs only
        discovered count against discovery.max_jobs instead."""
        if sum(1 for j in self._jobs.values() if j.state == RUNNING and (j.reported or j.touched)) >= self.max_jobs:
            raise TooManyJobs(f"this exporter already tracks {self.max_jobs} running jobs (ingest.max_jobs)")

    def _new_run(self, job: Job, now: float) -> None:
        """A report after the job ended: a run of its own, whose counters carry on from the last run's."""
        log.info("job %s: reporting again after it %s: run %d starts", job.name, job.state, job.runs + 1)
        job.carried_tokens += job.tokens_total + job.replayed_tokens
        job.tokens_total = job.replayed_tokens = 0.0
        job.restarts = 0
        job.step = None
        job.window.clear()
        job.facts = dict(self._configured.get(job.name, {}))
        job.state, job.ended, job.runs = RUNNING, None, job.runs + 1
        job.framework_mfu = job.framework_tflops_per_gpu = job.feed_reason = None
        job.created = now
        self._warned = {key for key in self._warned if key[0] != job.name}

    def _end(self, job: Job, state: str, now: float) -> None:
        if job.state == RUNNING:
            log.info(
                "job %s %s (its progress report says so): its MFU series end, its counters stay for %s",
                job.name,
                state,
                "ingest.job_ttl",
            )
        job.state, job.ended = state, now
        job.window.clear()
        ended = sorted((j for j in self._jobs.values() if j.state != RUNNING), key=lambda j: j.ended or 0.0)
        for old in ended[: max(len(ended) - self.max_jobs, 0)]:
            # Ended jobs are bounded too, or a stream of short runs would grow memory and /metrics until the TTL.
            del self._jobs[old.name]
            self._warned = {key for key in self._warned if key[0] != old.name}

    def _count_flops(self, job: Job) -> None:
        """Add the tokens not yet counted at the job's current FLOPs per token: the counter never goes back, even
        when the job changes its model facts (an earlier token keeps the FLOPs it was counted with)."""
        fpt = self._flops_per_token({**FACT_DEFAULTS, **job.facts})
        if fpt is None:
            return  # counted once params arrive: then all tokens so far, as if they had been known from the start
        processed = job.tokens_processed
        if processed > job.counted_tokens:
            job.flops_total += fpt * (processed - job.counted_tokens)
            job.counted_tokens = processed

    @staticmethod
    def _flops_per_token(facts: dict) -> float | None:
        if not facts.get("params"):
            return None
        return mfu_math.flops_per_token(
            mfu_math.ModelShape(
                facts["params"],
                facts.get("layers"),
                facts.get("heads"),
                facts.get("head_dim"),
                facts.get("seq_len"),
                bool(facts.get("causal_attention")),
            )
        )

    def touch(self, name: str) -> None:
        """Create a job known only from another API (checkpoints) so it counts against the cap."""
        now = self._clock()
        with self._lock:
            self._expire(now)
            job = self._jobs.get(name)
            if job is None or not (job.reported or job.touched):
                self._admit()
                if job is None:
                    job = self._jobs[name] = Job(name, dict(self._configured.get(name, {})), created=now)
                job.touched = True
                self.generation += 1

    def set_discovered(self, found: dict[str, DiscoveredJob]) -> None:
        """What discovery finds now: new jobs begin, known ones get its facts, the ones it no longer finds end
        (or, when they also report, keep only what they report)."""
        now = self._clock()
        with self._lock:
            changed = False
            when, mono, offset = self._clocks(None, now)
            for name, discovered in found.items():
                job = self._jobs.get(name)
                if job is None:
                    job = self._jobs[name] = Job(name, dict(self._configured.get(name, {})), created=now)
                    changed = True
                if job.discovered != discovered:
                    job.discovered = discovered
                    changed = True
                pods = frozenset(
                    (p.scheduler, p.namespace, p.pod, p.slurm_job_id, step)
                    for p in discovered.pods
                    for step in (p.slurm_steps.split(",") if p.slurm_steps else [""])
                )
                if pods != job.pods:
                    # Found again, or in a pod (a Slurm step) it was not in before: a new process, a new run.
                    # Found for the first time: the run it is in, whose start we did not see.
                    restart = job.pods is not None and bool(pods - job.pods)
                    if job.pods is None or restart:
                        self._ledger(job, mono, offset).start_run(when, offset, "discovery", restart=restart)
                    job.pods = pods
            for name, job in list(self._jobs.items()):
                if job.pods is not None and name not in found:
                    # Its pod (or Slurm step) went away: the run ended at its last sign of life.
                    ledger = self._ledger(job, mono, offset)
                    ledger.end_run(ledger.last_seen if ledger.last_seen is not None else when, offset, "gone")
                    job.pods = None
                    changed = True
                if job.discovered is not None and name not in found:
                    job.discovered = None
                    changed = True
                    self._expiry_bound = (float("inf"), 0.0)  # it may expire now: the next pass looks at every job
                    if not (job.reported or job.touched):
                        del self._jobs[name]
                        self._warned = {key for key in self._warned if key[0] != name}
            if changed:
                self.generation += 1

    def names(self) -> list[str]:
        with self._lock:
            return list(self._jobs)

    def is_discovered(self, name: str) -> bool:
        """Whether the job model holds the job as discovery last found it (its GPUs known to ``gpu_count``)."""
        with self._lock:
            job = self._jobs.get(name)
            return job is not None and job.discovered is not None

    def views(self) -> list[JobView]:
        """Every job as it stands now; a read that changes nothing (scrapes and the status API call it, from the
        encoder's threads too). A job past ``job_ttl`` is left out, though the tick or the next report forgets it."""
        now = self._clock()
        with self._lock:
            return self._views(now)

    def tick(self) -> list[JobView]:
        """The 1 s evaluation: forget the jobs past ``job_ttl``, log once each job's new reason for having no MFU,
        and return the views (``views()`` then). Reads never do this, so a scrape leaves the model as it found it."""
        now = self._clock()
        with self._lock:
            self._expire(now)
            _, mono, offset = self._clocks(None, now)
            for job in self._jobs.values():
                self._ledger(job, mono, offset).tick(mono, offset)
            views = self._views(now)
            for view in views:
                self._warn(view)
            return views

    def _views(self, now: float) -> list[JobView]:
        # Jobs that report first (their formula MFU is the headline), then those only discovered; each in the order
        # they appeared.
        ordered = sorted(
            (job for job in self._jobs.values() if not self._expired(job, now)),
            key=lambda job: not (job.reported or job.touched),
        )
        return [self._view(job, now) for job in ordered]

    def _expired(self, job: Job, now: float) -> bool:
        # A job discovery still finds holds GPUs here: it does not expire for want of reports.
        return job.discovered is None and now - max(job.last_arrival, job.created) > self.job_ttl

    def _warn(self, view: JobView) -> None:
        """Log a running job's reason for having no MFU, once per job and reason. Per job: two jobs without params
        each deserve a line, though the reason reads the same. A job only discovered has no formula MFU by nature
        (its hardware figures stand in): nothing to warn about."""
        if (
            not (view.reason and view.running and "reported" in view.found_by)
            or (view.name, view.reason) in self._warned
        ):
            return
        self._warned.add((view.name, view.reason))
        log.warning("job %s: no MFU: %s", view.name, view.reason)

    def _expire(self, now: float) -> None:
        # Every report comes here: skip the pass over the jobs while even the oldest arrival seen at the last pass is
        # within the TTL. Arrivals only move forward, and new ones are at least that pass's clock, so the oldest is a
        # bound for all; a clock that went back since that pass makes a full pass.
        scanned_at, oldest = self._expiry_bound
        if scanned_at <= now and now - oldest <= self.job_ttl:
            return
        expired = [name for name, job in self._jobs.items() if self._expired(job, now)]
        for name in expired:
            del self._jobs[name]
            self.generation += 1
        if expired:  # a job of the same name later is a new one, and the set stays as small as the jobs
            self._warned = {key for key in self._warned if key[0] not in expired}
        self._expiry_bound = (now, min([now, *(max(j.last_arrival, j.created) for j in self._jobs.values())]))

    def _rate(self, job: Job, now: float) -> float | None:
        if not job.reported:
            return None
        if now - job.last_arrival > max(self.window, 2 * job.interval):
            # No report for a whole window (or twice the job's own cadence, for one that reports less often, like
            # a log printed every few minutes): the job is not progressing.
            return 0.0
        points = [p for p in job.window if p[0] >= job.last_report_time - self.window]
        if len(points) < 2 and len(job.window) >= 2:
            points = [job.window[-2], job.window[-1]]  # reports sparser than the window: use the last interval
        if len(points) < 2:
            return None
        (t0, n0), (t1, n1) = points[0], points[-1]
        if t1 - t0 < REPORT_RESOLUTION_SECONDS:
            return None  # a zero or sub-second step divides nothing: wait for reports further apart
        return (n1 - n0) / (t1 - t0)

    def _resolve_gpus(self, facts: dict) -> tuple[list[GpuInfo] | None, int | None, str | None]:
        """The job's GPUs on this node (when the inventory is known) and their count."""
        wanted = facts.get("gpus")
        inventory = self._gpu_inventory()
        if inventory is None:
            if isinstance(wanted, int):
                return None, wanted, None
            if isinstance(wanted, list):
                return None, len(wanted), None
            return None, None, "the job gave no gpus and the GPU inventory is unknown (GPU source down)"
        if wanted is None:
            return inventory, len(inventory), None if inventory else "no GPUs visible on this node"
        if isinstance(wanted, int):
            if wanted > len(inventory):
                return inventory, wanted, f"the job declares {wanted} GPUs but this node has {len(inventory)}"
            return sorted(inventory, key=lambda g: g.index)[:wanted], wanted, None
        by_key = {g.index: g for g in inventory} | {g.uuid: g for g in inventory}
        chosen = [by_key[w] for w in wanted if w in by_key]
        missing = [w for w in wanted if w not in by_key]
        if missing:
            return chosen, len(wanted), f"job GPUs not found on this node: {', '.join(map(str, missing))}"
        # Validation refuses a repeated entry, but an index and a UUID can name the same GPU: counted twice, its
        # peak would halve the job's MFU.
        named: dict[int, int | str] = {}  # GPU index -> how the job named it (its index or its UUID)
        for key, gpu in zip(wanted, chosen):
            if gpu.index in named:
                return (
                    None,
                    None,
                    f"job GPUs name GPU {gpu.index} twice (as {named[gpu.index]} and {key}); list each GPU once",
                )
            named[gpu.index] = key
        return chosen, len(wanted), None

    def _peak(self, facts: dict, gpus: list[GpuInfo] | None, count: int | None) -> tuple[float | None, str | None]:
        if facts.get("peak_tflops"):
            return (facts["peak_tflops"] * 1e12 * count, None) if count else (None, None)
        if count is None:
            return None, None
        if gpus is None:
            return None, "the GPU models here are unknown (GPU source down or absent); set peak_tflops for this job"
        dtype = facts.get("dtype") or "bf16"
        total = 0.0
        for gpu in gpus:
            peak = mfu_math.peak_flops(gpu.name, dtype)
            if peak is None:
                return None, f"no {dtype} peak known for GPU {gpu.name!r}; set peak_tflops for this job"
            total += peak
        if len(gpus) < count:
            return None, None
        return total, None

    def _view(self, job: Job, now: float) -> JobView:
        facts = {**FACT_DEFAULTS, **job.facts}
        running = job.state == RUNNING
        rate = self._rate(job, now) if running else None
        reason = None
        fpt = self._flops_per_token(facts)
        if fpt is None:
            reason = "model params unknown: send model.params in a progress report or set jobs.<name>.params"
        gpus, count, gpu_reason = self._resolve_gpus(self._gpu_facts(facts, job))
        peak, peak_reason = self._peak(facts, gpus, count)
        reason = reason or gpu_reason or peak_reason
        if reason is None and peak is None:
            reason = "peak FLOP/s unknown for this job's GPUs"
        if job.feed_reason and (reason is None or not job.reported):
            reason = job.feed_reason
        if reason is None and rate is None and running:
            reason = (
                "waiting for progress reports at least 1 s apart"
                if len(job.window) >= 2
                else "waiting for a second progress report"
            )
        utilization = implausible = None
        # No reason means every fact is known; the checks for None say so to the type checker.
        if reason is None and running and fpt is not None and rate is not None and peak is not None:
            utilization = mfu_math.model_flops_utilization(fpt, rate, peak)
            if not 0.0 <= utilization <= 1.0:
                reason = self._implausible(facts, gpus, count, fpt * rate, peak)
                implausible, utilization = utilization, None
        if not running:
            reason = f"the job {job.state}: MFU is measured while a job runs"
        framework = job.framework_mfu
        if framework is None and job.framework_tflops_per_gpu is not None and peak and count:
            # Megatron and NeMo print their FLOPs count as TFLOP/s per GPU, not an MFU: over our per-GPU peak.
            framework = job.framework_tflops_per_gpu * 1e12 / (peak / count)
        eta = None
        target = facts.get("target_tokens")
        if target and rate and running:
            eta = max(target - job.tokens_total, 0.0) / rate
            if not math.isfinite(eta):
                eta = None  # a rate so slow the remaining tokens take longer than a double counts
        return JobView(
            name=job.name,
            tokens_total=job.tokens_total,
            step=job.step,
            last_report_time=job.last_report_time,
            tokens_per_second=rate,
            flops_per_token=fpt,
            gpus=count,
            peak_flops=peak,
            mfu=utilization,
            eta_seconds=eta,
            reason=reason,
            facts=facts,
            restarts=job.restarts,
            replayed_tokens=job.replayed_tokens,
            gpu_indices=[g.index for g in gpus] if gpus is not None else None,
            state=job.state,
            runs=job.runs,
            tokens_processed=job.tokens_processed,
            model_flops=job.flops_total if fpt is not None or job.flops_total > 0 else None,
            implausible_mfu=implausible,
            framework_mfu=framework,
            framework_tflops_per_gpu=job.framework_tflops_per_gpu,
            ledger=self._ledger_view(job, now),
            reported=job.reported,
            found_by=self._found_by(job),
            discovered=job.discovered,
            hardware=hardware_figures(
                [g.index for g in gpus] if gpus is not None else None,
                self._gpu_readings(),
                job.discovered.shared_gpus if job.discovered else (),
            ),
        )

    def _ledger_view(self, job: Job, now: float) -> LedgerView | None:
        if not job.ledger.fed:
            return None  # no progress feed: its steps cannot be told from a hang, so its time is not split
        _, mono, offset = self._clocks(None, now)
        return job.ledger.view(mono, offset)

    def _implausible(
        self, facts: dict, gpus: list[GpuInfo] | None, count: int | None, achieved: float, peak: float
    ) -> str:
        """Why an MFU above 1 cannot be: the job's fact that must be wrong. The text stays the same from one window
        to the next (no live figures), so it is logged once; the value is in the job's ``implausible_mfu``."""
        head = "MFU above 1 (more model FLOP/s than the peak of the job's GPUs here), so a fact of the job is wrong: "
        override = facts.get("peak_tflops")
        if override:
            table = self._table_peak(facts, gpus, count)
            if table is None or achieved <= table:
                known = f", the GPU table says {table / 1e12 / count:g}" if table and count else ""
                return head + f"peak_tflops ({override:g} TFLOP/s per GPU{known}) is below what its GPUs do"
        inventory = self._gpu_inventory()
        if inventory and count is not None and count < len(inventory) and achieved <= peak / count * len(inventory):
            return (
                head + f"gpus ({count}) is fewer than the GPUs the job trains on here (this node has {len(inventory)})"
            )
        return head + (
            "tokens_total grows faster than these GPUs can train (it must count this node's tokens, not "
            "the whole job's) or model.params is too large"
        )

    def _table_peak(self, facts: dict, gpus: list[GpuInfo] | None, count: int | None) -> float | None:
        """The peak of the job's GPUs from the GPU table, ignoring a peak_tflops override; None when unknown."""
        if gpus is None or count is None or len(gpus) < count:
            return None
        return self._peak({**facts, "peak_tflops": None}, gpus, count)[0]

    def _found_by(self, job: Job) -> tuple[str, ...]:
        found = []
        if job.reported or job.touched:
            found.append("reported")
        if job.name in self._configured:
            found.append("config")
        if job.discovered is not None:
            found += sorted({pod.scheduler for pod in job.discovered.pods})
        return tuple(found)


def job_families(views: list[JobView]) -> Iterable:
    """Per-job metric families; every series is labelled ``training_job`` (``job`` is Prometheus's own).

    An ended job keeps its counters (tokens, FLOPs), step, last report time, FLOPs per token, info and state until
    it is forgotten; its rate, MFU, ETA, peak and GPU count go at once. A window whose MFU came out above 1 exports
    no MFU and no peak, so the cluster-wide MFU rule (which counts nodes exporting both halves) leaves it out too.
    """
    label = ["training_job"]
    tokens = CounterMetricFamily(
        "mfu_job_tokens",
        "Tokens this job has processed on this node: its reported total, plus tokens trained again after restarts from checkpoints.",
        labels=label,
    )
    flops = CounterMetricFamily(
        "mfu_job_model_flops", "Model FLOPs done by this job on this node: FLOPs per token × tokens.", labels=label
    )
    peak = GaugeMetricFamily(
        "mfu_job_peak_flops", "Dense peak FLOP/s of this job's GPUs on this node, for its dtype.", labels=label
    )
    gpus = GaugeMetricFamily("mfu_job_gpus", "GPUs this job uses on this node.", labels=label)
    rate = GaugeMetricFamily("mfu_job_tokens_per_second", "Tokens per second over the MFU window.", labels=label)
    utilization = GaugeMetricFamily(
        "mfu_model_flops_utilization_ratio", "Model FLOPs utilization over the MFU window (0–1).", labels=label
    )
    step = GaugeMetricFamily("mfu_job_step", "Training step of the newest progress report.", labels=label)
    last = GaugeMetricFamily(
        "mfu_job_last_report_timestamp_seconds", "Unix time of the newest progress report.", labels=label
    )
    per_token = GaugeMetricFamily(
        "mfu_job_flops_per_token",
        "Model FLOPs per token: 6·P plus the attention term when the shape is known.",
        labels=label,
    )
    eta = GaugeMetricFamily("mfu_job_eta_seconds", "Seconds until target_tokens at the current rate.", labels=label)
    state = GaugeMetricFamily(
        "mfu_job_state",
        "1 for the job's state as its newest progress report gave it (running, finished, failed, cancelled), 0 for the others.",
        labels=["training_job", "state"],
    )
    framework = GaugeMetricFamily(
        "mfu_job_framework_mfu_ratio",
        "The MFU the training framework printed in its log (0–1), or its printed TFLOP/s per GPU over this node's "
        "per-GPU peak; by the framework's FLOPs convention, beside ours.",
        labels=label,
    )
    info = InfoMetricFamily(
        "mfu_job",
        "Facts of the job that are not numbers, one series per pod (or Slurm job) discovery found it in: how it was "
        "found, its scheduler, namespace, pod, Slurm job ID and user, for joins.",
        labels=label,
    )
    hardware = GaugeMetricFamily(
        "mfu_job_hardware_flops_utilization_ratio",
        "Hardware estimate of the job's FLOPs utilization: mean over its GPUs here of GPM tensor activity × SM clock ÷ "
        "the SKU's reference clock (0–1); beside the formula MFU, and the only figure for a job that reports nothing.",
        labels=label,
    )
    gpu_util = GaugeMetricFamily(
        "mfu_job_gpu_utilization_ratio", "Mean NVML GPU utilization over the job's GPUs here (0–1).", labels=label
    )
    tensor = GaugeMetricFamily(
        "mfu_job_tensor_active_ratio", "Mean GPM tensor activity over the job's GPUs here (0–1).", labels=label
    )
    job_gpu = InfoMetricFamily(
        "mfu_job_gpu",
        "1 for each GPU of this node the job holds, as discovery or its gpus list says: one job-GPU series, never a "
        "training_job label on every GPU series.",
        labels=label,
    )
    for view in views:
        key = [view.name]
        if view.reported:
            # A node of the job that sees no progress (its log has none: the framework prints on another rank)
            # exports no token or FLOPs counters, so the cluster rules count only the nodes that measure. A job only
            # discovered has none either: its hardware figures stand in.
            tokens.add_metric(key, view.tokens_processed)
        if view.discovered is None or "reported" in view.found_by:
            last.add_metric(key, view.last_report_time)
        for name in STATES:
            state.add_metric([view.name, name], 1.0 if name == view.state else 0.0)
        base = {"dtype": str(view.facts.get("dtype", "bf16")), "found_by": ",".join(view.found_by)}
        pods = view.discovered.pods if view.discovered else ()
        for pod in pods or (None,):
            info.add_metric(
                key,
                {
                    **base,
                    "scheduler": pod.scheduler if pod else "",
                    "namespace": pod.namespace if pod else "",
                    "pod": pod.pod if pod else "",
                    "slurm_job_id": pod.slurm_job_id if pod else "",
                    "user": pod.user if pod else "",
                },
            )
        if view.step is not None:
            step.add_metric(key, view.step)
        if view.flops_per_token is not None:
            per_token.add_metric(key, view.flops_per_token)
        # A node of the job that sees no progress exports no FLOPs counter either (see tokens above).
        if view.model_flops is not None and view.reported:
            flops.add_metric(key, view.model_flops)
        if not view.running:
            continue
        # A job that ended holds no GPUs here any more, so neither the job-GPU series nor the GPUs' figures stay.
        for index in view.gpu_indices or ():
            job_gpu.add_metric(key, {"gpu": str(index)})
        if view.hardware is not None:
            for family, value in (
                (hardware, view.hardware.hardware_flops_utilization),
                (gpu_util, view.hardware.gpu_utilization),
                (tensor, view.hardware.tensor_active),
            ):
                if value is not None:
                    family.add_metric(key, value)
        if view.peak_flops is not None and view.implausible_mfu is None:
            peak.add_metric(key, view.peak_flops)
        if view.gpus is not None:
            gpus.add_metric(key, view.gpus)
        if view.tokens_per_second is not None:
            rate.add_metric(key, view.tokens_per_second)
        if view.mfu is not None:
            utilization.add_metric(key, view.mfu)
        if view.eta_seconds is not None:
            eta.add_metric(key, view.eta_seconds)
        # A framework dividing by a wrong peak prints impossible figures (torchtitan's A100 fallback: 563 %).
        if view.framework_mfu is not None and 0.0 <= view.framework_mfu <= 1.0:
            framework.add_metric(key, view.framework_mfu)
    return (
        tokens,
        flops,
        peak,
        gpus,
        rate,
        utilization,
        step,
        last,
        per_token,
        eta,
        state,
        framework,
        info,
        hardware,
        gpu_util,
        tensor,
        job_gpu,
    )
