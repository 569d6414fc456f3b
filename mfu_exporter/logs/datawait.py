"""Data-loading time as the frameworks print it: how long the training loop waited for its next batch.

These lines take no part in format detection (they carry no progress); the stream reads them in any log, whatever
framework it detected, since a Lightning profiler table can sit in a NeMo log and Megatron's timers in a fork's.
Every figure is one rank's wall time (the rank that prints), never GPU-seconds: the job model multiplies by the
job's GPUs on the node.

**Megatron-LM** (NVIDIA/Megatron-LM), the ``batch-generator`` timer around ``get_batch`` in ``pretrain_gpt.py``
(``timers('batch-generator', log_level=2).start()``), logged by ``training_log`` in
``megatron/training/training.py`` with ``timers.log(timers_to_log, normalizer=args.log_interval, ...)`` only with
``--timing-log-level 2``: the mean milliseconds **per iteration** over the logging interval, on the last rank, right
after the iteration line. HEAD d98e8a64ddf3, ``megatron/core/timers.py``::

    output_string = '(min, max) time across ranks (ms):'
    output_string += '\\n    {}: ({:.2f}, {:.2f})'.format((name + ' ').ljust(48, '.'), min_time, max_time)

(``'max time across ranks (ms):'`` and ``'\\n    {}: {:.2f}'`` with ``--timing-log-option max``). The max across
ranks is read: a synchronous step waits for its slowest rank's batch. Before the timers moved to core (680b67c881,
2024-02), v2.6 ``megatron/global_vars.py``::

    string = 'time (ms)'
    string += ' | {}: {:.2f}'.format(name, elapsed_time)   # elapsed * 1000.0 / normalizer

with ``batch-generator`` always in the list (no timing levels before 77efcccb93, 2022-08).

**DeepSpeed** (microsoft/DeepSpeed 38327e07f6cd), ``--wall_clock_breakdown`` (``"wall_clock_breakdown": true``):
only the pipeline engine times data loading, ``BATCH_INPUT_TIMER = 'batch_input'`` around
``_exec_load_micro_batch`` in ``deepspeed/runtime/pipe/engine.py``, logged every ``steps_per_print`` steps by
``deepspeed/utils/timer.py``::

    string = f"time (ms)"
    string += " | {}: {:.2f}".format(name, elapsed_time)      # elapsed(reset=True) / normalizer, normalizer 1

through ``log_dist`` (``"[Rank {}] "``): the milliseconds summed **since the previous such line**. Until 2023-07
(PR #3996) the string began ``f"rank={dist.get_rank()} time (ms)"`` (ebed51df787579, ``utils/timer.py:116``), and
``_exec_optimizer_step`` logged ``['batch_input', 'forward_microstep', ...]`` when ``global_steps %
steps_per_print() == 0`` (``runtime/pipe/engine.py:1177``): DeepSpeed#2264's paste. EleutherAI's fork DeeperSpeed,
under GPT-NeoX with pipeline parallelism, logs every timer in one such line after its ``%comms`` shares
(branch ``ds_update_final``, eb7f5cff3667 of 2021-09, ``runtime/pipe/engine.py:331-341``, ``timers.log(names)`` with
``names = list(self.timers.timers.keys())``), ``batch_input`` among them (gpt-neox#126's paste, mosaicml/examples' GPT-NeoX README). The
plain engine's breakdown (``forward_microstep``, ``backward_microstep``, ``step_microstep``, ...) has no
data-loading timer, so a DeepSpeed job outside the pipeline engine gives none.

**GPT-NeoX** (EleutherAI/gpt-neox) without pipeline parallelism keeps Megatron's timers under their pre-2.0 name,
HEAD ea7aefd8f8e1: ``timers("batch generator")`` around ``get_batch`` (``megatron/training.py:550``),
``add_to_logging("batch generator")`` (``megatron/logging.py:289``, only ``if not neox_args.is_pipe_parallel``) and
``timers.log(timers_to_log, normalizer=neox_args.log_interval)`` after the iteration line (``logging.py:564``;
``:356`` in 408e29d9c746 of 2023-07), ``megatron/utils.py``::

    string = "time (ms)"
    string += " | {}: {:.2f}".format(name, elapsed_time)      # elapsed * 1000.0 / normalizer, rank 0

as Megatron-LM v1.0 did (03d2880923, 2020-04, ``add_to_logging('batch generator')``): read as Megatron's one-line
form, the mean ms per iteration (DeepSpeed#3742's paste).

**Lightning** (Lightning-AI/pytorch-lightning 7f0c3436cd3f), ``Trainer(profiler="simple")``: the action
``f"[{self.__class__.__name__}].train_dataloader_next"`` (``loops/training_epoch_loop.py``, since 759e89df21,
2022-06; ``get_train_batch`` before) in the summary that ``profilers/simple.py`` ``summary`` prints when a stage ends
(rank zero, ``log.info``, or to ``dirpath/filename``)::

    row = f"{sep}|  {action:<{max_key}s}\\t|  {mean:<15}\\t|"
    row += f"  {num_calls:<15}\\t|  {total:<15}\\t|  {per:<15}\\t|"     # extended (the default)
    return f"{sep}|  {action:<{max_key}s}\\t|  {mean:<15}\\t|  {total:<15}\\t|"   # not extended

The row's total time (s) is the **whole stage's** wait so far: a running total, printed once at the end of fit.

**torchtitan** prints none on the console: its ``time_metrics/data_loading(s)`` and ``(%)``
(``torchtitan/components/metrics.py``) go to TensorBoard or W&B only, and the structured JSONL logs' ``fetching_batch``
spans are not read here (docs/metrics.md says so).
"""

from __future__ import annotations

import re

from mfu_exporter.logs.base import leading_time, number
from mfu_exporter.logs.records import PER_STEP, RUNNING_TOTAL, SINCE_LAST, DataWait

# Substrings one of which every line read here contains: any other line is skipped before a regex.
KEYWORDS = ("batch-generator", "batch generator", "batch_input:", "train_dataloader_next", "get_train_batch")
KEYWORD_PATTERN = re.compile("|".join(map(re.escape, KEYWORDS)))
NUM = r"([0-9]+(?:\.[0-9]+)?(?:[eE][-+]?\d+)?)"
# Megatron's (min, max) block row (or the max-only one), indented under its header; what a user appended after
# the figure (a marker like "<---") is left alone.
MEGATRON_ROW = re.compile(r"^\s+batch-generator \.*: (?:\(" + NUM + r", " + NUM + r"\)|" + NUM + r")(?=\s|$)")
# Megatron's one-line form (its timer "batch generator" before v2.0, and in GPT-NeoX) and DeepSpeed's:
# "time (ms) | name: value | ...".
TIME_LINE = re.compile(r"time \(ms\)(?: \|.*?)? \| (batch[- ]generator|batch_input): " + NUM + r"(?= \||\s*$)")
# Lightning's profiler row names: the loop's action (2022-06 on) and the 2020 one.
LIGHTNING_ACTIONS = re.compile(r"^(?:\[_?TrainingEpochLoop\]\.train_dataloader_next|get_train_batch)$")


def parse_data_wait(text: str) -> DataWait | None:
    """The data-loading figure ``text`` prints, or None."""
    if "batch generator" in text:
        return _per_step_line(text)
    if "batch-generator" in text:
        match = MEGATRON_ROW.match(text)
        if match:
            worst = number(match.group(2) or match.group(3))
            return DataWait(worst / 1000, PER_STEP, "megatron") if worst is not None else None
        return _per_step_line(text)
    if "batch_input:" in text:
        match = TIME_LINE.search(text)
        if match:
            value = number(match.group(2))
            return DataWait(value / 1000, SINCE_LAST, "deepspeed", leading_time(text)) if value is not None else None
        return None
    if "train_dataloader_next" in text or "get_train_batch" in text:
        return _lightning_row(text)
    return None


def _per_step_line(text: str) -> DataWait | None:
    """Megatron's one-line form: the mean milliseconds per iteration over the logging interval."""
    match = TIME_LINE.search(text)
    if not match or match.group(1) == "batch_input":
        return None
    value = number(match.group(2))
    return DataWait(value / 1000, PER_STEP, "megatron") if value is not None else None


def _lightning_row(text: str) -> DataWait | None:
    """A profiler row: cells split on "|" (the profiler's "\\t|", or a Markdown table's); mean and total (plain), or
    mean, calls, total and share (extended)."""
    cells = [cell.strip() for cell in text.strip().lstrip("|").split("|")]
    if not LIGHTNING_ACTIONS.match(cells[0]):
        return None
    values = [cell for cell in cells[1:] if cell]
    if len(values) < 2:
        return None
    total = number(values[2] if len(values) >= 4 else values[1])
    return DataWait(total, RUNNING_TOTAL, "lightning") if total is not None else None
