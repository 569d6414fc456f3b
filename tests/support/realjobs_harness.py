"""Real training processes (tests/support/realjobs) under a real ``mfu-exporter run``: the daemon as a process on
loopback, configured with only where the jobs' logs are and the jobs' facts, as a user would; the jobs as processes
whose output goes to a file, as in a pod or a Slurm job; and what the jobs recorded of themselves, read back.

The daemon runs on this machine's real sources: no GPU here (the GPU source finds no NVML and says so), so a job's
peak is the CPU's, declared with ``jobs.<name>.peak_flops``.

A CPU has no entry in the GPU peak table: both sides take one thread's float32 matmul FLOP/s, measured once, as the
device's peak (the jobs print their MFU by it, the config declares it as ``jobs.<name>.peak_flops``), so the
comparisons are of the same quantity. The daemon is configured with where the logs are and the jobs' facts only."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable

from tests.support.expo import matching, samples
from tests.support.net import free_port
from tests.support.wait import wait_until

ROOT = Path(__file__).resolve().parents[2]
TOLERANCE = 0.02  # relative: the bar for MFU against a framework's own count, and for the ledger
# Seconds a line may take from the job's write to the daemon's view (inotify, the tick every mfu.interval) on a loaded machine.
SERVED = 30.0
TEARDOWN = 90.0  # seconds torchrun is given to end once every rank recorded its exit
# A job's own loop on a loaded two-core machine: generous, since the tests wait on the thing itself, not a clock.
JOB_DEADLINE = 240.0


@functools.lru_cache(maxsize=1)
def model_facts() -> dict[str, float]:
    """Measured and counted once, in a process of its own (torch stays out of the test process): one thread's
    float32 matmul FLOP/s (``peak_flops``: the peak both the jobs' own MFU and the exporter's config declare, as the
    jobs run one thread a rank), and the model's parameters as the HF Trainer counts them (``non_embedding_params``)
    and as a FLOP counter sees them (``matmul_params``). Once per test process: every real-jobs file declares the
    same peak."""
    out = subprocess.run(
        [sys.executable, "-m", "tests.support.realjobs.model"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
        env=job_env(),
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def job_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "PYTHONPATH": str(ROOT),
            "OMP_NUM_THREADS": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_OFFLINE": "1",  # nothing is downloaded: the models are built from a config
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.pop("TERM", None)
    return env


class Job:
    """A training process (or torchrun and its ranks) writing stdout and stderr to ``log``, as a pod's would."""

    def __init__(self, argv: list[str], log: Path, done: Callable[[], bool] | None = None):
        self.argv, self.log, self.done = argv, log, done
        self.handle = open(log, "ab")
        # At the lowest CPU priority: a job's figures are held against its own clock and count, which a busy machine
        # slows alike, while the other test files' daemons and timings running beside it must not starve for it.
        self.process = subprocess.Popen(
            ["nice", "-n", "19", *argv],
            cwd=ROOT,
            stdout=self.handle,
            stderr=subprocess.STDOUT,
            env=job_env(),
            start_new_session=True,
        )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait(self, timeout: float = JOB_DEADLINE) -> int:
        """The job's exit status. A job that says it is ``done`` (every rank recorded its exit) is given
        ``TEARDOWN`` seconds to end, then ended: torchrun's own teardown now and then never returns (its agent
        after a restart, github.com/pytorch/pytorch/issues/75097), and what the test compares is already recorded."""
        deadline = time.monotonic() + timeout
        done_at = None
        while time.monotonic() < deadline:
            try:
                return self.process.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                pass
            if self.done is not None and self.done():
                done_at = time.monotonic() if done_at is None else done_at
                if time.monotonic() - done_at > TEARDOWN:
                    print(f"\n{self.argv[:4]}: every rank exited {TEARDOWN:g} s ago and it still runs: ended")
                    self.stop()
                    return 0
        raise AssertionError(f"{self.argv[:4]} still running after {timeout:g}s; log tail:\n{self.text()[-3000:]}")

    def stop(self) -> None:
        """End the job and every process of it. torchrun starts each rank in a session of its own, so killing
        torchrun's session leaves the ranks training on, loading the rest of the suite: torchrun is asked to end
        them (SIGTERM), and any process still naming the job's folder is killed."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=30)
        for pid in processes_naming(str(self.log.parent)):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.handle.close()


def processes_naming(text: str) -> list[int]:
    """The PIDs of this machine's processes whose command line holds ``text`` (a job's own folder)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if text in entry.joinpath("cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def hf_trainer(out: Path, steps: int, logging_steps: int, slow_loader: float = 0.0) -> Job:
    out.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "tests.support.realjobs.hf_trainer", "--out", str(out), "--steps", str(steps)]
    argv += ["--logging-steps", str(logging_steps), "--slow-loader", str(slow_loader)]
    return Job(argv, out / "train.log")


def lightning_run(out: Path, steps: int) -> Job:
    out.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "tests.support.realjobs.lightning_run", "--out", str(out), "--steps", str(steps)]
    return Job(argv, out / "train.log")


def lightning_metrics(out: Path) -> Path:
    return out / "csv" / "version_0" / "metrics.csv"


def torchrun_job(out: Path, peak: float, *job_args: str, max_restarts: int = 1) -> Job:
    out.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    argv += ["--max-restarts", str(max_restarts), "--monitor-interval", "0.1"]
    argv += ["-m", "tests.support.realjobs.ddp_job", "--out", str(out), "--peak-flops", repr(peak), *job_args]
    return Job(argv, out / "train.log", done=lambda: all(ranks_exited(out, rank) for rank in (0, 1)))


def ranks_exited(out: Path, rank: int) -> bool:
    """Whether the rank's last record is its exit: a rank that ran to the end, not one killed (torchrun restarts it)."""
    records = truth(out, rank)
    return bool(records) and records[-1]["event"] == "exit"


def truth(out: Path, rank: int = 0) -> list[dict[str, Any]]:
    """What a rank of the torchrun job recorded of itself, in order."""
    path = out / f"truth-rank{rank}.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class Daemon:
    """``python -m mfu_exporter run --config`` as a process on a loopback port; restartable on the same config."""

    def __init__(self, tmp: Path, files: list[dict], jobs: dict[str, dict], extra: dict | None = None):
        self.port = free_port()
        config: dict[str, Any] = {
            "web": {"listen_address": f"127.0.0.1:{self.port}"},
            "sources": {"logs": {"files": files}},
            "jobs": jobs,
        }
        for key, value in (extra or {}).items():
            config[key] = {**config.get(key, {}), **value}
        self.config_path = tmp / "exporter.yaml"
        self.config_path.write_text(json.dumps(config))  # JSON is YAML
        self.output = tmp / "exporter.out"
        self.process: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        with open(self.output, "ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "mfu_exporter", "run", "--config", str(self.config_path)],
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        wait_until(self.ready, timeout=60, what="the exporter to be ready")

    def ready(self) -> bool:
        assert self.process is not None and self.process.poll() is None, self.output.read_text()[-3000:]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def get(self, path: str) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=10) as response:
            return response.read().decode()

    def job(self, name: str) -> dict | None:
        jobs = json.loads(self.get("/api/v1/jobs"))["jobs"]
        return next((j for j in jobs if j["job"] == name), None)

    def ledger(self, name: str) -> dict:
        return json.loads(self.get(f"/api/v1/jobs/{name}/ledger"))

    def metrics(self) -> dict:
        return samples(self.get("/metrics"))

    def metric(self, name: str, **labels: str) -> float | None:
        values = matching(self.metrics(), name, **labels)
        return values[0] if values else None

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)


class Watcher:
    """Reads the daemon's view of one job about every ``interval`` seconds in a thread, keeping every answer (its
    jobs JSON and the job's series), so a test can look back at what was served while a job ran and the daemon
    restarted. A read that fails (the daemon down) is kept as None."""

    def __init__(self, daemon: Daemon, job: str, interval: float = 0.25):
        self.daemon, self.name, self.interval = daemon, job, interval
        self.seen: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "Watcher":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def until(self, moment: float) -> None:
        """Until the watcher has read the daemon at ``moment`` (Unix time) or later: a look at what it serves then."""
        wait_until(
            lambda: self.seen and self.seen[-1]["time"] >= moment,
            max(moment - time.time(), 0.0) + SERVED,
            f"a read at {moment:.0f}",
        )

    def _run(self) -> None:
        while not self._stop.is_set():
            at = time.time()
            try:
                job = self.daemon.job(self.name)
                found = self.daemon.metrics()
                series = {
                    name: (matching(found, name, training_job=self.name) or [None])[0]
                    for name in (
                        "mfu_job_tokens_total",
                        "mfu_job_model_flops_total",
                        "mfu_model_flops_utilization_ratio",
                    )
                }
                # The series are paired with the job's JSON read just before them: a line read in between would pair
                # a gauge of the newer window with the older count, so such a read keeps its counters only.
                after = self.daemon.job(self.name)
                if (job or {}).get("tokens_total") != (after or {}).get("tokens_total"):
                    series["mfu_model_flops_utilization_ratio"] = None
                self.seen.append({"time": at, "start": self.daemon.starts, "job": job, **series})
            except (OSError, ValueError, AssertionError):
                self.seen.append({"time": at, "start": self.daemon.starts, "job": None})
            self._stop.wait(self.interval)


def figures(test: str, **values: object) -> None:
    """What a test compared, printed (``pytest -s`` shows it) and appended to the file ``REALJOBS_FIGURES`` names,
    if set (xdist's workers print nowhere): the figures behind the verdict, for the record."""
    line = f"{test}: " + ", ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items())
    print("\n" + line)
    if os.environ.get("REALJOBS_FIGURES"):
        with open(os.environ["REALJOBS_FIGURES"], "a") as handle:
            handle.write(line + "\n")


def settled(daemon: Daemon, name: str, what: str, predicate: Any, timeout: float = SERVED) -> dict:
    """The daemon's job JSON once ``predicate`` holds for it; on a timeout, the last one, to see why."""
    last: list[dict | None] = [None]

    def check() -> dict | bool:
        last[0] = job = daemon.job(name)
        return job is not None and bool(predicate(job)) and job

    try:
        return wait_until(check, timeout, what)  # type: ignore[return-value]
    except AssertionError as failure:
        raise AssertionError(f"{failure}; the job's last JSON: {json.dumps(last[0])}") from None
