"""NCCL Inspector's output: the profiler plugin's JSON lines and its Prometheus textfile, parsed and summarised.

From NVIDIA/nccl ``plugins/profiler/inspector`` (HEAD 5067397c, 2026-06; added in NCCL 2.28.3, Prometheus mode in
2.29.3), read there rather than from its README where they differ:

- JSON mode, ``inspector.cc`` ``inspectorStateDumpJSON``: one file per process,
  ``snprintf(tmp, ..., "%s/%s-pid%d.log", output_root, hostname, getpid())`` under ``NCCL_INSPECTOR_DUMP_DIR``.
  ``inspector_json.cc`` ``inspectorCommInfoDumpColl`` writes, per completed collective and communicator, one compact
  object and ``jsonNewline``: ``{"header":{"id","comm_name","rank","n_ranks","nnodes"},"metadata":
  {"inspector_output_format_version":"v4.0","git_rev","rec_mechanism","dump_timestamp_us","hostname","pid"},
  "coll_perf":{"coll","coll_sn","coll_msg_size_bytes","coll_exec_time_us","coll_timing_source","coll_algobw_gbs",
  "coll_busbw_gbs"}}`` (``event_trace_sn``/``event_trace_ts`` added with ``NCCL_INSPECTOR_DUMP_VERBOSE=1``).
  Point-to-point operations come as ``p2p_perf`` (``p2p``, ``p2p_peer``, ...): not collectives, left out here.
  ``json.cc`` ``jsonDouble`` prints ``%lf``, or the string ``"nan"``; older files (v3) lack ``comm_name`` and
  ``coll_timing_source``. The plugin's README (``README.md``, "Output Example") prints the same objects indented over
  many lines; ``JsonObjects`` reads both, with the same bounds.
- Prometheus mode (``NCCL_INSPECTOR_PROM_DUMP=1``), ``inspector_prom.cc``: one file per GPU,
  ``"%s/nccl_inspector_metrics_%s.prom"`` with the device UUID, rewritten every dump (at least 30 s), lines
  ``nccl_bus_bandwidth_gbs{%s} %.6g`` (geometric mean over the interval) and
  ``nccl_collective_exec_time_microseconds{%s} %.6g`` (arithmetic mean) with labels ``version, slurm_job_id, node,
  gpu ("GPU<cudaDev>"), comm_name, n_nodes, nranks, collective, message_size, algo_proto``; ``message_size`` is
  ``inspectorPromFormatMessageSizeRange``: ``"%.0f-%.0f%s"`` of the size in its 1024-unit (``4-5GB``, ``0B``).
  P2P lines (``nccl_p2p_*``) are left out as above.

Pure: text in, dataclasses out. The nccl source (``mfu_exporter.sources.nccl``) tails the files and maps processes and
GPUs to jobs; ``CollectiveTally`` is what it keeps per job.
"""

from __future__ import annotations

import json
import math
import re
from collections import deque
from dataclasses import dataclass, field
from typing import Iterable

# Message-size classes, few on purpose (a series per job, collective and class): latency-bound small messages,
# the middle, and the bandwidth-bound large ones whose bus bandwidth is the fabric's.
SIZE_CLASSES = (("small", 1 << 20), ("medium", 128 << 20), ("large", math.inf))  # (class, upper bound in bytes)
JSON_FILE = re.compile(r"^(?P<host>.+)-pid(?P<pid>\d+)\.log$")
PROM_FILE = re.compile(r"^nccl_inspector_metrics_(?P<uuid>.+)\.prom$")
PROM_LINE = re.compile(
    r"^(?P<name>nccl_bus_bandwidth_gbs|nccl_collective_exec_time_microseconds)\{(?P<labels>.*)\}\s+(?P<value>\S+)\s*$"
)
PROM_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
SIZE_RANGE = re.compile(r"^(\d+)-\d+(B|KB|MB|GB|TB)$")
UNITS = {"B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40}
GBS = 1e9  # Inspector's GB/s are decimal: bytes ÷ µs ÷ 1000
# A rank's last medium and large collectives whose median is compared with its peers': recent, so a rank that turns
# slow (or recovers) shows within a few dumps, yet a median of enough that one odd collective does not.
RANK_WINDOW = 16


def size_class(size_bytes: float) -> str:
    """The message-size class a collective of this many bytes falls in."""
    return next(name for name, upper in SIZE_CLASSES if size_bytes < upper)


@dataclass(frozen=True, slots=True)
class Collective:
    """One completed collective of one rank on one communicator (a JSON line)."""

    comm: str  # the communicator's hash (header.id)
    rank: int
    n_ranks: int
    n_nodes: int | None
    hostname: str
    pid: int
    collective: str  # "AllReduce", "AllGather", "ReduceScatter", "Broadcast", "Reduce", ...
    sn: int
    size_bytes: int
    exec_time_seconds: float
    busbw_bytes_per_second: float | None  # None when Inspector wrote "nan"
    timing_source: str | None  # "kernel_gpu", "kernel_cpu", "collective_cpu"; None before v4
    dump_time: float | None  # seconds since the epoch


# What a value of Inspector's may be; a line with a number past these is skipped as ``value_out_of_range``, since no
# GPU, job or clock reaches them and one such value would reach /metrics as an absurd or infinite figure.
MAX_BUSBW_GBS = 1e4  # 10 TB/s: several times the fastest NVLink a GPU has
MAX_EXEC_US = 3.6e9  # an hour for one collective
MAX_SIZE_BYTES = 1 << 50  # 1 PiB in one collective
MAX_RANKS = 1 << 24
MAX_PID = 1 << 22  # Linux's largest pid_max
MAX_SN = 1 << 63
MAX_DUMP_US = 1e17  # the year 5000, in microseconds since the epoch
MAX_TEXT = 256  # characters kept of a name (communicator, host, collective)


class LineError(ValueError):
    """A line that is not one of Inspector's, with the reason it is counted under (``unreadable_line``,
    ``value_out_of_range``, ``nested_too_deep``) and the field at fault."""

    def __init__(self, message: str, reason: str = "unreadable_line"):
        super().__init__(message)
        self.reason = reason


def _reject_constant(name: str) -> float:
    raise LineError(f"{name} is not a number JSON allows", "value_out_of_range")


def _finite(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None  # "nan" is a string in Inspector's JSON
    try:
        number = float(value)
    except OverflowError:  # an integer past a float's range
        return None
    return number if math.isfinite(number) and number >= 0 else None


def _number(record: dict, key: str, upper: float, where: str) -> float:
    """A required non-negative number no larger than ``upper``; LineError names the field."""
    if key not in record:
        raise LineError(f"{where}.{key} is missing")
    value = _finite(record[key])
    if value is None:
        raise LineError(f"{where}.{key} is not a finite number: {str(record[key])[:40]}", "value_out_of_range")
    if value > upper:
        raise LineError(f"{where}.{key} is over {upper:g}: {value:g}", "value_out_of_range")
    return value


def _integer(record: dict, key: str, upper: int, where: str) -> int:
    value = _number(record, key, upper, where)
    if value != int(value):
        raise LineError(f"{where}.{key} is not a whole number: {value:g}", "value_out_of_range")
    return int(value)


def _text(value: object) -> str:
    return value[:MAX_TEXT] if isinstance(value, str) else str(value)[:MAX_TEXT] if isinstance(value, int) else ""


def parse_line(line: str) -> Collective | None:
    """A JSON line's collective; None for a P2P operation. Raises LineError (a ValueError) for a line that is not
    Inspector's or holds a value past the bounds above, naming the field."""
    try:
        record = json.loads(line, parse_constant=_reject_constant)
    except LineError:
        raise
    except json.JSONDecodeError as error:
        raise LineError(f"not JSON: {error.msg}") from None
    except ValueError as error:  # an integer literal of thousands of digits
        raise LineError(f"not JSON: {str(error)[:80]}", "value_out_of_range") from None
    except RecursionError:
        raise LineError("not JSON: nested too deep", "nested_too_deep") from None
    if not isinstance(record, dict) or not isinstance(record.get("header"), dict):
        raise LineError("no header object")
    perf = record.get("coll_perf")
    if perf is None:
        if isinstance(record.get("p2p_perf"), dict):
            return None
        raise LineError("neither coll_perf nor p2p_perf")
    header, meta = record["header"], record.get("metadata") or {}
    if not isinstance(perf, dict) or not isinstance(meta, dict):
        raise LineError("coll_perf or metadata is not an object")
    size = _integer(perf, "coll_msg_size_bytes", MAX_SIZE_BYTES, "coll_perf")
    exec_us = _number(perf, "coll_exec_time_us", MAX_EXEC_US, "coll_perf")
    rank = _integer(header, "rank", MAX_RANKS, "header")
    n_ranks = _integer(header, "n_ranks", MAX_RANKS, "header")
    sn = _integer(perf, "coll_sn", MAX_SN, "coll_perf")
    if not isinstance(perf.get("coll"), str) or not perf["coll"]:
        raise LineError("coll_perf.coll is not a name")
    if not rank < max(n_ranks, 1):
        raise LineError(f"header.rank {rank} is not under n_ranks {n_ranks}", "value_out_of_range")
    busbw = None if isinstance(perf.get("coll_busbw_gbs"), str) else perf.get("coll_busbw_gbs")
    if busbw is not None:
        busbw = _number(perf, "coll_busbw_gbs", MAX_BUSBW_GBS, "coll_perf")
    pid = _integer(meta, "pid", MAX_PID, "metadata") if meta.get("pid") is not None else 0
    nodes = header.get("nnodes")
    dump_us = _finite(meta.get("dump_timestamp_us"))
    source = perf.get("coll_timing_source")
    return Collective(
        comm=_text(header.get("id", "")),
        rank=rank,
        n_ranks=n_ranks,
        n_nodes=nodes if isinstance(nodes, int) and not isinstance(nodes, bool) and 0 < nodes <= MAX_RANKS else None,
        hostname=_text(meta.get("hostname", "")),
        pid=pid,
        collective=perf["coll"][:MAX_TEXT],
        sn=sn,
        size_bytes=size,
        exec_time_seconds=exec_us / 1e6,
        busbw_bytes_per_second=busbw * GBS if busbw is not None else None,
        timing_source=source[:MAX_TEXT] if isinstance(source, str) else None,
        dump_time=dump_us / 1e6 if dump_us is not None and dump_us <= MAX_DUMP_US else None,
    )


MAX_OBJECT_BYTES = 64 << 10  # one object, compact or printed over lines: Inspector's are a few hundred bytes
MAX_NESTING = 32  # objects and arrays inside one another: Inspector's verbose objects go 4 deep
BRACKETS = re.compile(r"[\[\]{}]")
JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


class JsonObjects:
    """Inspector's JSON objects from a file's lines: one compact object a line, as the plugin writes, or one object
    printed over many lines, as its README prints them (pretty-printed, or copied from there). ``feed`` takes the
    file's complete lines in order and gives each object's text (for ``parse_line``) or a ``LineError`` for one past
    the bounds, which is skipped whole: over ``MAX_OBJECT_BYTES``, nested past ``MAX_NESTING``, or cut off by the
    next object's ``{`` at the start of a line. JSON strings hold no raw newline, so brackets are counted per line
    outside strings."""

    def __init__(self) -> None:
        self._lines: list[str] = []  # the object being read
        self._size = 0
        self._depth = 0
        self._skipping = False  # inside an object refused: its lines are dropped up to its end

    def feed(self, line: str) -> list[str | LineError]:
        out: list[str | LineError] = []
        if self._depth > 0 and line.startswith("{"):  # a new object at the margin: the one before was cut off
            if not self._skipping:
                out.append(LineError("an object cut off before its end"))
            self._reset()
        if self._depth == 0:
            text = line.strip()
            if not text:
                return out
            if not text.startswith("{") or text.endswith("}"):
                out.append(line)  # a compact object, or a line that is not one: parse_line judges it
                return out
        depth, deepest = self._depth, self._depth
        for bracket in BRACKETS.findall(JSON_STRING.sub("", line)):
            depth += 1 if bracket in "[{" else -1
            deepest = max(deepest, depth)
        self._depth = max(depth, 0)
        if self._skipping:
            if self._depth == 0:
                self._reset()
            return out
        self._lines.append(line)
        self._size += len(line) + 1
        if deepest > MAX_NESTING or self._size > MAX_OBJECT_BYTES:
            too_deep = deepest > MAX_NESTING
            out.append(
                LineError("an object nested too deep", "nested_too_deep")
                if too_deep
                else LineError("an object over its size bound", "line_too_long")
            )
            self._lines, self._size, self._skipping = [], 0, self._depth > 0
            return out
        if self._depth == 0:
            out.append("\n".join(self._lines))
            self._reset()
        return out

    @property
    def open(self) -> bool:
        """Inside an object printed over lines."""
        return self._depth > 0

    def _reset(self) -> None:
        self._lines, self._size, self._depth, self._skipping = [], 0, 0, False


@dataclass(frozen=True, slots=True)
class PromBucket:
    """One communicator's collective and size bucket on one GPU, as the Prometheus textfile mode sums it up."""

    gpu: str  # "GPU0": the CUDA device of the process, not NVML's index
    comm_name: str
    collective: str
    size_bytes: int  # the bucket's lower bound
    n_nodes: int | None
    n_ranks: int | None
    slurm_job_id: str | None
    busbw_bytes_per_second: float | None = None
    exec_time_seconds: float | None = None


def message_size_bytes(label: str) -> int | None:
    """The lower bound of Inspector's ``message_size`` label (``4-5GB`` -> 4 GiB, ``0B`` -> 0)."""
    if label == "0B":
        return 0
    found = SIZE_RANGE.match(label)
    if found is None or len(found.group(1)) > 12:  # past a PiB in any unit: not Inspector's
        return None
    return int(found.group(1)) * UNITS[found.group(2)]


def parse_textfile(text: str) -> tuple[list[PromBucket], int]:
    """The collective buckets of a ``nccl_inspector_metrics_<uuid>.prom`` file, and how many lines were unreadable."""
    buckets: dict[tuple, dict] = {}
    bad = 0
    for line in text.splitlines():
        if not line.strip() or line.startswith("#") or line.startswith("nccl_p2p_"):
            continue
        try:
            parsed = _prom_line(line)
        except Exception:  # noqa: BLE001 - a line that breaks the parser is one bad line, never the file
            parsed = None
        if parsed is None:
            bad += 1
            continue
        found, labels, size, value = parsed
        key = (labels.get("gpu", ""), labels.get("comm_name", ""), labels["collective"], size, labels.get("algo_proto"))
        entry = buckets.setdefault(key, {"labels": labels, "size": size})
        if found.group("name") == "nccl_bus_bandwidth_gbs":
            entry["busbw"] = value * GBS
        else:
            entry["exec"] = value / 1e6
    result = []
    for (gpu, comm, collective, size, _), entry in buckets.items():
        labels = entry["labels"]
        result.append(
            PromBucket(
                gpu=gpu,
                comm_name=comm,
                collective=collective,
                size_bytes=size,
                n_nodes=_int(labels.get("n_nodes")),
                n_ranks=_int(labels.get("nranks")),
                slurm_job_id=labels.get("slurm_job_id")
                if labels.get("slurm_job_id") not in (None, "unknown")
                else None,
                busbw_bytes_per_second=entry.get("busbw"),
                exec_time_seconds=entry.get("exec"),
            )
        )
    return result, bad


def _prom_line(line: str) -> tuple[re.Match, dict[str, str], int, float] | None:
    """A textfile line's match, labels, size bucket and value; None for one that is not Inspector's or whose value
    is past the JSON lines' bounds."""
    found = PROM_LINE.match(line)
    if found is None:
        return None
    labels = dict(PROM_LABEL.findall(found.group("labels")))
    size = message_size_bytes(labels.get("message_size", ""))
    value = float(found.group("value"))
    upper = MAX_BUSBW_GBS if found.group("name") == "nccl_bus_bandwidth_gbs" else MAX_EXEC_US
    if size is None or size > MAX_SIZE_BYTES or "collective" not in labels or not 0 <= value <= upper:
        return None
    return found, labels, size, value


def _int(text: str | None) -> int | None:
    if text is None or not text.isascii() or not text.isdigit() or len(text) > 9:
        return None
    return int(text)


# -- the per-job summary ------------------------------------------------------------------------------------------


@dataclass
class _Class:
    count: int = 0
    seconds: float = 0.0
    bytes: float = 0.0
    recent: deque = field(default_factory=lambda: deque(maxlen=256))  # (busbw, exec seconds) of the last ones


@dataclass(frozen=True, slots=True)
class CollectiveSummary:
    """A job's collectives of one kind and size class on this node, for its series."""

    collective: str
    size_class: str
    count: int  # collectives seen since the exporter started (a counter)
    exec_seconds: float  # their summed execution time (a counter)
    busbw_bytes_per_second: float | None  # geometric mean of the recent ones (as Inspector's own textfile mode)
    exec_time_seconds: float | None  # mean execution time of the recent ones


class CollectiveTally:
    """A job's collectives on this node, by kind and size class: counts and times since start, recent bandwidth;
    and each rank's (process's) recent execution times, for the slow-rank comparison. Bounded: a class keeps its
    last 256 collectives, a job its last ``MAX_RANKS`` processes."""

    MAX_RANKS = 64

    def __init__(self) -> None:
        self._classes: dict[tuple[str, str], _Class] = {}
        self._ranks: dict[str, deque] = {}  # process key -> recent exec times of large collectives

    def add(self, item: Collective, who: str) -> None:
        entry = self._classes.setdefault((item.collective, size_class(item.size_bytes)), _Class())
        entry.count += 1
        entry.seconds += item.exec_time_seconds
        entry.recent.append((item.busbw_bytes_per_second, item.exec_time_seconds))
        if size_class(item.size_bytes) != "small":  # the small ones measure latency, not who is late
            if who not in self._ranks and len(self._ranks) >= self.MAX_RANKS:
                return
            self._ranks.setdefault(who, deque(maxlen=RANK_WINDOW)).append(item.exec_time_seconds)

    def add_bucket(self, bucket: PromBucket, who: str) -> None:
        """A textfile bucket: its means stand for one collective each time the file is rewritten."""
        entry = self._classes.setdefault((bucket.collective, size_class(bucket.size_bytes)), _Class())
        entry.recent.append((bucket.busbw_bytes_per_second, bucket.exec_time_seconds))
        if bucket.exec_time_seconds is not None and size_class(bucket.size_bytes) != "small":
            if who in self._ranks or len(self._ranks) < self.MAX_RANKS:
                self._ranks.setdefault(who, deque(maxlen=RANK_WINDOW)).append(bucket.exec_time_seconds)

    def summaries(self) -> list[CollectiveSummary]:
        result = []
        for (collective, klass), entry in sorted(self._classes.items()):
            bandwidths = [b for b, _ in entry.recent if b is not None and b > 0]
            times = [t for _, t in entry.recent if t is not None]
            result.append(
                CollectiveSummary(
                    collective=collective,
                    size_class=klass,
                    count=entry.count,
                    exec_seconds=entry.seconds,
                    busbw_bytes_per_second=math.exp(sum(map(math.log, bandwidths)) / len(bandwidths))
                    if bandwidths
                    else None,
                    exec_time_seconds=sum(times) / len(times) if times else None,
                )
            )
        return result

    def rank_times(self) -> dict[str, float]:
        """Each process's median execution time of its last ``RANK_WINDOW`` medium and large collectives."""
        return {who: median(times) for who, times in self._ranks.items() if times}


def median(values: Iterable[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def shortest_outlier(times: dict[str, float], floor: float = 0.3) -> tuple[str, float, float] | None:
    """The rank whose collectives are the shortest by far: its peers wait inside the kernel for it, so the straggler
    spends the least time in collectives. Beyond median − 3 MAD of the ranks and at least ``floor`` (30%) under
    the median, so ranks that agree closely do not name one of them; three ranks at least. Returns (rank, its time,
    the median) or None."""
    if len(times) < 3:
        return None
    middle = median(times.values())
    mad = median(abs(t - middle) for t in times.values())
    who, shortest = min(times.items(), key=lambda kv: kv[1])
    if middle <= 0 or shortest > middle - 3 * mad or shortest > (1 - floor) * middle:
        return None
    return who, shortest, middle
