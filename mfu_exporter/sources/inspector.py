"""NCCL Inspector's files, followed for the nccl source: each job's collectives as Inspector measures them
(``sources.nccl.inspector_paths``).

NCCL Inspector (a profiler plugin of NCCL since 2.28.3) writes, per process, one JSON line per collective and
communicator to ``<dump dir>/<host>-pid<pid>.log`` (an object printed over many lines, as its README shows them, is
read the same way: ``JsonObjects``), or, in its Prometheus mode, one textfile per GPU,
``nccl_inspector_metrics_<GPU UUID>.prom``, rewritten every dump (``mfu_exporter.nccl.inspector`` has the layouts).
``InspectorFiles`` follows them: a JSON file is read from where the last sample stopped (at most ``MAX_READ_BYTES`` per
file and sample, the rest next time; a file that shrank or was replaced is read from its start), a textfile again
only when its modification time changed.

Which job a file is: a JSON file's pid holds a GPU (NVML's compute processes, host PIDs: Slurm, or a DaemonSet in the
host's PID namespace), and a textfile names its GPU's UUID; the job holding that GPU (discovery, or ``jobs.<job>.gpus``)
is the file's job. A node running one job gives it every file whose GPU is not known (a container's own PIDs).

Per job the snapshot keeps, by collective and message-size class, the collectives counted, their summed time, the
recent bus bandwidth and execution time (``InspectorReading``; render/collectives.py exports them,
a handful of series per job and collective, never per communicator or rank), and the rank whose collectives are the
shortest by far: its peers wait inside the collective for it, so it is the job's straggler.
"""

from __future__ import annotations

import glob
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

from mfu_exporter.nccl.inspector import (
    JSON_FILE,
    PROM_FILE,
    CollectiveSummary,
    CollectiveTally,
    JsonObjects,
    LineError,
    parse_line,
    parse_textfile,
    shortest_outlier,
)
from mfu_exporter.node.nvml import NvmlSession
from mfu_exporter.node.slurm import nvml_compute_pids

MAX_FILES = 512  # files followed at once (a process per GPU, a directory per job)
MAX_JOBS = 64
MAX_READ_BYTES = 4 << 20  # per file and sample: a backlog is read over several samples, not in one
MAX_LINE_BYTES = 64 << 10
PID_GPU_TTL = 60.0  # seconds a process's GPUs are trusted before NVML is asked again

JobsByGpu = Callable[[], dict[int, str]]  # GPU index -> the job holding it
GpuIndexByUuid = Callable[[], dict[str, int]]


@dataclass(frozen=True, slots=True)
class InspectorReading:
    """A job's collectives on this node as NCCL Inspector measured them."""

    summaries: tuple[CollectiveSummary, ...]
    straggler: str | None  # the evidence naming the rank whose collectives are the shortest, or None


@dataclass
class _File:
    inode: int = -1
    offset: int = 0
    mtime: float = -1.0
    partial: bytes = b""
    objects: JsonObjects = field(default_factory=JsonObjects)  # an object printed over lines, read so far


class InspectorFiles:
    """The files of ``paths`` (globs of dump directories or files), followed from sample to sample."""

    def __init__(
        self,
        paths: tuple[str, ...],
        nvml_session: NvmlSession | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.paths = paths
        self._session = nvml_session
        self._clock = clock
        self._files: dict[str, _File] = {}
        self._tallies: dict[str, CollectiveTally] = {}
        self._pid_gpus: dict[int, tuple[float, tuple[int, ...]]] = {}
        self._jobs_by_gpu: JobsByGpu = dict
        self._gpu_by_uuid: GpuIndexByUuid = dict

    def attach(self, jobs_by_gpu: JobsByGpu, gpu_by_uuid: GpuIndexByUuid) -> None:
        """Where a GPU's job (the job model) and a UUID's GPU index (the GPU source) come from."""
        self._jobs_by_gpu, self._gpu_by_uuid = jobs_by_gpu, gpu_by_uuid

    def close(self) -> None:
        self._files.clear()

    def sample(self, errors: Counter) -> tuple[dict[str, InspectorReading], dict]:
        """Each job's reading, and a status; problems counted into ``errors``."""
        found = self._expand(errors)
        self._files = {path: self._files.get(path, _File()) for path in found}
        jobs_by_gpu = self._jobs_by_gpu()
        only_job = next(iter(set(jobs_by_gpu.values()))) if len(set(jobs_by_gpu.values())) == 1 else None
        read = 0
        for path, kind, key in found.values():
            if kind == "json":
                gpus = self._gpus_of_pid(int(key), errors)
                host = JSON_FILE.match(os.path.basename(path)).group("host")  # type: ignore[union-attr]
                label = f"GPU {', '.join(map(str, gpus))} of {host} (pid {key})" if gpus else f"pid {key} on {host}"
            else:
                index = self._gpu_by_uuid().get(key)
                gpus = (index,) if index is not None else ()
                label = f"GPU {index}" if index is not None else key
            job = next((jobs_by_gpu[g] for g in gpus if g in jobs_by_gpu), only_job)
            if job is None:
                errors["file_without_job"] += 1
                continue
            if job not in self._tallies and len(self._tallies) >= MAX_JOBS:
                errors["too_many_jobs"] += 1
                continue
            tally = self._tallies.setdefault(job, CollectiveTally())
            read += (
                self._read_json(path, tally, label, errors)
                if kind == "json"
                else self._read_prom(path, tally, label, errors)
            )
        jobs = set(jobs_by_gpu.values())
        self._tallies = {job: tally for job, tally in self._tallies.items() if job in jobs}
        readings = {job: self._reading(tally) for job, tally in sorted(self._tallies.items())}
        return readings, {"files": len(found), "bytes_read": read, "jobs": sorted(readings)}

    def _expand(self, errors: Counter) -> dict[str, tuple[str, str, str]]:
        """Each file to follow: path -> (path, "json" or "prom", its pid or GPU UUID)."""
        found: dict[str, tuple[str, str, str]] = {}
        for pattern in self.paths:
            for match in sorted(glob.glob(pattern)):
                names = [os.path.join(match, n) for n in sorted(os.listdir(match))] if os.path.isdir(match) else [match]
                for path in names:
                    base = os.path.basename(path)
                    json_file, prom_file = JSON_FILE.match(base), PROM_FILE.match(base)
                    if json_file:
                        found.setdefault(path, (path, "json", json_file.group("pid")))
                    elif prom_file:
                        found.setdefault(path, (path, "prom", prom_file.group("uuid")))
        if len(found) > MAX_FILES:
            errors["too_many_files"] += 1
            found = dict(sorted(found.items())[:MAX_FILES])
        return found

    def _gpus_of_pid(self, pid: int, errors: Counter) -> tuple[int, ...]:
        now = self._clock()
        known = self._pid_gpus.get(pid)
        if known is not None and now - known[0] < PID_GPU_TTL:
            return known[1]
        gpus: tuple[int, ...] = ()
        if self._session is not None:
            try:
                with self._session.borrowed() as nvml:
                    indices = range(nvml.nvmlDeviceGetCount())
                    pids, failed = nvml_compute_pids(nvml, indices)
                errors.update(failed)
                gpus = tuple(sorted(index for index, held in pids.items() if pid in held))
            except Exception as error:  # noqa: BLE001 - no driver: the file's job falls back to the node's one job
                errors[f"nvml_{type(error).__name__}"] += 1
        self._pid_gpus = {p: v for p, v in self._pid_gpus.items() if now - v[0] < PID_GPU_TTL}
        self._pid_gpus[pid] = (now, gpus)
        return gpus

    def _read_json(self, path: str, tally: CollectiveTally, who: str, errors: Counter) -> int:
        state = self._files[path]
        try:
            with open(path, "rb") as handle:
                info = os.fstat(handle.fileno())
                if info.st_ino != state.inode or info.st_size < state.offset:
                    state.inode, state.offset, state.partial = info.st_ino, 0, b""  # new or truncated: from the start
                    state.objects = JsonObjects()
                handle.seek(state.offset)
                chunk = handle.read(MAX_READ_BYTES)
        except OSError as error:
            errors[f"read_{type(error).__name__}"] += 1
            return 0
        state.offset += len(chunk)
        data = state.partial + chunk
        lines = data.split(b"\n")
        state.partial = lines.pop()  # a line the plugin is still writing
        if len(state.partial) > MAX_LINE_BYTES:
            errors["line_too_long"] += 1
            state.partial = b""
        for raw in lines:
            if not raw.strip():
                continue
            if len(raw) > MAX_LINE_BYTES:  # Inspector's lines are a few hundred bytes; a huge one is not its
                errors["line_too_long"] += 1
                continue
            for text in state.objects.feed(raw.decode("utf-8", "replace")):
                if isinstance(text, LineError):  # an object past the bounds, skipped whole
                    errors[text.reason] += 1
                    continue
                try:
                    item = parse_line(text)
                    if item is not None:
                        tally.add(item, who)
                except LineError as error:
                    errors[error.reason] += 1
                except Exception as error:  # noqa: BLE001 - one object that breaks the parser is skipped, not the chunk
                    errors[f"unreadable_line_{type(error).__name__}"] += 1
        return len(chunk)

    def _read_prom(self, path: str, tally: CollectiveTally, who: str, errors: Counter) -> int:
        state = self._files[path]
        try:
            mtime = os.stat(path).st_mtime
            if mtime == state.mtime:
                return 0
            with open(path, encoding="utf-8", errors="replace") as handle:
                text = handle.read(MAX_READ_BYTES)
        except OSError as error:
            errors[f"read_{type(error).__name__}"] += 1
            return 0
        state.mtime = mtime
        buckets, bad = parse_textfile(text)
        if bad:
            errors["unreadable_line"] += bad
        for bucket in buckets:
            tally.add_bucket(bucket, who)
        return len(text)

    @staticmethod
    def _reading(tally: CollectiveTally) -> InspectorReading:
        times = tally.rank_times()
        outlier = shortest_outlier(times)
        straggler = None
        if outlier is not None:
            who, shortest, middle = outlier
            straggler = (
                f"NCCL Inspector: {who} spends {1e3 * shortest:.3g} ms in each large collective against the median "
                f"{1e3 * middle:.3g} ms of the job's {len(times)} ranks here: the others wait in the collective for it"
            )
        return InspectorReading(tuple(tally.summaries()), straggler)
