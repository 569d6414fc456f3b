"""Data-loading time from the forms that span lines: profiler tables and reports, and timer lines re-wrapped.

``mfu_exporter.logs.datawait`` reads the one-line forms; ``WaitReader`` keeps the little state these need and hands
every other line to it. A stream keeps one reader per file.

**PyTorch profiler tables** (pytorch/pytorch ``torch/autograd/profiler_util.py`` ``_build_table``, printed by
``prof.key_averages().table(...)``): a dashed line, a header of right-aligned column names (``Name``, ``Self CPU %``,
``Self CPU``, ``CPU total %``, ``CPU total``, ``CPU time avg``, the CUDA ones where traced, ``# of Calls``), a
dashed line, the rows, and ``Self CPU time total: ...``. Names longer than ``max_name_column_width`` (55) are cut
to 52 characters and ``...``; times are ``_format_time``: ``f"{time_us / US_IN_SECOND:.3f}s"``, ``ms`` or ``us``.
The data loader's ``__next__`` runs under ``torch.autograd.profiler.record_function(self._profile_name)``
(``torch/utils/data/dataloader.py``: ``enumerate(DataLoader)#{self.__class__.__name__}.__next__``), so its row's
**CPU total** is the wall time the loop spent fetching batches while the profiler recorded: the input wait of the
profiled steps (``_SingleProcessDataLoaderIter`` loads in the loop itself; ``_MultiProcessingDataLoaderIter`` waits
for its workers). Lightning's ``PyTorchProfiler`` adds ``[pl][profile]<action>`` rows, among them
``[pl][profile][_TrainingEpochLoop].train_dataloader_next`` (cut to ``..._n...``). One figure per table (its first
such row): the seconds summed over the table's window (``SINCE_LAST``); steps the profiler's schedule skipped are
not in it. The same tables re-typeset in Markdown (``| Name | Self CPU % | ... |``) are read the same way.

**Lightning's AdvancedProfiler** (Lightning-AI/pytorch-lightning ``src/lightning/pytorch/profilers/advanced.py``
``summary`` and ``profiler.py`` ``_stats_to_str``, 2.6): per action ``f"Profile stats for: {action}"`` (with
``f" rank: {local_rank}"`` when set) and ``pstats`` of its cProfile, whose first line is ``N function calls (M
primitive calls) in X seconds`` on the next line: X is the action's whole time in the stage so far. For the loop's
``[_TrainingEpochLoop].train_dataloader_next`` (``get_train_batch`` before 2022-06) it is the running total of the
wait (``RUNNING_TOTAL``), as the simple profiler's row (``mfu_exporter.logs.datawait``).

**Timer lines re-wrapped** by hand or by a terminal: Megatron's and DeepSpeed's ``time (ms) | name: value | ...``
broken over lines, the data-loading field on a later line with no ``time (ms)`` of its own. That line is read when
it is nothing but ``name: value`` fields and a timer line left open (ending in ``|``) came at most ``WRAP_LINES``
lines before it.
"""

from __future__ import annotations

import re

from mfu_exporter.logs.base import number
from mfu_exporter.logs.datawait import parse_data_wait
from mfu_exporter.logs.records import PER_STEP, RUNNING_TOTAL, SINCE_LAST, DataWait

# Substrings one of which every line read here contains, beyond datawait's own.
KEYWORDS = ("CPU total", "enumerate(DataLoader)#", "train_dataloader_n", "function calls", "time (ms)")
WRAP_LINES = 12  # a wrapped timer line's fields are within this many lines of its "time (ms)"
UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
TIME = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(s|ms|us)$")
# The rows whose time is the input wait: the data loader's iterator (cut or whole) and Lightning's action.
LOADER_ROW = re.compile(
    r"^(?:enumerate\(DataLoader\)#_(?:SingleProcess|MultiProcessing)DataLoaderIter(?:\._?_?next__|\.\.\.|\._\.\.\.)"
    r"|\[pl\]\[profile\]\[_?TrainingEpochLoop\]\.train_dataloader_n(?:ext|\.\.\.))$"
)
ADVANCED_ACTION = re.compile(
    r"Profile stats for: (?:\[_?TrainingEpochLoop\]\.train_dataloader_next|get_train_batch)(?: rank: \d+)?\s*$"
)
ADVANCED_TOTAL = re.compile(r"^\s*\d+ function calls(?: \(\d+ primitive calls\))? in ([0-9]+(?:\.[0-9]+)?) seconds\s*$")
# A wrapped timer line's later part: "name: value" fields between "|", a comment or quote marker before them.
FIELDS = re.compile(r"^[#>\s]*(?:[A-Za-z][\w\- ]*: [0-9]+(?:\.[0-9]+)?\s*(?:\||$)\s*)+$")
WRAPPED = re.compile(
    r"(?:^[#>\s]*|\|)\s*(batch-generator|batch generator|batch_input): ([0-9]+(?:\.[0-9]+)?)\s*(?:\||$)"
)


def _cells(text: str) -> list[str]:
    """A table line's cells: Markdown's ``|`` columns, else the columns two or more spaces apart."""
    stripped = text.strip()
    if stripped.startswith("|"):
        return [cell.strip() for cell in stripped.strip("|").split("|")]
    return [cell for cell in re.split(r"\s{2,}", stripped) if cell]


def _seconds(cell: str) -> float | None:
    found = TIME.match(cell)
    value = number(found.group(1)) if found else None
    return value * UNITS[found.group(2)] if found and value is not None else None


class WaitReader:
    """One log file's data-loading figures, line by line (``read``), with the state the multi-line forms need."""

    __slots__ = ("_columns", "_taken", "_advanced", "_timer_open")

    def __init__(self) -> None:
        self._columns: list[str] | None = None  # the current profiler table's header
        self._taken = False  # the current table gave its figure
        self._advanced: int | None = None  # the line that named the data loader's action in an AdvancedProfiler report
        self._timer_open: int | None = None  # the line number of a "time (ms)" line left open

    def read(self, text: str, line_number: int) -> DataWait | None:
        """The figure ``text`` (the file's ``line_number``-th line) completes, or None."""
        if self._advanced is not None:
            named, self._advanced = self._advanced, None
            found = ADVANCED_TOTAL.match(text) if line_number == named + 1 else None
            if found:
                seconds = number(found.group(1))
                return DataWait(seconds, RUNNING_TOTAL, "lightning") if seconds is not None else None
        if "Profile stats for:" in text:
            self._advanced = line_number if ADVANCED_ACTION.search(text) is not None else None
            return None
        if "CPU total" in text:
            cells = _cells(text)
            if cells and cells[0] == "Name" and "CPU total" in cells:
                self._columns, self._taken = cells, False
            return None
        if self._columns is not None and ("DataLoader" in text or "train_dataloader_n" in text):
            found = self._row(text)
            if found is not None:
                return found
        wait = parse_data_wait(text)
        if wait is not None:
            self._timer_open = None
            return wait
        return self._wrapped(text, line_number)

    def _row(self, text: str) -> DataWait | None:
        assert self._columns is not None
        cells = _cells(text)
        if self._taken or len(cells) != len(self._columns) or LOADER_ROW.match(cells[0]) is None:
            return None
        seconds = _seconds(cells[self._columns.index("CPU total")])
        if seconds is None:
            return None
        self._taken = True
        return DataWait(seconds, SINCE_LAST, "lightning" if cells[0].startswith("[pl]") else "pytorch")

    def _wrapped(self, text: str, line_number: int) -> DataWait | None:
        if "time (ms)" in text:
            self._timer_open = line_number if text.rstrip().endswith("|") else None
            return None
        opened, self._timer_open = self._timer_open, None
        if opened is None or line_number - opened > WRAP_LINES or not FIELDS.match(text):
            return None
        found = WRAPPED.search(text)
        if found is None:
            self._timer_open = opened  # more fields to come
            return None
        value = number(found.group(2))
        if value is None:
            return None
        if found.group(1) == "batch_input":
            return DataWait(value / 1000, SINCE_LAST, "deepspeed")
        return DataWait(value / 1000, PER_STEP, "megatron")
