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
"""

from __future__ import annotations

import re

from exporter.logs.base import Parser, integer, local_time, number
from exporter.logs.records import Checkpoint, Line, Progress, Record, Restore, Startup

STAMP = r"(?:\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?)\] )?"
ITERATION = re.compile(r"^\s*" + STAMP + r"iteration\s+(\d+)/\s*\d+ \| consumed samples:\s+(\d+) \|(.*)$")
ELAPSED = re.compile(r" elapsed time per iteration \(ms\): ([\d.]+) \|")
THROUGHPUT = re.compile(r" throughput per GPU \(TFLOP/s/GPU\): ([\d.]+) \|")
BATCH = re.compile(r" global batch size:\s+(\d+) \|")
ARGUMENT = re.compile(
    r"^  (seq_length|world_size|global_batch_size|num_layers|num_attention_heads|kv_channels) \.{2,} (\S+)\s*$"
)
SAVE_START = re.compile(r"^\s*" + STAMP + r"saving checkpoint at iteration\s+(\d+) to (\S+)")
SAVE_END = re.compile(
    r"^\s*" + STAMP + r"successfully saved (?:local )?checkpoint (?:from|at) iteration\s+(\d+)(?: to (\S+))?"
)
LOAD_START = re.compile(r"^\s*" + STAMP + r"loading checkpoint from \S+ at iteration (\d+)\s*$")
LOAD_END = re.compile(r"^\s*" + STAMP + r"successfully loaded checkpoint from \S+ \[[^\]]*\] at iteration (\d+)\s*$")
FIELDS = {
    "seq_length": "seq_len",
    "world_size": "world_size",
    "global_batch_size": "global_batch",
    "num_layers": "layers",
    "num_attention_heads": "heads",
    "kv_channels": "head_dim",
}


class MegatronParser(Parser):
    name = "megatron"
    keywords = ("iteration", " ..", " arguments ")
    # The iteration line is on the last rank only; rank 0's log (another node, in a multi-node job) has the argument
    # dump's title and the checkpoint lines instead.
    anchor = re.compile(
        r"^\s*" + STAMP + r"iteration\s+\d+/\s*\d+ \| consumed samples:"
        r"|^-{24} arguments -{24}$"
        r"|^\s*" + STAMP + r"saving checkpoint at iteration\s+\d+ to \S+ in \S+ format"
    )

    def parse(self, line: Line) -> Record | None:
        text = line.text
        if "iteration" in text:
            match = ITERATION.match(text)
            if match:
                rest = match.group(4)
                elapsed = ELAPSED.search(rest)
                throughput = THROUGHPUT.search(rest)
                batch = BATCH.search(rest)
                return Progress(
                    step=int(match.group(2)),
                    time=local_time(match.group(1)),
                    samples_seen=number(match.group(3)),
                    step_seconds=number(elapsed.group(1)) / 1000 if elapsed else None,
                    tflops_per_gpu=number(throughput.group(1)) if throughput else None,
                    global_batch=integer(batch.group(1)) if batch else None,
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
                return Startup(**{FIELDS[match.group(1)]: value}) if value is not None else None
        return None
