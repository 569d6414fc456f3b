"""Hugging Face transformers ``Trainer``, from the 5.25.0, 5.0.0 and 4.57.1 wheels.

Per logging step, ``Trainer.log`` builds ``logs`` (``loss``, ``grad_norm``, ``learning_rate``, ``epoch``) and, with
``include_num_input_tokens_seen``::

    logs["num_input_tokens_seen"] = self.state.num_input_tokens_seen
    ...
    logs.update(speed_metrics("train", start_time, num_tokens=current_session_num_tokens))

``num_input_tokens_seen`` is global and cumulative (``self.accelerator.gather(input_tokens).sum()``);
``train_tokens_per_second`` is a running average since the session started. ``ProgressCallback.on_log`` prints
``self.training_bar.write(str(shallow_logs))`` on world rank 0 (``PrinterCallback``: ``print(logs)``): a Python dict
``repr`` (single quotes, never JSON), floats formatted ``f"{v:.4g}"`` as strings since 5.0.0. The printed dict has
no ``step``: it comes from the tqdm bar drawn beside it (``  5%|▌   | 50/1000 [01:23<26:15,  1.66s/it]``, the
``n/total`` of ``tqdm``'s ``format_meter``), else it is unknown.

The Trainer computes no MFU (``floating_point_ops`` is ``6 * tokens * num_parameters(exclude_embeddings=True)``,
no attention term), and prints no parameter count, sequence length or world size: those come from ``jobs.<job>``.

Checkpoints, ``Trainer._save``: ``logger.info(f"Saving model checkpoint to {output_dir}")`` (INFO: shown only with
``log_level="info"``), under ``f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"``; 5.25.0's handler prefixes
``[transformers] ``. No end line: the save ends at the next progress record.

Resuming, ``Trainer._load_from_checkpoint``: ``logger.info(f"Loading model from {resume_from_checkpoint}.")``
(the directory is ``checkpoint-{step}``), then in ``_inner_training_loop``
``logger.info(f"  Continuing training from global step {self.state.global_step}")`` once the state is restored.

Other trainers print the same dicts with more in them: TRL's SFTTrainer a ``'num_tokens'`` running total (global:
``accelerator.gather_for_metrics`` of the attention mask's sum, huggingface/trl#3926), read as tokens seen;
transformers 3.x printed JSON with the step in it (``{"loss": ..., "step": 500}``, huggingface/blog#56), and a dict
that carries its own ``'step'`` gives it. A dict with neither a step (its own, or the bar's) nor a token count gives
the job nothing (TRL's GRPO dicts, a loss-only dict before any bar): it is no progress, and the stream says so.
"""

from __future__ import annotations

import ast
import json
import re

from mfu_exporter.logs.base import Parser, number
from mfu_exporter.logs.records import Checkpoint, Line, Progress, Record, Restore

BAR = re.compile(r"^\s*\d+%\|[^|]*\| (\d+)/(\d+) \[")
SAVE = re.compile(r"Saving model checkpoint to (\S+)")
STEP_DIR = re.compile(r"checkpoint-(\d+)")
LOAD_START = re.compile(r"Loading model from (\S+?)\)?\.$")
LOAD_END = re.compile(r"Continuing training from global step (\d+)")


DICT = re.compile(r"^\s*\{['\"](?:loss|train_runtime|num_input_tokens_seen)['\"]: ")
TOKEN_KEYS = ("num_input_tokens_seen", "num_tokens")  # transformers' running total, then TRL's


def read_dict(text: str) -> dict | None:
    """A printed dict: Python's repr (the Trainer's ``str(logs)``), else JSON (transformers 3.x); never eval."""
    try:
        value = ast.literal_eval(text)
    except Exception:  # noqa: BLE001 - CPython 3.11's AST state can raise SystemError when a collector nests a parse
        try:
            value = json.loads(text)
        except ValueError:
            return None
    return value if isinstance(value, dict) else None


class HfParser(Parser):
    name = "hf"
    keywords = (
        "{'",
        '{"',
        "%|",
        "Saving model checkpoint",
        "Loading model from",
        "Continuing training from global step",
    )
    candidate = DICT
    anchor_keywords = ("{'", '{"')
    anchor = DICT
    unread_hint = (
        "an HF Trainer dict gives the job something only with a step (its tqdm bar in the same log, or a 'step' "
        "key) or a token count (TrainingArguments include_num_input_tokens_seen=True)"
    )
    ends_saves_at_next_step = True

    def __init__(self) -> None:
        self.bar_step: int | None = None

    def parse(self, line: Line) -> Record | None:
        text = line.text.strip()
        if text.startswith(("{'", '{"')):
            logs = read_dict(text)
            if logs is None or not any(k in logs for k in ("loss", "num_input_tokens_seen", "train_runtime")):
                return None
            if any(str(k).startswith("eval_") for k in logs):
                return None  # an evaluation record: no training progress
            tokens = next((number(str(logs[k])) for k in TOKEN_KEYS if k in logs), None)
            own = logs.get("step")
            step = own if isinstance(own, int) and not isinstance(own, bool) else self.bar_step
            if step is None and tokens is None:
                return None  # nothing for the job: an unread progress line, reported by the stream
            # The Trainer's own clock since train() began (transformers 5 prints it on every line): its lines carry
            # no wall time, so a backlog read at once is dated by it, not all at the moment it was read.
            runtime = number(str(logs["train_runtime"])) if "train_runtime" in logs else None
            return Progress(step=step, tokens_seen=tokens, elapsed=runtime)
        if "%|" in text:
            match = BAR.match(text)
            if match:
                self.bar_step = int(match.group(1))
            return None
        if "Saving model checkpoint to" in text:
            match = SAVE.search(text)
            step = STEP_DIR.search(match.group(1)) if match else None
            return Checkpoint(
                "start", step=int(step.group(1)) if step else None, path=match.group(1) if match else None
            )
        if "Loading model from" in text:
            match = LOAD_START.search(text)
            step = STEP_DIR.search(match.group(1)) if match else None
            return Restore("start", step=int(step.group(1)) if step else None) if match else None
        if "Continuing training from global step" in text:
            match = LOAD_END.search(text)
            return Restore("end", step=int(match.group(1))) if match else None
        return None
