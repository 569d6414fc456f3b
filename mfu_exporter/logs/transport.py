"""Peel the layers between a framework's ``print`` and the bytes on disk.

From the outside in (../shared/reference/framework-logs.md §0):

- **CRI container log** (kubelet/containerd, ``/var/log/pods/<ns>_<pod>_<uid>/<container>/<n>.log``): each line is
  ``<RFC3339Nano time> <stdout|stderr> <P|F>[:tags] <text>``. ``P`` is a partial segment (containerd splits lines
  over ``MaxContainerLogLineSize``, 16 KiB), joined with the following segments of the same stream up to the ``F``
  one. The comment of the kubelet's ``parseCRILog`` gives the form:
  ``2016-10-06T00:17:09.669794202Z stdout P log content 1``. The same parser reads Docker's json-file lines
  ``{"log":"content 1","stream":"stdout","time":"2016-10-20T18:39:20.57606443Z"}``.
- **Launchers and job runners**, each a whole-line prefix, nested in any order (``LAUNCHER``), peeled here once for
  every parser so detection and reading see the same line:

  - Slurm ``srun --label``: ``<task>: `` (`` 0: Training epoch 0, ...``, NVIDIA-NeMo/Speech#14850);
  - torchrun ``--tee``/``--local-ranks-filter`` and torchelastic's ``--log-line-prefix-template``
    (``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE``, any text in brackets then ``:``): ``[rank0]:`` (torchtitan#3393),
    ``[default3]:`` (pytorch#75087), ``[trainer1|1]:``;
  - a job runner's ``stdout: `` / ``stderr: ``;
  - ``mpirun --tag-output`` (``[1,0]<stdout>:``, with ``--timestamp-output``'s date before it);
  - Ray's ``(RayTrainWorker pid=1585) `` (kuberay#1891);
  - Python logging's time and a rank tag before the framework's own line:
    ``2023-10-26 21:31:16,318 [Rank 15]:  iteration ...``; that time (local) becomes the line's time;
  - a runner's bracketed ISO 8601 time with its zone, ``[2025-10-17T11:33:02+08:00] Training epoch 0, ...``
    (DeepLink-org/AIChipBenchmark's NeMo log), which becomes the line's time.
- **ANSI colour** (torchtitan's step line, NeMo's header): ``ESC [ ... m`` removed everywhere.
- **tqdm** ``\\r``: a bar redraws itself with carriage returns, so one physical line can hold bar fragments and
  a record written with ``tqdm.write``: each ``\\r`` piece is a line of its own.
"""

from __future__ import annotations

import calendar
import json
import re
from collections import Counter
from typing import Iterator

from mfu_exporter.logs.base import local_time
from mfu_exporter.logs.records import Line

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
CRI = re.compile(
    r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)) (stdout|stderr) ([PF])(?::\S*)? ?(.*)$", re.S
)
RFC3339 = re.compile(r"^(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$")
LAUNCHER = re.compile(
    r"\s*(?P<task>\d+): "
    r"|\[(?P<rank>[^\]\s]{1,64})\]:"
    r"|(?P<stream>stdout|stderr): "
    r"|(?:[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4})?\[(?P<mpi>\d+,\d+)\]<std(?:out|err)>:"
    r"|\((?P<ray>\w+ pid=\d+(?:, ip=[\d.]+)?)\) "
    r"|(?P<stamp>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \[(?P<tag>[Rr]ank ?\d+)\]:\s?"
    r"|\[?(?P<iso>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d))\] "
)
MAX_PREFIXES = 4  # launcher layers peeled from one line: srun outside torchrun outside a runner is three
MAX_LINE_CHARS = 1 << 20  # a CRI line joined from P segments past this is dropped (bounded memory), with a count


def parse_rfc3339(text: str) -> float | None:
    """Unix seconds of an RFC 3339 time with any number of fraction digits (CRI writes nanoseconds)."""
    match = RFC3339.match(text)
    if not match:
        return None
    year, month, day, hour, minute, second, fraction, zone = match.groups()
    seconds = calendar.timegm((int(year), int(month), int(day), int(hour), int(minute), int(second), 0, 0, 0))
    if fraction:
        seconds += int(fraction[:9].ljust(9, "0")) / 1e9
    if zone != "Z":
        sign = 1 if zone[0] == "+" else -1
        seconds -= sign * (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60)
    return seconds


class Peeler:
    """Turns the raw lines of one file into ``Line`` records. Stateful only for CRI partial lines.

    ``container`` is ``cri`` (kubelet files), ``plain`` or ``auto``: the first non-empty line decides, and a CRI
    file is a CRI file throughout (a line of it that is not CRI-formed is counted as ``cri_malformed`` and kept).
    """

    def __init__(self, container: str = "auto", max_line_chars: int = MAX_LINE_CHARS):
        self.container = container
        self.max_line_chars = max_line_chars
        self.errors: Counter = Counter()
        self._partial: dict[str, list[str]] = {}
        self._partial_size: dict[str, int] = {}
        self._dropping: set[str] = set()

    def feed(self, raw: str) -> list[Line]:
        """The lines of one raw line, transport and launcher layers peeled."""
        return [
            line
            for text, stamp in self.unwrap(raw)
            for line in split_line(text, parse_rfc3339(stamp) if stamp else None)
        ]

    def unwrap(self, raw: str) -> list[tuple[str, str | None]]:
        """The container layer only: ``(text, RFC 3339 time or None)`` of each complete line (CRI partial lines
        give nothing until their last segment). Cheap, so a caller can skip uninteresting text before the rest."""
        if self.container == "auto":
            if not raw.strip():
                return []
            self.container = "cri" if CRI.match(raw) else "docker" if raw.startswith('{"log":') else "plain"
        if self.container == "cri":
            return self._cri(raw)
        if self.container == "docker":
            return self._docker(raw)
        return [(raw, None)]

    def _cri(self, raw: str) -> list[tuple[str, str | None]]:
        # One str.split, not the regex: this runs on every line of a pod's log.
        parts = raw.split(" ", 3)
        if len(parts) == 3:
            parts.append("")  # an F segment with no text (an empty line)
        if len(parts) != 4:
            self.errors["cri_malformed"] += 1
            return [(raw, None)]
        stamp, stream, tag, text = parts
        if (
            stream not in ("stdout", "stderr")
            or not tag
            or tag[0] not in "PF"
            or (len(tag) > 1 and tag[1] != ":")
            or stamp[4:5] != "-"
            or stamp[10:11] != "T"
        ):
            self.errors["cri_malformed"] += 1
            return [(raw, None)]
        if tag[0] == "P":
            if stream in self._dropping:
                return []
            size = self._partial_size.get(stream, 0) + len(text)
            if size > self.max_line_chars:
                self.errors["line_too_long"] += 1
                self._dropping.add(stream)
                self._partial.pop(stream, None)
                self._partial_size.pop(stream, None)
                return []
            self._partial.setdefault(stream, []).append(text)
            self._partial_size[stream] = size
            return []
        if stream in self._dropping:
            self._dropping.discard(stream)
            return []
        if self._partial:
            parts = self._partial.pop(stream, None)
            self._partial_size.pop(stream, None)
            if parts:
                parts.append(text)
                text = "".join(parts)
        return [(text, stamp)]

    def _docker(self, raw: str) -> list[tuple[str, str | None]]:
        try:
            record = json.loads(raw)
            text, stamp = record["log"], record.get("time", "")
        except (ValueError, KeyError, TypeError):
            self.errors["docker_malformed"] += 1
            return [(raw, None)]
        return [(str(text).rstrip("\n"), str(stamp) or None)]


def split_line(text: str, when: float | None) -> Iterator[Line]:
    """The launcher prefixes, colour and ``\\r`` pieces of one physical line."""
    if "\x1b" in text:
        text = ANSI.sub("", text)
    origin = ""
    for _ in range(MAX_PREFIXES):
        prefix = LAUNCHER.match(text)
        if prefix is None:
            break
        text = text[prefix.end() :]
        kind = prefix.lastgroup  # the stamp alternative's last group is its rank tag
        if kind == "tag" and when is None:
            when = local_time(prefix.group("stamp"))
        if kind == "iso":  # a runner's own time, with its zone: exact, and no writer's name
            if when is None:
                when = parse_rfc3339(prefix.group("iso"))
            continue
        if kind != "stream":  # stdout/stderr names no writer: every rank's lines share it
            origin += prefix.group(kind) + (":" if kind == "task" else "")
    if "\r" in text:
        for piece in text.split("\r"):
            if piece.strip():
                yield Line(piece, when, origin)
        return
    yield Line(text, when, origin)
