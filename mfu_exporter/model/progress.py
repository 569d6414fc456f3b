"""A progress report's body (``POST /api/v1/progress``) validated into a ``ProgressReport``, and the validators the
other ingest APIs share. Nothing here knows about HTTP or keeps state (but for a bounded cache of validated model
facts); its refusals are ``mfu_exporter.model.errors.ValidationError`` (400), naming the field.

Progress is cumulative (totals, not deltas), so a lost or repeated report loses nothing and double-counts
nothing. Every number a report leads to is finite: the facts are bounded (``mfu_exporter.config``, MAX_*), tokens too.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Iterable

from mfu_exporter.config import JOB_NAME_FORM, JOB_NAME_PATTERN, MAX_TOKENS, ConfigError, validate_job_facts
from mfu_exporter.model.errors import ValidationError

MAX_FUTURE_SECONDS = 86400.0  # the longest duration a report may give (a load, a heartbeat interval)
# How far ahead of this node's clock a report's or a line's time may be: a job runs on the node it reports to, so
# its clock is this node's, give or take NTP. A time further ahead would hold the job's window and ledger in the
# future, so every honest report after it would read as out of order.
MAX_CLOCK_SKEW_SECONDS = 60.0
MAX_STEP = 2**53  # the largest integer a double (and so a Prometheus sample) holds exactly
# Reports closer together than this are merged in the MFU window, and a rate needs at least this much time between
# the window's ends: over a zero or nanosecond step any token count would be an infinite or absurd rate.
REPORT_RESOLUTION_SECONDS = 1.0
# A job's cadence is the median of its recent intervals between token counts (a report, a log's progress line). Real
# jobs log every N steps, so a line every minute or more is normal: silence is a stall only after this many of the
# job's own intervals, and never before it has shown one (two counts).
STALL_CADENCES = 3.0
STALL_MIN_SECONDS = 3.0  # a job reporting every step (a fraction of a second) is not stalled by a hiccup of a second
CADENCE_INTERVALS = 16  # recent intervals the cadence is the median of


def stall_after(cadence: float | None) -> float | None:
    """Seconds of silence after which a job with this cadence is stalled; None while its cadence is unknown."""
    if cadence is None:
        return None
    return max(STALL_CADENCES * cadence, STALL_MIN_SECONDS)


def rate_window(window: float, cadence: float | None) -> float:
    """The MFU window for a job of this cadence: the configured one, or the job's own interval when that is longer,
    so the window always holds the job's last interval and a rate is taken between its own lines."""
    return max(window, cadence or 0.0)


STATES = ("running", "finished", "failed", "cancelled")
RUNNING = "running"
FACT_KEYS = ("dtype", "gpus", "target_tokens", "peak_tflops", "expected_mfu")
MODEL_KEYS = ("params", "layers", "heads", "head_dim", "seq_len", "causal_attention")
FACT_DEFAULTS = {"dtype": "bf16", "causal_attention": False}
# What a run of the job says besides its totals (the ``event`` field; ``tokens_total`` is optional with one): its
# process started, it is alive, or it loads a checkpoint (``step``: the step it resumes from).
EVENTS = ("start", "heartbeat", "checkpoint_load_started", "checkpoint_load_finished")
RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}\Z")
MAX_HEARTBEAT_SECONDS = 3600.0
MAX_DATA_WAIT_SECONDS = 10 * 365 * 86400.0  # ten years of one rank's wall time: more is not a wait, it is a bug


def validate_job_name(value: Any, field_name: str = "job") -> str:
    if not isinstance(value, str) or not JOB_NAME_PATTERN.match(value):
        raise ValidationError(field_name, f"{field_name} must be {JOB_NAME_FORM}")
    return value


def validate_time(value: Any, now: float, field_name: str = "time") -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValidationError(field_name, f"{field_name} must be a Unix time in seconds")
    if value > now + MAX_CLOCK_SKEW_SECONDS:
        raise ValidationError(
            field_name,
            f"{field_name} is {value - now:.0f} s ahead of this node's clock (at most {MAX_CLOCK_SKEW_SECONDS:g} s is "
            "accepted): check the job's clock, or leave time out to use the time the report arrives",
        )
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
    data_wait_seconds: float | None = None  # running total of one rank's seconds waiting for input
    # Whether tokens_total is the job's own running total, the same after an exporter restart (a client's count, a
    # log's tokens seen or steps), rather than a rate a log's reader integrated since it began reading.
    continues: bool = True


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
            "data_wait_seconds",
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
    wait = body.get("data_wait_seconds")
    if wait is not None and (
        tokens is None
        or isinstance(wait, bool)
        or not isinstance(wait, (int, float))
        or not math.isfinite(wait)
        or not 0 <= wait <= MAX_DATA_WAIT_SECONDS
    ):
        raise ValidationError(
            "data_wait_seconds",
            "data_wait_seconds must be the seconds the training loop has waited for its next batch so far (a running "
            f"total, from 0 to {MAX_DATA_WAIT_SECONDS:g}), sent with tokens_total",
        )
    return ProgressReport(
        job,
        total,
        step,
        report_time,
        facts,
        state,
        run,
        event,
        heartbeat,
        duration,
        float(wait) if wait is not None else None,
    )


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
