"""Megatron-LM (NVIDIA/Megatron-LM), from its source at HEAD d98e8a64ddf3 and the layouts back to v2.6.

Per-iteration line, ``megatron/training/training.py`` ``training_log``, printed by ``print_rank_last`` (the last
global rank only)::

    log_string = f" [{datetime.now().strftime('%Y-%m-%d %H:%M:%S.%f')}]"
    log_string += ' iteration {:8d}/{:8d} |'.format(iteration, args.train_iters)
    log_string += ' consumed samples: {:12d} |'.format(args.consumed_train_samples)
    log_string += ' elapsed time per iteration (ms): {:.1f} |'.format(elapsed_time_per_iteration * 1000.0)
    if args.log_throughput:
        log_string += f' throughput per GPU (TFLOP/s/GPU): {throughput:.1f} |'
    ...
    log_string += f' global batch size: {batch_size:5d} |'

``consumed_train_samples`` is global and counts sequences ("always means sequences now"). Variants: no timestamp
before f427c6f0a1 (2024-01), ``%H:%M:%S`` without ``.%f`` before #3036 (2026-01), no throughput field without
``--log-throughput`` (added 2748e7c7d4, 2023-11). Megatron prints no MFU; its TFLOP/s/GPU is
``num_floating_point_operations / (elapsed * 1e12 * world_size)``, attention causal-halved since 8873b55 (2025-03).

Start-up, ``megatron/training/arguments.py`` ``_print_args`` (rank 0):
``'  {} {} {}'.format(arg, dots, getattr(args, arg))`` with ``dots = '.' * (48 - len(arg))``, e.g.
``  seq_length ...................................... 4096``.

Checkpoints, ``megatron/training/checkpointing.py`` ``save_checkpoint`` (rank 0): ``f'[{datetime.now()...}] saving
checkpoint ' f'at iteration {iteration:7d} to {save_dir} in {ckpt_format} format'`` and ``f'  [{...}] successfully
saved ' f'checkpoint from iteration {int(iteration):7d} to {args.save} ' f'[ t {...}/{...}, ... p {...}/{...} ]'``
(with ``--async-save`` printed when the write is durable); older ``'saving checkpoint at iteration {:7d} to {}'``
and ``'  successfully saved checkpoint at iteration {:7d} to {}'``; local ``saved local checkpoint from
iteration``. The duration is the end line's time minus the start line's.

Checkpoint load, ``megatron/training/checkpointing.py`` ``load_checkpoint`` / ``_load_base_checkpoint`` (rank 0):
``print_rank_0(f' loading checkpoint from {load_dir} at iteration {iteration}')`` and, once loaded,
``print_rank_0(f'  successfully loaded checkpoint from {load_dir} ' f'[ t {...}/{...}, ' f'p {...}/{...} ] '
f'at iteration {iteration}')`` (older: ``[ t {tp rank}, p {pp rank} ]``). Neither prints a duration.

Forks and wrappers print the same line with other fields, all read by name (``FIELDS``), after ``|`` and with ``:``
or ``=``, unit and scope as they print them (docs/metrics.md, FLOPs conventions):

- Megatron-DeepSpeed (microsoft, BigScience): ``consumed tokens`` (global running total), ``samples per second``
  (global), ``TFLOPs`` (per GPU), ``tokens per gpu per second (tgs)`` (per GPU, microsoft PR #286),
  ``elapsed time per iteration (s)``;
- Argonne's Megatron-DeepSpeed: the same as ``key=value`` (``consumed_samples=``, ``consumed_tokens=``,
  ``elapsed_time_per_iteration_ms=``, ``tokens_per_gpu_per_second_tgs=``, ``[LM]TFLOPs=`` by Megatron's formula
  beside ``[DS]TFLOPs=`` by DeepSpeed's profiler: the first is read), behind ``[<time>][INFO][file:line] - ``;
- GPT-NeoX: ``samples/sec: S | iteration N/M | ... | approx flops per GPU: 112.9TFLOPS`` (no consumed samples);
- other wrappers' ``TFLOPs: F | tokens-per-second-per-gpu: T``, behind Python logging's time and ``[Rank N]:``
  (the transport peels those).

Old Megatron (before consumed samples) and GPT-NeoX lines have no running total: the step and the rates are read.
"""

from __future__ import annotations

import re

from mfu_exporter.logs.base import Parser, integer, leading_time, local_time, number
from mfu_exporter.logs.records import Checkpoint, Line, Progress, Record, Restore, Startup

STAMP = r"(?:\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?)\] )?"
# The iteration field wherever the line has it (after a timestamp, a logger prefix or GPT-NeoX's samples/sec);
# "iteration=" is Argonne's form. nanotron's "iteration: N / M" is another framework's and does not match, nor
# does NeMo 2's "epoch E, iteration i/N |". The pattern begins with its literal word, so the search skips to it.
ITERATION = re.compile(r"iteration(?<!, iteration)(?:=\s*|\s+)(\d+)/\s*\d+ \|")
# The fields read, by every spelling seen (exact), to (Progress field, factor).
FIELDS = {
    "consumed samples:": ("samples_seen", 1.0),
    "consumed_samples=": ("samples_seen", 1.0),
    "consumed tokens:": ("tokens_seen", 1.0),
    "consumed_tokens=": ("tokens_seen", 1.0),
    "elapsed time per iteration (ms):": ("step_seconds", 1e-3),
    "elapsed_time_per_iteration_ms=": ("step_seconds", 1e-3),
    "elapsed time per iteration (s):": ("step_seconds", 1.0),
    "throughput per GPU (TFLOP/s/GPU):": ("tflops_per_gpu", 1.0),
    "[LM]TFLOPs=": ("tflops_per_gpu", 1.0),
    "TFLOPs:": ("tflops_per_gpu", 1.0),
    "approx flops per GPU:": ("tflops_per_gpu", 1.0),
    "samples per second:": ("samples_per_second", 1.0),
    "samples_per_second=": ("samples_per_second", 1.0),
    "samples/sec:": ("samples_per_second", 1.0),
    "tokens per gpu per second (tgs):": ("tokens_per_second_per_gpu", 1.0),
    "tokens per gpu per second(tgs):": ("tokens_per_second_per_gpu", 1.0),
    "tokens_per_gpu_per_second_tgs=": ("tokens_per_second_per_gpu", 1.0),
    "tokens-per-second-per-gpu:": ("tokens_per_second_per_gpu", 1.0),
    "global batch size:": ("global_batch", 1.0),
    "global_batch_size=": ("global_batch", 1.0),
}
# Every such field in one scan: after a separator (one is put before the line's first field), a spelling, a number,
# an optional unit ("112.9TFLOPS"), up to the next separator. The pattern begins with the literal "|", so the scan
# skips from separator to separator.
FIELD = re.compile(
    r"\|\s*("
    + "|".join(re.escape(k) for k in sorted(FIELDS, key=len, reverse=True))
    + r")\s*([-+]?[\d.]+(?:[eE][-+]?\d+)?)(\w*)\s*(?=\||$)"
)
UNITS = {"", "TFLOPS"}  # a value with any other suffix (nanotron's "634K") is not read as a number
ARGUMENT = re.compile(
    r"^  (seq_length|world_size|global_batch_size|num_layers|num_attention_heads|kv_channels) \.{2,} (\S+)\s*$"
)
SAVE_START = re.compile(r"^\s*" + STAMP + r"saving checkpoint at iteration\s+(\d+) to (\S+)")
SAVE_END = re.compile(
    r"^\s*" + STAMP + r"successfully saved (?:local )?checkpoint (?:from|at) iteration\s+(\d+)(?: to (\S+))?"
)
LOAD_START = re.compile(r"^\s*" + STAMP + r"loading checkpoint from \S+ at iteration (\d+)\s*$")
LOAD_END = re.compile(r"^\s*" + STAMP + r"successfully loaded checkpoint from \S+ \[[^\]]*\] at iteration (\d+)\s*$")
ARGUMENTS = {
    "seq_length": "seq_len",
    "world_size": "world_size",
    "global_batch_size": "global_batch",
    "num_layers": "layers",
    "num_attention_heads": "heads",
    "kv_channels": "head_dim",
}


def read_fields(text: str) -> dict[str, float]:
    """The Progress fields a Megatron-style ``name: value |`` line prints, by ``FIELDS``; the first of each wins."""
    values: dict[str, float] = {}
    for spelling, text_value, unit in FIELD.findall("|" + text):
        name, factor = FIELDS[spelling]
        value = number(text_value) if unit in UNITS else None
        if value is not None and name not in values:
            values[name] = value * factor
    return values


class MegatronParser(Parser):
    name = "megatron"
    keywords = ("iteration", " ..", " arguments ")
    candidate = ITERATION
    anchor_keywords = ("iteration", " arguments ")
    # The iteration line is on the last rank only; rank 0's log (another node, in a multi-node job) has the argument
    # dump's title and the checkpoint lines instead.
    anchor = re.compile(
        ITERATION.pattern + r"|^-{24} arguments -{24}$"
        r"|^\s*" + STAMP + r"saving checkpoint at iteration\s+\d+ to \S+ in \S+ format"
    )

    def parse(self, line: Line) -> Record | None:
        text = line.text
        if "iteration" in text:
            match = ITERATION.search(text)
            if match:
                values = read_fields(text)
                batch = values.get("global_batch")
                return Progress(
                    step=int(match.group(1)),
                    time=leading_time(text),
                    tokens_seen=values.get("tokens_seen"),
                    samples_seen=values.get("samples_seen"),
                    tokens_per_second_per_gpu=values.get("tokens_per_second_per_gpu"),
                    samples_per_second=values.get("samples_per_second"),
                    global_batch=int(batch) if batch is not None and batch == int(batch) else None,
                    step_seconds=values.get("step_seconds"),
                    tflops_per_gpu=values.get("tflops_per_gpu"),
                )
            if "checkpoint" in text:
                for pattern, phase in ((LOAD_START, "start"), (LOAD_END, "end")):
                    match = pattern.match(text)
                    if match:
                        return Restore(phase, local_time(match.group(1)), step=int(match.group(2)))
                match = SAVE_START.match(text)
                if match:
                    return Checkpoint(
                        "start", local_time(match.group(1)), step=int(match.group(2)), path=match.group(3)
                    )
                match = SAVE_END.match(text)
                if match:
                    return Checkpoint("end", local_time(match.group(1)), step=int(match.group(2)), path=match.group(3))
            return None
        if text.startswith("  ") and " .." in text:
            match = ARGUMENT.match(text)
            if match:
                value = integer(match.group(2))
                return Startup(**{ARGUMENTS[match.group(1)]: value}) if value is not None else None
        return None
