"""A real Slurm cluster of one node on loopback: Debian's munged, slurmctld and slurmd, started as root in a test's
own directory (its own munge key and socket, slurm.conf, state and spool directories, pid and log files, and
ports), with GPUs declared as GRES on device files it creates. Jobs go in through the real sbatch/srun/squeue.

    with SlurmCluster(tmp, gpus=8, prolog=..., epilog=...) as cluster:
        job = cluster.sbatch("--gres=gpu:2", "--wrap", "srun --label ...")

Debian builds Slurm with --enable-multiple-slurmd, so cgroup v1 job directories are ``/slurm_<node>/uid_<uid>/
job_<id>/step_<s>`` under each controller: the node is this machine's hostname, so the first job ID is drawn at random
to keep two clusters on one machine (two test runs) out of each other's cgroups.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
from pathlib import Path

from tests.support.net import free_port
from tests.support.prom_harness import stop_process
from tests.support.wait import wait_until

# The Debian packages the harness needs, by the program it runs (scripts/install-system-deps.sh installs them).
TOOLS = {
    "munged": "munge",
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "sbatch": "slurm-client",
    "srun": "slurm-client",
    "squeue": "slurm-client",
    "scancel": "slurm-client",
    "sinfo": "slurm-client",
}
NVIDIA_MAJOR = 195  # /dev/nvidiaN's character major; the minor is N


class SlurmError(AssertionError):
    """Slurm did not come up or refused a command; the message carries the daemons' last log lines."""


def missing_tools() -> list[str]:
    return sorted({package for tool, package in TOOLS.items() if not shutil.which(tool)})


class SlurmCluster:
    def __init__(
        self,
        root: Path,
        gpus: int = 8,
        prolog: str | None = None,
        epilog: str | None = None,
        cgroups: bool = True,
    ):
        self.root = root
        self.gpus = gpus
        self.prolog, self.epilog = prolog, epilog
        self.cgroups = cgroups
        self.node = socket.gethostname().split(".")[0]
        self.conf = root / "slurm.conf"
        self.devices = [root / "dev" / f"nvidia{i}" for i in range(gpus)]
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self._processes: dict[str, subprocess.Popen] = {}
        self.submitted: list[str] = []  # job IDs, so tear-down touches this cluster's jobs only

    # --- set-up ---------------------------------------------------------------------------------------------

    def _write(self) -> None:
        for sub in ("munge", "state", "spool", "log", "dev"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        (self.root / "munge").chmod(0o700)
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        for minor, device in enumerate(self.devices):
            # Character devices like the driver's: Slurm's GRES reads their major/minor (device cgroups).
            os.mknod(device, 0o600 | 0o020000, os.makedev(NVIDIA_MAJOR, minor))
        cpus = os.cpu_count() or 1
        ctld_port, slurmd_port = free_port(), free_port()
        lines = [
            "ClusterName=mfutest",
            "SlurmctldHost=localhost(127.0.0.1)",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"SlurmctldPort={ctld_port}",
            f"SlurmdPort={slurmd_port}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={self.root / 'state'}",
            f"SlurmdSpoolDir={self.root / 'spool'}",
            f"SlurmctldPidFile={self.root / 'slurmctld.pid'}",
            f"SlurmdPidFile={self.root / 'slurmd.pid'}",
            f"SlurmctldLogFile={self.root / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={self.root / 'log' / 'slurmd.log'}",
            "SlurmdDebug=verbose",
            f"FirstJobId={random.randint(100_000, 9_000_000)}",
            "ProctrackType=" + ("proctrack/cgroup" if self.cgroups else "proctrack/linuxproc"),
            "TaskPlugin=" + ("task/cgroup" if self.cgroups else "task/none"),
            "GresTypes=gpu",
            "SchedulerType=sched/builtin",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "ReturnToService=2",
            "MpiDefault=none",
            "JobCompType=jobcomp/none",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "SlurmdTimeout=30",
            "InactiveLimit=0",
            "KillWait=2",
            "MessageTimeout=10",
            "PrologFlags=Alloc",
            *([f"Prolog={self.prolog}"] if self.prolog else []),
            *([f"Epilog={self.epilog}"] if self.epilog else []),
            f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=1000 Gres=gpu:{self.gpus} State=UNKNOWN",
            f"PartitionName=test Nodes={self.node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES",
        ]
        self.conf.write_text("\n".join(lines) + "\n")
        files = ",".join(d.name.removeprefix("nvidia") for d in self.devices)
        (self.root / "gres.conf").write_text(f"AutoDetect=off\nName=gpu File={self.root / 'dev'}/nvidia[{files}]\n")
        # cgroup v1 controllers under /sys/fs/cgroup (freezer for proctrack, the rest for task/cgroup); nothing
        # is constrained, since the GPUs are device files no driver backs.
        (self.root / "cgroup.conf").write_text("CgroupPlugin=autodetect\nConstrainDevices=no\n")

    @property
    def munge_socket(self) -> Path:
        return self.root / "munge" / "munge.sock"

    def _start(self, name: str, argv: list[str]) -> None:
        log = open(self.root / "log" / f"{name}.out", "wb")
        self._processes[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env)
        log.close()

    def start(self) -> SlurmCluster:
        self._write()
        munge = self.root / "munge"
        # --force: munged refuses to run as root, and the test directory's parents (/tmp) are world-writable.
        self._start(
            "munged",
            [
                shutil.which("munged") or "munged",
                "--foreground",
                "--force",
                f"--key-file={munge / 'munge.key'}",
                f"--socket={self.munge_socket}",
                f"--pid-file={munge / 'munged.pid'}",
                f"--log-file={munge / 'munged.log'}",
                f"--seed-file={munge / 'munged.seed'}",
            ],
        )
        wait_until(lambda: self.munge_socket.exists() or self._died(), 15, "munged's socket")
        self._start("slurmctld", [shutil.which("slurmctld") or "slurmctld", "-D", "-i", "-f", str(self.conf)])
        self._start("slurmd", [shutil.which("slurmd") or "slurmd", "-D", "-f", str(self.conf)])
        try:
            wait_until(
                lambda: self._died() or "idle" in self.run("sinfo", "-h", "-o", "%t", check=False),
                30,
                "the node to be idle",
            )
        except AssertionError as error:
            raise SlurmError(f"{error}\n{self.logs()}") from None
        if died := self._died():
            raise SlurmError(f"{died} exited\n{self.logs()}")
        return self

    def _died(self) -> str | None:
        return next((n for n, p in self._processes.items() if p.poll() is not None), None)

    # --- commands -------------------------------------------------------------------------------------------

    def run(self, *argv: str, check: bool = True, timeout: float = 30) -> str:
        done = subprocess.run(argv, capture_output=True, text=True, env=self.env, timeout=timeout, cwd=self.root)
        if check and done.returncode != 0:
            raise SlurmError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr}\n{self.logs()}")
        return done.stdout

    def sbatch(self, *args: str) -> str:
        """The job ID of ``sbatch --parsable <args>``."""
        job = self.run("sbatch", "--parsable", *args).strip().split(";")[0]
        self.submitted.append(job)
        return job

    def job_state(self, job: str) -> str | None:
        """squeue's state (RUNNING, COMPLETING...) or None once the job has left the queue."""
        out = self.run("squeue", "-h", "-o", "%T", "-j", job, check=False).strip()
        return out or None

    def errors(self, daemon: str = "slurmd") -> str:
        """The daemon's own error and fatal lines (its log file), e.g. why it could not use this machine's cgroups."""
        path = self.root / "log" / f"{daemon}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(line for line in text.splitlines() if "error:" in line or "fatal:" in line)

    def logs(self, lines: int = 25) -> str:
        parts = []
        for path in sorted((self.root / "log").glob("*")) + [self.root / "munge" / "munged.log"]:
            if path.exists():
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"== {path.name}\n" + "\n".join(tail))
        return "\n".join(parts)

    # --- tear-down ------------------------------------------------------------------------------------------

    def stop(self) -> None:
        if self._alive("slurmctld"):
            self.run("scancel", "--full", "--quiet", *self.submitted, check=False, timeout=10)
            try:
                wait_until(lambda: not self.run("squeue", "-h", check=False).strip(), 20, "the queue to empty")
            except AssertionError:
                pass  # what is left is killed below
        self._kill_job_processes()
        for name in ("slurmd", "slurmctld", "munged"):  # the node first: it reports to the controller
            stop_process(self._processes.get(name))

    def _alive(self, name: str) -> bool:
        return name in self._processes and self._processes[name].poll() is None

    def _job_cgroups(self) -> list[Path]:
        """This cluster's job directories under each cgroup v1 controller, deepest first."""
        found = []
        for job in self.submitted:
            found += Path("/sys/fs/cgroup").glob(f"*/slurm_{self.node}/uid_*/job_{job}")
        return sorted({d for top in found for d in [top, *top.rglob("*")] if d.is_dir()}, reverse=True)

    def _kill_job_processes(self) -> None:
        """What Slurm left of this cluster's jobs (slurmstepd outlives slurmd by design): the processes in their
        cgroups and their slurmstepds (process title ``slurmstepd: [<job>.<step>]``), by PID; then the cgroups."""
        pids = set()
        for directory in self._job_cgroups():
            with contextlib.suppress(OSError):
                pids.update(int(p) for p in (directory / "cgroup.procs").read_text().split())
        titles = tuple(f"slurmstepd: [{job}.".encode() for job in self.submitted)
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit() and titles:
                with contextlib.suppress(OSError):
                    if (proc / "cmdline").read_bytes().startswith(titles):
                        pids.add(int(proc.name))
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for directory in self._job_cgroups():
            with contextlib.suppress(OSError, AssertionError):
                wait_until(lambda d=directory: not (d / "cgroup.procs").read_text().strip(), 5, f"{directory} to empty")
                directory.rmdir()

    def __enter__(self) -> SlurmCluster:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()
