"""Training-side client: report token progress to the node's exporter without ever slowing or breaking the job.

    reporter = ProgressReporter("http://127.0.0.1:9495", job="llama3-70b", model={"params": "70B"}, gpus=8)
    with reporter.checkpoint_load(step=12000):              # restoring at start: the ledger's checkpoint_load
        dcp.load(state, checkpoint_id=path)
    ...
    for batch in reporter.timed(loader):                    # the wait for each next batch: the job's data wait
        ...
    reporter.update(tokens_total=tokens_seen, step=step)   # returns at once, never raises
    # or time the wait yourself: `with reporter.data_wait(): batch = next(it)`, or pass your own running total:
    reporter.update(tokens_total=tokens_seen, step=step, data_wait_seconds=waited)
    ...
    with reporter.checkpoint("step-12000") as save:         # started, then finished (failed if the block raises)
        dcp.save(state, checkpoint_id=path)
        save.bytes = written                                # optional: the checkpoint's size
    ...
    reporter.close()                                        # flushes the newest totals: the job finished
    reporter.close(state="failed")                          # ... or says it failed (or "cancelled")

As a context manager, the reporter closes as finished when the block ends, failed when it raises, and cancelled on
KeyboardInterrupt (Ctrl-C, or SIGINT from a scheduler).

Each reporter is one run of the job (one process): it says so at creation (a start event with a run id, the
exporter's time ledger counts start-up from then) and sends a heartbeat when it has sent nothing for ``heartbeat``
seconds, so the exporter tells a crashed process (no heartbeat: down) from a hung one (heartbeats, no steps:
stalled). An exporter from before run ids refuses these fields: the reporter then sends plain totals, as before.

Standard library only, so a training environment installs it alone (``pip install mfu-exporter-client``): reports go
over one kept-alive ``http.client`` connection, straight to the exporter (it runs on the job's own node, so no proxy
from the environment is used); ``ssl_context`` for an exporter serving TLS with a private CA, or ``session``, any
object with ``requests.Session``'s ``post``, for a transport of one's own. The first answer of the exporter says its
version: a different major version than this client's is logged as a warning, since the API may differ.

Totals are cumulative, so only the newest one matters: a slow or absent exporter makes the reporter keep just the
latest totals and retry with backoff, never queueing the job's history. Checkpoint events each matter, so they wait
in a small queue of their own, sent by the same thread; if it fills while the exporter is away, the oldest go.
"""

from __future__ import annotations

import logging
import math
import os
import ssl
import threading
import time
import uuid
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, TypeVar

from mfu_exporter import VERSION_HEADER, __version__
from mfu_exporter.client_http import HttpSession
from mfu_exporter.jobname import DEFAULT_POD_NAME_PATTERN, compile_pod_name_pattern, sanitize_job_name

log = logging.getLogger(__name__)

PROGRESS_PATH = "/api/v1/progress"
CHECKPOINTS_PATH = "/api/v1/checkpoints"
END_STATES = ("finished", "failed", "cancelled")
# Fields an older exporter refuses with a 400 naming the field: the reporter then sends its reports without them.
RUN_FIELDS = ("run", "event", "heartbeat_seconds", "duration_seconds")  # an exporter without the time ledger
DATA_WAIT_FIELD = "data_wait_seconds"  # an exporter without the input cause
MAX_RUN_EVENTS = 16
T = TypeVar("T")


@dataclass
class CheckpointSave:
    """The save being timed by ``ProgressReporter.checkpoint``; set ``bytes`` to report its size."""

    name: str
    bytes: int | float | None = None


JOB_ENV = "MFU_TRAINING_JOB"


def major_version(version: str) -> str:
    """``0.1.0`` -> ``0``: the part of a version whose change may change the API."""
    return version.strip().split(".", 1)[0]


def job_name_from_env(environ: dict[str, str] | None = None) -> str | None:
    """The job's name as the exporter's discovery names it, so a reporting job and a discovered one are one job.

    In order: ``MFU_TRAINING_JOB`` (on Kubernetes, set it from the pod label discovery reads, through the downward
    API: ``valueFrom: {fieldRef: {fieldPath: "metadata.labels['training.kubeflow.org/job-name']"}}``); on Slurm,
    ``SLURM_JOB_ID`` (discovery names Slurm jobs by their ID); in a Kubernetes pod without either, the pod name
    (``HOSTNAME``) through discovery's default pod-name pattern (``<job>-worker-<n>`` is ``<job>``).
    """
    env = os.environ if environ is None else environ
    if env.get(JOB_ENV):
        return sanitize_job_name(env[JOB_ENV])
    if env.get("SLURM_JOB_ID"):
        return sanitize_job_name(env["SLURM_JOB_ID"])
    if env.get("KUBERNETES_SERVICE_HOST") and env.get("HOSTNAME"):
        match = compile_pod_name_pattern(DEFAULT_POD_NAME_PATTERN).match(env["HOSTNAME"])
        return sanitize_job_name(match.group("job") if match else env["HOSTNAME"])
    return None


class ProgressReporter:
    def __init__(
        self,
        url: str,
        job: str | None = None,
        *,
        model: dict[str, Any] | None = None,
        dtype: str | None = None,
        gpus: int | list | None = None,
        target_tokens: float | str | None = None,
        peak_tflops: float | None = None,
        token: str | None = None,
        timeout: float = 2.0,
        max_backoff: float = 30.0,
        session: Any = None,
        ssl_context: ssl.SSLContext | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        checkpoint_queue: int = 64,
        run_id: str | None = None,
        heartbeat: float | None = 30.0,
        started_at: float | None = None,
        announce: bool = True,
    ):
        self._base = url.rstrip("/")
        if session is None and not self._base.startswith(("http://", "https://")):
            raise ValueError(f"the exporter's URL must start with http:// or https://, got {url!r}")
        if job is None:
            job = job_name_from_env()
            if job is None:
                raise ValueError(
                    f"no job name: pass job=, or set {JOB_ENV} (on Kubernetes from the job's pod label through the "
                    "downward API); on Slurm SLURM_JOB_ID names it"
                )
        self.job = job
        # Model facts ride along with every report, so a restarted exporter has everything back after one report.
        self._facts = {
            k: v
            for k, v in {
                "model": model,
                "dtype": dtype,
                "gpus": gpus,
                "target_tokens": target_tokens,
                "peak_tflops": peak_tflops,
            }.items()
            if v is not None
        }
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._timeout = timeout
        self._max_backoff = max_backoff
        self._session = session if session is not None else HttpSession(ssl_context)
        self.exporter_version: str | None = None  # from the exporter's first answer that says it
        self._clock = clock
        self._monotonic = monotonic
        self._wake = threading.Condition()
        self._pending: dict[str, Any] | None = None
        self._last: dict[str, Any] | None = None  # the newest progress payload, for the final report's totals
        self._checkpoint_events: deque[dict[str, Any]] = deque()
        self._checkpoint_queue = checkpoint_queue
        self.dropped_checkpoint_events = 0
        self._closing = False
        self._warned: set[str] = set()
        self.sent = 0
        self.failures = 0
        # One id per reporter, so per process: a new id is a new run (a restart) to the exporter.
        self.run_id = run_id or uuid.uuid4().hex[:16]
        self._heartbeat = heartbeat if heartbeat and heartbeat > 0 else None
        self._run_events: deque[dict[str, Any]] = deque(maxlen=MAX_RUN_EVENTS)
        self._legacy = False  # the exporter refuses run fields: plain totals only
        self._no_data_wait = False  # the exporter refuses data_wait_seconds: totals without it
        self._last_post = self._monotonic()
        # Seconds this process waited for its next batch, summed (data_wait / timed); sent with each update.
        self._data_wait = 0.0
        self._data_wait_timed = False
        if announce:
            self._run_event("start", time=started_at if started_at is not None else self._clock())
        self._thread = threading.Thread(target=self._run, name=f"mfu-reporter-{job}", daemon=True)
        self._thread.start()

    def update(self, tokens_total: float, step: int | None = None, data_wait_seconds: float | None = None) -> None:
        """Record the job's running token total (node-local); sent in the background. Never blocks, never raises.

        ``data_wait_seconds``: the running total of seconds this process's training loop waited for its next batch
        (one rank's wall time; the exporter counts it for each of the job's GPUs on the node). Left out, the total
        timed by ``data_wait``/``timed`` is sent, if any.
        """
        try:
            if data_wait_seconds is None and self._data_wait_timed:
                data_wait_seconds = self._data_wait
            payload: dict[str, Any] = {
                "job": self.job,
                "run": self.run_id,
                "tokens_total": tokens_total,
                "time": self._clock(),
                **self._facts,
            }
            if step is not None:
                payload["step"] = step
            if data_wait_seconds is not None:
                if (
                    isinstance(data_wait_seconds, (int, float))
                    and not isinstance(data_wait_seconds, bool)
                    and math.isfinite(data_wait_seconds)
                    and data_wait_seconds >= 0
                ):
                    payload["data_wait_seconds"] = float(data_wait_seconds)
                else:
                    self._warn_once(
                        "data-wait",
                        f"data_wait_seconds must be a running total of seconds, got {data_wait_seconds!r}; "
                        "sent without it",
                    )
            with self._wake:
                if self._closing:
                    return  # after close() said how the job ended, a late total would start a new run
                self._pending = self._last = payload
                self._wake.notify()
        except Exception:
            log.debug("progress update dropped", exc_info=True)

    @contextmanager
    def checkpoint(self, name: str) -> Iterator[CheckpointSave]:
        """Time a checkpoint save in this block: started now, then finished, or failed if the block raises.

        Times and the duration are measured here, on the job's side. The job's own exception propagates untouched;
        the reporter never raises into the job and never blocks it.
        """
        save = CheckpointSave(name)
        started = self._checkpoint_event(save, "started", None)
        try:
            yield save
        except BaseException:
            self._checkpoint_event(save, "failed", started)
            raise
        self._checkpoint_event(save, "finished", started)

    @contextmanager
    def data_wait(self) -> Iterator[None]:
        """Time the wait for the next batch in this block (``batch = next(it)``): added to the running data-wait
        total the next ``update`` sends. Never raises into the job; the block's own exception propagates."""
        began = self._monotonic()
        try:
            yield
        finally:
            self._data_wait += max(self._monotonic() - began, 0.0)
            self._data_wait_timed = True

    def timed(self, batches: Iterable[T]) -> Iterator[T]:
        """The batches of ``batches`` (a DataLoader, any iterable), each fetch timed as ``data_wait``."""
        iterator = iter(batches)
        while True:
            with self.data_wait():
                try:
                    batch = next(iterator)
                except StopIteration:
                    return
            yield batch

    @property
    def data_wait_seconds(self) -> float:
        """The seconds timed by ``data_wait``/``timed`` so far."""
        return self._data_wait

    @contextmanager
    def checkpoint_load(self, step: int | None = None) -> Iterator[None]:
        """Time a checkpoint restore in this block (``step``: the step it resumes from): the exporter's ledger counts
        it as checkpoint_load, not start-up, and the steps after it up to the highest one reached as wasted."""
        began = self._monotonic()
        self._run_event("checkpoint_load_started", step=step)
        yield
        self._run_event("checkpoint_load_finished", step=step, duration_seconds=max(self._monotonic() - began, 1e-3))

    def _run_event(self, event: str, **fields: Any) -> None:
        """Queue one event of the run (sent before any newer total); never raises."""
        try:
            payload: dict[str, Any] = {"job": self.job, "run": self.run_id, "event": event, "time": self._clock()}
            payload.update({k: v for k, v in fields.items() if v is not None})
            if event in ("start", "heartbeat") and self._heartbeat:
                payload["heartbeat_seconds"] = self._heartbeat
            if event == "start":
                payload.update(self._facts)
            with self._wake:
                if self._closing or self._legacy:
                    return
                self._run_events.append(payload)
                self._wake.notify()
        except Exception:
            log.debug("run event dropped", exc_info=True)

    def close(self, timeout: float = 5.0, state: str = "finished") -> None:
        """Say how the job ended (``finished``, ``failed`` or ``cancelled``) with its newest totals, send what is
        pending (best effort, at most ``timeout`` seconds) and stop the background thread.

        The exporter then drops the job's MFU series and stops counting it as stalled. A reporter that never got
        an update sends nothing: the exporter does not know the job. Never raises.
        """
        if state not in END_STATES:
            self._warn_once(
                "close-state",
                f"close(state={state!r}): expected one of {', '.join(END_STATES)}; reporting the job as finished",
            )
            state = "finished"
        with self._wake:
            if not self._closing and self._last is not None:
                self._pending = {**self._last, "time": self._clock(), "state": state}
            self._closing = True
            self._wake.notify()
        self._thread.join(timeout)

    def abandon(self) -> None:
        """Stop at once, sending nothing more and saying nothing of how the job ended: what a killed process does.
        For simulations and tests of crashes (the demo's ``crash-restart`` incident); a real job calls ``close``."""
        with self._wake:
            self._closing = True
            self._pending = None
            self._run_events.clear()
            self._checkpoint_events.clear()
            self._wake.notify()

    def __enter__(self) -> "ProgressReporter":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is None:
            self.close()
        elif issubclass(exc_type, KeyboardInterrupt):
            self.close(state="cancelled")
        else:
            self.close(state="failed")

    def _checkpoint_event(self, save: CheckpointSave, phase: str, started: float | None) -> float | None:
        """Queue one checkpoint event; returns the monotonic time it was taken (None if that failed)."""
        try:
            now = self._monotonic()
            payload: dict[str, Any] = {"job": self.job, "checkpoint": save.name, "phase": phase, "time": self._clock()}
            if started is not None:
                payload["duration_seconds"] = max(now - started, 0.0)
            if phase == "finished" and save.bytes is not None:
                if (
                    isinstance(save.bytes, (int, float))
                    and not isinstance(save.bytes, bool)
                    and math.isfinite(save.bytes)
                    and save.bytes >= 0
                ):
                    payload["bytes"] = save.bytes
                else:
                    self._warn_once(
                        "checkpoint-bytes",
                        f"checkpoint bytes must be a byte count, got {save.bytes!r}; sent without it",
                    )
            with self._wake:
                if len(self._checkpoint_events) >= self._checkpoint_queue:
                    self._drop_checkpoint_event(self._checkpoint_events.popleft())
                self._checkpoint_events.append(payload)
                self._wake.notify()
            return now
        except Exception:
            log.debug("checkpoint event dropped", exc_info=True)
            return None

    def _drop_checkpoint_event(self, payload: dict[str, Any]) -> None:
        self.dropped_checkpoint_events += 1
        log.warning(
            "mfu-exporter at %s unreachable: %d checkpoint events queued, dropping the oldest (%s of %s)",
            self._base,
            self._checkpoint_queue,
            payload["phase"],
            payload["checkpoint"],
        )

    def _take(self) -> tuple[str, dict[str, Any]] | None:
        with self._wake:
            while self._pending is None and not self._checkpoint_events and not self._run_events and not self._closing:
                if self._heartbeat is None or self._legacy:
                    self._wake.wait()
                    continue
                idle = self._monotonic() - self._last_post
                if idle >= self._heartbeat:
                    self._last_post = self._monotonic()
                    payload = {"job": self.job, "run": self.run_id, "event": "heartbeat", "time": self._clock()}
                    return PROGRESS_PATH, {**payload, "heartbeat_seconds": self._heartbeat}
                self._wake.wait(self._heartbeat - idle)
            if self._run_events:
                return PROGRESS_PATH, self._run_events.popleft()
            if self._checkpoint_events:
                return CHECKPOINTS_PATH, self._checkpoint_events.popleft()
            if self._pending is None:
                return None
            payload, self._pending = self._pending, None
            return PROGRESS_PATH, payload

    def _run(self) -> None:
        try:
            self._send_until_closed()
        finally:
            if isinstance(self._session, HttpSession):
                self._session.close()  # the kept-alive connection goes with the thread; a caller's session stays open

    def _send_until_closed(self) -> None:
        backoff = 0.5
        while True:
            item = self._take()
            if item is None:
                return
            path, payload = item
            if self._post(path, payload):
                backoff = 0.5
                continue
            with self._wake:
                if "event" in payload:
                    if payload["event"] != "heartbeat":
                        self._run_events.appendleft(payload)  # first again: the start before the totals
                elif path == CHECKPOINTS_PATH:
                    self._checkpoint_events.appendleft(payload)  # first again: events keep their order
                    if len(self._checkpoint_events) > self._checkpoint_queue:
                        self._drop_checkpoint_event(self._checkpoint_events.popleft())
                elif self._pending is None:
                    self._pending = payload  # keep it unless a newer total arrived meanwhile
                if self._closing:
                    return
                self._wake.wait(backoff)
            backoff = min(backoff * 2, self._max_backoff)

    def _post(self, path: str, payload: dict[str, Any]) -> bool:
        """True when the exporter took the report or rejected it for good (a 4xx other than 429: retrying won't help)."""
        if self._legacy and path == PROGRESS_PATH:
            if "event" in payload:
                return True  # an exporter without run fields has no use for the run's events
            payload = {k: v for k, v in payload.items() if k not in RUN_FIELDS}
        if self._no_data_wait and DATA_WAIT_FIELD in payload:
            payload = {k: v for k, v in payload.items() if k != DATA_WAIT_FIELD}
        self._last_post = self._monotonic()
        try:
            response = self._session.post(self._base + path, json=payload, headers=self._headers, timeout=self._timeout)
        except Exception as exc:  # noqa: BLE001 - any transport error means "retry later"
            self.failures += 1
            self._warn_once(
                "unreachable", f"mfu-exporter at {self._base} unreachable ({type(exc).__name__}); will retry"
            )
            return False
        self._check_version(response)
        if response.status_code < 300:
            self.sent += 1
            return True
        self.failures += 1
        if (
            response.status_code == 400
            and path == PROGRESS_PATH
            and not self._legacy
            and self._refused_run_fields(response)
        ):
            # An exporter from before run ids: plain totals from now on, this one sent again without the fields.
            self._legacy = True
            self._warn_once("legacy", f"mfu-exporter at {self._base} predates run ids: sending totals only")
            return self._post(path, payload)
        if response.status_code == 400 and not self._no_data_wait and self._refused_field(response) == DATA_WAIT_FIELD:
            # An exporter from before data wait: totals without it from now on, this one sent again.
            self._no_data_wait = True
            self._warn_once("no-data-wait", f"mfu-exporter at {self._base} predates data wait: sending totals only")
            return self._post(path, payload)
        if 400 <= response.status_code < 500 and response.status_code != 429:
            self._warn_once(
                f"rejected-{response.status_code}",
                f"mfu-exporter rejected a report: {response.status_code} {response.text[:200]}",
            )
            return True
        self._warn_once(f"status-{response.status_code}", f"mfu-exporter answered {response.status_code}; will retry")
        return False

    def _check_version(self, response: Any) -> None:
        """Note the exporter's version from its answer, once; warn when its major version differs from this one's."""
        if self.exporter_version is not None:
            return
        try:
            version = response.headers.get(VERSION_HEADER)
        except Exception:  # noqa: BLE001 - a transport of the caller's whose answers have no headers
            return
        if not isinstance(version, str) or not version:
            return  # an exporter from before the header: nothing to compare
        self.exporter_version = version
        if major_version(version) != major_version(__version__):
            log.warning(
                "mfu-exporter at %s is version %s and this client (mfu-exporter-client) is %s: major versions differ, "
                "so reports may be refused or read differently; install the client of the exporter's major version "
                "(pip install 'mfu-exporter-client==%s.*')",
                self._base,
                version,
                __version__,
                major_version(version),
            )

    @classmethod
    def _refused_run_fields(cls, response: Any) -> bool:
        return cls._refused_field(response) in RUN_FIELDS

    @staticmethod
    def _refused_field(response: Any) -> str | None:
        try:
            return response.json().get("field")
        except Exception:  # noqa: BLE001 - any body that is not the exporter's JSON error
            return None

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message)
