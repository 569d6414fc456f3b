"""From one job's log records to what the job model takes: this node's running token total, step and time.

The frameworks count in different units, so the total is derived, in this order of preference (a running total
survives lost lines and restarts; an integrated rate does not):

1. **tokens seen** (HF ``num_input_tokens_seen``, TRL ``num_tokens``, Megatron-DeepSpeed ``consumed tokens``, global):
   node tokens = tokens seen × node GPUs ÷ world size.
   **tokens seen per device** (Lightning's ThroughputMonitor ``train/lengths``, rank 0's device, each device
   training the same tokens in data parallel): node tokens = that × node GPUs; its ``train/samples``: × seq_len too.
2. **consumed samples** (Megatron, NeMo, global sequences): node tokens = samples × seq_len × node GPUs ÷ world
   size (what Megatron itself does for ``progress.txt``: ``consumed_train_samples * seq_length``).
3. **step × tokens per step** (torchtitan's init line, or global batch × seq_len): node tokens = step × tokens
   per step × node GPUs ÷ world size.
4. **a rate integrated between progress lines**: torchtitan's ``tps`` is tokens/s **per GPU** (verified in its
   source), so node tokens/s = tps × the job's GPUs on this node; DeepSpeed's samples/s are global, so node
   tokens/s = samples/s × seq_len × node GPUs ÷ world size (Megatron-DeepSpeed's ``samples per second`` and
   GPT-NeoX's ``samples/sec`` too; Megatron-DeepSpeed's ``tgs`` and ``tokens-per-second-per-gpu`` are per GPU, like
   tps). The total is Σ rate × Δt between consecutive lines
   (torchtitan's tps is the mean over exactly that interval). A step that goes backwards takes off the tokens of
   the steps undone, at the mean tokens per step so far, so the job model sees the restart.

A running total the line rounds (NeMo 1.x's bar prints ``consumed_samples=1.63e+6``) moves in jumps of the rounding:
such a record takes step × tokens per step where that is known, and the rounded total only where it is not.

Node GPUs ÷ world size is this node's share of a synchronous data-parallel job: every GPU processes the same
tokens per second, so the node's share is exact. Where a fact is missing the update says which and where to set it.

One job's progress is counted from one writer: the first file and rank (``[rank0]:``, ``srun`` task) that prints
progress. Other writers' progress lines are skipped (counted), so eight ranks printing the same step count once.
A writer in a file that appeared later (a container restarted into ``1.log``) takes over at once; otherwise a
writer silent for longer than ``takeover_after`` (or twice its own interval, if longer) hands over to the next
one that prints. Checkpoint lines are
taken from one writer by the same rule (Megatron prints them on rank 0, its iteration line on the last rank).

Runs, for the job's time ledger: start-up lines (or a checkpoint load) after progress, or a newer file taking over,
are a new process (a ``start``); the frameworks' checkpoint-load lines bound its load; torchtitan's "Training starts
at step N" says where it resumes. Only lines read live count: a file's head read at an exporter restart is history.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from mfu_exporter.logs.records import PER_STEP, SINCE_LAST, Checkpoint, DataWait, Progress, Restore, Startup
from mfu_exporter.logs.stream import Event

INTEGRATED = "rate integrated between lines"  # how a total was derived when the log gives only a rate


@dataclass(frozen=True)
class Facts:
    """What the log may not say, from ``jobs.<job>`` and the GPU inventory. ``None`` = unknown."""

    node_gpus: int | None = None
    world_size: int | None = None
    seq_len: int | None = None
    global_batch: int | None = None


@dataclass(frozen=True)
class Update:
    """One progress line, in the job model's terms. ``tokens_total`` is None when it cannot be derived (``reason``)."""

    step: int | None
    time: float
    tokens_total: float | None
    how: str | None
    reason: str | None
    framework_mfu: float | None
    framework_tflops_per_gpu: float | None


@dataclass(frozen=True)
class SaveAction:
    """For the checkpoint tracker: ``start``, ``finish`` or ``fail`` of the save ``name``."""

    phase: str
    name: str
    time: float
    duration: float | None = None


@dataclass(frozen=True)
class RunAction:
    """For the job model's ledger: a run ``start``s, a ``checkpoint_load_started``/``_finished`` (``step``: where it
    resumes), or ``training_starts`` at ``step``."""

    event: str
    time: float
    step: int | None = None
    duration: float | None = None


@dataclass(frozen=True)
class WaitAction:
    """For the job model: the job's running data-wait total, ``seconds`` of one rank's wall time since its log
    began, as of ``time`` (``framework`` printed it)."""

    seconds: float
    time: float
    framework: str


class _Writer:
    __slots__ = ("key", "last", "interval", "generation")

    def __init__(self, key: str, at: float, generation: int = 0):
        self.key, self.last, self.interval, self.generation = key, at, 0.0, generation

    def saw(self, at: float) -> None:
        if at > self.last:
            self.interval = at - self.last
            self.last = at


class JobLog:
    def __init__(self, takeover_after: float = 30.0):
        self.takeover_after = takeover_after
        self.startup = Startup()
        self.skipped: Counter = Counter()
        self._progress: _Writer | None = None
        self._saves: _Writer | None = None
        self._last_step: int | None = None
        self._open: tuple[str, float] | None = None
        self._saves_seen = 0
        self._starting = False  # start-up lines seen since the last progress line: one run start for all of them
        # Rate integration (preference 4): running total, last line's time and step, first step integrated from.
        self._integrated = 0.0
        self._integrated_at: float | None = None
        self._integrated_step: int | None = None
        self._integrated_first: int | None = None
        # Data wait (mfu_exporter.logs.datawait): the running total, the step it counts to, the previous progress step.
        self._waits: _Writer | None = None
        self._wait_total = 0.0
        self._wait_step: int | None = None
        self._previous_step: int | None = None
        self._last_progress_at: float | None = None

    def feed(
        self,
        source: str,
        events: list[Event],
        facts: Facts,
        ends_saves_at_next_step: bool = False,
        generation: int = 0,
        live: bool = True,
    ) -> list:
        """Updates, SaveActions and RunActions, in order, for the events of one file (``source`` names it).
        ``generation`` orders files by when they appeared: a writer in a newer file takes over at once (a restarted
        container's ``1.log``), while writers of files that appeared together keep the first-come rule. ``live``
        False (a file's head read at a restart): no RunActions, its start-up lines are history."""
        out: list = []
        for event in events:
            record = event.record
            if isinstance(record, Startup):
                self.startup = self.startup.merged(record)
                if live:
                    self._run_start(out, event.time)
                    if record.first_step is not None:
                        out.append(RunAction("training_starts", event.time, step=record.first_step))
            elif isinstance(record, Restore):
                if live:
                    self._run_start(out, event.time)
                    phase = "checkpoint_load_started" if record.phase == "start" else "checkpoint_load_finished"
                    out.append(RunAction(phase, event.time, step=record.step, duration=record.duration))
            elif isinstance(record, Progress):
                newer = self._progress is not None and generation > self._progress.generation
                if not self._take("_progress", f"{source}|{event.origin}", event.time, generation):
                    self.skipped["other_writer_progress"] += 1
                    continue
                if newer and live:
                    self._run_start(out, event.time)  # a newer file (a restarted container's log): a new process
                self._starting = False
                if ends_saves_at_next_step and self._open is not None:
                    name, started = self._open
                    self._open = None
                    out.append(SaveAction("finish", name, event.time, max(event.time - started, 0.0)))
                out.append(self._update(record, event.time, facts))
            elif isinstance(record, DataWait):
                if not self._take("_waits", f"{source}|{event.origin}", event.time, generation):
                    self.skipped["other_writer_data_wait"] += 1
                    continue
                action = self._wait(record, event.time)
                if action is not None:
                    out.append(action)
            elif isinstance(record, Checkpoint):
                if not self._take("_saves", f"{source}|{event.origin}", event.time, generation):
                    self.skipped["other_writer_checkpoint"] += 1
                    continue
                out.extend(self._save(record, event.time))
        return out

    def _wait(self, record: DataWait, at: float) -> WaitAction | None:
        """The running total after one data-wait line. Megatron's per-iteration mean counts for the steps since
        the previous timer line (its first, for the steps since the progress line before); a profiler's running
        total is taken as it is (one that goes down is a new run's: the job model counts it as a reset)."""
        if record.scope == PER_STEP:
            step = self._last_step
            since = self._wait_step if self._wait_step is not None else self._previous_step
            if step is None or since is None or step <= since:
                self._wait_step = step
                return None
            self._wait_total += record.seconds * (step - since)
            self._wait_step = step
            # The timers print right after the iteration line and carry no time of their own: the line's time.
            if record.time is None and self._last_progress_at is not None:
                at = self._last_progress_at
        elif record.scope == SINCE_LAST:
            self._wait_total += record.seconds
        else:
            self._wait_total = record.seconds
        return WaitAction(self._wait_total, at, record.framework)

    def _run_start(self, out: list, at: float) -> None:
        if not self._starting:
            self._starting = True
            out.append(RunAction("start", at))

    def _take(self, attr: str, key: str, at: float, generation: int) -> bool:
        writer: _Writer | None = getattr(self, attr)
        if writer is None or writer.key == key:
            if writer is None:
                setattr(self, attr, _Writer(key, at, generation))
            else:
                writer.saw(at)
            return True
        if generation > writer.generation or at - writer.last > max(self.takeover_after, 2 * writer.interval):
            setattr(self, attr, _Writer(key, at, generation))
            return True
        return False

    def _name(self, record: Checkpoint) -> str:
        step = record.step if record.step is not None else self._last_step
        if step is not None:
            return f"step-{step}"
        self._saves_seen += 1
        return record.path or f"save-{self._saves_seen}"

    def _save(self, record: Checkpoint, at: float) -> list[SaveAction]:
        if record.phase == "start":
            if self._open is not None:
                return []  # a second line for the same save (DeepSpeed prints two)
            self._open = (self._name(record), at)
            return [SaveAction("start", self._open[0], at)]
        if record.phase in ("end", "failed"):
            phase = "finish" if record.phase == "end" else "fail"
            if self._open is not None:
                name, _ = self._open
                self._open = None
                return [SaveAction(phase, name, at, record.duration)]
            if record.duration is not None:  # a one-line save (NeMo), or its start was before we began reading
                return [SaveAction(phase, self._name(record), at, record.duration)]
            self.skipped["checkpoint_end_without_start"] += 1
        return []

    def _update(self, record: Progress, at: float, facts: Facts) -> Update:
        if record.step is not None:
            if self._last_step is not None and record.step < self._last_step:
                self._wait_step = None  # a restart: the timers count from the resumed step
            self._previous_step, self._last_step = self._last_step, record.step
        self._last_progress_at = at
        seq_len = facts.seq_len or self.startup.seq_len
        world = facts.world_size or self.startup.world_size
        gpus = facts.node_gpus
        share = gpus / world if gpus and world else None
        need_share = (
            "the job's GPUs on this node (jobs.<job>.gpus or the GPU inventory) and its world size "
            "(jobs.<job>.world_size, when the log does not print it)"
        )
        tokens = how = reason = None
        batch = facts.global_batch or record.global_batch or self.startup.global_batch
        per_step = self.startup.tokens_per_step or (batch * seq_len if batch and seq_len else None)
        # A rounded running total (NeMo 1.x's bar) yields to the exact step count where tokens per step are known.
        by_step = record.rounded and record.step is not None and bool(per_step) and share is not None
        if record.tokens_seen is not None and not by_step:
            if share is not None:
                tokens, how = record.tokens_seen * share, "tokens seen × node GPUs ÷ world size"
            else:
                reason = f"the log counts global tokens seen; needs {need_share}"
        elif record.samples_seen is not None and not by_step:
            if share is not None and seq_len:
                tokens, how = (
                    record.samples_seen * seq_len * share,
                    "consumed samples × seq_len × node GPUs ÷ world size",
                )
            else:
                reason = "the log counts global consumed samples; needs seq_len (jobs.<job>.seq_len) and " + need_share
        if tokens is None and reason is None and gpus:
            if record.tokens_seen_per_device is not None:
                tokens, how = record.tokens_seen_per_device * gpus, "tokens seen per device × node GPUs"
            elif record.samples_seen_per_device is not None and seq_len:
                tokens, how = (
                    record.samples_seen_per_device * seq_len * gpus,
                    "samples seen per device × seq_len × node GPUs",
                )
        if tokens is None and record.step is not None and per_step and share is not None:
            tokens, how, reason = (
                record.step * per_step * share,
                "step × tokens per step × node GPUs ÷ world size",
                None,
            )
        if tokens is None:
            rate = self._rate(record, facts, seq_len, share)
            if rate is not None:
                tokens, how, reason = self._integrate(rate, record.step, at), INTEGRATED, None
            elif reason is None:
                reason = self._rate_reason(record, seq_len, share, need_share)
        return Update(record.step, at, tokens, how, reason, record.mfu, record.tflops_per_gpu)

    @staticmethod
    def _rate(record: Progress, facts: Facts, seq_len: int | None, share: float | None) -> float | None:
        if record.tokens_per_second_per_gpu is not None and facts.node_gpus:
            return record.tokens_per_second_per_gpu * facts.node_gpus
        if record.samples_per_second is not None and seq_len and share is not None:
            return record.samples_per_second * seq_len * share
        return None

    @staticmethod
    def _rate_reason(record: Progress, seq_len: int | None, share: float | None, need_share: str) -> str:
        if record.tokens_per_second_per_gpu is not None:
            return "the log gives tokens/s per GPU; needs the job's GPUs on this node (jobs.<job>.gpus or the GPU inventory)"
        if record.tokens_seen_per_device is not None:
            return "the log counts tokens per device; needs the job's GPUs on this node (jobs.<job>.gpus or the GPU inventory)"
        if record.samples_seen_per_device is not None:
            return (
                "the log counts samples per device; needs seq_len (jobs.<job>.seq_len) and the job's GPUs on this "
                "node (jobs.<job>.gpus or the GPU inventory)"
            )
        if record.samples_per_second is not None:
            return f"the log gives global samples/s; needs seq_len (jobs.<job>.seq_len) and {need_share}"
        return (
            "the log's progress lines carry no token count; set jobs.<job>.seq_len with global_batch (or the "
            "framework's tokens-seen option) and " + need_share
        )

    def _integrate(self, rate: float, step: int | None, at: float) -> float:
        if self._integrated_at is None:
            self._integrated_at, self._integrated_step, self._integrated_first = at, step, step
            return self._integrated
        if step is not None and self._integrated_step is not None and step < self._integrated_step:
            done = self._integrated_step - (self._integrated_first or 0)
            per_step = self._integrated / done if done > 0 else 0.0
            self._integrated = max(self._integrated - (self._integrated_step - step) * per_step, 0.0)
        elif at > self._integrated_at:
            self._integrated += rate * (at - self._integrated_at)
        self._integrated_at = max(at, self._integrated_at)
        self._integrated_step = step
        return self._integrated
