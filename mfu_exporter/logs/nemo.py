"""NeMo 2 on PyTorch Lightning (NVIDIA/NeMo 8cfedd720346, Lightning-AI/pytorch-lightning 7f0c3436cd3f).

Per-step line, ``nemo/lightning/pytorch/callbacks/progress_printer.py`` (global rank 0 only)::

    def format_string(self, prefix, metrics):
        log_string = prefix
        for metric, val in metrics.items():
            if isinstance(val, (float)) and val.is_integer():
                val = int(val)
                log_string += f' | {metric}: {val}'
            else:
                log_string += f' | {metric}: {val:.4}'
    ...
    prefix = self.train_description + f" epoch {trainer.current_epoch}, iteration {n-1}/{self.total-1}"

The keys are whatever was logged with ``prog_bar=True``: ``global_step``, ``consumed_samples`` (global, sequences;
averaged over the log interval like every key but ``global_step``), ``global_batch_size``, ``train_step_timing in
s`` (TimingCallback), ``TFLOPS_per_GPU`` (FLOPsMeasurementCallback: ``flops_per_gpu / (1e12 *
train_step_time)``, llama3's formula with causal-halved attention), ``tokens_per_sec_per_gpu`` with
``log_tokens_per_sec``. NeMo prints no MFU. Real line (NVIDIA-NeMo/Speech#14850, behind ``srun --label``)::

     0: Training epoch 0, iteration 9/29 | lr: 5.988e-06 | global_batch_size: 512 | global_step: 9 | ...
     | train_step_timing in s: 27.88 | consumed_samples: 5120 | TFLOPS_per_GPU: 85.8

Logger format, ``nemo/utils/formatters/base.py``: ``"%(color)s[NeMo %(levelname)1.1s %(asctime)s
%(module)s:%(lineno)d]%(end_color)s %(message)s"``, datefmt ``"%Y-%m-%d %H:%M:%S"``.

Checkpoints, ``nemo/lightning/io/pl.py`` ``MegatronCheckpointIO.save_checkpoint``: the parts ``"Global Checkpoint
Save"``, ``f"Rank: {rank}"``, ``f"Iteration: {iteration}"``, ``f"Start time: {start_time:.3f}s"``, ``f"Save
duration: {end_time - start_time:.3f}s"`` joined with ``" : "``: one line for the whole save (for an async save,
its blocking part, as NeMo measures it).

NeMo 1.x prints no such line: its progress is Lightning's tqdm bar, whose postfix holds what was logged with
``prog_bar=True`` as ``key=value`` (NVIDIA/NeMo-Framework-Launcher#55)::

    Epoch 0:   1%|          | 795/77225 [9:07:58<878:01:48, 41.36s/it, loss=3.1, v_num=, reduced_train_loss=3.090,
    global_step=794.0, consumed_samples=1.63e+6]

The bar formats numbers to 3 significant digits, so ``consumed_samples`` (and past 1,000 steps ``global_step``,
``9e+3``) are rounded: the record says so, and a rounded global step is taken from the bar's ``n`` (``n - 1``, as in
``795 ... global_step=794.0``). NeMo Automodel (the NeMo 2 family's trainer) prints ``<time> | INFO | root | step N
| epoch E | ... | tps <global>(<per GPU>/gpu) | num_label_tokens K`` (NVIDIA-NeMo/Automodel#3473); K is the step's
own token count, not a running total, and is not read.
"""

from __future__ import annotations

import re

from mfu_exporter.logs.base import AnyOf, Parser, integer, leading_time, local_time, number
from mfu_exporter.logs.records import Checkpoint, Line, Progress, Record, Restore

HEADER = re.compile(r"^\[NeMo [A-Z] (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) [^\]]*\] ")
STEP = re.compile(r"^\S+ epoch (\d+), iteration (\d+)/(\d+)((?: \| [^|]+)+)$")
SAVE = re.compile(
    r"^Global Checkpoint Save : Rank: \d+ : (?:Iteration: (\d+) : )?Start time: ([\d.]+)s : Save duration: ([\d.]+)s"
)


# Restoring at start (NeMo 2 resumes through Lightning's ``_CheckpointConnector``, ``rank_zero_info``):
# ``f"Restoring states from the checkpoint path at {self._ckpt_path}"`` and, once restored,
# ``f"Restored all states from the checkpoint at {self._ckpt_path}"`` (Lightning-AI/pytorch-lightning,
# ``src/lightning/pytorch/trainer/connectors/checkpoint_connector.py``; real lines in public logs read
# ``INFO:lightning.pytorch.utilities.rank_zero:Restored all states from the checkpoint at .../last.ckpt``).
# NeMo's checkpoint names carry ``step=N`` (``...-step=1250-...``).
LOAD_START = re.compile(r"Restoring states from the checkpoint path at (\S+)")
LOAD_END = re.compile(r"Restored all states from the checkpoint at (\S+)")
CKPT_STEP = re.compile(r"step=(\d+)")

BAR = re.compile(r"^Epoch \d+:.*?\|\s*(\d+)/(\d+) \[([^\]]*global_step=[^\]]*)\]")
AUTOMODEL = re.compile(r"(?:^|\| )step (\d+) \| epoch \d+ \|")
AUTOMODEL_TPS = re.compile(r"\| tps [\d.]+\(([\d.]+)/gpu\)")
CANDIDATE = AnyOf(
    r"^\S+ epoch \d+, iteration \d+/\d+ \| ",
    r"^Epoch \d+:.*\|\s*\d+/\d+ \[.*global_step=",
    r"\| step \d+ \| epoch \d+ \|",
)


class NemoParser(Parser):
    name = "nemo"
    keywords = (
        ", iteration ",
        "Global Checkpoint Save",
        "[NeMo ",
        "global_step=",
        "| step ",
        "states from the checkpoint",
    )
    candidate = CANDIDATE
    anchor_keywords = (", iteration ", "global_step=", "| step ", "[NeMo ")
    anchor = AnyOf(*(p.pattern for p in CANDIDATE.patterns), r"^\[NeMo [A-Z] \d{4}-\d\d-\d\d ")

    def parse(self, line: Line) -> Record | None:
        text = line.text
        stamp = None
        header = HEADER.match(text)
        if header:
            stamp = local_time(header.group(1))
            text = text[header.end() :]
        if ", iteration " in text:
            match = STEP.match(text.rstrip())
            if not match:
                return None
            metrics = {}
            for part in match.group(4).split(" | ")[1:]:
                key, _, value = part.rpartition(": ")
                metrics[key.strip()] = value.strip()
            step = integer(metrics.get("global_step"))
            timing = number(metrics.get("train_step_timing in s"))
            return Progress(
                step=step if step is not None else int(match.group(2)),
                time=stamp,
                samples_seen=number(metrics.get("consumed_samples")),
                global_batch=integer(metrics.get("global_batch_size")),
                step_seconds=timing,
                tflops_per_gpu=number(metrics.get("TFLOPS_per_GPU")),
                tokens_per_second_per_gpu=number(metrics.get("tokens_per_sec_per_gpu")),
            )
        if "global_step=" in text:
            return self._bar(text)
        if "| step " in text:
            match = AUTOMODEL.search(text)
            if not match:
                return None
            tps = AUTOMODEL_TPS.search(text)
            return Progress(
                step=int(match.group(1)),
                time=leading_time(text),
                tokens_per_second_per_gpu=number(tps.group(1)) if tps else None,
            )
        if text.startswith("Global Checkpoint Save"):
            match = SAVE.match(text)
            if not match:
                return None
            start, duration = number(match.group(2)), number(match.group(3))
            if start is None or duration is None:
                return None
            return Checkpoint("end", start + duration, step=integer(match.group(1)), duration=duration)
        if "states from the checkpoint" in text:
            for pattern, phase in ((LOAD_START, "start"), (LOAD_END, "end")):
                match = pattern.search(text)
                if match:
                    step = CKPT_STEP.search(match.group(1))
                    return Restore(phase, stamp, step=int(step.group(1)) if step else None)
        return None

    @staticmethod
    def _bar(text: str) -> Record | None:
        match = BAR.match(text)
        if not match:
            return None
        postfix = {}
        for part in match.group(3).split(", "):
            key, sep, value = part.partition("=")
            if sep:
                postfix[key.strip()] = value.strip()
        shown = postfix.get("global_step", "")
        step = number(shown)
        if step is None:
            return None
        rounded = "e" in shown.lower()
        if rounded:
            # Rounded to 3 digits: the bar's own count, one ahead of the step it logged, is exact.
            done = int(match.group(1)) - 1
            step = done if abs(done - step) <= 0.005 * step else step
        samples = postfix.get("consumed_samples")
        return Progress(
            step=int(step),
            samples_seen=number(samples),
            step_seconds=number(postfix.get("train_step_timing in s")),
            rounded=rounded or bool(samples and "e" in samples.lower()),
        )
