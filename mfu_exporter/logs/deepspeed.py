"""DeepSpeed (deepspeedai/DeepSpeed HEAD edaa72212672, and the 2022-2024 layouts).

Throughput line, ``deepspeed/utils/timer.py`` ``ThroughputTimer.stop`` (global rank 0, every ``steps_per_print``;
off by default since #6602, and INFO, so hidden by the WARNING default since #7526)::

    "epoch={}/micro_step={}/global_step={}, RunningAvgSamplesPerSec={}, CurrSamplesPerSec={}, "
    "MemAllocated={}GB, MaxMemAllocated={}GB".format(self.epoch_count, self.micro_step_count,
        self.global_step_count, self.avg_samples_per_sec(), self.batch_size / (self.step_elapsed_time + TIME_EPSILON), ...)

``batch_size`` is ``train_batch_size()``: the **global** batch in samples, so both rates are global samples/s;
``CurrSamplesPerSec`` is the latest step alone. Older layouts: ``"{}/{}, RunningAvgSamplesPerSec={}, CurrSamplesPerSec={},
..."`` (PR #2553) and ``"{}/{}, SamplesPerSec={}, ..."``, read as epoch/global step (the real line of
DeepSpeed#1825, ``0/40, SamplesPerSec=83.48...``, sits beside ``step=40``). DeepSpeed knows no sequence length and
prints no FLOPs or MFU: tokens need ``seq_len`` (and the global batch, for a running total) from ``jobs.<job>``.

Logger format, ``deepspeed/utils/logging.py``: ``"[%(asctime)s] [%(levelname)s] "
"[%(filename)s:%(lineno)d:%(funcName)s] %(message)s"``; ``log_dist`` prepends ``"[Rank {}] "``.

Checkpoints, ``deepspeed/runtime/engine.py``/``torch_checkpoint_engine.py``: ``f"[Torch] Checkpoint {info.tag} is
about to be saved!"`` (default tag ``f"global_step{self.global_steps}"``) and ``f'Saving model checkpoint:
{save_path}'``. The end line is commented out in the source, so the save ends at the next progress line.
"""

from __future__ import annotations

import re

from mfu_exporter.logs.base import Parser, leading_time, local_time, number
from mfu_exporter.logs.records import Checkpoint, Line, Progress, Record

HEADER = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\] \[[A-Z]+\] \[[^\]]*\] (?:\[Rank \d+\] )?")
NUM = r"([0-9.]+(?:[eE][+-]?\d+)?)"
THROUGHPUT = re.compile(
    r"(?:^|\] )(?:epoch=\d+/micro_step=\d+/global_step=(\d+)|\d+/(\d+)), (?:RunningAvgSamplesPerSec="
    + NUM
    + r", CurrSamplesPerSec="
    + NUM
    + r"|SamplesPerSec="
    + NUM
    + r")"
)
SAVE = re.compile(r"^(?:\[Torch\] Checkpoint (\S+) is about to be saved!|Saving model checkpoint: (\S+))")
TAG_STEP = re.compile(r"global_step(\d+)")


class DeepSpeedParser(Parser):
    name = "deepspeed"
    keywords = ("SamplesPerSec=", "heckpoint")
    # The 2020 layout sits behind another logger prefix ("[INFO 2020-06-08 05:26:19] 0/2650, SamplesPerSec="), so
    # the line is searched, after "] " or at the start, the same way for detection and for reading.
    candidate = re.compile(
        r"(?:^|\] )(?:epoch=\d+/micro_step=\d+/global_step=\d+|\d+/\d+), (?:RunningAvg)?SamplesPerSec="
    )
    anchor = candidate
    anchor_keywords = ("SamplesPerSec=",)
    ends_saves_at_next_step = True

    def parse(self, line: Line) -> Record | None:
        text = line.text
        stamp = None
        header = HEADER.match(text)
        if header:
            stamp = local_time(header.group(1))
            text = text[header.end() :]
        if "SamplesPerSec=" in text:
            match = THROUGHPUT.search(text)
            if not match:
                return None
            if stamp is None:
                stamp = leading_time(line.text)
            step = match.group(1) or match.group(2)
            rate = number(match.group(4) or match.group(5))
            return Progress(step=int(step), time=stamp, samples_per_second=rate)
        if "checkpoint" in text.lower():
            match = SAVE.match(text)
            if match:
                name = match.group(1) or match.group(2)
                tag = TAG_STEP.search(name)
                return Checkpoint("start", stamp, step=int(tag.group(1)) if tag else None, path=name)
        return None
