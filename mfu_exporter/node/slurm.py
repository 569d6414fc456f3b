"""Slurm jobs on this node's GPUs, found without slurmctld: through the GPU processes' cgroups, or the per-GPU job
mapping directory that prolog/epilog scripts write for the standard GPU exporter.

**Processes → cgroup → job.** NVML lists each GPU's compute processes by host PID; ``<procfs>/<pid>/cgroup`` names
the slurmstepd cgroup the process runs in. Layouts (SchedMD doc/html/cgroup_v2.shtml and cgroups.shtml; the
``src/plugins/cgroup/v{1,2}`` code builds the same paths):

- cgroup v2: one line ``0::/system.slice/slurmstepd.scope/job_<id>/step_<step>/user/task_<n>`` (the slice is
  ``CgroupSlice``; ``<node>_slurmstepd.scope`` with --enable-multiple-slurmd).
- cgroup v2, Slurm 26.05 and later: the job directory is the job's SLUID (``.../slurmstepd.scope/s5K1KKYAYG5D00/
  step_0/...``) unless cgroup.conf sets ``CgroupJobIdPaths=yes``. No local file maps a SLUID to the job ID, so the
  ID is read from the process title of the step's slurmstepd, ``slurmstepd: [<job>.<step>]`` (the doc's
  ``systemctl status slurmstepd.scope`` shows it), found through ``<cgroup root>/<job dir>/step_<step>/slurm/
  cgroup.procs``. The process's own ``SLURM_JOB_ID`` is never read: ``/proc/<pid>/environ`` holds the job's
  whole environment, tokens and keys included, and the exporter reads no credentials. When the title is not
  readable the job is named by its SLUID: what is lost is the numeric ID, so a job whose client names itself by
  ``SLURM_JOB_ID`` is then a second job, and a name lookup (scontrol) cannot run for it.
- cgroup v1 (deprecated in Slurm): one line per controller, ``<n>:memory:/slurm/uid_<uid>/job_<id>/step_<step>/
  task_<n>`` (``/slurm_<node>`` with --enable-multiple-slurmd).

NVML returns host PIDs whatever PID namespace the exporter runs in (NVIDIA, nvidia-docker #1483: "the driver is not
aware of the PID namespace"), so this needs ``<procfs>`` to be the host's: ``host_pid_namespace`` tells, and the
caller turns the path off with that reason instead of reading an unrelated process of its own namespace.

**Mapping directory** (dcgm-exporter ``--hpc-job-mapping-dir``): one file per GPU index (``0``, ``1``...), each line
a job ID on that GPU; ``<gpu>.<gi>`` files are MIG instances, reported unsupported (figures are per whole GPU).
"""

from __future__ import annotations

import errno
import logging
import os
import re
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

log = logging.getLogger(__name__)

_V2 = re.compile(
    r"/(?:[^/]+_)?slurmstepd\.scope/(?:job_(?P<job>\d+)|(?P<sluid>[A-Za-z0-9]+))/step_(?P<step>[A-Za-z0-9_]+)(?:/|$)"
)
_V1 = re.compile(
    r"/slurm(?:_[^/]+)?/uid_(?P<uid>\d+)/(?:job_(?P<job>\d+)|(?P<sluid>[A-Za-z0-9]+))/step_(?P<step>[A-Za-z0-9_]+)(?:/|$)"
)
_STEPD_TITLE = re.compile(rb"^slurmstepd: \[(\d+)(?:[._][^\]]*)?\]")
_JOB_ID_LINE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:@+-]{0,127}\Z")
_GPU_FILE = re.compile(r"^\d+$")
_MIG_FILE = re.compile(r"^\d+\.\d+$")
MAX_MAPPING_FILE_BYTES = 64 * 1024


@dataclass(frozen=True)
class StepCgroup:
    """The Slurm step a cgroup path names; ``job_id`` is None when the path carries only a SLUID."""

    job_id: str | None
    sluid: str | None
    step: str
    uid: int | None
    job_dir: str  # the cgroup path up to and including the job directory
    version: int


def parse_cgroup(text: str) -> StepCgroup | None:
    """The slurmstepd step of one ``/proc/<pid>/cgroup`` text, or None when the process is not in a Slurm step."""
    v1_hit = None
    for line in text.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            if m := _V2.search(path):
                return StepCgroup(m["job"], m["sluid"], m["step"], None, path[: m.start("step") - len("/step_")], 2)
        elif v1_hit is None and (m := _V1.search(path)):
            v1_hit = StepCgroup(
                m["job"], m["sluid"], m["step"], int(m["uid"]), path[: m.start("step") - len("/step_")], 1
            )
    return v1_hit


def host_pid_namespace(procfs: str) -> tuple[bool, str]:
    """Whether ``procfs`` shows the host's PID namespace (where NVML's PIDs live), with the reason.

    In the initial PID namespace PID 2 is always the kernel's ``kthreadd``; a container's own namespace shows no
    kernel threads. This is the test, since NVML PIDs that happen to exist in a private namespace are other
    processes entirely.
    """
    try:
        with open(os.path.join(procfs, "2", "comm"), "rb") as file:
            comm = file.read().strip()
    except OSError:
        comm = b""
    if comm == b"kthreadd":
        return True, "host PID namespace"
    return False, (
        f"{procfs} is not the host's PID namespace (no kthreadd at PID 2), while NVML reports host PIDs: "
        "run with hostPID: true, or point --path.procfs at the host's /proc"
    )


def _read(path: str, limit: int = 65536) -> bytes:
    with open(path, "rb") as file:
        return file.read(limit)


def _start_time(procfs: str, pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat, so a reused PID is never taken for the process cached under it."""
    try:
        stat = _read(os.path.join(procfs, str(pid), "stat"), 4096)
    except OSError:
        return None
    # comm (field 2) is in parentheses and may hold spaces or ')': split after the last ')'.
    fields = stat[stat.rfind(b")") + 2 :].split()
    return fields[19].decode() if len(fields) > 19 else None


@dataclass(frozen=True)
class PidJob:
    pid: int
    job: str | None  # the Slurm job ID, or the SLUID when no ID could be found (see module docs)
    by: str  # "cgroup", "slurmstepd", "sluid"; or the skip reason when job is None
    step: str | None = None
    uid: int | None = None
    sluid: str | None = None


class ProcessJobs:
    """GPU PIDs to Slurm jobs through ``<procfs>``, cached by (PID, start time) for the life of each process."""

    def __init__(self, procfs: str = "/proc", cgroup_root: str = "/sys/fs/cgroup", max_cached: int = 4096):
        self.procfs = procfs
        self.cgroup_root = cgroup_root
        self.max_cached = max_cached
        self._cache: dict[tuple[int, str], PidJob] = {}
        self._own: str | None = None

    def own_cgroup(self) -> str:
        if self._own is None:
            try:
                self._own = _read(os.path.join(self.procfs, "self", "cgroup")).decode("utf-8", "replace")
            except OSError:
                self._own = ""
        return self._own

    def job_of(self, pid: int) -> PidJob:
        started = _start_time(self.procfs, pid)
        if started is None:
            return PidJob(pid, None, "pid_gone")
        key = (pid, started)
        if (hit := self._cache.get(key)) is not None:
            return hit
        result = self._resolve(pid)
        if result.by != "pid_gone":
            if len(self._cache) >= self.max_cached:
                self._cache.clear()  # processes come and go; the cache refills in one cycle
            self._cache[key] = result
        return result

    def _resolve(self, pid: int) -> PidJob:
        try:
            text = _read(os.path.join(self.procfs, str(pid), "cgroup")).decode("utf-8", "replace")
        except OSError:
            return PidJob(pid, None, "pid_gone")  # it exited between NVML's list and this read
        own = self.own_cgroup()
        if own and text == own:
            return PidJob(pid, None, "own_container")
        step = parse_cgroup(text)
        if step is None:
            return PidJob(pid, None, "not_slurm")
        if step.job_id is not None:
            return PidJob(pid, step.job_id, "cgroup", step.step, step.uid)
        job = self._job_id_from_stepd(step)
        if job is not None:
            return PidJob(pid, job, "slurmstepd", step.step, step.uid, step.sluid)
        return PidJob(pid, step.sluid, "sluid", step.step, step.uid, step.sluid)

    def _job_id_from_stepd(self, step: StepCgroup) -> str | None:
        procs = os.path.join(self.cgroup_root, step.job_dir.lstrip("/"), f"step_{step.step}", "slurm", "cgroup.procs")
        try:
            pids = _read(procs).split()
        except OSError:
            return None
        for raw in pids[:8]:
            try:
                title = _read(os.path.join(self.procfs, raw.decode(), "cmdline"), 256)
            except (OSError, UnicodeDecodeError):
                continue
            if m := _STEPD_TITLE.match(title):
                return m.group(1).decode()
        return None


@dataclass
class SlurmGpuJobs:
    """One pass: each GPU index's Slurm job IDs, with PID counts per reason a process gave no job."""

    gpus: dict[int, set[str]] = field(default_factory=dict)
    skipped: Counter = field(default_factory=Counter)
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)  # job -> {"uid", "sluid", "by", "steps"}


def jobs_of_processes(processes: dict[int, Sequence[int]], resolver: ProcessJobs) -> SlurmGpuJobs:
    """``processes``: GPU index → PIDs from NVML. A PID on several GPUs counts on each."""
    result = SlurmGpuJobs()
    for gpu, pids in processes.items():
        for pid in pids:
            found = resolver.job_of(pid)
            if found.job is None:
                result.skipped[found.by] += 1
                continue
            result.gpus.setdefault(gpu, set()).add(found.job)
            job = result.jobs.setdefault(found.job, {"uid": found.uid, "sluid": found.sluid, "by": found.by})
            if found.step is not None:
                # The job's steps on these GPUs: a new step (an srun started again in the allocation) is a new run.
                job["steps"] = tuple(sorted({*job.get("steps", ()), found.step}))
    return result


def nvml_compute_pids(nvml: Any, indices: Iterable[int]) -> tuple[dict[int, list[int]], Counter]:
    """Each GPU's compute-process PIDs (NVML must be initialised); a GPU that fails counts by its error name."""
    pids: dict[int, list[int]] = {}
    errors: Counter = Counter()
    for index in indices:
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            pids[index] = [p.pid for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)]
        except Exception as error:  # noqa: BLE001 - NVMLError subclasses per code; one GPU must not stop the rest
            errors[f"nvml_processes_{type(error).__name__}"] += 1
    return pids, errors


# --- the mapping directory -----------------------------------------------------------------------------------------


@dataclass
class MappingRead:
    gpus: dict[int, tuple[str, ...]] = field(default_factory=dict)
    errors: Counter = field(default_factory=Counter)
    unsupported: dict[str, str] = field(default_factory=dict)  # file name -> why


def _read_stable(path: str) -> bytes | None:
    """A file's bytes, re-read when its size or mtime changed during the read (a prolog rewriting it); None when
    it vanished or never held still in three tries."""
    for _ in range(3):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError as error:
            if error.errno in (errno.ENOENT, errno.ELOOP):
                return None
            raise
        try:
            before = os.fstat(fd)
            data = os.read(fd, MAX_MAPPING_FILE_BYTES + 1)
            after = os.fstat(fd)
        finally:
            os.close(fd)
        if (before.st_size, before.st_mtime_ns) == (after.st_size, after.st_mtime_ns) and after.st_size == len(data):
            return data
    return None


class MappingDir:
    """Reads the per-GPU job mapping directory, tolerant of files rewritten while it reads.

    A prolog writing ``echo $SLURM_JOB_ID > <dir>/<gpu>`` truncates before it writes: a read in between sees an
    empty file. An empty file younger than ``settle`` seconds keeps the GPU's previous jobs for that read, so such a
    moment does not end a job; an epilog's emptied file ends it ``settle`` seconds later.
    """

    def __init__(self, path: str, settle: float = 2.0, clock: Callable[[], float] = time.time):
        self.path = path
        self.settle = settle
        self._clock = clock
        self._previous: dict[int, tuple[str, ...]] = {}

    def read(self) -> MappingRead:
        result = MappingRead()
        try:
            names = os.listdir(self.path)
        except FileNotFoundError:
            result.errors["mapping_dir_missing"] += 1
            self._previous = {}
            return result
        except OSError as error:
            result.errors[f"mapping_dir_{errno.errorcode.get(error.errno or 0, 'error').lower()}"] += 1
            return result
        now = self._clock()
        for name in sorted(names):
            if _MIG_FILE.match(name):
                result.unsupported[name] = "a MIG instance (<gpu>.<gi>): figures are per whole GPU, not attributed"
                continue
            if not _GPU_FILE.match(name):
                continue  # editor backups, a prolog's temporary file before its rename
            path = os.path.join(self.path, name)
            try:
                data = _read_stable(path)
            except OSError:
                result.errors["mapping_file_unreadable"] += 1
                continue
            if data is None:
                if os.path.lexists(path):
                    result.errors["mapping_file_unstable"] += 1
                    if int(name) in self._previous:
                        result.gpus[int(name)] = self._previous[int(name)]
                continue
            if len(data) > MAX_MAPPING_FILE_BYTES:
                result.errors["mapping_file_too_large"] += 1
                continue
            jobs = []
            for line in data.decode("utf-8", "replace").splitlines():
                line = line.strip()
                if not line:
                    continue
                if _JOB_ID_LINE.match(line):
                    jobs.append(line)
                else:
                    result.errors["mapping_line_invalid"] += 1
            index = int(name)
            if not jobs and index in self._previous:
                try:
                    fresh = now - os.stat(path).st_mtime < self.settle
                except OSError:
                    fresh = False
                if fresh:
                    result.gpus[index] = self._previous[index]
                    continue
            if jobs:
                result.gpus[index] = tuple(dict.fromkeys(jobs))
        self._previous = dict(result.gpus)
        return result


# --- optional job names --------------------------------------------------------------------------------------------


class JobNames:
    """Slurm job names from a command (``squeue -h -o %j -j {job}`` by default), cached; the ID works without it.

    The command runs on a background thread with a timeout, so a slow slurmctld never holds up a sample; until the
    answer (or after a failure) ``name`` returns None and the job is named by its ID.
    """

    def __init__(
        self,
        command: Sequence[str] = ("squeue", "-h", "-o", "%j", "-j", "{job}"),
        timeout: float = 5.0,
        ttl: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
        runner: Callable[..., Any] = subprocess.run,
    ):
        self.command = list(command)
        self.timeout = timeout
        self.ttl = ttl
        self._clock = clock
        self._runner = runner
        self._lock = threading.Lock()
        self._names: dict[str, tuple[float, str | None]] = {}
        self._inflight: set[str] = set()
        self.failures: Counter = Counter()

    def name(self, job_id: str) -> str | None:
        with self._lock:
            hit = self._names.get(job_id)
            if hit is not None and self._clock() - hit[0] < self.ttl:
                return hit[1]
            if job_id in self._inflight:
                return hit[1] if hit else None
            self._inflight.add(job_id)
        threading.Thread(target=self._lookup, args=(job_id,), name="slurm-names", daemon=True).start()
        return hit[1] if hit else None

    def pending(self, job_id: str) -> bool:
        """Whether the job's first lookup is still running (no answer yet, not even a failed one)."""
        with self._lock:
            return job_id in self._inflight and job_id not in self._names

    def _lookup(self, job_id: str) -> None:
        argv = [part.replace("{job}", job_id) for part in self.command]
        name = None
        try:
            done = self._runner(argv, capture_output=True, timeout=self.timeout, check=False)
            out = done.stdout.decode("utf-8", "replace").strip().splitlines() if done.returncode == 0 else []
            name = out[0].strip() if out and out[0].strip() else None
            if name is None:
                self.failures[f"exit_{done.returncode}"] += 1
        except subprocess.TimeoutExpired:
            self.failures["timeout"] += 1
        except OSError as error:
            self.failures[type(error).__name__] += 1
        with self._lock:
            self._inflight.discard(job_id)
            self._names[job_id] = (self._clock(), name)

    def forget(self, keep: set[str]) -> None:
        with self._lock:
            for job in [j for j in self._names if j not in keep]:
                del self._names[job]
