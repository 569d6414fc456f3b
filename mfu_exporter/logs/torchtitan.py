"""torchtitan (pytorch/torchtitan), from its source at HEAD b5bcd76c66d0 and the variants since v0.1.0.

Per-step line, ``torchtitan/components/metrics.py`` ``MetricsProcessor.log`` (colours stripped by the transport)::

    f"{color.red}step: {step:2}  " f"{color.green}loss: {global_avg_loss:8.5f}  "
    f"{color.orange}grad_norm: {grad_norm:7.4f}  " f"{color.turquoise}memory: {...max_reserved_gib:5.2f}GiB"
    f"({...max_reserved_pct:.2f}%)  " f"{color.blue}tps: {round(tps):,}  " f"{color.cyan}tflops: {tflops:,.2f}  "
    f"{color.magenta}mfu: {mfu_str}{color.reset}"

with ``tps = ntokens_since_last_log / (time_delta * parallel_dims.non_data_parallel_size)``: tokens per second
**per GPU** (``ntokens`` is this DP shard's tokens; ``non_data_parallel_size = cp * tp * pp``), averaged since the
previous logged step (forks print the step as ``step: N/M = x%``). ``mfu_str`` is ``f"{mfu:.2f}%"`` or ``N/A``
under FP8/MX (#2451). Older layouts: ``wps:`` before #697 (2024-11), no ``tflops:`` before #847 (2025-02), no
``grad_norm:`` before #1339 (2025-06).

Logger prefix, ``torchtitan/tools/logging.py``: ``"[titan] %(asctime)s - %(name)s - %(levelname)s - %(message)s"``
(no ``[titan] `` before #861, 2025-02).

Start-up, ``torchtitan/trainer.py``: ``f"{color.blue}Model {model_spec.name} {model_spec.flavor} "
f"{color.red}size: {model_param_count:,} total parameters{color.reset}"`` (all parameters, embeddings included);
``f"Peak FLOPS used for computing MFU: {gpu_peak_flops:.3e}"``; HEAD ``"Trainer is initialized with "
f"{num_tokens_per_dp_rank} tokens per DP rank, " f"{num_tokens_per_train_step} tokens per train step, "
f"gradient accumulation steps {...}, " f"maximum context length {...}, " f"total steps {...} " f"(warmup {...})"``;
v0.1.0–v0.2.2 ``"Trainer is initialized with " f"local batch size {...}, " f"global batch size {global_batch_size}, "
f"gradient accumulation steps {...}, " f"sequence length {...seq_len}, " f"total steps {...} " f"(warmup {...})"``
(v0.1.0 ends with ``.``); ``f"Training starts at step {self.step + 1}"``.

Checkpoints, ``torchtitan/components/checkpointer/dcp.py`` ``_save``: ``f"{checkpoint_phase.capitalize()} the
checkpoint."`` (``Saving``/``Staging``), ``f"Finished {checkpoint_phase} the checkpoint in "
f"{time.monotonic() - begin:.2f} seconds."``, ``f"Last step checkpoint completed in {...:.2f}s"``; before #3393
``"Saving the checkpoint (or staging if async is enabled)."`` and ``"Finished saving the checkpoint (or staging if
async is enabled)" f"in {...:.2f} seconds."`` (no space before ``in``); v0.1.0 also ``"Finish saving the checkpoint
in the background process in %.2f seconds."``. The lines carry no step: the stream adds the last progress step.

Checkpoint load, ``torchtitan/components/checkpoint.py`` ``CheckpointManager.load`` (HEAD and v0.2.x):
``f"Loading the checkpoint from {checkpoint_id}."`` (``checkpoint_id`` is ``.../step-{step}``), then
``"Finished loading the checkpoint in " f"{time.monotonic() - begin:.2f} seconds."``; v0.1.0 ``f"Loading the
checkpoint at step {step}"`` and ``f"Finished loading the checkpoint in {...:.2f} seconds"`` (no ``.``).
"""

from __future__ import annotations

import re

from mfu_exporter.logs.base import AnyOf, Parser, integer, local_time, number
from mfu_exporter.logs.records import Checkpoint, Line, Progress, Record, Restore, Startup

PREFIX = re.compile(r"^(?:\[titan\] )?(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) - \S+ - [A-Z]+ - ")
# "step: N" (forks print "step: N/M = x%") followed by loss and tps; not the validation line ("validate step:").
# The pattern begins with its literal word, so a search skips to it.
STEP_HEAD = r"step:(?<!validate step:)\s*(\d+)(?:\s*/\s*\d+(?:\s*=\s*[\d.]+%)?)?\s+loss:"
STEP = re.compile(STEP_HEAD + r".*?\s(?:tps|wps): ([\d,]+)(?:\s+tflops: ([\d,.]+))?\s+mfu: (?:([\d.]+)%|N/A)")
CANDIDATE = re.compile(STEP_HEAD + r".*\s(?:tps|wps): ")
INIT_HEAD = re.compile(
    r"^Trainer is initialized with (\d+) tokens per DP rank, (\d+) tokens per train step, "
    r"gradient accumulation steps \d+, maximum context length (\d+)"
)
INIT_OLD = re.compile(
    r"^Trainer is initialized with local batch size \d+, global batch size (\d+), "
    r"gradient accumulation steps \d+, sequence length (\d+)"
)
MODEL_SIZE = re.compile(r"size: ([\d,]+) total parameters")
PEAK = re.compile(r"^Peak FLOPS used for computing MFU: ([\d.]+e[+-]?\d+)")
STARTS = re.compile(r"^Training starts at step (\d+)")
LOAD_START = re.compile(r"^Loading the checkpoint (?:from \S*?step-(\d+)\S*\.|from \S+\.|at step (\d+))$")
LOAD_END = re.compile(r"^Finished loading the checkpoint in ([\d.]+) seconds\.?$")
SAVE_START = re.compile(r"^(?:Saving|Staging) the checkpoint(?: \(or staging if async is enabled\))?\.$")
SAVE_END = re.compile(
    r"^(?:Finished (?:saving|staging) the checkpoint(?: \(or staging if async is enabled\))? ?in ([\d.]+) seconds\."
    r"|Last step checkpoint completed in ([\d.]+)s"
    r"|Finish saving the checkpoint in the background process in ([\d.]+) seconds\.)"
)


class TorchtitanParser(Parser):
    name = "torchtitan"
    keywords = ("step:", "checkpoint", "Trainer is initialized", "total parameters", "Peak FLOPS", "Training starts")
    candidate = CANDIDATE
    anchor_keywords = ("[titan] ", "step:")
    anchor = AnyOf(r"^\[titan\] \d{4}-\d\d-\d\d ", CANDIDATE.pattern)

    def parse(self, line: Line) -> Record | None:
        text = line.text
        stamp = None
        prefix = PREFIX.match(text)
        if prefix:
            stamp = local_time(prefix.group(1))
            text = text[prefix.end() :]
        if "step:" in text:
            match = STEP.search(text)
            if not match:
                return None
            mfu = number(match.group(4))
            return Progress(
                step=int(match.group(1)),
                time=stamp,
                tokens_per_second_per_gpu=number(match.group(2)),
                tflops_per_gpu=number(match.group(3)),
                mfu=mfu / 100 if mfu is not None else None,
            )
        if "checkpoint" in text:
            if text.startswith(("Loading the checkpoint", "Finished loading")):
                match = LOAD_START.match(text)
                if match:
                    step = match.group(1) or match.group(2)
                    return Restore("start", stamp, step=int(step) if step else None)
                match = LOAD_END.match(text)
                return Restore("end", stamp, duration=number(match.group(1))) if match else None
            if SAVE_START.match(text):
                return Checkpoint("start", stamp)
            match = SAVE_END.match(text)
            if match:
                seconds = number(next(g for g in match.groups() if g is not None))
                return Checkpoint("end", stamp, duration=seconds)
            return None
        if text.startswith("Trainer is initialized"):
            match = INIT_HEAD.match(text)
            if match:
                return Startup(tokens_per_step=number(match.group(2)), seq_len=integer(match.group(3)))
            match = INIT_OLD.match(text)
            if match:
                batch, seq = integer(match.group(1)), integer(match.group(2))
                return Startup(
                    global_batch=batch, seq_len=seq, tokens_per_step=float(batch * seq) if batch and seq else None
                )
            return None
        if "total parameters" in text:
            match = MODEL_SIZE.search(text)
            return Startup(params=number(match.group(1))) if match else None
        if text.startswith("Peak FLOPS"):
            match = PEAK.match(text)
            return Startup(peak_flops_per_gpu=number(match.group(1))) if match else None
        if text.startswith("Training starts"):
            match = STARTS.match(text)
            return Startup(first_step=int(match.group(1))) if match else None
        return None
