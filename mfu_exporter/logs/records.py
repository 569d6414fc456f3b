"""What the parsers read out of a training log: frozen records, one per meaningful line.

A parser says only what its line says. Turning a framework's numbers into the node-local running token total the
job model wants (its units differ: per-GPU tokens/s, global consumed samples, global tokens seen) is
``mfu_exporter.logs.derive``'s job, because it needs facts the line does not carry (GPUs here, world size).
"""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class Line:
    """One logical log line with its transport peeled off.

    ``time`` is the transport's own timestamp (CRI, Docker JSON), ``origin`` names the writer (the ``srun --label``
    task and the torchrun ``[rankN]:`` prefix, when present), so interleaved ranks can be told apart.
    """

    text: str
    time: float | None = None
    origin: str = ""


@dataclass(frozen=True)
class Progress:
    """A per-step throughput line. Every quantity is in the framework's own unit, named by the field.

    ``time`` is the line's own timestamp (the framework's log prefix), None when the line has none. ``step`` is
    None only where the framework does not print it (HF Trainer without its progress bar).
    """

    step: int | None
    time: float | None = None
    tokens_seen: float | None = None  # global cumulative tokens (HF num_input_tokens_seen)
    samples_seen: float | None = None  # global cumulative samples/sequences (Megatron, NeMo consumed samples)
    # Per-device cumulative counts (Lightning's ThroughputMonitor: train/lengths, train/samples on rank 0's device).
    tokens_seen_per_device: float | None = None
    samples_seen_per_device: float | None = None
    tokens_per_second_per_gpu: float | None = None  # torchtitan tps (verified per device)
    samples_per_second: float | None = None  # global samples/s (DeepSpeed CurrSamplesPerSec)
    global_batch: int | None = None  # sequences per step, where the line prints it
    step_seconds: float | None = None  # time per step, where printed (Megatron, NeMo)
    tflops_per_gpu: float | None = None  # the framework's achieved TFLOP/s per GPU
    mfu: float | None = None  # the framework's own MFU, as a ratio (48.5 % -> 0.485)
    # Seconds on the job's own clock since its stage began, for a line with no wall time (Lightning's CSV rows:
    # train/time): the stream dates such lines by it, anchored at when it first read one (``LogStream``).
    elapsed: float | None = None
    # The running totals are rounded (NeMo 1.x's progress bar prints consumed_samples=1.63e+6): the derivation
    # prefers step x tokens per step, where known, so the rate does not move in steps of the rounding.
    rounded: bool = False


@dataclass(frozen=True)
class Startup:
    """Facts printed once at start-up; None where the line does not say."""

    params: float | None = None
    seq_len: int | None = None
    global_batch: int | None = None
    world_size: int | None = None
    tokens_per_step: float | None = None
    layers: int | None = None
    heads: int | None = None
    head_dim: int | None = None
    peak_flops_per_gpu: float | None = None  # the peak the framework divides by (torchtitan)
    first_step: int | None = None  # the step training (re)starts at

    def merged(self, other: "Startup") -> "Startup":
        """These facts with ``other``'s known ones on top (a later line wins)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update({f.name: getattr(other, f.name) for f in fields(other) if getattr(other, f.name) is not None})
        return Startup(**values)


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint save: ``phase`` is ``start``, ``end`` or ``failed``.

    ``duration`` is what the framework measured, when it prints it (then the start is ``time - duration``).
    ``step`` is None where the line does not say; the stream fills in the step of the latest progress line.
    """

    phase: str
    time: float | None = None
    step: int | None = None
    duration: float | None = None
    path: str | None = None
    detail: str = ""


@dataclass(frozen=True)
class Restore:
    """A checkpoint load at start-up: ``phase`` is ``start`` or ``end``. ``step`` is the step it resumes from, where
    the line (or its checkpoint's directory name) says; ``duration`` what the framework measured, where printed."""

    phase: str
    time: float | None = None
    step: int | None = None
    duration: float | None = None


PER_STEP = "per_step"  # mean seconds per step over the interval just logged (Megatron)
SINCE_LAST = "since_last"  # seconds summed since the previous such line (DeepSpeed's pipeline engine)
RUNNING_TOTAL = "total"  # seconds since the stage began (Lightning's profiler summary)


@dataclass(frozen=True)
class DataWait:
    """How long the training loop waited for its next batch (``mfu_exporter.logs.datawait``): ``seconds`` of one rank's
    wall time, counted as ``scope`` says (``PER_STEP``, ``SINCE_LAST`` or ``RUNNING_TOTAL``)."""

    seconds: float
    scope: str
    framework: str
    time: float | None = None  # the line's own timestamp (DeepSpeed's logger prefix), None where it has none


Record = Progress | Startup | Checkpoint | Restore | DataWait
