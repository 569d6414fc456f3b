"""Lightning's ``CSVLogger`` file (``<save_dir>/<name>/version_<n>/metrics.csv``), from lightning 2.6.6
(Lightning-AI/pytorch-lightning, ``fabric/loggers/csv_logs.py`` and ``pytorch/callbacks/throughput_monitor.py``).

Under a non-TTY (a pod, a Slurm job) Lightning prints nothing during ``fit``: its rich or tqdm bar draws only on a
terminal, and what the loop logs goes to the loggers. With the default ``CSVLogger`` that is a CSV file,
``_ExperimentWriter.save``::

    writer = csv.DictWriter(file, fieldnames=self.metrics_keys)   # sorted keys, "step" among them
    if not file_exists:
        writer.writeheader()
    writer.writerows(self.metrics)

appended every ``flush_logs_every_n_steps`` (100) steps, one row per ``log_metrics`` call (every
``log_every_n_steps``, 50), and rewritten whole, header first, when a new column appears
(``_rewrite_with_new_header``). A ``ThroughputMonitor`` (``Throughput.compute``, keys ``f"{stage}{separator}{k}"``
with the stage ``train`` and the separator ``/``) logs per device and cumulative since the stage began:
``train/batches``, ``train/samples``, ``train/lengths`` (with a ``length_fn``: tokens), ``train/time`` (seconds,
``perf_counter`` since the stage's start), and once its window (``window_size``, 100 batches) is full
``train/device/flops_per_sec`` (given the module's ``flops_per_batch``) and, where Lightning knows the device's peak
(CUDA, TPU), ``train/device/mfu``. The module's own ``self.log`` values come in rows of their own (same ``step``,
the monitor's columns empty).

A row with a running total is progress: tokens (``lengths``) or samples seen **per device**, the CSV's ``step``
(Lightning's global step), the monitor's FLOP/s per device as the framework's TFLOP/s. The rows carry no wall time,
only ``train/time`` (seconds since the stage's start), which the stream dates them by (``Progress.elapsed``): the
time between two rows is the job's own, though they are read a flush at a time and the file is found up to a glob
interval after it appears. Not in auto-detection: its rows are bare numbers, which no keyword finds; name
the file with ``format: lightning_csv``. When a column is added the file is truncated and written again whole: the
follower sees the bytes before its offset change and reads it from the start, and rows already read (the same step
at the same ``train/time``) are skipped. The header is the file's first line, which the follower's bounded resume
reads (its head) after an exporter restart.
"""

from __future__ import annotations

import csv
import re

from mfu_exporter.logs.base import Parser, integer, number
from mfu_exporter.logs.records import Line, Progress, Record

# A header: the CSV's columns, a ThroughputMonitor's among them (its stage "train", any one-character separator).
HEADER = re.compile(r"(?:^|,)train([/|.:_-])(?:batches|samples|lengths|time)(?:,|\r?$)")
NEVER = re.compile(r"(?!)")  # rows are bare numbers: no form a line could be told a progress row by
MAX_ROWS = 100_000  # rows remembered (a row per log_every_n_steps: 5M steps at the default 50)


class LightningCsvParser(Parser):
    name = "lightning_csv"
    anchor = HEADER
    anchor_keywords = ("train/", "train|")
    candidate = NEVER
    keywords = None  # every line: its rows carry no word to look for
    unread_hint = (
        "a Lightning CSVLogger row gives progress only with a ThroughputMonitor's train/lengths or train/samples "
        "column (ThroughputMonitor(batch_size_fn=..., length_fn=...))"
    )

    def __init__(self) -> None:
        self.columns: dict[str, int] = {}
        self.separator = "/"
        # Each progress row read, by step: its train/time. A rewrite (a new column) puts every row in the file again,
        # and the follower reads it from the start: a row seen before is no progress; the same step at another time
        # is a new run's.
        self.rows: dict[int, str] = {}

    def parse(self, line: Line) -> Record | None:
        text = line.text.strip()
        if not text:
            return None
        header = HEADER.search(text)
        if header:
            # A (re)written header: its columns from now on (a new column rewrites the file, header first).
            self.separator = header.group(1)
            self.columns = {name: i for i, name in enumerate(next(csv.reader([text])))}
            return None
        if not self.columns:
            return None
        cells = next(csv.reader([text]), [])
        tokens, samples = self._cell(cells, "lengths"), self._cell(cells, "samples")
        if tokens is None and samples is None:
            return None  # the module's own self.log row, or a row of another stage
        step = integer(self._cell_named(cells, "step"))
        clock = self._cell_named(cells, f"train{self.separator}time") or ""
        if step is not None:
            if self.rows.get(step) == clock:
                return None  # read again after the file was rewritten
            if step in self.rows:  # a new run from an earlier step: what the old one logged past it is over
                self.rows = {s: t for s, t in self.rows.items() if s < step}
            self.rows[step] = clock
            if len(self.rows) > MAX_ROWS:
                del self.rows[next(iter(self.rows))]
        flops = self._cell(cells, f"device{self.separator}flops_per_sec")
        mfu = self._cell(cells, f"device{self.separator}mfu")
        return Progress(
            step=step,
            tokens_seen_per_device=tokens,
            samples_seen_per_device=samples if tokens is None else None,
            tflops_per_gpu=flops / 1e12 if flops is not None else None,
            mfu=mfu,
            elapsed=self._cell(cells, "time"),
        )

    def _cell(self, cells: list[str], key: str) -> float | None:
        value = number(self._cell_named(cells, f"train{self.separator}{key}"))
        return value if value is None or value >= 0 else None

    def _cell_named(self, cells: list[str], column: str) -> str | None:
        index = self.columns.get(column)
        if index is None or index >= len(cells) or not cells[index]:
            return None
        return cells[index]
